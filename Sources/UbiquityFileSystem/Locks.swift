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
    public func testLock(_ ino: UInt64, owner id: UInt64, mode: LockMode, range: LockRange) throws -> HeldLock? {
        do { return try store.locks.test(ino, owner: owner(id, .posix), mode: mode, range: range) }
        catch { throw FSError(error) }
    }

    /// Take, change or drop (`mode` nil) a lock without waiting: `F_SETLK`, or `flock` with
    /// `LOCK_NB` (the range is then ignored). False when another owner's lock is in the way.
    public func setLock(_ ino: UInt64, owner id: UInt64, style: LockStyle, mode: LockMode?,
                        range: LockRange = .wholeFile, pid: Int32) throws -> Bool {
        let done: Bool
        do { done = try store.locks.set(ino, owner: owner(id, style), mode: mode, range: range, pid: pid) }
        catch { throw FSError(error) }
        // Dropping or narrowing a lock may let a waiter in.
        if done { lockWaiters.retrySoon() }
        return done
    }

    /// `F_SETLKW`, or `flock` without `LOCK_NB`: take the lock as soon as no other owner's lock is
    /// in the way. `done` is called exactly once, on another thread: with 0 once the lock is
    /// held, EINTR once `interrupted()` is true (or the daemon stops), or a failure's errno.
    public func waitForLock(_ ino: UInt64, owner id: UInt64, style: LockStyle, mode: LockMode,
                            range: LockRange = .wholeFile, pid: Int32,
                            interrupted: @escaping @Sendable () -> Bool, done: @escaping @Sendable (Int32) -> Void) {
        lockWaiters.add(LockWaiters.Waiter(
            attempt: { [self] in try setLock(ino, owner: id, style: style, mode: mode, range: range, pid: pid) },
            interrupted: interrupted, done: done))
    }

    /// Drop every lock of one owner on one node: POSIX locks when the owner closes any descriptor
    /// of the file (`flush`), a `flock` lock when its open file description goes (`release`).
    public func releaseLocks(_ ino: UInt64, owner id: UInt64, style: LockStyle) {
        store.locks.release(ino, owner: owner(id, style))
        lockWaiters.retrySoon()
    }

    /// End every waiting lock request with EINTR, before the mount goes away.
    public func stopLockWaits() {
        lockWaiters.stop()
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
        // Whatever joined after `stop` took the list was answered by `stop` or `add`.
        let left = waiting
        waiting = []
        running = false
        condition.broadcast()
        condition.unlock()
        for w in left { w.done(EINTR) }
    }
}
