// The journal of grouped commits: one file per daemon of the embedded store, in the store's
// `journal/` folder.
//
// A daemon groups its non-durable commits into one SQLite transaction (64 at most, for ~2 ms at
// most): SQLite's per-transaction cost (WAL frames, locks, the WAL index) is paid once per group.
// A commit is acknowledged before its group commits, so each is first appended here, one write
// and no fsync, exactly as a commit outside a group reaches SQLite's WAL: it survives the daemon's
// death (`kill -9`), not a power cut. Whoever opens the next write transaction on the store — the
// daemon's next incarnation, or another daemon of the store — applies the records the store lacks
// before anything else, so they land on the very state they were checked against, under the
// positions they were acknowledged with.
//
// The file is flock'd while its daemon lives; a journal whose lock is free belongs to a dead
// daemon and is removed once its records are in the store. Frame: payload length (u32), FNV-1a
// checksum of the payload (u64), payload (`BatchCoding.encodeRecord`), little endian. A torn last
// frame (the daemon died inside the write) was never acknowledged, and ends the journal.
//
// Every write transaction must look for other daemons' records, and listing the folder each time
// was most of what opening a group cost an isolated change. So a daemon watches the folder
// (inotify): another journal can only appear by a create or a rename into it. While the last
// listing found no journal but the daemon's own and the watch has reported nothing since, there
// is nothing to look for. (A journal that was there keeps the daemon listing until it is gone:
// a death or a failed group commit raises no event.) Every daemon of an embedded store runs on
// one machine and sees the folder through the same filesystem (SQLite's WAL needs memory they
// share), so every such change raises an event here. Without a watch (no inotify instance to be
// had) every look lists the folder.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One daemon's journal. Used under its store's mutex only.
final class CommitJournal: @unchecked Sendable {
    static let suffix = ".journal"
    static let frameHeader = 12

    let folder: String
    let path: String
    private let fd: Int32
    /// Bytes of whole frames in the file.
    private(set) var size = 0
    /// A failed append could not be cut off again: later frames would be unreadable behind it,
    /// so nothing is appended until the next `reset`.
    private(set) var broken = false
    /// The folder's inotify watch (-1: none; see the top of this file).
    private let watchFD: Int32
    /// The last listing found no journal but this one, and the watch has reported nothing since.
    private var alone = false
    /// How many times the folder was listed (what the watch saves, shown by a test).
    private(set) var listings = 0

    init(folder: String) throws(StoreError) {
        try makeDirectories(folder, mode: 0o700)
        let name = "\(getpid())-\(String(UInt32.random(in: 0 ... .max), radix: 16))"
        let temporary = folder + "/" + name + ".new"
        let fd = retryEINTR { open(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        if fd < 0 { throw systemError("create", temporary, errno) }
        // Locked before it takes its name: a journal under its name whose lock is free is a
        // dead daemon's, and its reader removes it.
        if retryEINTR({ flock(fd, LOCK_EX | LOCK_NB) }) != 0 {
            let code = errno
            close(fd)
            unlink(temporary)
            throw systemError("flock", temporary, code)
        }
        let path = folder + "/" + name + Self.suffix
        do throws(StoreError) {
            try renameNoReplace(temporary, path)
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        self.folder = folder
        self.path = path
        self.fd = fd
        watchFD = Self.watch(folder)
    }

    deinit {
        // Empty: every record is in the store. Otherwise the next writer applies them.
        if size == 0 && !broken { unlink(path) }
        close(fd)
        if watchFD >= 0 { close(watchFD) }
    }

    /// A watch for what can bring another journal into `folder`, or -1.
    private static func watch(_ folder: String) -> Int32 {
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { return -1 }
        if inotify_add_watch(fd, folder, UInt32(IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)) < 0 {
            close(fd)
            return -1
        }
        return fd
    }

    /// Whether a listing of the folder might find another daemon's journal.
    fileprivate func othersPossible() -> Bool {
        guard alone, watchFD >= 0 else { return true }
        if drained() { alone = false }
        return !alone
    }

    /// Consumes the watch's events: whether there were any (or they could not be read).
    private func drained() -> Bool {
        var any = false
        return withUnsafeTemporaryAllocation(byteCount: 4096, alignment: 8) { buffer -> Bool in
            while true {
                let n = read(watchFD, buffer.baseAddress, buffer.count)
                if n > 0 {
                    any = true
                } else if n < 0 && errno == EINTR {
                    continue
                } else {
                    return any || !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                }
            }
        }
    }

    /// Lists the folder, noting whether it found only this journal (a listing cut short never
    /// counts as that). The watch is drained first: what happens from here on is reported to
    /// the next look.
    fileprivate func list() -> [String] {
        if watchFD >= 0 { _ = drained() }
        listings += 1
        let (names, complete) = Self.names(in: folder)
        alone = complete && names.allSatisfy { folder + "/" + $0 == path }
        return names
    }

    /// Appends one record. On failure the file is as it was (or `broken`).
    func append(_ payload: [UInt8]) throws(StoreError) {
        if broken { throw StoreError(errno: EIO, "\(path): an earlier write failed half-way") }
        var frame = [UInt8]()
        frame.reserveCapacity(Self.frameHeader + payload.count)
        withUnsafeBytes(of: UInt32(payload.count).littleEndian) { frame.append(contentsOf: $0) }
        let sum = payload.withUnsafeBytes { contentChecksum($0) }
        withUnsafeBytes(of: sum.littleEndian) { frame.append(contentsOf: $0) }
        frame.append(contentsOf: payload)
        do throws(StoreError) {
            try pwriteFully(fd, frame, at: size, path: path)
        } catch {
            // A torn frame would hide every record written after it.
            if retryEINTR({ ftruncate(fd, off_t(size)) }) != 0 { broken = true }
            throw error
        }
        size += frame.count
    }

    /// Empties the journal (its records are in the store).
    func reset() throws(StoreError) {
        if retryEINTR({ ftruncate(fd, 0) }) != 0 { throw systemError("truncate", path, errno) }
        size = 0
        broken = false
    }

    /// A journal with records, as a writer about to apply them sees it.
    struct Found {
        let path: String
        let records: [(seq: ChangeSeq, batch: Batch)]
        /// The lock of a dead daemon's journal, now held: the file goes once its records are
        /// committed. nil while its daemon lives (it empties the file itself) and for one's own.
        let lockFD: Int32?

        /// After the transaction that applied the records committed (or failed: `committed` false).
        func finish(committed: Bool) {
            guard let lockFD else { return }
            if committed { unlink(path) }
            close(lockFD)
        }
    }

    /// The journals in `folder` that hold records, oldest first (by their first position);
    /// `own`'s only when `includeOwn`. Empty journals of dead daemons, and files a daemon died
    /// before naming, are removed on the way.
    static func pending(in folder: String, own: CommitJournal?, includeOwn: Bool) -> [Found] {
        guard let listing = look(in: folder, own: own, skipping: !includeOwn) else { return [] }
        var found: [Found] = []
        for name in listing {
            let path = folder + "/" + name
            let isOwn = path == own?.path
            if isOwn && !includeOwn { continue }
            let isJournal = name.hasSuffix(suffix)
            var st = stat()
            // A file not yet named may be a starting daemon's that has yet to lock it (trying
            // its lock then would fail that daemon's start): only an old one is a dead daemon's.
            guard isJournal || (name.hasSuffix(".new") && lstat(path, &st) == 0 && time(nil) - st.st_mtim.tv_sec > 60)
            else { continue }
            let fd = retryEINTR { open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
            guard fd >= 0 else { continue }
            // One's own is locked through the other descriptor: it counts as alive.
            let dead = !isOwn && retryEINTR({ flock(fd, LOCK_EX | LOCK_NB) }) == 0
            let size = fstat(fd, &st) == 0 ? Int(st.st_size) : 0
            if !isJournal || size == 0 {
                if dead { unlink(path) }
                close(fd)
                continue
            }
            let records = (try? preadFully(fd, count: size, at: 0, path: path)).map(Self.records) ?? []
            if records.isEmpty {
                if dead { unlink(path) }
                close(fd)
                continue
            }
            if dead {
                found.append(Found(path: path, records: records, lockFD: fd))
            } else {
                close(fd)
                found.append(Found(path: path, records: records, lockFD: nil))
            }
        }
        return found.sorted { $0.records[0].seq < $1.records[0].seq }
    }

    /// Whether `folder` holds a dead daemon's journal with records (cheap enough to ask at each
    /// poll of the change feed: a file name and a size per daemon).
    static func orphanExists(in folder: String, own: CommitJournal?) -> Bool {
        guard let listing = look(in: folder, own: own, skipping: true) else { return false }
        for name in listing where name.hasSuffix(suffix) {
            let path = folder + "/" + name
            var st = stat()
            guard path != own?.path, lstat(path, &st) == 0, st.st_size > 0 else { continue }
            let fd = retryEINTR { open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
            guard fd >= 0 else { continue }
            defer { close(fd) }
            if retryEINTR({ flock(fd, LOCK_EX | LOCK_NB) }) == 0 { return true }
        }
        return false
    }

    /// The names in `folder` to look at, or nil where `own`'s watch says no other journal can
    /// be there (only when `skipping`: a look for `own`'s records always lists).
    private static func look(in folder: String, own: CommitJournal?, skipping: Bool) -> [String]? {
        guard let own else { return names(in: folder).names }
        if skipping && !own.othersPossible() { return nil }
        return own.list()
    }

    /// The journals and unnamed journals in `folder` (readdir, not FileManager: a listing was
    /// most of what opening a group cost an isolated change). `complete` is false where the folder could not be read to its end (what was read is kept).
    static func names(in folder: String) -> (names: [String], complete: Bool) {
        guard let dir = opendir(folder) else { return ([], false) }
        defer { closedir(dir) }
        var names: [String] = []
        // readdir's nil is the end or an error: a listing cut short must not pass for whole.
        while true {
            errno = 0
            guard let entry = readdir(dir) else { return (names, errno == 0) }
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name.hasSuffix(suffix) || name.hasSuffix(".new") { names.append(name) }
        }
    }

    /// The whole frames of `bytes`, up to the first torn or foreign one.
    static func records(_ bytes: [UInt8]) -> [(seq: ChangeSeq, batch: Batch)] {
        var out: [(seq: ChangeSeq, batch: Batch)] = []
        var at = 0
        bytes.withUnsafeBytes { raw in
            while raw.count - at >= frameHeader {
                let length = Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self)))
                let sum = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: at + 4, as: UInt64.self))
                let start = at + frameHeader
                guard length <= raw.count - start else { return }
                let payload = UnsafeRawBufferPointer(rebasing: raw[start ..< start + length])
                guard contentChecksum(payload) == sum,
                      let record = BatchCoding.decodeRecord(Array(payload)) else { return }
                out.append(record)
                at = start + length
            }
        }
        return out
    }
}
