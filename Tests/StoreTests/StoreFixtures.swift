import Foundation
import XCTest
@testable import UbiquityStore
@testable import UbiquitySharedStore

/// One kind of backing store under test. `open()` opens it (again): for the embedded store a
/// fresh open of the same folder (the caller must have dropped the previous objects), for the
/// memory store the same objects (its "disk").
protocol StoreFixture: AnyObject {
    var isOnDisk: Bool { get }
    func open() throws -> BackingStore
    /// Change blob `ref`'s stored bytes behind the store's back.
    func corrupt(_ ref: ChunkRef, in store: BackingStore) throws
    /// Another writer's connection to the same metadata (another daemon, later another device).
    func secondWriter() throws -> any MetadataStore
    /// Another writer's lock table on the same store.
    func secondLockTable() throws -> any LockTable
}

final class EmbeddedFixture: StoreFixture {
    let directory: String
    var isOnDisk: Bool { true }

    init() throws {
        directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("storetests-\(UUID().uuidString)").path
    }

    func open() throws -> BackingStore { try openEmbeddedStore(directory: directory) }

    func secondWriter() throws -> any MetadataStore {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return try SQLiteMetadataStore(path: directory + "/metadata.sqlite3")
    }

    func secondLockTable() throws -> any LockTable { try LocalLockTable(directory: directory) }

    func corrupt(_ ref: ChunkRef, in store: BackingStore) throws {
        let path = try XCTUnwrap(store.blobs as? LocalBlobStore).path(of: ref.blob)
        let handle = try XCTUnwrap(FileHandle(forUpdatingAtPath: path))
        defer { try? handle.close() }
        try handle.seek(toOffset: 0)
        let first = try XCTUnwrap(handle.readData(ofLength: 1).first)
        try handle.seek(toOffset: 0)
        handle.write(Data([first ^ 0xff]))
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: directory)
    }
}

final class MemoryFixture: StoreFixture {
    let store = makeMemoryStore()
    var isOnDisk: Bool { false }
    func open() throws -> BackingStore { store }
    func secondWriter() throws -> any MetadataStore { store.metadata }
    func secondLockTable() throws -> any LockTable { store.locks }

    func corrupt(_ ref: ChunkRef, in store: BackingStore) throws {
        var bytes = [UInt8](repeating: 0, count: Int(ref.length))
        _ = try bytes.withUnsafeMutableBytes { try store.blobs.read(ref.blob, at: 0, into: $0) }
        bytes[0] ^= 0xff
        (self.store.blobs as! MemoryBlobStore).corrupt(ref.blob, with: bytes)
    }
}

// MARK: - Sample records and helpers

enum Sample {
    static let container = "iCloud.com.example.TestDrive"

    static func node(_ ino: InodeNumber, kind: NodeKind = .regular, size: UInt64 = 0,
                     version: VersionID? = nil, target: [UInt8] = [], rdev: UInt64 = 0) -> NodeRecord {
        NodeRecord(ino: ino, container: container, kind: kind, mode: kind == .directory ? 0o755 : 0o644,
                   uid: 1000, gid: 1000, nlink: kind == .directory ? 2 : 1, size: size,
                   atime: 1_700_000_000_000_000_001, mtime: 1_700_000_000_000_000_002,
                   ctime: -3, btime: 4, rdev: rdev, target: target, currentVersion: version)
    }

    /// `count` distinct chunk references, told apart from another `seed`'s.
    static func chunks(_ seed: UInt64, count: Int) -> [ChunkRef] {
        (0..<count).map { ChunkRef(blob: seed << 32 | UInt64($0 + 1), length: UInt32(chunkSize), checksum: seed ^ UInt64($0)) }
    }

    static func version(_ id: VersionID, ino: InodeNumber, chunks: [ChunkRef]? = nil,
                        origin: VersionOrigin = .published) -> VersionRecord {
        let refs = chunks ?? [ChunkRef(blob: 0x0123_4567_89ab_cdef, length: UInt32(chunkSize), checksum: 0xfeed_face_dead_beef),
                              .hole,
                              ChunkRef(blob: UInt64.max, length: 17, checksum: 1)]
        return VersionRecord(id: id, ino: ino, created: 1_000 + id, size: UInt64(2 * chunkSize + 17),
                             chunks: refs, origin: origin, device: "host-\(id)")
    }

    static func containerRecord(root: InodeNumber) -> ContainerRecord {
        ContainerRecord(identifier: container, bundleIdentifier: "com.example.TestDrive", name: "Test Drive",
                        isPublic: true, folderLevels: "Any", registeredVersion: "42",
                        manifestPath: "/apps/TestDrive/Info.plist", rootIno: root)
    }

    static func bytes(_ count: Int, seed: UInt64) -> [UInt8] {
        var x = seed &* 0x9e37_79b9_7f4a_7c15 | 1
        return (0..<count).map { _ in
            x ^= x << 13; x ^= x >> 7; x ^= x << 17
            return UInt8(truncatingIfNeeded: x)
        }
    }
}

func sortedDirents(_ d: [DirentRecord]) -> [DirentRecord] {
    d.sorted { $0.parent != $1.parent ? $0.parent < $1.parent : $0.name.lexicographicallyPrecedes($1.name) }
}

func sortedXattrs(_ x: [XattrRecord]) -> [XattrRecord] {
    x.sorted { $0.ino != $1.ino ? $0.ino < $1.ino : $0.name.lexicographicallyPrecedes($1.name) }
}

func assertSameContent(_ a: StoreSnapshot, _ b: StoreSnapshot, file: StaticString = #filePath, line: UInt = #line) {
    XCTAssertEqual(a.nodes.sorted { $0.ino < $1.ino }, b.nodes.sorted { $0.ino < $1.ino }, file: file, line: line)
    XCTAssertEqual(sortedDirents(a.dirents), sortedDirents(b.dirents), file: file, line: line)
    XCTAssertEqual(sortedXattrs(a.xattrs), sortedXattrs(b.xattrs), file: file, line: line)
    XCTAssertEqual(a.containers, b.containers, file: file, line: line)
    XCTAssertEqual(a.currentVersions.sorted { $0.id < $1.id }, b.currentVersions.sorted { $0.id < $1.id },
                   file: file, line: line)
    XCTAssertEqual(a.meta, b.meta, file: file, line: line)
    XCTAssertEqual(a.maxIno, b.maxIno, file: file, line: line)
    XCTAssertEqual(a.maxVersion, b.maxVersion, file: file, line: line)
}

func writeBlob(_ blobs: any BlobStore, _ bytes: [UInt8], durable: Bool = false) throws -> ChunkRef {
    try bytes.withUnsafeBytes { try blobs.write($0, durable: durable) }
}

func readBlob(_ blobs: any BlobStore, _ id: BlobID, at offset: Int = 0, count: Int) throws -> [UInt8] {
    var buffer = [UInt8](repeating: 0xAA, count: count)
    let n = try buffer.withUnsafeMutableBytes { try blobs.read(id, at: offset, into: $0) }
    return Array(buffer[..<n])
}

func writeWork(_ file: any WorkFile, _ bytes: [UInt8], at offset: Int) throws {
    try bytes.withUnsafeBytes { try file.pwrite($0, at: offset) }
}

func readWork(_ file: any WorkFile, at offset: Int, count: Int) throws -> [UInt8] {
    var buffer = [UInt8](repeating: 0xAA, count: count)
    let n = try buffer.withUnsafeMutableBytes { try file.pread(into: $0, at: offset) }
    return Array(buffer[..<n])
}

/// Asserts `body` throws a StoreError with `errno`; returns it.
@discardableResult
func assertStoreError<T>(_ errno: Int32, file: StaticString = #filePath, line: UInt = #line,
                         _ body: () throws -> T) -> StoreError? {
    do {
        _ = try body()
        XCTFail("expected StoreError errno \(errno), got success", file: file, line: line)
        return nil
    } catch let error as StoreError {
        XCTAssertEqual(error.errno, errno, "\(error)", file: file, line: line)
        return error
    } catch {
        XCTFail("expected StoreError, got \(error)", file: file, line: line)
        return nil
    }
}

/// A thread-safe counter for concurrent tests.
final class Counter: @unchecked Sendable {
    // `lock` guards `value`.
    private let lock = NSLock()
    private var value = 0
    func add(_ n: Int = 1) { lock.lock(); value += n; lock.unlock() }
    var count: Int { lock.lock(); defer { lock.unlock() }; return value }
}

/// A value shared by threads of a test.
final class LockedBox<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: T
    init(_ value: T) { stored = value }
    var value: T { lock.lock(); defer { lock.unlock() }; return stored }
    func update(_ body: (inout T) -> Void) { lock.lock(); body(&stored); lock.unlock() }
}

/// The working copies a live work area holds (not leftovers: those are a gone writer's).
func workingCopies(_ work: any WorkArea) throws -> [RecoveredWork] {
    if let local = work as? LocalWorkArea { return try local.ownCopies() }
    if let shared = work as? SharedWorkArea { return try shared.local.ownCopies() }
    return try work.leftovers()
}

/// Now, in nanoseconds since the epoch.
func nowForTests() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}
