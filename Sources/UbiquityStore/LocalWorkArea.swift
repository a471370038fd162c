// Working copies as files in `<directory>/work/`:
//   <ino>.data  sparse; only dirty chunks hold meaningful bytes. Its length is the file's logical
//               size (`setBase` and `truncate` set it; a pwrite past the end extends it).
//   <ino>.map   a 32-byte header, then one byte per chunk index (1 = dirty), each set with a
//               one-byte pwrite so marking is cheap. Header, little endian:
//                 0  magic "UBQWMAP1"
//                 8  u64 flags (bit 0: has a base version)
//                16  i64 base version id (0 when none)
//                24  u64 logical size, as last set by setBase/truncate (informational: the
//                    data file's length is authoritative, since pwrites extend it without
//                    touching the map)
//
// `leftovers()` returns every valid pair (its size = the data file's length, its dirty chunks
// those below that size) and removes malformed or unpaired files.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

enum WorkMap {
    static let magic: [UInt8] = Array("UBQWMAP1".utf8)
    static let headerSize = 32

    static func header(base: VersionID?, size: UInt64) -> [UInt8] {
        var out = magic
        withUnsafeBytes(of: UInt64(base == nil ? 0 : 1).littleEndian) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: (base ?? 0).littleEndian) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: size.littleEndian) { out.append(contentsOf: $0) }
        return out
    }

    /// (base, size) from a header, or nil when malformed.
    static func parse(_ bytes: [UInt8]) -> (base: VersionID?, size: UInt64)? {
        guard bytes.count >= headerSize, Array(bytes[0..<8]) == magic else { return nil }
        return bytes.withUnsafeBytes { raw in
            let flags = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
            let base = Int64(littleEndian: raw.loadUnaligned(fromByteOffset: 16, as: Int64.self))
            let size = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
            guard flags & ~1 == 0 else { return nil }
            return (flags & 1 == 1 ? base : nil, size)
        }
    }
}

public final class LocalWorkArea: WorkArea, Sendable {
    /// `<directory>/work`.
    public let workPath: String
    private let storeLock: StoreLock?

    /// Opens (creating if missing) `<directory>/work`.
    public convenience init(directory: String) throws(StoreError) {
        try self.init(directory: directory, storeLock: nil)
    }

    init(directory: String, storeLock: StoreLock?) throws(StoreError) {
        try makeDirectories(directory)
        let workPath = directory + "/work"
        if try makeDirectory(workPath) {
            try fsyncDirectory(workPath)
            try fsyncDirectory(directory)
        }
        self.workPath = workPath
        self.storeLock = storeLock
    }

    private func dataPath(_ ino: InodeNumber) -> String { "\(workPath)/\(ino).data" }
    private func mapPath(_ ino: InodeNumber) -> String { "\(workPath)/\(ino).map" }

    public func create(ino: InodeNumber) throws(StoreError) -> any WorkFile {
        let data = dataPath(ino), map = mapPath(ino)
        // Unlink first, so the new pair are new files: a WorkFile still open on the old ones
        // keeps its own (and its remove() won't touch the new ones).
        _ = retryEINTR { unlink(data) }
        _ = retryEINTR { unlink(map) }
        let dataFD = retryEINTR { open(data, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600) }
        if dataFD < 0 { throw systemError("create", data, errno) }
        let mapFD = retryEINTR { open(map, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600) }
        if mapFD < 0 {
            let code = errno
            close(dataFD)
            _ = retryEINTR { unlink(data) }
            throw systemError("create", map, code)
        }
        let file = LocalWorkFile(ino: ino, dataFD: dataFD, mapFD: mapFD, dataPath: data, mapPath: map,
                                 workPath: workPath, dirty: [], newlyCreated: true)
        do throws(StoreError) {
            try pwriteFully(mapFD, WorkMap.header(base: nil, size: 0), at: 0, path: map)
        } catch {
            file.remove()
            throw error
        }
        return file
    }

    public func leftovers() throws(StoreError) -> [RecoveredWork] {
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: workPath)
        } catch {
            throw StoreError(errno: EIO, "list \(workPath): \(error)")
        }
        var datas = Set<InodeNumber>(), maps = Set<InodeNumber>()
        for name in names {
            let path = workPath + "/" + name
            var st = stat()
            guard lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { continue }
            if name.hasSuffix(".data"), let ino = InodeNumber(name.dropLast(5)), "\(ino).data" == name {
                datas.insert(ino)
            } else if name.hasSuffix(".map"), let ino = InodeNumber(name.dropLast(4)), "\(ino).map" == name {
                maps.insert(ino)
            } else {
                _ = retryEINTR { unlink(path) }  // not ours
            }
        }
        for ino in datas.symmetricDifference(maps) {  // half a pair: useless
            _ = retryEINTR { unlink(dataPath(ino)) }
            _ = retryEINTR { unlink(mapPath(ino)) }
        }
        var result: [RecoveredWork] = []
        for ino in datas.intersection(maps).sorted() {
            if let work = recover(ino) {
                result.append(work)
            } else {
                _ = retryEINTR { unlink(dataPath(ino)) }
                _ = retryEINTR { unlink(mapPath(ino)) }
            }
        }
        return result
    }

    /// Opens a leftover pair; nil when malformed.
    private func recover(_ ino: InodeNumber) -> RecoveredWork? {
        let data = dataPath(ino), map = mapPath(ino)
        let dataFD = retryEINTR { open(data, O_RDWR | O_CLOEXEC) }
        guard dataFD >= 0 else { return nil }
        let mapFD = retryEINTR { open(map, O_RDWR | O_CLOEXEC) }
        guard mapFD >= 0 else { close(dataFD); return nil }
        var dataStat = stat(), mapStat = stat()
        guard retryEINTR({ fstat(dataFD, &dataStat) }) == 0, retryEINTR({ fstat(mapFD, &mapStat) }) == 0,
              mapStat.st_size >= WorkMap.headerSize else {
            close(dataFD); close(mapFD); return nil
        }
        var bytes = [UInt8](repeating: 0, count: Int(mapStat.st_size))
        let n = bytes.withUnsafeMutableBytes { (try? preadFully(mapFD, $0, at: 0, path: map)) ?? -1 }
        guard n == bytes.count, let header = WorkMap.parse(bytes) else {
            close(dataFD); close(mapFD); return nil
        }
        let size = UInt64(dataStat.st_size)
        let chunks = Int((size + UInt64(chunkSize) - 1) / UInt64(chunkSize))
        var dirty: [Int] = []
        for i in 0..<min(chunks, bytes.count - WorkMap.headerSize) where bytes[WorkMap.headerSize + i] == 1 {
            dirty.append(i)
        }
        let file = LocalWorkFile(ino: ino, dataFD: dataFD, mapFD: mapFD, dataPath: data, mapPath: map,
                                 workPath: workPath, dirty: Set(dirty), newlyCreated: false)
        return RecoveredWork(ino: ino, base: header.base, size: size, dirtyChunks: dirty, file: file)
    }
}

public final class LocalWorkFile: WorkFile, @unchecked Sendable {
    public let ino: InodeNumber
    private let dataFD: Int32
    private let mapFD: Int32
    private let dataPath: String
    private let mapPath: String
    private let workPath: String

    // `mutex` guards `dirty` (chunk indexes already marked in the map, to skip repeated
    // pwrites) and `needsDirectorySync` (the files' names are not yet known durable). The fds
    // are immutable, open for the object's lifetime, and used without the lock.
    private let mutex = StoreMutex()
    private var dirty: Set<Int>
    private var needsDirectorySync: Bool

    init(ino: InodeNumber, dataFD: Int32, mapFD: Int32, dataPath: String, mapPath: String,
         workPath: String, dirty: Set<Int>, newlyCreated: Bool) {
        self.ino = ino; self.dataFD = dataFD; self.mapFD = mapFD
        self.dataPath = dataPath; self.mapPath = mapPath; self.workPath = workPath
        self.dirty = dirty; self.needsDirectorySync = newlyCreated
    }

    deinit {
        close(dataFD)
        close(mapFD)
    }

    public func pread(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) -> Int {
        try preadFully(dataFD, buffer, at: offset, path: dataPath)
    }

    public func pwrite(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError) {
        try pwriteFully(dataFD, bytes, at: offset, path: dataPath)
    }

    public func truncate(to size: Int) throws(StoreError) {
        guard size >= 0 else { throw StoreError(errno: EINVAL, "truncate \(dataPath): negative size \(size)") }
        if retryEINTR({ ftruncate(dataFD, off_t(size)) }) != 0 { throw systemError("truncate", dataPath, errno) }
        try withUnsafeBytes(of: UInt64(size).littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: 24, path: mapPath)
        }
    }

    public func markDirty(_ index: Int) throws(StoreError) {
        guard index >= 0 else { throw StoreError(errno: EINVAL, "mark \(mapPath): negative chunk index \(index)") }
        if mutex.withLock({ dirty.contains(index) }) { return }
        try withUnsafeBytes(of: UInt8(1)) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: WorkMap.headerSize + index, path: mapPath)
        }
        mutex.withLock { _ = dirty.insert(index) }
    }

    public func setBase(_ base: VersionID?, size: UInt64) throws(StoreError) {
        guard size <= UInt64(Int64.max) else { throw StoreError(errno: EFBIG, "set base \(dataPath): size \(size)") }
        try pwriteFully(mapFD, WorkMap.header(base: base, size: size), at: 0, path: mapPath)
        if retryEINTR({ ftruncate(dataFD, off_t(size)) }) != 0 { throw systemError("truncate", dataPath, errno) }
    }

    public func sync() throws(StoreError) {
        try fsyncChecked(dataFD, path: dataPath)
        try fsyncChecked(mapFD, path: mapPath)
        if mutex.withLock({ needsDirectorySync }) {
            try fsyncDirectory(workPath)
            mutex.withLock { needsDirectorySync = false }
        }
    }

    public func remove() {
        // Unlink only if the names still refer to our files (a later create() of the same ino
        // replaced them otherwise).
        for (fd, path) in [(dataFD, dataPath), (mapFD, mapPath)] {
            var mine = stat(), named = stat()
            guard fstat(fd, &mine) == 0, stat(path, &named) == 0,
                  mine.st_dev == named.st_dev, mine.st_ino == named.st_ino else { continue }
            _ = retryEINTR { unlink(path) }
        }
    }
}
