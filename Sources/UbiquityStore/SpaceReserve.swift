// A full disk must never stop the changes that free space. With the disk full, SQLite cannot
// grow its WAL, so even `rm` (a move to Recently Deleted) and `trash empty` would fail with
// ENOSPC, and the only way out would be to stop the daemon and delete files by hand.
//
// So the embedded store keeps `reserve`, a file of a few MiB allocated in its folder. A metadata
// commit that fails with ENOSPC releases it (truncates it to nothing) and is tried once more.
// While it is released, new content (working-copy writes, chunk files) is refused with ENOSPC
// at once, so the space goes to the namespace: deletes, renames and emptying Recently Deleted
// keep working. The store allocates the reserve again as soon as the disk has room for it
// (tried at most every half second, from the calls that need it), and content writes work
// again with no restart.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

final class SpaceReserve: Sendable {
    let path: String
    /// Bytes kept: 1/32 of the filesystem, at least 1 MiB and at most 16 MiB.
    let size: Int64
    private let released = Atomic<Bool>(false)
    /// When allocating it again was last tried (CLOCK_MONOTONIC ns); guards the attempts.
    private let lastTry = Mutex<UInt64>(0)
    private let log: @Sendable (String) -> Void

    /// The reserve of the store in `directory`, not allocated yet (see `start`).
    init(directory: String, log: @escaping @Sendable (String) -> Void) {
        path = directory + "/reserve"
        var st = statvfs()
        let total = retryEINTR({ statvfs(directory, &st) }) == 0 ? Int64(st.f_blocks) * Int64(st.f_frsize) : 0
        size = min(16 << 20, max(1 << 20, total / 32))
        self.log = log
    }

    /// Allocates the reserve, once the store opened whole (a store refused as damaged or newer
    /// gets no new file). Where the filesystem cannot allocate ahead the store keeps none.
    func start() {
        switch allocate() {
        case 0: break
        case ENOSPC:
            released.store(true, ordering: .relaxed)
            log("the disk holding the store has no room for its \(size >> 20) MiB reserve: new content is refused "
                + "(ENOSPC) until space is freed; deletes and emptying Recently Deleted still work")
        case let code:
            disabled.store(true, ordering: .relaxed)
            log("the store keeps no space reserve: allocating \(path) failed: \(String(cString: strerror(code)))")
        }
    }

    private let disabled = Atomic<Bool>(false)

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
        guard !disabled.load(ordering: .relaxed), !released.exchange(true, ordering: .acquiringAndReleasing) else { return false }
        _ = retryEINTR { truncate(path, 0) }
        lastTry.withLock { $0 = monotonicNanoseconds() }
        log("the disk holding the store is full: released its \(size >> 20) MiB reserve so that changes to names "
            + "can go on; new content is refused (ENOSPC) until space is freed (delete files and empty Recently Deleted)")
        return true
    }

    /// Throws ENOSPC while the reserve is released and the disk still has no room for it.
    /// Cheap when it is in place (one atomic load): called before every content write.
    func checkRoom(for what: @autoclosure () -> String) throws(StoreError) {
        guard released.load(ordering: .relaxed) else { return }
        if !restore() {
            throw StoreError(errno: ENOSPC, "\(what()): the disk holding the store is full (its reserve is in use)")
        }
    }

    /// Allocates the reserve again if it is released and the last try was over half a second
    /// ago; true if it is in place.
    @discardableResult
    func restore() -> Bool {
        guard released.load(ordering: .acquiring) else { return true }
        let now = monotonicNanoseconds()
        let due = lastTry.withLock { last -> Bool in
            guard now &- last >= 500_000_000 else { return false }
            last = now
            return true
        }
        guard due, allocate() == 0 else { return false }
        if released.exchange(false, ordering: .acquiringAndReleasing) {
            log("the disk holding the store has room again: its reserve is in place and new content is accepted")
        }
        return true
    }
}
