import Foundation
import XCTest
@testable import UbiquityManifests

// MARK: - Temporary manifests folders

/// A fresh folder under the system temporary directory, removed by `remove()`.
struct TempDir {
    let path: String

    init() {
        let base = NSTemporaryDirectory() + "ubiquityfs-manifests-" + UUID().uuidString
        try! FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        path = base
    }

    func write(_ name: String, _ text: String) {
        write(name, Array(text.utf8))
    }

    func write(_ name: String, _ bytes: [UInt8]) {
        let full = path + "/" + name
        let dir = (full as NSString).deletingLastPathComponent
        try! FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        XCTAssertTrue(FileManager.default.createFile(atPath: full, contents: Data(bytes)))
    }

    func file(_ name: String) -> String { path + "/" + name }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// The repository's `samples/apps` folder.
let samplesAppsPath: String = {
    var url = URL(fileURLWithPath: #filePath)
    for _ in 0..<3 { url.deleteLastPathComponent() }   // Support.swift, ManifestsTests, Tests
    return url.appendingPathComponent("samples/apps").path
}()

// MARK: - XML manifests

func plistXML(_ topBody: String) -> String {
    """
    <?xml version="1.0" encoding="UTF-8"?>
    <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
    <plist version="1.0">
    <dict>
    \(topBody)
    </dict>
    </plist>
    """
}

/// Container settings body; pass nil to leave a key out, or raw XML for the value.
func settingsXML(isPublic: String? = "<true/>", name: String? = "<string>Foo</string>",
                 levels: String? = "<string>None</string>", extra: String = "") -> String {
    var s = ""
    if let isPublic { s += "<key>NSUbiquitousContainerIsDocumentScopePublic</key>\(isPublic)\n" }
    if let name { s += "<key>NSUbiquitousContainerName</key>\(name)\n" }
    if let levels { s += "<key>NSUbiquitousContainerSupportedFolderLevels</key>\(levels)\n" }
    return s + extra
}

func containerXML(_ key: String = "iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)", _ settings: String = settingsXML()) -> String {
    "<key>\(key)</key>\n<dict>\n\(settings)</dict>\n"
}

/// An app manifest; pass nil to leave a key out, raw XML values via `containers` and `extra`.
func appXML(id: String? = "com.x.Foo", name: String? = "Foo", version: String? = "1",
            containers: String? = containerXML(), extra: String = "") -> String {
    var s = ""
    if let id { s += "<key>CFBundleIdentifier</key><string>\(id)</string>\n" }
    if let name { s += "<key>CFBundleName</key><string>\(name)</string>\n" }
    if let version { s += "<key>CFBundleVersion</key><string>\(version)</string>\n" }
    s += extra
    if let containers { s += "<key>NSUbiquitousContainers</key>\n<dict>\n\(containers)</dict>\n" }
    return plistXML(s)
}

/// A manifest that always loads, written beside each bad one to check that the others still load.
let goodManifest = appXML(id: "com.x.Good", name: "Good",
                          containers: containerXML("iCloud.com.x.Good", settingsXML(name: "<string>Good</string>")))

/// Loads `bad` (named `name`) next to a good manifest; asserts that the good one loads and the bad
/// one does not, and returns the bad file's diagnostics and the folder path.
func loadBad(_ bad: [UInt8], name: String = "Bad.plist",
             file: StaticString = #filePath, line: UInt = #line) -> (diagnostics: [Diagnostic], dir: String) {
    let dir = TempDir()
    defer { dir.remove() }
    dir.write("Good.plist", goodManifest)
    dir.write(name, bad)
    let load = loadManifests(directory: dir.path)
    XCTAssertEqual(load.manifests.map(\.bundleIdentifier), ["com.x.Good"], "the good manifest still loads", file: file, line: line)
    XCTAssertTrue(load.diagnostics.allSatisfy { $0.file == dir.file(name) }, "\(load.diagnostics)", file: file, line: line)
    XCTAssertTrue(load.diagnostics.contains { $0.severity == .error }, "an error explains why", file: file, line: line)
    return (load.diagnostics, dir.path)
}

func loadBad(_ bad: String, name: String = "Bad.plist",
             file: StaticString = #filePath, line: UInt = #line) -> (diagnostics: [Diagnostic], dir: String) {
    loadBad(Array(bad.utf8), name: name, file: file, line: line)
}

/// Loads one manifest alone and returns the whole result.
func loadOne(_ text: String) -> ManifestLoad {
    loadOne(Array(text.utf8))
}

func loadOne(_ bytes: [UInt8]) -> ManifestLoad {
    let dir = TempDir()
    defer { dir.remove() }
    dir.write("App.plist", bytes)
    return loadManifests(directory: dir.path)
}

/// The descriptions of the diagnostics with the folder prefix removed ("Bad.plist: error: …").
func lines(_ diagnostics: [Diagnostic], in dir: String) -> [String] {
    diagnostics.map { d in
        let s = d.description
        return s.hasPrefix(dir + "/") ? String(s.dropFirst(dir.count + 1)) : s
    }
}

// MARK: - A small bplist00 writer (tests only)

/// Writes `PlistValue`s as `bplist00`, keeping dictionary order; every value is its own object.
struct BinaryPlistWriter {
    private var objects: [[UInt8]] = []

    static func write(_ value: PlistValue) -> [UInt8] {
        var writer = BinaryPlistWriter()
        // First pass: count objects to choose the reference size.
        let count = Self.count(value)
        let refSize = count < 256 ? 1 : 2
        _ = writer.add(value, refSize: refSize)
        var out = Array("bplist00".utf8)
        var offsets: [Int] = []
        for object in writer.objects {
            offsets.append(out.count)
            out += object
        }
        let tableOffset = out.count
        let offsetSize = tableOffset < 256 ? 1 : (tableOffset < 65536 ? 2 : 4)
        for o in offsets { out += bigEndian(UInt64(o), size: offsetSize) }
        out += [0, 0, 0, 0, 0, 0, UInt8(offsetSize), UInt8(refSize)]
        out += bigEndian(UInt64(writer.objects.count), size: 8)
        out += bigEndian(0, size: 8)
        out += bigEndian(UInt64(tableOffset), size: 8)
        return out
    }

    private static func count(_ v: PlistValue) -> Int {
        switch v {
        case .array(let items): return 1 + items.reduce(0) { $0 + count($1) }
        case .dictionary(let entries): return 1 + entries.reduce(0) { $0 + 1 + count($1.value) }
        default: return 1
        }
    }

    static func bigEndian(_ v: UInt64, size: Int) -> [UInt8] {
        (0..<size).reversed().map { UInt8(truncatingIfNeeded: v >> (8 * UInt64($0))) }
    }

    private static func header(_ kind: UInt8, _ length: Int) -> [UInt8] {
        if length < 15 { return [kind << 4 | UInt8(length)] }
        return [kind << 4 | 0x0F] + intObject(Int64(length))
    }

    private static func intObject(_ n: Int64) -> [UInt8] {
        if n >= 0 && n < 256 { return [0x10, UInt8(n)] }
        if n >= 0 && n < 65536 { return [0x11] + bigEndian(UInt64(n), size: 2) }
        if n >= 0 && n < 1 << 32 { return [0x12] + bigEndian(UInt64(n), size: 4) }
        return [0x13] + bigEndian(UInt64(bitPattern: n), size: 8)
    }

    private mutating func add(_ value: PlistValue, refSize: Int) -> Int {
        let index = objects.count
        objects.append([])
        var bytes: [UInt8]
        switch value {
        case .bool(let b): bytes = [b ? 0x09 : 0x08]
        case .integer(let n): bytes = Self.intObject(n)
        case .real(let d): bytes = [0x23] + Self.bigEndian(d.bitPattern, size: 8)
        case .date: fatalError("dates are not written by this test writer")
        case .data(let d): bytes = Self.header(0x4, d.count) + d
        case .string(let s):
            if s.unicodeScalars.allSatisfy({ $0.isASCII }) {
                bytes = Self.header(0x5, s.utf8.count) + Array(s.utf8)
            } else {
                let units = Array(s.utf16)
                bytes = Self.header(0x6, units.count) + units.flatMap { [UInt8($0 >> 8), UInt8($0 & 0xFF)] }
            }
        case .array(let items):
            let refs = items.map { add($0, refSize: refSize) }
            bytes = Self.header(0xA, items.count) + refs.flatMap { Self.bigEndian(UInt64($0), size: refSize) }
        case .dictionary(let entries):
            let keyRefs = entries.map { add(.string($0.key), refSize: refSize) }
            let valueRefs = entries.map { add($0.value, refSize: refSize) }
            bytes = Self.header(0xD, entries.count) + (keyRefs + valueRefs).flatMap { Self.bigEndian(UInt64($0), size: refSize) }
        }
        objects[index] = bytes
        return index
    }
}

/// A manifest as a `PlistValue`, for binary tests.
func appValue(id: String = "com.x.Foo", name: PlistValue? = .string("Foo"), version: PlistValue = .string("1"),
              containers: [(key: String, value: PlistValue)]) -> PlistValue {
    var top: [(key: String, value: PlistValue)] = [(key: "CFBundleIdentifier", value: .string(id))]
    if let name { top.append((key: "CFBundleName", value: name)) }
    top.append((key: "CFBundleVersion", value: version))
    top.append((key: "NSUbiquitousContainers", value: .dictionary(containers)))
    return .dictionary(top)
}

func settingsValue(isPublic: PlistValue? = .bool(true), name: PlistValue? = .string("Foo"),
                   levels: PlistValue? = .string("None")) -> PlistValue {
    var s: [(key: String, value: PlistValue)] = []
    if let isPublic { s.append((key: "NSUbiquitousContainerIsDocumentScopePublic", value: isPublic)) }
    if let name { s.append((key: "NSUbiquitousContainerName", value: name)) }
    if let levels { s.append((key: "NSUbiquitousContainerSupportedFolderLevels", value: levels)) }
    return .dictionary(s)
}
