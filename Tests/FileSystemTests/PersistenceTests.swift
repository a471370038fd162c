// Data survives reopening, publishing keeps versions, a small change to a big file
// writes one chunk, fsync is durable across a power cut, a crashed daemon's unpublished working
// copies come back as versions, idle publishing.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class PersistenceTests: XCTestCase {
    /// Every folder `embeddedDirectory` made (a test may make several).
    var temporary: [String] = []

    override func tearDown() {
        for path in temporary { try? FileManager.default.removeItem(atPath: path) }
        temporary = []
    }

    private func embeddedDirectory() -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("fstests-\(UUID().uuidString)").path
        temporary.append(path)
        return path
    }

    private func openFS(_ store: BackingStore, view: View = .drive) throws -> UbiquityFileSystem {
        try UbiquityFileSystem(store: store, containers: Sample.all, view: view)
    }

    /// Run `body` on a filesystem over a freshly opened embedded store; everything is dropped on
    /// return (so the store's lock is free again). `publish`: publishAll before dropping.
    private func embeddedSession(_ directory: String, publish: Bool = true,
                                 _ body: (UbiquityFileSystem, BackingStore) throws -> Void) throws {
        let store = try openEmbeddedStore(directory: directory)
        let fs = try openFS(store)
        try body(fs, store)
        if publish { XCTAssertTrue(fs.publishAll().isEmpty) }
    }

    /// The bytes of a version, read chunk by chunk from the blob store.
    private func bytes(of v: VersionRecord, in store: BackingStore) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(v.size))
        for (i, ref) in v.chunks.enumerated() where !ref.isHole {
            let start = i * chunkSize
            let end = min(start + chunkSize, out.count)
            guard start < end else { continue }
            let n = try out.withUnsafeMutableBytes {
                try store.blobs.read(ref.blob, at: 0, into: UnsafeMutableRawBufferPointer(rebasing: $0[start..<end]))
            }
            XCTAssertLessThanOrEqual(n, end - start)
        }
        return out
    }

    // MARK: reopening

    private let big = pattern(3 * chunkSize + 5, seed: 11)
    private let stamp: Int64 = 1_600_000_000_123_456_789

    /// A bit of everything, in SugoiApp's Documents; one file is left open with unpublished writes.
    private func populate(_ fs: UbiquityFileSystem) throws -> UInt64 {
        let docs = try fs.ino("SugoiApp")
        let dir = try fs.mkdir(parent: docs, name: b("dir"), mode: 0o750, caller: owner).ino
        _ = try fs.mkdir(parent: docs, name: b("empty"), mode: 0o700, caller: owner)
        let a = try fs.makeFile(dir, "a.bin", big)
        _ = try fs.link(a, newParent: docs, newName: b("hard.bin"))
        _ = try fs.symlink(parent: docs, name: b("link"), target: b("dir/a.bin"), caller: owner)
        _ = try fs.mknod(parent: docs, name: b("pipe"), mode: UInt32(S_IFIFO) | 0o600, rdev: 0, caller: owner)
        try fs.setxattr(a, name: b("user.color"), value: b("blue"), flags: 0)
        _ = try fs.setattr(a, AttributeChanges(mode: 0o600, mtime: .at(stamp)), handle: nil, caller: owner)
        try fs.makeFile(try fs.ino("TestDrive"), "MyTextFile.txt", b("hello"))
        let (open, h) = try fs.create(parent: docs, name: b("open.txt"), mode: 0o644, flags: O_RDWR, caller: owner)
        try fs.put(h, b("unpublished when publishAll runs"), at: 0)
        _ = h   // left open on purpose: publishAll must publish it
        return open.ino
    }

    private func verify(_ fs: UbiquityFileSystem) throws {
        XCTAssertEqual(try fs.names("SugoiApp"), ["dir", "empty", "hard.bin", "link", "open.txt", "pipe"])
        XCTAssertEqual(try fs.names("SugoiApp/dir"), ["a.bin"])
        XCTAssertEqual(try fs.names("SugoiApp/empty"), [], "empty folders persist")
        let a = try fs.at("SugoiApp/dir/a.bin")
        XCTAssertEqual(a.nlink, 2)
        XCTAssertEqual(a.mode, UInt32(S_IFREG) | 0o600)
        XCTAssertEqual(a.mtime, stamp)
        XCTAssertEqual(a.size, UInt64(big.count))
        XCTAssertEqual(try fs.at("SugoiApp/hard.bin").ino, a.ino)
        assertBytes(try fs.contents(a.ino), big)
        XCTAssertEqual(try fs.getxattr(a.ino, name: b("user.color")), b("blue"))
        XCTAssertEqual(try fs.readlink(try fs.ino("SugoiApp/link")), b("dir/a.bin"))
        XCTAssertEqual(try fs.at("SugoiApp/pipe").kind, .fifo)
        XCTAssertEqual(try fs.at("SugoiApp/dir").mode & 0o7777, 0o750)
        XCTAssertEqual(try fs.at("SugoiApp").nlink, 4)
        assertBytes(try fs.contents("SugoiApp/open.txt"), b("unpublished when publishAll runs"))
        assertBytes(try fs.contents("TestDrive/MyTextFile.txt"), b("hello"))
    }

    func testDataSurvivesReopeningMemoryStore() throws {
        let store = makeMemoryStore()
        do {
            let fs = try openFS(store)
            _ = try populate(fs)
            XCTAssertTrue(fs.publishAll().isEmpty)
        }
        try verify(try openFS(store))
        try verify(try openFS(store))   // and again: reopening changes nothing
    }

    func testDataSurvivesReopeningEmbeddedStore() throws {
        let directory = embeddedDirectory()
        try embeddedSession(directory) { fs, _ in _ = try populate(fs) }
        try embeddedSession(directory) { fs, _ in try verify(fs) }
        try embeddedSession(directory) { fs, _ in
            // Change something, then check the change persisted too.
            let docs = try fs.ino("SugoiApp")
            try fs.unlink(parent: docs, name: b("hard.bin"))
            try fs.writeFile(try fs.ino("SugoiApp/dir/a.bin"), b("HEAD"), at: 0)
        }
        try embeddedSession(directory) { fs, _ in
            // A sparse file past 4 GiB in the embedded store, and real capacity figures.
            let (huge, h) = try fs.create(parent: try fs.ino("SugoiApp"), name: b("huge"), mode: 0o644,
                                          flags: O_RDWR, caller: owner)
            try fs.put(h, b("tail"), at: 5 << 30)
            try fs.release(handle: h)
            XCTAssertEqual(try fs.getattr(huge.ino).size, (5 << 30) + 4)
            let s = fs.statfs()
            XCTAssertGreaterThan(s.totalBlocks, 0)
            XCTAssertGreaterThan(s.blockSize, 0)
            XCTAssertEqual(s.nameMax, 255)
        }
        try embeddedSession(directory) { fs, _ in
            let huge = try fs.ino("SugoiApp/huge")
            XCTAssertEqual(try fs.getattr(huge).size, (5 << 30) + 4)
            let h = try fs.open(huge, flags: O_RDONLY)
            assertBytes(try fs.get(h, at: (5 << 30) - 2, count: 10), [0, 0] + b("tail"))
            assertBytes(try fs.get(h, at: 3 << 30, count: 4096), [UInt8](repeating: 0, count: 4096))
            try fs.release(handle: h)
            XCTAssertEqual(try fs.at("SugoiApp/dir/a.bin").nlink, 1)
            assertBytes(try fs.contents("SugoiApp/dir/a.bin"), b("HEAD") + big[4...])
            XCTAssertFalse(try fs.names("SugoiApp").contains("hard.bin"))
            XCTAssertTrue(try fs.names("SugoiApp").contains("huge"))
        }
    }

    /// A read's bytes as blob-file pieces and zeros (what a spliced reply sends) are the bytes a
    /// copying read returns, across chunks, holes and a short last chunk; a working copy's
    /// bytes are never offered as pieces.
    func testFilePiecesAreTheBytesAReadReturns() throws {
        try embeddedSession(embeddedDirectory()) { fs, _ in
            let docs = try fs.ino("SugoiApp")
            let chunk = 1 << 20
            var data = [UInt8](repeating: 0, count: 2 * chunk + 5000)
            for i in data.indices where i < chunk || i >= 2 * chunk { data[i] = UInt8(truncatingIfNeeded: i &* 31 &+ 7) }
            let (attrs, w) = try fs.create(parent: docs, name: b("pieces.bin"), mode: 0o644, flags: O_RDWR, caller: owner)
            try fs.put(w, Array(data[..<chunk]), at: 0)      // chunk 1 stays a hole
            try fs.put(w, Array(data[(2 * chunk)...]), at: UInt64(2 * chunk))
            try fs.release(handle: w)
            var h = try fs.open(attrs.ino, flags: O_RDONLY)
            defer { try? fs.release(handle: h) }
            func spliced(_ offset: Int, _ count: Int) throws -> [UInt8]? {
                guard let reply = try fs.filePieces(handle: h, offset: UInt64(offset), count: count) else { return nil }
                return withExtendedLifetime(reply) { () -> [UInt8] in
                    var out: [UInt8] = []
                    for piece in reply.pieces {
                        switch piece {
                        case .zeros(let n): out += [UInt8](repeating: 0, count: n)
                        case .file(let fd, let at, let n):
                            var bytes = [UInt8](repeating: 0, count: n)
                            XCTAssertEqual(bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, n, off_t(at)) }, n)
                            out += bytes
                        }
                    }
                    return out
                }
            }
            for (offset, count) in [(0, 4096), (chunk - 100, 300), (chunk - 10, chunk + 20), (2 * chunk + 4000, 4096),
                                    (0, 3 * chunk), (12345, 2 * chunk)] {
                let want = Array(data[offset..<min(data.count, offset + count)])
                XCTAssertEqual(try spliced(offset, count), want, "\(count) bytes at \(offset)")
                XCTAssertEqual(try fs.get(h, at: UInt64(offset), count: count), want)
            }
            XCTAssertNil(try spliced(data.count, 10), "nothing past the end: the copying read answers")

            // Unpublished bytes in the chunk (another handle writing): read through the copy.
            let w2 = try fs.open(attrs.ino, flags: O_RDWR)
            try fs.put(w2, b("new"), at: 10)
            XCTAssertNil(try spliced(0, 100), "the working copy holds part of it")
            XCTAssertNotNil(try spliced(2 * chunk, 100), "a chunk it does not touch still comes from the blob")
            assertBytes(try fs.get(h, at: 8, count: 7), Array(data[8..<10]) + b("new") + Array(data[13..<15]))
            try fs.release(handle: w2)
            try fs.release(handle: h)
            h = try fs.open(attrs.ino, flags: O_RDONLY)
            XCTAssertEqual(try spliced(8, 7), Array(data[8..<10]) + b("new") + Array(data[13..<15]), "published")
        }
    }

    // MARK: versions

    func testPublishOnReleaseCreatesAVersionAndKeepsThePrevious() throws {
        let store = makeMemoryStore()
        let fs = try openFS(store)
        let docs = try fs.ino("SugoiApp")
        let (attrs, h) = try fs.create(parent: docs, name: b("v.txt"), mode: 0o644, flags: O_RDWR, caller: owner)
        try fs.put(h, b("version one"), at: 0)
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 0, "nothing published while open")
        try fs.release(handle: h)
        let v1 = try store.metadata.versions(of: attrs.ino)
        XCTAssertEqual(v1.count, 1)
        XCTAssertEqual(v1.first?.origin, .published)

        try fs.writeFile(attrs.ino, b("version TWO"), at: 0)
        let v2 = try store.metadata.versions(of: attrs.ino)
        XCTAssertEqual(v2.count, 2)
        XCTAssertEqual(v2.first, v1.first, "the previous version is kept unchanged")
        assertBytes(try bytes(of: v2[0], in: store), b("version one"))
        assertBytes(try bytes(of: v2[1], in: store), b("version TWO"))
        XCTAssertGreaterThan(v2[1].id, v2[0].id)
        assertBytes(try fs.contents(attrs.ino), b("version TWO"))

        // Opening and closing without a change publishes nothing.
        let r = try fs.open(attrs.ino, flags: O_RDONLY)
        try fs.release(handle: r)
        let w = try fs.open(attrs.ino, flags: O_RDWR)
        try fs.release(handle: w)
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 2)
        // Truncation publishes too.
        _ = try fs.setattr(attrs.ino, AttributeChanges(size: 7), handle: nil, caller: owner)
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 3)
        assertBytes(try openFS(store).contents("SugoiApp/v.txt"), b("version"))
    }

    func testSmallWriteToMultiChunkFileWritesOneChunk() throws {
        let store = makeMemoryStore()
        let blobs = try XCTUnwrap(store.blobs as? MemoryBlobStore)
        let fs = try openFS(store)
        let docs = try fs.ino("SugoiApp")
        let content = pattern(4 * chunkSize + 100, seed: 21)
        let ino = try fs.makeFile(docs, "big.bin", content)
        let first = try XCTUnwrap(try store.metadata.versions(of: ino).last)
        XCTAssertEqual(first.chunks.count, 5)
        let blobCount = blobs.blobIDs.count

        try fs.writeFile(ino, b("0123456789"), at: UInt64(2 * chunkSize + 7))
        let second = try XCTUnwrap(try store.metadata.versions(of: ino).last)
        XCTAssertNotEqual(first.id, second.id)
        XCTAssertEqual(second.chunks.count, 5)
        let changed = zip(first.chunks, second.chunks).enumerated().filter { $0.element.0 != $0.element.1 }.map(\.offset)
        XCTAssertEqual(changed, [2], "only the touched chunk is new")
        XCTAssertEqual(blobs.blobIDs.count, blobCount + 1, "one new blob")

        // An append past the end touches only the last chunk (and a new one if it spills over).
        try fs.writeFile(ino, b("appended"), at: UInt64(content.count))
        let third = try XCTUnwrap(try store.metadata.versions(of: ino).last)
        let changed3 = zip(second.chunks, third.chunks).enumerated().filter { $0.element.0 != $0.element.1 }.map(\.offset)
        XCTAssertEqual(changed3, [4])

        var expected = content
        expected.replaceSubrange((2 * chunkSize + 7)..<(2 * chunkSize + 17), with: b("0123456789"))
        expected += b("appended")
        assertBytes(try openFS(store).contents(ino), expected)
    }

    /// Sessions over one store: the same memory store each time, or the embedded store reopened
    /// from its folder (a session that ends without publishing is a crash of the daemon).
    private func sessions(embedded: Bool) -> (BackingStore?, (Bool, (UbiquityFileSystem, BackingStore) throws -> Void) throws -> Void) {
        if embedded {
            let directory = embeddedDirectory()
            return (nil, { publish, body in try self.embeddedSession(directory, publish: publish, body) })
        }
        let store = makeMemoryStore()
        return (store, { publish, body in
            let fs = try self.openFS(store)
            try body(fs, store)
            if publish { XCTAssertTrue(fs.publishAll().isEmpty) }
        })
    }

    /// The bytes the working copies of `store` hold on disk (embedded store), or the pages its
    /// copies hold (memory store).
    private func workBytes(_ store: BackingStore) throws -> Int {
        if let area = store.work as? LocalWorkArea {
            var total = 0
            // Chunk files only: a map is slots, a page log zeros written ahead of its batches.
            for name in try FileManager.default.contentsOfDirectory(atPath: area.workPath)
            where !name.hasSuffix(".map") && !name.hasSuffix(".log") && name != "lock" {
                var st = stat()
                XCTAssertEqual(lstat(area.workPath + "/" + name, &st), 0)
                total += Int(st.st_blocks) * 512
            }
            return total
        }
        return try store.work.leftovers().reduce(0) { sum, w in
            sum + w.dirtyChunks.count * chunkSize
                + w.partialChunks.values.reduce(0) { n, pages in n + (0..<PageSet.count).filter(pages.contains).count * pageSize }
        }
    }

    /// A small write into a big file brings in the pages it ends in, not its whole chunk: reads
    /// merge those pages with the base, a crash recovers them over the base, and the publish
    /// completes the chunk from the base (one new blob).
    func testSmallWritesIntoABigFileBringInPagesNotChunks() throws {
        for embedded in [false, true] {
            let (_, session) = sessions(embedded: embedded)
            let base = pattern(3 * chunkSize + 5000, seed: 9)
            var ino: UInt64 = 0
            var expected = base
            let writes: [(offset: Int, bytes: [UInt8])] = [
                (2 * chunkSize + 4090, b("0123456789")),             // ends in two pages, both partly
                (chunkSize + 8192, pattern(pageSize, seed: 3)),      // one whole page: nothing to bring in
                (3 * chunkSize + 4999, b("end")),                     // the last, short chunk, past its end
            ]
            for w in writes {
                if expected.count < w.offset + w.bytes.count { expected += [UInt8](repeating: 0, count: w.offset + w.bytes.count - expected.count) }
                expected.replaceSubrange(w.offset..<(w.offset + w.bytes.count), with: w.bytes)
            }
            try session(true) { fs, _ in ino = try fs.makeFile(try fs.ino("SugoiApp"), "big.bin", base) }
            try session(false) { fs, store in
                let h = try fs.open(ino, flags: O_RDWR)
                for w in writes { try fs.put(h, w.bytes, at: UInt64(w.offset)) }
                assertBytes(try fs.get(h, at: 0, count: expected.count), expected, "read back while open")
                assertBytes(try fs.get(h, at: UInt64(2 * chunkSize + 4000), count: 200),
                            Array(expected[(2 * chunkSize + 4000)..<(2 * chunkSize + 4200)]), "a read across held and base pages")
                XCTAssertLessThanOrEqual(try workBytes(store), 6 * pageSize, "pages, not chunks (embedded: \(embedded))")
                if !embedded {
                    let left = try XCTUnwrap(store.work.leftovers().first)
                    XCTAssertEqual(left.dirtyChunks, [])
                    XCTAssertEqual(left.partialChunks, [1: PageSet(touching: 8192, 8192 + pageSize),
                                                        2: PageSet(touching: 4090, 4100), 3: PageSet(touching: 4999, 5002)])
                }
                // killed: no release
            }
            try session(true) { fs, store in
                assertBytes(try fs.contents(ino), base, "the current version is untouched")
                let versions = try store.metadata.versions(of: ino)
                XCTAssertEqual(versions.map(\.origin), [.published, .recovered])
                assertBytes(try bytes(of: XCTUnwrap(versions.last), in: store), expected, "recovered over the base")
                // Published at the release: each touched chunk is whole again, the rest shared.
                let h = try fs.open(ino, flags: O_RDWR)
                for w in writes { try fs.put(h, w.bytes, at: UInt64(w.offset)) }
                try fs.release(handle: h)
                let all = try store.metadata.versions(of: ino)
                let (first, last) = (try XCTUnwrap(all.first), try XCTUnwrap(all.last))
                XCTAssertEqual(last.origin, .published)
                let changed = zip(first.chunks, last.chunks).enumerated().filter { $0.element.0 != $0.element.1 }.map(\.offset)
                XCTAssertEqual(changed, [1, 2, 3])
                XCTAssertEqual(last.chunks.map(\.length), [UInt32(chunkSize), UInt32(chunkSize), UInt32(chunkSize), 5002])
                assertBytes(try fs.contents(ino), expected)
            }
        }
    }

    /// Truncates of a file whose working copy holds pages: a cut in a chunk held in pages keeps
    /// the held pages before it and the base's bytes between them; a cut at a chunk's start and
    /// a growth again show zeros, not the base's bytes, whether the copy is published or
    /// recovered after a crash.
    func testTruncatesOfAFileHeldInPages() throws {
        for embedded in [false, true] {
            for crash in [false, true] {
                let (_, session) = sessions(embedded: embedded)
                let base = pattern(3 * chunkSize + 100, seed: 12)
                var ino: UInt64 = 0
                try session(true) { fs, _ in ino = try fs.makeFile(try fs.ino("SugoiApp"), "t.bin", base) }
                var expected = base
                try session(!crash) { fs, _ in
                    let h = try fs.open(ino, flags: O_RDWR)
                    try fs.put(h, b("held"), at: UInt64(chunkSize + 10))
                    try fs.put(h, b("more"), at: UInt64(2 * chunkSize + 9000))
                    expected.replaceSubrange((chunkSize + 10)..<(chunkSize + 14), with: b("held"))
                    _ = try fs.setattr(ino, AttributeChanges(size: UInt64(chunkSize + 12)), handle: h, caller: owner)
                    _ = try fs.setattr(ino, AttributeChanges(size: UInt64(2 * chunkSize)), handle: h, caller: owner)
                    expected = Array(expected[0..<(chunkSize + 12)]) + [UInt8](repeating: 0, count: chunkSize - 12)
                    try fs.put(h, b("tail"), at: UInt64(chunkSize - 2))
                    expected.replaceSubrange((chunkSize - 2)..<(chunkSize + 2), with: b("tail"))
                    _ = try fs.setattr(ino, AttributeChanges(size: UInt64(chunkSize)), handle: h, caller: owner)
                    _ = try fs.setattr(ino, AttributeChanges(size: UInt64(3 * chunkSize)), handle: h, caller: owner)
                    expected = Array(expected[0..<chunkSize]) + [UInt8](repeating: 0, count: 2 * chunkSize)
                    assertBytes(try fs.get(h, at: 0, count: 3 * chunkSize), expected, "while open")
                    if !crash { try fs.release(handle: h) }
                }
                try session(true) { fs, store in
                    let versions = try store.metadata.versions(of: ino)
                    if crash {
                        XCTAssertEqual(versions.map(\.origin), [.published, .recovered])
                        assertBytes(try fs.contents(ino), base)
                        assertBytes(try bytes(of: XCTUnwrap(versions.last), in: store), expected, "recovered (embedded: \(embedded))")
                    } else {
                        assertBytes(try fs.contents(ino), expected, "published (embedded: \(embedded))")
                    }
                }
            }
        }
    }

    // MARK: fsync and power cuts

    private func powerCut(_ store: BackingStore) throws {
        try XCTUnwrap(store.metadata as? MemoryMetadataStore).simulatePowerCut()
        try XCTUnwrap(store.blobs as? MemoryBlobStore).simulatePowerCut()
        try XCTUnwrap(store.work as? MemoryWorkArea).simulatePowerCut()
    }

    /// fsync makes the working copy durable where it is, without a version: a power cut keeps
    /// what was fsync'd (the memory store's copy falls back to its last sync), a kill keeps what
    /// came after it too, as a file system shows a file after a crash. The version comes at the
    /// close, and only then do other writers see the content.
    func testFsyncMakesTheWorkingCopyDurableWithoutAVersion() throws {
        for powerCutToo in [true, false] {
            let store = makeMemoryStore()
            var ino: UInt64 = 0
            let synced = pattern(chunkSize + 300, seed: 2)
            do {
                let fs = try openFS(store)
                let docs = try fs.ino("SugoiApp")
                let (attrs, h) = try fs.create(parent: docs, name: b("db.sqlite"), mode: 0o644, flags: O_RDWR, caller: owner)
                ino = attrs.ino
                try fs.put(h, synced, at: 0)
                try fs.fsync(handle: h, dataOnly: false)
                XCTAssertEqual(try store.metadata.versions(of: ino).count, 0, "no version per fsync")
                try fs.put(h, b("later"), at: 0)
                if powerCutToo { try powerCut(store) }   // the daemon and the machine die here
            }
            let fs = try openFS(store)
            var expected = synced
            if !powerCutToo { expected.replaceSubrange(0..<5, with: b("later")) }
            assertBytes(try fs.contents("SugoiApp/db.sqlite"), expected, "power cut: \(powerCutToo)")
            XCTAssertEqual(try store.metadata.versions(of: ino).map(\.origin), [.published], "the current version, not a side one")
        }
    }

    /// An fsync's barrier covers the working copy's base; when a publish (idle time, another
    /// handle) and a write give the copy a new base between the barrier and the copy's synced
    /// mark, the barrier is made again: after a power cut the file holds what the fsync promised,
    /// the new base's bytes included.
    func testAnFsyncWhoseBaseMovesAfterItsBarrierMakesTheBarrierAgain() throws {
        var store = makeMemoryStore()
        let hooked = HookedDurability(store.durability)
        store.durability = hooked
        var expected = pattern(2 * chunkSize, seed: 3)
        expected.replaceSubrange(chunkSize + 10 ..< chunkSize + 22, with: b("second chunk"))
        expected.replaceSubrange(0..<5, with: b("first"))
        var ino: UInt64 = 0
        do {
            let fs = try openFS(store)
            let docs = try fs.ino("SugoiApp")
            ino = try fs.makeFile(docs, "db", pattern(2 * chunkSize, seed: 3))
            try store.durability.sync()
            let h = try fs.open(ino, flags: O_RDWR)
            try fs.put(h, b("second chunk"), at: UInt64(chunkSize + 10))
            fs.idlePublishNanoseconds = 0
            hooked.afterNextSync = {
                // Between the barrier and the mark: the copy is published at idle time (its
                // second chunk a new, unsynced chunk), and a write starts a copy on that version.
                fs.publishIdle()
                XCTAssertEqual(try store.metadata.versions(of: ino).count, 2, "published")
                try fs.put(h, b("first"), at: 0)
            }
            try fs.fsync(handle: h, dataOnly: false)
            XCTAssertNil(hooked.afterNextSync, "the race happened")
            try powerCut(store)   // the daemon and the machine die here
        }
        let fs = try openFS(store)
        assertBytes(try fs.contents(ino), expected)
    }

    /// Where chunks live elsewhere (a shared store), fsync publishes: what it promised is on the
    /// servers, not only on this machine's disk.
    func testFsyncPublishesWhereTheStoreSaysSo() throws {
        var store = makeMemoryStore()
        store.fsyncPublishes = true
        let fs = try openFS(store)
        let (attrs, h) = try fs.create(parent: try fs.ino("SugoiApp"), name: b("f"), mode: 0o644, flags: O_RDWR, caller: owner)
        try fs.put(h, b("kept"), at: 0)
        try fs.fsync(handle: h, dataOnly: true)
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 1, "fsync published a version")
        try fs.release(handle: h)
    }

    /// A truncate of content an fsync made durable publishes it first (a cut may begin a new
    /// content, which a crash would leave half made); the later writes only add to it.
    func testATruncateAfterAnFsyncKeepsTheSyncedContentAsAVersion() throws {
        for embedded in [false, true] {
            let (_, session) = sessions(embedded: embedded)
            var ino: UInt64 = 0
            try session(false) { fs, store in
                let (attrs, h) = try fs.create(parent: try fs.ino("SugoiApp"), name: b("log"), mode: 0o644, flags: O_RDWR, caller: owner)
                ino = attrs.ino
                try fs.put(h, b("first, fsync'ed"), at: 0)
                try fs.fsync(handle: h, dataOnly: false)
                try fs.put(h, b("FIRST"), at: 0)
                XCTAssertEqual(try store.metadata.versions(of: ino).count, 0)
                _ = try fs.setattr(ino, AttributeChanges(size: 0), handle: h, caller: owner)
                XCTAssertEqual(try store.metadata.versions(of: ino).count, 1, "published before the cut")
                try fs.put(h, b("second, half writ"), at: 0)
                // killed: no release
            }
            try session(true) { fs, store in
                assertBytes(try fs.contents(ino), b("FIRST, fsync'ed"), "embedded: \(embedded)")
                let versions = try store.metadata.versions(of: ino)
                XCTAssertEqual(versions.map(\.origin), [.published, .recovered])
                assertBytes(try bytes(of: XCTUnwrap(versions.last), in: store), b("second, half writ"))
            }
        }
    }

    /// A file deleted (to Recently Deleted) while its fsync'd working copy waited for its publish
    /// stays deleted after a crash: recovery publishes the copy into the deleted file, where a
    /// restore finds it, and never brings it back to its name (the delete was this mount's own).
    func testAnFsyncedCopyOfADeletedFileStaysInRecentlyDeleted() throws {
        for powerCutToo in [false, true] {
            let store = makeMemoryStore()
            var ino: UInt64 = 0
            do {
                let fs = try openFS(store)
                fs.publishesOnClose = false   // killed between the close and its publish
                let docs = try fs.ino("SugoiApp")
                ino = try fs.makeFile(docs, "gone.txt", b("old"))
                let h = try fs.open(ino, flags: O_RDWR | O_TRUNC)
                try fs.put(h, b("fsync'ed, then deleted"), at: 0)
                try fs.fsync(handle: h, dataOnly: false)
                try fs.flush(handle: h)
                try fs.unlink(parent: docs, name: b("gone.txt"))
                if powerCutToo { try powerCut(store) }
            }
            let fs = try openFS(store)
            if !powerCutToo {
                XCTAssertEqual(try fs.names("SugoiApp"), [])
                XCTAssertEqual(fs.trashItems().map(\.ino), [ino])
                _ = try fs.restoreFromTrash(ino)
            } else {
                XCTAssertEqual(fs.trashItems().map(\.ino), [], "the delete was never made durable")
            }
            assertBytes(try fs.contents("SugoiApp/gone.txt"), b("fsync'ed, then deleted"), "power cut: \(powerCutToo)")
        }
    }

    /// A synced copy whose base version left the history (a power cut lost its content) is not
    /// trusted to be the file: the pages it does not hold have nothing to come from. It becomes
    /// a side version.
    func testASyncedCopyWhoseBaseIsGoneIsASideVersion() throws {
        let store = makeMemoryStore()
        var ino: UInt64 = 0
        let base = pattern(2 * pageSize, seed: 8)
        do {
            let fs = try openFS(store)
            ino = try fs.makeFile(try fs.ino("SugoiApp"), "db", base)
            let h = try fs.open(ino, flags: O_RDWR)
            try fs.put(h, b("page one"), at: UInt64(pageSize))
            try fs.fsync(handle: h, dataOnly: false)
            // killed; the base then leaves the history
            let version = try XCTUnwrap(store.metadata.versions(of: ino).first)
            _ = try store.metadata.commit(Batch([.deleteVersion(version.id)]), durable: true)
        }
        let fs = try openFS(store)
        XCTAssertEqual(try store.metadata.versions(of: ino).map(\.origin), [.recovered], "kept beside, not made current")
        XCTAssertEqual(try fs.names("SugoiApp"), ["db"], "no conflict copy beside it")
    }

    /// The embedded store keeps an fsync'd working copy's mark: after a kill the copy (held in
    /// pages of a big file) is the current version, and its publish at close is durable.
    func testAnFsyncedWorkingCopyIsCurrentAfterAKillInTheEmbeddedStore() throws {
        let (_, session) = sessions(embedded: true)
        let base = pattern(2 * chunkSize + 77, seed: 5)
        var ino: UInt64 = 0
        var expected = base
        try session(true) { fs, _ in ino = try fs.makeFile(try fs.ino("SugoiApp"), "db", base) }
        try session(false) { fs, store in
            let h = try fs.open(ino, flags: O_RDWR)
            for (i, offset) in [chunkSize + 4096, 77, 2 * chunkSize + 70].enumerated() {
                let block = pattern(100, seed: UInt8(40 + i))
                try fs.put(h, block, at: UInt64(offset))
                expected.replaceSubrange(offset..<min(expected.count, offset + 100), with: block.prefix(expected.count - offset))
                if offset + 100 > expected.count { expected += block.suffix(offset + 100 - expected.count) }
                try fs.fsync(handle: h, dataOnly: true)
            }
            XCTAssertEqual(try store.metadata.versions(of: ino).count, 1, "no version per fsync")
            XCTAssertLessThanOrEqual(try workBytes(store), 8 * pageSize, "pages, not chunks")
        }
        try session(true) { fs, store in
            assertBytes(try fs.contents(ino), expected)
            XCTAssertEqual(try store.metadata.versions(of: ino).map(\.origin), [.published, .published])
            XCTAssertEqual(try store.work.leftovers().count, 0)
        }
    }

    func testFsyncWithNothingNewIsStillABarrier() throws {
        let store = makeMemoryStore()
        do {
            let fs = try openFS(store)
            let docs = try fs.ino("SugoiApp")
            let ino = try fs.makeFile(docs, "a", b("published on close"))
            let h = try fs.open(ino, flags: O_RDONLY)
            try fs.fsync(handle: h, dataOnly: true)   // fsync(2) of a file whose data is already published
            try fs.release(handle: h)
            try powerCut(store)
        }
        assertBytes(try openFS(store).contents("SugoiApp/a"), b("published on close"))
    }

    /// After a power cut the store never holds metadata pointing at content that did not
    /// reach the disk. Here file A is published on close (not durably), then another file is
    /// fsync'ed: whatever state A ends in after the cut, it must be whole and readable.
    func testFsyncOfOneFileDoesNotLeaveAnotherPointingAtLostContent() throws {
        let store = makeMemoryStore()
        let dataA = pattern(5000, seed: 4)
        do {
            let fs = try openFS(store)
            let docs = try fs.ino("SugoiApp")
            try fs.makeFile(docs, "a.txt", dataA)      // published on close, not durable
            let (_, h) = try fs.create(parent: docs, name: b("b.txt"), mode: 0o644, flags: O_RDWR, caller: owner)
            try fs.put(h, b("synced"), at: 0)
            try fs.fsync(handle: h, dataOnly: false)
            try powerCut(store)
        }
        let fs = try openFS(store)
        assertBytes(try fs.contents("SugoiApp/b.txt"), b("synced"))
        if let a = try? fs.ino("SugoiApp/a.txt") {
            do {
                let got = try fs.contents(a)
                XCTAssertTrue(got == dataA || got.isEmpty, "a.txt is neither its previous nor its new whole version")
            } catch {
                XCTFail("a.txt survived the power cut but cannot be read: \(error)")
            }
        }
    }

    /// The same within one file: v1 published on close (not durably), then a one-chunk change
    /// fsync'ed. v2 shares v1's other chunks; after a power cut the file must read whole.
    func testFsyncOfSmallChangeKeepsTheWholeFileAfterPowerCut() throws {
        let store = makeMemoryStore()
        let v1 = pattern(3 * chunkSize, seed: 6)
        var v2 = v1
        v2.replaceSubrange(chunkSize..<(chunkSize + 4), with: b("SYNC"))
        do {
            let fs = try openFS(store)
            let docs = try fs.ino("SugoiApp")
            let ino = try fs.makeFile(docs, "log", v1)
            let h = try fs.open(ino, flags: O_RDWR)
            try fs.put(h, b("SYNC"), at: UInt64(chunkSize))
            try fs.fsync(handle: h, dataOnly: true)
            try powerCut(store)
        }
        let fs = try openFS(store)
        do {
            let got = try fs.contents("SugoiApp/log")
            assertBytes(got, v2, "fsync'ed data is never lost")
        } catch {
            XCTFail("the fsync'ed file cannot be read after a power cut: \(error)")
        }
    }

    // MARK: crash recovery

    func testCrashRecoveryKeepsPreviousVersionAndRecoversUnpublishedWork() throws {
        let store = makeMemoryStore()
        var kept: UInt64 = 0, fresh: UInt64 = 0, unlinked: UInt64 = 0
        do {
            let fs = try openFS(store)
            let docs = try fs.ino("SugoiApp")
            kept = try fs.makeFile(docs, "report.txt", b("previous whole version"))
            let h = try fs.open(kept, flags: O_RDWR)
            try fs.put(h, b("NEW BYTES"), at: 0)
            let (attrs, h2) = try fs.create(parent: docs, name: b("new.txt"), mode: 0o644, flags: O_RDWR, caller: owner)
            fresh = attrs.ino
            try fs.put(h2, b("never published"), at: 0)
            let (gone, h3) = try fs.create(parent: docs, name: b("tmp"), mode: 0o644, flags: O_RDWR, caller: owner)
            unlinked = gone.ino
            try fs.put(h3, b("temporary"), at: 0)
            try fs.unlink(parent: docs, name: b("tmp"))
            // kill -9: no release, no publishAll; the filesystem object is dropped here.
        }
        let messages = LogBox()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, log: { messages.append($0) })
        assertBytes(try fs.contents("SugoiApp/report.txt"), b("previous whole version"))
        let versions = try store.metadata.versions(of: kept)
        XCTAssertEqual(versions.count, 2)
        XCTAssertEqual(versions.first?.origin, .published)
        let recovered = try XCTUnwrap(versions.last)
        XCTAssertEqual(recovered.origin, .recovered)
        assertBytes(try bytes(of: recovered, in: store), b("NEW BYTESwhole version"))
        XCTAssertEqual(try fs.getxattr(kept, name: b("user.ubiquity.status")), b("recovered"), "it needs the user's look")
        XCTAssertEqual(try fs.recoveredVersions().map(\.ino), [kept, fresh, unlinked], "the deleted one is in Recently Deleted")

        XCTAssertEqual(try fs.getattr(fresh).size, 0, "a file never published is empty")
        let freshVersions = try store.metadata.versions(of: fresh)
        XCTAssertEqual(freshVersions.map(\.origin), [.recovered])
        assertBytes(try bytes(of: XCTUnwrap(freshVersions.first), in: store), b("never published"))

        // Unlinked while open: in Recently Deleted, with what was written kept as a version.
        XCTAssertEqual(fs.trashItems().map(\.ino), [unlinked])
        XCTAssertEqual(try store.metadata.versions(of: unlinked).map(\.origin), [.recovered])
        XCTAssertEqual(try fs.names("SugoiApp"), ["new.txt", "report.txt"])
        XCTAssertEqual(try store.work.leftovers().count, 0, "recovered working copies are gone")
        XCTAssertFalse(messages.lines.isEmpty, "recovery is logged")

        // Recovering again finds nothing more.
        _ = try openFS(store)
        XCTAssertEqual(try store.metadata.versions(of: kept).count, 2)
    }

    func testCrashRecoveryWithEmbeddedStore() throws {
        let directory = embeddedDirectory()
        var ino: UInt64 = 0
        let base = pattern(2 * chunkSize + 10, seed: 7)
        try embeddedSession(directory) { fs, _ in
            ino = try fs.makeFile(try fs.ino("SugoiApp"), "big", base)
        }
        try embeddedSession(directory, publish: false) { fs, _ in
            let h = try fs.open(ino, flags: O_RDWR)
            try fs.put(h, b("CHANGED"), at: UInt64(chunkSize + 1))
            // dropped without release or publishAll
        }
        try embeddedSession(directory) { fs, store in
            assertBytes(try fs.contents(ino), base)
            let versions = try store.metadata.versions(of: ino)
            XCTAssertEqual(versions.map(\.origin), [.published, .recovered])
            var expected = base
            expected.replaceSubrange((chunkSize + 1)..<(chunkSize + 8), with: b("CHANGED"))
            assertBytes(try bytes(of: XCTUnwrap(versions.last), in: store), expected)
            XCTAssertEqual(try store.work.leftovers().count, 0)
        }
    }

    /// close(2) returns once FLUSH is answered; the RELEASE that publishes comes after. A daemon
    /// killed in between must not lose what was saved and closed.
    func testCrashAfterCloseMakesTheClosedContentCurrent() throws {
        let store = makeMemoryStore()
        var existing: UInt64 = 0, created: UInt64 = 0, reopened: UInt64 = 0, stillOpen: UInt64 = 0, shared: UInt64 = 0
        var both: UInt64 = 0, truncated: UInt64 = 0
        do {
            let fs = try openFS(store)
            fs.publishesOnClose = false   // killed between each close and its publish
            let docs = try fs.ino("SugoiApp")
            existing = try fs.makeFile(docs, "report.txt", b("old"))
            // Saved and closed (flush), release never came.
            var h = try fs.open(existing, flags: O_RDWR | O_TRUNC)
            try fs.put(h, b("saved and closed"), at: 0)
            try fs.flush(handle: h)
            let (attrs, h2) = try fs.create(parent: docs, name: b("new.txt"), mode: 0o644, flags: O_RDWR, caller: owner)
            created = attrs.ino
            try fs.put(h2, b("brand new"), at: 0)
            try fs.flush(handle: h2)
            // Closed, then written again through another descriptor of the same open file: not finished.
            reopened = try fs.makeFile(docs, "again.txt", b("v1"))
            h = try fs.open(reopened, flags: O_RDWR)
            try fs.put(h, b("v2"), at: 0)
            try fs.flush(handle: h)
            try fs.put(h, b("v3, still being written"), at: 0)
            // Never closed.
            stillOpen = try fs.makeFile(docs, "open.txt", b("published"))
            h = try fs.open(stillOpen, flags: O_WRONLY)
            try fs.put(h, b("in progress"), at: 0)
            // Closed by one writer while another, still open, has written too: not finished.
            shared = try fs.makeFile(docs, "shared.txt", b("one"))
            let w1 = try fs.open(shared, flags: O_RDWR), w2 = try fs.open(shared, flags: O_WRONLY)
            try fs.put(w1, b("tw"), at: 0)
            try fs.put(w2, b("o"), at: 2)
            try fs.flush(handle: w1)
            // Two writers that both closed (their releases not yet arrived): finished.
            both = try fs.makeFile(docs, "both.txt", b("old"))
            let b1 = try fs.open(both, flags: O_WRONLY), b2 = try fs.open(both, flags: O_WRONLY)
            try fs.put(b1, b("ne"), at: 0)
            try fs.put(b2, b("w"), at: 2)
            try fs.flush(handle: b1)
            try fs.flush(handle: b2)
            // Opened with O_TRUNC while another handle is clean: the truncation counts as the new
            // handle's change, so the other's close does not finish an emptied file.
            truncated = try fs.makeFile(docs, "trunc.txt", b("keep"))
            let clean = try fs.open(truncated, flags: O_RDWR)
            _ = try fs.open(truncated, flags: O_WRONLY | O_TRUNC)
            try fs.flush(handle: clean)
            // A reader's close does not finish anything either.
            let r = try fs.open(stillOpen, flags: O_RDONLY)
            try fs.flush(handle: r)
            // kill -9: the filesystem object is dropped here.
        }
        let messages = LogBox()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, log: { messages.append($0) })
        assertBytes(try fs.contents(existing), b("saved and closed"))
        XCTAssertEqual(try store.metadata.versions(of: existing).map(\.origin), [.published, .published])
        assertBytes(try fs.contents("SugoiApp/new.txt"), b("brand new"))
        XCTAssertEqual(try fs.getattr(created).size, 9)
        assertBytes(try fs.contents(both), b("new"))
        for (ino, current, side) in [(reopened, "v1", "v3, still being written"), (stillOpen, "published", "in progress"),
                                     (shared, "one", "two"), (truncated, "keep", "")] {
            assertBytes(try fs.contents(ino), b(current), "inode \(ino) stays at its published version")
            let versions = try store.metadata.versions(of: ino)
            XCTAssertEqual(versions.map(\.origin), [.published, .recovered], "inode \(ino)")
            assertBytes(try bytes(of: XCTUnwrap(versions.last), in: store), b(side), "inode \(ino)'s recovered version")
        }
        XCTAssertEqual(try store.work.leftovers().count, 0)
        XCTAssertTrue(messages.lines.contains { $0.contains("closed before the daemon stopped") }, "\(messages.lines)")
    }

    /// A file saved and closed whose publish waits for the release (a second close within a
    /// second of the last publish, or a release still on its way) is opened again with O_TRUNC
    /// and written: that open publishes the closed content first, so a daemon killed in the
    /// middle of the new write leaves the closed content current, not the one before it.
    func testANewWriterPublishesTheClosedContentItWouldOverwrite() throws {
        let store = makeMemoryStore()
        var reopened: UInt64 = 0, truncated: UInt64 = 0, other: UInt64 = 0, shared: UInt64 = 0
        do {
            let fs = try openFS(store)
            fs.publishesOnClose = false   // the close's publish deferred to a release that never came
            let docs = try fs.ino("SugoiApp")
            reopened = try fs.makeFile(docs, "report.txt", b("old"))
            let h1 = try fs.open(reopened, flags: O_WRONLY | O_TRUNC)
            try fs.put(h1, b("saved and closed"), at: 0)
            try fs.flush(handle: h1)
            XCTAssertEqual(try store.metadata.versions(of: reopened).count, 1, "the close published nothing")
            let h2 = try fs.open(reopened, flags: O_WRONLY | O_TRUNC)
            XCTAssertEqual(try store.metadata.versions(of: reopened).count, 2, "the O_TRUNC open published the closed content")
            try fs.put(h2, b("half writ"), at: 0)
            // truncate(2) by path, after a close.
            truncated = try fs.makeFile(docs, "cut.txt", b("old"))
            let t1 = try fs.open(truncated, flags: O_RDWR)
            try fs.put(t1, b("closed, long"), at: 0)
            try fs.flush(handle: t1)
            _ = try fs.setattr(truncated, AttributeChanges(size: 6), handle: nil, caller: owner)
            // A handle opened before the close, writing after it.
            other = try fs.makeFile(docs, "other.txt", b("old"))
            let early = try fs.open(other, flags: O_WRONLY)
            let o1 = try fs.open(other, flags: O_WRONLY)
            try fs.put(o1, b("closed"), at: 0)
            try fs.flush(handle: o1)
            try fs.put(early, b("X"), at: 0)
            // The same handle again (a descriptor several processes share): only the mark goes.
            shared = try fs.makeFile(docs, "log.txt", b("one"))
            let s1 = try fs.open(shared, flags: O_WRONLY)
            try fs.put(s1, b("two"), at: 0)
            try fs.flush(handle: s1)
            try fs.put(s1, b("three"), at: 0)
            // kill -9: the filesystem object is dropped here.
        }
        let fs = try openFS(store)
        for (ino, current, side) in [(reopened, "saved and closed", "half writ"), (other, "closed", "Xlosed"),
                                     (shared, "one", "three")] {
            assertBytes(try fs.contents(ino), b(current), "inode \(ino)")
            let versions = try store.metadata.versions(of: ino)
            XCTAssertEqual(versions.map(\.origin), current == "one" ? [.published, .recovered] : [.published, .published, .recovered],
                           "inode \(ino)")
            assertBytes(try bytes(of: XCTUnwrap(versions.last), in: store), b(side), "inode \(ino)'s recovered version")
        }
        // The truncate by path published the closed content first; the cut, with the file still
        // open, is what recovery keeps beside it.
        assertBytes(try fs.contents(truncated), b("closed, long"))
        XCTAssertEqual(try store.metadata.versions(of: truncated).map(\.size), [3, 12, 6])
        XCTAssertEqual(try store.metadata.versions(of: truncated).last?.origin, .recovered)
        XCTAssertEqual(try store.work.leftovers().count, 0)
    }

    /// A finished copy whose base is no longer the file's current version (another writer
    /// published meanwhile) must not replace that version: it becomes a conflict, as the
    /// publish the daemon did not get to would have.
    func testFinishedCopyOnAStaleBaseBecomesAConflict() throws {
        let store = makeMemoryStore()
        var ino: UInt64 = 0
        do {
            let fs = try openFS(store)
            fs.publishesOnClose = false   // killed between the close and its publish
            ino = try fs.makeFile(try fs.ino("SugoiApp"), "report.txt", b("base"))
            let h = try fs.open(ino, flags: O_RDWR)
            try fs.put(h, b("mine"), at: 0)
            try fs.flush(handle: h)
        }
        // Another writer's publish, straight into the store.
        var node = try XCTUnwrap(store.metadata.load().nodes.first { $0.ino == ino })
        let theirs = try writeBlob(store.blobs, b("theirs"))
        let id = try store.metadata.reserveVersions(1).lowerBound
        node.currentVersion = id
        node.size = 6
        try store.metadata.commit([.putVersion(VersionRecord(id: id, ino: ino, created: 1, size: 6, chunks: [theirs],
                                                             origin: .published, device: "other")),
                                   .putNode(node)], durable: true)
        let fs = try openFS(store)
        assertBytes(try fs.contents(ino), b("theirs"))
        let versions = try store.metadata.versions(of: ino)
        XCTAssertEqual(versions.map(\.origin), [.published, .published, .conflict])
        assertBytes(try bytes(of: XCTUnwrap(versions.last), in: store), b("mine"))
        // And shown beside the file, as any conflict.
        let copy = try XCTUnwrap(try fs.names("SugoiApp").first { $0.hasPrefix("report (conflict from ") })
        assertBytes(try fs.contents("SugoiApp/" + copy), b("mine"))
        XCTAssertEqual(fs.unresolvedConflicts().count, 1)
    }

    /// After a power cut a closed but unsynced working copy may be torn: it is kept beside the
    /// current version, never made current.
    func testClosedWorkingCopyAfterPowerCutStaysASideVersion() throws {
        let store = makeMemoryStore()
        var ino: UInt64 = 0
        do {
            let fs = try openFS(store)
            fs.publishesOnClose = false   // killed between the close and its publish
            ino = try fs.makeFile(try fs.ino("SugoiApp"), "report.txt", b("old"))
            XCTAssertTrue(fs.publishAll().isEmpty)   // durable
            let h = try fs.open(ino, flags: O_RDWR)
            try fs.put(h, b("new"), at: 0)
            try fs.flush(handle: h)
            // Synced after the mark, so the finished copy survives the cut, marked: only the
            // restart keeps it from being made current.
            let left = try XCTUnwrap(store.work.leftovers().first)
            XCTAssertTrue(left.finished)
            try left.file.sync()
        }
        (store.metadata as? MemoryMetadataStore)?.simulatePowerCut()
        (store.blobs as? MemoryBlobStore)?.simulatePowerCut()
        (store.work as? MemoryWorkArea)?.simulatePowerCut()
        let fs = try openFS(store)
        assertBytes(try fs.contents(ino), b("old"))
        XCTAssertEqual(try store.metadata.versions(of: ino).map(\.origin), [.published, .recovered])
    }

    func testFinishedFlagSurvivesInTheEmbeddedWorkArea() throws {
        let directory = embeddedDirectory()
        var ino: UInt64 = 0
        try embeddedSession(directory) { fs, _ in
            ino = try fs.makeFile(try fs.ino("SugoiApp"), "doc.txt", b("first"))
        }
        try embeddedSession(directory, publish: false) { fs, _ in
            let h = try fs.open(ino, flags: O_RDWR | O_TRUNC)
            try fs.put(h, b("second, closed"), at: 0)
            try fs.flush(handle: h)
        }
        try embeddedSession(directory) { fs, store in
            assertBytes(try fs.contents(ino), b("second, closed"))
            XCTAssertEqual(try store.metadata.versions(of: ino).map(\.origin), [.published, .published])
        }
    }

    // MARK: idle publishing

    func testIdlePublish() throws {
        let store = makeMemoryStore()
        let fs = try openFS(store)
        let docs = try fs.ino("SugoiApp")
        let (attrs, h) = try fs.create(parent: docs, name: b("held.log"), mode: 0o644, flags: O_RDWR, caller: owner)
        try fs.put(h, b("line 1\n"), at: 0)

        fs.idlePublishNanoseconds = 3_600_000_000_000   // an hour: not idle yet
        fs.publishIdle()
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 0)

        fs.idlePublishNanoseconds = 0
        fs.publishIdle()
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 1, "published while still open")
        assertBytes(try openFS(store).contents("SugoiApp/held.log"), b("line 1\n"),
                       "another view of the store sees it")
        fs.publishIdle()
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 1, "nothing new, nothing published")

        try fs.put(h, b("line 2\n"), at: 7)
        assertBytes(try fs.get(h, at: 0, count: 100), b("line 1\nline 2\n"))
        fs.publishIdle()
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 2)
        try fs.release(handle: h)
        XCTAssertEqual(try store.metadata.versions(of: attrs.ino).count, 2, "release after idle publish: nothing new")
        assertBytes(try openFS(store).contents("SugoiApp/held.log"), b("line 1\nline 2\n"))
    }
}

/// A durability that runs a test's step once, right after a sync returns.
final class HookedDurability: Durability, @unchecked Sendable {
    private let wrapped: any Durability
    var afterNextSync: (() throws -> Void)?
    init(_ wrapped: any Durability) { self.wrapped = wrapped }
    func begin(writer: String, snapshot: StoreSnapshot) throws(StoreError) -> [String] {
        try wrapped.begin(writer: writer, snapshot: snapshot)
    }
    func sync() throws(StoreError) {
        try wrapped.sync()
        guard let step = afterNextSync else { return }
        afterNextSync = nil
        do { try step() } catch { XCTFail("\(error)") }
    }
    func syncMetadata() throws(StoreError) { try wrapped.syncMetadata() }
    func end(writer: String) throws(StoreError) { try wrapped.end(writer: writer) }
}
