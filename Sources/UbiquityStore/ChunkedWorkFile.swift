// Working copies whose chunks are files of their own (map format 3), so that publishing writes
// no byte twice: a chunk file becomes the chunk's blob by a second name (`ChunkAdopting`), where
// the single-file format had every dirty chunk read back and written again as a blob.
//
//   <ino>.map                 as in LocalWorkArea.swift, magic "UBQWMAP3", and 8 more header
//                             bytes: 64 u64 the copy's id (random), which names its chunk files
//   <ino>.<copy id>.<index>   chunk `index`'s bytes from the chunk's start; a file shorter than
//                             the chunk reads as zeros past its end
//
// The logical size is the header's (`setBase`, `truncate`) or the end of the furthest chunk
// file, whichever is larger: a write past the end extends a chunk file, not the map. A chunk
// file exists before its dirty mark, so a marked chunk without a file holds zeros (a truncate
// removed it). Chunk files are never written once published (the working copy is removed then),
// and never truncated to be reused: they may be blobs too. The copy id keeps a working copy
// made again for the same inode (a discarded document and a reopened one) from sharing names
// with the one before.

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
    private let spares: SparePairs?

    // `mutex` guards everything below. The map's descriptor is immutable and used without it.
    private let mutex = StoreMutex()
    private var dirty: Set<Int>
    /// Chunk files that exist.
    private var files: Set<Int>
    /// Chunk files written since the last `sync`.
    private var unsynced: Set<Int> = []
    private var open: [Int: ChunkDescriptor] = [:]
    private var needsDirectorySync: Bool
    private var hasBase: Bool
    /// The size as `setBase` or `truncate` last set it.
    private var headerSize: UInt64
    /// The end of the furthest chunk file's bytes (at most: a truncate may have cut it).
    private var dataEnd: UInt64
    /// The working copy's logical size. Caller holds mutex.
    private var logicalSize: UInt64 { max(headerSize, dataEnd) }
    /// Chunk files kept open at once (a sequential writer needs one, a random one a few).
    static let openLimit = 8

    init(ino: InodeNumber, folder: String, copyID: UInt64, mapFD: Int32, mapPath: String, dirty: Set<Int>,
         files: Set<Int>, newlyCreated: Bool, base: VersionID?, size: UInt64, dataEnd: UInt64 = 0, reserve: SpaceReserve?,
         spares: SparePairs? = nil) {
        self.ino = ino; self.folder = folder; self.copyID = copyID
        self.mapFD = mapFD; self.mapPath = mapPath
        self.dirty = dirty; self.files = files
        self.needsDirectorySync = newlyCreated
        self.hasBase = base != nil
        self.headerSize = size
        self.dataEnd = dataEnd
        self.reserve = reserve
        self.spares = spares
    }

    deinit { close(mapFD) }

    static func chunkName(ino: InodeNumber, copyID: UInt64, index: Int) -> String {
        "\(ino).\(String(copyID, radix: 16)).\(index)"
    }

    private func path(_ index: Int) -> String {
        folder + "/" + Self.chunkName(ino: ino, copyID: copyID, index: index)
    }

    /// Chunk `index`'s open file; nil when it has none and `create` is false.
    private func descriptor(_ index: Int, create: Bool) throws(StoreError) -> ChunkDescriptor? {
        try mutex.withLock { () throws(StoreError) -> ChunkDescriptor? in
            if let d = open[index] { return d }
            let exists = files.contains(index)
            guard exists || create else { return nil }
            let p = path(index)
            let fd = retryEINTR { Glibc.open(p, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (exists ? 0 : O_CREAT), 0o600) }
            if fd < 0 { throw systemError(exists ? "open" : "create", p, errno) }
            if !exists {
                files.insert(index)
                needsDirectorySync = true
            }
            if open.count >= Self.openLimit, let victim = open.keys.first { open[victim] = nil }
            let d = ChunkDescriptor(fd)
            open[index] = d
            return d
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
            let got = try descriptor(index, create: false).map { (d) throws(StoreError) in
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
            let d = try descriptor(index, create: true)!
            try pwriteFully(d.fd, UnsafeRawBufferPointer(rebasing: bytes[range]), at: within, path: path(index))
            mutex.withLock {
                unsynced.insert(index)
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
        try withUnsafeBytes(of: UInt64(size).littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: 24, path: mapPath)
        }
        mutex.withLock { headerSize = UInt64(size) }
    }

    /// No chunk file holds bytes past `size`: those wholly past go, the one it ends in is cut.
    private func cutFiles(to size: Int) throws(StoreError) {
        let keep = (size + chunkSize - 1) / chunkSize
        let gone = mutex.withLock { () -> [Int] in
            let gone = Array(files.filter { $0 >= keep })
            for index in gone {
                files.remove(index)
                unsynced.remove(index)
                open[index] = nil
            }
            dataEnd = min(dataEnd, UInt64(size))
            return gone
        }
        for index in gone { _ = retryEINTR { unlink(path(index)) } }
        if size % chunkSize != 0, let d = try descriptor(size / chunkSize, create: false) {
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
        _ = try descriptor(index, create: true)
        try withUnsafeBytes(of: UInt8(1)) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: WorkMap.chunkedHeaderSize + index, path: mapPath)
        }
        mutex.withLock { _ = dirty.insert(index) }
    }

    public func setBase(_ base: VersionID?, size: UInt64) throws(StoreError) {
        guard size <= UInt64(Int64.max) else { throw StoreError(errno: EFBIG, "set base \(mapPath): size \(size)") }
        try pwriteFully(mapFD, WorkMap.chunkedHeader(ino: ino, base: base, size: size, boot: currentBootID ?? [], copyID: copyID),
                        at: 0, path: mapPath)
        try cutFiles(to: Int(size))
        mutex.withLock {
            hasBase = base != nil
            headerSize = size
        }
    }

    public func setFinished(mtime: Int64?) throws(StoreError) {
        if let mtime {
            // The time first: the flag, written after it, vouches for it.
            try withUnsafeBytes(of: mtime.littleEndian) { (raw) throws(StoreError) in
                try pwriteFully(mapFD, raw, at: 48, path: mapPath)
            }
        }
        let flags = (mutex.withLock { hasBase } ? WorkMap.hasBase : 0) | (mtime != nil ? WorkMap.finished : 0)
        try withUnsafeBytes(of: flags.littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: 8, path: mapPath)
        }
    }

    public func sync() throws(StoreError) {
        let indexes = mutex.withLock { () -> [Int] in
            defer { unsynced = [] }
            return Array(unsynced)
        }
        do throws(StoreError) {
            for index in indexes {
                guard let d = try descriptor(index, create: false) else { continue }
                try fsyncChecked(d.fd, path: path(index))
            }
            try fsyncChecked(mapFD, path: mapPath)
            if mutex.withLock({ needsDirectorySync }) {
                try fsyncDirectory(folder)
                mutex.withLock { needsDirectorySync = false }
            }
        } catch {
            mutex.withLock { unsynced.formUnion(indexes) }
            throw error
        }
    }

    public func chunkFile(_ index: Int, length: Int) throws(StoreError) -> String? {
        guard length > 0, length <= chunkSize else { throw StoreError(errno: EINVAL, "chunk \(index) of \(mapPath): \(length) bytes") }
        let d = try descriptor(index, create: true)!
        var st = stat()
        guard fstat(d.fd, &st) == 0 else { throw systemError("stat", path(index), errno) }
        if st.st_size != off_t(length) {
            if retryEINTR({ ftruncate(d.fd, off_t(length)) }) != 0 { throw systemError("truncate", path(index), errno) }
            mutex.withLock { dataEnd = max(dataEnd, UInt64(index * chunkSize + length)) }
        }
        return path(index)
    }

    public func remove() {
        // The map first: without it (or emptied, as a spare) recovery sees no working copy, and
        // takes chunk files with no map for leftovers.
        let kept = spares?.keep(map: (mapFD, mapPath)) ?? false
        if !kept {
            var mine = stat(), named = stat()
            if fstat(mapFD, &mine) == 0, stat(mapPath, &named) == 0, mine.st_dev == named.st_dev, mine.st_ino == named.st_ino {
                _ = retryEINTR { unlink(mapPath) }
            }
        }
        let indexes = mutex.withLock { () -> Set<Int> in
            defer { files = []; unsynced = []; open = [:] }
            return files
        }
        // Names of this copy's own (its id is in them); a published chunk lives on as its blob.
        for index in indexes { _ = retryEINTR { unlink(path(index)) } }
    }
}
