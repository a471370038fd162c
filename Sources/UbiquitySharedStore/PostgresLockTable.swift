// Advisory locks held in PostgreSQL, so a `fcntl` or `flock` lock taken on one machine blocks a
// conflicting one on another.
//
// One row per (node, writer, owner, style) holds that owner's ranges. A change locks the node's
// row in `lock_nodes` first (`SELECT … FOR UPDATE`), so the rows of one node change one
// transaction at a time, and computes the new ranges with the same rules as the local tables.
//
// Leases: a daemon that dies or loses its link cannot release its locks, so each writer renews a
// lease in `writers` every few seconds while it holds locks, and the locks of a writer whose lease
// ran out count for nothing (and are removed by the next change of that node). Lease times are
// the server's clock, so the machines' clocks need not agree.
//
// Cut off from the servers, locks are decided on this machine alone, from its own locks (kept
// in memory for that): its programs still exclude each other, as most lock users need, and
// what two machines write meanwhile meets as versions and conflict copies, never lost. Once the
// servers answer, this machine's locks are put back there as they are now.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

public final class PostgresLockTable: LockTable, @unchecked Sendable {
    /// How long a writer's locks outlive its last renewal.
    public let leaseSeconds: Int
    // `mutex` guards `connection` and `writers`.
    private let mutex = StoreMutex()
    private let connection: PGConnection
    /// The writers this table has taken locks for, whose leases it renews.
    private var writers: Set<String> = []
    /// Owners that asked for a lock on a node (each may hold one): a release by any other owner
    /// (every close of a file) has nothing to give back, and costs no round trip nor waits for
    /// `mutex`. Guarded by `askersMutex`.
    private let askersMutex = StoreMutex()
    private var askers: Set<String> = []
    private var renewing = false
    /// This process's own locks by node and owner, as the servers have them or as taken while
    /// cut off (`pid` set).
    private var mine: [InodeNumber: [LockOwner: LockSegments]] = [:]
    /// Locks changed while cut off: the servers get `mine` once they answer.
    private var unsynced = false
    private let reachability: Reachability?
    private let log: @Sendable (String) -> Void
    /// When the leases were last renewed (monotonic nanoseconds; 0: not yet), and whether their
    /// lapse since was logged.
    private var renewed: UInt64 = 0
    private var lapseLogged = false

    public convenience init(url: String, timeout: Double = 10, leaseSeconds: Int = 15) throws(StoreError) {
        try self.init(url: url, timeout: timeout, leaseSeconds: leaseSeconds, reachability: nil)
    }

    init(url: String, timeout: Double, leaseSeconds: Int, reachability: Reachability?,
         log: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) {
        try checkPostgresURL(url)
        self.reachability = reachability
        self.log = log
        connection = PGConnection(PGTarget(url: url, timeout: timeout, applicationName: "ubiquityfs locks",
                                           reachability: reachability))
        self.leaseSeconds = max(3, leaseSeconds)
    }

    deinit {
        // A clean stop: give every lock back now rather than at the lease's end.
        for w in writers {
            _ = try? connection.query("DELETE FROM ubiquityfs.locks WHERE writer = $1", [.text(w)])
            _ = try? connection.query("DELETE FROM ubiquityfs.writers WHERE writer = $1", [.text(w)])
        }
    }

    private static let serverMillis = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

    private struct Row {
        var writer: String
        var owner: UInt64
        var style: LockStyle
        var pid: Int32
        var segments: LockSegments
        var key: LockOwner { LockOwner(writer: writer, id: owner, style: style) }
    }

    private static func encode(_ s: LockSegments) -> [UInt8] {
        var out: [UInt8] = []
        for seg in s.segments {
            withUnsafeBytes(of: seg.start.littleEndian) { out.append(contentsOf: $0) }
            withUnsafeBytes(of: seg.end.littleEndian) { out.append(contentsOf: $0) }
            out.append(seg.mode == .write ? 1 : 0)
        }
        return out
    }

    private static func decode(_ bytes: [UInt8]) -> LockSegments {
        var s = LockSegments()
        var i = 0
        while i + 17 <= bytes.count {
            let start = bytes.withUnsafeBytes { Int64(littleEndian: $0.loadUnaligned(fromByteOffset: i, as: Int64.self)) }
            let end = bytes.withUnsafeBytes { Int64(littleEndian: $0.loadUnaligned(fromByteOffset: i + 8, as: Int64.self)) }
            s.apply(bytes[i + 16] == 1 ? .write : .read, start: start, end: end)
            i += 17
        }
        return s
    }

    /// The live rows of `node` (writers with a lease), inside the caller's transaction.
    private func rows(_ node: InodeNumber) throws(StoreError) -> [Row] {
        let r = try connection.query("""
            SELECT l.writer, l.owner, l.style, l.pid, l.segments FROM ubiquityfs.locks l
            JOIN ubiquityfs.writers w ON w.writer = l.writer
            WHERE l.node = $1 AND w.lease_until > \(Self.serverMillis)
            """, [.int(Int64(bitPattern: node))])
        return (0..<r.count).map { i in
            Row(writer: r.text(i, 0), owner: r.uint(i, 1), style: r.int(i, 2) == 1 ? .flock : .posix,
                pid: Int32(truncatingIfNeeded: r.int(i, 3)), segments: Self.decode(r.bytes(i, 4)))
        }
    }

    /// Whether `owner` gets `mode` on `range` beside `others`, and its ranges after (nil:
    /// unchanged), by the rules of the local tables.
    private static func decide(others: [Row], current: LockSegments, owner: LockOwner, mode: LockMode?,
                               range: LockRange) -> (granted: Bool, after: LockSegments?) {
        var after = current
        switch owner.style {
        case .posix:
            if let mode, others.contains(where: {
                $0.style == .posix && $0.segments.conflict(with: mode, start: range.start, end: range.end) != nil
            }) {
                return (false, nil)
            }
            after.apply(mode, start: range.start, end: range.end)
            return (true, after)
        case .flock:
            if current.segments.first?.mode == mode { return (true, nil) }
            // A conversion drops the old lock first, as Linux's flock does.
            after = LockSegments()
            guard let mode else { return (true, after) }
            if others.contains(where: { $0.style == .flock && ($0.segments.segments.first?.mode == .write || mode == .write) }) {
                return (false, after)
            }
            after.apply(mode, start: 0, end: Int64.max)
            return (true, after)
        }
    }

    /// This process's locks of `node` as rows. Caller holds mutex.
    private func myRows(_ node: InodeNumber) -> [Row] {
        (mine[node] ?? [:]).map { Row(writer: $0.key.writer, owner: $0.key.id, style: $0.key.style, pid: $0.value.pid, segments: $0.value) }
    }

    /// Notes `owner`'s ranges of `node` after a change. Caller holds mutex.
    private func record(_ node: InodeNumber, _ owner: LockOwner, _ segments: LockSegments, pid: Int32) {
        var s = segments
        s.pid = pid
        if s.isEmpty { mine[node]?[owner] = nil } else { mine[node, default: [:]][owner] = s }
        if mine[node]?.isEmpty == true { mine[node] = nil }
    }

    private var outOfReach: Bool { reachability?.current.online == false }

    /// Decides on this machine alone (cut off). Caller holds mutex.
    private func setLocally(_ node: InodeNumber, owner: LockOwner, mode: LockMode?, range: LockRange, pid: Int32) -> Bool {
        let rows = myRows(node)
        let current = rows.first { $0.key == owner }?.segments ?? LockSegments()
        let (granted, after) = Self.decide(others: rows.filter { $0.key != owner }, current: current, owner: owner,
                                           mode: mode, range: range)
        if let after { record(node, owner, after, pid: pid) }
        if !unsynced {
            log("the store's servers are out of reach: locks are decided on this machine alone until they answer")
        }
        unsynced = true
        return granted
    }

    public func set(_ node: InodeNumber, owner: LockOwner, mode: LockMode?, range: LockRange, pid: Int32) throws(StoreError) -> Bool {
        askersMutex.withLock { _ = askers.insert(Self.key(node, owner)) }
        let granted = try mutex.withLock { () throws(StoreError) -> Bool in
            let first = writers.insert(owner.writer).inserted
            if outOfReach { return setLocally(node, owner: owner, mode: mode, range: range, pid: pid) }
            do throws(StoreError) {
                if unsynced { try syncLocked() }
                var clashes: [InodeNumber] = []
                let (granted, after) = try connection.transaction { () throws(StoreError) -> (Bool, LockSegments?) in
                    let n = Int64(bitPattern: node)
                    clashes = try renew(owner.writer)
                    try lockNode(node)
                    let live = try rows(node)
                    let current = live.first { $0.key == owner }?.segments ?? LockSegments()
                    let (granted, after) = Self.decide(others: live.filter { $0.key != owner }, current: current,
                                                       owner: owner, mode: mode, range: range)
                    guard let after else { return (granted, nil) }
                    // Rows of writers whose lease ran out go now.
                    try connection.query("""
                        DELETE FROM ubiquityfs.locks WHERE node = $1 AND writer NOT IN
                            (SELECT writer FROM ubiquityfs.writers WHERE lease_until > \(Self.serverMillis))
                        """, [.int(n)])
                    try put(node, owner, after, pid: pid)
                    return (granted, after)
                }
                if let after { record(node, owner, after, pid: pid) }
                renewedNow(clashes)
                return granted
            } catch {
                // Cut off now: decided here, and put on the servers once they answer.
                if error.kind == .unavailable { return setLocally(node, owner: owner, mode: mode, range: range, pid: pid) }
                if first { writers.remove(owner.writer) }
                throw error
            }
        }
        startRenewing()
        return granted
    }

    /// Writes `owner`'s row of `node` (none when `segments` is empty). Caller holds mutex, in a
    /// transaction that locked the node's row.
    private func put(_ node: InodeNumber, _ owner: LockOwner, _ segments: LockSegments, pid: Int32) throws(StoreError) {
        let n = Int64(bitPattern: node)
        let style = Self.styleCode(owner)
        if segments.isEmpty {
            try connection.query("DELETE FROM ubiquityfs.locks WHERE node = $1 AND writer = $2 AND owner = $3 AND style = $4",
                                 [.int(n), .text(owner.writer), .int(Int64(bitPattern: owner.id)), .int(style)])
        } else {
            try connection.query("""
                INSERT INTO ubiquityfs.locks(node, writer, owner, style, pid, segments) VALUES($1, $2, $3, $4, $5, $6)
                ON CONFLICT (node, writer, owner, style) DO UPDATE SET pid = EXCLUDED.pid, segments = EXCLUDED.segments
                """, [.int(n), .text(owner.writer), .int(Int64(bitPattern: owner.id)), .int(style), .int(Int64(pid)),
                      .bytes(Self.encode(segments))])
        }
    }

    private static func styleCode(_ owner: LockOwner) -> Int64 { owner.style == .flock ? 1 : 0 }

    /// Takes `node`'s row of `lock_nodes` (made if missing) in the caller's transaction: the lock
    /// rows of a node change one transaction at a time. One statement makes and locks it (a
    /// separate SELECT … FOR UPDATE could find it deleted by `forget` in between).
    private func lockNode(_ node: InodeNumber) throws(StoreError) {
        try connection.query("""
            INSERT INTO ubiquityfs.lock_nodes(node) VALUES($1)
            ON CONFLICT (node) DO UPDATE SET node = EXCLUDED.node RETURNING node
            """, [.int(Int64(bitPattern: node))])
    }

    /// The servers answer again after locks changed here alone: this process's rows there become
    /// what it holds now. Caller holds mutex.
    private func syncLocked() throws(StoreError) {
        let clashes = try connection.transaction { () throws(StoreError) -> [InodeNumber] in
            var clashes: [InodeNumber] = []
            for w in writers.sorted() { clashes += try replaceRows(of: w) }
            return clashes
        }
        unsynced = false
        log("the store's servers answer: this machine's locks are held there again")
        renewedNow(clashes)
    }

    /// `writer`'s rows on the servers become what this process holds now, with a fresh lease
    /// (its lease may have run out, and others taken locks meanwhile: a lock both hold is
    /// returned for the log, and each keeps it until it lets go). Every node's row is taken
    /// first, in node order, as a change takes it before the rows. Caller holds mutex, in a
    /// transaction.
    private func replaceRows(of writer: String) throws(StoreError) -> [InodeNumber] {
        let held = try connection.query("SELECT DISTINCT node FROM ubiquityfs.locks WHERE writer = $1", [.text(writer)])
        var nodes = Set((0..<held.count).map { InodeNumber(bitPattern: held.int($0, 0)) })
        for (node, owners) in mine where owners.keys.contains(where: { $0.writer == writer }) { nodes.insert(node) }
        for node in nodes.sorted() { try lockNode(node) }
        try connection.query("DELETE FROM ubiquityfs.locks WHERE writer = $1", [.text(writer)])
        try connection.query("""
            INSERT INTO ubiquityfs.writers(writer, lease_until) VALUES($1, \(Self.serverMillis) + $2)
            ON CONFLICT (writer) DO UPDATE SET lease_until = EXCLUDED.lease_until
            """, [.text(writer), .int(Int64(leaseSeconds) * 1000)])
        var clashes: [InodeNumber] = []
        for (node, owners) in mine.sorted(by: { $0.key < $1.key }) {
            let others = try rows(node).filter { $0.writer != writer }
            for (owner, segments) in owners where owner.writer == writer {
                try put(node, owner, segments, pid: segments.pid)
                let clash = segments.segments.contains { seg in
                    !Self.decide(others: others, current: LockSegments(), owner: owner, mode: seg.mode,
                                 range: LockRange(start: seg.start, end: seg.end)).granted
                }
                if clash { clashes.append(node) }
            }
        }
        return clashes
    }

    /// Extends `writer`'s lease. One that ran out is not merely extended: others may have taken
    /// its locks meanwhile, so its rows are replaced by what this process holds now (returns the
    /// nodes where both hold one). Caller holds mutex, in a transaction.
    private func renew(_ writer: String) throws(StoreError) -> [InodeNumber] {
        let extended = try connection.query("""
            UPDATE ubiquityfs.writers SET lease_until = \(Self.serverMillis) + $2
            WHERE writer = $1 AND lease_until > \(Self.serverMillis)
            """, [.text(writer), .int(Int64(leaseSeconds) * 1000)])
        if extended.affected > 0 { return [] }
        return try replaceRows(of: writer)
    }

    /// The leases were just renewed. Caller holds mutex.
    private func renewedNow(_ clashes: [InodeNumber]) {
        renewed = monotonicNanoseconds()
        lapseLogged = false
        for node in Set(clashes).sorted() {
            log("inode \(node): a lock this machine holds is also held by another machine (each took it while they "
                + "could not see each other); what both write is kept as versions and conflict copies")
        }
    }

    public func test(_ node: InodeNumber, owner: LockOwner, mode: LockMode, range: LockRange) throws(StoreError) -> HeldLock? {
        try mutex.withLock { () throws(StoreError) -> HeldLock? in
            var live: [Row]
            if outOfReach || unsynced {
                live = myRows(node)
            } else {
                do throws(StoreError) { live = try rows(node) } catch {
                    guard error.kind == .unavailable else { throw error }
                    live = myRows(node)
                }
            }
            for row in live where row.key != owner && row.style == .posix {
                if let s = row.segments.conflict(with: mode, start: range.start, end: range.end) {
                    return HeldLock(mode: s.mode, range: LockRange(start: s.start, end: s.end),
                                    pid: row.writer == owner.writer ? row.pid : 0)
                }
            }
            return nil
        }
    }

    private static func key(_ node: InodeNumber, _ owner: LockOwner) -> String {
        "\(node) \(owner.writer) \(owner.id) \(owner.style == .flock ? 1 : 0)"
    }

    public func release(_ node: InodeNumber, owner: LockOwner) {
        guard askersMutex.withLock({ askers.remove(Self.key(node, owner)) != nil }) else { return }
        mutex.withLock {
            mine[node]?[owner] = nil
            if mine[node]?.isEmpty == true { mine[node] = nil }
            if outOfReach || unsynced {
                unsynced = true
                return
            }
            do throws(StoreError) { try put(node, owner, LockSegments(), pid: 0) } catch {
                // Given back when the servers answer (or by the lease's end).
                unsynced = true
            }
        }
    }

    public func forget(_ node: InodeNumber) {
        mutex.withLock {
            if outOfReach { return }   // its row stays, harmless, until a later forget
            _ = try? connection.query("""
                DELETE FROM ubiquityfs.lock_nodes WHERE node = $1
                    AND NOT EXISTS (SELECT 1 FROM ubiquityfs.locks WHERE node = $1)
                """, [.int(Int64(bitPattern: node))])
        }
    }

    /// One round of the lease thread. Caller holds mutex.
    private func renewAllLocked() {
        // Out of reach, a try would hold the mutex for the timeout, for nothing.
        if !outOfReach {
            do throws(StoreError) {
                if unsynced {
                    try syncLocked()
                } else {
                    let clashes = try connection.transaction { () throws(StoreError) -> [InodeNumber] in
                        var clashes: [InodeNumber] = []
                        for w in writers.sorted() { clashes += try renew(w) }
                        return clashes
                    }
                    renewedNow(clashes)
                }
                return
            } catch {}
        }
        // No renewal for a lease's length: the servers count this machine's locks for nothing
        // now, and another machine may take them. They are put back as they are once the
        // servers answer (`renew` finds the lease ran out).
        if renewed > 0, !lapseLogged, monotonicNanoseconds() &- renewed > UInt64(leaseSeconds) * 1_000_000_000 {
            lapseLogged = true
            log("the lease of this machine's locks ran out without a renewal (the servers did not answer for "
                + "\(leaseSeconds) s): other machines may take them until they answer")
        }
    }

    /// Renews the leases of this table's writers a few times per lease, from a thread that ends
    /// with the table.
    private func startRenewing() {
        let start: Bool = mutex.withLock {
            if renewing { return false }
            renewing = true
            return true
        }
        guard start else { return }
        let interval = Double(leaseSeconds) / 3
        let t = Thread { [weak self] in
            while true {
                Thread.sleep(forTimeInterval: interval)
                guard let self else { return }
                self.mutex.withLock { self.renewAllLocked() }
            }
        }
        t.name = "lock-leases"
        t.start()
    }
}
