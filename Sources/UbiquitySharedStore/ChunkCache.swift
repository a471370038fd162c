// This machine's copies of a shared store's chunks: reads of a cached chunk are local file reads,
// as the embedded store's are, and the network is used once per chunk.
//
// Chunks never change once written, so a cached copy is never stale: there is nothing to
// invalidate, only space to manage. The cache keeps at most `limit` bytes, dropping the least
// recently used chunks first, except those pinned (`ubiquityfs pin`), which stay until evicted.
// Chunks this machine writes are kept too (a file just saved is likely read again here).
//
// Layout: `<folder>/blobs/XX/<id>` (the embedded store's blob layout, so reads use the same
// code), `<folder>/pinned` (one hex id per line). A crash can leave the index short of a file or
// the pinned list short of a pin; the folder is scanned at start, so neither loses data.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

public final class ChunkCache: BlobStore, LocalChunks, @unchecked Sendable {
    let remote: any BlobStore
    private let local: LocalBlobStore
    private let pinnedPath: String
    /// The most bytes kept (pinned chunks may exceed it).
    public let limit: Int64
    private let log: @Sendable (String) -> Void

    private struct Entry {
        var size: Int64
        var used: UInt64
    }

    /// One download in flight, which other readers of the chunk wait for.
    private final class Download {
        var done = false
        var error: StoreError?
    }

    // `condition` guards everything below; downloads and file I/O run without it.
    private let condition = NSCondition()
    private var entries: [BlobID: Entry] = [:]
    private var total: Int64 = 0
    private var tick: UInt64 = 0
    private var pinned: Set<BlobID> = []
    private var downloads: [BlobID: Download] = [:]
    private var prefetching = 0
    private static let prefetchLimit = 4

    public init(remote: any BlobStore, directory: String, limit: Int64,
                log: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) {
        self.remote = remote
        self.limit = max(limit, Int64(chunkSize))
        self.log = log
        local = try LocalBlobStore(directory: directory, fdCacheCapacity: 256)
        pinnedPath = directory + "/pinned"
        // Oldest first by modification time, so the first evictions take the oldest copies.
        var found: [(BlobID, Int64, Int64)] = []
        for id in try local.allBlobs() {
            var st = stat()
            guard lstat(local.path(of: id), &st) == 0 else { continue }
            found.append((id, Int64(st.st_size), Int64(st.st_mtim.tv_sec)))
        }
        for (id, size, _) in found.sorted(by: { $0.2 < $1.2 }) {
            tick += 1
            entries[id] = Entry(size: size, used: tick)
            total += size
        }
        if let text = try? String(contentsOfFile: pinnedPath, encoding: .utf8) {
            pinned = Set(text.split(separator: "\n").compactMap { UInt64($0, radix: 16) })
        }
        condition.lock()
        evictLocked()
        condition.unlock()
    }

    /// Bytes and chunks held now (for `status`).
    public var usage: (bytes: Int64, chunks: Int, pinned: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (total, entries.count, pinned.count)
    }

    // MARK: BlobStore

    public func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef {
        let ref = try remote.write(bytes, durable: durable)
        // Keeping a copy is a bonus: a failure here costs a download later, nothing more.
        if (try? local.put(ref.blob, bytes)) != nil { added(ref.blob, size: Int64(bytes.count)) }
        return ref
    }

    public func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        if blob == 0 || buffer.isEmpty { return 0 }
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "read chunk \(String(blob, radix: 16)): negative offset \(offset)") }
        for _ in 0..<3 {
            if touch(blob) {
                do {
                    return try local.read(blob, at: offset, into: buffer)
                } catch {
                    // Evicted between the look and the read (or the file went): fetch it again.
                    guard error.kind == .notFound else { throw error }
                    forget(blob)
                }
            }
            try fetch(blob, expecting: nil)
        }
        throw StoreError(errno: EIO, "chunk \(String(blob, radix: 16)) keeps disappearing from the local cache")
    }

    public func syncAll() throws(StoreError) { try remote.syncAll() }

    public func delete(_ blob: BlobID) throws(StoreError) {
        try remote.delete(blob)
        drop([blob])
    }

    /// The store's copy is the one that counts.
    public func verify(_ ref: ChunkRef) -> Bool { remote.verify(ref) }

    public func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID] {
        try remote.allBlobs(writtenBefore: cutoff)
    }

    // MARK: LocalChunks

    public func isLocal(_ blob: BlobID) -> Bool {
        if blob == 0 { return true }
        condition.lock()
        defer { condition.unlock() }
        return entries[blob] != nil
    }

    public func fetch(_ chunk: ChunkRef) throws(StoreError) {
        if chunk.isHole || touch(chunk.blob) { return }
        try fetch(chunk.blob, expecting: chunk)
    }

    public func prefetch(_ chunks: [ChunkRef]) {
        for chunk in chunks where !chunk.isHole {
            let blob = chunk.blob
            condition.lock()
            let start = entries[blob] == nil && downloads[blob] == nil && prefetching < Self.prefetchLimit
            if start { prefetching += 1 }
            condition.unlock()
            guard start else { continue }
            DispatchQueue.global(qos: .utility).async { [self] in
                do { try fetch(blob, expecting: chunk) } catch {
                    log("read-ahead of chunk \(String(blob, radix: 16)) failed: \(error)")
                }
                condition.lock()
                prefetching -= 1
                condition.unlock()
            }
        }
    }

    public func keep(_ chunks: [ChunkRef]) throws(StoreError) {
        // Pinned first, so that fetching the others cannot evict these.
        condition.lock()
        pinned.formUnion(chunks.filter { !$0.isHole }.map(\.blob))
        condition.unlock()
        try savePinned()
        for chunk in chunks { try fetch(chunk) }
    }

    public func evict(_ blobs: [BlobID]) {
        drop(blobs)
        try? savePinned()
    }

    // MARK: Internals

    /// Marks `blob` used; false if it is not cached.
    private func touch(_ blob: BlobID) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard entries[blob] != nil else { return false }
        tick += 1
        entries[blob]!.used = tick
        return true
    }

    private func forget(_ blob: BlobID) {
        condition.lock()
        if let e = entries.removeValue(forKey: blob) { total -= e.size }
        condition.unlock()
    }

    private func added(_ blob: BlobID, size: Int64) {
        condition.lock()
        if let old = entries[blob] { total -= old.size }
        total += size
        tick += 1
        entries[blob] = Entry(size: size, used: tick)
        // Never the chunk just added: its reader is about to read it.
        evictLocked(sparing: blob)
        condition.unlock()
    }

    /// Downloads `blob` whole, or waits for the download another thread started; with
    /// `expecting`, a download that does not match its length and checksum is not kept.
    private func fetch(_ blob: BlobID, expecting: ChunkRef?) throws(StoreError) {
        condition.lock()
        if entries[blob] != nil {
            condition.unlock()
            return
        }
        if let running = downloads[blob] {
            while !running.done { condition.wait() }
            condition.unlock()
            if let error = running.error { throw error }
            return
        }
        let download = Download()
        downloads[blob] = download
        condition.unlock()
        var failure: StoreError?
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        do throws(StoreError) {
            // One request: a blob store's read is short only at the blob's end.
            var got = 0
            while got < chunkSize {
                let n = try remote.read(blob, at: got, into: UnsafeMutableRawBufferPointer(rebasing: buffer[got...]))
                got += n
                if n < chunkSize - (got - n) { break }
            }
            let bytes = UnsafeRawBufferPointer(rebasing: buffer[..<got])
            if let expecting, got != Int(expecting.length) || contentChecksum(bytes) != expecting.checksum {
                throw StoreError(.corrupt, "chunk \(String(blob, radix: 16)) as downloaded does not match its checksum "
                                 + "(\(got) bytes, \(expecting.length) expected)")
            }
            try local.put(blob, bytes)
            added(blob, size: Int64(got))
        } catch {
            failure = error
        }
        condition.lock()
        download.error = failure
        download.done = true
        downloads[blob] = nil
        condition.broadcast()
        condition.unlock()
        if let failure { throw failure }
    }

    /// Removes local copies (and pins) of `blobs`; one being downloaded is left to finish.
    private func drop(_ blobs: [BlobID]) {
        for blob in blobs where blob != 0 {
            condition.lock()
            pinned.remove(blob)
            let e = entries.removeValue(forKey: blob)
            if let e { total -= e.size }
            condition.unlock()
            if e != nil { try? local.delete(blob) }
        }
    }

    /// Drops least recently used unpinned chunks until the cache is within its limit, to 90% of
    /// it so that the next few downloads do not each evict. Call with `condition` held.
    private func evictLocked(sparing spared: BlobID = 0) {
        guard total > limit else { return }
        let target = limit / 10 * 9
        let victims = entries.filter { !pinned.contains($0.key) && $0.key != spared }.sorted { $0.value.used < $1.value.used }
        for (blob, e) in victims {
            if total <= target { break }
            entries[blob] = nil
            total -= e.size
            // Unlinking under the lock is one quick call per victim; a reader holding the file's
            // fd finishes its read, a later one fetches the chunk again.
            try? local.delete(blob)
        }
    }

    private func savePinned() throws(StoreError) {
        condition.lock()
        let text = pinned.map { String($0, radix: 16) }.sorted().joined(separator: "\n")
        condition.unlock()
        // A file of its own per call: two saves at once must not write one temporary file.
        let temp = pinnedPath + ".tmp-" + String(UInt64.random(in: 1...UInt64.max), radix: 16)
        guard FileManager.default.createFile(atPath: temp, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600]),
              rename(temp, pinnedPath) == 0 else {
            throw StoreError(errno: EIO, "cannot record the pinned chunks in \(pinnedPath)")
        }
    }
}
