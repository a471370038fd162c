import Foundation
import XCTest
@testable import UbiquityManifests

/// Binary (`bplist00`) manifests: written by python3's plistlib and by the test writer.
final class BinaryPlistTests: XCTestCase {
    /// python3 plistlib.dumps(fmt=FMT_BINARY, sort_keys=False) of a manifest whose containers are declared
    /// Zeta, $(PRODUCT_BUNDLE_IDENTIFIER), Alpha — not in sorted order — with a UTF-16 name "Café ☕ Zeta",
    /// a private container without name or levels, and "$(PRODUCT_NAME) Alpha".
    private let pythonMulti = """
        YnBsaXN0MDDVAQIDBAUGBwgJCl8QEkNGQnVuZGxlSWRlbnRpZmllclxDRkJ1bmRsZU5hbWVfEA9DRkJ1bmRsZVZlcnNpb25fEBZMU01pbmltdW1TeXN0ZW1WZXJzaW9uXxAWTlNVYmlxdWl0b3VzQ29udGFpbmVyc18QEWNvbS5leGFtcGxlLk11bHRpVU11bHRpVTcuMC4xEA7TCwwNDhUXXxAdaUNsb3VkLmNvbS5leGFtcGxlLk11bHRpLlpldGFfECNpQ2xvdWQuJChQUk9EVUNUX0JVTkRMRV9JREVOVElGSUVSKV8QHmlDbG91ZC5jb20uZXhhbXBsZS5NdWx0aS5BbHBoYdMPEBESExRfECpOU1ViaXF1aXRvdXNDb250YWluZXJJc0RvY3VtZW50U2NvcGVQdWJsaWNfEBlOU1ViaXF1aXRvdXNDb250YWluZXJOYW1lXxAqTlNVYmlxdWl0b3VzQ29udGFpbmVyU3VwcG9ydGVkRm9sZGVyTGV2ZWxzCWsAQwBhAGYA6QAgJhUAIABaAGUAdABhU09uZdEPFgjSEBEYGV8QFSQoUFJPRFVDVF9OQU1FKSBBbHBoYVNBbnkACAATACgANQBHAGAAeQCNAJMAmQCbAKIAwgDoAQkBEAE9AVkBhgGHAZ4BogGlAaYBqwHDAAAAAAAAAgEAAAAAAAAAGgAAAAAAAAAAAAAAAAAAAcc=
        """

    func testPythonWrittenBinaryKeepsDeclarationOrder() throws {
        let bytes = [UInt8](try XCTUnwrap(Data(base64Encoded: pythonMulti)))
        let load = loadOne(bytes)
        let manifest = try XCTUnwrap(load.manifests.first, "\(load.diagnostics)")
        XCTAssertEqual(manifest.bundleIdentifier, "com.example.Multi")
        XCTAssertEqual(manifest.bundleName, "Multi")
        XCTAssertEqual(manifest.bundleVersion, "7.0.1")
        XCTAssertEqual(manifest.containers, [
            ContainerDeclaration(identifier: "iCloud.com.example.Multi.Zeta",
                                 settings: ContainerSettings(isPublic: true, name: "Café ☕ Zeta", folderLevels: .one), levelsDefaulted: false),
            ContainerDeclaration(identifier: "iCloud.com.example.Multi",
                                 settings: ContainerSettings(isPublic: false, name: "Multi", folderLevels: .none), levelsDefaulted: true),
            ContainerDeclaration(identifier: "iCloud.com.example.Multi.Alpha",
                                 settings: ContainerSettings(isPublic: false, name: "Multi Alpha", folderLevels: .any), levelsDefaulted: false),
        ])
        XCTAssertEqual(load.diagnostics.map(\.severity), [.warning])
        XCTAssertEqual(load.diagnostics.map(\.key), ["NSUbiquitousContainers.iCloud.com.example.Multi.NSUbiquitousContainerSupportedFolderLevels"])
    }

    func testWriterOutputMatchesFoundationsReader() throws {
        // Checks the test writer itself against Foundation's binary plist reader.
        let value = PlistValue.dictionary([
            (key: "s", value: .string("hello")), (key: "u", value: .string("Grüße ☕ 𝄞")),
            (key: "t", value: .bool(true)), (key: "f", value: .bool(false)),
            (key: "i", value: .integer(70000)), (key: "n", value: .integer(-5)), (key: "r", value: .real(2.5)),
            (key: "d", value: .data([1, 2, 3])), (key: "long string over fifteen", value: .string(String(repeating: "x", count: 300))),
            (key: "a", value: .array([.string("x"), .integer(1)])),
        ])
        let bytes = BinaryPlistWriter.write(value)
        let parsed = try PropertyListSerialization.propertyList(from: Data(bytes), options: [], format: nil)
        let dict = try XCTUnwrap(parsed as? [String: Any])
        XCTAssertEqual(dict["s"] as? String, "hello")
        XCTAssertEqual(dict["u"] as? String, "Grüße ☕ 𝄞")
        XCTAssertEqual(dict["i"] as? Int, 70000)
        XCTAssertEqual(dict["n"] as? Int, -5)
        XCTAssertEqual(dict["r"] as? Double, 2.5)
        XCTAssertEqual(dict["d"] as? Data, Data([1, 2, 3]))
        XCTAssertEqual((dict["long string over fifteen"] as? String)?.count, 300)
        XCTAssertEqual((dict["a"] as? [Any])?.count, 2)
        // And our reader gives back exactly what was written, in order.
        let (roundTrip, format) = try readPropertyList(bytes)
        XCTAssertEqual(format, .binary)
        XCTAssertEqual(roundTrip, value)
    }

    func testBinaryOrderWithManyContainers() throws {
        // 20 containers in reverse-alphabetical order: more than 15 entries uses the extended length form.
        let suffixes = (0..<20).map { "S\(String(format: "%02d", 19 - $0))" }
        let containers = suffixes.map { (key: "iCloud.com.x.Foo.\($0)", value: settingsValue(name: .string($0))) }
        let load = loadOne(BinaryPlistWriter.write(appValue(containers: containers)))
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.first?.containers.map(\.settings.name), suffixes)
    }

    func testBinaryWrongTypes() {
        let nameKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerName"
        let publicKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerIsDocumentScopePublic"
        let bad = appValue(containers: [(key: "iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)",
                                         value: settingsValue(isPublic: .string("true"), name: .integer(5)))])
        let (diagnostics, dir) = loadBad(BinaryPlistWriter.write(bad))
        XCTAssertEqual(lines(diagnostics, in: dir), [
            "Bad.plist: error: \(publicKey): is a string (\"true\"), expected a Boolean; write <true/> or <false/>",
            "Bad.plist: error: \(nameKey): is an integer (5), expected a string; write the folder name as a <string>",
        ])
        let badVersion = appValue(version: .real(1.0), containers: [(key: "iCloud.com.x.Foo", value: settingsValue())])
        XCTAssertEqual(loadBad(BinaryPlistWriter.write(badVersion)).diagnostics.map(\.message), ["is a real number, expected a string"])
    }

    func testNulInNameOnlyPossibleInBinary() {
        let bad = appValue(containers: [(key: "iCloud.com.x.Foo", value: settingsValue(name: .string("A\u{0}B")))])
        let (diagnostics, dir) = loadBad(BinaryPlistWriter.write(bad))
        XCTAssertEqual(lines(diagnostics, in: dir), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerName: \"A\\0B\" contains a NUL character, which cannot be in a folder name; remove it",
        ])
    }

    func testBinaryTopLevelNotADictionary() {
        let (diagnostics, _) = loadBad(BinaryPlistWriter.write(.array([.string("x")])))
        XCTAssertEqual(diagnostics.map(\.message), ["the top level is an array, not a dictionary"])
    }

    func testCorruptBinaryFiles() {
        let good = BinaryPlistWriter.write(appValue(containers: [(key: "iCloud.com.x.Foo", value: settingsValue())]))
        let cases: [(String, [UInt8])] = [
            ("header only", Array("bplist00".utf8)),
            ("truncated", Array(good.prefix(good.count - 10))),
            ("unsupported version", Array("bplist01".utf8) + Array(good.dropFirst(8))),
        ]
        for (label, bytes) in cases {
            let (diagnostics, _) = loadBad(bytes)
            XCTAssertEqual(diagnostics.count, 1, label)
            XCTAssertNil(diagnostics.first?.key, label)
            XCTAssertTrue(diagnostics.first?.fix.contains("plistlib") ?? false, label)
        }
        XCTAssertEqual(loadBad(Array("bplist00".utf8)).diagnostics.map(\.message), ["the file is not a valid binary property list: the file is truncated"])
        XCTAssertEqual(loadBad(Array("bplist01".utf8) + Array(good.dropFirst(8))).diagnostics.map(\.message),
                       ["the file is a binary property list of unsupported version \"01\""])
    }

    func testSelfContainingArrayIsRejected() {
        // Object 0 is an array whose only element is object 0.
        var bytes = Array("bplist00".utf8) + [0xA1, 0x00]
        let table = bytes.count
        bytes += [0x08]
        bytes += [0, 0, 0, 0, 0, 0, 1, 1] + BinaryPlistWriter.bigEndian(1, size: 8) + BinaryPlistWriter.bigEndian(0, size: 8)
            + BinaryPlistWriter.bigEndian(UInt64(table), size: 8)
        XCTAssertThrowsError(try readPropertyList(bytes)) { error in
            XCTAssertEqual((error as? PlistReadError)?.message, "the file is not a valid binary property list: an object contains itself")
        }
    }

    // Found by fuzzing (FuzzTests).

    func testObjectSharedAMillionTimesIsRefused() {
        // An array of 1,000,000 references to one 4 MB string: each reference copied the string
        // (4 TB) before the reader counted the bytes it reads.
        func ref(_ k: Int) -> [UInt8] { BinaryPlistWriter.bigEndian(UInt64(k), size: 4) }
        let refs = Array([[UInt8]](repeating: ref(1), count: 1_000_000).joined())
        let bytes = bplist([[0xAF, 0x12] + BinaryPlistWriter.bigEndian(1_000_000, size: 4) + refs,
                            [0x5F, 0x12] + BinaryPlistWriter.bigEndian(4_000_000, size: 4) + Array(repeating: UInt8(ascii: "a"), count: 4_000_000)])
        let started = Date()
        let (diagnostics, _) = loadBad(bytes)
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
        XCTAssertEqual(diagnostics.map(\.message), [
            "the file is not a valid binary property list: its objects, counted each time they are referenced, come to more than 16777216 bytes",
        ])
    }

    func testSharedArraysThatDoubleAreRefused() {
        // 64 arrays, each referring to the next one twice: 2^64 objects in under 1 KB. Decoding stopped
        // only at a million objects (seconds); now at one per byte of the file.
        func ref(_ k: Int) -> [UInt8] { BinaryPlistWriter.bigEndian(UInt64(k), size: 4) }
        let bytes = bplist((0..<64).map { [0xA2] + ref($0 + 1) + ref($0 + 1) } + [[0x51, UInt8(ascii: "x")]])
        XCTAssertThrowsError(try readPropertyList(bytes)) { error in
            XCTAssertEqual((error as? PlistReadError)?.message,
                           "the file is not a valid binary property list: its arrays and dictionaries refer to objects more than \(bytes.count) times (shared ones count each time)")
        }
        // Sharing within those limits is fine (writers share equal strings).
        XCTAssertEqual(try readPropertyList(bplist([[0xA3] + ref(1) + ref(1) + ref(1), [0x51, UInt8(ascii: "x")]])).0,
                       .array([.string("x"), .string("x"), .string("x")]))
    }

    /// Objects (references already encoded, 4 bytes); object 0 is the top.
    private func bplist(_ objects: [[UInt8]]) -> [UInt8] {
        BinaryLayout.build(objects: objects, top: 0, refSize: 4)
    }

    func testRandomCorruptionNeverCrashes() {
        // Flip bytes of a valid manifest many times: every result is a value or an error, never a crash.
        let good = BinaryPlistWriter.write(appValue(containers: [(key: "iCloud.com.x.Foo", value: settingsValue()),
                                                                  (key: "iCloud.com.x.Foo.B", value: settingsValue(name: .string("B")))]))
        var generator = SystemRandomNumberGenerator()
        var errors = 0
        for _ in 0..<3000 {
            var bytes = good
            for _ in 0..<Int.random(in: 1...4, using: &generator) {
                let i = Int.random(in: 8..<bytes.count, using: &generator)
                bytes[i] = UInt8.random(in: 0...255, using: &generator)
            }
            if (try? readPropertyList(bytes)) == nil { errors += 1 }
            var parser = ManifestParser(path: "fuzz.plist")
            _ = parser.parse(bytes)
        }
        XCTAssertGreaterThan(errors, 0)
    }
}
