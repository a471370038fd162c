// This machine's copies of a shared store's chunks: reads of a cached chunk are local file reads,
// as the embedded store's are, and the network is used once per chunk.
//
// Chunks never change once written, so a cached copy is never stale: there is nothing to
// invalidate, only space to manage. The cache keeps at most `limit` bytes, dropping the least
// recently used chunks first, except those pinned (`ubiquityfs pin`), which stay until evicted.
// Chunks this machine writes are kept too (a file just saved is likely read again here).
//
// Chunks written while the servers are out of reach wait here to be uploaded (the outbox): kept
// whatever the limit, synced to disk, uploaded before the queued batch that names them is sent,
// and kept in the outbox until it lands.
//
// Layout: `<folder>/blobs/XX/<id>` (the embedded store's blob layout, so reads use the same
// code), `<folder>/pinned` (one hex id per line), `<folder>/outbox/<id>` (an empty file per chunk
// waiting to be uploaded). A crash can leave the index short of a file or
// the pinned list short of a pin; the folder is scanned at start, so neither loses data.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Where a cache's chunks live: a blob store that can also hand out an id first and store a
/// chunk under it later (a chunk written while the servers are out of reach keeps its id).
protocol RemoteChunks: BlobStore {
    func newBlobID() throws(StoreError) -> BlobID
    /// Reserves ids ahead now, while the servers answer.
    func primeIDs() throws(StoreError)
    /// Stores `bytes` as blob `id`; storing the same id again is harmless.
    func put(_ id: BlobID, _ bytes: UnsafeRawBufferPointer) throws(StoreError)
    /// Whether blob `id` is there.
    func has(_ id: BlobID) throws(StoreError) -> Bool
}

public final class ChunkCache: BlobStore, LocalChunks, @unchecked Sendable {
    let remote: any RemoteChunks
    private let local: LocalBlobStore
    private let pinnedPath: String
    private let outboxPath: String
    /// Whether the servers answer, to write straight to the outbox while they do not.
    private let reachability: Reachability?
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
    private var pinnedFileSet: Set<InodeNumber> = []
    private let pinnedFilesPath: String
    /// Chunks in the outbox, with their sizes: to be uploaded before the batch naming them is
    /// sent, and kept here until it lands.
    private var outbox: [BlobID: Int64] = [:]
    /// When chunks of the outbox were last uploaded (monotonic nanoseconds).
    private var uploaded: [BlobID: UInt64] = [:]
    /// Chunks uploaded as they were written, in the last day, that no landed batch names yet
    /// (see `hold`).
    private var recent: [BlobID: UInt64] = [:]
    private var downloads: [BlobID: Download] = [:]
    /// Downloads the servers did not answer (when, in monotonic nanoseconds, and why): the
    /// kernel asks again at once for a read that failed, and that second ask fails at once
    /// (while the servers are still out of reach) rather than waiting out the timeout again.
    /// Other chunks are tried as usual.
    private var unanswered: [BlobID: (at: UInt64, error: StoreError)] = [:]
    static let unansweredWindow: UInt64 = 2_000_000_000
    private var prefetching = 0
    private static let prefetchLimit = 4

    init(remote: any RemoteChunks, directory: String, limit: Int64, reachability: Reachability? = nil,
         log: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) {
        self.remote = remote
        self.limit = max(limit, Int64(chunkSize))
        self.log = log
        self.reachability = reachability
        local = try LocalBlobStore(directory: directory, fdCacheCapacity: 256)
        pinnedPath = directory + "/pinned"
        pinnedFilesPath = directory + "/pinned-files"
        outboxPath = directory + "/outbox"
        try makeDirectories(outboxPath, mode: 0o700)
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
        if let text = try? String(contentsOfFile: pinnedFilesPath, encoding: .utf8) {
            pinnedFileSet = Set(text.split(separator: "\n").compactMap { UInt64($0) })
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: outboxPath)) ?? [] {
            guard let id = UInt64(name, radix: 16) else { continue }
            guard let e = entries[id] else {
                log("chunk \(name) waited to be uploaded but its local copy is gone; a queued change that names it fails")
                continue
            }
            outbox[id] = e.size
        }
        condition.lock()
        evictLocked()
        condition.unlock()
    }

    /// Bytes and chunks held now (for `status`); chunks waiting to be uploaded are among them.
    public var usage: (bytes: Int64, chunks: Int, pinned: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (total, entries.count, pinned.count)
    }

    // MARK: BlobStore

    public func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef {
        guard bytes.count <= chunkSize else {
            throw StoreError(errno: EINVAL, "blob of \(bytes.count) bytes is larger than a chunk (\(chunkSize))")
        }
        let id = try remote.newBlobID()
        let ref = ChunkRef(blob: id, length: UInt32(bytes.count), checksum: contentChecksum(bytes))
        if reachability?.current.online != false {
            do throws(StoreError) {
                try remote.put(id, bytes)
                // Keeping a copy is a bonus: a failure here costs a download later, nothing more.
                if (try? local.put(id, bytes)) != nil {
                    added(id, size: Int64(bytes.count))
                    condition.lock()
                    recent[id] = monotonicNanoseconds()
                    if recent.count > 200_000 { recent = recent.filter { monotonicNanoseconds() &- $0.value < Self.writtenWindow } }
                    condition.unlock()
                }
                return ref
            } catch {
                guard error.kind == .unavailable else { throw error }
            }
        }
        // Out of reach: the chunk waits here, on disk before the batch naming it is queued.
        try local.put(id, bytes)
        try syncFile(local.path(of: id))
        try fsyncDirectory((local.path(of: id) as NSString).deletingLastPathComponent)
        try mark([(id, Int64(bytes.count))])
        added(id, size: Int64(bytes.count))
        return ref
    }

    // MARK: The outbox

    /// Marks these local chunks (with their sizes) as to be uploaded before a batch naming them
    /// commits.
    private func mark(_ chunks: [(BlobID, Int64)]) throws(StoreError) {
        var made = false
        for (id, size) in chunks {
            condition.lock()
            let known = outbox[id] != nil
            condition.unlock()
            guard !known else { continue }
            let marker = outboxPath + "/" + String(id, radix: 16)
            let fd = open(marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
            if fd < 0 { throw StoreError(errno: errno, "cannot record chunk \(String(id, radix: 16)) in \(outboxPath)") }
            close(fd)
            made = true
            condition.lock()
            outbox[id] = size
            condition.unlock()
        }
        if made { try fsyncDirectory(outboxPath) }
    }

    /// A batch naming `chunks` is queued: those this machine wrote that no landed batch names
    /// yet (and it still has) go in the outbox too, to be uploaded again right before the batch is sent (a chunk no version names
    /// is the collection's once it is old, and the batch may wait long).
    func hold(_ chunks: [BlobID]) throws(StoreError) {
        condition.lock()
        let now = monotonicNanoseconds()
        let again = chunks.compactMap { id -> (BlobID, Int64)? in
            guard let t = recent[id], now &- t < Self.writtenWindow, let e = entries[id] else { return nil }
            return (id, e.size)
        }
        for (id, _) in again { uploaded[id] = nil }
        condition.unlock()
        try mark(again)
    }

    /// A batch naming `ids` landed: they are no one's garbage now.
    func named(_ ids: [BlobID]) {
        condition.lock()
        if !recent.isEmpty { for id in ids { recent[id] = nil } }
        condition.unlock()
    }

    /// The chunks in the outbox.
    var outboxIDs: [BlobID] {
        condition.lock()
        defer { condition.unlock() }
        return Array(outbox.keys)
    }

    /// Chunks waiting to be uploaded, and their bytes.
    public var waiting: (chunks: Int, bytes: Int64) {
        condition.lock()
        defer { condition.unlock() }
        return (outbox.count, outbox.values.reduce(0, +))
    }

    /// Uploads those of `ids` (all of the outbox when nil) that are in the outbox and were not
    /// uploaded in the last minutes; throws on the first that fails. They stay in the outbox
    /// (kept here, uploaded again if they wait long) until `landed`.
    func upload(_ ids: [BlobID]? = nil) throws(StoreError) {
        condition.lock()
        let now = monotonicNanoseconds()
        let due = (ids ?? Array(outbox.keys)).filter { id in
            outbox[id] != nil && (uploaded[id].map { now &- $0 >= Self.recentNanoseconds / 2 } ?? true)
        }.sorted()
        condition.unlock()
        guard !due.isEmpty else { return }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        for id in due {
            let n: Int
            do throws(StoreError) { n = try local.read(id, at: 0, into: buffer) } catch {
                guard error.kind == .notFound else { throw error }
                // Gone from this disk (removed by hand?): nothing to upload, ever. The batch
                // naming it reads EIO there; the queue must not stop on it.
                log("chunk \(String(id, radix: 16)) waited to be uploaded but its local copy is gone")
                landed([id])
                continue
            }
            try remote.put(id, UnsafeRawBufferPointer(rebasing: buffer[..<n]))
            condition.lock()
            uploaded[id] = monotonicNanoseconds()
            condition.unlock()
        }
        log("uploaded \(due.count) chunk\(due.count == 1 ? "" : "s") written while the servers were out of reach")
    }

    /// Before a batch queued while cut off is sent: the chunks it names that are not this
    /// machine's own new ones must still be on the servers, and another machine may have freed
    /// them meanwhile (with a file it deleted for good, or versions its retention pruned). Those
    /// missing are uploaded again from this machine's copies; returns those it has no copy of.
    func secure(_ ids: [BlobID]) throws(StoreError) -> [BlobID] {
        condition.lock()
        let others = Set(ids).filter { $0 != 0 && outbox[$0] == nil }.sorted()
        condition.unlock()
        var lost: [BlobID] = []
        var restored = 0
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        for id in others where try !remote.has(id) {
            let n: Int
            do throws(StoreError) { n = try local.read(id, at: 0, into: buffer) } catch {
                guard error.kind == .notFound else { throw error }
                lost.append(id)
                continue
            }
            try remote.put(id, UnsafeRawBufferPointer(rebasing: buffer[..<n]))
            restored += 1
        }
        if restored > 0 {
            log("uploaded again \(restored) chunk\(restored == 1 ? "" : "s") that changes made out of reach name and the store no longer had")
        }
        return lost
    }

    /// A batch naming `ids` landed and no queued batch names them: they leave the outbox, and
    /// are cached as any other chunk.
    func landed(_ ids: [BlobID]) {
        condition.lock()
        let gone = ids.filter { outbox[$0] != nil }
        for id in gone {
            outbox[id] = nil
            uploaded[id] = nil
        }
        condition.unlock()
        for id in gone { _ = unlink(outboxPath + "/" + String(id, radix: 16)) }
    }

    /// How long a chunk counts as just uploaded.
    private static let recentNanoseconds: UInt64 = 10 * 60 * 1_000_000_000
    /// How long this machine remembers writing a chunk (a publish that took long, then found
    /// the servers gone, still has its early chunks uploaded again before its batch is sent).
    private static let writtenWindow: UInt64 = 24 * 3600 * 1_000_000_000

    private func syncFile(_ path: String) throws(StoreError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw StoreError(errno: errno, "cannot open \(path) to sync it") }
        defer { close(fd) }
        if fsync(fd) != 0 { throw StoreError(errno: errno, "cannot sync \(path)") }
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
        condition.lock()
        let waiting = outbox.removeValue(forKey: blob) != nil
        condition.unlock()
        if waiting {
            // Never uploaded: the local copy is the only one.
            _ = unlink(outboxPath + "/" + String(blob, radix: 16))
        } else {
            try remote.delete(blob)
        }
        drop([blob], evenWaiting: true)
    }

    /// The store's copy is the one that counts (this machine's, for one not uploaded yet).
    public func verify(_ ref: ChunkRef) -> Bool {
        condition.lock()
        let waiting = outbox[ref.blob] != nil
        condition.unlock()
        return waiting ? local.verify(ref) : remote.verify(ref)
    }

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

    public func release(_ blobs: [BlobID]) {
        condition.lock()
        pinned.subtract(blobs)
        condition.unlock()
        try? savePinned()
    }

    public var pinnedFiles: Set<InodeNumber> {
        condition.lock()
        defer { condition.unlock() }
        return pinnedFileSet
    }

    public func updatePinnedFiles(_ change: (inout Set<InodeNumber>) -> Void) throws(StoreError) {
        condition.lock()
        let before = pinnedFileSet
        change(&pinnedFileSet)
        let files = pinnedFileSet
        condition.unlock()
        if files != before { try writeList(files.sorted().map { String($0) }, to: pinnedFilesPath, what: "the pinned files") }
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
        if let last = unanswered[blob] {
            // Not once anything heard from the servers since.
            if reachability?.current.online == false, monotonicNanoseconds() &- last.at < Self.unansweredWindow {
                condition.unlock()
                throw last.error
            }
            unanswered[blob] = nil
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
        if let failure, failure.kind == .unavailable {
            if unanswered.count > 1024 { unanswered = [:] }
            unanswered[blob] = (monotonicNanoseconds(), failure)
        }
        download.error = failure
        download.done = true
        downloads[blob] = nil
        condition.broadcast()
        condition.unlock()
        if let failure { throw failure }
    }

    /// Removes local copies (and pins) of `blobs`, except those waiting to be uploaded; one
    /// being downloaded is left to finish.
    private func drop(_ blobs: [BlobID], evenWaiting: Bool = false) {
        for blob in blobs where blob != 0 {
            condition.lock()
            if !evenWaiting && outbox[blob] != nil {
                condition.unlock()
                continue
            }
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
        let victims = entries.filter { !pinned.contains($0.key) && outbox[$0.key] == nil && $0.key != spared }.sorted { $0.value.used < $1.value.used }
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
        let lines = pinned.map { String($0, radix: 16) }.sorted()
        condition.unlock()
        try writeList(lines, to: pinnedPath, what: "the pinned chunks")
    }

    private func writeList(_ lines: [String], to path: String, what: String) throws(StoreError) {
        // A file of its own per call: two saves at once must not write one temporary file.
        let temp = path + ".tmp-" + String(UInt64.random(in: 1...UInt64.max), radix: 16)
        guard FileManager.default.createFile(atPath: temp, contents: Data(lines.joined(separator: "\n").utf8),
                                             attributes: [.posixPermissions: 0o600]),
              rename(temp, path) == 0 else {
            _ = unlink(temp)
            throw StoreError(errno: EIO, "cannot record \(what) in \(path)")
        }
    }
}
