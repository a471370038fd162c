// Advisory locks (`fcntl` record locks, `flock`) through the store's lock table, so that locks
// taken through one daemon block conflicting ones taken through another. The kernel leaves them
// to the filesystem once it is told the filesystem handles them (and then keeps none itself), so
// this is also where locks between two processes on one mount are decided.
//
// Waiting. The table never blocks. A lock request that must wait (`F_SETLKW`, `flock` without
// `LOCK_NB`) joins `LockWaiters`: one thread that retries every waiting request when a lock of
// this daemon is dropped, and every few milliseconds for locks dropped elsewhere (another daemon
// releasing, or dying: the kernel drops a dead daemon's locks). A waiting request holds no FUSE
// worker and ends with EINTR when the caller is interrupted by a signal.

import Foundation
import UbiquityStore

extension UbiquityFileSystem {
    private func owner(_ id: UInt64, _ style: LockStyle) -> LockOwner {
        LockOwner(writer: writerID, id: id, style: style)
    }

    /// `F_GETLK`: the lock of another owner that a lock of `mode` on `range` would conflict with.
    public func testLock(_ ino: UInt64, owner id: UInt64, mode: LockMode, range: LockRange) throws(FSError) -> HeldLock? {
        try typed {
            do { return try store.locks.test(ino, owner: owner(id, .posix), mode: mode, range: range) }
            catch { throw FSError(error) }
        }
    }

    /// Take, change or drop (`mode` nil) a lock without waiting: `F_SETLK`, or `flock` with
    /// `LOCK_NB` (the range is then ignored). False when another owner's lock is in the way.
    /// `handle` is the open file the request came through (see `LockHandles`).
    public func setLock(_ ino: UInt64, owner id: UInt64, style: LockStyle, mode: LockMode?,
                        range: LockRange = .wholeFile, pid: Int32, handle: UInt64? = nil) throws(FSError) -> Bool {
        let done: Bool
        do { done = try store.locks.set(ino, owner: owner(id, style), mode: mode, range: range, pid: pid) }
        catch { throw FSError(error) }
        if done, mode != nil, style == .posix, let handle { lockHandles.used(ino, owner: id, handle: handle) }
        // Dropping or narrowing a lock may let a waiter in.
        if done { lockWaiters.retrySoon() }
        return done
    }

    /// `F_SETLKW`, or `flock` without `LOCK_NB`: take the lock as soon as no other owner's lock is
    /// in the way. `done` is called exactly once, on another thread: with 0 once the lock is
    /// held, EINTR once `interrupted()` is true (or the daemon stops), or a failure's errno.
    public func waitForLock(_ ino: UInt64, owner id: UInt64, style: LockStyle, mode: LockMode,
                            range: LockRange = .wholeFile, pid: Int32, handle: UInt64? = nil,
                            interrupted: @escaping @Sendable () -> Bool, done: @escaping @Sendable (Int32) -> Void) {
        lockWaiters.add(LockWaiters.Waiter(
            attempt: { [self] in
                try setLock(ino, owner: id, style: style, mode: mode, range: range, pid: pid, handle: handle)
            },
            interrupted: interrupted, done: done))
    }

    /// Drop every lock of one owner on one node: POSIX locks when the owner closes any descriptor
    /// of the file (`flush`), a `flock` lock when its open file description goes (`release`).
    public func releaseLocks(_ ino: UInt64, owner id: UInt64, style: LockStyle) {
        store.locks.release(ino, owner: owner(id, style))
        if style == .posix { lockHandles.ownerReleased(ino, owner: id) }
        lockWaiters.retrySoon()
    }

    /// The last release of an open file: end the POSIX locks of owners that took locks only
    /// through it (open-file-description locks, see `LockHandles`).
    func releaseLocks(ofHandle handle: UInt64) {
        let ended = lockHandles.handleReleased(handle)
        guard !ended.isEmpty else { return }
        for (ino, id) in ended { store.locks.release(ino, owner: owner(id, .posix)) }
        lockWaiters.retrySoon()
    }

    /// End every waiting lock request with EINTR, before the mount goes away.
    public func stopLockWaits() {
        lockWaiters.stop()
    }
}

/// Which open files (handles) each POSIX lock owner took locks through. The kernel ends a
/// process's POSIX locks with a `flush` on each close, but sends nothing for the locks of an open
/// file description (`F_OFD_SETLK`, whose owner is the description itself) when it goes. So the
/// last release of a handle ends the locks of owners that used that handle alone. A process's
/// own locks taken through it are gone by then (closing the descriptor flushed them), so this
/// drops nothing a process still holds.
final class LockHandles: @unchecked Sendable {
    private struct Key: Hashable {
        var ino: InodeNumber
        var owner: UInt64
    }
    private let lock = Lock()
    private var handlesOf: [Key: Set<UInt64>] = [:]   // guarded by lock
    private var keysOf: [UInt64: Set<Key>] = [:]      // guarded by lock

    func used(_ ino: InodeNumber, owner: UInt64, handle: UInt64) {
        let key = Key(ino: ino, owner: owner)
        lock.withLock {
            handlesOf[key, default: []].insert(handle)
            keysOf[handle, default: []].insert(key)
        }
    }

    func ownerReleased(_ ino: InodeNumber, owner: UInt64) {
        let key = Key(ino: ino, owner: owner)
        lock.withLock {
            for handle in handlesOf.removeValue(forKey: key) ?? [] {
                keysOf[handle]?.remove(key)
                if keysOf[handle]?.isEmpty == true { keysOf[handle] = nil }
            }
        }
    }

    /// Forget `handle`; the owners that took locks through it alone.
    func handleReleased(_ handle: UInt64) -> [(InodeNumber, UInt64)] {
        lock.withLock {
            var ended: [(InodeNumber, UInt64)] = []
            for key in keysOf.removeValue(forKey: handle) ?? [] {
                handlesOf[key]?.remove(handle)
                if handlesOf[key]?.isEmpty == true {
                    handlesOf[key] = nil
                    ended.append((key.ino, key.owner))
                }
            }
            return ended
        }
    }
}

/// Lock requests that are waiting, and the thread that retries them.
final class LockWaiters: @unchecked Sendable {
    struct Waiter {
        var attempt: () throws -> Bool
        var interrupted: () -> Bool
        var done: (Int32) -> Void
    }
    /// How often waiters retry when nothing in this daemon woke them: the delay before a waiter
    /// sees a lock dropped by another daemon.
    static let pollInterval: TimeInterval = 0.01

    private let condition = NSCondition()
    private var waiting: [Waiter] = []   // guarded by condition
    private var wake = false             // guarded by condition
    private var stopped = false          // guarded by condition
    private var running = false          // guarded by condition

    func add(_ waiter: Waiter) {
        condition.lock()
        if stopped {
            condition.unlock()
            waiter.done(EINTR)
            return
        }
        waiting.append(waiter)
        wake = true
        if !running {
            running = true
            let t = Thread { [self] in loop() }
            t.name = "lock-waiters"
            t.start()
        }
        condition.broadcast()
        condition.unlock()
    }

    func retrySoon() {
        condition.lock()
        if !waiting.isEmpty {
            wake = true
            condition.broadcast()
        }
        condition.unlock()
    }

    func stop() {
        condition.lock()
        stopped = true
        let left = waiting
        waiting = []
        condition.broadcast()
        while running { condition.wait() }
        condition.unlock()
        for w in left { w.done(EINTR) }
    }

    private func loop() {
        condition.lock()
        while !stopped {
            if waiting.isEmpty {
                condition.wait()
                continue
            }
            if !wake { _ = condition.wait(until: Date().addingTimeInterval(Self.pollInterval)) }
            wake = false
            if stopped { break }
            // Take the list out, so that no lock of this class is held while trying or replying.
            let batch = waiting
            waiting = []
            condition.unlock()
            var still: [Waiter] = []
            for w in batch {
                if w.interrupted() { w.done(EINTR); continue }
                do {
                    if try w.attempt() { w.done(0) } else { still.append(w) }
                } catch {
                    w.done((error as? FSError)?.errno ?? EIO)
                }
            }
            condition.lock()
            waiting = still + waiting
        }
        // The waiters put back after `stop` took the list: answered here, before `running`
        // goes false, since `stop` returns then and the session may go right after.
        let left = waiting
        waiting = []
        condition.unlock()
        for w in left { w.done(EINTR) }
        condition.lock()
        running = false
        condition.broadcast()
        condition.unlock()
    }
}
