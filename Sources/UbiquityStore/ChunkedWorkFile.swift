// Working copies whose chunks are files of their own (map formats 3 and 4), so that publishing
// writes no byte twice: a chunk file becomes the chunk's blob by a second name (`ChunkAdopting`),
// where the single-file format had every dirty chunk read back and written again as a blob.
//
//   <ino>.map                 as in LocalWorkArea.swift, magic "UBQWMAP4", and more header:
//                               64  u64 the copy's id (random), which names its chunk files
//                               72  u64 how much of the base it still shows: its least size
//                                   since `setBase` (a truncate below, then a growth, shows zeros
//                                   there, not the base's bytes)
//                               80  u64 the page log's epoch (0: none; `setBase` clears it)
//                             flags bit 2: an fsync made it durable (`markSynced`), written by
//                             `sync` after the chunk files' fdatasync; then from byte 128 a
//                             128-byte slot per chunk, two halves of 64: the state now and the
//                             state as of the last sync since that mark. A half: byte 0 the
//                             state (1: whole in the copy, 2: some pages are, the rest are the
//                             base's), bytes 32..<64 those pages (`PageSet`, little endian).
//                             After a power cut, recovery of a synced copy reads the synced
//                             halves (a later state may be on disk before its bytes). Format 3
//                             ("UBQWMAP3", header ending at 72, a state byte per chunk from 72,
//                             whole chunks only) is still recovered.
//   <ino>.<copy id>.<index>   chunk `index`'s bytes from the chunk's start; a file shorter than
//                             the chunk reads as zeros past its end; of a chunk held in pages,
//                             only those pages mean anything
//   <ino>.<copy id>.log       a synced copy's page log (PageLog.swift): the pages each fsync
//                             after the first made durable; its epoch is the map's at 80
//
// The logical size is the header's (`setBase`, `truncate`) or the end of the furthest chunk
// file, whichever is larger: a write past the end extends a chunk file, not the map. A chunk
// file exists before its dirty mark, so after a crash of the daemon a marked chunk without a
// file holds zeros (a truncate removed it). A truncate cuts the files, then writes the size: a
// crash between leaves a copy whose tail is cut before its size says, which recovery keeps as a
// side version only (a truncate clears the finished mark first; a synced copy is published
// before any truncate). Chunk files are never
// truncated to be reused, and a file handed to the blob store (`chunkFile`) is copied before
// any change: it may be a blob too. The copy id keeps a working copy made again for the same
// inode (a discarded document and a reopened one) from sharing names with the one before.
// An older daemon that takes over this folder knows neither format: it deletes such copies,
// fsync'd ones included (a downgrade after a crash loses what they held).

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An open chunk file, closed when the last user lets go (a read on one thread while another
/// evicts it from the cache).
private final class ChunkDescriptor: @unchecked Sendable {
    let fd: Int32
    init(_ fd: Int32) { self.fd = fd }
    deinit { close(fd) }
}

public final class ChunkedWorkFile: WorkFile, @unchecked Sendable {
    public let ino: InodeNumber
    /// Where its map is (for tests).
    var mapFilePath: String { mapPath }
    private let folder: String
    /// Names its chunk files.
    let copyID: UInt64
    private let mapFD: Int32
    private let mapPath: String
    private let reserve: SpaceReserve?
    /// Where `remove()` puts the emptied map for reuse (nil: it is deleted).
    private let spares: SpareMaps?
    /// Empty files made ahead for new chunk files (nil: each is made when first written).
    private let chunkSpares: SpareChunkFiles?

    // `mutex` guards everything below. The map's descriptor is immutable and used without it.
    private let mutex = StoreMutex()
    private var dirty: Set<Int>
    /// Chunk files that exist.
    private var files: Set<Int>
    /// Chunk files written since the last `sync`.
    private var unsynced: Set<Int> = []
    private var open: [Int: ChunkDescriptor] = [:]
    /// `open`'s keys, least recently used first.
    private var order: [Int] = []
    /// Chunk files handed to a blob store (`chunkFile`), or found at recovery, which may be
    /// blobs too: copied before any change (`writer`).
    private var lent: Set<Int>
    private var needsDirectorySync: Bool
    /// The map changed since the last `sync`.
    private var mapChanged = true
    private var hasBase: Bool
    /// The flags' finished and synced marks as last written.
    private var finishedMark = false
    private var syncedMark = false
    /// An fsync asked for the synced mark (`markSynced`): `sync` writes the slots' synced
    /// halves, then the mark.
    private var syncRequested = false
    /// Chunks held in pages, and which (format 4).
    private var heldPages: [Int: PageSet] = [:]
    /// Slots changed since their synced halves were last written; nil: all of them are owed
    /// (none was written yet).
    private var unsyncedSlots: Set<Int>? = nil
    /// Format 4: a slot per chunk, pages, the base's reach. A format-3 copy (recovered) has none.
    private let paged: Bool
    /// The least size since `setBase` (format 4).
    private var baseReach: UInt64
    /// The size as `setBase` or `truncate` last set it.
    private var headerSize: UInt64
    /// The end of the furthest chunk file's bytes (at most: a truncate may have cut it).
    private var dataEnd: UInt64
    /// The working copy's logical size. Caller holds mutex.
    private var logicalSize: UInt64 { max(headerSize, dataEnd) }
    /// Pages written since the last sync, by chunk: what the next log batch holds.
    private var writtenPages: [Int: PageSet] = [:]
    /// The page log, made by the first fsync that goes through it (-1 before), where its
    /// batches end, and the epoch of its batches in the map (0: none yet).
    private var logFD: Int32 = -1
    private var logEnd = 0
    /// The log file's length: zeros past `logEnd`, written ahead so that a batch overwrites
    /// blocks the file has (an `fdatasync` of an append also writes the file's new size and
    /// blocks: 0.12 ms against 0.07 on this kind of disk).
    private var logSize = 0
    private var logEpoch: UInt64 = 0
    /// The next sync must be a full one: a batch cannot say what changed (a truncate, a new
    /// base, a chunk file copied or handed to the blob store, a recovered log) or a sync failed
    /// (what reached the disk is unknown).
    private var logBlocked = false
    /// One sync at a time (the kernel sends one fsync of a file at a time; this does not rely
    /// on it): the epoch and the log's end are read and written across a sync's steps.
    private let syncLock = StoreMutex()
    /// Chunk files kept open at once (a sequential writer needs one, a random one a few).
    static let openLimit = 8

    init(ino: InodeNumber, folder: String, copyID: UInt64, mapFD: Int32, mapPath: String, dirty: Set<Int>,
         files: Set<Int>, newlyCreated: Bool, base: VersionID?, size: UInt64, dataEnd: UInt64 = 0, paged: Bool,
         baseReach: UInt64?, finished: Bool = false, synced: Bool = false, reserve: SpaceReserve?, spares: SpareMaps? = nil,
         chunkSpares: SpareChunkFiles? = nil, log: (fd: Int32, end: Int, epoch: UInt64)? = nil) {
        self.ino = ino; self.folder = folder; self.copyID = copyID
        self.mapFD = mapFD; self.mapPath = mapPath
        self.dirty = dirty; self.files = files
        self.lent = files
        self.needsDirectorySync = newlyCreated
        self.hasBase = base != nil
        self.headerSize = size
        self.paged = paged
        self.baseReach = baseReach ?? size
        self.finishedMark = finished
        self.syncedMark = synced
        self.syncRequested = synced
        self.dataEnd = dataEnd
        self.reserve = reserve
        self.spares = spares
        self.chunkSpares = chunkSpares
        if let log {
            // A recovered copy's log: its next sync is a full one, which retires what it holds.
            (logFD, logEnd, logEpoch) = log
            logSize = log.end
            logBlocked = true
        }
    }

    deinit {
        close(mapFD)
        if logFD >= 0 { close(logFD) }
    }

    var logPath: String { folder + "/" + Self.logName(ino: ino, copyID: copyID) }

    static func logName(ino: InodeNumber, copyID: UInt64) -> String {
        "\(ino).\(String(copyID, radix: 16)).log"
    }

    static func chunkName(ino: InodeNumber, copyID: UInt64, index: Int) -> String {
        "\(ino).\(String(copyID, radix: 16)).\(index)"
    }

    private func path(_ index: Int) -> String {
        folder + "/" + Self.chunkName(ino: ino, copyID: copyID, index: index)
    }

    /// The cached descriptor of chunk `index`, now the most recently used. Caller holds mutex.
    private func cached(_ index: Int) -> ChunkDescriptor? {
        guard let d = open[index] else { return nil }
        if let i = order.firstIndex(of: index), i != order.count - 1 {
            order.remove(at: i)
            order.append(index)
        }
        return d
    }

    /// Caches `d` for chunk `index` (or returns the one another thread cached meanwhile); the
    /// least recently used goes past `openLimit`. Descriptors are closed after the lock is let go.
    private func install(_ index: Int, _ d: ChunkDescriptor) -> ChunkDescriptor {
        var dropped: [ChunkDescriptor] = []
        let chosen = mutex.withLock { () -> ChunkDescriptor in
            if let existing = cached(index) { return existing }
            if open.count >= Self.openLimit, !order.isEmpty, let victim = open.removeValue(forKey: order.removeFirst()) {
                dropped.append(victim)
            }
            open[index] = d
            order.append(index)
            return d
        }
        withExtendedLifetime(dropped) {}
        return chosen
    }

    /// Forgets chunk `index`'s cached descriptor (its file is about to go or change). Caller
    /// holds mutex; returns it, for the caller to drop after unlocking.
    private func uncache(_ index: Int) -> ChunkDescriptor? {
        if let i = order.firstIndex(of: index) { order.remove(at: i) }
        return open.removeValue(forKey: index)
    }

    /// Chunk `index`'s file for reading; nil when it has none.
    private func reader(_ index: Int) throws(StoreError) -> ChunkDescriptor? {
        let (d, exists) = mutex.withLock { (cached(index), files.contains(index)) }
        if let d { return d }
        guard exists else { return nil }
        let fd = retryEINTR { Glibc.open(path(index), O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
        if fd < 0 { throw systemError("open", path(index), errno) }
        return install(index, ChunkDescriptor(fd))
    }

    /// Chunk `index`'s file for a change, made if missing. One that may be a blob too is copied
    /// to a file of its own first: a blob never changes, even where a publish that adopted it
    /// failed and its blob name could not be deleted.
    private func writer(_ index: Int) throws(StoreError) -> ChunkDescriptor {
        var stale: ChunkDescriptor?
        let (d, exists, shared) = mutex.withLock { () -> (ChunkDescriptor?, Bool, Bool) in
            if lent.contains(index) {
                stale = uncache(index)
                return (nil, files.contains(index), true)
            }
            return (cached(index), files.contains(index), false)
        }
        withExtendedLifetime(stale) {}
        if let d { return d }
        let p = path(index)
        if exists {
            if shared { try copyIfShared(index) }
            let fd = retryEINTR { Glibc.open(p, O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
            if fd < 0 { throw systemError("open", p, errno) }
            mutex.withLock { _ = lent.remove(index) }
            return install(index, ChunkDescriptor(fd))
        }
        // A new file (a spare made ahead, renamed over any file under this name); one left under
        // this name by an unlink that failed is not this chunk's.
        var fd = chunkSpares?.take(as: p) ?? -1
        if fd < 0 { fd = retryEINTR { Glibc.open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) } }
        if fd < 0 && errno == EEXIST {
            _ = retryEINTR { unlink(p) }
            fd = retryEINTR { Glibc.open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        }
        if fd < 0 { throw systemError("create", p, errno) }
        mutex.withLock {
            files.insert(index)
            lent.remove(index)
            needsDirectorySync = true
        }
        return install(index, ChunkDescriptor(fd))
    }

    /// If chunk `index`'s file has another name (a blob's), puts a copy of it in its place.
    private func copyIfShared(_ index: Int) throws(StoreError) {
        let p = path(index), temp = p + ".copy"
        var st = stat()
        guard lstat(p, &st) == 0 else { throw systemError("stat", p, errno) }
        guard st.st_nlink > 1 else { return }
        let source = retryEINTR { Glibc.open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        if source < 0 { throw systemError("open", p, errno) }
        defer { close(source) }
        _ = retryEINTR { unlink(temp) }
        let target = retryEINTR { Glibc.open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        if target < 0 { throw systemError("create", temp, errno) }
        defer { close(target) }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, Int(st.st_size)), alignment: 16)
        defer { buffer.deallocate() }
        do throws(StoreError) {
            let n = try preadFully(source, buffer, at: 0, path: p)
            try pwriteFully(target, UnsafeRawBufferPointer(rebasing: buffer[0..<n]), at: 0, path: temp)
            if rename(temp, p) != 0 { throw systemError("rename", temp, errno) }
        } catch {
            _ = retryEINTR { unlink(temp) }
            throw error
        }
        // A new file in its place, none of it synced: the next sync is a full one.
        mutex.withLock {
            needsDirectorySync = true
            logBlocked = true
        }
    }

    /// Calls `body` for each piece of [offset, offset + count) within one chunk: its index, the
    /// offset in the chunk, and the piece's range in the caller's buffer. Stops when it returns false.
    private func pieces(_ offset: Int, _ count: Int, _ body: (Int, Int, Range<Int>) throws(StoreError) -> Bool) throws(StoreError) {
        var done = 0
        while done < count {
            let position = offset + done
            let within = position % chunkSize
            let n = min(count - done, chunkSize - within)
            guard try body(position / chunkSize, within, done..<(done + n)) else { return }
            done += n
        }
    }

    /// Zeros where no chunk file holds bytes, up to the logical size.
    public func pread(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) -> Int {
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "read \(mapPath): negative offset \(offset)") }
        let size = mutex.withLock { logicalSize }
        guard UInt64(offset) < size else { return 0 }
        let count = Int(min(UInt64(buffer.count), size - UInt64(offset)))
        try pieces(offset, count) { (index, within, range) throws(StoreError) -> Bool in
            let piece = UnsafeMutableRawBufferPointer(rebasing: buffer[range])
            let got = try reader(index).map { (d) throws(StoreError) in
                try preadFully(d.fd, piece, at: within, path: path(index))
            } ?? 0
            if got < piece.count { UnsafeMutableRawBufferPointer(rebasing: piece[got...]).initializeMemory(as: UInt8.self, repeating: 0) }
            return true
        }
        return count
    }

    public func pwrite(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError) {
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "write \(mapPath): negative offset \(offset)") }
        try reserve?.checkRoom(for: "write \(mapPath)")
        try pieces(offset, bytes.count) { (index, within, range) throws(StoreError) -> Bool in
            let d = try writer(index)
            try pwriteFully(d.fd, UnsafeRawBufferPointer(rebasing: bytes[range]), at: within, path: path(index))
            mutex.withLock {
                unsynced.insert(index)
                // Only a synced copy's next sync may go through the log; until then a full one
                // covers everything.
                if syncedMark { writtenPages[index, default: PageSet()].formUnion(PageSet(touching: within, within + range.count)) }
                dataEnd = max(dataEnd, UInt64(index * chunkSize + within + range.count))
            }
            return true
        }
    }

    public func truncate(to size: Int) throws(StoreError) {
        guard size >= 0 else { throw StoreError(errno: EINVAL, "truncate \(mapPath): negative size \(size)") }
        if let reserve, reserve.isReleased, UInt64(size) > mutex.withLock({ logicalSize }) {   // a shrink needs no room
            try reserve.checkRoom(for: "truncate \(mapPath)")
        }
        try cutFiles(to: size)
        let reach = mutex.withLock { paged && UInt64(size) < baseReach ? UInt64(size) : nil }
        if let reach {
            // Before the size: a crash between leaves a copy that shows less of its base, never
            // more (the chunks past it hold zeros, as the cut made them).
            try withUnsafeBytes(of: reach.littleEndian) { (raw) throws(StoreError) in
                try pwriteFully(mapFD, raw, at: WorkMap.baseReachAt, path: mapPath)
            }
        }
        try withUnsafeBytes(of: UInt64(size).littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: WorkMap.sizeAt, path: mapPath)
        }
        mutex.withLock {
            headerSize = UInt64(size)
            if let reach { baseReach = reach }
            mapChanged = true
            logBlocked = true
        }
    }

    /// No chunk file holds bytes past `size`: those wholly past go, the one it ends in is cut.
    private func cutFiles(to size: Int) throws(StoreError) {
        let keep = (size + chunkSize - 1) / chunkSize
        var dropped: [ChunkDescriptor] = []
        let (gone, cut) = mutex.withLock { () -> ([Int], Bool) in
            let gone = Array(files.filter { $0 >= keep })
            for index in gone {
                files.remove(index)
                unsynced.remove(index)
                lent.remove(index)
                if let d = uncache(index) { dropped.append(d) }
            }
            dataEnd = min(dataEnd, UInt64(size))
            // The names go: an fsync after this must make that durable too.
            if !gone.isEmpty { needsDirectorySync = true }
            return (gone, files.contains(size / chunkSize))
        }
        dropped = []
        for index in gone { _ = retryEINTR { unlink(path(index)) } }
        if size % chunkSize != 0, cut {
            let d = try writer(size / chunkSize)
            var st = stat()
            guard fstat(d.fd, &st) == 0 else { throw systemError("stat", path(size / chunkSize), errno) }
            if st.st_size > off_t(size % chunkSize) {
                if retryEINTR({ ftruncate(d.fd, off_t(size % chunkSize)) }) != 0 { throw systemError("truncate", path(size / chunkSize), errno) }
                mutex.withLock { _ = unsynced.insert(size / chunkSize) }
            }
        }
    }

    public func markDirty(_ index: Int) throws(StoreError) {
        guard index >= 0 else { throw StoreError(errno: EINVAL, "mark \(mapPath): negative chunk index \(index)") }
        if mutex.withLock({ dirty.contains(index) }) { return }
        // The file first: a marked chunk without one reads as zeros.
        _ = try writer(index)
        try withUnsafeBytes(of: WorkMap.wholeChunk) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: markOffset(index), path: mapPath)
        }
        mutex.withLock {
            dirty.insert(index)
            heldPages[index] = nil
            unsyncedSlots?.insert(index)
            mapChanged = true
        }
    }

    /// Where chunk `index`'s mark is in the map.
    private func markOffset(_ index: Int) -> Int {
        paged ? WorkMap.slotsAt + index * WorkMap.slotSize : WorkMap.chunkedHeaderSize + index
    }

    public var keepsPages: Bool { paged }

    public func markPages(_ index: Int, _ pages: PageSet) throws(StoreError) {
        guard index >= 0 else { throw StoreError(errno: EINVAL, "mark \(mapPath): negative chunk index \(index)") }
        guard paged else { throw StoreError(errno: ENOTSUP, "mark \(mapPath): a format-3 copy holds whole chunks only") }
        if mutex.withLock({ dirty.contains(index) }) { return }
        // The slot's live half in one write, within one page of the map.
        try pwriteFully(mapFD, Self.half(WorkMap.someChunkPages, pages), at: markOffset(index), path: mapPath)
        mutex.withLock {
            heldPages[index] = pages
            unsyncedSlots?.insert(index)
            mapChanged = true
        }
    }

    /// A slot's half: its state byte, its page set at `WorkMap.pagesAt`.
    private static func half(_ state: UInt8, _ pages: PageSet) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: WorkMap.syncedHalf)
        bytes[0] = state
        bytes.replaceSubrange(WorkMap.pagesAt..<(WorkMap.pagesAt + PageSet.count / 8), with: pages.bytes)
        return bytes
    }

    /// Asks `sync` to mark the copy synced. The mark is written there, after the chunk files are
    /// durable and with the slots' synced halves, so that after a power cut it vouches only for
    /// bytes that reached the disk.
    public func markSynced() throws(StoreError) -> Bool {
        guard paged else { return false }
        mutex.withLock { syncRequested = true }
        return true
    }

    /// Writes the synced halves of the slots changed since the last time (all the first time)
    /// and the synced mark. Caller made the chunk files durable; the map's sync follows.
    /// Returns whether it wrote anything (nothing when no slot changed since and the mark is on
    /// the disk: a program rewriting the same pages pays one `fdatasync` per fsync, not two).
    private func writeSyncedHalves() throws(StoreError) -> Bool {
        let (owed, base, finished, marked) = mutex.withLock { () -> ([(Int, [UInt8])], Bool, Bool, Bool) in
            let slots = unsyncedSlots ?? dirty.union(heldPages.keys)
            let owed = slots.sorted().map { index in
                (index, dirty.contains(index) ? Self.half(WorkMap.wholeChunk, PageSet())
                    : Self.half(heldPages[index] != nil ? WorkMap.someChunkPages : 0, heldPages[index] ?? PageSet()))
            }
            return (owed, hasBase, finishedMark, syncedMark)
        }
        if owed.isEmpty && marked { return false }
        for (index, half) in owed {
            try pwriteFully(mapFD, half, at: markOffset(index) + WorkMap.syncedHalf, path: mapPath)
        }
        let flags = (base ? WorkMap.hasBase : 0) | (finished ? WorkMap.finished : 0) | WorkMap.synced
        try withUnsafeBytes(of: flags.littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: WorkMap.flagsAt, path: mapPath)
        }
        mutex.withLock {
            // Changed meanwhile: owed again at the next sync.
            let written = Set(owed.map(\.0))
            unsyncedSlots = (unsyncedSlots ?? []).subtracting(written)
            syncedMark = true
        }
        return true
    }

    public func setBase(_ base: VersionID?, size: UInt64) throws(StoreError) {
        guard size <= UInt64(Int64.max) else { throw StoreError(errno: EFBIG, "set base \(mapPath): size \(size)") }
        // Format 4 with the log's epoch cleared: the log's batches were of the content before.
        let header = paged
            ? WorkMap.pagedHeader(ino: ino, base: base, size: size, boot: currentBootID ?? [], copyID: copyID, baseReach: size)
                + [UInt8](repeating: 0, count: 8)
            : WorkMap.chunkedHeader(ino: ino, base: base, size: size, boot: currentBootID ?? [], copyID: copyID)
        try pwriteFully(mapFD, header, at: 0, path: mapPath)
        try cutFiles(to: Int(size))
        mutex.withLock {
            hasBase = base != nil
            headerSize = size
            baseReach = size
            finishedMark = false
            syncedMark = false
            syncRequested = false
            heldPages = [:]
            unsyncedSlots = nil
            mapChanged = true
            writtenPages = [:]
            logBlocked = true
            logEpoch = 0
        }
    }

    public func setFinished(mtime: Int64?) throws(StoreError) {
        let (base, synced) = mutex.withLock { (hasBase, syncedMark) }
        try WorkMap.writeFinished(mtime, hasBase: base, synced: synced, mapFD: mapFD, mapPath: mapPath)
        mutex.withLock {
            finishedMark = mtime != nil
            mapChanged = true
        }
    }

    public func sync() throws(StoreError) {
        try syncLock.withLock { () throws(StoreError) in try syncOnce() }
    }

    private func syncOnce() throws(StoreError) {
        if try syncThroughLog() { return }
        let (indexes, map) = mutex.withLock { () -> ([Int], Bool) in
            defer { unsynced = []; mapChanged = false }
            return (Array(unsynced), mapChanged)
        }
        do throws(StoreError) {
            // fdatasync: the bytes and what reading them back needs (the size), not the times.
            for index in indexes {
                guard let d = try reader(index) else { continue }
                try fdatasyncChecked(d.fd, path: path(index))
            }
            // The names before the map vouches for what they hold.
            if mutex.withLock({ needsDirectorySync }) {
                try fsyncDirectory(folder)
                mutex.withLock { needsDirectorySync = false }
            }
            var mapOwed = map
            let requested = mutex.withLock { syncRequested }
            if requested, try writeSyncedHalves() { mapOwed = true }
            let (epoch, logged) = mutex.withLock { (logEpoch, logEnd) }
            if requested && logged > 0 {
                // The log's batches are in the chunk files and the synced halves now: once those
                // are durable, a new epoch retires the batches (they may hold older bytes than
                // the chunk files do), and the log starts over.
                try fdatasyncChecked(mapFD, path: mapPath)
                try writeLogEpoch()
                try fdatasyncChecked(mapFD, path: mapPath)
                // Batches of the new epoch overwrite the old ones, which no longer count.
                mutex.withLock { logEnd = 0 }
            } else {
                if requested && epoch == 0 {
                    try writeLogEpoch()
                    mapOwed = true
                }
                if mapOwed { try fdatasyncChecked(mapFD, path: mapPath) }
            }
            mutex.withLock {
                writtenPages = [:]
                logBlocked = false
            }
        } catch {
            // The map may hold marks, halves or an epoch that did not reach the disk: the next
            // sync writes it again and syncs it, and is a full one.
            mutex.withLock {
                unsynced.formUnion(indexes)
                mapChanged = true
                logBlocked = true
            }
            throw error
        }
    }

    /// A new epoch for the page log's batches, in the map. Caller syncs the map.
    private func writeLogEpoch() throws(StoreError) {
        let old = mutex.withLock { logEpoch }
        var epoch: UInt64 = 0
        while epoch == 0 || epoch == old { epoch = UInt64.random(in: 1...UInt64.max) }
        try withUnsafeBytes(of: epoch.littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: WorkMap.logEpochAt, path: mapPath)
        }
        mutex.withLock { logEpoch = epoch }
    }

    /// An fsync of a synced copy after its first, of at most a batch of pages: the pages go to
    /// the page log in one batch, and only the log is synced. The chunk files stay owed to the
    /// next full sync (which makes them durable before the log's batches retire), as do the
    /// map's changes (a batch says the pages and the size). False: a full sync is needed.
    private func syncThroughLog() throws(StoreError) -> Bool {
        let plan = mutex.withLock { () -> (fd: Int32, end: Int, epoch: UInt64, size: UInt64, pages: [(Int, Int)])? in
            guard paged, syncRequested, syncedMark, !logBlocked, logEpoch != 0 else { return nil }
            var pages: [(Int, Int)] = []
            for index in writtenPages.keys.sorted() {
                let set = writtenPages[index]!
                for page in 0..<PageSet.count where set.contains(page) { pages.append((index, page)) }
                if pages.count > PageLog.batchPages { return nil }
            }
            guard logEnd + PageLog.batchBytes(pages.count) <= PageLog.limit else { return nil }
            return (logFD, logEnd, logEpoch, logicalSize, pages)
        }
        guard let plan else { return false }
        if plan.pages.isEmpty { return true }   // nothing written since the last sync
        var pages: [PageLog.Page] = []
        pages.reserveCapacity(plan.pages.count)
        for (index, page) in plan.pages {
            let start = UInt64(index * chunkSize + page * pageSize)
            guard start < plan.size else { continue }
            let count = Int(min(UInt64(pageSize), plan.size - start))
            let bytes = try reader(index).map { (d) throws(StoreError) in
                try preadFully(d.fd, count: count, at: page * pageSize, path: path(index))
            } ?? [UInt8](repeating: 0, count: count)
            pages.append(PageLog.Page(chunk: index, page: page, bytes: bytes))
        }
        let batch = PageLog.encode(epoch: plan.epoch, size: plan.size, pages: pages)
        do throws(StoreError) {
            // Made by the first fsync that needs it (a program that writes, fsyncs once and
            // closes never pays for it); its name is made durable with the first batch.
            var fd = plan.fd
            let made = fd < 0
            if made {
                fd = retryEINTR { Glibc.open(logPath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600) }
                if fd < 0 { throw systemError("create", logPath, errno) }
                mutex.withLock {
                    logFD = fd
                    logSize = 0
                }
            }
            let allocated = mutex.withLock { logSize }
            if plan.end + batch.count > allocated {
                let size = (plan.end + batch.count + PageLog.growth - 1) / PageLog.growth * PageLog.growth
                try pwriteFully(fd, [UInt8](repeating: 0, count: size - allocated), at: allocated, path: logPath)
                mutex.withLock { logSize = size }
            }
            try pwriteFully(fd, batch, at: plan.end, path: logPath)
            try fdatasyncChecked(fd, path: logPath)
            if made { try fsyncDirectory(folder) }
        } catch {
            // The batch may be on the disk in part or whole, unsynced: the next sync is a full
            // one, which retires it with the epoch.
            mutex.withLock {
                logEnd = max(logEnd, plan.end + batch.count)
                logBlocked = true
            }
            throw error
        }
        mutex.withLock {
            logEnd = plan.end + batch.count
            writtenPages = [:]
        }
        return true
    }

    /// Recovery after a power cut: writes the page log's batches back into the chunk files, in
    /// order (a file that may be a blob too is copied first, as for any change), and makes them
    /// and their names durable.
    func restore(_ batches: [PageLog.Batch]) throws(StoreError) {
        var touched = Set<Int>()
        for batch in batches {
            for page in batch.pages {
                let d = try writer(page.chunk)
                try pwriteFully(d.fd, page.bytes, at: page.page * pageSize, path: path(page.chunk))
                touched.insert(page.chunk)
            }
        }
        for index in touched.sorted() {
            guard let d = try reader(index) else { continue }
            try fdatasyncChecked(d.fd, path: path(index))
        }
        if mutex.withLock({ needsDirectorySync }) {
            try fsyncDirectory(folder)
            mutex.withLock { needsDirectorySync = false }
        }
    }

    public func chunkFile(_ index: Int, length: Int) throws(StoreError) -> String? {
        guard length > 0, length <= chunkSize else { throw StoreError(errno: EINVAL, "chunk \(index) of \(mapPath): \(length) bytes") }
        let d = try writer(index)
        var st = stat()
        guard fstat(d.fd, &st) == 0 else { throw systemError("stat", path(index), errno) }
        if st.st_size != off_t(length) {
            if retryEINTR({ ftruncate(d.fd, off_t(length)) }) != 0 { throw systemError("truncate", path(index), errno) }
            mutex.withLock { dataEnd = max(dataEnd, UInt64(index * chunkSize + length)) }
        }
        // From here the file may be a blob as well: any later change copies it first. Its
        // length may have changed here, which no log batch says: the next sync is a full one.
        let dropped = mutex.withLock { () -> ChunkDescriptor? in
            lent.insert(index)
            logBlocked = true
            return uncache(index)
        }
        withExtendedLifetime(dropped) {}
        return path(index)
    }

    public func remove() {
        // The map first: without it (or emptied, as a spare) recovery sees no working copy, and
        // takes chunk files with no map for leftovers.
        // A synced copy's map is not reused: were its emptying lost to a power cut while the
        // name change stayed, a later copy of the same file would come back as this one (synced,
        // claiming chunk files that are gone), as a conflict with what it became.
        let synced = mutex.withLock { syncedMark || syncRequested }
        let kept = synced ? false : spares?.keep(map: (mapFD, mapPath)) ?? false
        if !kept {
            var mine = stat(), named = stat()
            if fstat(mapFD, &mine) == 0, stat(mapPath, &named) == 0, mine.st_dev == named.st_dev, mine.st_ino == named.st_ino {
                _ = retryEINTR { unlink(mapPath) }
            }
        }
        let (indexes, dropped) = mutex.withLock { () -> (Set<Int>, [Int: ChunkDescriptor]) in
            defer { files = []; unsynced = []; open = [:]; order = []; lent = [] }
            return (files, open)
        }
        withExtendedLifetime(dropped) {}   // closed here, not under the lock
        // Names of this copy's own (its id is in them); a published chunk lives on as its blob.
        for index in indexes { _ = retryEINTR { unlink(path(index)) } }
        _ = retryEINTR { unlink(logPath) }
        // A synced copy's map must not come back after a power cut: recovery would publish it
        // again, over the version it became, as a conflict.
        if mutex.withLock({ syncedMark }) { try? fsyncDirectory(folder) }
    }
}
