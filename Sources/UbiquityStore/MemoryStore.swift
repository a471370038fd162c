// In-memory backing store for model tests: the same semantics as the embedded one (atomic
// batches, ids never reused, versions immutable, working copies that survive a "crash" until
// removed), plus hooks to simulate a power cut and a corrupt blob.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A fresh, empty in-memory backing store.
public func makeMemoryStore() -> BackingStore {
    BackingStore(metadata: MemoryMetadataStore(), blobs: MemoryBlobStore(), work: MemoryWorkArea(),
                 locks: MemoryLockTable())
}

// MARK: - Metadata

public final class MemoryMetadataStore: MetadataStore, @unchecked Sendable {
    struct DirentKey: Hashable {
        var parent: InodeNumber
        var name: [UInt8]
    }
    struct XattrKey: Hashable {
        var ino: InodeNumber
        var name: [UInt8]
    }
    struct State {
        var nodes: [InodeNumber: NodeRecord] = [:]
        var dirents: [DirentKey: InodeNumber] = [:]
        var xattrs: [XattrKey: [UInt8]] = [:]
        var versions: [VersionID: VersionRecord] = [:]
        var containers: [String: ContainerRecord] = [:]
        var meta: [String: String] = [:]
        var maxIno: InodeNumber = 0
        var maxVersion: VersionID = 0
        var nodeChanges: [InodeNumber: ChangeSeq] = [:]
        /// Records after `trimmedThrough`: record n is at index n - trimmedThrough - 1.
        var log: [ChangeRecord] = []
        var trimmedThrough: ChangeSeq = 0
        var seq: ChangeSeq = 0
    }

    // `mutex` guards `state` (what is committed), `durableState` (what survives a simulated
    // power cut: the state as of the last durable commit) and the counters.
    private let mutex = StoreMutex()
    private var state = State()
    private var durableState = State()
    private var commits = 0
    private var durableCommits = 0

    public init() {}

    /// Successful commits so far, and how many of them were durable (for model tests).
    public var commitCounts: (all: Int, durable: Int) { mutex.withLock { (commits, durableCommits) } }

    /// Forget every commit since the last durable one, as a power cut may (the worst case).
    public func simulatePowerCut() {
        mutex.withLock { state = durableState }
    }

    public func load() throws(StoreError) -> StoreSnapshot {
        let s = mutex.withLock { state }
        var snapshot = StoreSnapshot()
        snapshot.nodes = s.nodes.values.sorted { $0.ino < $1.ino }
        snapshot.dirents = s.dirents
            .map { DirentRecord(parent: $0.key.parent, name: $0.key.name, child: $0.value) }
            .sorted { $0.parent != $1.parent ? $0.parent < $1.parent : $0.name.lexicographicallyPrecedes($1.name) }
        snapshot.xattrs = s.xattrs
            .map { XattrRecord(ino: $0.key.ino, name: $0.key.name, value: $0.value) }
            .sorted { $0.ino != $1.ino ? $0.ino < $1.ino : $0.name.lexicographicallyPrecedes($1.name) }
        snapshot.containers = s.containers.values.sorted { $0.identifier < $1.identifier }
        snapshot.currentVersions = s.nodes.values
            .compactMap { $0.currentVersion.flatMap { s.versions[$0] } }
            .sorted { $0.id < $1.id }
        snapshot.meta = s.meta
        snapshot.maxIno = s.maxIno
        snapshot.maxVersion = s.maxVersion
        snapshot.seq = s.seq
        snapshot.nodeChangeSeqs = snapshot.nodes.map { s.nodeChanges[$0.ino] ?? 0 }
        return snapshot
    }

    private static func holds(_ e: Expectation, in s: State) -> Bool {
        switch e {
        case .nameFree(let parent, let name): return s.dirents[DirentKey(parent: parent, name: name)] == nil
        case .nameIs(let parent, let name, let child): return s.dirents[DirentKey(parent: parent, name: name)] == child
        case .nodeAt(let ino, let change): return s.nodes[ino] != nil && s.nodeChanges[ino, default: 0] == change
        case .containerRoot(let identifier, let root): return s.containers[identifier]?.rootIno == root
        case .metaIs(let key, let value): return s.meta[key] == value
        }
    }

    public func commit(_ batch: Batch, durable: Bool) throws(StoreError) -> ChangeSeq {
        try mutex.withLock { () throws(StoreError) -> ChangeSeq in
            if let failed = batch.expectations.first(where: { !Self.holds($0, in: state) }) {
                throw StoreError(.conflict, "memory store: expected \(failed), which no longer holds")
            }
            guard !batch.mutations.isEmpty else {
                // Counted: an empty batch is a barrier (durable) or at least a round trip.
                commits += 1
                if durable {
                    durableState = state
                    durableCommits += 1
                }
                return state.seq
            }
            var s = state  // applied to a copy: a failing mutation leaves `state` untouched
            let seq = s.seq + 1
            for mutation in batch.mutations {
                switch mutation {
                case .putNode(let n):
                    s.nodes[n.ino] = n
                    s.nodeChanges[n.ino] = seq
                    s.maxIno = max(s.maxIno, n.ino)
                case .deleteNode(let ino):
                    s.nodes[ino] = nil
                    s.nodeChanges[ino] = nil
                    s.xattrs = s.xattrs.filter { $0.key.ino != ino }
                    s.versions = s.versions.filter { $0.value.ino != ino }
                case .putDirent(let d):
                    s.dirents[DirentKey(parent: d.parent, name: d.name)] = d.child
                case .deleteDirent(let parent, let name):
                    s.dirents[DirentKey(parent: parent, name: name)] = nil
                case .putXattr(let x):
                    s.xattrs[XattrKey(ino: x.ino, name: x.name)] = x.value
                case .deleteXattr(let ino, let name):
                    s.xattrs[XattrKey(ino: ino, name: name)] = nil
                case .putVersion(let v):
                    // Same errno as the SQLite store's constraint violation.
                    guard s.versions[v.id] == nil else {
                        throw StoreError(errno: EIO, "memory store: version \(v.id) already exists")
                    }
                    s.versions[v.id] = v
                    s.maxVersion = max(s.maxVersion, v.id)
                case .putContainer(let c):
                    s.containers[c.identifier] = c
                case .deleteVersion(let id):
                    s.versions[id] = nil
                case .moveVersions(let from, let to):
                    for (id, v) in s.versions where v.ino == from {
                        s.versions[id]!.ino = to
                        if v.movedFrom == nil { s.versions[id]!.movedFrom = from }
                    }
                case .setMeta(let key, let value):
                    s.meta[key] = value
                case .deleteMeta(let key):
                    s.meta[key] = nil
                }
            }
            s.seq = seq
            s.log.append(ChangeRecord(seq: seq, writer: batch.writer, mutations: batch.mutations))
            state = s
            commits += 1
            if durable {
                durableState = s
                durableCommits += 1
            }
            return seq
        }
    }

    public func changes(since seq: ChangeSeq) throws(StoreError) -> [ChangeRecord] {
        try mutex.withLock { () throws(StoreError) -> [ChangeRecord] in
            if seq < state.trimmedThrough {
                throw StoreError(.trimmed, "memory store: the change log was trimmed through \(state.trimmedThrough), past \(seq)")
            }
            // Sequence numbers are dense here.
            let from = max(0, Int(seq - state.trimmedThrough))
            return from < state.log.count ? Array(state.log[from...]) : []
        }
    }

    public func trimChanges(keepingLast count: Int) throws(StoreError) {
        mutex.withLock {
            let drop = state.log.count - count
            guard drop > 0 else { return }
            state.log.removeFirst(drop)
            state.trimmedThrough += ChangeSeq(drop)
            // Not durable by itself (as in the embedded store, where it is an ordinary commit):
            // a power cut before the next durable commit brings the records back.
        }
    }

    public func reserveInodes(_ count: Int) throws(StoreError) -> ClosedRange<InodeNumber> {
        precondition(count > 0)
        return mutex.withLock {
            // Inode 1 is the mount root (FUSE_ROOT_ID): store nodes start at 2.
            let first = max(state.maxIno, 1) + 1
            state.maxIno = first + InodeNumber(count) - 1
            durableState.maxIno = max(durableState.maxIno, state.maxIno)   // reservations are never handed out twice
            return first...state.maxIno
        }
    }

    public func reserveVersions(_ count: Int) throws(StoreError) -> ClosedRange<VersionID> {
        precondition(count > 0)
        return mutex.withLock {
            let first = state.maxVersion + 1
            state.maxVersion = first + VersionID(count) - 1
            durableState.maxVersion = max(durableState.maxVersion, state.maxVersion)
            return first...state.maxVersion
        }
    }

    public func versions(of ino: InodeNumber) throws(StoreError) -> [VersionRecord] {
        mutex.withLock { state.versions.values.filter { $0.ino == ino }.sorted { $0.id < $1.id } }
    }

    public func versionCount(of ino: InodeNumber) throws(StoreError) -> Int {
        mutex.withLock { state.versions.values.count { $0.ino == ino } }
    }

    public func allVersions() throws(StoreError) -> [VersionRecord] {
        mutex.withLock { state.versions.values.sorted { $0.id < $1.id } }
    }

    public func versions(withOrigin origin: VersionOrigin) throws(StoreError) -> [VersionRecord] {
        mutex.withLock { state.versions.values.filter { $0.origin == origin }.sorted { $0.id < $1.id } }
    }

    public func version(_ id: VersionID) throws(StoreError) -> VersionRecord? {
        mutex.withLock { state.versions[id] }
    }

    public func referencedBlobs() throws(StoreError) -> Set<BlobID> {
        mutex.withLock { Set(state.versions.values.flatMap { $0.chunks.filter { !$0.isHole }.map(\.blob) }) }
    }

    public func capacity() -> StoreCapacity {
        StoreCapacity(blockSize: 4096, totalBlocks: 1 << 24, freeBlocks: 1 << 23, availableBlocks: 1 << 23,
                      totalFiles: 1 << 20, freeFiles: 1 << 19)
    }
}

// MARK: - Blobs

public final class MemoryBlobStore: BlobStore, @unchecked Sendable {
    // `mutex` guards `blobs` and `unsynced` (blobs written non-durably since the last syncAll).
    private let mutex = StoreMutex()
    private var blobs: [BlobID: [UInt8]] = [:]
    private var written: [BlobID: Int64] = [:]
    private var unsynced: Set<BlobID> = []

    public init() {}

    /// Ids of the blobs stored now.
    public var blobIDs: Set<BlobID> { mutex.withLock { Set(blobs.keys) } }

    /// Lose every blob written non-durably since the last `syncAll()`, as a power cut may.
    public func simulatePowerCut() {
        mutex.withLock {
            for id in unsynced { blobs[id] = nil }
            unsynced = []
        }
    }

    /// Replace a blob's bytes behind the store's back (to test `verify` and recovery).
    public func corrupt(_ blob: BlobID, with bytes: [UInt8]) {
        mutex.withLock { if blobs[blob] != nil { blobs[blob] = bytes } }
    }

    public func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef {
        guard bytes.count <= chunkSize else {
            throw StoreError(errno: EINVAL, "blob of \(bytes.count) bytes is larger than a chunk (\(chunkSize))")
        }
        let content = [UInt8](bytes)
        let checksum = contentChecksum(bytes)
        var generator = SystemRandomNumberGenerator()
        return mutex.withLock {
            var id: BlobID = 0
            while id == 0 || blobs[id] != nil { id = generator.next() }
            blobs[id] = content
            var ts = timespec()
            clock_gettime(CLOCK_REALTIME, &ts)
            written[id] = Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
            if !durable { unsynced.insert(id) }
            return ChunkRef(blob: id, length: UInt32(content.count), checksum: checksum)
        }
    }

    public func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        if blob == 0 || buffer.isEmpty { return 0 }
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "read blob \(blob): negative offset \(offset)") }
        return try mutex.withLock { () throws(StoreError) -> Int in
            guard let content = blobs[blob] else {
                throw StoreError(errno: ENOENT, "open blob \(blob) (memory): \(String(cString: strerror(ENOENT)))")
            }
            guard offset < content.count else { return 0 }
            let n = min(buffer.count, content.count - offset)
            content.withUnsafeBytes { src in
                buffer.baseAddress!.copyMemory(from: src.baseAddress! + offset, byteCount: n)
            }
            return n
        }
    }

    public func syncAll() throws(StoreError) {
        mutex.withLock { unsynced = [] }
    }

    public func delete(_ blob: BlobID) throws(StoreError) {
        mutex.withLock {
            blobs[blob] = nil
            unsynced.remove(blob)
        }
    }

    public func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID] {
        mutex.withLock { Array(blobs.keys.filter { cutoff == nil || written[$0, default: 0] < cutoff! }) }
    }

    /// Make a blob look written `nanoseconds` earlier (to test garbage collection's grace).
    public func backdate(_ blob: BlobID, by nanoseconds: Int64) {
        mutex.withLock { written[blob, default: 0] -= nanoseconds }
    }

    public func verify(_ ref: ChunkRef) -> Bool {
        if ref.isHole { return true }
        guard let content = mutex.withLock({ blobs[ref.blob] }) else { return false }
        return content.count == Int(ref.length)
            && content.withUnsafeBytes { contentChecksum($0) } == ref.checksum
    }
}

// MARK: - Work area

public final class MemoryWorkArea: WorkArea, @unchecked Sendable {
    // `mutex` guards `files`: every working copy created and not yet removed, kept (as a
    // crashed daemon's files stay on disk) so `leftovers()` finds them.
    private let mutex = StoreMutex()
    private var files: [InodeNumber: MemoryWorkFile] = [:]

    public init() {}

    /// Roll every working copy back to its last `sync()` (never-synced ones vanish), as a power
    /// cut may. What is left is no longer known intact, as after a restart.
    public func simulatePowerCut() {
        mutex.withLock {
            for (ino, file) in files where !file.revertToSynced() { files[ino] = nil }
            boot = UUID().uuidString
        }
    }

    public func create(ino: InodeNumber) throws(StoreError) -> any WorkFile {
        let file = MemoryWorkFile(ino: ino, area: self)
        mutex.withLock { files[ino] = file }
        return file
    }

    public func leftovers() throws(StoreError) -> [RecoveredWork] {
        let all = mutex.withLock { files.values.sorted { $0.ino < $1.ino } }
        return all.map { file in
            let info = file.recoveryInfo()
            var work = RecoveredWork(ino: file.ino, base: info.base, size: info.size, dirtyChunks: info.dirty, file: file,
                                     finished: info.finished, intact: info.intact, modified: info.modified)
            work.partialChunks = info.partial
            work.baseReach = info.baseReach
            work.synced = info.synced
            return work
        }
    }

    public func recoveryFinished() {}
    /// A new one after each simulated power cut, as after a real restart.
    public var bootID: String { mutex.withLock { boot } }
    private var boot = UUID().uuidString   // guarded by mutex
    /// One memory work area is one writer; a second model on the store in a test has its own.
    /// A test says whether other writers are to count as running.
    public func otherWritersAlive() -> Bool { mutex.withLock { othersAlive } }
    public func setOtherWritersAlive(_ alive: Bool) { mutex.withLock { othersAlive = alive } }
    private var othersAlive = false   // guarded by mutex

    fileprivate func removeFile(_ file: MemoryWorkFile) {
        mutex.withLock { if files[file.ino] === file { files[file.ino] = nil } }
    }
}

public final class MemoryWorkFile: WorkFile, @unchecked Sendable {
    /// Content is kept in pages so a big sparse working copy costs only what was written.
    static let pageSize = 1 << 16

    struct Content {
        var pages: [Int: [UInt8]] = [:]
        var size = 0
        var base: VersionID?
        var dirty: Set<Int> = []
        var partial: [Int: PageSet] = [:]
        var baseReach: UInt64 = 0
        var finished = false
        var fsynced = false
        var finishedMtime: Int64?
        var modified: Int64 = 0
    }

    public let ino: InodeNumber
    // `mutex` guards `content`, `synced` (the content as of the last sync(), nil if never) and
    // `area` (weak, so a dropped area does not leak through its files).
    private let mutex = StoreMutex()
    private var content = Content()
    private var synced: Content?
    /// False once a simulated power cut rolled it back.
    private var intact = true
    private weak var area: MemoryWorkArea?

    init(ino: InodeNumber, area: MemoryWorkArea) {
        self.ino = ino
        self.area = area
    }

    /// Back to the last synced content; false if never synced.
    fileprivate func revertToSynced() -> Bool {
        mutex.withLock {
            guard let synced else { return false }
            content = synced
            intact = false
            return true
        }
    }

    fileprivate func recoveryInfo() -> (base: VersionID?, size: UInt64, dirty: [Int], partial: [Int: PageSet], baseReach: UInt64,
                                        synced: Bool, finished: Bool, intact: Bool, modified: Int64) {
        mutex.withLock {
            let chunks = (content.size + chunkSize - 1) / chunkSize
            return (content.base, UInt64(content.size), content.dirty.filter { $0 < chunks }.sorted(),
                    content.partial.filter { $0.key < chunks }, content.baseReach, content.fsynced,
                    content.finished, intact, content.finishedMtime ?? content.modified)
        }
    }

    private func touched() {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        content.modified = Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }

    public func pread(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) -> Int {
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "read work file \(ino): negative offset") }
        return mutex.withLock {
            guard offset < content.size, !buffer.isEmpty else { return 0 }
            let n = min(buffer.count, content.size - offset)
            var done = 0
            while done < n {
                let position = offset + done
                let page = position / Self.pageSize, within = position % Self.pageSize
                let step = min(n - done, Self.pageSize - within)
                let target = UnsafeMutableRawBufferPointer(rebasing: buffer[done..<(done + step)])
                if let bytes = content.pages[page] {
                    bytes.withUnsafeBytes { target.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[within..<(within + step)])) }
                } else {
                    target.initializeMemory(as: UInt8.self, repeating: 0)
                }
                done += step
            }
            return n
        }
    }

    public func pwrite(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError) {
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "write work file \(ino): negative offset") }
        guard !bytes.isEmpty else { return }
        mutex.withLock {
            var done = 0
            while done < bytes.count {
                let position = offset + done
                let page = position / Self.pageSize, within = position % Self.pageSize
                let step = min(bytes.count - done, Self.pageSize - within)
                var pageBytes = content.pages.removeValue(forKey: page) ?? [UInt8](repeating: 0, count: Self.pageSize)
                pageBytes.withUnsafeMutableBytes {
                    UnsafeMutableRawBufferPointer(rebasing: $0[within..<(within + step)])
                        .copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[done..<(done + step)]))
                }
                content.pages[page] = pageBytes
                done += step
            }
            content.size = max(content.size, offset + bytes.count)
            touched()
        }
    }

    /// Sets the size; bytes past it are dropped (they read as zeros if the file grows again).
    private func resize(_ size: Int) {
        if size < content.size {
            let lastPage = size / Self.pageSize, within = size % Self.pageSize
            content.pages = content.pages.filter { $0.key < lastPage || ($0.key == lastPage && within > 0) }
            if within > 0, var page = content.pages.removeValue(forKey: lastPage) {
                for i in within..<Self.pageSize { page[i] = 0 }
                content.pages[lastPage] = page
            }
        }
        content.size = size
    }

    public func truncate(to size: Int) throws(StoreError) {
        guard size >= 0 else { throw StoreError(errno: EINVAL, "truncate work file \(ino): negative size") }
        mutex.withLock {
            resize(size)
            content.baseReach = min(content.baseReach, UInt64(size))
            touched()
        }
    }

    public func markDirty(_ index: Int) throws(StoreError) {
        guard index >= 0 else { throw StoreError(errno: EINVAL, "mark work file \(ino): negative chunk index") }
        mutex.withLock {
            content.dirty.insert(index)
            content.partial[index] = nil
        }
    }

    public var keepsPages: Bool { true }

    public func markSynced() throws(StoreError) -> Bool {
        mutex.withLock { content.fsynced = true }
        return true
    }

    public func markPages(_ index: Int, _ pages: PageSet) throws(StoreError) {
        guard index >= 0 else { throw StoreError(errno: EINVAL, "mark work file \(ino): negative chunk index") }
        mutex.withLock { if !content.dirty.contains(index) { content.partial[index] = pages } }
    }

    public func setBase(_ base: VersionID?, size: UInt64) throws(StoreError) {
        guard size <= UInt64(Int64.max) else { throw StoreError(errno: EFBIG, "set base of work file \(ino): size \(size)") }
        mutex.withLock {
            content.base = base
            content.baseReach = size
            content.fsynced = false
            content.finished = false
            content.finishedMtime = nil
            resize(Int(size))
        }
    }

    public func setFinished(mtime: Int64?) throws(StoreError) {
        mutex.withLock {
            content.finished = mtime != nil
            content.finishedMtime = mtime
        }
    }

    public func sync() throws(StoreError) {
        mutex.withLock { synced = content }
    }

    public func remove() {
        let area = mutex.withLock { self.area }
        area?.removeFile(self)
    }
}
