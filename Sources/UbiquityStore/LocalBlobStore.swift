// Content blobs as files: `<directory>/blobs/XX/<16 hex digits>`, XX = the id's low byte.
//
// A blob is written under a temporary name in `blobs/.tmp/` and renamed into place (without
// replacing: an id collision just draws another id), so a blob file is never half-present
// under its final name. Durable writes fdatasync the file before the rename and fsync the XX
// folder after it; non-durable writes are made durable later, by `syncAll()` (one syncfs of the
// whole filesystem) or by `syncWritten()`: an fdatasync of each chunk this object wrote since
// its last sync and an fsync of their XX folders. syncfs writes back every dirty page of the
// disk (other files' too), so an fsync of a small change costs what that change costs; past
// `unsyncedLimit` chunks, one syncfs is cheaper than as many journal commits.
//
// Ids drawn one after another share their XX folder (`folderCursor`, 64 to a folder, then the
// next), so a sync of many fresh chunks fsyncs one or two folders, not one per chunk: an fsync
// after fifty `echo line >> f` made fifty fdatasyncs and 43 folder fsyncs.
//
// Reads go through a bounded LRU cache of read-only fds. The cache lock guards only the map; the
// pread runs outside it on a reference-counted `BlobFile` that closes its fd when the last user
// (the cache or a reader in flight) lets go — so evicting an fd another thread is reading from
// is harmless.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A bounded LRU map of blob id → open fd. Not thread-safe: use under a lock.
struct FDCache {
    private struct Entry {
        var handle: BlobFile
        var lastUse: UInt64
    }
    let capacity: Int
    private var entries: [BlobID: Entry] = [:]
    private var clock: UInt64 = 0

    init(capacity: Int) { self.capacity = max(1, capacity) }

    var count: Int { entries.count }

    mutating func get(_ id: BlobID) -> BlobFile? {
        guard entries[id] != nil else { return nil }
        clock += 1
        entries[id]!.lastUse = clock
        return entries[id]!.handle
    }

    /// Inserts `handle` unless `id` is already cached; returns the cached one, and the entry
    /// evicted to make room (the least recently used; O(capacity), only on a miss, which costs an
    /// open() anyway) so the caller can release it outside its lock.
    mutating func insert(_ id: BlobID, _ handle: BlobFile) -> (handle: BlobFile, evicted: BlobFile?) {
        if let existing = get(id) { return (existing, nil) }
        var evicted: BlobFile?
        if entries.count >= capacity,
           let victim = entries.min(by: { $0.value.lastUse < $1.value.lastUse })?.key {
            evicted = entries.removeValue(forKey: victim)?.handle
        }
        clock += 1
        entries[id] = Entry(handle: handle, lastUse: clock)
        return (handle, evicted)
    }

    /// Removes `id`; returns its handle so the caller can release it outside its lock.
    mutating func remove(_ id: BlobID) -> BlobFile? { entries.removeValue(forKey: id)?.handle }
}

public final class LocalBlobStore: BlobStore, ChunkAdopting, BlobFiles, @unchecked Sendable {
    // `cacheMutex` guards `cache` (the map of open read fds) and nothing else; it is never held
    // across a system call (evicted fds are released, and so maybe closed, after unlocking).
    private let cacheMutex = StoreMutex()
    private var cache: FDCache

    /// `<directory>/blobs`.
    public let blobsPath: String
    private let tempPath: String
    /// The blobs folder, open for syncfs.
    private let blobsFD: Int32
    private let storeLock: StoreLock?
    /// The embedded store's space reserve: while it is in use, no new chunk is written.
    private let reserve: SpaceReserve?
    // `syncMutex` guards `unsynced` and `unsyncedOverflow`: the chunks written without a sync
    // since the last `syncAll` or `syncWritten` (or, past the limit, only that there were many),
    // and `folderCursor`. Never held across a system call.
    private let syncMutex = StoreMutex()
    private var unsynced: Set<BlobID> = []
    private var unsyncedOverflow = false
    /// Counts ids drawn; `folderCursor >> 6` is the XX folder of the next one (64 per folder).
    private var folderCursor = UInt64.random(in: 0...UInt64.max)
    /// More unsynced chunks than this are made durable by one syncfs.
    static let unsyncedLimit = 64

    /// Opens (creating if missing) `<directory>/blobs`. `fdCacheCapacity`: open read fds kept.
    public convenience init(directory: String, fdCacheCapacity: Int = 256) throws(StoreError) {
        try self.init(directory: directory, fdCacheCapacity: fdCacheCapacity, storeLock: nil)
    }

    init(directory: String, fdCacheCapacity: Int, storeLock: StoreLock?, reserve: SpaceReserve? = nil) throws(StoreError) {
        let blobsPath = directory + "/blobs"
        let tempPath = blobsPath + "/.tmp"
        try makeDirectories(directory)
        var created = try makeDirectory(blobsPath)
        for low in 0..<256 {
            if try makeDirectory(blobsPath + "/" + Self.hex2(UInt8(low))) { created = true }
        }
        try makeDirectory(tempPath)
        // Temporary files left by a crash are garbage.
        if let names = try? FileManager.default.contentsOfDirectory(atPath: tempPath) {
            // Only old ones: a young one may be another daemon's blob being written right now.
            let cutoff = Int64(time(nil)) - 600
            for name in names {
                var st = stat()
                guard lstat(tempPath + "/" + name, &st) == 0, Int64(st.st_mtim.tv_sec) < cutoff else { continue }
                _ = retryEINTR { unlink(tempPath + "/" + name) }
            }
        }
        if created {
            try fsyncDirectory(blobsPath)
            try fsyncDirectory(directory)
        }
        let fd = retryEINTR { open(blobsPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
        if fd < 0 { throw systemError("open", blobsPath, errno) }
        self.blobsPath = blobsPath
        self.tempPath = tempPath
        self.blobsFD = fd
        self.cache = FDCache(capacity: fdCacheCapacity)
        self.storeLock = storeLock
        self.reserve = reserve
    }

    deinit { close(blobsFD) }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    private static func hex2(_ byte: UInt8) -> String {
        String(decoding: [hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 15)]], as: UTF8.self)
    }

    private static func hex16(_ value: UInt64) -> String {
        var out = [UInt8](repeating: 0, count: 16)
        for i in 0..<16 { out[15 - i] = hexDigits[Int((value >> (UInt64(i) * 4)) & 15)] }
        return String(decoding: out, as: UTF8.self)
    }

    /// The file of blob `id`.
    public func path(of id: BlobID) -> String {
        blobsPath + "/" + Self.hex2(UInt8(truncatingIfNeeded: id)) + "/" + Self.hex16(id)
    }

    private func folder(of id: BlobID) -> String {
        blobsPath + "/" + Self.hex2(UInt8(truncatingIfNeeded: id))
    }

    // MARK: BlobStore

    public func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef {
        guard bytes.count <= chunkSize else {
            throw StoreError(errno: EINVAL, "blob of \(bytes.count) bytes is larger than a chunk (\(chunkSize))")
        }
        try reserve?.checkRoom(for: "write a chunk in \(blobsPath)")
        let checksum = contentChecksum(bytes)
        var generator = SystemRandomNumberGenerator()
        while true {
            let id = nextID(&generator)
            let temp = tempPath + "/" + Self.hex16(id)
            let fd = retryEINTR { open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
            if fd < 0 {
                if errno == EEXIST { continue }
                throw systemError("create", temp, errno)
            }
            do throws(StoreError) {
                try pwriteFully(fd, bytes, at: 0, path: temp)
                if durable { try fdatasyncChecked(fd, path: temp) }
            } catch {
                close(fd)
                _ = retryEINTR { unlink(temp) }
                throw error
            }
            // close() is never retried: on Linux the fd is gone even when it reports EINTR.
            if close(fd) != 0 && errno != EINTR {
                let code = errno
                _ = retryEINTR { unlink(temp) }
                throw systemError("close", temp, code)
            }
            let final = path(of: id)
            do throws(StoreError) {
                try renameNoReplace(temp, final)
            } catch {
                _ = retryEINTR { unlink(temp) }
                if error.errno == EEXIST { continue }  // id already taken: draw another
                throw error
            }
            if durable {
                try fsyncDirectory(folder(of: id))
            } else {
                listUnsynced(id)
            }
            return ChunkRef(blob: id, length: UInt32(bytes.count), checksum: checksum)
        }
    }

    /// A working copy's chunk file becomes a blob by a hard link: its bytes, already in the page
    /// cache, are not copied. Where a link cannot be made (another file system, say), the bytes
    /// are read and written as any blob's.
    public func adopt(_ file: String, length: Int, checksum: UInt64, durable: Bool) throws(StoreError) -> ChunkRef {
        guard length > 0, length <= chunkSize else {
            throw StoreError(errno: EINVAL, "adopt \(file): a chunk of \(length) bytes")
        }
        var generator = SystemRandomNumberGenerator()
        while true {
            let id = nextID(&generator)
            let final = path(of: id)
            if retryEINTR({ link(file, final) }) != 0 {
                let code = errno
                if code == EEXIST { continue }   // id already taken: draw another
                guard code == EXDEV || code == EPERM || code == EMLINK || code == ENOTSUP else {
                    throw systemError("link", "\(file) to \(final)", code)
                }
                return try copying(file, length: length, durable: durable)
            }
            // Written now, as far as garbage collection goes (it spares blobs younger than its
            // grace): the chunk file may have been written long before this link.
            // (<sys/stat.h>'s UTIME_OMIT and UTIME_NOW, which Glibc's module does not show.)
            var times = [timespec(tv_sec: 0, tv_nsec: (1 << 30) - 2), timespec(tv_sec: 0, tv_nsec: (1 << 30) - 1)]
            if utimensat(AT_FDCWD, final, &times, AT_SYMLINK_NOFOLLOW) != 0 {
                let code = errno
                _ = retryEINTR { unlink(final) }
                throw systemError("utimensat", final, code)
            }
            if durable {
                do throws(StoreError) {
                    let fd = retryEINTR { open(final, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
                    if fd < 0 { throw systemError("open", final, errno) }
                    defer { close(fd) }
                    try fdatasyncChecked(fd, path: final)
                    try fsyncDirectory(folder(of: id))
                } catch {
                    _ = retryEINTR { unlink(final) }
                    throw error
                }
            } else {
                listUnsynced(id)
            }
            return ChunkRef(blob: id, length: UInt32(length), checksum: checksum)
        }
    }

    /// A fresh id: random, but in the XX folder of the ids drawn just before it.
    private func nextID(_ generator: inout SystemRandomNumberGenerator) -> BlobID {
        let low = syncMutex.withLock { () -> UInt64 in
            folderCursor &+= 1
            return (folderCursor >> 6) & 0xff
        }
        var high: UInt64 = 0
        while high == 0 { high = generator.next() >> 8 }
        return high << 8 | low
    }

    /// `id` was written without a sync: the next barrier syncs it.
    private func listUnsynced(_ id: BlobID) {
        syncMutex.withLock {
            if unsynced.count < Self.unsyncedLimit { unsynced.insert(id) } else { unsyncedOverflow = true }
        }
    }

    private func copying(_ file: String, length: Int, durable: Bool) throws(StoreError) -> ChunkRef {
        let fd = retryEINTR { open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        if fd < 0 { throw systemError("open", file, errno) }
        defer { close(fd) }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: length, alignment: 16)
        defer { buffer.deallocate() }
        let n = try preadFully(fd, buffer, at: 0, path: file)
        guard n == length else { throw StoreError(errno: EIO, "\(file) is \(n) bytes, not \(length)") }
        return try write(UnsafeRawBufferPointer(buffer), durable: durable)
    }

    /// Stores `bytes` as blob `id`, a copy of another store's blob (a cache of it), replacing any
    /// file of that id. Not synced: a cache's copy that a power cut loses is fetched again.
    package func put(_ id: BlobID, _ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        let temp = tempPath + "/" + Self.hex16(id) + "." + Self.hex16(UInt64.random(in: 1...UInt64.max))
        let fd = retryEINTR { open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        if fd < 0 { throw systemError("create", temp, errno) }
        do throws(StoreError) {
            try pwriteFully(fd, bytes, at: 0, path: temp)
        } catch {
            close(fd)
            _ = retryEINTR { unlink(temp) }
            throw error
        }
        close(fd)
        let final = path(of: id)
        if rename(temp, final) != 0 {
            let code = errno
            _ = retryEINTR { unlink(temp) }
            throw systemError("rename", final, code)
        }
        // A reader may hold the fd of the file this replaced: it goes on reading that one, which
        // has the same bytes (blobs never change).
    }

    /// The size of blob `id`'s file, or nil if there is none.
    package func size(of id: BlobID) -> Int? {
        var st = stat()
        return lstat(path(of: id), &st) == 0 ? Int(st.st_size) : nil
    }

    public func file(_ blob: BlobID) throws(StoreError) -> BlobFile { try openForReading(blob) }

    public func readAhead(_ blobs: [BlobID]) {
        guard !blobs.isEmpty else { return }
        // Off the request's path: opening a blob reads its inode, and WILLNEED can wait for the
        // disk's queue.
        Self.readAheadQueue.async { [self] in
            for blob in blobs where blob != 0 {
                guard let file = try? openForReading(blob) else { continue }
                _ = posix_fadvise(file.fd, 0, 0, POSIX_FADV_WILLNEED)
            }
        }
    }
    private static let readAheadQueue = DispatchQueue(label: "ubiquityfs.blobs.read-ahead", qos: .utility)

    public func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        if blob == 0 || buffer.isEmpty { return 0 }  // the hole: an empty blob
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "read \(path(of: blob)): negative offset \(offset)") }
        let handle = try openForReading(blob)
        return try preadFully(handle.fd, buffer, at: offset, path: path(of: blob))
    }

    /// The cached fd of `blob`, opening it (outside the lock) on a miss.
    private func openForReading(_ blob: BlobID) throws(StoreError) -> BlobFile {
        if let handle = cacheMutex.withLock({ cache.get(blob) }) { return handle }
        let file = path(of: blob)
        let fd = retryEINTR { open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        if fd < 0 { throw systemError("open blob", file, errno) }
        var st = stat()
        if fstat(fd, &st) != 0 {
            let code = errno
            close(fd)
            throw systemError("stat blob", file, code)
        }
        let fresh = BlobFile(fd, size: Int(st.st_size))
        // If another thread cached it meanwhile, use theirs; `fresh` closes on release.
        let (handle, evicted) = cacheMutex.withLock { cache.insert(blob, fresh) }
        withExtendedLifetime(evicted) {}  // released here, outside the lock
        return handle
    }

    public func syncAll() throws(StoreError) { try sync(wholeDisk: true) }

    public func syncWritten() throws(StoreError) { try sync(wholeDisk: false) }

    /// One syncfs, or an fdatasync of each listed chunk and an fsync of their folders. The list
    /// is taken first: a chunk written meanwhile stays listed (synced twice at worst), and a
    /// failed sync gives back what it took.
    private func sync(wholeDisk: Bool) throws(StoreError) {
        let taken = takeUnsynced()
        do throws(StoreError) {
            if wholeDisk || taken.overflow { return try syncFilesystem(blobsFD, path: blobsPath) }
            var folders = Set<UInt8>()
            for id in taken.ids {
                let file = path(of: id)
                let fd = retryEINTR { open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
                if fd < 0 {
                    if errno == ENOENT { continue }   // deleted since (a failed publish's): named by no commit
                    throw systemError("open blob", file, errno)
                }
                defer { close(fd) }
                try fdatasyncChecked(fd, path: file)
                folders.insert(UInt8(truncatingIfNeeded: id))
            }
            // The renames into the XX folders: without these, a synced file may have no name.
            for low in folders { try fsyncDirectory(folder(of: BlobID(low))) }
        } catch {
            giveBack(taken)
            throw error
        }
    }

    private func takeUnsynced() -> (ids: Set<BlobID>, overflow: Bool) {
        syncMutex.withLock {
            defer { unsynced = []; unsyncedOverflow = false }
            return (unsynced, unsyncedOverflow)
        }
    }

    /// A sync failed: what it took is still to be synced (by a syncfs, if there is too much).
    private func giveBack(_ taken: (ids: Set<BlobID>, overflow: Bool)) {
        syncMutex.withLock {
            unsynced.formUnion(taken.ids)
            if taken.overflow || unsynced.count > Self.unsyncedLimit { unsyncedOverflow = true }
        }
    }

    public func delete(_ blob: BlobID) throws(StoreError) {
        guard blob != 0 else { return }
        let evicted = cacheMutex.withLock { cache.remove(blob) }
        withExtendedLifetime(evicted) {}
        syncMutex.withLock { _ = unsynced.remove(blob) }
        let file = path(of: blob)
        if retryEINTR({ unlink(file) }) != 0 && errno != ENOENT {
            throw systemError("delete blob", file, errno)
        }
    }

    public func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID] {
        var result: [BlobID] = []
        let fm = FileManager.default
        guard let folders = try? fm.contentsOfDirectory(atPath: blobsPath) else {
            throw StoreError(errno: EIO, "cannot list \(blobsPath)")
        }
        for folder in folders where folder.count == 2 {
            for name in (try? fm.contentsOfDirectory(atPath: blobsPath + "/" + folder)) ?? [] {
                guard name.count == 16, let id = UInt64(name, radix: 16), id != 0 else { continue }
                if let cutoff {
                    var st = stat()
                    guard lstat(blobsPath + "/" + folder + "/" + name, &st) == 0,
                          Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec) < cutoff else { continue }
                }
                result.append(id)
            }
        }
        return result
    }

    public func verify(_ ref: ChunkRef) -> Bool {
        if ref.isHole { return true }
        let file = path(of: ref.blob)
        let fd = retryEINTR { open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        if fd < 0 { return false }
        defer { close(fd) }
        var st = stat()
        guard retryEINTR({ fstat(fd, &st) }) == 0, Int(st.st_size) == Int(ref.length) else { return false }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(ref.length), alignment: 16)
        defer { buffer.deallocate() }
        guard let n = try? preadFully(fd, buffer, at: 0, path: file), n == Int(ref.length) else { return false }
        return contentChecksum(UnsafeRawBufferPointer(buffer)) == ref.checksum
    }

    // MARK: For tests

    /// How many read fds are cached now.
    var cachedFDCount: Int { cacheMutex.withLock { cache.count } }

    /// The chunks written and not synced since, and whether there were too many to list.
    var unsyncedChunks: (ids: Set<BlobID>, overflow: Bool) { syncMutex.withLock { (unsynced, unsyncedOverflow) } }
}
