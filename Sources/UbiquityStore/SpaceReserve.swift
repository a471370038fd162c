// A full disk must never stop the changes that free space. With the disk full, SQLite cannot
// grow its WAL, so even `rm` (a move to Recently Deleted) and `trash empty` would fail with
// ENOSPC, and the only way out would be to stop the daemon and delete files by hand.
//
// So the embedded store keeps `reserve`, a file of a few MiB allocated in its folder. A metadata
// commit that fails with ENOSPC releases it (truncates it to nothing) and is tried once more.
// While it is released, new content (working-copy writes, chunk files) is refused with ENOSPC
// at once, so the space goes to the namespace: deletes, renames and emptying Recently Deleted
// keep working. The store allocates the reserve again as soon as the disk has room for it
// (looked at with statvfs by the calls that need it), and content writes work again with no
// restart. Each daemon on a store keeps its own view of whether the reserve is given up, and
// looks at the file at most every 100 ms of content writes to learn that another daemon gave it
// up (so that its writes do not eat the space the other freed for names).

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

final class SpaceReserve: Sendable {
    let path: String
    /// Bytes kept: 1/32 of the filesystem, at least 1 MiB and at most 16 MiB.
    let size: Int64
    /// Set while the reserve is given up: read without the lock on every content write.
    private let released = Atomic<Bool>(false)
    /// Serializes giving the reserve up and taking it again (the file calls included), so a
    /// restore can never overlap a release and leave the flag and the file disagreeing.
    private let change = Mutex<Void>(())
    private let disabled = Atomic<Bool>(false)
    /// Monotonic time of the last look at the file for another daemon's release.
    private let lastLook = Atomic<UInt64>(0)
    private let directory: String
    private let log: @Sendable (String) -> Void

    /// The reserve of the store in `directory`, not allocated yet (see `start`).
    init(directory: String, log: @escaping @Sendable (String) -> Void) {
        self.directory = directory
        path = directory + "/reserve"
        var st = statvfs()
        let total = retryEINTR({ statvfs(directory, &st) }) == 0 ? Int64(st.f_blocks) * Int64(st.f_frsize) : 0
        size = min(16 << 20, max(1 << 20, total / 32))
        self.log = log
    }

    /// Allocates the reserve, once the store opened whole (a store refused as damaged or newer
    /// gets no new file). Where the filesystem cannot allocate ahead the store keeps none.
    func start() {
        change.withLock { _ in
            switch hasRoom() ? allocate() : ENOSPC {
            case 0: break
            case ENOSPC:
                released.store(true, ordering: .releasing)
                log("the disk holding the store has no room for its \(size >> 20) MiB reserve: new content is refused "
                    + "(ENOSPC) until space is freed; deletes and emptying Recently Deleted still work")
            case let code:
                disabled.store(true, ordering: .releasing)
                log("the store keeps no space reserve: allocating \(path) failed: \(String(cString: strerror(code)))")
            }
        }
    }

    /// Whether the disk has room for the reserve and 1 MiB besides: only then is allocating
    /// tried, since a failing fallocate fills the disk for a moment before giving it back.
    private func hasRoom() -> Bool {
        var st = statvfs()
        guard retryEINTR({ statvfs(directory, &st) }) == 0 else { return false }
        var own = stat()
        let held = lstat(path, &own) == 0 ? Int64(own.st_blocks) * 512 : 0
        return Int64(st.f_bavail) * Int64(st.f_frsize) + held >= size + (1 << 20)
    }

    /// 0, or the errno of allocating `size` bytes (what a failure allocated is given back).
    private func allocate() -> Int32 {
        let fd = retryEINTR { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        guard fd >= 0 else { return errno }
        defer { close(fd) }
        var code: Int32
        repeat { code = posix_fallocate(fd, 0, off_t(size)) } while code == EINTR
        if code != 0 { _ = retryEINTR { ftruncate(fd, 0) } }
        return code
    }

    /// Frees the reserve for a metadata commit that found the disk full; false if it was
    /// already free (so trying again would not help).
    func release() -> Bool {
        guard !disabled.load(ordering: .acquiring) else { return false }
        let freed = change.withLock { _ -> Bool in
            guard !released.load(ordering: .acquiring) else { return false }
            _ = retryEINTR { truncate(path, 0) }
            released.store(true, ordering: .releasing)
            return true
        }
        if freed {
            log("the disk holding the store is full: released its \(size >> 20) MiB reserve so that changes to names "
                + "can go on; new content is refused (ENOSPC) until space is freed (delete files and empty Recently Deleted)")
        }
        return freed
    }

    /// Whether the reserve is given up now (one atomic load).
    var isReleased: Bool { released.load(ordering: .relaxed) }

    /// Throws ENOSPC while the reserve is released and the disk still has no room for it.
    /// Cheap when it is in place (an atomic load and a vDSO clock read; an lstat at most every
    /// 100 ms): called before every content write.
    func checkRoom(for what: @autoclosure () -> String) throws(StoreError) {
        if !released.load(ordering: .relaxed) {
            guard releasedElsewhere() else { return }
            let noticed = change.withLock { _ -> Bool in
                guard !released.load(ordering: .acquiring) else { return false }
                released.store(true, ordering: .releasing)
                return true
            }
            if noticed { log("another daemon of the store released its reserve: the disk is full; new content is refused (ENOSPC) until space is freed") }
        }
        if !restore() {
            throw StoreError(errno: ENOSPC, "\(what()): the disk holding the store is full (its reserve is in use)")
        }
    }

    /// Whether the reserve file is shorter than its size while this daemon thinks it in place:
    /// another daemon released it (a release truncates it to nothing; its size, not its blocks,
    /// since some filesystems allocate no blocks ahead). Looks at most every 100 ms (an lstat).
    private func releasedElsewhere() -> Bool {
        guard !disabled.load(ordering: .relaxed) else { return false }
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let ns = UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
        let last = lastLook.load(ordering: .relaxed)
        guard ns &- last >= 100_000_000, lastLook.compareExchange(expected: last, desired: ns, ordering: .relaxed).exchanged
        else { return false }
        var st = stat()
        return lstat(path, &st) != 0 || Int64(st.st_size) < size
    }

    /// Allocates the reserve again if it is released and the disk has room for it (a statvfs
    /// while it is released); true if it is in place.
    @discardableResult
    func restore() -> Bool {
        guard released.load(ordering: .acquiring) else { return true }
        let back = change.withLock { _ -> Bool in
            guard released.load(ordering: .acquiring) else { return false }
            guard hasRoom(), allocate() == 0 else { return false }
            released.store(false, ordering: .releasing)
            return true
        }
        if back { log("the disk holding the store has room again: its reserve is in place and new content is accepted") }
        return !released.load(ordering: .acquiring)
    }
}
