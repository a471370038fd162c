// CFBundleVersion: digits and dots, compared numerically component by component.

/// The dot-separated components of a bundle version, or nil unless the string is digits and dots
/// only, with no empty component (no empty string, no leading, trailing or double dot).
func bundleVersionComponents(_ version: String) -> [Substring.UTF8View]? {
    let parts = version.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
    guard !parts.isEmpty else { return nil }
    for part in parts {
        guard !part.isEmpty, part.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
    }
    return parts.map { Substring($0).utf8 }
}

func isValidBundleVersion(_ version: String) -> Bool {
    bundleVersionComponents(version) != nil
}

/// Compares two decimal digit strings of any length by value.
private func compareDigits(_ a: Substring.UTF8View, _ b: Substring.UTF8View) -> Int {
    let x = a.drop(while: { $0 == UInt8(ascii: "0") })
    let y = b.drop(while: { $0 == UInt8(ascii: "0") })
    if x.count != y.count { return x.count < y.count ? -1 : 1 }
    for (p, q) in zip(x, y) where p != q { return p < q ? -1 : 1 }
    return 0
}

/// Numeric dot-separated compare ("1.10" > "1.9", "2" == "2.0"); nil if either is not digits-and-dots only (empty, leading/trailing/double dot, letters).
/// Missing components count as 0; components may be arbitrarily long.
public func compareBundleVersions(_ a: String, _ b: String) -> Int? {
    guard let x = bundleVersionComponents(a), let y = bundleVersionComponents(b) else { return nil }
    let zero = Substring("0").utf8
    for i in 0..<max(x.count, y.count) {
        let c = compareDigits(i < x.count ? x[i] : zero, i < y.count ? y[i] : zero)
        if c != 0 { return c }
    }
    return 0
}
