// Invalidations the kernel did not hear, sent again.
//
// The kernel answers an invalidation ENOENT when it has no inode, or no name, to drop. Mostly
// that is the truth. But it makes an inode or a name from a reply only after the daemon has
// written the reply: an invalidation sent between the two finds nothing, and the kernel then
// keeps what the reply said, read before the change, for the whole cache time (a file another
// mount renamed into place would read as the empty file it was a moment before, or a new name
// would stay missing). So an unheard invalidation is sent again over the next moments while
// the daemon still counts its node, or its folder, as held by the kernel: a node for up to 2 s
// (a held node the kernel has not made is rare, and is one whose reply is on its way), a name a
// few times within half a second (most names are simply not cached).

import Foundation
import UbiquityStore

public final class UnheardInvalidations: @unchecked Sendable {
    private struct Pending {
        let change: KernelInvalidation
        let first: UInt64
        var next: UInt64
        var tries: Int
    }

    /// Sends changes to the kernel; returns those it did not hear, or nil if nothing was sent
    /// (the session no longer serves).
    private let send: ([KernelInvalidation]) -> [KernelInvalidation]?
    /// The changes whose node (or folder) the kernel still holds.
    private let held: ([KernelInvalidation]) -> [KernelInvalidation]
    private let condition = NSCondition()
    private var pending: [Pending] = []   // guarded by condition
    private var stopping = false          // guarded by condition
    private var running = false           // guarded by condition
    private var thread: Thread?           // guarded by condition
    /// Pending changes at most: past that, new ones are not tried again (a mass change elsewhere).
    static let limit = 10_000
    /// How long a node's invalidation is tried again.
    static let nodeSpan: UInt64 = 2_000_000_000
    /// When a name's invalidation is tried again, after the first try.
    static let entryDelays: [UInt64] = [5_000_000, 25_000_000, 100_000_000, 500_000_000]

    public init(send: @escaping ([KernelInvalidation]) -> [KernelInvalidation]?,
         held: @escaping ([KernelInvalidation]) -> [KernelInvalidation]) {
        self.send = send
        self.held = held
    }

    /// When `p` is next tried after its `tries`-th try, or nil to give up.
    private static func next(after p: Pending, now: UInt64) -> UInt64? {
        switch p.change {
        case .node:
            guard now &- p.first < nodeSpan else { return nil }
            // 2 ms, doubling to 50 ms: soon after the kernel makes the inode.
            return now &+ min(2_000_000 << UInt64(min(p.tries - 1, 5)), 50_000_000)
        case .entry:
            guard p.tries <= entryDelays.count else { return nil }
            return p.first &+ entryDelays[p.tries - 1]
        }
    }

    /// Changes the kernel did not hear on their first try.
    public func add(_ changes: [KernelInvalidation]) {
        guard !changes.isEmpty else { return }
        let now = monotonicNanoseconds()
        condition.lock()
        defer { condition.unlock() }
        guard !stopping else { return }
        for change in changes.prefix(max(0, Self.limit - pending.count)) {
            var p = Pending(change: change, first: now, next: 0, tries: 1)
            p.next = Self.next(after: p, now: now)!
            pending.append(p)
        }
        if thread == nil {
            let t = Thread { [self] in run() }
            t.name = "invalidations-again"
            thread = t
            running = true
            t.start()
        }
        condition.broadcast()
    }

    /// Stop trying (before the session goes); waits for a try under way.
    public func stop() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while running { condition.wait() }
        condition.unlock()
    }

    private func run() {
        condition.lock()
        while !stopping {
            guard let soonest = pending.lazy.map(\.next).min() else {
                condition.wait()
                continue
            }
            let now = monotonicNanoseconds()
            if soonest > now {
                _ = condition.wait(until: Date().addingTimeInterval(Double(soonest - now) / 1e9))
                continue
            }
            let due = pending.filter { $0.next <= now }
            pending.removeAll { $0.next <= now }
            condition.unlock()
            let stillHeld = Set(held(due.map(\.change)))
            let tried = due.filter { stillHeld.contains($0.change) }
            let unheard = send(tried.map(\.change)).map(Set.init) ?? []
            let after = monotonicNanoseconds()
            condition.lock()
            for var p in tried where unheard.contains(p.change) {
                p.tries += 1
                if let next = Self.next(after: p, now: after) {
                    p.next = next
                    pending.append(p)
                }
            }
        }
        running = false
        condition.broadcast()
        condition.unlock()
    }
}
