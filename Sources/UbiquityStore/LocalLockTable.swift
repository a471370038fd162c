// The embedded store's lock table: the kernel's own locks on one small file per node,
// `<store>/locks/<node>`, so that every daemon on the store sees them.
//
// Each (node, owner) holding a lock has a descriptor of its own on the node's lock file. POSIX
// locks are open-file-description locks (`F_OFD_SETLK`) on it: they conflict between descriptors,
// never with their own, and split and merge by range exactly as the owner's locks on a local file
// would; `flock` locks are `flock` on it. The kernel drops them when the descriptor closes, so a
// daemon that dies (even `kill -9`) releases every lock it held, and a waiter elsewhere gets it on
// its next try. Each owner's POSIX ranges are also kept here, only to tell when its descriptor can
// close and to name the holder's process in `F_GETLK` when the holder is in this daemon.
//
// Lock files are empty. One is removed when its node is deleted from the store, by the daemon
// that deleted it, if no other daemon runs and it holds no lock on it itself; otherwise they
// stay while the store is in use: removing one another daemon has open (even for a deleted
// node, which a program there may still have open and locked) would let a later owner lock a
// new file of that name beside the old one's holder. A daemon that finds itself the store's
// only user (it takes `locks/.folder` exclusively) clears them all, as nobody can hold a lock
// then.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

// Linux's open-file-description lock commands (glibc defines them only under _GNU_SOURCE).
private let F_OFD_GETLK: Int32 = 36
private let F_OFD_SETLK: Int32 = 37

public final class LocalLockTable: LockTable, @unchecked Sendable {
    private struct Key: Hashable {
        var node: InodeNumber
        var owner: LockOwner
    }
    private struct Held {
        var fd: Int32
        var segments = LockSegments()   // POSIX owners only
    }
    /// `<store>/locks`.
    public let directory: String
    private let folderLock: Int32
    /// Keeps the store's shared lock held while this part of the store is open.
    private let storeLock: StoreLock?
    // `mutex` guards `held`. It is held across the lock calls (never blocking ones) and the
    // `open` of a lock file, so one owner's descriptor and ranges change together; lock requests
    // are rare next to reads and writes, and the longest wait behind it is one file creation.
    private let mutex = StoreMutex()
    private var held: [Key: Held] = [:]

    public convenience init(directory: String) throws(StoreError) {
        try self.init(directory: directory, storeLock: nil)
    }

    init(directory: String, storeLock: StoreLock?) throws(StoreError) {
        try makeDirectories(directory)
        let path = directory + "/locks"
        if try makeDirectory(path) { try fsyncDirectory(directory) }
        let lockPath = path + "/.folder"
        let fd = retryEINTR { open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        if fd < 0 { throw systemError("open", lockPath, errno) }
        if retryEINTR({ flock(fd, LOCK_EX | LOCK_NB) }) == 0 {
            Self.clear(path)
        }
        // Shared from here on: others may clear only once every user is gone. (If another daemon
        // slips in between, it clears too, which is harmless: nobody holds a lock yet.)
        if retryEINTR({ flock(fd, LOCK_SH) }) != 0 {
            let code = errno
            close(fd)
            throw systemError("flock", lockPath, code)
        }
        self.directory = path
        self.folderLock = fd
        self.storeLock = storeLock
    }

    deinit {
        for h in held.values { close(h.fd) }
        close(folderLock)
    }

    private static func clear(_ path: String) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: path) else { return }
        for name in names where !name.hasPrefix(".") { unlink(path + "/" + name) }
    }

    private func openLockFile(_ node: InodeNumber) throws(StoreError) -> Int32 {
        let path = "\(directory)/\(node)"
        let fd = retryEINTR { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        if fd < 0 { throw systemError("open", path, errno) }
        return fd
    }

    public func set(_ node: InodeNumber, owner: LockOwner, mode: LockMode?, range: LockRange, pid: Int32) throws(StoreError) -> Bool {
        let key = Key(node: node, owner: owner)
        return try mutex.withLock { () throws(StoreError) -> Bool in
            var entry: Held
            if let existing = held[key] {
                entry = existing
            } else {
                // Nothing to drop for an owner that holds nothing.
                guard mode != nil else { return true }
                entry = Held(fd: try openLockFile(node))
            }
            let done: Bool
            switch owner.style {
            case .posix:
                var fl = flock()
                fl.l_type = Int16(mode.map { $0 == .write ? F_WRLCK : F_RDLCK } ?? F_UNLCK)
                fl.l_whence = Int16(SEEK_SET)
                fl.l_start = __off_t(range.start)
                fl.l_len = __off_t(range.length)
                if retryEINTR({ fcntl(entry.fd, F_OFD_SETLK, &fl) }) == 0 {
                    entry.segments.apply(mode, start: range.start, end: range.end)
                    entry.segments.pid = pid
                    done = true
                } else if errno == EAGAIN || errno == EACCES {
                    done = false
                } else {
                    let code = errno
                    if held[key] == nil { close(entry.fd) }
                    throw systemError("lock", "\(directory)/\(node)", code)
                }
                if entry.segments.isEmpty {
                    close(entry.fd)
                    held[key] = nil
                } else {
                    held[key] = entry
                }
            case .flock:
                let op = mode.map { $0 == .write ? LOCK_EX : LOCK_SH } ?? LOCK_UN
                if retryEINTR({ flock(entry.fd, op | LOCK_NB) }) == 0 {
                    done = true
                } else if errno == EWOULDBLOCK {
                    done = false
                } else {
                    let code = errno
                    if held[key] == nil { close(entry.fd) }
                    throw systemError("flock", "\(directory)/\(node)", code)
                }
                // A failed conversion has dropped the old lock (Linux's rule), so a descriptor
                // holds a lock only after a successful lock.
                if done && mode != nil {
                    held[key] = entry
                } else {
                    close(entry.fd)
                    held[key] = nil
                }
            }
            return done
        }
    }

    public func test(_ node: InodeNumber, owner: LockOwner, mode: LockMode, range: LockRange) throws(StoreError) -> HeldLock? {
        let key = Key(node: node, owner: owner)
        return try mutex.withLock { () throws(StoreError) -> HeldLock? in
            // The owner's own descriptor, so its own locks are not reported; a fresh one (which
            // holds nothing) when it has none.
            let fd: Int32
            if let existing = held[key] { fd = existing.fd } else { fd = try openLockFile(node) }
            defer { if held[key] == nil { close(fd) } }
            var fl = flock()
            fl.l_type = Int16(mode == .write ? F_WRLCK : F_RDLCK)
            fl.l_whence = Int16(SEEK_SET)
            fl.l_start = __off_t(range.start)
            fl.l_len = __off_t(range.length)
            if retryEINTR({ fcntl(fd, F_OFD_GETLK, &fl) }) != 0 {
                throw systemError("test lock", "\(directory)/\(node)", errno)
            }
            if fl.l_type == Int16(F_UNLCK) { return nil }
            let found = HeldLock(mode: fl.l_type == Int16(F_WRLCK) ? .write : .read,
                                 range: LockRange(start: Int64(fl.l_start), length: Int64(fl.l_len)), pid: 0)
            let r = found.range
            // Name the holder when it is one of this daemon's owners: one of them holding exactly
            // the lock the kernel reported (a holder elsewhere may overlap a local one).
            for (k, h) in held where k.node == node && k.owner != owner && k.owner.style == .posix {
                if let s = h.segments.conflict(with: mode, start: r.start, end: r.end), s.mode == found.mode,
                   s.start == r.start, s.end == r.end {
                    return HeldLock(mode: found.mode, range: r, pid: h.segments.pid)
                }
            }
            return found
        }
    }

    public func release(_ node: InodeNumber, owner: LockOwner) {
        mutex.withLock {
            if let h = held.removeValue(forKey: Key(node: node, owner: owner)) { close(h.fd) }
        }
    }

    public func forget(_ node: InodeNumber) {
        mutex.withLock {
            guard !held.keys.contains(where: { $0.node == node }) else { return }
            _ = unlink("\(directory)/\(node)")
        }
    }

    /// Descriptors open for held locks (for tests: none may stay once their locks are gone).
    var openDescriptors: Int { mutex.withLock { held.count } }
}
