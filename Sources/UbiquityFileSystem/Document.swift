// Document: the one working copy of a regular file, shared by all its open handles.
//
// A published version is a list of chunk references (immutable blobs). While a file is open, a
// Document holds the base version's chunk list and, lazily, a working copy (WorkFile) that holds
// only the chunks changed since then: whole ("dirty" chunks), or, where the working copy can,
// only the 4 KiB pages a write touched (a write that ends mid-page brings that page of the base
// in first). Reads take each page from the working copy if it holds it, else from the base's
// blob, else zeros (holes, or past a blob's end). So a 4 KiB write into a 1 GiB file copies at
// most two pages, and reading costs a pread. A publish completes such chunks from the base.
//
// Publishing writes each dirty chunk as a new blob and then commits one metadata transaction
// (new version + node) through the filesystem: that commit is the publish point. Until then
// readers of the store (and other machines, later) see the previous whole version.
//
// Locking: `lock` (readers-writer) guards everything below it. A Document's lock may be held while
// taking the filesystem's `commits` and namespace locks (publish commits); never the other way
// round. `opens` is guarded by
// the filesystem's `docsLock`; size, times and the change counters are also guarded by
// `statLock` so that getattr (under the namespace lock) can read them: both are innermost locks,
// held for no I/O. Those fields change only under `lock` held for writing *and* `statLock`.

import Foundation
import Synchronization
import UbiquityStore

final class Document: @unchecked Sendable {
    let ino: InodeNumber
    let store: BackingStore
    let lock = RWLock()

    // Guarded by `lock`.
    private(set) var baseVersion: VersionID?
    private(set) var base: [ChunkRef]
    private var work: (any WorkFile)?
    private var dirty: Set<Int> = []
    /// Chunks the working copy holds some pages of (the others are the base's); never in `dirty`.
    private var partial: [Int: PageSet] = [:]
    /// The working copy is marked finished (no handle has changes it has not closed); the next
    /// change unmarks it.
    private var finished = false
    /// While finished: the handle whose close set the mark. That content is a saved document
    /// until it is published, so a change through any other handle (a new open's O_TRUNC, another
    /// program) must publish it first, or a crash would lose it to a copy that is neither. A
    /// change through the same handle (one descriptor shared by several processes, as in
    /// `{ a; b; } > out` or `make > log`) only clears the mark, so they don't publish at each exit.
    private var closedBy: UInt64?
    /// An fsync made the working copy durable (and marked it so): a crash leaves it as the
    /// file's content. A truncate publishes it first (see `truncate`), and so is its publish durable.
    private var syncedMark = false
    /// Handles that changed the file since their last flush (close). Finished means none.
    private var unflushed: Set<UInt64> = []
    /// Handles opened with O_TRUNC that have written nothing yet. A close of one of their
    /// descriptors marks the copy finished but publishes nothing: a shell's `echo x > f` opens,
    /// dups and closes the first descriptor before `echo` writes, and that close must not
    /// publish an empty version that other mounts would show between two whole ones. The
    /// release (or the idle publish) publishes a file that stays empty.
    private var truncatedAtOpen: Set<UInt64> = []
    /// Monotonic time of the last publish at a close (guarded by `closeLock`).
    private var lastClosePublish: UInt64 = 0
    private let closeLock = Lock()
    /// Sequential reads (see `blobsToReadAhead`): the furthest end of a read so far, where the
    /// run of reads in order began, and the last chunk whose blob was named for read-ahead.
    private let readAhead = Mutex<(end: UInt64, runStart: UInt64, named: Int)>((0, 0, -1))
    /// Chunks read ahead of a sequential read: the mount's own read-ahead (4 MiB) and as much
    /// again, so the disk is reading the next blobs while the kernel asks for these.
    static let readAheadChunks = 8

    // Written under `lock` (write) and `statLock`; read under either.
    private let statLock = Lock()
    private(set) var size: UInt64
    private var mtime: Int64
    private var ctime: Int64
    private var writeSeq: UInt64 = 0
    private var publishedSeq: UInt64 = 0
    /// Monotonic time of the last change, for idle publishing.
    private var lastChange: UInt64 = 0
    /// Bytes stored for the base version (holes excluded) and chunks in the working copy: an
    /// estimate of st_blocks that keeps sparse files sparse while they are open.
    private var baseAllocated: UInt64 = 0
    private var dirtyCount = 0

    struct Stat {
        var size: UInt64
        var mtime: Int64
        var ctime: Int64
        var lastChange: UInt64
        var unpublished: Bool
        var allocated: UInt64
    }

    func stat() -> Stat {
        statLock.withLock { Stat(size: size, mtime: mtime, ctime: ctime, lastChange: lastChange, unpublished: writeSeq != publishedSeq,
                                  allocated: min(size, baseAllocated + UInt64(dirtyCount) * UInt64(chunkSize))) }
    }

    /// Times set by setattr while the file is open (they win over the write that came before).
    func setTimes(mtime: Int64? = nil, ctime: Int64? = nil) {
        statLock.withLock {
            if let mtime { self.mtime = mtime }
            if let ctime { self.ctime = ctime }
        }
    }

    // Guarded by the filesystem's docsLock.
    var opens = 0

    init(node: NodeRecord, chunks: [ChunkRef], store: BackingStore) {
        ino = node.ino
        self.store = store
        baseVersion = node.currentVersion
        base = chunks
        size = node.size
        mtime = node.mtime
        ctime = node.ctime
        baseAllocated = allocatedBytes(chunks)
    }

    /// A working copy left by a crashed daemon, being turned into a version.
    init(recovered: RecoveredWork, base: [ChunkRef], baseVersion: VersionID?, mtime: Int64, store: BackingStore) {
        ino = recovered.ino
        self.store = store
        self.baseVersion = baseVersion
        self.base = base
        size = recovered.size
        self.mtime = mtime
        ctime = mtime
        work = recovered.file
        dirty = Set(recovered.dirtyChunks)
        partial = recovered.partialChunks.filter { !dirty.contains($0.key) }
        syncedMark = recovered.synced
        if let reach = recovered.baseReach {
            // A truncate below it cut the base there: past it the copy shows zeros.
            let kept = Int((reach + UInt64(chunkSize) - 1) / UInt64(chunkSize))
            if self.base.count > kept { self.base.removeSubrange(kept...) }
        }
        writeSeq = 1
    }

    var hasUnpublishedChanges: Bool { stat().unpublished }

    // MARK: reads and writes

    func read(at offset: UInt64, into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        try lock.read {
            guard offset < size, buffer.count > 0 else { return 0 }
            let total = Int(min(UInt64(buffer.count), size - offset))
            try Self.eachChunk(at: offset, total: total) { index, within, done, n in
                let piece = UnsafeMutableRawBufferPointer(rebasing: buffer[done..<(done + n)])
                try readPiece(index: index, within: within, into: piece)
                return true
            }
            return total
        }
    }

    /// Walks the chunks that `total` bytes at `offset` cover, in order: the chunk's index, where
    /// the bytes start in it and in the whole read, and how many there are in it. Stops when
    /// `body` returns false, and returns whether it went to the end.
    @discardableResult
    private static func eachChunk(at offset: UInt64, total: Int,
                                  _ body: (_ index: Int, _ within: Int, _ done: Int, _ count: Int) throws -> Bool) rethrows -> Bool {
        var done = 0
        while done < total {
            let position = Int(offset) + done
            let within = position % chunkSize
            let n = min(total - done, chunkSize - within)
            guard try body(position / chunkSize, within, done, n) else { return false }
            done += n
        }
        return true
    }

    /// `count` bytes at `offset` as pieces of the base's blob files and runs of zeros, with the
    /// files open, when the working copy holds none of them and every blob is a whole file on
    /// this machine (a reply spliced from the files, after the lock is let go: blobs never
    /// change). nil where the bytes must be read (and merged) by `read`, which also reports a
    /// blob that cannot be opened or is short.
    func filePieces(at offset: UInt64, count: Int, files: any BlobFiles) -> (pieces: [FilePiece], files: [BlobFile])? {
        lock.read { () -> (pieces: [FilePiece], files: [BlobFile])? in
            guard offset < size, count > 0 else { return nil }
            let total = Int(min(UInt64(count), size - offset))
            var pieces: [FilePiece] = []
            var open: [BlobFile] = []
            let whole = Self.eachChunk(at: offset, total: total) { index, within, _, n in
                guard partial[index] == nil, !dirty.contains(index) || work == nil else { return false }
                var got = 0
                if index < base.count, !base[index].isHole, within < Int(base[index].length) {
                    let chunk = base[index]
                    guard let file = try? files.file(chunk.blob), file.size >= Int(chunk.length) else { return false }
                    got = min(n, Int(chunk.length) - within)
                    pieces.append(.file(fd: file.fd, offset: within, length: got))
                    open.append(file)
                }
                if got < n { pieces.append(.zeros(n - got)) }
                return true
            }
            return whole ? (pieces, open) : nil
        }
    }

    /// The blobs to read ahead of a read of `count` bytes at `offset`. Each chunk is a blob file
    /// of its own, and the disk's read-ahead stops at a file's end: where reads of this file run
    /// in order (each starts within `readAheadChunks` chunks of the furthest end so far: the
    /// kernel's read-ahead sends several at once, in any order), are large (it asks for up to
    /// 1000 KiB at a time; a random reader's misses ask for a few pages), and the run has
    /// covered twice that window (a page fault's read-around, or a first look at a file's start,
    /// is not a run), the base's blobs of the next chunks not yet named, for the caller to have
    /// read into the page cache. Other reads name none; one far from the last starts a new run.
    func blobsToReadAhead(offset: UInt64, count: Int) -> [BlobID] {
        guard count > 0 else { return [] }
        let end = offset + UInt64(count)
        let last = Int((end - 1) / UInt64(chunkSize))
        let window = UInt64(Self.readAheadChunks * chunkSize)
        let wanted: Range<Int> = readAhead.withLock { state in
            let near = offset == 0 ? state.end == 0 : (offset <= state.end + window && offset + window >= state.end)
            if !near { state.runStart = offset }
            state.end = near ? max(state.end, end) : end
            guard near, count >= 128 * 1024, state.end - state.runStart >= 2 * window else {
                state.named = max(state.named, last)
                if !near { state.named = last }
                return 0..<0
            }
            let from = max(state.named + 1, last + 1)
            let to = last + 1 + Self.readAheadChunks
            if from >= to { return 0..<0 }
            state.named = to - 1
            return from..<to
        }
        if wanted.isEmpty { return [] }
        return lock.read {
            wanted.clamped(to: 0..<base.count).compactMap { base[$0].isHole ? nil : base[$0].blob }
        }
    }

    /// Caller holds `lock` (read or write).
    private func readPiece(index: Int, within: Int, into piece: UnsafeMutableRawBufferPointer) throws {
        if let pages = partial[index], let work {
            // Runs of pages from the same side: the working copy's, or the base's.
            var done = 0
            while done < piece.count {
                let page = (within + done) / pageSize
                let mine = pages.contains(page)
                var end = min(piece.count, (page + 1) * pageSize - within)
                while end < piece.count && pages.contains((within + end) / pageSize) == mine {
                    end = min(piece.count, end + pageSize)
                }
                let run = UnsafeMutableRawBufferPointer(rebasing: piece[done..<end])
                if mine {
                    try readWork(work, at: index * chunkSize + within + done, into: run)
                } else {
                    try readBase(index: index, within: within + done, into: run)
                }
                done = end
            }
        } else if dirty.contains(index), let work {
            try readWork(work, at: index * chunkSize + within, into: piece)
        } else {
            try readBase(index: index, within: within, into: piece)
        }
    }

    /// The working copy's bytes at `offset`, zeros past its end.
    private func readWork(_ work: any WorkFile, at offset: Int, into piece: UnsafeMutableRawBufferPointer) throws {
        var got = 0
        while got < piece.count {
            let n = try work.pread(into: UnsafeMutableRawBufferPointer(rebasing: piece[got...]), at: offset + got)
            if n == 0 { break }
            got += n
        }
        if got < piece.count {
            UnsafeMutableRawBufferPointer(rebasing: piece[got...]).initializeMemory(as: UInt8.self, repeating: 0)
        }
    }

    /// The base version's bytes of chunk `index` from `within`, zeros past its blob's end.
    /// Caller holds `lock` (read or write).
    private func readBase(index: Int, within: Int, into piece: UnsafeMutableRawBufferPointer) throws {
        var got = 0
        if index < base.count, !base[index].isHole, within < Int(base[index].length) {
            let want = min(piece.count, Int(base[index].length) - within)
            // Reading to the end of a chunk: a sequential reader wants the next ones soon.
            if within + want == Int(base[index].length), let local = store.localChunks {
                local.prefetch(Array(base[(index + 1)..<min(index + 3, base.count)]))
            }
            while got < want {
                let n: Int
                do {
                    // Content that lives elsewhere comes here first, checked against its checksum.
                    try store.localChunks?.fetch(base[index])
                    n = try store.blobs.read(base[index].blob, at: within + got,
                                             into: UnsafeMutableRawBufferPointer(rebasing: piece[got..<want]))
                } catch {
                    if error.kind == .unavailable {
                        throw StoreError(errno: EIO, "the content of inode \(ino) is not on this machine, and the store "
                                         + "cannot be reached: \(error.message)")
                    }
                    throw StoreError(errno: EIO, "content of inode \(ino) is damaged: \(error)")
                }
                if n == 0 { throw StoreError(errno: EIO, "content of inode \(ino) is damaged: chunk \(index) is short") }
                got += n
            }
        }
        if got < piece.count {
            UnsafeMutableRawBufferPointer(rebasing: piece[got...]).initializeMemory(as: UInt8.self, repeating: 0)
        }
    }

    /// Write through `handle` (the file handle the bytes came through).
    func write(_ bytes: UnsafeRawBufferPointer, at offset: UInt64, handle: UInt64) throws {
        guard bytes.count > 0 else { return }
        try lock.write {
            try unfinish(by: handle)
            truncatedAtOpen.remove(handle)
            let start = Int(offset)
            let end = start + bytes.count
            var paged: [(index: Int, pages: PageSet)] = []
            for index in (start / chunkSize)...((end - 1) / chunkSize) {
                let from = max(start, index * chunkSize) - index * chunkSize
                let to = min(end, (index + 1) * chunkSize) - index * chunkSize
                if let pages = try bringIn(index, from: from, to: to) { paged.append((index, pages)) }
            }
            try work!.pwrite(bytes, at: start)
            // The pages are marked once their bytes are written.
            for (index, pages) in paged { try markPages(index, pages) }
            touch(size: max(size, UInt64(end)))
        }
    }

    /// Truncate through `handle` (nil: by path, with no descriptor); `atOpen`: the O_TRUNC of
    /// the open that made `handle`.
    func truncate(to newSize: UInt64, handle: UInt64?, atOpen: Bool = false) throws {
        try lock.write {
            // What an fsync made durable becomes a version before a truncate can take it: the
            // program's later writes only add to it, as a crash would show them, but a cut may
            // start a new content that a crash would leave half made.
            if syncedMark { throw ClosedContentFirst() }
            try unfinish(by: handle)
            if let handle {
                if atOpen { truncatedAtOpen.insert(handle) } else { truncatedAtOpen.remove(handle) }
            }
            if newSize < size && newSize % UInt64(chunkSize) != 0 {
                // The chunk that now ends mid-way must not later show its old tail.
                try materialize(Int(newSize / UInt64(chunkSize)), fullyOverwritten: false)
            }
            let created = work == nil
            try ensureWork()
            do { try work!.truncate(to: Int(newSize)) } catch {
                // Don't leave a fresh, unchanged working copy behind (recovery would find it).
                if created && dirty.isEmpty { work?.remove(); work = nil }
                throw error
            }
            // Only once the working copy is cut: a failed truncate leaves the content as it was.
            if newSize < size {
                let keep = Int((newSize + UInt64(chunkSize) - 1) / UInt64(chunkSize))
                dirty = dirty.filter { $0 < keep }
                partial = partial.filter { $0.key < keep }
                if base.count > keep { base.removeSubrange(keep...) }
                let allocated = allocatedBytes(base)
                statLock.withLock { baseAllocated = allocated; dirtyCount = dirty.count }
            }
            touch(size: newSize)
        }
    }

    /// `handle` was closed (flush: each close(2), before it returns). Once no handle has
    /// changes it has not closed, the working copy is marked finished, so that if the daemon
    /// dies before the publish that follows, recovery makes it the current version rather than
    /// a side version: "saved, closed, then the daemon died"
    /// must not show the old file. Under `lock`, so no write can slip between check and mark.
    /// Returns whether every writer has now closed the document with changes unpublished (and
    /// it is to be published now).
    @discardableResult
    func flushed(handle: UInt64) throws -> Bool {
        try lock.write {
            unflushed.remove(handle)
            guard unflushed.isEmpty, let work, stat().unpublished else { return false }
            if !finished {
                try work.setFinished(mtime: statLock.withLock { mtime })
                finished = true
                closedBy = handle
            }
            // Marked, so a crash keeps what the close left; published at the release.
            return !truncatedAtOpen.contains(handle)
        }
    }

    /// Whether a close may publish now: at most once per `gap` per file. A descriptor shared by
    /// many processes (`make > build.log`: each child's exit is a close) would otherwise publish
    /// a version at every one of them; the later closes leave it to the release or the idle
    /// publish.
    func claimClosePublish(gap: UInt64 = 1_000_000_000) -> Bool {
        let now = monotonicNanoseconds()
        return closeLock.withLock {
            guard lastClosePublish == 0 || now &- lastClosePublish >= gap else { return false }
            lastClosePublish = now
            return true
        }
    }

    /// `handle` is gone (release) without necessarily a flush first.
    func released(handle: UInt64) {
        lock.write {
            unflushed.remove(handle)
            truncatedAtOpen.remove(handle)
        }
    }

    /// A change through `handle` is coming: the working copy is no longer a finished document.
    /// The mark is cleared before the change, so a crash in between leaves a side version, never
    /// a half-changed current one. Throws `ClosedContentFirst`, changing nothing, when the
    /// finished content came from another handle's close (see `closedBy`). Caller holds `lock`
    /// for writing.
    private func unfinish(by handle: UInt64?) throws {
        if finished, closedBy != nil, closedBy != handle { throw ClosedContentFirst() }
        if let handle { unflushed.insert(handle) }
        guard finished, let work else { return }
        try work.setFinished(mtime: nil)
        finished = false
        closedBy = nil
    }

    /// A change came through another handle than the one whose close left the working copy's
    /// content, or would cut content an fsync made durable: publish that content, then try the
    /// change again.
    struct ClosedContentFirst: Error {}

    /// The version a working copy builds on now: what an fsync's barrier must have made durable
    /// before the copy is marked synced.
    var currentBaseVersion: VersionID? { lock.read { baseVersion } }

    enum WorkingCopySync { case synced, publish, baseMoved }

    /// fsync without a publish: the working copy is made durable where it is and marked so, so
    /// that a crash of the daemon or the machine leaves it as the file's content (what came after
    /// the fsync too, as a file system shows a file after a crash). `publish` when there is
    /// nothing unpublished or the copy cannot carry the mark: the caller publishes durably
    /// instead. The mark vouches for the base, which the caller's barrier made durable:
    /// `baseMoved` when the base is no longer `vouched` (a publish and a write came in between).
    func syncWorkingCopy(vouched: VersionID?) throws -> WorkingCopySync {
        var moved = false
        let marked = try lock.write { () throws -> (any WorkFile)? in
            guard let work, stat().unpublished else { return nil }
            if !syncedMark {
                guard baseVersion == vouched else { moved = true; return nil }
                guard try work.markSynced() else { return nil }
                syncedMark = true
            }
            return work
        }
        if moved { return .baseMoved }
        guard let marked else { return .publish }
        // The syncs under the read lock: reads go on meanwhile, writes wait (an fsync covers
        // the writes that returned before it).
        try lock.read {
            // Published meanwhile (durably: it was marked), and the copy is gone.
            guard work === marked else { return }
            try marked.sync()
        }
        return .synced
    }

    /// Let a change overwrite the closed content: it will never be published (`nameless`: the
    /// file has no name left), or it is published already. Decided under the lock, so a close
    /// that marked new content since the caller looked keeps its mark.
    func dropClosedContent(nameless: Bool) {
        lock.write {
            if nameless || !stat().unpublished {
                closedBy = nil
                syncedMark = false
            }
        }
    }

    /// Caller holds `lock` for writing.
    private func touch(size newSize: UInt64) {
        let now = nowNanoseconds()
        let mono = monotonicNanoseconds()
        statLock.withLock {
            size = newSize
            writeSeq &+= 1
            mtime = now
            ctime = now
            lastChange = mono
        }
    }

    /// Caller holds `lock` for writing.
    private func ensureWork() throws {
        guard work == nil else { return }
        let file = try store.work.create(ino: ino)
        do {
            try file.setBase(baseVersion, size: size)
            try file.truncate(to: Int(size))
        } catch {
            file.remove()
            throw error
        }
        work = file
    }

    /// How many bytes of chunk `index` the base holds (within the file's size). Caller holds `lock`.
    private func baseLength(_ index: Int) -> Int {
        guard index < base.count, !base[index].isHole else { return 0 }
        return min(Int(base[index].length), max(0, Int(size) - index * chunkSize))
    }

    /// Ready chunk `index` for a write of [from, to) (offsets in the chunk): whole in the working
    /// copy, or, where the copy keeps pages and the chunk has base bytes the write leaves, with
    /// the pages the write ends in brought in from the base. Returns the pages to mark once the
    /// write is done (nil: the chunk is whole). Caller holds `lock` for writing.
    private func bringIn(_ index: Int, from: Int, to: Int) throws -> PageSet? {
        if dirty.contains(index) { return nil }
        try ensureWork()
        let length = baseLength(index)
        if from == 0 && to >= chunkSize || length == 0 || !work!.keepsPages {
            try materialize(index, fullyOverwritten: from == 0 && to >= chunkSize)
            return nil
        }
        var held = partial[index] ?? PageSet()
        let touched = PageSet(touching: from, to)
        // A page the write covers only in part, and which the copy does not hold yet, comes in
        // first: the rest of it must stay the base's bytes.
        for page in Set([from / pageSize, (to - 1) / pageSize]) where !held.contains(page) {
            let pageStart = page * pageSize
            guard from > pageStart || to < pageStart + pageSize, pageStart < length else { continue }
            try copyBase(index, pageStart..<min(pageStart + pageSize, length))
        }
        held.formUnion(touched)
        return held
    }

    /// Record that the working copy holds `pages` of chunk `index`; a chunk held whole is marked
    /// so. Caller holds `lock` for writing.
    private func markPages(_ index: Int, _ pages: PageSet) throws {
        if pages.isFull { return try markWhole(index) }
        if partial[index] == pages { return }
        try work!.markPages(index, pages)
        partial[index] = pages
    }

    /// Copies the base's bytes `range` (offsets in chunk `index`) into the working copy.
    /// Caller holds `lock` for writing.
    private func copyBase(_ index: Int, _ range: Range<Int>) throws {
        guard !range.isEmpty, index < base.count, !base[index].isHole else { return }
        let ref = base[index]
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: range.count, alignment: 16)
        defer { buffer.deallocate() }
        var got = 0
        while got < range.count {
            let n = try store.blobs.read(ref.blob, at: range.lowerBound + got, into: UnsafeMutableRawBufferPointer(rebasing: buffer[got...]))
            if n == 0 { throw StoreError(errno: EIO, "blob \(ref.blob) of inode \(ino) is shorter than recorded") }
            got += n
        }
        try work!.pwrite(UnsafeRawBufferPointer(buffer), at: index * chunkSize + range.lowerBound)
    }

    /// Bring chunk `index` into the working copy whole: the base's bytes, except the pages the
    /// copy holds already. Caller holds `lock` for writing.
    private func materialize(_ index: Int, fullyOverwritten: Bool) throws {
        if dirty.contains(index) { return }
        try ensureWork()
        let length = baseLength(index)
        if !fullyOverwritten && length > 0 {
            if let held = partial[index] {
                var page = 0
                while page * pageSize < length {
                    // Runs of pages the copy lacks, each one read and write.
                    guard !held.contains(page) else { page += 1; continue }
                    var end = page + 1
                    while end * pageSize < length && !held.contains(end) { end += 1 }
                    try copyBase(index, (page * pageSize)..<min(end * pageSize, length))
                    page = end
                }
            } else {
                try copyBase(index, 0..<length)
            }
        }
        try markWhole(index)
    }

    /// Chunk `index` is whole in the working copy. Caller holds `lock` for writing.
    private func markWhole(_ index: Int) throws {
        try work!.markDirty(index)
        partial[index] = nil
        dirty.insert(index)
        statLock.withLock { dirtyCount = dirty.count }
    }

    // MARK: publishing

    /// The new chunk list with every dirty chunk written as a blob. Caller holds `lock` for writing.
    /// Chunks that go over the network (a shared store) are written a few at a time: each write
    /// is a round trip, which one at a time would leave the link idle.
    private func writeChunks(durable: Bool) throws -> [ChunkRef] {
        let count = Int((size + UInt64(chunkSize) - 1) / UInt64(chunkSize))
        var chunks = Array(base.prefix(count))
        while chunks.count < count { chunks.append(.hole) }
        guard !dirty.isEmpty, let work else { return chunks }
        let indices = dirty.sorted().filter { $0 < count }
        let workers = store.localChunks == nil ? 1 : min(Self.parallelUploads, indices.count)
        let results = ChunkResults(indices.count)
        let size = self.size, blobs = store.blobs
        // A chunk file of the working copy becomes its blob by a second name: no byte written twice.
        let adopting = blobs as? ChunkAdopting
        DispatchQueue.concurrentPerform(iterations: workers) { worker in
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 16)
            defer { buffer.deallocate() }
            var i = worker
            while i < indices.count, !results.failed {
                let index = indices[i]
                let length = min(chunkSize, Int(size) - index * chunkSize)
                let piece = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<length])
                do {
                    var got = 0
                    while got < length {
                        let n = try work.pread(into: UnsafeMutableRawBufferPointer(rebasing: piece[got...]), at: index * chunkSize + got)
                        if n == 0 { break }
                        got += n
                    }
                    if got < length {
                        UnsafeMutableRawBufferPointer(rebasing: piece[got...]).initializeMemory(as: UInt8.self, repeating: 0)
                    }
                    let bytes = UnsafeRawBufferPointer(piece)
                    if isAllZero(bytes) {
                        results.set(i, .hole)
                    } else if let adopting, let file = try work.chunkFile(index, length: length) {
                        // Asked for after the read (which zero-fills to `length`, as the sizing
                        // does): a hole needs no file, and the read kept its open descriptor.
                        results.set(i, try adopting.adopt(file, length: length, checksum: contentChecksum(bytes), durable: durable))
                    } else {
                        results.set(i, try blobs.write(bytes, durable: durable))
                    }
                } catch {
                    results.fail(error)
                }
                i += workers
            }
        }
        let (refs, failure) = results.taken
        if let failure {
            // The chunks already written belong to no version: freed now where that is safe,
            // else by the garbage collection.
            if store.deletesChunksOfFailedCommits { for r in refs.compactMap({ $0 }) where !r.isHole { try? blobs.delete(r.blob) } }
            throw failure
        }
        for (i, index) in indices.enumerated() { chunks[index] = refs[i]! }
        return chunks
    }

    /// How many chunks of one publish go to a shared store at once.
    static let parallelUploads = 4

    /// Start publishing the working copy, if it changed: write its changed chunks as blobs and
    /// hold the document (its lock, for writing) until the returned `Publication` is finished
    /// (the caller has committed the version) or goes unfinished (nothing is published, the
    /// chunks just written are deleted, the working copy stays). Nil when there is nothing to
    /// publish.
    func preparePublish() throws -> Publication? {
        lock.lockWrite()
        let st = stat()
        guard st.unpublished else {
            lock.unlock()
            return nil
        }
        let chunks: [ChunkRef]
        do {
            // A chunk held in pages is completed from the base first: a blob is a whole chunk.
            for index in partial.keys.sorted() { try materialize(index, fullyOverwritten: false) }
            chunks = try writeChunks(durable: false)
        } catch {
            lock.unlock()
            throw error
        }
        // Only a position whose blob changed can hold a new one: no set of a big file's whole list.
        var written = Set<BlobID>()
        for (i, c) in chunks.enumerated() where !c.isHole && (i >= base.count || base[i].blob != c.blob) { written.insert(c.blob) }
        if !written.isEmpty { written.subtract(base.lazy.map(\.blob)) }
        return Publication(doc: self, chunks: chunks, size: st.size, mtime: st.mtime, ctime: st.ctime, written: written,
                           synced: syncedMark)
    }

    /// The version `p` is now committed as `id`: it is this document's base. Caller holds the
    /// lock (through `p`). Returns the working copy, now published, for the caller to delete.
    fileprivate func published(_ p: borrowing Publication, as id: VersionID) -> (any WorkFile)? {
        baseVersion = id
        base = p.chunks
        dirty = []
        partial = [:]
        let done = work
        work = nil
        finished = false
        syncedMark = false
        closedBy = nil
        let allocated = allocatedBytes(p.chunks)
        statLock.withLock { publishedSeq = writeSeq; baseAllocated = allocated; dirtyCount = 0 }
        return done
    }

    /// The blobs this document reads that are not in its working copy.
    func baseBlobs() -> Set<BlobID> {
        lock.read { Set(base.lazy.filter { !$0.isHole }.map(\.blob)) }
    }

    /// Another writer published `node`'s new current version: if this document holds no change of
    /// its own, it follows (so a program opening the file now reads the new content); with
    /// changes, it keeps its base and its publish becomes a conflict version.
    func rebase(on node: NodeRecord, chunks: [ChunkRef]) {
        lock.write {
            guard work == nil, dirty.isEmpty, !stat().unpublished, baseVersion != node.currentVersion else { return }
            baseVersion = node.currentVersion
            base = chunks
            let allocated = allocatedBytes(chunks)
            statLock.withLock {
                size = node.size
                mtime = node.mtime
                ctime = node.ctime
                baseAllocated = allocated
            }
        }
    }

    /// Forget the working copy without publishing (the file was deleted).
    func discard() {
        lock.write {
            work?.remove()
            work = nil
            dirty = []
            partial = [:]
            finished = false
            syncedMark = false
            closedBy = nil
            statLock.withLock { publishedSeq = writeSeq; dirtyCount = 0 }
        }
    }
}

func isAllZero(_ bytes: UnsafeRawBufferPointer) -> Bool {
    let words = bytes.count / 8
    var i = 0
    while i < words {
        if bytes.loadUnaligned(fromByteOffset: i * 8, as: UInt64.self) != 0 { return false }
        i += 1
    }
    var j = words * 8
    while j < bytes.count {
        if bytes[j] != 0 { return false }
        j += 1
    }
    return true
}

func allocatedBytes(_ chunks: [ChunkRef]) -> UInt64 {
    chunks.reduce(0) { $0 + ($1.isHole ? 0 : UInt64($1.length)) }
}

/// A publish in progress (see `Document.preparePublish`): the chunks to commit as a version, with
/// the document held until this value goes. `finish` makes the committed version the document's
/// base; a publication that goes unfinished (the commit failed, or the file is gone) deletes the
/// blobs it wrote, which nothing refers to. Either way the document is let go exactly once.
struct Publication: ~Copyable {
    // Holds a pthread rwlock, which must be unlocked on the thread that locked it: never sent.
    let doc: Document
    let chunks: [ChunkRef]
    let size: UInt64
    let mtime: Int64
    let ctime: Int64
    /// The working copy was fsync'd: its publish must be durable before the copy goes.
    let synced: Bool
    fileprivate let written: Set<BlobID>
    private var finished = false

    fileprivate init(doc: Document, chunks: [ChunkRef], size: UInt64, mtime: Int64, ctime: Int64, written: Set<BlobID>,
                     synced: Bool) {
        self.synced = synced
        self.doc = doc
        self.chunks = chunks
        self.size = size
        self.mtime = mtime
        self.ctime = ctime
        self.written = written
    }

    /// The version was committed as `id`. `sync` (fsync, recovery) is the store's barrier, run
    /// before the working copy is deleted: if it fails, the version stands but the working copy
    /// stays on disk, for recovery to publish again. `removeLater` takes the published working
    /// copy instead of deleting it, for a caller that syncs many publishes at once (a clean stop).
    consuming func finish(as id: VersionID, sync: (() throws -> Void)?,
                          removeLater: ((any WorkFile) -> Void)? = nil) throws {
        finished = true
        let done = doc.published(self, as: id)
        // A barrier covers every earlier chunk too (a new version may reuse chunks of versions
        // published without one).
        try sync?()
        if let done {
            if let removeLater { removeLater(done) } else { done.remove() }
        }
    }

    deinit {
        if !finished && doc.store.deletesChunksOfFailedCommits {
            for blob in written { try? doc.store.blobs.delete(blob) }
        }
        doc.lock.unlock()
    }
}

@available(*, unavailable)
extension Publication: Sendable {}

/// The chunks one publish wrote, by position, and the first failure, filled from several threads.
private final class ChunkResults: @unchecked Sendable {
    private let lock = NSLock()
    private var refs: [ChunkRef?]   // guarded by lock
    private var failure: (any Error)?   // guarded by lock
    init(_ count: Int) { refs = Array(repeating: nil, count: count) }
    var failed: Bool { lock.withLock { failure != nil } }
    func set(_ i: Int, _ ref: ChunkRef) { lock.withLock { refs[i] = ref } }
    func fail(_ error: any Error) { lock.withLock { if failure == nil { failure = error } } }
    var taken: ([ChunkRef?], (any Error)?) { lock.withLock { (refs, failure) } }
}
