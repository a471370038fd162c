// The gap between an answer and the kernel taking it, on a store other writers change.
//
// The daemon answers a lookup with attributes it read a moment before; the kernel makes its
// inode from the answer only after the daemon has written it. Another writer's change applied
// in between is invalidated by the change feed, but an inode invalidation finds no inode yet:
// the kernel answers ENOENT, drops nothing, and then keeps the answer's attributes for the whole
// cache time (a file another mount renamed into place would read as the empty file it was a
// moment before). (A name's invalidation waits for the folder's lock, which a lookup or listing
// under way holds, so names do not race this way.) Two rules close the gap:
// - an inode invalidation the kernel did not hear is sent again while the daemon counts the node
//   as the kernel's (`UnheardInvalidations`);
// - the attributes of a file another writer changed a moment ago are answered for no cache time
//   (`RecentRemoteChanges`): it is likely to change again, and its invalidation may be the one
//   that goes unheard (NFS likewise caches files that change for less time).
// (Counting the node as the kernel's while its attributes are read, under the namespace lock,
// is the third: see `UbiquityFileSystem.lookup`.)

import Foundation
import UbiquityStore

/// Inode invalidations the kernel answered ENOENT, sent again every 2 ms doubling to 50 ms,
/// for `span`, while the node is held. Mostly ENOENT means the kernel let the inode go (its
/// FORGET is on its way); for a node whose answer is on its way, the kernel makes the inode
/// within moments and the next try drops what it took.
public final class UnheardInvalidations: @unchecked Sendable {
    private struct Pending {
        let ino: UInt64
        let first: UInt64
        var next: UInt64
        var tries: Int
    }

    /// Sends changes to the kernel; returns those it did not hear, or nil if nothing was sent
    /// (the session no longer serves).
    private let send: @Sendable ([KernelInvalidation]) -> [KernelInvalidation]?
    /// The changes whose node the kernel still holds.
    private let held: @Sendable ([KernelInvalidation]) -> [KernelInvalidation]
    private let span: UInt64
    private let condition = NSCondition()
    private var pending: [UInt64: Pending] = [:]   // by node; guarded by condition
    private var stopping = false                   // guarded by condition
    private var running = false                    // guarded by condition
    private var thread: Thread?                    // guarded by condition
    /// Nodes pending at most: past that, more are not tried again (a mass change elsewhere).
    static let limit = 10_000

    public init(span: UInt64 = 5_000_000_000,
                send: @escaping @Sendable ([KernelInvalidation]) -> [KernelInvalidation]?,
                held: @escaping @Sendable ([KernelInvalidation]) -> [KernelInvalidation]) {
        self.span = span
        self.send = send
        self.held = held
    }

    /// When `p` is next tried after its `tries`-th try, or nil to give up.
    private func next(after p: Pending, now: UInt64) -> UInt64? {
        guard now &- p.first < span else { return nil }
        return now &+ min(2_000_000 << UInt64(min(p.tries - 1, 5)), 50_000_000)
    }

    /// Changes the kernel did not hear on their first try (names are left alone, see above).
    public func add(_ changes: [KernelInvalidation]) {
        let nodes = changes.compactMap { if case .node(let ino) = $0 { ino } else { nil } }
        guard !nodes.isEmpty else { return }
        let now = monotonicNanoseconds()
        condition.lock()
        defer { condition.unlock() }
        guard !stopping else { return }
        for ino in nodes where pending[ino] == nil && pending.count < Self.limit {
            var p = Pending(ino: ino, first: now, next: 0, tries: 1)
            p.next = next(after: p, now: now)!
            pending[ino] = p
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
            guard let soonest = pending.values.lazy.map(\.next).min() else {
                condition.wait()
                continue
            }
            let now = monotonicNanoseconds()
            if soonest > now {
                _ = condition.wait(until: Date().addingTimeInterval(Double(soonest - now) / 1e9))
                continue
            }
            let due = pending.values.filter { $0.next <= now }
            for p in due { pending[p.ino] = nil }
            condition.unlock()
            let tried = held(due.map { .node($0.ino) })
            let unheard = tried.isEmpty ? [] : Set(send(tried) ?? [])
            let after = monotonicNanoseconds()
            condition.lock()
            for var p in due where unheard.contains(.node(p.ino)) && pending[p.ino] == nil {
                p.tries += 1
                if let next = next(after: p, now: after) {
                    p.next = next
                    pending[p.ino] = p
                }
            }
        }
        running = false
        condition.broadcast()
        condition.unlock()
    }
}

/// Files another writer changed in the last `window`, whose attributes the kernel is told to
/// keep for no time (see above).
struct RecentRemoteChanges {
    static let window: UInt64 = 2_000_000_000
    private var last: [InodeNumber: UInt64] = [:]
    /// Notes in the order made (so, by time), for pruning without a scan.
    private var order: [(ino: InodeNumber, at: UInt64)] = []
    private var head = 0

    var isEmpty: Bool { last.isEmpty }

    func contains(_ ino: InodeNumber) -> Bool { !last.isEmpty && last[ino] != nil }

    /// Whether `prune(now:)` has anything to forget.
    func hasExpired(now: UInt64) -> Bool { head < order.count && now &- order[head].at >= Self.window }

    mutating func note(_ ino: InodeNumber, now: UInt64) {
        last[ino] = now
        order.append((ino, now))
    }

    /// Forget notes older than the window.
    mutating func prune(now: UInt64) {
        while hasExpired(now: now) {
            let (ino, at) = order[head]
            if last[ino] == at { last[ino] = nil }
            head += 1
        }
        if head == order.count {
            order.removeAll(keepingCapacity: order.count < 4096)
            head = 0
        } else if head > 4096 && head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
    }
}
