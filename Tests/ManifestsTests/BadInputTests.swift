import Foundation
import XCTest
@testable import UbiquityManifests

/// Each bad input gives one clear line naming the file and the key, and the other manifests still load.
final class BadInputTests: XCTestCase {
    private let levelsKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerSupportedFolderLevels"
    private let nameKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerName"
    private let publicKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerIsDocumentScopePublic"

    /// Loads a bad manifest and asserts it gives exactly these lines (folder prefix removed).
    private func assertLines(_ bad: String, _ expected: [String], file: StaticString = #filePath, line: UInt = #line) {
        let (diagnostics, dir) = loadBad(bad, file: file, line: line)
        XCTAssertEqual(lines(diagnostics, in: dir), expected, file: file, line: line)
    }

    private func assertLines(_ bad: [UInt8], _ expected: [String], file: StaticString = #filePath, line: UInt = #line) {
        let (diagnostics, dir) = loadBad(bad, file: file, line: line)
        XCTAssertEqual(lines(diagnostics, in: dir), expected, file: file, line: line)
    }

    // MARK: Files that are not property lists

    func testMalformedXML() {
        let (diagnostics, _) = loadBad(plistXML("<key>CFBundleIdentifier</key><string>com.x.Foo</dict>"))
        XCTAssertEqual(diagnostics.count, 1)
        XCTAssertNil(diagnostics[0].key)
        XCTAssertTrue(diagnostics[0].message.hasPrefix("the file is not well-formed XML (syntax error at line "), diagnostics[0].message)
        XCTAssertTrue(diagnostics[0].fix.contains("xmllint"))
    }

    func testTruncatedXML() {
        let (diagnostics, _) = loadBad(String(appXML().prefix(200)))
        XCTAssertEqual(diagnostics.count, 1)
        XCTAssertNil(diagnostics[0].key)
        XCTAssertTrue(diagnostics[0].message.hasPrefix("the file is not well-formed XML"), diagnostics[0].message)
    }

    func testWellFormedXMLThatIsNotAPlist() {
        assertLines(plistXML("<key>A</key><string>x</string><key>B</key>"), [
            "Bad.plist: error: the file is not a valid XML property list: the key \"B\" has no value at line 6; fix it so it is an XML property list (<plist><dict>…</dict></plist>); xmllint --noout shows where the XML breaks",
        ])
        let (unknown, _) = loadBad(plistXML("<key>A</key><thing>x</thing>"))
        XCTAssertEqual(unknown.map(\.message), ["the file is not a valid XML property list: unknown element <thing> at line 5"])
        let (badInteger, _) = loadBad(plistXML("<key>A</key><integer>twelve</integer>"))
        XCTAssertEqual(badInteger.map(\.message), ["the file is not a valid XML property list: \"twelve\" is not an integer at line 5"])
    }

    func testEmptyAndGarbageFiles() {
        assertLines("", ["Bad.plist: error: the file is empty; fix it so it is an XML property list (<plist><dict>…</dict></plist>); xmllint --noout shows where the XML breaks"])
        let (garbage, _) = loadBad("CFBundleIdentifier = com.x.Foo")
        XCTAssertEqual(garbage.map(\.message), ["the file is neither an XML nor a binary (bplist00) property list"])
    }

    func testTopLevelNotADictionary() {
        assertLines("<?xml version=\"1.0\"?><plist version=\"1.0\"><array><string>x</string></array></plist>", [
            "Bad.plist: error: the top level is an array, not a dictionary; make the top-level value a <dict> with CFBundleIdentifier, CFBundleVersion and NSUbiquitousContainers",
        ])
    }

    func testBrokenSymbolicLink() throws {
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("Good.plist", goodManifest)
        try FileManager.default.createSymbolicLink(atPath: dir.file("Gone.plist"), withDestinationPath: dir.file("nowhere.plist"))
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.manifests.map(\.bundleIdentifier), ["com.x.Good"])
        XCTAssertEqual(lines(load.diagnostics, in: dir.path), [
            "Gone.plist: error: the file cannot be read: it is a broken symbolic link; point the link at a manifest or remove it",
        ])
    }

    func testFIFOIsNotOpened() throws {
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("Good.plist", goodManifest)
        XCTAssertEqual(mkfifo(dir.file("Pipe.plist"), 0o644), 0)
        let load = loadManifests(directory: dir.path)   // would block if it opened the FIFO
        XCTAssertEqual(load.manifests.map(\.bundleIdentifier), ["com.x.Good"])
        XCTAssertEqual(lines(load.diagnostics, in: dir.path), [
            "Pipe.plist: error: is not a regular file (a FIFO, socket or device); remove it from the manifests folder",
        ])
    }

    func testFolderNamedLikeAManifest() throws {
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("Good.plist", goodManifest)
        try FileManager.default.createDirectory(atPath: dir.file("X.plist"), withIntermediateDirectories: false)
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.manifests.map(\.bundleIdentifier), ["com.x.Good"])
        XCTAssertEqual(lines(load.diagnostics, in: dir.path), [
            "X.plist: error: is a folder, not a manifest file (and it holds no Info.plist); put the app's Info.plist inside it, or rename or remove the folder",
        ])
    }

    // MARK: Hostile input: nesting, sizes, encodings

    /// Far deeper than the stack could hold if reading or tearing down the value recursed.
    private let hostileDepth = 100_000

    func testDeeplyNestedXMLIsRefused() {
        for (open, close) in [("<array>", "</array>"), ("<dict><key>k</key>", "</dict>")] {
            let body = "<key>Deep</key>" + String(repeating: open, count: hostileDepth) + "<true/>"
                + String(repeating: close, count: hostileDepth)
            assertLines(appXML(extra: body), [
                "Bad.plist: error: the file is not a valid XML property list: arrays and dictionaries are nested more than 512 levels deep at line 8; an Info.plist nests a few levels; remove the deep nesting",
            ])
        }
    }

    func testNestingUpToTheLimitLoads() {
        let body = "<key>Deep</key>" + String(repeating: "<array>", count: 500) + String(repeating: "</array>", count: 500)
        XCTAssertEqual(loadOne(appXML(extra: body)).diagnostics, [])
    }

    func testDeeplyNestedBinaryIsRefused() {
        // Object k is a one-element array holding object k+1; the last is `false`.
        var body: [UInt8] = []
        var offsets: [Int] = []
        for k in 0..<hostileDepth {
            offsets.append(8 + body.count)
            if k == hostileDepth - 1 { body.append(0x08) } else { body += [0xA1] + BinaryPlistWriter.bigEndian(UInt64(k + 1), size: 4) }
        }
        var bytes = Array("bplist00".utf8) + body
        let table = bytes.count
        for o in offsets { bytes += BinaryPlistWriter.bigEndian(UInt64(o), size: 4) }
        bytes += [0, 0, 0, 0, 0, 0, 4, 4] + BinaryPlistWriter.bigEndian(UInt64(hostileDepth), size: 8)
            + BinaryPlistWriter.bigEndian(0, size: 8) + BinaryPlistWriter.bigEndian(UInt64(table), size: 8)
        let (diagnostics, _) = loadBad(bytes)
        XCTAssertEqual(diagnostics.map(\.message), [
            "the file is not a valid binary property list: arrays and dictionaries are nested more than 512 levels deep",
        ])
    }

    func testValueOverTheXMLReadersLimit() {
        // Valid for Apple's readers, but libxml2 (without XML_PARSE_HUGE) stops at 10,000,000 bytes.
        let big = String(repeating: "a", count: 15_000_000)
        assertLines(appXML(extra: "<key>Big</key>\n<string>\(big)</string>"), [
            "Bad.plist: error: a value at line 9 is 15000000 bytes long; the XML reader (libxml2) stops at 10000000 bytes, so values this long cannot be read; shorten the value; an Info.plist value is a few KB at most",
        ])
    }

    func testInvalidUTF8IsReportedWhereItIs() {
        var bytes = Array(appXML(extra: "<key>A</key><string>x</string>").utf8)
        let at = bytes.firstRange(of: Array("<key>A".utf8))!.lowerBound + 2   // inside the element name
        bytes[at] = 0xFF
        assertLines(bytes, [
            "Bad.plist: error: the file is not valid UTF-8: byte 0xFF at line \(lineAndColumn(of: at, in: bytes).line), column 3 is not part of a UTF-8 character; save the file as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8), or declare its encoding in <?xml … encoding=\"…\"?>",
        ])
        // Also in a value, and for a truncated sequence or an overlong encoding.
        for bad: [UInt8] in [[0xC3], [0xC0, 0xAF], [0xED, 0xA0, 0x80]] {
            var b = Array(appXML(extra: "<key>A</key><string>x</string>").utf8)
            let v = b.firstRange(of: Array(">x<".utf8))!.lowerBound + 1
            b.replaceSubrange(v..<(v + 1), with: bad)
            let (diagnostics, _) = loadBad(b)
            XCTAssertEqual(diagnostics.count, 1)
            XCTAssertTrue(diagnostics[0].message.hasPrefix("the file is not valid UTF-8: byte 0x\(String(bad[0], radix: 16, uppercase: true)) at line "), diagnostics[0].message)
        }
        // A file that declares another encoding is converted from it, however it spaces the declaration.
        for declaration in ["encoding=\"ISO-8859-1\"", "encoding = 'ISO-8859-1'", "encoding\n=\t\"latin1\""] {
            let text = try? utf8Text(Array("<?xml version=\"1.0\" \(declaration)?><plist/>".utf8) + [0xE9])
            XCTAssertEqual(text.flatMap { invalidUTF8($0) }, nil, declaration)
            XCTAssertEqual(text?.suffix(2), [0xC3, 0xA9], declaration)
        }
        XCTAssertEqual(invalidUTF8(Array("<?xml version=\"1.0\" encoding = \"UTF-8\"?>".utf8) + [0xE9]), 40)
        // Valid multi-byte UTF-8 is fine.
        XCTAssertNil(invalidUTF8(Array("Café ☕ 𝄞".utf8)))
    }

    // MARK: Found by fuzzing (FuzzTests)

    func testWideXMLIsReadInLinearTime() {
        // Each append copied the whole array or text (a copy stayed on the reader's stack), so these
        // took minutes; libxml2 hands over text in pieces, one per entity reference.
        let entries = (0..<100_000).map { "<key>k\($0)</key><true/>" }.joined()
        let items = "<key>Wide</key><array>" + String(repeating: "<true/>", count: 100_000) + "</array>"
        let text = "<key>Long</key><string>" + String(repeating: "&amp;", count: 300_000) + "</string>"
        let started = Date()
        let load = loadOne(appXML(extra: entries + items + text))
        XCTAssertEqual(load.manifests.count, 1, "\(load.diagnostics.prefix(3))")
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
    }

    func testLongValuesAreCutInMessages() {
        // Messages quoted whole values: a 1 MB identifier made a 1 MB line.
        let id = String(repeating: "a b ", count: 250_000)
        assertLines(appXML(id: id, containers: containerXML("iCloud.com.x.Foo")), [
            "Bad.plist: error: CFBundleIdentifier: \"\(id.prefix(300))…\" (1000000 bytes) is not a valid bundle identifier; use letters, digits, hyphens and dots in reverse-DNS form, e.g. com.example.App",
        ])
        let element = String(repeating: "x", count: 40_000)
        let (diagnostics, _) = loadBad(plistXML("<key>A</key><\(element)/>"))
        XCTAssertEqual(diagnostics.map(\.message), ["the file is not a valid XML property list: unknown element <\(element.prefix(300))…> at line 5"])
    }

    func testLineBreaksInKeysAndReferencesStayEscaped() {
        // Key paths and $(…) references were put in the line as written, line breaks included.
        let (diagnostics, dir) = loadBad(appXML(containers: containerXML("iCloud.com.x.Foo\nEvil", settingsXML(extra: "<key>Odd\u{2028}Key</key><true/>"))
            + containerXML("iCloud.com.x.Foo.B", settingsXML(name: "<string>$(PRODUCT_NAME:lo\nwer)</string>"))))
        XCTAssertEqual(lines(diagnostics, in: dir), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo\\nEvil: \"iCloud.com.x.Foo\\nEvil\" does not match the bundle identifier com.x.Foo; use iCloud.com.x.Foo (write it as iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)) or iCloud.com.x.Foo.<suffix>",
            "Bad.plist: warning: NSUbiquitousContainers.iCloud.com.x.Foo\\nEvil.Odd\\u{2028}Key: is not a container setting and is ignored; remove it or correct the spelling (NSUbiquitousContainerIsDocumentScopePublic, NSUbiquitousContainerName, NSUbiquitousContainerSupportedFolderLevels)",
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo.B.NSUbiquitousContainerName: \"$(PRODUCT_NAME:lo\\nwer)\" uses the unsupported modifier :lo\\nwer in $(PRODUCT_NAME:lo\\nwer); use one of :rfc1034identifier, :c99extidentifier, :identifier, :lower, :upper, or write the value literally",
        ])
    }

    func testLongReferenceChainIsRefused() {
        // Each nested $(…) reference was a level of recursion: a chain through 100,000 keys crashed
        // with a stack overflow.
        let chain = (0..<100_000).map { "<key>K\($0)</key><string>$(K\($0 + 1))</string>" }.joined() + "<key>K100000</key><string>end</string>"
        assertLines(appXML(name: "$(K0)", extra: chain), [
            "Bad.plist: error: K30: \"$(K31)\" is reached through more than 32 nested $(…) references, starting at CFBundleName; write one of the values on the way literally",
        ])
        // A short chain is fine.
        let short = (0..<10).map { "<key>K\($0)</key><string>$(K\($0 + 1))</string>" }.joined() + "<key>K10</key><string>Foo</string>"
        XCTAssertEqual(loadOne(appXML(name: "$(K0)", extra: short)).manifests.first?.bundleName, "Foo")
    }

    func testDoublingReferencesAreRefused() {
        // Each key refers to the next one twice: 2^31 bytes from 30 keys, built in memory.
        let keys = (0..<30).map { "<key>K\($0)</key><string>$(K\($0 + 1))$(K\($0 + 1))</string>" }.joined() + "<key>K30</key><string>ab</string>"
        assertLines(appXML(name: "$(K0)", extra: keys), [
            "Bad.plist: error: K18: \"$(K19)$(K19)\" expands to more than 4096 bytes; write the value literally; an identifier, name or version is a few hundred bytes at most",
        ])
    }

    func testThousandsOfContainersWithAHugeBundleName() {
        // Each container defaulting to (or referring to) a 2 MB CFBundleName scanned or copied it:
        // 10,000 containers took minutes.
        let name = String(repeating: "n", count: 2_000_000)
        let defaulted = (0..<10_000).map { "<key>iCloud.com.x.Foo.C\($0)</key><dict/>" }.joined()
        let referring = (0..<10_000).map { "<key>iCloud.com.x.Foo.R\($0)</key><dict><key>NSUbiquitousContainerName</key><string>$(PRODUCT_NAME)</string></dict>" }.joined()
        let started = Date()
        let (diagnostics, dir) = loadBad(appXML(name: name, containers: defaulted + referring))
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
        let errors = lines(diagnostics.filter { $0.severity == .error }, in: dir)
        XCTAssertEqual(errors.count, 20_000)
        XCTAssertEqual(errors.first, "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo.C0.NSUbiquitousContainerName: is missing, and the default from CFBundleName is 2000000 bytes long in UTF-8; a folder name holds at most 255; set NSUbiquitousContainerName to a valid folder name")
        XCTAssertEqual(errors.last, "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo.R9999.NSUbiquitousContainerName: \"$(PRODUCT_NAME)\" expands to more than 4096 bytes; write the value literally; an identifier, name or version is a few hundred bytes at most")
    }

    func testXMLParserIsGivenOnlyCheckedUTF8() {
        // libxml2 decodes some files leniently, and Foundation's XMLParser then crashed on what came out:
        // bad UTF-8 in an element name under `encoding="UTF\xFF8"` (to libxml2, "UTF" and an unclosed
        // string: it went on in UTF-8 unchecked), under "UTF-16" without a byte order mark (ignored),
        // or an encoding without a converter; a processing instruction without data (`<?x?>`) read with
        // strlen(NULL), also through UTF-16 or UTF-7; DTD declarations read the same way. Now the reader
        // converts to UTF-8 itself and refuses what XMLParser cannot read.
        func with(encoding: [UInt8], badElementName: Bool = true) -> [UInt8] {
            var bytes = Array(appXML().utf8)
            bytes.replaceSubrange(bytes.firstRange(of: Array("UTF-8".utf8))!, with: encoding)
            if badElementName { bytes[bytes.firstRange(of: Array("<string>".utf8))!.lowerBound + 4] = 0xEE }   // <striîng>
            return bytes
        }
        func message(_ bytes: [UInt8]) -> [String] { loadBad(bytes).diagnostics.map(\.message) }
        XCTAssertEqual(message(with(encoding: Array("UTF".utf8) + [0xFF] + Array("8".utf8))),
                       ["the file is not well-formed XML (the XML declaration <?xml …?> at its start is malformed)"])
        XCTAssertEqual(message(with(encoding: Array("UTF-16".utf8))),
                       ["the file declares the encoding \"UTF-16\", but its text is not in that encoding"])
        XCTAssertEqual(message(with(encoding: Array("bogus".utf8))),
                       ["the file is in the encoding \"bogus\" (as its XML declaration says), which this system cannot convert"])
        XCTAssertEqual(message(with(encoding: Array("US-ASCII".utf8))),
                       ["the file is not valid US-ASCII (as its XML declaration says): the bytes at line 5, column 34 cannot be read in it"])
        XCTAssertEqual(message(Array("<?x?>".utf8) + Array(goodManifest.utf8)), [
            "the file is not a valid XML property list: \"<?x?>\" is a processing instruction without data, which the XML reader cannot read at line 1, column 1",
        ])
        let piInUTF16: [UInt8] = [0xFF, 0xFE] + "<?xml version=\"1.0\" encoding=\"UTF-16\"?><?x?><plist/>".utf16.flatMap { (u: UInt16) -> [UInt8] in [UInt8(u & 0xFF), UInt8(u >> 8)] }
        XCTAssertEqual(message(piInUTF16), [
            "the file is not a valid XML property list: \"<?x?>\" is a processing instruction without data, which the XML reader cannot read at line 1, column 39",
        ])
        XCTAssertEqual(message(Array("<?xml version=\"1.0\" encoding=\"UTF-7\"?>+ADw-?x?+AD4-<plist/>".utf8)), [
            "the file is not a valid XML property list: \"<?x?>\" is a processing instruction without data, which the XML reader cannot read at line 1, column 39",
        ])
        for subset in ["<!ATTLIST a b CDATA #IMPLIED>", "<!NOTATION n SYSTEM \"x\">", "<!ENTITY u SYSTEM \"a\" NDATA n>", "<!ENTITY e \"&#60;?x?>\">"] {
            XCTAssertEqual(message(Array("<?xml version=\"1.0\"?>\n<!DOCTYPE plist [\(subset)]>\n<plist><dict/></plist>".utf8)), [
                "the file is not a valid XML property list: its DOCTYPE has an internal subset ([…]), with declarations a property list does not use at line 2, column 17",
            ], subset)
        }
        // Other encodings still load, converted to UTF-8 first.
        let cafe = appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>Café ☕</string>")))
        let latin1 = cafe.replacingOccurrences(of: "encoding=\"UTF-8\"", with: "encoding=\"windows-1252\"").replacingOccurrences(of: " ☕", with: "")
        var load = loadOne(latin1.unicodeScalars.map { UInt8(truncatingIfNeeded: $0.value) })
        XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, "Café", "\(load.diagnostics)")
        let cafe16 = cafe.replacingOccurrences(of: "encoding=\"UTF-8\"", with: "encoding=\"UTF-16\"")
        let bigEndian: [UInt8] = [0xFE, 0xFF] + cafe16.utf16.flatMap { (u: UInt16) -> [UInt8] in [UInt8(u >> 8), UInt8(u & 0xFF)] }
        load = loadOne(bigEndian)
        XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, "Café ☕", "\(load.diagnostics)")
        XCTAssertEqual(declaredEncoding(Array("<?xml version=\"1.0\" encoding='latin1'?>".utf8)), "latin1")
        XCTAssertEqual(xmlDeclaration(Array("<?xml version=\"1.0x\" encoding=\"latin1\"?>".utf8)), .malformed)
        XCTAssertEqual(xmlDeclaration(Array("<?xml encoding=\"UTF-7\"?>".utf8)), .malformed)
    }

    // MARK: Required keys and types

    func testMissingBundleIdentifier() {
        assertLines(appXML(id: nil), [
            "Bad.plist: error: CFBundleIdentifier: is missing; add the app's bundle identifier, e.g. <key>CFBundleIdentifier</key><string>com.example.App</string>",
        ])
    }

    func testBundleIdentifierWrongTypeAndInvalid() {
        assertLines(appXML(id: nil, extra: "<key>CFBundleIdentifier</key><integer>7</integer>"), [
            "Bad.plist: error: CFBundleIdentifier: is an integer, expected a string; write it as <string>com.example.App</string>",
        ])
        assertLines(appXML(id: "com x Foo"), [
            "Bad.plist: error: CFBundleIdentifier: \"com x Foo\" is not a valid bundle identifier; use letters, digits, hyphens and dots in reverse-DNS form, e.g. com.example.App",
        ])
    }

    func testBundleVersion() {
        assertLines(appXML(version: nil), [
            "Bad.plist: error: CFBundleVersion: is missing; add the build version, e.g. <key>CFBundleVersion</key><string>1</string>",
        ])
        assertLines(appXML(version: "1.0b3"), [
            "Bad.plist: error: CFBundleVersion: \"1.0b3\" is not a version of digits and dots; use digits and dots only, e.g. 1, 12 or 1.2.3",
        ])
        for bad in ["", ".1", "1.", "1..2", "v2", "1 "] {
            let (diagnostics, _) = loadBad(appXML(version: bad))
            XCTAssertEqual(diagnostics.map(\.key), ["CFBundleVersion"], bad)
        }
        assertLines(appXML(version: nil, extra: "<key>CFBundleVersion</key><integer>3</integer>"), [
            "Bad.plist: error: CFBundleVersion: is an integer, expected a string; write it as a string of digits and dots, e.g. <string>1</string>",
        ])
    }

    func testBundleNameWrongType() {
        assertLines(appXML(name: nil, extra: "<key>CFBundleName</key><real>2.5</real>"), [
            "Bad.plist: error: CFBundleName: is a real number, expected a string; write the app's name as a <string>",
        ])
    }

    func testContainersMissingEmptyOrWrongType() {
        assertLines(appXML(containers: nil), [
            "Bad.plist: error: NSUbiquitousContainers: is missing, so the app declares no container; add an NSUbiquitousContainers dictionary with the app's container, e.g. iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)",
        ])
        assertLines(appXML(containers: ""), [
            "Bad.plist: error: NSUbiquitousContainers: is empty, so the app declares no container; add the app's container, e.g. <key>iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)</key> with its settings",
        ])
        assertLines(appXML(containers: nil, extra: "<key>NSUbiquitousContainers</key><array/>"), [
            "Bad.plist: error: NSUbiquitousContainers: is an array, expected a dictionary of container identifier to settings; write it as <dict><key>iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)</key><dict>…</dict></dict>",
        ])
        assertLines(appXML(containers: "<key>iCloud.com.x.Foo</key><string>yes</string>"), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo: is a string, expected a dictionary of container settings; write it as <dict> with NSUbiquitousContainerIsDocumentScopePublic, NSUbiquitousContainerName and NSUbiquitousContainerSupportedFolderLevels",
        ])
    }

    func testPublicWrongType() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(isPublic: "<string>YES</string>"))), [
            "Bad.plist: error: \(publicKey): is a string (\"YES\"), expected a Boolean; write <true/> or <false/>",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(isPublic: "<integer>1</integer>"))), [
            "Bad.plist: error: \(publicKey): is an integer (1), expected a Boolean; write <true/> or <false/>",
        ])
    }

    func testNameWrongTypeAndMissing() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<integer>42</integer>"))), [
            "Bad.plist: error: \(nameKey): is an integer (42), expected a string; write the folder name as a <string>",
        ])
        assertLines(appXML(name: nil, containers: containerXML("iCloud.com.x.Foo", settingsXML(name: nil))), [
            "Bad.plist: error: \(nameKey): is missing and CFBundleName is not set, so the container has no name; add NSUbiquitousContainerName (the folder name shown in the drive view) or CFBundleName",
        ])
    }

    func testNamesThatCannotBeFolderNames() {
        func nameLine(_ xmlName: String) -> [String] {
            let (diagnostics, dir) = loadBad(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>\(xmlName)</string>"))))
            return lines(diagnostics, in: dir)
        }
        XCTAssertEqual(nameLine("Work/Notes"), ["Bad.plist: error: \(nameKey): \"Work/Notes\" contains \"/\", which cannot be in a folder name; choose a name without \"/\""])
        XCTAssertEqual(nameLine("."), ["Bad.plist: error: \(nameKey): \".\" cannot be a folder name; choose another name"])
        XCTAssertEqual(nameLine(".."), ["Bad.plist: error: \(nameKey): \"..\" cannot be a folder name; choose another name"])
        XCTAssertEqual(nameLine(""), ["Bad.plist: error: \(nameKey): is empty, which cannot be a folder name; give the container a name, e.g. the app's name"])
        XCTAssertEqual(nameLine(String(repeating: "a", count: 256)),
                       ["Bad.plist: error: \(nameKey): is 256 bytes long in UTF-8; a folder name holds at most 255; shorten it"])
        // 86 × "☕" is 86 characters but 258 UTF-8 bytes.
        XCTAssertEqual(nameLine(String(repeating: "☕", count: 86)),
                       ["Bad.plist: error: \(nameKey): is 258 bytes long in UTF-8; a folder name holds at most 255; shorten it"])

        // 255 bytes, "...", names with spaces and other Unicode are fine.
        for good in [String(repeating: "b", count: 255), "...", " My Notes ", "Café ☕", ".hidden"] {
            let load = loadOne(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>\(good)</string>"))))
            XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, good)
            XCTAssertEqual(load.diagnostics, [])
        }
    }

    func testDefaultNameFromBundleNameIsCheckedToo() {
        assertLines(appXML(name: "A/B", containers: containerXML("iCloud.com.x.Foo", settingsXML(name: nil))), [
            "Bad.plist: error: \(nameKey): is missing, and the default from CFBundleName \"A/B\" contains \"/\", which cannot be in a folder name; set NSUbiquitousContainerName to a valid folder name",
        ])
    }

    func testUnknownFolderLevel() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<string>Some</string>"))), [
            "Bad.plist: error: \(levelsKey): \"Some\" is not a folder level; use None, One or Any",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<string>any</string>"))), [
            "Bad.plist: error: \(levelsKey): \"any\" is not a folder level; use None, One or Any (write Any, with that capitalization)",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<integer>1</integer>"))), [
            "Bad.plist: error: \(levelsKey): is an integer (1), expected a string; write <string>None</string>, <string>One</string> or <string>Any</string>",
        ])
    }

    // MARK: Container identifiers

    func testContainerIdentifierMustMatchBundleIdentifier() {
        let fix = "use iCloud.com.x.Foo (write it as iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)) or iCloud.com.x.Foo.<suffix>"
        for bad in ["iCloud.com.other.App", "com.x.Foo", "icloud.com.x.Foo", "iCloud.com.x.FooBar", "iCloud.com.x"] {
            let (diagnostics, dir) = loadBad(appXML(containers: containerXML(bad)))
            XCTAssertEqual(lines(diagnostics, in: dir), [
                "Bad.plist: error: NSUbiquitousContainers.\(bad): \"\(bad)\" does not match the bundle identifier com.x.Foo; \(fix)",
            ])
        }
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo.")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo.: \"iCloud.com.x.Foo.\" has an invalid suffix after iCloud.com.x.Foo.; use letters, digits and hyphens in dot-separated parts, e.g. iCloud.com.x.Foo.Shared",
        ])
        // A suffix is fine.
        let load = loadOne(appXML(containers: containerXML("iCloud.com.x.Foo.Shared-2.docs")))
        XCTAssertEqual(load.manifests.first?.containers.map(\.identifier), ["iCloud.com.x.Foo.Shared-2.docs"])
    }

    func testContainerDeclaredTwiceInOneManifest() {
        // Literally twice.
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo") + containerXML("iCloud.com.x.Foo")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo: is declared more than once; keep one entry for each container",
        ])
        // Twice after expansion.
        assertLines(appXML(containers: containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)") + containerXML("iCloud.com.x.Foo")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo: is declared twice (as \"iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)\" and \"iCloud.com.x.Foo\"); keep one entry for each container",
        ])
    }

    func testDuplicateKeys() {
        assertLines(appXML(extra: "<key>CFBundleVersion</key><string>2</string>"), [
            "Bad.plist: error: CFBundleVersion: appears more than once at the top level; keep one",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(extra: "<key>NSUbiquitousContainerName</key><string>Again</string>"))), [
            "Bad.plist: error: \(nameKey): appears more than once; keep one",
        ])
    }

    // MARK: Several problems

    func testEveryProblemOfAManifestIsReportedAndItIsLeftOut() {
        let containers = containerXML("iCloud.com.x.Foo", settingsXML(isPublic: "<string>true</string>", levels: "<string>Many</string>"))
            + containerXML("iCloud.com.y.Bar", settingsXML(name: "<string>Bar</string>"))
            + containerXML("iCloud.com.x.Foo.Docs", settingsXML(name: "<string>Docs</string>"))
        let (diagnostics, _) = loadBad(appXML(version: "one", containers: containers))
        XCTAssertEqual(diagnostics.map(\.key), [
            "CFBundleVersion",
            publicKey,
            levelsKey,
            "NSUbiquitousContainers.iCloud.com.y.Bar",
        ])
        XCTAssertTrue(diagnostics.allSatisfy { $0.severity == .error })
    }

    func testMessagesStayOnOneLine() {
        let (diagnostics, _) = loadBad(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<string>No\nne</string>"))))
        XCTAssertEqual(diagnostics.map(\.message), ["\"No\\nne\" is not a folder level"])
        XCTAssertFalse(diagnostics[0].description.contains("\n"))
    }
}
