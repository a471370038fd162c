// Validation of one app manifest: required keys, types, `$(NAME)` expansion, container settings.
//
// Every problem is one Diagnostic naming the file and the key. A manifest with any *error* is left
// out entirely (no partial app); warnings never exclude.

import Foundation

enum Keys {
    static let bundleIdentifier = "CFBundleIdentifier"
    static let bundleName = "CFBundleName"
    static let bundleVersion = "CFBundleVersion"
    static let containers = "NSUbiquitousContainers"
    static let isPublic = "NSUbiquitousContainerIsDocumentScopePublic"
    static let name = "NSUbiquitousContainerName"
    static let levels = "NSUbiquitousContainerSupportedFolderLevels"
    static let containerSettings: [String] = [isPublic, name, levels]
}

/// Why a container name cannot be a folder name, or nil when it can.
func folderNameProblem(_ name: String) -> (problem: String, fix: String)? {
    let bytes = name.utf8.count
    if name.isEmpty { return ("is empty, which cannot be a folder name", "give the container a name, e.g. the app's name") }
    // The length first: it costs nothing, while scanning a megabytes-long CFBundleName for each of
    // thousands of containers that default to it would take minutes.
    if bytes > 255 { return ("is \(bytes) bytes long in UTF-8; a folder name holds at most 255", "shorten it") }
    if name == "." || name == ".." { return ("\(quoted(name)) cannot be a folder name", "choose another name") }
    if name.utf8.contains(0) { return ("\(quoted(name)) contains a NUL character, which cannot be in a folder name", "remove it") }
    if name.utf8.contains(UInt8(ascii: "/")) { return ("\(quoted(name)) contains \"/\", which cannot be in a folder name", "choose a name without \"/\"") }
    return nil
}

/// A reverse-DNS identifier: dot-separated non-empty parts of ASCII letters, digits and hyphens.
func isValidReverseDNS(_ s: Substring.UTF8View) -> Bool {
    let parts = s.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
    return !parts.isEmpty && parts.allSatisfy { part in
        !part.isEmpty && part.allSatisfy { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == UInt8(ascii: "-")
        }
    }
}

/// How deep `$(NAME)` references may nest: a value referring to a key whose value refers to another...
let maximumReferenceNesting = 32

/// The longest value `$(NAME)` expansion may build.
let maximumExpandedBytes = 4096

struct ManifestParser {
    let path: String
    private(set) var diagnostics: [Diagnostic] = []

    /// The top-level dictionary: first value of each key, and the keys that appear more than once.
    private var top: [String: PlistValue] = [:]
    private var duplicateTopKeys: Set<String> = []
    private var reportedDuplicates: Set<String> = []
    private var resolved: [String: Resolution] = [:]

    private enum Resolution {
        case value(String)
        case failed                 // already reported
        case missing
        case notString(String)      // the value's type description
        case cycle([String])
    }

    init(path: String) { self.path = path }

    var hasErrors: Bool { diagnostics.contains { $0.severity == .error } }

    private mutating func error(_ key: String?, _ message: String, _ fix: String) {
        diagnostics.append(Diagnostic(severity: .error, file: path, key: key, message: message, fix: fix))
    }

    private mutating func warning(_ key: String?, _ message: String, _ fix: String) {
        diagnostics.append(Diagnostic(severity: .warning, file: path, key: key, message: message, fix: fix))
    }

    // MARK: Entry point

    /// Parses the bytes of one manifest. Returns the manifest when it has no errors.
    mutating func parse(_ bytes: [UInt8]) -> AppManifest? {
        let root: PlistValue
        do {
            (root, _) = try readPropertyList(bytes)
        } catch {
            let fix = bytes.starts(with: Array("bplist".utf8))
                ? "regenerate it as a bplist00 or XML property list (e.g. plutil -convert xml1, or python3's plistlib)"
                : "fix it so it is an XML property list (<plist><dict>…</dict></plist>); xmllint --noout shows where the XML breaks"
            self.error(nil, error.message, error.fix ?? fix)
            return nil
        }
        guard case .dictionary(let entries) = root else {
            error(nil, "the top level is \(root.typeDescription), not a dictionary",
                  "make the top-level value a <dict> with CFBundleIdentifier, CFBundleVersion and NSUbiquitousContainers")
            return nil
        }
        for (key, value) in entries {
            if top[key] == nil { top[key] = value } else { duplicateTopKeys.insert(key) }
        }
        return manifest()
    }

    private mutating func manifest() -> AppManifest? {
        // CFBundleIdentifier: required string, reverse DNS.
        var bundleID: String?
        switch topString(Keys.bundleIdentifier) {
        case .value(let id):
            if isValidReverseDNS(Substring(id).utf8) {
                bundleID = id
            } else {
                error(Keys.bundleIdentifier, "\(quoted(id)) is not a valid bundle identifier",
                      "use letters, digits, hyphens and dots in reverse-DNS form, e.g. com.example.App")
            }
        case .missing:
            error(Keys.bundleIdentifier, "is missing",
                  "add the app's bundle identifier, e.g. <key>CFBundleIdentifier</key><string>com.example.App</string>")
        case .notString(let type):
            error(Keys.bundleIdentifier, "is \(type), expected a string",
                  "write it as <string>com.example.App</string>")
        case .failed, .cycle: break
        }

        // CFBundleName: optional string; the default container name.
        var bundleName: String?
        var bundleNameFailed = false
        switch topString(Keys.bundleName) {
        case .value(let name): bundleName = name
        case .missing: break
        case .notString(let type):
            bundleNameFailed = true
            error(Keys.bundleName, "is \(type), expected a string", "write the app's name as a <string>")
        case .failed, .cycle: bundleNameFailed = true
        }

        // CFBundleVersion: required string of digits and dots.
        var bundleVersion: String?
        switch topString(Keys.bundleVersion) {
        case .value(let version):
            if isValidBundleVersion(version) {
                bundleVersion = version
            } else {
                error(Keys.bundleVersion, "\(quoted(version)) is not a version of digits and dots",
                      "use digits and dots only, e.g. 1, 12 or 1.2.3")
            }
        case .missing:
            error(Keys.bundleVersion, "is missing",
                  "add the build version, e.g. <key>CFBundleVersion</key><string>1</string>")
        case .notString(let type):
            error(Keys.bundleVersion, "is \(type), expected a string",
                  "write it as a string of digits and dots, e.g. <string>1</string>")
        case .failed, .cycle: break
        }

        // NSUbiquitousContainers: required, non-empty dictionary.
        let containers = containerDeclarations(bundleID: bundleID, bundleName: bundleName,
                                               bundleNameFailed: bundleNameFailed)

        guard !hasErrors, let bundleID, let bundleVersion, let containers else { return nil }
        return AppManifest(path: path, bundleIdentifier: bundleID, bundleName: bundleName ?? "",
                           bundleVersion: bundleVersion, containers: containers)
    }

    // MARK: Containers

    private mutating func containerDeclarations(bundleID: String?, bundleName: String?,
                                                bundleNameFailed: Bool) -> [ContainerDeclaration]? {
        noteDuplicate(Keys.containers)
        guard let value = top[Keys.containers] else {
            error(Keys.containers, "is missing, so the app declares no container",
                  "add an NSUbiquitousContainers dictionary with the app's container, e.g. iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)")
            return nil
        }
        guard case .dictionary(let entries) = value else {
            error(Keys.containers, "is \(value.typeDescription), expected a dictionary of container identifier to settings",
                  "write it as <dict><key>iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)</key><dict>…</dict></dict>")
            return nil
        }
        guard !entries.isEmpty else {
            error(Keys.containers, "is empty, so the app declares no container",
                  "add the app's container, e.g. <key>iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)</key> with its settings")
            return nil
        }

        var declarations: [ContainerDeclaration] = []
        var rawKeysSeen: Set<String> = []
        var identifiersSeen: [String: String] = [:]   // expanded identifier -> raw key
        var failed = false
        for (rawKey, settingsValue) in entries {
            let rawPath = "\(Keys.containers).\(rawKey)"
            guard rawKeysSeen.insert(rawKey).inserted else {
                if reportedDuplicates.insert(rawPath).inserted {
                    error(rawPath, "is declared more than once", "keep one entry for each container")
                }
                failed = true
                continue
            }
            guard let identifier = expand(rawKey, at: rawPath) else { failed = true; continue }
            let keyPath = "\(Keys.containers).\(identifier)"
            if let earlier = identifiersSeen[identifier] {
                error(keyPath, "is declared twice (as \(quoted(earlier)) and \(quoted(rawKey)))", "keep one entry for each container")
                failed = true
                continue
            }
            identifiersSeen[identifier] = rawKey
            if let bundleID, !checkIdentifier(identifier, bundleID: bundleID, keyPath: keyPath) { failed = true }

            guard case .dictionary(let settingsEntries) = settingsValue else {
                error(keyPath, "is \(settingsValue.typeDescription), expected a dictionary of container settings",
                      "write it as <dict> with NSUbiquitousContainerIsDocumentScopePublic, NSUbiquitousContainerName and NSUbiquitousContainerSupportedFolderLevels")
                failed = true
                continue
            }
            guard let declaration = settings(settingsEntries, identifier: identifier, keyPath: keyPath,
                                             bundleName: bundleName, bundleNameFailed: bundleNameFailed) else {
                failed = true
                continue
            }
            declarations.append(declaration)
        }
        return failed ? nil : declarations
    }

    private mutating func checkIdentifier(_ identifier: String, bundleID: String, keyPath: String) -> Bool {
        let expected = "iCloud." + bundleID
        let shown = oneLine(expected).text   // a valid bundle identifier can still be megabytes long
        let fix = "use \(shown) (write it as iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)) or \(shown).<suffix>"
        let id = identifier.utf8
        if id.elementsEqual(expected.utf8) { return true }
        if id.starts(with: (expected + ".").utf8) {
            let suffix = Substring(identifier).utf8.dropFirst(expected.utf8.count + 1)
            if isValidReverseDNS(suffix) { return true }
            error(keyPath, "\(quoted(identifier)) has an invalid suffix after \(shown).",
                  "use letters, digits and hyphens in dot-separated parts, e.g. \(shown).Shared")
            return false
        }
        error(keyPath, "\(quoted(identifier)) does not match the bundle identifier \(oneLine(bundleID).text)", fix)
        return false
    }

    private mutating func settings(_ entries: [(key: String, value: PlistValue)], identifier: String, keyPath: String,
                                   bundleName: String?, bundleNameFailed: Bool) -> ContainerDeclaration? {
        var first: [String: PlistValue] = [:]
        var ok = true
        for (key, value) in entries {
            if first[key] == nil {
                first[key] = value
                if !Keys.containerSettings.contains(key) {
                    warning("\(keyPath).\(key)", "is not a container setting and is ignored",
                            "remove it or correct the spelling (\(Keys.containerSettings.joined(separator: ", ")))")
                }
            } else if Keys.containerSettings.contains(key), reportedDuplicates.insert("\(keyPath).\(key)").inserted {
                error("\(keyPath).\(key)", "appears more than once", "keep one")
                ok = false
            }
        }

        // NSUbiquitousContainerIsDocumentScopePublic: Boolean, default false.
        var isPublic = false
        let publicPath = "\(keyPath).\(Keys.isPublic)"
        switch first[Keys.isPublic] {
        case nil: break
        case .bool(let b)?: isPublic = b
        case let other?:
            error(publicPath, "is \(describe(other)), expected a Boolean", "write <true/> or <false/>")
            ok = false
        }

        // NSUbiquitousContainerName: string, default CFBundleName; must be a valid folder name.
        var name: String?
        let namePath = "\(keyPath).\(Keys.name)"
        switch first[Keys.name] {
        case nil:
            if let bundleName {
                if let (problem, _) = folderNameProblem(bundleName) {
                    error(namePath, "is missing, and the default from CFBundleName \(problem)",
                          "set NSUbiquitousContainerName to a valid folder name")
                    ok = false
                } else {
                    name = bundleName
                }
            } else if bundleNameFailed {
                ok = false
            } else {
                error(namePath, "is missing and CFBundleName is not set, so the container has no name",
                      "add NSUbiquitousContainerName (the folder name shown in the drive view) or CFBundleName")
                ok = false
            }
        case .string(let raw)?:
            if let expanded = expand(raw, at: namePath) {
                if let (problem, fix) = folderNameProblem(expanded) {
                    error(namePath, problem, fix)
                    ok = false
                } else {
                    name = expanded
                }
            } else {
                ok = false
            }
        case let other?:
            error(namePath, "is \(describe(other)), expected a string", "write the folder name as a <string>")
            ok = false
        }

        // NSUbiquitousContainerSupportedFolderLevels: None | One | Any; missing means None (with a warning).
        var levels = FolderLevels.none
        var levelsDefaulted = false
        let levelsPath = "\(keyPath).\(Keys.levels)"
        switch first[Keys.levels] {
        case nil:
            levelsDefaulted = true
            warning(levelsPath, "is missing; assumed None (no folders can be created in Documents)",
                    "add <key>NSUbiquitousContainerSupportedFolderLevels</key><string>None</string> (or One or Any) to say so")
        case .string(let raw)?:
            if let expanded = expand(raw, at: levelsPath) {
                if let l = FolderLevels(rawValue: expanded) {
                    levels = l
                } else {
                    let hint = FolderLevels.allCases.first { $0.rawValue.lowercased() == expanded.lowercased() }
                    error(levelsPath, "\(quoted(expanded)) is not a folder level",
                          hint.map { "use None, One or Any (write \($0.rawValue), with that capitalization)" } ?? "use None, One or Any")
                    ok = false
                }
            } else {
                ok = false
            }
        case let other?:
            error(levelsPath, "is \(describe(other)), expected a string", "write <string>None</string>, <string>One</string> or <string>Any</string>")
            ok = false
        }

        guard ok, let name else { return nil }
        return ContainerDeclaration(identifier: identifier,
                                    settings: ContainerSettings(isPublic: isPublic, name: name, folderLevels: levels),
                                    levelsDefaulted: levelsDefaulted)
    }

    /// "a string (\"YES\")", "an integer (1)": the type, and the value when it is short.
    private func describe(_ value: PlistValue) -> String {
        switch value {
        case .string(let s): return s.count <= 40 ? "a string (\(quoted(s)))" : "a string"
        case .integer(let n): return "an integer (\(n))"
        case .bool(let b): return "a Boolean (\(b))"
        case .real(let d): return "a real number (\(d))"
        default: return value.typeDescription
        }
    }

    // MARK: Top-level strings and $(NAME) expansion

    private mutating func noteDuplicate(_ key: String) {
        if duplicateTopKeys.contains(key), reportedDuplicates.insert(key).inserted {
            error(key, "appears more than once at the top level", "keep one")
        }
    }

    /// A top-level string value, expanded; errors inside the value are reported at its key.
    private mutating func topString(_ key: String) -> Resolution {
        resolveTopKey(key, stack: [])
    }

    private mutating func resolveTopKey(_ key: String, stack: [String]) -> Resolution {
        if let i = stack.firstIndex(of: key) { return .cycle(Array(stack[i...]) + [key]) }
        if let done = resolved[key] { return done }
        let result: Resolution
        switch top[key] {
        case _ where duplicateTopKeys.contains(key):
            noteDuplicate(key)
            result = .failed
        case nil: result = .missing
        case .string(let raw)?:
            result = expand(raw, at: key, stack: stack + [key]).map(Resolution.value) ?? .failed
        case let other?: result = .notString(other.typeDescription)
        }
        resolved[key] = result
        return result
    }

    private static func variableKey(_ name: String) -> String {
        switch name {
        case "PRODUCT_BUNDLE_IDENTIFIER": return Keys.bundleIdentifier
        case "PRODUCT_NAME": return Keys.bundleName
        default: return name
        }
    }

    private static func isVariableName(_ s: Substring) -> Bool {
        guard let first = s.unicodeScalars.first, first == "_" || (first.isASCII && first.properties.isAlphabetic) else { return false }
        return s.unicodeScalars.allSatisfy { $0 == "_" || ($0.isASCII && ($0.properties.isAlphabetic || $0.properties.numericType != nil)) }
    }

    private static let modifiers = ["rfc1034identifier", "c99extidentifier", "identifier", "lower", "upper"]

    private static func apply(_ modifier: String, to value: String) -> String {
        func map(_ keep: (Unicode.Scalar) -> Bool, _ replacement: Character) -> String {
            String(value.unicodeScalars.map { keep($0) ? Character($0) : replacement })
        }
        let alnum: (Unicode.Scalar) -> Bool = { $0.isASCII && ($0.properties.isAlphabetic || $0.properties.numericType != nil) }
        switch modifier {
        case "rfc1034identifier": return map({ alnum($0) || $0 == "-" || $0 == "." }, "-")
        case "c99extidentifier", "identifier": return map({ alnum($0) || $0 == "_" }, "_")
        case "lower": return value.lowercased()
        case "upper": return value.uppercased()
        default: return value
        }
    }

    /// Expands `$(NAME)` and `$(NAME:modifier)` references in `value`, reporting problems at `key`.
    private mutating func expand(_ value: String, at key: String, stack: [String] = []) -> String? {
        var out = ""
        var rest = Substring(value)
        while let start = rest.range(of: "$(") {
            out += rest[..<start.lowerBound]
            let after = rest[start.upperBound...]
            guard let close = after.firstIndex(of: ")") else {
                error(key, "\(quoted(value)) has \"$(\" without a closing \")\"",
                      "close the reference, e.g. $(PRODUCT_BUNDLE_IDENTIFIER), or remove it")
                return nil
            }
            let reference = after[..<close]
            let parts = reference.split(separator: ":", omittingEmptySubsequences: false)
            let name = parts[0]
            guard Self.isVariableName(name) else {
                error(key, "\(quoted(value)) has $(\(oneLine(reference).text)), which is not a build-setting reference",
                      "write $(NAME) with a name of letters, digits and underscores, e.g. $(PRODUCT_BUNDLE_IDENTIFIER)")
                return nil
            }
            for modifier in parts.dropFirst() where !Self.modifiers.contains(String(modifier)) {
                error(key, "\(quoted(value)) uses the unsupported modifier :\(oneLine(modifier).text) in $(\(oneLine(reference).text))",
                      "use one of :\(Self.modifiers.joined(separator: ", :")), or write the value literally")
                return nil
            }
            let variable = String(name)
            let shown = oneLine(variable).text   // names may be megabytes long
            let target = Self.variableKey(variable)
            // Each nested reference is a level of recursion: a chain through 100,000 keys overflowed
            // the stack. An Info.plist nests one or two.
            guard stack.count < maximumReferenceNesting else {
                error(key, "\(quoted(value)) is reached through more than \(maximumReferenceNesting) nested $(…) references, starting at \(oneLine(stack[0]).text)",
                      "write one of the values on the way literally")
                return nil
            }
            var substitution: String
            switch resolveTopKey(target, stack: stack) {
            case .value(let v):
                substitution = v
            case .failed:
                return nil
            case .cycle(let chain):
                if chain.count == 2 {
                    let via = target == variable ? "" : " (\(shown) is \(target))"
                    error(key, "\(quoted(value)) refers to itself through $(\(shown))\(via)",
                          key == Keys.bundleIdentifier
                            ? "write the literal bundle identifier, as a built app's Info.plist has it, e.g. com.example.App"
                            : "write the value literally")
                } else {
                    error(key, "\(quoted(value)) refers back to itself: \(chain.map { oneLine($0).text }.joined(separator: " → "))",
                          "write one of these values literally")
                }
                return nil
            case .missing:
                switch variable {
                case "PRODUCT_BUNDLE_IDENTIFIER":
                    return nil   // CFBundleIdentifier is required; its absence is reported there
                case "PRODUCT_NAME":
                    error(key, "\(quoted(value)) uses $(PRODUCT_NAME), but the manifest has no CFBundleName",
                          "add CFBundleName or write the value literally")
                default:
                    error(key, "\(quoted(value)) uses the unknown build setting $(\(shown))",
                          "use $(PRODUCT_BUNDLE_IDENTIFIER) or $(PRODUCT_NAME), add a top-level string key \(shown), or write the value literally")
                }
                return nil
            case .notString(let type):
                if target == Keys.bundleIdentifier || target == Keys.bundleName { return nil }   // reported at that key
                error(key, "\(quoted(value)) uses $(\(shown)), but the top-level \(shown) is \(type), not a string",
                      "make \(shown) a string or write the value literally")
                return nil
            }
            // References repeated at each level double the length per level (2^64 bytes from 64 keys),
            // and copying a long value into each of thousands of containers takes minutes.
            guard out.utf8.count + substitution.utf8.count <= maximumExpandedBytes else {
                error(key, "\(quoted(value)) expands to more than \(maximumExpandedBytes) bytes",
                      "write the value literally; an identifier, name or version is a few hundred bytes at most")
                return nil
            }
            for modifier in parts.dropFirst() { substitution = Self.apply(String(modifier), to: substitution) }
            out += substitution
            rest = after[after.index(after: close)...]
        }
        out += rest
        return out
    }
}
