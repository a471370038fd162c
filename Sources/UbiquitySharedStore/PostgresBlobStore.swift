// Content chunks in PostgreSQL itself (`ubiquityfs.blobs`, one `bytea` row per chunk), for small
// deployments with one server. Each row records when it was written, for garbage collection's
// grace period.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// A few connections for calls that may run on many threads at once (chunk reads).
final class PGPool: @unchecked Sendable {
    private let condition = NSCondition()
    private var idle: [PGConnection]   // guarded by condition
    private var made: Int              // guarded by condition
    private let limit: Int
    let target: PGTarget

    init(_ target: PGTarget, limit: Int) {
        self.target = target
        self.limit = max(1, limit)
        idle = []
        made = 0
    }

    /// Runs `body` on a connection of the pool. A connection that broke while it sat idle (the
    /// link was down a while ago, the server restarted) fails its next call though the server
    /// answers again: that one failure is tried once more on a new connection. `body` must be
    /// safe to run twice. A failure that took long (no answer) is not tried again: the caller
    /// waits one timeout, not two.
    func with<R>(_ body: (PGConnection) throws(StoreError) -> R) throws(StoreError) -> R {
        let start = monotonicNanoseconds()
        do {
            return try once(body)
        } catch where error.kind == .unavailable
                        && Double(monotonicNanoseconds() &- start) < target.timeout * 250_000_000 {
            return try once(body)
        }
    }

    private func once<R>(_ body: (PGConnection) throws(StoreError) -> R) throws(StoreError) -> R {
        condition.lock()
        // Every connection busy for the whole timeout: the server is not answering them.
        let deadline = Date().addingTimeInterval(target.timeout)
        while idle.isEmpty && made >= limit {
            if !condition.wait(until: deadline) && idle.isEmpty && made >= limit {
                condition.unlock()
                throw StoreError(.unavailable, "PostgreSQL at \(redacted(target.url)): no connection of the pool came free within "
                                 + "\(target.timeout) s")
            }
        }
        let c: PGConnection
        if let last = idle.popLast() {
            c = last
        } else {
            made += 1
            c = PGConnection(target)
        }
        condition.unlock()
        defer {
            condition.lock()
            idle.append(c)
            condition.signal()
            condition.unlock()
        }
        return try body(c)
    }
}

/// Reserves `count` ids of counter `key` on connection `c`.
func reserveCounter(_ c: PGConnection, _ key: String, _ count: Int) throws(StoreError) -> ClosedRange<Int64> {
    let r = try c.query("UPDATE ubiquityfs.store SET value = value + $2 WHERE key = $1 RETURNING value",
                        [.text(key), .int(Int64(count))])
    guard r.count == 1 else { throw StoreError(.corrupt, "the store's counter \(key) is missing") }
    let last = r.int(0, 0)
    return (last - Int64(count) + 1)...last
}

public final class PostgresBlobStore: RemoteChunks, @unchecked Sendable {
    private let pool: PGPool
    private let ids: IDReserve
    private let reachability: Reachability?

    public convenience init(url: String, timeout: Double = 10, connections: Int = 4) throws(StoreError) {
        try self.init(url: url, timeout: timeout, connections: connections, reachability: nil)
    }

    /// `idsPath`: where the chunk ids reserved ahead are kept (nil: memory only).
    init(url: String, timeout: Double, connections: Int, reachability: Reachability?, idsPath: String? = nil) throws(StoreError) {
        try checkPostgresURL(url)
        let pool = PGPool(PGTarget(url: url, timeout: timeout, applicationName: "ubiquityfs chunks", reachability: reachability),
                          limit: connections)
        self.pool = pool
        self.reachability = reachability
        ids = try IDReserve(path: idsPath) { (count) throws(StoreError) in
            try pool.with { (c) throws(StoreError) in try reserveCounter(c, "max_blob", count) }
        }
    }

    public func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef {
        let id = try newBlobID()
        try put(id, bytes)
        return ChunkRef(blob: id, length: UInt32(bytes.count), checksum: contentChecksum(bytes))
    }

    func newBlobID() throws(StoreError) -> BlobID { try ids.takeBlobID(online: reachability?.current.online != false) }
    func primeIDs() throws(StoreError) { try ids.prime() }

    func put(_ id: BlobID, _ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        guard bytes.count <= chunkSize else {
            throw StoreError(errno: EINVAL, "blob of \(bytes.count) bytes is larger than a chunk (\(chunkSize))")
        }
        try pool.with { (c) throws(StoreError) in
            // Stamped with the server's clock, which every machine's collection shares. Tried
            // twice at most (see `with`): a second put only stamps it again (a chunk put again
            // before the batch naming it commits must be young to the collection).
            _ = try c.query("""
                INSERT INTO ubiquityfs.blobs(id, written, data)
                VALUES($1, (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint, $2)
                ON CONFLICT (id) DO UPDATE SET written = EXCLUDED.written
                """, [.int(Int64(bitPattern: id)), .buffer(bytes)])
        }
    }

    func has(_ id: BlobID) throws(StoreError) -> Bool {
        try pool.with { (c) throws(StoreError) -> Bool in
            try c.query("SELECT 1 FROM ubiquityfs.blobs WHERE id = $1", [.int(Int64(bitPattern: id))]).count == 1
        }
    }

    public func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        if blob == 0 || buffer.isEmpty { return 0 }   // the hole: an empty blob
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "read chunk \(String(blob, radix: 16)): negative offset \(offset)") }
        return try pool.with { (c) throws(StoreError) -> Int in
            // substring counts from 1.
            let r = try c.query("SELECT substring(data FROM $2::integer FOR $3::integer) FROM ubiquityfs.blobs WHERE id = $1",
                                [.int(Int64(bitPattern: blob)), .int(Int64(offset) + 1), .int(Int64(buffer.count))])
            guard r.count == 1 else { throw StoreError(.notFound, "chunk \(String(blob, radix: 16)) is not in the store") }
            return try r.withBytes(0, 0) { (bytes) throws(StoreError) -> Int in
                let n = min(bytes.count, buffer.count)
                if n > 0 { buffer.baseAddress!.copyMemory(from: bytes.baseAddress!, byteCount: n) }
                return n
            }
        }
    }

    /// Every write was committed by the server before it returned.
    public func syncAll() throws(StoreError) {}

    public func delete(_ blob: BlobID) throws(StoreError) {
        try pool.with { (c) throws(StoreError) in
            _ = try c.query("DELETE FROM ubiquityfs.blobs WHERE id = $1", [.int(Int64(bitPattern: blob))])
        }
    }

    public func verify(_ ref: ChunkRef) -> Bool {
        guard !ref.isHole else { return true }
        let result: Bool? = try? pool.with { (c) throws(StoreError) -> Bool in
            let r = try c.query("SELECT data FROM ubiquityfs.blobs WHERE id = $1", [.int(Int64(bitPattern: ref.blob))])
            guard r.count == 1 else { return false }
            return try r.withBytes(0, 0) { bytes in bytes.count == Int(ref.length) && contentChecksum(bytes) == ref.checksum }
        }
        return result ?? false
    }

    public func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID] {
        try pool.with { (c) throws(StoreError) -> [BlobID] in
            guard let cutoff else {
                let r = try c.query("SELECT id FROM ubiquityfs.blobs")
                return (0..<r.count).map { r.uint($0, 0) }
            }
            // `written` is the server's clock: the cutoff goes as an age, counted back from the
            // server's now, so a machine whose clock runs ahead never takes a young chunk for an old one.
            let r = try c.query("""
                SELECT id FROM ubiquityfs.blobs
                WHERE written < (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint - $1
                """, [.int(nowNanoseconds() - cutoff)])
            return (0..<r.count).map { r.uint($0, 0) }
        }
    }
}

func nowNanoseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}
