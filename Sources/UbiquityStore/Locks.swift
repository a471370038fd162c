// Advisory locks shared by every writer of a store: `fcntl` record locks and `flock` whole-file
// locks taken through one daemon block conflicting ones taken through another, as a program
// expects of one filesystem. The table never waits: a lock in the way is reported, and the model
// retries (see UbiquityFileSystem's LockWaiters), so a waiting request holds no thread of the
// store and can be interrupted.
//
// Owners. POSIX locks belong to a process (the kernel's lock owner of its file table): they split
// and merge by byte range, an owner never conflicts with itself, and closing any descriptor of the
// file drops them. `flock` locks belong to one open file description and cover the whole file.
// Owner numbers come from one kernel connection, so a table keys them by the writer too.

/// Shared (`F_RDLCK`, `LOCK_SH`) or exclusive (`F_WRLCK`, `LOCK_EX`).
public enum LockMode: Sendable, Equatable {
    case read, write
}

/// Which rules a lock follows.
public enum LockStyle: Sendable, Hashable {
    case posix, flock
}

/// A byte range as `struct flock` gives it: `length` 0 means to the end of the file, however far
/// it grows.
public struct LockRange: Sendable, Equatable {
    public var start: Int64
    public var length: Int64
    public init(start: Int64, length: Int64) {
        self.start = start
        self.length = length
    }
    public static let wholeFile = LockRange(start: 0, length: 0)

    /// The last byte covered (inclusive); `Int64.max` for a range to the end.
    package var end: Int64 {
        length == 0 || length > Int64.max - start ? Int64.max : start + length - 1
    }
    package init(start: Int64, end: Int64) {
        self.start = start
        self.length = end == Int64.max ? 0 : end - start + 1
    }
}

/// Who holds a lock: one kernel lock owner of one writer (a daemon), under one style's rules.
public struct LockOwner: Sendable, Hashable {
    public var writer: String
    public var id: UInt64
    public var style: LockStyle
    public init(writer: String, id: UInt64, style: LockStyle) {
        self.writer = writer
        self.id = id
        self.style = style
    }
}

/// A lock that is in the way, for `F_GETLK`. `pid` is the holder's process id when the holder
/// is a process of this writer, and 0 when another writer holds it (its process ids mean nothing
/// here; NFS reports remote holders the same way).
public struct HeldLock: Sendable, Equatable {
    public var mode: LockMode
    public var range: LockRange
    public var pid: Int32
    public init(mode: LockMode, range: LockRange, pid: Int32) {
        self.mode = mode
        self.range = range
        self.pid = pid
    }
}

public protocol LockTable: AnyObject, Sendable {
    /// Take, change (`mode` non-nil) or drop (`nil`) `owner`'s lock on `range` of `node`, without
    /// waiting. Returns false, changing nothing, when another owner's lock is in the way; except
    /// that a `flock` conversion that fails has dropped the old lock, as Linux's `flock` does.
    func set(_ node: InodeNumber, owner: LockOwner, mode: LockMode?, range: LockRange, pid: Int32) throws(StoreError) -> Bool
    /// The first lock of another owner that a POSIX lock of `mode` on `range` would conflict with.
    func test(_ node: InodeNumber, owner: LockOwner, mode: LockMode, range: LockRange) throws(StoreError) -> HeldLock?
    /// Drop every lock `owner` holds on `node` (a close, the last release of a `flock` holder).
    func release(_ node: InodeNumber, owner: LockOwner)
    /// `node` is gone from the store: whatever the table keeps for it can go too.
    func forget(_ node: InodeNumber)
}

/// One owner's POSIX locks on one file: disjoint, sorted segments, neighbours of one mode merged,
/// as the kernel keeps them.
package struct LockSegments: Sendable, Equatable {
    package struct Segment: Sendable, Equatable {
        package var start: Int64
        package var end: Int64   // inclusive
        package var mode: LockMode
        package init(start: Int64, end: Int64, mode: LockMode) {
            self.start = start; self.end = end; self.mode = mode
        }
    }
    package private(set) var segments: [Segment] = []
    package var pid: Int32 = 0
    package init() {}

    package var isEmpty: Bool { segments.isEmpty }

    /// Apply a lock (`mode` non-nil) or unlock of `[start, end]`: what was there is replaced.
    package mutating func apply(_ mode: LockMode?, start: Int64, end: Int64) {
        var out: [Segment] = []
        out.reserveCapacity(segments.count + 2)
        for s in segments {
            if s.end < start || s.start > end { out.append(s); continue }
            if s.start < start { out.append(Segment(start: s.start, end: start - 1, mode: s.mode)) }
            if s.end > end { out.append(Segment(start: end + 1, end: s.end, mode: s.mode)) }
        }
        if let mode { out.append(Segment(start: start, end: end, mode: mode)) }
        out.sort { $0.start < $1.start }
        var merged: [Segment] = []
        for s in out {
            if var last = merged.last, last.mode == s.mode, last.end != Int64.max, last.end + 1 >= s.start {
                last.end = max(last.end, s.end)
                merged[merged.count - 1] = last
            } else {
                merged.append(s)
            }
        }
        segments = merged
    }

    /// The first segment that a lock of `mode` on `[start, end]` by another owner conflicts with.
    package func conflict(with mode: LockMode, start: Int64, end: Int64) -> Segment? {
        segments.first { $0.end >= start && $0.start <= end && ($0.mode == .write || mode == .write) }
    }
}

/// The lock table of the in-memory store: the whole table in this process, shared by every model
/// opened on the same `MemoryStore` parts (as two daemons share an embedded store's table).
public final class MemoryLockTable: LockTable, @unchecked Sendable {
    // `mutex` guards `posix` and `flocks`.
    private let mutex = StoreMutex()
    private var posix: [InodeNumber: [LockOwner: LockSegments]] = [:]
    private var flocks: [InodeNumber: [LockOwner: LockMode]] = [:]

    public init() {}

    public func set(_ node: InodeNumber, owner: LockOwner, mode: LockMode?, range: LockRange, pid: Int32) throws(StoreError) -> Bool {
        mutex.withLock {
            switch owner.style {
            case .posix:
                let (start, end) = (range.start, range.end)
                var held = posix[node, default: [:]]
                if let mode, held.contains(where: { $0.key != owner && $0.value.conflict(with: mode, start: start, end: end) != nil }) {
                    return false
                }
                var mine = held[owner] ?? LockSegments()
                mine.apply(mode, start: start, end: end)
                mine.pid = pid
                held[owner] = mine.isEmpty ? nil : mine
                posix[node] = held.isEmpty ? nil : held
                return true
            case .flock:
                var held = flocks[node, default: [:]]
                if held[owner] == mode { return true }
                held[owner] = nil
                defer { flocks[node] = held.isEmpty ? nil : held }
                guard let mode else { return true }
                if held.contains(where: { $0.value == .write || mode == .write }) { return false }
                held[owner] = mode
                return true
            }
        }
    }

    public func test(_ node: InodeNumber, owner: LockOwner, mode: LockMode, range: LockRange) throws(StoreError) -> HeldLock? {
        mutex.withLock {
            for (other, segments) in posix[node] ?? [:] where other != owner {
                if let s = segments.conflict(with: mode, start: range.start, end: range.end) {
                    return HeldLock(mode: s.mode, range: LockRange(start: s.start, end: s.end),
                                    pid: other.writer == owner.writer ? segments.pid : 0)
                }
            }
            return nil
        }
    }

    public func forget(_ node: InodeNumber) {}   // entries go with their last lock

    public func release(_ node: InodeNumber, owner: LockOwner) {
        mutex.withLock {
            switch owner.style {
            case .posix:
                posix[node]?[owner] = nil
                if posix[node]?.isEmpty == true { posix[node] = nil }
            case .flock:
                flocks[node]?[owner] = nil
                if flocks[node]?.isEmpty == true { flocks[node] = nil }
            }
        }
    }
}
