// POSIX behaviour of the model, without a kernel: data, truncation across chunks, sharing of one
// working copy, unlink-while-open, rename variants, links, special files, names, times, ownership,
// extended attributes, statfs and folder link counts. Everything runs in SugoiApp's Documents
// (levels Any) in the drive view over a memory store.

import Foundation
import XCTest
import UbiquityFileSystem
import UbiquityStore

final class PosixModelTests: XCTestCase {
    var store: BackingStore!
    var fs: UbiquityFileSystem!
    var docs: UInt64 = 0

    override func setUpWithError() throws {
        store = makeMemoryStore()
        fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        docs = try fs.ino("SugoiApp")
    }

    override func tearDown() {
        fs = nil
        store = nil
    }

    private func mkdir(_ parent: UInt64, _ name: String, mode: UInt32 = 0o755, caller: Caller = owner) throws -> UInt64 {
        try fs.mkdir(parent: parent, name: b(name), mode: mode, caller: caller).ino
    }

    private func reopen() throws -> UbiquityFileSystem {
        XCTAssertTrue(fs.publishAll().isEmpty)
        return try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
    }

    // MARK: data

    func testCreateWriteReadOverwrite() throws {
        let (attrs, h) = try fs.create(parent: docs, name: b("a.txt"), mode: 0o640, flags: O_RDWR | O_CREAT, caller: owner)
        XCTAssertEqual(attrs.kind, .regular)
        XCTAssertEqual(attrs.mode, UInt32(S_IFREG) | 0o640)
        XCTAssertEqual(attrs.nlink, 1)
        XCTAssertEqual(attrs.size, 0)
        XCTAssertEqual(attrs.uid, owner.uid)
        XCTAssertEqual(attrs.gid, owner.gid)
        XCTAssertEqual(try fs.lookup(parent: docs, name: b("a.txt")).ino, attrs.ino)

        try fs.put(h, b("hello world"), at: 0)
        assertBytes(try fs.get(h, at: 0, count: 100), b("hello world"))
        assertBytes(try fs.get(h, at: 6, count: 100), b("world"))
        assertBytes(try fs.get(h, at: 11, count: 10), [])
        assertBytes(try fs.get(h, at: 1000, count: 10), [])
        try fs.put(h, b("HELLO"), at: 0)
        assertBytes(try fs.get(h, at: 0, count: 100), b("HELLO world"))
        XCTAssertEqual(try fs.getattr(attrs.ino).size, 11)
        try fs.release(handle: h)

        assertBytes(try fs.contents(attrs.ino), b("HELLO world"))
        try fs.writeFile(attrs.ino, b("WORLD!"), at: 6)
        assertBytes(try fs.contents(attrs.ino), b("HELLO WORLD!"))
        XCTAssertEqual(try fs.getattr(attrs.ino).size, 12)

        assertErrno(EEXIST, try fs.create(parent: docs, name: b("a.txt"), mode: 0o644, flags: O_RDWR | O_CREAT | O_EXCL, caller: owner),
                    "create over an existing name")
        let ro = try fs.open(attrs.ino, flags: O_RDONLY)
        assertErrno(EBADF, try b("x").withUnsafeBytes { try fs.write(handle: ro, offset: 0, bytes: $0) }, "write on O_RDONLY")
        try fs.release(handle: ro)
        assertErrno(EBADF, try fs.release(handle: ro), "double release")
        assertErrno(EISDIR, try fs.open(docs, flags: O_RDONLY), "open a folder")
    }

    func testWritesSpanningChunks() throws {
        let (attrs, h) = try fs.create(parent: docs, name: b("span"), mode: 0o644, flags: O_RDWR, caller: owner)
        // 100 bytes across the first chunk boundary of an empty file.
        let edge = pattern(100, seed: 3)
        try fs.put(h, edge, at: UInt64(chunkSize - 50))
        XCTAssertEqual(try fs.getattr(attrs.ino).size, UInt64(chunkSize + 50))
        var expected = [UInt8](repeating: 0, count: chunkSize - 50) + edge
        assertBytes(try fs.get(h, at: 0, count: chunkSize + 100), expected)
        // 2.5 MiB from 0.5 MiB: spans chunks 0..2 fully or partly.
        let big = pattern(5 * chunkSize / 2, seed: 9)
        try fs.put(h, big, at: UInt64(chunkSize / 2))
        expected = [UInt8](expected.prefix(chunkSize / 2)) + big
        assertBytes(try fs.get(h, at: 0, count: 4 * chunkSize), expected)
        try fs.release(handle: h)
        assertBytes(try fs.contents(attrs.ino), expected)
        let again = try reopen()
        assertBytes(try again.contents(attrs.ino), expected)
        // Reads that straddle chunk boundaries at odd offsets.
        let rh = try again.open(attrs.ino, flags: O_RDONLY)
        for offset in [chunkSize - 1, chunkSize, 2 * chunkSize - 7, 3 * chunkSize - 1] {
            assertBytes(try again.get(rh, at: UInt64(offset), count: 13),
                           Array(expected[offset..<min(offset + 13, expected.count)]), "at \(offset)")
        }
        try again.release(handle: rh)
    }

    func testTruncateShrinkAndGrowAcrossChunks() throws {
        let original = pattern(5 * chunkSize / 2, seed: 5)
        let ino = try fs.makeFile(docs, "t", original)   // published: the base is 3 chunks

        // Shrink to mid-chunk, then grow: the old tail must not come back.
        let mid = UInt64(3 * chunkSize / 2)
        XCTAssertEqual(try fs.setattr(ino, AttributeChanges(size: mid), handle: nil, caller: owner).size, mid)
        assertBytes(try fs.contents(ino), Array(original.prefix(Int(mid))))
        _ = try fs.setattr(ino, AttributeChanges(size: UInt64(3 * chunkSize)), handle: nil, caller: owner)
        var expected = Array(original.prefix(Int(mid))) + [UInt8](repeating: 0, count: 3 * chunkSize - Int(mid))
        assertBytes(try fs.contents(ino), expected)

        // Exactly at a chunk boundary, then grow.
        _ = try fs.setattr(ino, AttributeChanges(size: UInt64(chunkSize)), handle: nil, caller: owner)
        _ = try fs.setattr(ino, AttributeChanges(size: UInt64(2 * chunkSize + 3)), handle: nil, caller: owner)
        expected = Array(original.prefix(chunkSize)) + [UInt8](repeating: 0, count: chunkSize + 3)
        assertBytes(try fs.contents(ino), expected)

        // The same within one open handle, before any publish.
        let h = try fs.open(ino, flags: O_RDWR)
        try fs.put(h, pattern(2 * chunkSize, seed: 8), at: UInt64(chunkSize))
        expected = Array(original.prefix(chunkSize)) + pattern(2 * chunkSize, seed: 8)
        assertBytes(try fs.get(h, at: 0, count: 4 * chunkSize), expected)
        _ = try fs.setattr(ino, AttributeChanges(size: UInt64(chunkSize + 10)), handle: h, caller: owner)
        XCTAssertEqual(try fs.getattr(ino).size, UInt64(chunkSize + 10))
        _ = try fs.setattr(ino, AttributeChanges(size: UInt64(2 * chunkSize + 10)), handle: h, caller: owner)
        expected = Array(expected.prefix(chunkSize + 10)) + [UInt8](repeating: 0, count: chunkSize)
        assertBytes(try fs.get(h, at: 0, count: 4 * chunkSize), expected)
        try fs.release(handle: h)
        assertBytes(try fs.contents(ino), expected)

        // To zero and back: all zeros.
        _ = try fs.setattr(ino, AttributeChanges(size: 0), handle: nil, caller: owner)
        _ = try fs.setattr(ino, AttributeChanges(size: UInt64(chunkSize + 1)), handle: nil, caller: owner)
        assertBytes(try fs.contents(ino), [UInt8](repeating: 0, count: chunkSize + 1))
        assertBytes(try reopen().contents(ino), [UInt8](repeating: 0, count: chunkSize + 1))

        assertErrno(EISDIR, try fs.setattr(docs, AttributeChanges(size: 0), handle: nil, caller: owner), "truncate a folder")
    }

    func testSparseWriteFarOutReadsZeros() throws {
        let (attrs, h) = try fs.create(parent: docs, name: b("sparse"), mode: 0o644, flags: O_RDWR, caller: owner)
        let far: UInt64 = (4 << 30) + 10   // past 4 GiB
        try fs.put(h, b("head"), at: 0)
        try fs.put(h, b("tail"), at: far)
        XCTAssertEqual(try fs.getattr(attrs.ino).size, far + 4)
        assertBytes(try fs.get(h, at: 4, count: 64), [UInt8](repeating: 0, count: 64))
        assertBytes(try fs.get(h, at: 2 << 30, count: 4096), [UInt8](repeating: 0, count: 4096))
        assertBytes(try fs.get(h, at: far - 6, count: 100), [0, 0, 0, 0, 0, 0] + b("tail"))
        assertErrno(EFBIG, try b("x").withUnsafeBytes { try fs.write(handle: h, offset: UInt64(Int64.max), bytes: $0) },
                    "write past the largest offset")
        assertErrno(EFBIG, try fs.setattr(attrs.ino, AttributeChanges(size: UInt64.max), handle: h, caller: owner),
                    "truncate past the largest size")
        try fs.release(handle: h)

        let again = try reopen()
        let a = try again.getattr(attrs.ino)
        XCTAssertEqual(a.size, far + 4)
        XCTAssertLessThan(a.blocks, 8192, "a sparse file does not allocate its holes")
        let rh = try again.open(attrs.ino, flags: O_RDONLY)
        assertBytes(try again.get(rh, at: 0, count: 8), b("head") + [0, 0, 0, 0])
        assertBytes(try again.get(rh, at: (3 << 30) + 12345, count: 4096), [UInt8](repeating: 0, count: 4096))
        assertBytes(try again.get(rh, at: far - 2, count: 100), [0, 0] + b("tail"))
        try again.release(handle: rh)
    }

    func testOpenWithOTruncEmptiesTheFile() throws {
        let ino = try fs.makeFile(docs, "trunc", b("some content"))
        let ro = try fs.open(ino, flags: O_RDONLY)
        XCTAssertEqual(try fs.getattr(ino).size, 12, "a plain open truncates nothing")
        try fs.release(handle: ro)
        let h = try fs.open(ino, flags: O_WRONLY | O_TRUNC)
        XCTAssertEqual(try fs.getattr(ino).size, 0)
        try fs.put(h, b("new"), at: 0)
        try fs.release(handle: h)
        assertBytes(try fs.contents(ino), b("new"))
        assertBytes(try reopen().contents(ino), b("new"))
        // Linux truncates on O_RDONLY|O_TRUNC too (the kernel asks for write permission first).
        let rt = try fs.open(ino, flags: O_RDONLY | O_TRUNC)
        XCTAssertEqual(try fs.getattr(ino).size, 0, "O_RDONLY|O_TRUNC truncates, as on Linux")
        try fs.release(handle: rt)
        assertBytes(try reopen().contents(ino), [])
    }

    func testHandlesShareOneWorkingCopy() throws {
        let (attrs, w) = try fs.create(parent: docs, name: b("shared"), mode: 0o644, flags: O_RDWR, caller: owner)
        let r = try fs.open(attrs.ino, flags: O_RDONLY)
        try fs.put(w, b("x"), at: 0)
        assertBytes(try fs.get(r, at: 0, count: 10), b("x"), "a reader sees a write as soon as it returns")
        let w2 = try fs.open(attrs.ino, flags: O_RDWR)
        try fs.put(w2, b("yz"), at: 1)
        assertBytes(try fs.get(r, at: 0, count: 10), b("xyz"))
        assertBytes(try fs.get(w, at: 0, count: 10), b("xyz"))
        _ = try fs.setattr(attrs.ino, AttributeChanges(size: 2), handle: w2, caller: owner)
        assertBytes(try fs.get(r, at: 0, count: 10), b("xy"))
        XCTAssertEqual(try fs.getattr(attrs.ino).size, 2)
        try fs.release(handle: w)
        // Still shared by the remaining handles; not published until the last close.
        try fs.put(w2, b("!"), at: 2)
        assertBytes(try fs.get(r, at: 0, count: 10), b("xy!"))
        try fs.release(handle: w2)
        try fs.release(handle: r)
        assertBytes(try fs.contents(attrs.ino), b("xy!"))
    }

    func testUnlinkWhileOpen() throws {
        let (attrs, h) = try fs.create(parent: docs, name: b("gone"), mode: 0o644, flags: O_RDWR, caller: owner)
        try fs.put(h, b("data"), at: 0)
        try fs.unlink(parent: docs, name: b("gone"))
        assertErrno(ENOENT, try fs.lookup(parent: docs, name: b("gone")), "name is gone at once")
        XCTAssertEqual(try fs.names(docs), [])
        XCTAssertEqual(try fs.getattr(attrs.ino).nlink, 0)
        assertBytes(try fs.get(h, at: 0, count: 10), b("data"))
        try fs.put(h, b("more"), at: 4)
        assertBytes(try fs.get(h, at: 0, count: 10), b("datamore"))
        XCTAssertEqual(try fs.getattr(attrs.ino).size, 8)
        assertErrno(ENOENT, try fs.link(attrs.ino, newParent: docs, newName: b("revived")),
                    "linkat(AT_EMPTY_PATH) of an unlinked file")
        // A new file can take the name meanwhile.
        try fs.makeFile(docs, "gone", b("other"))
        try fs.release(handle: h)
        // In Documents a delete is a move to Recently Deleted: what was written after it is kept.
        XCTAssertEqual(try fs.getattr(attrs.ino).nlink, 0)
        XCTAssertEqual(fs.trashItems().map(\.ino), [attrs.ino])
        assertBytes(try fs.contents(attrs.ino), b("datamore"))
        XCTAssertEqual(try store.work.leftovers().count, 0, "no working copy left behind")
        assertBytes(try fs.contents("SugoiApp/gone"), b("other"))
    }

    // MARK: rename

    /// Two folders d1 and d2 in Documents.
    private func twoFolders() throws -> (UInt64, UInt64) {
        (try mkdir(docs, "d1"), try mkdir(docs, "d2"))
    }

    func testRenameReplacesAFile() throws {
        let (d1, d2) = try twoFolders()
        let a = try fs.makeFile(d1, "a", b("A"))
        let old = try fs.makeFile(d2, "b", b("B"))
        let reader = try fs.open(old, flags: O_RDONLY)
        try fs.rename(parent: d1, name: b("a"), newParent: d2, newName: b("b"), flags: [])
        assertErrno(ENOENT, try fs.lookup(parent: d1, name: b("a")))
        XCTAssertEqual(try fs.lookup(parent: d2, name: b("b")).ino, a)
        assertBytes(try fs.contents(a), b("A"))
        assertBytes(try fs.get(reader, at: 0, count: 10), b("B"), "the replaced file stays readable while open")
        XCTAssertEqual(try fs.getattr(old).nlink, 0)
        try fs.release(handle: reader)
        assertErrno(ENOENT, try fs.getattr(old), "replaced file is gone after its last close")
        XCTAssertEqual(try fs.names(d1), [])
        XCTAssertEqual(try fs.names(d2), ["b"])
    }

    func testRenameReplacesAnEmptyFolder() throws {
        let (d1, d2) = try twoFolders()
        let x = try mkdir(d1, "x")
        let y = try mkdir(d2, "y")
        try fs.makeFile(x, "inside", b("i"))
        try fs.rename(parent: d1, name: b("x"), newParent: d2, newName: b("y"), flags: [])
        assertErrno(ENOENT, try fs.getattr(y), "the replaced folder is gone")
        XCTAssertEqual(try fs.lookup(parent: d2, name: b("y")).ino, x)
        XCTAssertEqual(try fs.names(x), ["inside"])
        XCTAssertEqual(try fs.getattr(d1).nlink, 2)
        XCTAssertEqual(try fs.getattr(d2).nlink, 3)
        XCTAssertEqual(try fs.lookup(parent: x, name: b("..")).ino, d2)
    }

    func testRenameErrors() throws {
        let (d1, d2) = try twoFolders()
        let full = try mkdir(d2, "full")
        try fs.makeFile(full, "child")
        _ = try mkdir(d1, "dir")
        try fs.makeFile(d1, "file", b("f"))
        try fs.makeFile(d2, "file2", b("g"))
        _ = try mkdir(d2, "emptydir")

        assertErrno(ENOTEMPTY, try fs.rename(parent: d1, name: b("dir"), newParent: d2, newName: b("full"), flags: []),
                    "onto a non-empty folder")
        assertErrno(EISDIR, try fs.rename(parent: d1, name: b("file"), newParent: d2, newName: b("emptydir"), flags: []),
                    "a file onto a folder")
        assertErrno(ENOTDIR, try fs.rename(parent: d1, name: b("dir"), newParent: d2, newName: b("file2"), flags: []),
                    "a folder onto a file")
        assertErrno(ENOENT, try fs.rename(parent: d1, name: b("missing"), newParent: d2, newName: b("x"), flags: []),
                    "missing source")
        assertErrno(ENOTDIR, try fs.rename(parent: try fs.ino("SugoiApp/d1/file"), name: b("x"),
                                           newParent: d2, newName: b("x"), flags: []), "source parent is a file")
        // Into its own subtree.
        let sub = try mkdir(try fs.ino("SugoiApp/d1/dir"), "sub")
        assertErrno(EINVAL, try fs.rename(parent: docs, name: b("d1"), newParent: sub, newName: b("d1"), flags: []),
                    "into its own subtree")
        assertErrno(EINVAL, try fs.rename(parent: docs, name: b("d1"), newParent: d1, newName: b("again"), flags: []),
                    "into itself")
        try fs.makeFile(sub, "z")
        assertErrno(EINVAL, try fs.rename(parent: docs, name: b("d1"), newParent: sub, newName: b("z"), flags: .exchange),
                    "exchange into its own subtree")
        assertErrno(EINVAL, try fs.rename(parent: sub, name: b("z"), newParent: docs, newName: b("d1"), flags: .exchange),
                    "exchange a folder into its own subtree (other order)")
        XCTAssertEqual(try fs.names(d1), ["dir", "file"])
        XCTAssertEqual(try fs.names(d2), ["emptydir", "file2", "full"])
        let longName = String(repeating: "n", count: 256)
        try fs.makeFile(d1, "short")
        assertErrno(ENAMETOOLONG, try fs.rename(parent: d1, name: b("short"), newParent: d2, newName: b(longName), flags: []),
                    "new name too long")
        assertErrno(EINVAL, try fs.rename(parent: d1, name: b("short"), newParent: d2, newName: b("x"),
                                          flags: [.noReplace, .exchange]), "RENAME_NOREPLACE|RENAME_EXCHANGE")
    }

    func testRenameNoReplace() throws {
        let (d1, d2) = try twoFolders()
        try fs.makeFile(d1, "a", b("A"))
        try fs.makeFile(d2, "b", b("B"))
        assertErrno(EEXIST, try fs.rename(parent: d1, name: b("a"), newParent: d2, newName: b("b"), flags: .noReplace))
        assertBytes(try fs.contents("SugoiApp/d2/b"), b("B"))
        XCTAssertNoThrow(try fs.rename(parent: d1, name: b("a"), newParent: d2, newName: b("c"), flags: .noReplace))
        XCTAssertEqual(try fs.names(d2), ["b", "c"])
        XCTAssertEqual(try fs.names(d1), [])
    }

    func testRenameExchangeFileAndFolderAcrossFolders() throws {
        let (d1, d2) = try twoFolders()
        let f = try fs.makeFile(d1, "f", b("file"))
        let dir = try mkdir(d2, "dir")
        try fs.makeFile(dir, "inside")
        XCTAssertEqual(try fs.getattr(d1).nlink, 2)
        XCTAssertEqual(try fs.getattr(d2).nlink, 3)
        try fs.rename(parent: d1, name: b("f"), newParent: d2, newName: b("dir"), flags: .exchange)
        XCTAssertEqual(try fs.lookup(parent: d1, name: b("f")).ino, dir)
        XCTAssertEqual(try fs.lookup(parent: d2, name: b("dir")).ino, f)
        XCTAssertEqual(try fs.names("SugoiApp/d1/f"), ["inside"])
        assertBytes(try fs.contents("SugoiApp/d2/dir"), b("file"))
        XCTAssertEqual(try fs.getattr(d1).nlink, 3, "d1 now holds the folder")
        XCTAssertEqual(try fs.getattr(d2).nlink, 2, "d2 now holds the file")
        XCTAssertEqual(try fs.lookup(parent: dir, name: b("..")).ino, d1)
        XCTAssertEqual(try fs.getattr(docs).nlink, 4)

        // Two files in one exchange swap contents; a missing target is ENOENT.
        let g = try fs.makeFile(d2, "g", b("gee"))
        try fs.rename(parent: d2, name: b("dir"), newParent: d1, newName: b("f"), flags: .exchange)
        XCTAssertEqual(try fs.lookup(parent: d1, name: b("f")).ino, f)
        XCTAssertEqual(try fs.lookup(parent: d2, name: b("dir")).ino, dir)
        try fs.rename(parent: d1, name: b("f"), newParent: d2, newName: b("g"), flags: .exchange)
        assertBytes(try fs.contents("SugoiApp/d1/f"), b("gee"))
        assertBytes(try fs.contents("SugoiApp/d2/g"), b("file"))
        XCTAssertEqual(try fs.lookup(parent: d1, name: b("f")).ino, g)
        assertErrno(ENOENT, try fs.rename(parent: d1, name: b("f"), newParent: d2, newName: b("none"), flags: .exchange),
                    "exchange with nothing")
    }

    func testRenameBetweenTwoNamesOfOneFileDoesNothing() throws {
        let (d1, d2) = try twoFolders()
        let f = try fs.makeFile(d1, "a", b("same"))
        _ = try fs.link(f, newParent: d2, newName: b("b"))
        try fs.rename(parent: d1, name: b("a"), newParent: d2, newName: b("b"), flags: [])
        XCTAssertEqual(try fs.lookup(parent: d1, name: b("a")).ino, f, "POSIX: rename between links of one file does nothing")
        XCTAssertEqual(try fs.lookup(parent: d2, name: b("b")).ino, f)
        XCTAssertEqual(try fs.getattr(f).nlink, 2)
    }

    func testRenameWithinOneFolder() throws {
        let f = try fs.makeFile(docs, "old", b("content"))
        try fs.rename(parent: docs, name: b("old"), newParent: docs, newName: b("new"), flags: [])
        XCTAssertEqual(try fs.names(docs), ["new"])
        XCTAssertEqual(try fs.lookup(parent: docs, name: b("new")).ino, f)
        // Onto itself: nothing happens.
        try fs.rename(parent: docs, name: b("new"), newParent: docs, newName: b("new"), flags: [])
        XCTAssertEqual(try fs.names(docs), ["new"])
        // A folder renamed in place keeps the parent's link count.
        _ = try mkdir(docs, "dir")
        try fs.rename(parent: docs, name: b("dir"), newParent: docs, newName: b("folder"), flags: [])
        XCTAssertEqual(try fs.names(docs), ["folder", "new"])
        XCTAssertEqual(try fs.getattr(docs).nlink, 3)
        try fs.makeFile(docs, "other", b("o"))
        try fs.rename(parent: docs, name: b("new"), newParent: docs, newName: b("other"), flags: .exchange)
        assertBytes(try fs.contents("SugoiApp/other"), b("content"))
    }

    func testLinkAndRenameAcrossContainersIsEXDEV() throws {
        let f = try fs.makeFile(docs, "f", b("x"))
        let notes = try fs.ino("Notes")
        assertErrno(EXDEV, try fs.link(f, newParent: notes, newName: b("f")), "link")
        assertErrno(EXDEV, try fs.rename(parent: docs, name: b("f"), newParent: notes, newName: b("f"), flags: []), "rename")
        assertErrno(EXDEV, try fs.rename(parent: docs, name: b("f"), newParent: notes, newName: b("f"), flags: .noReplace),
                    "rename noreplace")
        _ = try mkdir(docs, "dir")
        assertErrno(EXDEV, try fs.rename(parent: docs, name: b("dir"), newParent: notes, newName: b("dir"), flags: []),
                    "rename a folder")
        XCTAssertEqual(try fs.names(notes), [])
        XCTAssertEqual(try fs.names(docs), ["dir", "f"])
    }

    // MARK: links and special files

    func testHardLinksShareAttributesAndCountLinks() throws {
        let d = try mkdir(docs, "d")
        let f = try fs.makeFile(docs, "f", b("one"))
        let before = try fs.getattr(f)
        tick()
        let linked = try fs.link(f, newParent: d, newName: b("g"))
        XCTAssertEqual(linked.ino, f)
        XCTAssertEqual(linked.nlink, 2)
        XCTAssertGreaterThan(linked.ctime, before.ctime, "link changes ctime")
        XCTAssertEqual(try fs.lookup(parent: docs, name: b("f")).nlink, 2)
        _ = try fs.setattr(f, AttributeChanges(mode: 0o600), handle: nil, caller: owner)
        XCTAssertEqual(try fs.at("SugoiApp/d/g").mode & 0o7777, 0o600)
        try fs.writeFile(try fs.ino("SugoiApp/d/g"), b("ONE, two"))
        assertBytes(try fs.contents("SugoiApp/f"), b("ONE, two"))
        try fs.setxattr(f, name: b("user.tag"), value: b("v"), flags: 0)
        XCTAssertEqual(try fs.getxattr(try fs.ino("SugoiApp/d/g"), name: b("user.tag")), b("v"))

        assertErrno(EEXIST, try fs.link(f, newParent: d, newName: b("g")), "existing name")
        assertErrno(EPERM, try fs.link(d, newParent: docs, newName: b("d2")), "link a folder")
        try fs.unlink(parent: docs, name: b("f"))
        XCTAssertEqual(try fs.getattr(f).nlink, 1)
        assertBytes(try fs.contents("SugoiApp/d/g"), b("ONE, two"))
        let again = try reopen()
        XCTAssertEqual(try again.getattr(f).nlink, 1)
        assertBytes(try again.contents("SugoiApp/d/g"), b("ONE, two"))
    }

    func testSymlinkAndReadlink() throws {
        let target = b("../some/where/file.txt")
        let l = try fs.symlink(parent: docs, name: b("link"), target: target, caller: owner)
        XCTAssertEqual(l.kind, .symlink)
        XCTAssertEqual(l.size, UInt64(target.count))
        XCTAssertEqual(l.mode & 0o777, 0o777)
        XCTAssertEqual(try fs.readlink(l.ino), target)
        XCTAssertEqual(try fs.lookup(parent: docs, name: b("link")).kind, .symlink)
        assertErrno(EEXIST, try fs.symlink(parent: docs, name: b("link"), target: b("x"), caller: owner))
        let f = try fs.makeFile(docs, "plain")
        assertErrno(EINVAL, try fs.readlink(f), "readlink of a file")
        assertErrno(EINVAL, try fs.readlink(docs), "readlink of a folder")
        let h = try fs.opendir(docs)
        let entry = try fs.readdir(handle: h, offset: 0).first { $0.name == b("link") }
        fs.releasedir(handle: h)
        XCTAssertEqual(entry?.kind, .symlink)
        XCTAssertEqual(try reopen().readlink(l.ino), target)
    }

    func testMknodFifoSocketAndDevices() throws {
        let fifo = try fs.mknod(parent: docs, name: b("fifo"), mode: UInt32(S_IFIFO) | 0o640, rdev: 0, caller: owner)
        XCTAssertEqual(fifo.kind, .fifo)
        XCTAssertEqual(fifo.mode, UInt32(S_IFIFO) | 0o640)
        XCTAssertEqual(fifo.size, 0)
        let sock = try fs.mknod(parent: docs, name: b("sock"), mode: UInt32(S_IFSOCK) | 0o755, rdev: 0, caller: owner)
        XCTAssertEqual(sock.kind, .socket)
        let dev = UInt64((1 << 8) | 3)   // makedev(1, 3): /dev/null
        let chr = try fs.mknod(parent: docs, name: b("null"), mode: UInt32(S_IFCHR) | 0o666, rdev: dev, caller: owner)
        XCTAssertEqual(chr.kind, .characterDevice)
        XCTAssertEqual(chr.rdev, dev)
        let blk = try fs.mknod(parent: docs, name: b("blk"), mode: UInt32(S_IFBLK) | 0o600, rdev: 0x0801, caller: owner)
        XCTAssertEqual(blk.kind, .blockDevice)
        let reg = try fs.mknod(parent: docs, name: b("reg"), mode: UInt32(S_IFREG) | 0o600, rdev: 0, caller: owner)
        XCTAssertEqual(reg.kind, .regular)
        assertErrno(EEXIST, try fs.mknod(parent: docs, name: b("fifo"), mode: UInt32(S_IFIFO) | 0o640, rdev: 0, caller: owner))
        assertErrno(EINVAL, try fs.mknod(parent: docs, name: b("lnk"), mode: UInt32(S_IFLNK) | 0o777, rdev: 0, caller: owner),
                    "mknod S_IFLNK")

        let again = try reopen()
        XCTAssertEqual(try again.names(docs), ["blk", "fifo", "null", "reg", "sock"])
        XCTAssertEqual(try again.at("SugoiApp/fifo").kind, .fifo)
        XCTAssertEqual(try again.at("SugoiApp/sock").kind, .socket)
        XCTAssertEqual(try again.at("SugoiApp/null").rdev, dev)
        XCTAssertEqual(try again.at("SugoiApp/null").kind, .characterDevice)
    }

    func testNameLengthLimit() throws {
        let ok = String(repeating: "a", count: 255)
        let long = String(repeating: "b", count: 256)
        let f = try fs.makeFile(docs, ok, b("255"))
        XCTAssertEqual(try fs.lookup(parent: docs, name: b(ok)).ino, f)
        let d = try mkdir(docs, String(repeating: "d", count: 255))
        _ = try fs.symlink(parent: d, name: b(ok), target: b("x"), caller: owner)
        _ = try fs.link(f, newParent: d, newName: b(String(repeating: "l", count: 255)))
        try fs.rename(parent: docs, name: b(ok), newParent: d, newName: b(String(repeating: "r", count: 255)), flags: [])
        // 255 bytes of multi-byte UTF-8 is fine too (85 × 3 bytes).
        try fs.makeFile(docs, String(repeating: "é", count: 85) + "x")   // 171 bytes
        try fs.makeFile(docs, String(repeating: "日", count: 85))         // 255 bytes

        assertErrno(ENAMETOOLONG, try fs.create(parent: docs, name: b(long), mode: 0o644, flags: O_RDWR, caller: owner), "create")
        assertErrno(ENAMETOOLONG, try fs.mkdir(parent: docs, name: b(long), mode: 0o755, caller: owner), "mkdir")
        assertErrno(ENAMETOOLONG, try fs.mknod(parent: docs, name: b(long), mode: UInt32(S_IFIFO) | 0o644, rdev: 0,
                                               caller: owner), "mknod")
        assertErrno(ENAMETOOLONG, try fs.symlink(parent: docs, name: b(long), target: b("x"), caller: owner), "symlink")
        assertErrno(ENAMETOOLONG, try fs.link(f, newParent: docs, newName: b(long)), "link")
        assertErrno(ENAMETOOLONG, try fs.lookup(parent: docs, name: b(long)), "lookup")
        assertErrno(ENAMETOOLONG, try fs.unlink(parent: docs, name: b(long)), "unlink")
        assertErrno(ENAMETOOLONG, try fs.rmdir(parent: docs, name: b(long)), "rmdir")
        assertErrno(ENAMETOOLONG, try fs.rename(parent: d, name: b(ok), newParent: docs, newName: b(long), flags: []), "rename")
        assertErrno(ENAMETOOLONG, try fs.create(parent: docs, name: b(String(repeating: "日", count: 85) + "x"), mode: 0o644,
                                                flags: O_RDWR, caller: owner), "256 bytes of UTF-8")
    }

    // MARK: times

    func testParentTimesChangeOnCreateUnlinkRenameMkdirRmdir() throws {
        let (d1, d2) = try twoFolders()
        func times(_ ino: UInt64) throws -> (Int64, Int64) {
            let a = try fs.getattr(ino)
            return (a.mtime, a.ctime)
        }
        func assertNewer(_ ino: UInt64, than before: (Int64, Int64), _ what: String, line: UInt = #line) throws {
            let now = try times(ino)
            XCTAssertGreaterThan(now.0, before.0, "\(what): mtime", line: line)
            XCTAssertGreaterThan(now.1, before.1, "\(what): ctime", line: line)
        }
        var t = try times(d1)
        tick()
        let f = try fs.makeFile(d1, "f", b("x"))
        try assertNewer(d1, than: t, "create")

        t = try times(d1)
        tick()
        _ = try mkdir(d1, "sub")
        try assertNewer(d1, than: t, "mkdir")

        t = try times(d1)
        tick()
        try fs.rmdir(parent: d1, name: b("sub"))
        try assertNewer(d1, than: t, "rmdir")

        t = try times(d1)
        let t2 = try times(d2)
        let ft = try fs.getattr(f)
        tick()
        try fs.rename(parent: d1, name: b("f"), newParent: d2, newName: b("g"), flags: [])
        try assertNewer(d1, than: t, "rename: source folder")
        try assertNewer(d2, than: t2, "rename: target folder")
        XCTAssertGreaterThan(try fs.getattr(f).ctime, ft.ctime, "rename changes the moved node's ctime")
        XCTAssertEqual(try fs.getattr(f).mtime, ft.mtime, "rename leaves the moved file's mtime")

        t = try times(d2)
        tick()
        try fs.unlink(parent: d2, name: b("g"))
        try assertNewer(d2, than: t, "unlink")

        t = try times(d2)
        tick()
        _ = try fs.symlink(parent: d2, name: b("l"), target: b("t"), caller: owner)
        try assertNewer(d2, than: t, "symlink")
    }

    func testCtimeChangesOnChmodAndLink() throws {
        let f = try fs.makeFile(docs, "f", b("x"))
        let a0 = try fs.getattr(f)
        tick()
        let a1 = try fs.setattr(f, AttributeChanges(mode: 0o600), handle: nil, caller: owner)
        XCTAssertEqual(a1.mode & 0o7777, 0o600)
        XCTAssertGreaterThan(a1.ctime, a0.ctime, "chmod changes ctime")
        XCTAssertEqual(a1.mtime, a0.mtime, "chmod leaves mtime")
        XCTAssertEqual(try fs.getattr(f).ctime, a1.ctime)
        tick()
        _ = try fs.link(f, newParent: docs, newName: b("f2"))
        XCTAssertGreaterThan(try fs.getattr(f).ctime, a1.ctime, "link changes ctime")
        let a2 = try fs.getattr(f)
        tick()
        try fs.unlink(parent: docs, name: b("f2"))
        XCTAssertGreaterThan(try fs.getattr(f).ctime, a2.ctime, "unlink of another name changes ctime")
        let a3 = try fs.getattr(f)
        tick()
        try fs.writeFile(f, b("more"))
        let a4 = try fs.getattr(f)
        XCTAssertGreaterThan(a4.mtime, a3.mtime, "write changes mtime")
        XCTAssertGreaterThan(a4.ctime, a3.ctime, "write changes ctime")
    }

    func testSetattrWithExplicitTimesAndNow() throws {
        let f = try fs.makeFile(docs, "f", b("x"))
        let atime: Int64 = 1_000_000_000_123_456_789
        let mtime: Int64 = 1_200_000_000_987_654_321
        let a = try fs.setattr(f, AttributeChanges(atime: .at(atime), mtime: .at(mtime)), handle: nil, caller: owner)
        XCTAssertEqual(a.atime, atime)
        XCTAssertEqual(a.mtime, mtime)
        XCTAssertEqual(try fs.getattr(f).atime, atime)
        XCTAssertEqual(try fs.getattr(f).mtime, mtime)
        XCTAssertEqual(try reopen().getattr(f).mtime, mtime)

        let before = wallClock()
        let n = try fs.setattr(f, AttributeChanges(atime: .now, mtime: .now), handle: nil, caller: owner)
        let after = wallClock()
        XCTAssertTrue((before...after).contains(n.atime), "atime .now")
        XCTAssertTrue((before...after).contains(n.mtime), "mtime .now")
        XCTAssertTrue((before...after).contains(n.ctime), "ctime")

        // `touch -d` on a file that is open with unpublished writes: the explicit time wins, also
        // after the last close publishes.
        let h = try fs.open(f, flags: O_RDWR)
        try fs.put(h, b("written"), at: 0)
        _ = try fs.setattr(f, AttributeChanges(mtime: .at(mtime)), handle: h, caller: owner)
        XCTAssertEqual(try fs.getattr(f).mtime, mtime)
        try fs.release(handle: h)
        XCTAssertEqual(try fs.getattr(f).mtime, mtime, "after publish")
        XCTAssertEqual(try reopen().getattr(f).mtime, mtime, "after reopening")
        assertBytes(try fs.contents(f), b("written"))
    }

    // MARK: ownership and modes

    func testChownClearsSetUserID() throws {
        let f = try fs.makeFile(docs, "suid", b("#!"))
        _ = try fs.setattr(f, AttributeChanges(mode: 0o6755), handle: nil, caller: owner)
        XCTAssertEqual(try fs.getattr(f).mode & 0o7777, 0o6755)
        let a = try fs.setattr(f, AttributeChanges(uid: 1000), handle: nil, caller: owner)
        XCTAssertEqual(a.uid, 1000)
        XCTAssertEqual(a.mode & UInt32(S_ISUID), 0, "chown clears set-user-ID")
        XCTAssertEqual(a.mode & UInt32(S_ISGID), 0, "and set-group-ID when group-exec is set")
        XCTAssertEqual(a.mode & 0o777, 0o755)

        let g = try fs.makeFile(docs, "sgid-no-exec", b("x"))
        _ = try fs.setattr(g, AttributeChanges(mode: 0o2644), handle: nil, caller: owner)
        let ga = try fs.setattr(g, AttributeChanges(gid: 1000), handle: nil, caller: owner)
        XCTAssertEqual(ga.gid, 1000)
        XCTAssertEqual(ga.mode & 0o7777, 0o2644, "set-group-ID without group-exec (mandatory locking) stays")
    }

    func testDropSetIDAsAWriteByAnotherUserDoes() throws {
        let other = Caller(uid: 4000, gid: 4000)
        func file(_ name: String, mode: UInt32, gid: UInt32 = owner.gid) throws -> UInt64 {
            let f = try fs.makeFile(docs, name, b("x"))
            _ = try fs.setattr(f, AttributeChanges(mode: mode, gid: gid), handle: nil, caller: owner)
            _ = try fs.setattr(f, AttributeChanges(mode: mode), handle: nil, caller: owner)
            return f
        }
        var asked: [UInt32] = []
        let a = try file("a", mode: 0o6777)
        try fs.dropSetID(a, caller: other) { asked.append($0); return false }
        XCTAssertEqual(try fs.getattr(a).mode & 0o7777, 0o777, "both bits go where the group may execute")
        XCTAssertEqual(asked, [], "group-exec decides it: the groups are not asked for")

        let b2 = try file("b", mode: 0o2666, gid: 4242)
        try fs.dropSetID(b2, caller: other) { asked.append($0); return true }
        XCTAssertEqual(try fs.getattr(b2).mode & 0o7777, 0o2666, "a member of the file's group keeps set-group-ID without group-exec")
        XCTAssertEqual(asked, [4242])
        try fs.dropSetID(b2, caller: other) { _ in false }
        XCTAssertEqual(try fs.getattr(b2).mode & 0o7777, 0o666, "anyone else drops it")
        let c = try file("c", mode: 0o2666, gid: 4000)
        try fs.dropSetID(c, caller: other) { _ in XCTFail("the caller's own group needs no look-up"); return false }
        XCTAssertEqual(try fs.getattr(c).mode & 0o7777, 0o2666)

        let d = try file("d", mode: 0o644)
        let before = try fs.getattr(d)
        try fs.dropSetID(d, caller: other) { _ in false }
        XCTAssertEqual(try fs.getattr(d), before, "a file without set-ID bits is left as it was, ctime too")
        let e = try file("e", mode: 0o4755)
        let eBefore = try fs.getattr(e)
        usleep(2000)
        try fs.dropSetID(e, caller: other) { _ in false }
        let eAfter = try fs.getattr(e)
        XCTAssertEqual(eAfter.mode & 0o7777, 0o755)
        XCTAssertGreaterThan(eAfter.ctime, eBefore.ctime, "dropping the bits is a change of the inode")
        let fresh = try reopen()
        XCTAssertEqual(try fresh.getattr(e).mode & 0o7777, 0o755, "committed")
    }

    func testSetgidFolderPassesGroupAndBit() throws {
        let shared = try mkdir(docs, "shared", mode: 0o2775)
        _ = try fs.setattr(shared, AttributeChanges(gid: 4242), handle: nil, caller: owner)
        XCTAssertEqual(try fs.getattr(shared).mode & 0o7777, 0o2775)
        let sub = try fs.mkdir(parent: shared, name: b("sub"), mode: 0o755, caller: alice)
        XCTAssertEqual(sub.uid, alice.uid)
        XCTAssertEqual(sub.gid, 4242, "the group comes from the setgid folder")
        XCTAssertEqual(sub.mode & 0o7777, 0o2755, "subfolders inherit the setgid bit")
        let (file, h) = try fs.create(parent: shared, name: b("f"), mode: 0o644, flags: O_RDWR, caller: alice)
        try fs.release(handle: h)
        XCTAssertEqual(file.gid, 4242)
        XCTAssertEqual(file.mode & 0o7777, 0o644, "files do not get the setgid bit")
        let deeper = try fs.mkdir(parent: sub.ino, name: b("deeper"), mode: 0o700, caller: alice)
        XCTAssertEqual(deeper.gid, 4242)
        XCTAssertEqual(deeper.mode & 0o7777, 0o2700)
        // A normal folder: the caller's group, no bit.
        let plain = try fs.mkdir(parent: docs, name: b("plain"), mode: 0o755, caller: alice)
        XCTAssertEqual(plain.gid, alice.gid)
        XCTAssertEqual(plain.mode & 0o7777, 0o755)
    }

    // MARK: extended attributes, statfs, folder links

    func testUserExtendedAttributes() throws {
        let f = try fs.makeFile(docs, "x", b("x"))
        let c0 = try fs.getattr(f).ctime
        tick()
        try fs.setxattr(f, name: b("user.color"), value: b("blue"), flags: xattrCreate)
        XCTAssertGreaterThan(try fs.getattr(f).ctime, c0, "setxattr changes ctime")
        assertErrno(EEXIST, try fs.setxattr(f, name: b("user.color"), value: b("red"), flags: xattrCreate), "XATTR_CREATE")
        assertErrno(ENODATA, try fs.setxattr(f, name: b("user.size"), value: b("1"), flags: xattrReplace), "XATTR_REPLACE")
        try fs.setxattr(f, name: b("user.color"), value: b("red"), flags: xattrReplace)
        try fs.setxattr(f, name: b("user.empty"), value: [], flags: 0)
        try fs.setxattr(f, name: b("user.bin"), value: [0, 1, 2, 255], flags: 0)
        XCTAssertEqual(try fs.getxattr(f, name: b("user.color")), b("red"))
        XCTAssertEqual(try fs.getxattr(f, name: b("user.empty")), [])
        XCTAssertEqual(try fs.getxattr(f, name: b("user.bin")), [0, 1, 2, 255])
        XCTAssertEqual(try fs.storedXattrs(f), [b("user.bin"), b("user.color"), b("user.empty")])
        assertErrno(ENODATA, try fs.getxattr(f, name: b("user.missing")), "getxattr missing")
        try fs.removexattr(f, name: b("user.color"))
        assertErrno(ENODATA, try fs.getxattr(f, name: b("user.color")), "after remove")
        assertErrno(ENODATA, try fs.removexattr(f, name: b("user.color")), "remove missing")
        XCTAssertEqual(try fs.storedXattrs(f), [b("user.bin"), b("user.empty")])
        for name in ["trusted.x", "security.selinux", "system.posix_acl_access", "other"] {
            assertErrno(EOPNOTSUPP, try fs.setxattr(f, name: b(name), value: b("v"), flags: 0), "setxattr \(name)")
            assertErrno(EOPNOTSUPP, try fs.removexattr(f, name: b(name)), "removexattr \(name)")
            assertErrno(EOPNOTSUPP, try fs.getxattr(f, name: b(name)), "getxattr \(name)")
        }
        assertErrno(ERANGE, try fs.setxattr(f, name: b("user." + String(repeating: "n", count: 251)), value: [], flags: 0),
                    "name over 255 bytes")
        XCTAssertNoThrow(try fs.setxattr(f, name: b("user." + String(repeating: "n", count: 250)), value: [], flags: 0))
        try fs.removexattr(f, name: b("user." + String(repeating: "n", count: 250)))
        assertErrno(E2BIG, try fs.setxattr(f, name: b("user.big"), value: [UInt8](repeating: 1, count: 65537), flags: 0),
                    "value over 64 KiB")
        // Folders carry attributes too, and they persist.
        try fs.setxattr(docs, name: b("user.folder"), value: b("yes"), flags: 0)
        let again = try reopen()
        XCTAssertEqual(try again.storedXattrs(f), [b("user.bin"), b("user.empty")])
        XCTAssertEqual(try again.getxattr(docs, name: b("user.folder")), b("yes"))
    }

    func testAccessFollowsModeBits() throws {
        let f = try fs.makeFile(docs, "private.txt", b("x"), mode: 0o640)
        let other = Caller(uid: 4321, gid: 4321)
        let group = Caller(uid: 4321, gid: owner.gid)
        XCTAssertNoThrow(try fs.access(f, mask: F_OK, caller: other))
        assertErrno(EACCES, try fs.access(f, mask: R_OK, caller: other), "others: no bits")
        XCTAssertNoThrow(try fs.access(f, mask: R_OK, caller: group), "group: read")
        assertErrno(EACCES, try fs.access(f, mask: W_OK, caller: group), "group: no write")
        XCTAssertNoThrow(try fs.access(f, mask: R_OK | W_OK, caller: Caller(uid: owner.uid, gid: 4321)), "owner: read+write")
        assertErrno(EACCES, try fs.access(f, mask: X_OK, caller: .root), "root: no exec bit anywhere")
        XCTAssertNoThrow(try fs.access(f, mask: R_OK | W_OK, caller: .root))
        XCTAssertNoThrow(try fs.access(docs, mask: X_OK, caller: .root), "folders are searchable by root")
        assertErrno(ENOENT, try fs.access(999_999, mask: F_OK, caller: .root), "no such node")
    }

    func testStatfsReportsCapacity() throws {
        let s = fs.statfs()
        XCTAssertGreaterThan(s.blockSize, 0)
        XCTAssertGreaterThan(s.totalBlocks, 0)
        XCTAssertGreaterThan(s.freeBlocks, 0)
        XCTAssertGreaterThan(s.availableBlocks, 0)
        XCTAssertLessThanOrEqual(s.availableBlocks, s.totalBlocks)
        XCTAssertGreaterThan(s.totalFiles, 0)
        XCTAssertEqual(s.nameMax, 255)
    }

    func testFolderLinkCountIsTwoPlusSubfolders() throws {
        XCTAssertEqual(try fs.getattr(docs).nlink, 2)
        let a = try mkdir(docs, "a")
        let bb = try mkdir(docs, "b")
        _ = try mkdir(docs, "c")
        try fs.makeFile(docs, "file")
        _ = try fs.symlink(parent: docs, name: b("link"), target: b("a"), caller: owner)
        XCTAssertEqual(try fs.getattr(docs).nlink, 5, "files and symlinks do not count")
        XCTAssertEqual(try fs.getattr(a).nlink, 2)
        try fs.rename(parent: docs, name: b("c"), newParent: a, newName: b("c"), flags: [])
        XCTAssertEqual(try fs.getattr(docs).nlink, 4)
        XCTAssertEqual(try fs.getattr(a).nlink, 3)
        try fs.rmdir(parent: docs, name: b("b"))
        XCTAssertEqual(try fs.getattr(bb).nlink, 0, "in Recently Deleted: no name in the view")
        XCTAssertEqual(try fs.getattr(docs).nlink, 3)
        assertErrno(ENOTEMPTY, try fs.rmdir(parent: docs, name: b("a")))
        assertErrno(ENOTDIR, try fs.rmdir(parent: docs, name: b("file")))
        assertErrno(EISDIR, try fs.unlink(parent: docs, name: b("a")))
        assertErrno(ENOENT, try fs.rmdir(parent: docs, name: b("nothing")))
        assertErrno(EINVAL, try fs.rmdir(parent: docs, name: b(".")))
        let again = try reopen()
        XCTAssertEqual(try again.getattr(docs).nlink, 3)
        XCTAssertEqual(try again.getattr(a).nlink, 3)
    }

    func testDirectoryHandleIsASnapshot() throws {
        try fs.makeFile(docs, "one")
        let h = try fs.opendir(docs)
        try fs.makeFile(docs, "two")
        let names = try fs.readdir(handle: h, offset: 0).map { String(decoding: $0.name, as: UTF8.self) }
        XCTAssertEqual(names, [".", "..", "one"])
        fs.releasedir(handle: h)
        assertErrno(EBADF, try fs.readdir(handle: h, offset: 0), "released handle")
        assertErrno(ENOTDIR, try fs.opendir(try fs.ino("SugoiApp/one")), "opendir a file")
    }
}

func wallClock() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}
