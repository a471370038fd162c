// Shared fixtures and helpers for the model tests (no kernel): sample containers, a path walker
// over `lookup`, whole-file read/write helpers and an errno assertion.

import Foundation
import XCTest
import UbiquityFileSystem
import UbiquityStore

let fsRoot = UbiquityFileSystem.rootID

/// Bytes of a name or path component.
func b(_ s: String) -> [UInt8] { Array(s.utf8) }

/// A deterministic byte pattern (no zero bytes, so a published chunk is never stored as a hole).
func pattern(_ count: Int, seed: UInt8 = 1) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: (($0 &* 31) &+ Int(seed) &* 7) % 251) &+ 1 }
}

let owner = Caller(uid: getuid(), gid: getgid())
let alice = Caller(uid: 1000, gid: 1000)

enum Sample {
    /// Public, levels None (the TestDrive example app of Apple's iCloud Drive guide).
    static let testDrive = ContainerInfo(identifier: "iCloud.com.example.TestDrive", bundleIdentifier: "com.example.TestDrive",
                                         name: "TestDrive", isPublic: true, folderLevels: "None", registeredVersion: "1",
                                         manifestPath: "/apps/TestDrive/Info.plist", active: true)
    /// Public, levels Any (an app that keeps folders of documents).
    static let sugoi = ContainerInfo(identifier: "iCloud.com.example.SugoiApp", bundleIdentifier: "com.example.SugoiApp",
                                     name: "SugoiApp", isPublic: true, folderLevels: "Any", registeredVersion: "1",
                                     manifestPath: "/apps/SugoiApp/Info.plist", active: true)
    /// Public, levels One.
    static let notes = ContainerInfo(identifier: "iCloud.com.example.Notes", bundleIdentifier: "com.example.Notes",
                                     name: "Notes", isPublic: true, folderLevels: "One", registeredVersion: "1",
                                     manifestPath: "/apps/Notes/Info.plist", active: true)
    /// Private, levels Any.
    static let secret = ContainerInfo(identifier: "iCloud.com.example.Secret", bundleIdentifier: "com.example.Secret",
                                      name: "Secret", isPublic: false, folderLevels: "Any", registeredVersion: "1",
                                      manifestPath: "/apps/Secret/Info.plist", active: true)
    /// A second container of the SugoiApp bundle, private.
    static let sugoiPrivate = ContainerInfo(identifier: "iCloud.com.example.SugoiApp.private", bundleIdentifier: "com.example.SugoiApp",
                                            name: "SugoiPrivate", isPublic: false, folderLevels: "None", registeredVersion: "1",
                                            manifestPath: "/apps/SugoiApp/Info.plist", active: true)

    static let all = [testDrive, sugoi, notes, secret, sugoiPrivate]
}

/// The errno an error carries: FSError (the model's one error type) or, leaked through, StoreError.
func errnoOf(_ error: Error) -> Int32? {
    if let e = error as? FSError { return e.errno }
    if let e = error as? StoreError { return e.errno }
    return nil
}

/// Assert that `body` fails with errno `code`. The error must carry an errno: an `FSError`, or a
/// `StoreError` passed through unchanged (the FUSE bridge replies with either's errno; that the
/// model should wrap store errors in FSError is checked on its own in
/// `FaultTests.testStoreFailuresReachCallersAsFSError`).
func assertErrno<T>(_ code: Int32, _ body: @autoclosure () throws -> T, _ what: String = "",
                    file: StaticString = #filePath, line: UInt = #line) {
    do {
        _ = try body()
        XCTFail("\(what): expected \(errnoName(code)), but it succeeded", file: file, line: line)
    } catch {
        guard let got = errnoOf(error) else {
            XCTFail("\(what): expected \(errnoName(code)), got \(type(of: error)): \(error)", file: file, line: line)
            return
        }
        XCTAssertEqual(errnoName(got), errnoName(code), "\(what): \(error)", file: file, line: line)
    }
}

extension UbiquityFileSystem {
    /// Attributes at `path` ("TestDrive/a"), walking from the root with `lookup`.
    func at(_ path: String) throws -> Attributes {
        var attrs = try getattr(fsRoot)
        for part in path.split(separator: "/") {
            attrs = try lookup(parent: attrs.ino, name: b(String(part)))
        }
        return attrs
    }

    func ino(_ path: String) throws -> UInt64 { try at(path).ino }

    /// Names in a folder (without "." and ".."), through opendir/readdir/releasedir.
    func names(_ ino: UInt64) throws -> [String] {
        let h = try opendir(ino)
        defer { releasedir(handle: h) }
        return try readdir(handle: h, offset: 0)
            .map { String(decoding: $0.name, as: UTF8.self) }
            .filter { $0 != "." && $0 != ".." }
            .sorted()
    }

    func names(_ path: String) throws -> [String] { try names(ino(path)) }

    /// Create `name` in `parent` holding `bytes`, closed (so published). Returns the inode.
    @discardableResult
    func makeFile(_ parent: UInt64, _ name: String, _ bytes: [UInt8] = [], mode: UInt32 = 0o644,
                  caller: Caller = owner) throws -> UInt64 {
        let (attrs, h) = try create(parent: parent, name: b(name), mode: mode, flags: O_RDWR | O_CREAT | O_EXCL, caller: caller)
        if !bytes.isEmpty { try put(h, bytes, at: 0) }
        try release(handle: h)
        return attrs.ino
    }

    func put(_ handle: UInt64, _ bytes: [UInt8], at offset: UInt64) throws {
        let n = try bytes.withUnsafeBytes { try write(handle: handle, offset: offset, bytes: $0) }
        XCTAssertEqual(n, bytes.count)
    }

    func get(_ handle: UInt64, at offset: UInt64, count: Int) throws -> [UInt8] {
        var out = [UInt8](repeating: 0xee, count: count)
        let n = try out.withUnsafeMutableBytes { try read(handle: handle, offset: offset, into: $0) }
        return Array(out[0..<n])
    }

    /// The whole content of a regular file (opened read-only and released).
    func contents(_ ino: UInt64) throws -> [UInt8] {
        let size = try getattr(ino).size
        let h = try open(ino, flags: O_RDONLY)
        defer { try? release(handle: h) }
        return try get(h, at: 0, count: Int(size))
    }

    func contents(_ path: String) throws -> [UInt8] { try contents(ino(path)) }

    /// Overwrite a closed file with `bytes` from `offset` and close it again.
    func writeFile(_ ino: UInt64, _ bytes: [UInt8], at offset: UInt64 = 0) throws {
        let h = try open(ino, flags: O_RDWR)
        try put(h, bytes, at: offset)
        try release(handle: h)
    }
}

/// A brief pause so that nanosecond timestamps of consecutive operations differ.
func tick() { usleep(2_000) }

/// Collects the filesystem's log lines (the log closure is called from any thread).
final class LogBox: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: [String] = []
    var lines: [String] { lock.lock(); defer { lock.unlock() }; return stored }
    func append(_ line: String) { lock.lock(); stored.append(line); lock.unlock() }
}

/// Compare bytes without printing megabytes on a mismatch: sizes and the first differing offset.
func assertBytes(_ got: @autoclosure () throws -> [UInt8], _ expected: [UInt8], _ what: String = "",
                 file: StaticString = #filePath, line: UInt = #line) {
    let actual: [UInt8]
    do { actual = try got() } catch {
        XCTFail("\(what): threw \(error)", file: file, line: line)
        return
    }
    guard actual != expected else { return }
    let first = zip(actual, expected).enumerated().first { $0.element.0 != $0.element.1 }?.offset
        ?? min(actual.count, expected.count)
    func around(_ bytes: [UInt8]) -> [UInt8] { Array(bytes[min(first, bytes.count)..<min(first + 8, bytes.count)]) }
    XCTFail("\(what): \(actual.count) bytes, expected \(expected.count); first difference at offset \(first): "
            + "\(around(actual)) vs \(around(expected))", file: file, line: line)
}

/// Store `bytes` as one blob.
func writeBlob(_ blobs: any BlobStore, _ bytes: [UInt8]) throws -> ChunkRef {
    try bytes.withUnsafeBytes { try blobs.write($0, durable: false) }
}

extension UbiquityFileSystem {
    /// The extended attributes set on `ino`, without the read-only status ones every item has.
    func storedXattrs(_ ino: UInt64) throws -> [[UInt8]] {
        try listxattr(ino).filter { !$0.starts(with: b("user.ubiquity.")) }
    }
}

/// Two models on one in-memory store, as two daemons (devices) on one store: `one` and `two`.
class TwoWritersTestCase: XCTestCase {
    var store: BackingStore!
    var one: UbiquityFileSystem!
    var two: UbiquityFileSystem!

    override func setUpWithError() throws {
        store = makeMemoryStore()
        one = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "A")
        two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
    }

    override func tearDown() {
        one = nil
        two = nil
        store = nil
    }
}
