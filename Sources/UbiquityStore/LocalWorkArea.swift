// Working copies as files in `<directory>/work/`:
//   <ino>.data  sparse; only dirty chunks hold meaningful bytes. Its length is the file's logical
//               size (`setBase` and `truncate` set it; a pwrite past the end extends it).
//   <ino>.map   a 64-byte header, then one byte per chunk index (1 = dirty), each set with a
//               one-byte pwrite so marking is cheap. Header, little endian:
//                 0  magic "UBQWMAP2"
//                 8  u64 flags (bit 0: has a base version; bit 1: finished, i.e. its last writer
//                    closed it)
//                16  i64 base version id (0 when none)
//                24  u64 logical size, as last set by setBase/truncate (informational: the
//                    data file's length is authoritative, since pwrites extend it without
//                    touching the map)
//                32  16 bytes: the boot id (/proc/sys/kernel/random/boot_id) when it was made.
//                    The same boot id at recovery means the daemon died but the machine did
//                    not: every byte written is in the page cache, so the copy is whole.
//                48  i64 the document's modification time when it was marked finished
//                56  u64 the inode number (0 in maps made before it was written: any)
//               Maps of the earlier 32-byte format ("UBQWMAP1": no finished bit, no boot id)
//               are still read; such a copy counts as neither finished nor intact.
//
// That single-file format is what daemons made before chunked working copies (map formats 3
// and 4, ChunkedWorkFile.swift); `create` makes format 4 now; all are recovered.
//
// `leftovers()` returns every valid working copy (a single-file one's size = the data file's
// length, its dirty chunks those below that size) and removes malformed or unpaired files.
//
// A daemon also keeps a few emptied maps for reuse, `spare-<n>.map` (see `SpareMaps`), and a
// few empty files made ahead for new chunk files, `spare-<n>.chunk` (see `SpareChunkFiles`);
// recovery removes them with anything else that is not a working copy.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

enum WorkMap {
    static let magic: [UInt8] = Array("UBQWMAP2".utf8)
    static let oldMagic: [UInt8] = Array("UBQWMAP1".utf8)
    /// Chunks in files of their own (ChunkedWorkFile.swift), one byte per chunk.
    static let chunkedMagic: [UInt8] = Array("UBQWMAP3".utf8)
    /// Chunks in files of their own, a slot per chunk with its pages: what `create` makes.
    static let pagedMagic: [UInt8] = Array("UBQWMAP4".utf8)
    static let headerSize = 64
    static let oldHeaderSize = 32
    static let chunkedHeaderSize = 72
    static let pagedHeaderSize = 80
    /// Where a format-4 map's slots start, and their size: a slot never spans two pages of the
    /// map, so each of its writes lands whole or not at all.
    static let slotsAt = 128
    static let slotSize = 128
    /// A slot's halves: the chunk's state now (a state byte, its page set at 32), and at 64 the
    /// same as of the copy's last sync since an fsync marked it, written after the chunk files'
    /// `fdatasync`. After a power cut the synced half is what the disk is known to hold: a
    /// state written later may have reached the disk before the bytes it vouches for.
    static let syncedHalf = 64
    static let pagesAt = 32
    /// A slot's state byte: the chunk is whole in the copy, or some of its pages are.
    static let wholeChunk: UInt8 = 1
    static let someChunkPages: UInt8 = 2
    /// Header fields written on their own.
    static let flagsAt = 8
    static let sizeAt = 24
    static let baseReachAt = 72
    /// Format 4: the page log's epoch (PageLog.swift), 0 while it has none; past the 80 bytes
    /// `pagedHeader` writes, so a map made without it reads 0.
    static let logEpochAt = 80
    static let hasBase: UInt64 = 1
    static let finished: UInt64 = 2
    /// Format 4: an fsync made the copy durable since its base (recovery makes it current).
    static let synced: UInt64 = 4

    struct Header: Equatable {
        var base: VersionID?
        var size: UInt64
        var finished = false
        var synced = false
        var finishedMtime: Int64 = 0
        var boot: [UInt8] = []
        /// The inode the copy is of (0: not recorded). A map whose file name says otherwise is
        /// not trusted (a reused spare whose emptying did not reach the disk).
        var ino: InodeNumber = 0
        /// Where the chunk bytes start.
        var chunksAt = WorkMap.headerSize
        /// A chunked copy's id, which names its chunk files; nil for the single-file formats.
        var copyID: UInt64?
        /// Bytes per chunk in the marks: 1 (a dirty byte), or a format-4 slot.
        var slotSize = 1
        /// Format 4: how much of the base the copy still shows (`RecoveredWork.baseReach`).
        var baseReach: UInt64?
        /// Format 4: the epoch of the page log's batches that count (0: none do).
        var logEpoch: UInt64 = 0
    }

    /// A format-3 header: the format-2 fields and the copy id at 64 (for copies recovered in it).
    static func chunkedHeader(ino: InodeNumber, base: VersionID?, size: UInt64, boot: [UInt8], copyID: UInt64) -> [UInt8] {
        var out = chunkedMagic + header(ino: ino, base: base, size: size, boot: boot).dropFirst(8)
        withUnsafeBytes(of: copyID.littleEndian) { out.append(contentsOf: $0) }
        return out
    }

    /// A format-4 header: the format-2 fields, the copy id at 64, the base's reach at 72.
    static func pagedHeader(ino: InodeNumber, base: VersionID?, size: UInt64, boot: [UInt8], copyID: UInt64,
                            baseReach: UInt64) -> [UInt8] {
        var out = pagedMagic + header(ino: ino, base: base, size: size, boot: boot).dropFirst(8)
        withUnsafeBytes(of: copyID.littleEndian) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: baseReach.littleEndian) { out.append(contentsOf: $0) }
        return out
    }

    static func header(ino: InodeNumber, base: VersionID?, size: UInt64, boot: [UInt8]) -> [UInt8] {
        var out = magic
        withUnsafeBytes(of: (base == nil ? 0 : hasBase).littleEndian) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: (base ?? 0).littleEndian) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: size.littleEndian) { out.append(contentsOf: $0) }
        out += boot.count == 16 ? boot : [UInt8](repeating: 0, count: 16)
        out += [UInt8](repeating: 0, count: 8)   // the finished mark's time
        withUnsafeBytes(of: ino.littleEndian) { out.append(contentsOf: $0) }
        return out
    }

    /// Writes the finished mark (with the document's modification time), or clears it (nil);
    /// `synced` keeps that mark (format 4).
    static func writeFinished(_ mtime: Int64?, hasBase: Bool, synced: Bool = false, mapFD: Int32, mapPath: String) throws(StoreError) {
        if let mtime {
            // The time first: the flag, written after it, vouches for it.
            try withUnsafeBytes(of: mtime.littleEndian) { (raw) throws(StoreError) in
                try pwriteFully(mapFD, raw, at: 48, path: mapPath)
            }
        }
        let flags = (hasBase ? WorkMap.hasBase : 0) | (mtime != nil ? WorkMap.finished : 0) | (synced ? WorkMap.synced : 0)
        try withUnsafeBytes(of: flags.littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: flagsAt, path: mapPath)
        }
    }

    /// The header of a map file's bytes, or nil when malformed.
    static func parse(_ bytes: [UInt8]) -> Header? {
        let paged = bytes.count >= pagedHeaderSize && Array(bytes[0..<8]) == pagedMagic
        let chunked = paged || (bytes.count >= chunkedHeaderSize && Array(bytes[0..<8]) == chunkedMagic)
        let current = chunked || (bytes.count >= headerSize && Array(bytes[0..<8]) == magic)
        let old = bytes.count >= oldHeaderSize && Array(bytes[0..<8]) == oldMagic
        guard current || old else { return nil }
        return bytes.withUnsafeBytes { raw in
            let flags = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
            let base = Int64(littleEndian: raw.loadUnaligned(fromByteOffset: 16, as: Int64.self))
            let size = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
            guard flags & ~(paged ? hasBase | finished | synced : current ? hasBase | finished : hasBase) == 0 else { return nil }
            let mtime = current ? Int64(littleEndian: raw.loadUnaligned(fromByteOffset: 48, as: Int64.self)) : 0
            let ino = current ? UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 56, as: UInt64.self)) : 0
            let copyID = chunked ? UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 64, as: UInt64.self)) : nil
            let reach = paged ? UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 72, as: UInt64.self)) : nil
            let epoch = paged && raw.count >= logEpochAt + 8
                ? UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: logEpochAt, as: UInt64.self)) : 0
            var header = Header(base: flags & hasBase != 0 ? base : nil, size: size, finished: flags & finished != 0,
                          synced: flags & synced != 0, finishedMtime: mtime, boot: current ? Array(bytes[32..<48]) : [], ino: ino,
                          chunksAt: paged ? slotsAt : chunked ? chunkedHeaderSize : current ? headerSize : oldHeaderSize,
                          copyID: copyID, slotSize: paged ? slotSize : 1, baseReach: reach)
            header.logEpoch = epoch
            return header
        }
    }
}

/// This boot's id as text; when the kernel does not say, one of this process's own, so that
/// every start counts as after a restart (the safe side).
let bootIDText: String = currentBootID.map { $0.map { String(format: "%02x", $0) }.joined() }
    ?? "unknown-\(UInt64.random(in: 0...UInt64.max))"

/// This boot's id as 16 bytes, or nil when the kernel does not say.
let currentBootID: [UInt8]? = {
    guard let text = try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8) else { return nil }
    let hex = Array(text.utf8.filter { $0 != UInt8(ascii: "-") && $0 != 0x0A })
    guard hex.count == 32 else { return nil }
    var out: [UInt8] = []
    for i in stride(from: 0, to: 32, by: 2) {
        guard let byte = UInt8(String(decoding: hex[i..<i + 2], as: UTF8.self), radix: 16) else { return nil }
        out.append(byte)
    }
    return out.allSatisfy({ $0 == 0 }) ? nil : out
}()

/// The working copies of one daemon: `<directory>/work/d-<random>/`, with a `lock` file it
/// holds an `flock` on for its lifetime. Several daemons share a store, each in its own folder:
/// a folder whose lock can be taken belongs to a daemon that is gone, and the next one to start
/// recovers it (`leftovers()`), then removes it (`recoveryFinished()`). Pairs directly in `work/`
/// are from the single-writer layout, and are recovered too.
public final class LocalWorkArea: WorkArea, @unchecked Sendable {
    /// `<directory>/work`.
    public let rootPath: String
    /// This daemon's own folder, `<directory>/work/d-<random>`.
    public let workPath: String
    private let ownLock: Int32
    private let storeLock: StoreLock?
    /// The embedded store's space reserve: while it is in use, working copies take no new bytes.
    private let reserve: SpaceReserve?
    // `mutex` guards `adopted`: the folders of gone daemons being recovered, with their locks.
    private let mutex = StoreMutex()
    private var adopted: [(path: String, lock: Int32)] = []
    private var recoveryLock: Int32 = -1   // guarded by mutex
    private let spares: SpareMaps
    private let chunkSpares: SpareChunkFiles

    /// Opens (creating if missing) `<directory>/work` and a folder of this daemon's own in it.
    public convenience init(directory: String) throws(StoreError) {
        try self.init(directory: directory, storeLock: nil)
    }

    init(directory: String, storeLock: StoreLock?, reserve: SpaceReserve? = nil) throws(StoreError) {
        try makeDirectories(directory)
        let rootPath = directory + "/work"
        if try makeDirectory(rootPath) {
            try fsyncDirectory(rootPath)
            try fsyncDirectory(directory)
        }
        var own = ""
        var fd: Int32 = -1
        for _ in 0..<8 where fd < 0 {
            own = rootPath + "/d-" + String(UInt64.random(in: 1...UInt64.max), radix: 16)
            guard try makeDirectory(own) else { continue }   // taken: draw again
            fd = try Self.lockFolder(own)
        }
        guard fd >= 0 else { throw StoreError(errno: EEXIST, "create a working-copy folder in \(rootPath)") }
        try fsyncDirectory(rootPath)
        self.rootPath = rootPath
        self.workPath = own
        self.ownLock = fd
        self.storeLock = storeLock
        self.reserve = reserve
        self.spares = SpareMaps(folder: own)
        self.chunkSpares = SpareChunkFiles(folder: own)
    }

    deinit {
        chunkSpares.close()
        close(ownLock)
        for a in adopted where a.lock >= 0 { close(a.lock) }
        if recoveryLock >= 0 { close(recoveryLock) }
    }

    /// Create `folder/lock` and hold an exclusive flock on it.
    private static func lockFolder(_ folder: String) throws(StoreError) -> Int32 {
        let path = folder + "/lock"
        let fd = retryEINTR { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        if fd < 0 { throw systemError("create", path, errno) }
        if retryEINTR({ flock(fd, LOCK_EX | LOCK_NB) }) != 0 {
            let code = errno
            close(fd)
            throw systemError("flock", path, code)
        }
        return fd
    }

    private static func dataPath(_ folder: String, _ ino: InodeNumber) -> String { "\(folder)/\(ino).data" }
    private static func mapPath(_ folder: String, _ ino: InodeNumber) -> String { "\(folder)/\(ino).map" }

    public func create(ino: InodeNumber) throws(StoreError) -> any WorkFile {
        let map = Self.mapPath(workPath, ino)
        // Unlink first, so the new map is a new file: a WorkFile still open on the old one keeps
        // its own (and its remove() won't touch the new one). Its chunk files have names of
        // their own (the copy id).
        // Under the spares' name lock: a spare kept meanwhile must not take this name's file.
        let mapFD = try spares.withNames { () throws(StoreError) -> Int32 in
            _ = retryEINTR { unlink(map) }
            spares.take(as: map)   // a spare's empty map, renamed in, when there is one
            let fd = retryEINTR { open(map, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600) }
            if fd < 0 { throw systemError("create", map, errno) }
            return fd
        }
        var copyID: UInt64 = 0
        while copyID == 0 { copyID = UInt64.random(in: 1...UInt64.max) }
        let file = ChunkedWorkFile(ino: ino, folder: workPath, copyID: copyID, mapFD: mapFD, mapPath: map, dirty: [],
                                   files: [], newlyCreated: true, base: nil, size: 0, paged: true, baseReach: 0,
                                   reserve: reserve, spares: spares, chunkSpares: chunkSpares)
        do throws(StoreError) {
            try pwriteFully(mapFD, WorkMap.pagedHeader(ino: ino, base: nil, size: 0, boot: currentBootID ?? [], copyID: copyID,
                                                       baseReach: 0),
                            at: 0, path: map)
        } catch {
            file.remove()
            throw error
        }
        return file
    }

    /// The working copies of daemons that are gone: those directly in `work/` (the old layout),
    /// and those in every `d-*` folder whose lock this daemon can take (it keeps the lock until
    /// `recoveryFinished()`, so no other daemon recovers them too). A live daemon's folder is
    /// left alone.
    public func leftovers() throws(StoreError) -> [RecoveredWork] {
        // Pairs in work/ itself and folders without a lock have no owner to lock: one daemon at a
        // time looks at those, under work/recovery.lock, held until recoveryFinished(). If
        // another daemon holds it, that one is recovering them.
        if mutex.withLock({ recoveryLock < 0 }) {
            let path = rootPath + "/recovery.lock"
            let fd = retryEINTR { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
            if fd < 0 { throw systemError("create", path, errno) }
            if retryEINTR({ flock(fd, LOCK_EX | LOCK_NB) }) == 0 {
                mutex.withLock { recoveryLock = fd }
            } else {
                close(fd)
            }
        }
        let unowned = mutex.withLock { recoveryLock >= 0 }
        var result = unowned ? try scan(rootPath) : []
        let names: [String]
        do { names = try FileManager.default.contentsOfDirectory(atPath: rootPath) } catch {
            throw StoreError(errno: EIO, "list \(rootPath): \(error)")
        }
        for name in names.sorted() where name.hasPrefix("d-") {
            let folder = rootPath + "/" + name
            guard folder != workPath else { continue }
            if mutex.withLock({ adopted.contains { $0.path == folder } }) {
                result += try scan(folder)   // already taken by an earlier call
                continue
            }
            var st = stat()
            guard lstat(folder, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else { continue }
            let fd = retryEINTR { open(folder + "/lock", O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
            if fd < 0 {
                // A folder without its lock: a daemon that died while making it, or one making
                // it right now; only an old one is taken.
                guard unowned, Int64(st.st_mtim.tv_sec) < Int64(time(nil)) - 60 else { continue }
                result += try scan(folder)
                mutex.withLock { adopted.append((folder, -1)) }
                continue
            }
            guard retryEINTR({ flock(fd, LOCK_EX | LOCK_NB) }) == 0 else {
                close(fd)   // its daemon is alive
                continue
            }
            // Another daemon may have recovered and removed the folder between our open and
            // our flock: then the lock we hold is of a file that is gone.
            var held = stat(), named = stat()
            guard fstat(fd, &held) == 0, lstat(folder + "/lock", &named) == 0,
                  held.st_ino == named.st_ino, held.st_dev == named.st_dev else {
                close(fd)
                continue
            }
            mutex.withLock { adopted.append((folder, fd)) }
            result += try scan(folder)
        }
        return result
    }

    public var bootID: String { bootIDText }

    /// Whether another daemon holds its folder's lock now.
    public func otherWritersAlive() -> Bool {
        let taken = mutex.withLock { Set(adopted.map(\.path)) }
        return Self.daemonRunning(in: rootPath, except: taken.union([workPath]))
    }

    /// Whether a daemon holds the lock of a folder of `root` (a store's `work/`) now, other than
    /// those in `except`: every daemon that writes to the store has one while it runs.
    static func daemonRunning(in root: String, except: Set<String> = []) -> Bool {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: root) else { return false }
        for name in names where name.hasPrefix("d-") {
            let folder = root + "/" + name
            guard !except.contains(folder) else { continue }
            let fd = retryEINTR { open(folder + "/lock", O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
            guard fd >= 0 else { continue }
            defer { close(fd) }
            // Probe with a shared lock: fails only while its daemon holds the exclusive one.
            if retryEINTR({ flock(fd, LOCK_SH | LOCK_NB) }) != 0 { return true }
            _ = flock(fd, LOCK_UN)
        }
        return false
    }

    /// This daemon's own working copies (for tests and checks; recovery never takes them).
    func ownCopies() throws(StoreError) -> [RecoveredWork] { try scan(workPath, keepingSpares: true) }

    /// Remove the folders of gone daemons once their working copies are recovered.
    public func recoveryFinished() {
        let folders = mutex.withLock { () -> [(path: String, lock: Int32)] in
            defer { adopted = [] }
            return adopted
        }
        for (folder, lock) in folders {
            if let names = try? FileManager.default.contentsOfDirectory(atPath: folder) {
                for name in names where name == "lock" || name.hasSuffix(".data") || name.hasSuffix(".map") || Self.chunkFileName(name) != nil
                    || Self.logFileName(name) != nil || name.hasPrefix(SpareMaps.prefix) {
                    _ = retryEINTR { unlink(folder + "/" + name) }
                }
            }
            _ = retryEINTR { rmdir(folder) }
            if lock >= 0 { close(lock) }
        }
        if !folders.isEmpty { try? fsyncDirectory(rootPath) }
        let fd = mutex.withLock { () -> Int32 in
            defer { recoveryLock = -1 }
            return recoveryLock
        }
        if fd >= 0 { close(fd) }
    }

    /// A chunked copy's chunk file name: `<ino>.<copy id, hex>.<index>`.
    static func chunkFileName(_ name: String) -> (ino: InodeNumber, copyID: UInt64, index: Int)? {
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let ino = InodeNumber(parts[0]), let copyID = UInt64(parts[1], radix: 16),
              let index = Int(parts[2]), index >= 0,
              ChunkedWorkFile.chunkName(ino: ino, copyID: copyID, index: index) == name else { return nil }
        return (ino, copyID, index)
    }

    /// A synced copy's page log name: `<ino>.<copy id, hex>.log`.
    static func logFileName(_ name: String) -> (ino: InodeNumber, copyID: UInt64)? {
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[2] == "log", let ino = InodeNumber(parts[0]), let copyID = UInt64(parts[1], radix: 16),
              ChunkedWorkFile.logName(ino: ino, copyID: copyID) == name else { return nil }
        return (ino, copyID)
    }

    /// Opens a copy's page log (kept until a full sync retires it) and, for a synced copy the
    /// machine stopped under, reads its whole batches of the map's epoch: what the fsyncs after
    /// its first made durable. Nil batches: the log could not be read.
    private func readLog(_ name: String?, in folder: String, header: WorkMap.Header,
                         intact: Bool) -> (log: (fd: Int32, end: Int, epoch: UInt64)?, batches: [PageLog.Batch]?) {
        guard let name else { return (nil, []) }
        let path = folder + "/" + name
        let fd = retryEINTR { open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { return (nil, []) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { close(fd); return (nil, []) }
        let log = (fd: fd, end: Int(st.st_size), epoch: header.logEpoch)
        guard header.synced, !intact, header.logEpoch != 0, st.st_size > 0 else { return (log, []) }
        let count = min(Int(st.st_size), PageLog.limit + PageLog.growth)
        guard let bytes = try? preadFully(fd, count: count, at: 0, path: path) else { return (log, nil) }
        return (log, PageLog.decode(bytes, epoch: header.logEpoch))
    }

    /// Every valid working copy in `folder` (a map with its data file, or a chunked map with its
    /// chunk files); malformed, unpaired and unclaimed files are removed.
    private func scan(_ folder: String, keepingSpares: Bool = false) throws(StoreError) -> [RecoveredWork] {
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: folder)
        } catch {
            throw StoreError(errno: EIO, "list \(folder): \(error)")
        }
        var datas = Set<InodeNumber>(), maps = Set<InodeNumber>()
        var chunkFiles: [InodeNumber: [(copyID: UInt64, index: Int, name: String)]] = [:]
        var logs: [InodeNumber: [(copyID: UInt64, name: String)]] = [:]
        for name in names {
            let path = folder + "/" + name
            var st = stat()
            guard lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { continue }
            if name.hasSuffix(".data"), let ino = InodeNumber(name.dropLast(5)), "\(ino).data" == name {
                datas.insert(ino)
            } else if name.hasSuffix(".map"), let ino = InodeNumber(name.dropLast(4)), "\(ino).map" == name {
                maps.insert(ino)
            } else if let c = Self.chunkFileName(name) {
                chunkFiles[c.ino, default: []].append((c.copyID, c.index, name))
            } else if let l = Self.logFileName(name) {
                logs[l.ino, default: []].append((l.copyID, name))
            } else if name != "lock" && !(keepingSpares && name.hasPrefix(SpareMaps.prefix)) {
                _ = retryEINTR { unlink(path) }  // not ours
            }
        }
        var result: [RecoveredWork] = []
        for ino in maps.sorted() {
            if let work = recover(ino, in: folder, hasData: datas.contains(ino), chunkFiles: chunkFiles[ino] ?? [],
                                  logs: logs[ino] ?? []) {
                result.append(work)
                // Its own chunk files and log stay; another copy's of the same inode go below.
                let own = (work.file as? ChunkedWorkFile)?.copyID
                chunkFiles[ino]?.removeAll { $0.copyID == own }
                logs[ino]?.removeAll { $0.copyID == own }
                if own == nil { datas.remove(ino) }
            } else {
                _ = retryEINTR { unlink(Self.mapPath(folder, ino)) }
            }
        }
        // Data files without a single-file map, chunk files no map claims: useless.
        for ino in datas { _ = retryEINTR { unlink(Self.dataPath(folder, ino)) } }
        for (_, files) in chunkFiles { for f in files { _ = retryEINTR { unlink(folder + "/" + f.name) } } }
        for (_, files) in logs { for f in files { _ = retryEINTR { unlink(folder + "/" + f.name) } } }
        return result
    }

    /// Opens a leftover working copy whose map is `<ino>.map`; nil when malformed. A chunked
    /// map claims the chunk files of its copy id (the others are left for the caller to remove).
    private func recover(_ ino: InodeNumber, in folder: String, hasData: Bool,
                         chunkFiles: [(copyID: UInt64, index: Int, name: String)],
                         logs: [(copyID: UInt64, name: String)] = []) -> RecoveredWork? {
        let map = Self.mapPath(folder, ino)
        let mapFD = retryEINTR { open(map, O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
        guard mapFD >= 0 else { return nil }
        var mapStat = stat()
        guard retryEINTR({ fstat(mapFD, &mapStat) }) == 0, mapStat.st_size >= WorkMap.oldHeaderSize else {
            close(mapFD); return nil
        }
        var bytes = [UInt8](repeating: 0, count: Int(mapStat.st_size))
        let n = bytes.withUnsafeMutableBytes { (try? preadFully(mapFD, $0, at: 0, path: map)) ?? -1 }
        guard n == bytes.count, let header = WorkMap.parse(bytes), header.ino == 0 || header.ino == ino else {
            close(mapFD); return nil
        }
        let intact = currentBootID != nil && header.boot == currentBootID
        // A synced copy the machine stopped under: only the states its last sync made durable.
        let half = header.synced && !intact ? WorkMap.syncedHalf : 0
        /// The chunks below `size` whose mark is `state`.
        func marked(_ state: UInt8, below size: UInt64) -> [Int] {
            let chunks = Int((size + UInt64(chunkSize) - 1) / UInt64(chunkSize))
            let recorded = max(0, bytes.count - header.chunksAt - half + header.slotSize - 1) / header.slotSize
            return (0..<min(chunks, recorded)).filter { bytes[header.chunksAt + $0 * header.slotSize + half] == state }
        }
        func dirtyBelow(_ size: UInt64) -> [Int] { marked(WorkMap.wholeChunk, below: size) }
        guard let copyID = header.copyID else {
            guard hasData else { close(mapFD); return nil }
            return recoverSingleFile(ino, in: folder, mapFD: mapFD, header: header, dirtyBelow: dirtyBelow, intact: intact)
        }
        // Chunked: the size is the header's or the furthest chunk file's end.
        var dataEnd: UInt64 = 0
        var files = Set<Int>()
        var newest = Int64(mapStat.st_mtim.tv_sec) * 1_000_000_000 + Int64(mapStat.st_mtim.tv_nsec)
        for f in chunkFiles where f.copyID == copyID {
            var st = stat()
            guard lstat(folder + "/" + f.name, &st) == 0 else { continue }
            files.insert(f.index)
            if st.st_size > 0 { dataEnd = max(dataEnd, UInt64(f.index * chunkSize) + UInt64(st.st_size)) }
            newest = max(newest, Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec))
        }
        let (log, batches) = readLog(logs.first { $0.copyID == copyID }?.name, in: folder, header: header, intact: intact)
        var logged: [Int: PageSet] = [:]
        for batch in batches ?? [] {
            for page in batch.pages { logged[page.chunk, default: PageSet()].insert(page.page) }
            // The size an fsync logged: what the chunk files hold may end before it.
            dataEnd = max(dataEnd, batch.size)
        }
        let size = max(header.size, dataEnd)
        let dirty = dirtyBelow(size)
        var partial: [Int: PageSet] = [:]
        if header.slotSize == WorkMap.slotSize {
            for index in marked(WorkMap.someChunkPages, below: size) {
                let at = header.chunksAt + index * header.slotSize + half + WorkMap.pagesAt
                let pages = PageSet(bytes[at..<min(bytes.count, at + 32)])
                if !pages.isEmpty { partial[index] = pages }
            }
        }
        let file = ChunkedWorkFile(ino: ino, folder: folder, copyID: copyID, mapFD: mapFD, mapPath: map, dirty: Set(dirty),
                                   files: files, newlyCreated: false, base: header.base, size: header.size, dataEnd: dataEnd,
                                   paged: header.slotSize == WorkMap.slotSize, baseReach: header.baseReach,
                                   finished: header.finished, synced: header.synced, reserve: reserve, log: log)
        // Pages the log made durable are the copy's, over the base's.
        var restored = batches != nil
        if let batches, !batches.isEmpty {
            do { try file.restore(batches) } catch { restored = false }
        }
        for (index, pages) in logged where !dirty.contains(index) && UInt64(index * chunkSize) < size {
            partial[index, default: PageSet()].formUnion(pages)
        }
        var work = RecoveredWork(ino: ino, base: header.base, size: size, dirtyChunks: dirty, file: file,
                                 finished: header.finished, intact: intact, modified: header.finished ? header.finishedMtime : newest)
        work.partialChunks = partial
        work.baseReach = header.baseReach
        // A log that could not be applied: the copy is kept as a version, not made current.
        work.synced = header.synced && restored
        return work
    }

    /// A single-file working copy (map formats 1 and 2, from before chunked copies).
    private func recoverSingleFile(_ ino: InodeNumber, in folder: String, mapFD: Int32, header: WorkMap.Header,
                                   dirtyBelow: (UInt64) -> [Int], intact: Bool) -> RecoveredWork? {
        let data = Self.dataPath(folder, ino), map = Self.mapPath(folder, ino)
        let dataFD = retryEINTR { open(data, O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
        guard dataFD >= 0 else { close(mapFD); return nil }
        var dataStat = stat()
        guard retryEINTR({ fstat(dataFD, &dataStat) }) == 0 else { close(dataFD); close(mapFD); return nil }
        let size = UInt64(dataStat.st_size)
        let dirty = dirtyBelow(size)
        let file = LocalWorkFile(ino: ino, dataFD: dataFD, mapFD: mapFD, dataPath: data, mapPath: map,
                                 workPath: folder, dirty: Set(dirty), newlyCreated: false, base: header.base,
                                 chunksAt: header.chunksAt, reserve: reserve)
        let modified = header.finished ? header.finishedMtime
            : Int64(dataStat.st_mtim.tv_sec) * 1_000_000_000 + Int64(dataStat.st_mtim.tv_nsec)
        return RecoveredWork(ino: ino, base: header.base, size: size, dirtyChunks: dirty, file: file,
                             finished: header.finished, intact: intact, modified: modified)
    }
}

public final class LocalWorkFile: WorkFile, @unchecked Sendable {
    public let ino: InodeNumber
    /// Where its map is (for tests).
    var mapFilePath: String { mapPath }
    private let dataFD: Int32
    private let mapFD: Int32
    private let dataPath: String
    private let mapPath: String
    private let workPath: String

    /// Offset of the chunk bytes in the map (an old-format map keeps its layout).
    private let chunksAt: Int
    private let reserve: SpaceReserve?

    // `mutex` guards `dirty` (chunk indexes already marked in the map, to skip repeated
    // pwrites), `needsDirectorySync` (the files' names are not yet known durable) and `hasBase`
    // (for rewriting the flags word). The fds are immutable, open for the object's lifetime, and
    // used without the lock.
    private let mutex = StoreMutex()
    private var dirty: Set<Int>
    private var needsDirectorySync: Bool
    private var hasBase: Bool

    init(ino: InodeNumber, dataFD: Int32, mapFD: Int32, dataPath: String, mapPath: String,
         workPath: String, dirty: Set<Int>, newlyCreated: Bool, base: VersionID?, chunksAt: Int = WorkMap.headerSize,
         reserve: SpaceReserve?) {
        self.ino = ino; self.dataFD = dataFD; self.mapFD = mapFD
        self.reserve = reserve
        self.dataPath = dataPath; self.mapPath = mapPath; self.workPath = workPath
        self.dirty = dirty; self.needsDirectorySync = newlyCreated
        self.hasBase = base != nil
        self.chunksAt = chunksAt
    }

    deinit {
        close(dataFD)
        close(mapFD)
    }

    public func pread(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) -> Int {
        try preadFully(dataFD, buffer, at: offset, path: dataPath)
    }

    public func pwrite(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError) {
        try reserve?.checkRoom(for: "write \(dataPath)")
        try pwriteFully(dataFD, bytes, at: offset, path: dataPath)
    }

    public func truncate(to size: Int) throws(StoreError) {
        guard size >= 0 else { throw StoreError(errno: EINVAL, "truncate \(dataPath): negative size \(size)") }
        var st = stat()
        if let reserve, reserve.isReleased, fstat(dataFD, &st) != 0 || Int(st.st_size) < size {   // a shrink needs no room
            try reserve.checkRoom(for: "truncate \(dataPath)")
        }
        if retryEINTR({ ftruncate(dataFD, off_t(size)) }) != 0 { throw systemError("truncate", dataPath, errno) }
        try withUnsafeBytes(of: UInt64(size).littleEndian) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: 24, path: mapPath)
        }
    }

    public func markDirty(_ index: Int) throws(StoreError) {
        guard index >= 0 else { throw StoreError(errno: EINVAL, "mark \(mapPath): negative chunk index \(index)") }
        if mutex.withLock({ dirty.contains(index) }) { return }
        try withUnsafeBytes(of: UInt8(1)) { (raw) throws(StoreError) in
            try pwriteFully(mapFD, raw, at: chunksAt + index, path: mapPath)
        }
        mutex.withLock { _ = dirty.insert(index) }
    }

    public func setBase(_ base: VersionID?, size: UInt64) throws(StoreError) {
        guard size <= UInt64(Int64.max) else { throw StoreError(errno: EFBIG, "set base \(dataPath): size \(size)") }
        // setBase comes first on a new working copy, so an old-format map is never rewritten.
        try pwriteFully(mapFD, WorkMap.header(ino: ino, base: base, size: size, boot: currentBootID ?? []), at: 0, path: mapPath)
        mutex.withLock { hasBase = base != nil }
        if retryEINTR({ ftruncate(dataFD, off_t(size)) }) != 0 { throw systemError("truncate", dataPath, errno) }
    }

    public func setFinished(mtime: Int64?) throws(StoreError) {
        guard chunksAt == WorkMap.headerSize else { return }   // an old-format map has no such bit
        try WorkMap.writeFinished(mtime, hasBase: mutex.withLock { hasBase }, mapFD: mapFD, mapPath: mapPath)
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

/// Emptied working-copy maps kept for reuse in a daemon's folder. A working copy is made and
/// removed at each edit of a file (every `echo line >> f`), and on ext4 a new file's inode
/// allocation looks past every recently deleted inode of its group: with files made and deleted
/// at that pace, it took 60% of the daemon's CPU. A rename reuses the inodes instead. (Chunk
/// files are never reused: a published one lives on as its blob.)
final class SpareMaps: @unchecked Sendable {
    static let prefix = "spare-"
    /// Maps kept at most (more open files than this at once make and delete maps as before).
    static let kept = 16
    private let folder: String
    private let mutex = StoreMutex()
    private var free: [Int] = []   // guarded by mutex: spares whose file is there
    private var taken = Set<Int>()   // guarded by mutex: numbers being filled or emptied
    /// Held across a check of a working copy's map name and what is done to it (`create`,
    /// `keep`): with two documents of one inode (a discarded one, a reopened one) a later
    /// create's map must not be moved into the pool. Taken before `mutex`.
    private let names = StoreMutex()

    init(folder: String) { self.folder = folder }

    func withNames<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try names.withLock(body)
    }

    private func path(_ n: Int) -> String { "\(folder)/\(Self.prefix)\(n).map" }

    /// Rename a spare map to `map` (a free name), if there is one. Until its header is written,
    /// an empty map is no working copy at all. Caller holds `withNames`.
    func take(as map: String) {
        guard let n = mutex.withLock({ () -> Int? in
            guard let n = free.popLast() else { return nil }
            taken.insert(n)
            return n
        }) else { return }
        if rename(path(n), map) != 0 { _ = unlink(path(n)) }
        mutex.withLock { _ = taken.remove(n) }
    }

    /// Empty a published working copy's map (`fd` open on the file `path` names) and keep it as
    /// a spare; false when the pool is full or the name no longer refers to this file (the
    /// caller then deletes what is still its own).
    func keep(map: (fd: Int32, path: String)) -> Bool {
        names.withLock { keepLocked(map: map) }
    }

    /// Relies on the file system keeping metadata changes in order across a power cut (ext4,
    /// XFS): the truncation is before the rename, and a map that comes back with another
    /// working copy's bytes says another inode anyway.
    private func keepLocked(map: (fd: Int32, path: String)) -> Bool {
        var mine = stat(), named = stat()
        guard fstat(map.fd, &mine) == 0, stat(map.path, &named) == 0, mine.st_dev == named.st_dev, mine.st_ino == named.st_ino else {
            return false
        }
        guard let n = mutex.withLock({ () -> Int? in
            guard free.count + taken.count < Self.kept else { return nil }
            let n = (0..<Self.kept).first { !free.contains($0) && !taken.contains($0) }
            if let n { taken.insert(n) }
            return n
        }) else { return false }
        // Emptied first: from then on recovery sees no working copy here.
        let kept = retryEINTR({ ftruncate(map.fd, 0) }) == 0 && rename(map.path, path(n)) == 0
        mutex.withLock {
            taken.remove(n)
            if kept { free.append(n) }
        }
        if !kept { _ = unlink(path(n)) }
        return kept
    }
}

/// Empty files made ahead, on a background queue, for working copies' new chunk files. Every
/// chunk a write starts is a new inode (a published chunk file lives on as its blob: none is
/// reused), and on an ext4 without a journal an inode's allocation looks past every inode its
/// group freed in the last minutes, which retention's pruned blobs keep supplying: 0.15 to
/// 0.5 ms on this kind of disk, paid by the write that starts the chunk (each `echo line >> f`,
/// each fsync'd 4 KiB write to a chunk not yet touched). Taking a spare is a rename. The files
/// are not held open: an idle daemon keeps a few empty files, no descriptors.
final class SpareChunkFiles: @unchecked Sendable {
    static let suffix = ".chunk"
    /// Spares made ahead at most.
    static let kept = 8
    private let folder: String
    // `mutex` guards everything below; it is never held across a system call.
    private let mutex = StoreMutex()
    private var free: [UInt64] = []
    private var made: UInt64 = 0
    private var filling = false
    private var closed = false
    private static let queue = DispatchQueue(label: "ubiquityfs.spare-chunk-files", qos: .utility)

    init(folder: String) { self.folder = folder }

    private func path(_ n: UInt64) -> String { "\(folder)/\(SpareMaps.prefix)\(n)\(Self.suffix)" }

    /// Renames a spare to `target` and opens it; -1 when there is none, and the caller makes the
    /// file as before. Any take starts a refill: the first chunk a daemon writes starts the pool.
    func take(as target: String) -> Int32 {
        let (n, fill) = mutex.withLock { () -> (UInt64?, Bool) in
            let n = free.popLast()
            let fill = !filling && !closed && free.count < Self.kept
            if fill { filling = true }
            return (n, fill)
        }
        if fill { Self.queue.async { self.fill() } }
        guard let n else { return -1 }
        let spare = path(n)
        guard rename(spare, target) == 0 else {
            _ = retryEINTR { unlink(spare) }
            return -1
        }
        // Still empty: spares are made in this daemon's own folder and nothing writes them.
        return retryEINTR { open(target, O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
    }

    private func fill() {
        while true {
            let n = mutex.withLock { () -> UInt64? in
                guard !closed, free.count < Self.kept else { filling = false; return nil }
                made += 1
                return made
            }
            guard let n else { return }
            let fd = retryEINTR { open(path(n), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
            guard fd >= 0 else {
                // A full disk, the folder gone: writes make their files themselves meanwhile.
                mutex.withLock { filling = false }
                return
            }
            Glibc.close(fd)
            let kept = mutex.withLock { () -> Bool in
                if closed { return false }
                free.append(n)
                return true
            }
            if !kept { _ = retryEINTR { unlink(path(n)) } }
        }
    }

    /// The work area goes away: no more spares, and those made are removed.
    func close() {
        let left = mutex.withLock { () -> [UInt64] in
            closed = true
            defer { free = [] }
            return free
        }
        for n in left { _ = retryEINTR { unlink(path(n)) } }
    }
}
