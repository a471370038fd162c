// The backing-store protocol: what the filesystem model needs from persistent storage.
//
// Three parts, so a shared store (PostgreSQL + S3) can later replace each one:
// - MetadataStore: namespace, attributes, versions, container registry. Every change is a batch of
//   `Mutation`s committed in one transaction: that transaction is the commit point of every
//   operation, including publishing a document version.
// - BlobStore: immutable content chunks. A version is a list of `ChunkRef`s; a small change to a
//   big file writes one new chunk and reuses the others.
// - WorkArea: mutable working copies of documents being written (one per open file, shared by all
//   its handles). A working copy is a sparse file holding only the chunks changed since its base
//   version, plus a map of which chunks those are, so a crashed daemon's unpublished work can be
//   recovered as a version.
//
// Implementations: embedded (SQLite + local files), in-memory (tests), fault-injecting (wraps
// either, fails chosen calls with a chosen errno).

import Foundation

public typealias InodeNumber = UInt64
public typealias VersionID = Int64
public typealias BlobID = UInt64

/// The one error type of the store layer: what kind of failure, the system's errno behind it,
/// and what failed, in words. The model turns kinds into the errno a caller gets, in one place.
public struct StoreError: Error, CustomStringConvertible, Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// A batch's expectation no longer holds: another writer changed the store first.
        case conflict
        /// The store cannot be reached (a shared store offline).
        case unavailable
        /// Something the call names does not exist (a blob, a file).
        case notFound
        /// The disk or the service is full.
        case noSpace
        /// Stored data is damaged (a malformed row, a blob that does not match its checksum).
        case corrupt
        /// The change log no longer holds the changes asked for (it was trimmed past them): the
        /// caller loads a snapshot again instead.
        case trimmed
        /// Any other failure; `errno` says which.
        case io
    }
    public var kind: Kind
    public var errno: Int32
    public var message: String
    /// A failure reported by the system as `errno`.
    public init(errno: Int32, _ message: String) {
        self.errno = errno
        self.message = message
        switch errno {
        case ENOSPC, EDQUOT: kind = .noSpace
        case ENOENT: kind = .notFound
        default: kind = .io
        }
    }
    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
        switch kind {
        case .conflict: errno = EAGAIN
        case .unavailable: errno = EHOSTUNREACH
        case .notFound: errno = ENOENT
        case .noSpace: errno = ENOSPC
        case .corrupt, .trimmed, .io: errno = EIO
        }
    }
    public var description: String { "\(message) (errno \(errno): \(String(cString: strerror(errno))))" }
}

/// A position in the store's change log. Every commit gets the next one; 0 is "before any".
public typealias ChangeSeq = Int64

/// What a batch expects of the store when it commits. If any does not hold, nothing of the batch
/// is written and the commit fails with a `.conflict` error, instead of overwriting what another
/// writer did meanwhile.
public enum Expectation: Sendable, Equatable, Codable {
    /// Folder `parent` has no entry `name`.
    case nameFree(parent: InodeNumber, name: [UInt8])
    /// Entry `name` of folder `parent` names `child`.
    case nameIs(parent: InodeNumber, name: [UInt8], child: InodeNumber)
    /// Node `ino` exists and was last put by the commit `change`.
    case nodeAt(ino: InodeNumber, change: ChangeSeq)
    /// Container `identifier` is registered with this root (nil: not registered).
    case containerRoot(identifier: String, root: InodeNumber?)
    /// The model's `meta` key holds `value` (nil: it is absent).
    case metaIs(key: String, value: String?)
}

/// One commit: its changes, what they assume, and who makes them.
public struct Batch: Sendable, Equatable {
    public var mutations: [Mutation]
    public var expectations: [Expectation]
    /// The writer (a daemon on a device), as the change log records it.
    public var writer: String
    /// The change-log position of the state the batch was staged over (0: not said). A store
    /// that queues batches while its servers are out of reach numbers them on from there.
    public var position: ChangeSeq
    /// The token its change-log row carries (nil: the store picks one). A batch committed again
    /// under the same token after a crash is found by it instead of landing twice.
    public var token: String?
    /// Every expectation was read from the state at `position` (a model staging over its own
    /// namespace, which holds exactly the log's batches up to there): a store whose log still
    /// ends at `position` knows they hold without reading them again. Not stored with the batch:
    /// a batch applied again later (a journal's, after a crash) is always checked.
    public var expectationsReadAtPosition: Bool
    public init(_ mutations: [Mutation], expecting expectations: [Expectation] = [], writer: String = "",
                position: ChangeSeq = 0, token: String? = nil, expectationsReadAtPosition: Bool = false) {
        self.mutations = mutations; self.expectations = expectations; self.writer = writer; self.position = position
        self.token = token; self.expectationsReadAtPosition = expectationsReadAtPosition
    }
}

/// A batch a store queued while its servers were out of reach and could not apply as it was
/// once they answered (what it expected no longer held): the model settles it over the state
/// of now, keeping what the user wrote.
public struct QueuedBatch: Sendable, Equatable {
    public var id: UInt64
    /// Its expectations name change-log positions of now; its token is the one to commit it with.
    public var batch: Batch
    public init(id: UInt64, batch: Batch) { self.id = id; self.batch = batch }
}

/// What a store holds queued on this machine for servers that do not answer.
public struct QueueState: Sendable, Equatable {
    /// Batches waiting to be sent.
    public var changes: Int
    /// Content chunks waiting to be uploaded, and their bytes.
    public var chunks: Int
    public var bytes: Int64
    /// When the oldest waiting batch was made (nanoseconds since the epoch; 0: none waits).
    public var since: Int64
    /// Batches sent that wait for the model to settle them (`OfflineQueue.nextUnsettled`).
    public var unsettled: Int
    /// This daemon started from this machine's copy of the namespace, and the servers have not
    /// answered since (what it shows is what this machine last knew).
    public var fromLocalCopy: Bool
    public init(changes: Int = 0, chunks: Int = 0, bytes: Int64 = 0, since: Int64 = 0, unsettled: Int = 0,
                fromLocalCopy: Bool = false) {
        self.changes = changes; self.chunks = chunks; self.bytes = bytes; self.since = since; self.unsettled = unsettled
        self.fromLocalCopy = fromLocalCopy
    }
}

/// A store that keeps working while its servers are out of reach: it queues batches durably
/// on this machine, sends them in order once the servers answer, and hands the model those
/// whose expectations no longer held then.
public protocol OfflineQueue: AnyObject, Sendable {
    /// Reserves ids ahead (inodes, versions, chunks) while the servers answer, so that files can
    /// be made and written once they do not. A daemon calls this as it starts.
    func prepare() throws(StoreError)
    var queued: QueueState { get }
    /// Sends the queue if the servers answer again (tried at most once a second; the change
    /// feed calls this before it reads the change log, and never with the model's locks held).
    func sendIfDue()
    /// The oldest batch the model has to settle, nil when there is none (or the store must be
    /// loaded again first).
    func nextUnsettled() -> QueuedBatch?
    /// `id` is settled, committed at change-log position `seq` (nil: nothing of it was), which
    /// put these of its nodes as it had them (nil: all): later batches that expected its
    /// position for one of them expect `seq`; for its other nodes, nothing holds.
    func settled(_ id: UInt64, at seq: ChangeSeq?, nodes: Set<InodeNumber>?) throws(StoreError)
    /// `id` cannot be settled (it keeps failing): it is kept aside on this machine's disk, named
    /// in the log, and the queue goes on without it.
    func setAside(_ id: UInt64)
    /// The files that queued batches made or wrote and that were sent as they were made, since
    /// the last call, once the store was loaded again (another machine may have deleted a
    /// folder they are in meanwhile).
    func takeSent() -> Set<InodeNumber>
}

/// A committed batch, as the change log returns it.
public struct ChangeRecord: Sendable, Equatable {
    public var seq: ChangeSeq
    public var writer: String
    public var mutations: [Mutation]
    public init(seq: ChangeSeq, writer: String, mutations: [Mutation]) {
        self.seq = seq; self.writer = writer; self.mutations = mutations
    }
}

/// Content is split into chunks of this size. Chunk `i` covers bytes [i*chunkSize, (i+1)*chunkSize).
public let chunkSize = 1 << 20

/// A working copy may hold a chunk in pages of this size (`WorkFile.markPages`), so that a small
/// write into a big file brings in a page of the base version, not its whole chunk.
public let pageSize = 1 << 12

/// Which pages (`pageSize` bytes each) of one chunk a working copy holds: a 256-bit set.
public struct PageSet: Sendable, Hashable {
    public static let count = chunkSize / pageSize
    private var words: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)

    public init() {}

    /// The pages of [start, end), byte offsets within the chunk, that the range touches.
    public init(touching start: Int, _ end: Int) {
        guard end > start else { return }
        for page in (start / pageSize)...((end - 1) / pageSize) { insert(page) }
    }

    /// From its 32-byte little-endian form (as a map stores it).
    public init(_ bytes: some Collection<UInt8>) {
        for (i, byte) in bytes.prefix(Self.count / 8).enumerated() {
            setWord(i / 8, word(i / 8) | UInt64(byte) << UInt64(i % 8 * 8))
        }
    }

    /// The 32-byte little-endian form.
    public var bytes: [UInt8] {
        (0..<(Self.count / 8)).map { i in UInt8(truncatingIfNeeded: word(i / 8) >> UInt64(i % 8 * 8)) }
    }

    private func word(_ i: Int) -> UInt64 {
        switch i { case 0: words.0; case 1: words.1; case 2: words.2; default: words.3 }
    }

    private mutating func setWord(_ i: Int, _ value: UInt64) {
        switch i { case 0: words.0 = value; case 1: words.1 = value; case 2: words.2 = value; default: words.3 = value }
    }

    public func contains(_ page: Int) -> Bool {
        page >= 0 && page < Self.count && word(page / 64) & (1 << UInt64(page % 64)) != 0
    }

    public mutating func insert(_ page: Int) {
        guard page >= 0 && page < Self.count else { return }
        setWord(page / 64, word(page / 64) | (1 << UInt64(page % 64)))
    }

    public mutating func formUnion(_ other: PageSet) {
        for i in 0..<4 { setWord(i, word(i) | other.word(i)) }
    }

    public func isSuperset(of other: PageSet) -> Bool {
        (0..<4).allSatisfy { word($0) & other.word($0) == other.word($0) }
    }

    public var isEmpty: Bool { (0..<4).allSatisfy { word($0) == 0 } }
    public var isFull: Bool { (0..<4).allSatisfy { word($0) == .max } }

    public static func == (a: PageSet, b: PageSet) -> Bool { (0..<4).allSatisfy { a.word($0) == b.word($0) } }
    public func hash(into hasher: inout Hasher) { for i in 0..<4 { hasher.combine(word(i)) } }
}

public enum NodeKind: UInt8, Sendable, Codable {
    case regular = 1, directory, symlink, fifo, socket, characterDevice, blockDevice
}

/// A reference to one chunk of a version. `blob == 0` is a hole (reads as zeros). A blob shorter
/// than `chunkSize` reads as zeros past its end.
public struct ChunkRef: Sendable, Hashable, Codable {
    public var blob: BlobID
    public var length: UInt32
    /// Checksum of the blob's bytes (see `contentChecksum`), to detect a blob that never reached
    /// the disk before a power cut.
    public var checksum: UInt64
    public init(blob: BlobID, length: UInt32, checksum: UInt64) {
        self.blob = blob
        self.length = length
        self.checksum = checksum
    }
    public static let hole = ChunkRef(blob: 0, length: 0, checksum: 0)
    public var isHole: Bool { blob == 0 }
}

/// Times are nanoseconds since the epoch.
public struct NodeRecord: Sendable, Equatable, Codable {
    public var ino: InodeNumber
    /// Identifier of the container this node belongs to (e.g. "iCloud.com.example.TestDrive").
    public var container: String
    public var kind: NodeKind
    /// Permission bits including set-user-ID, set-group-ID and sticky; no file-type bits.
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var nlink: UInt32
    public var size: UInt64
    public var atime: Int64
    public var mtime: Int64
    public var ctime: Int64
    public var btime: Int64
    public var rdev: UInt64
    /// Symlink target bytes (symlinks only).
    public var target: [UInt8]
    /// Current version of a regular file's content; nil for an empty file never published.
    public var currentVersion: VersionID?

    public init(ino: InodeNumber, container: String, kind: NodeKind, mode: UInt32, uid: UInt32,
                gid: UInt32, nlink: UInt32, size: UInt64, atime: Int64, mtime: Int64, ctime: Int64,
                btime: Int64, rdev: UInt64 = 0, target: [UInt8] = [], currentVersion: VersionID? = nil) {
        self.ino = ino; self.container = container; self.kind = kind; self.mode = mode
        self.uid = uid; self.gid = gid; self.nlink = nlink; self.size = size
        self.atime = atime; self.mtime = mtime; self.ctime = ctime; self.btime = btime
        self.rdev = rdev; self.target = target; self.currentVersion = currentVersion
    }
}

public struct DirentRecord: Sendable, Equatable, Codable {
    public var parent: InodeNumber
    public var name: [UInt8]
    public var child: InodeNumber
    public init(parent: InodeNumber, name: [UInt8], child: InodeNumber) {
        self.parent = parent; self.name = name; self.child = child
    }
}

public struct XattrRecord: Sendable, Equatable, Codable {
    public var ino: InodeNumber
    public var name: [UInt8]
    public var value: [UInt8]
    public init(ino: InodeNumber, name: [UInt8], value: [UInt8]) {
        self.ino = ino; self.name = name; self.value = value
    }
}

public enum VersionOrigin: String, Sendable, Codable {
    /// Published on last close, idle time, fsync or unmount.
    case published
    /// Rebuilt at start-up from a working copy a crashed daemon left unpublished.
    case recovered
    /// Published on a base that was no longer current (another writer published first): kept
    /// beside the current version, never over it.
    case conflict
    /// An older version published again as current, or copied beside its file, by the user.
    case restored
}

public struct VersionRecord: Sendable, Equatable, Codable {
    public var id: VersionID
    public var ino: InodeNumber
    public var created: Int64
    public var size: UInt64
    public var chunks: [ChunkRef]
    public var origin: VersionOrigin
    /// Host that published it (for conflict copies later).
    public var device: String
    /// The file it was published for, when `moveVersions` took it into this one's history (a
    /// rename over that file, a repair); nil for the file's own. A revert after a power cut goes
    /// back only to a file's own content: a moved-in version is content this file never held.
    public var movedFrom: InodeNumber?
    public init(id: VersionID, ino: InodeNumber, created: Int64, size: UInt64, chunks: [ChunkRef],
                origin: VersionOrigin, device: String, movedFrom: InodeNumber? = nil) {
        self.id = id; self.ino = ino; self.created = created; self.size = size
        self.chunks = chunks; self.origin = origin; self.device = device; self.movedFrom = movedFrom
    }
}

/// A container as registered (settings frozen until the manifest's CFBundleVersion grows).
public struct ContainerRecord: Sendable, Equatable, Codable {
    public var identifier: String
    public var bundleIdentifier: String
    public var name: String
    public var isPublic: Bool
    /// "None", "One" or "Any".
    public var folderLevels: String
    public var registeredVersion: String
    public var manifestPath: String
    /// The container's root folder (holds Documents/ and the app's private data).
    public var rootIno: InodeNumber
    public init(identifier: String, bundleIdentifier: String, name: String, isPublic: Bool,
                folderLevels: String, registeredVersion: String, manifestPath: String,
                rootIno: InodeNumber) {
        self.identifier = identifier; self.bundleIdentifier = bundleIdentifier; self.name = name
        self.isPublic = isPublic; self.folderLevels = folderLevels
        self.registeredVersion = registeredVersion; self.manifestPath = manifestPath
        self.rootIno = rootIno
    }
}

public enum Mutation: Sendable, Equatable, Codable {
    /// Insert or replace.
    case putNode(NodeRecord)
    /// Remove the node, its xattrs and its versions (versions' blobs become garbage).
    case deleteNode(InodeNumber)
    case putDirent(DirentRecord)
    case deleteDirent(parent: InodeNumber, name: [UInt8])
    case putXattr(XattrRecord)
    case deleteXattr(ino: InodeNumber, name: [UInt8])
    /// Insert a version (never replaced: versions are immutable).
    case putVersion(VersionRecord)
    case putContainer(ContainerRecord)
    case setMeta(key: String, value: String)
    case deleteMeta(key: String)
    /// Give every version of `from` to `to` (a file replaced by rename keeps its history with
    /// the file that replaced it, as an editor's atomic save expects); each keeps, in
    /// `movedFrom`, the file it was first published for.
    case moveVersions(from: InodeNumber, to: InodeNumber)
    /// Forget one version (retention); its blobs are the caller's to free.
    case deleteVersion(VersionID)
}

/// One string for equal texts read from many rows: a container's identifier, longer than the
/// 15 bytes a string holds inline, would otherwise be a heap allocation in every node loaded
/// (about 80 bytes each with malloc's rounding, 80 MB at a million nodes).
package final class TextInterner {
    private var known: [String] = []
    package init() {}

    package func text(_ bytes: UnsafeRawBufferPointer) -> String {
        for s in known where s.utf8.count == bytes.count {
            let same = s.utf8.withContiguousStorageIfAvailable {
                bytes.isEmpty || memcmp($0.baseAddress!, bytes.baseAddress!, bytes.count) == 0
            } ?? s.utf8.elementsEqual(bytes)
            if same { return s }
        }
        let s = String(decoding: bytes, as: UTF8.self)
        // Containers are few; anything else read through here is not kept.
        if known.count < 32 { known.append(s) }
        return s
    }
}

/// Everything the model keeps in memory, read once at start-up.
public struct StoreSnapshot: Sendable {
    public var nodes: [NodeRecord] = []
    public var dirents: [DirentRecord] = []
    public var xattrs: [XattrRecord] = []
    public var containers: [ContainerRecord] = []
    /// Chunk lists of every node's current version, keyed by version id.
    public var currentVersions: [VersionRecord] = []
    public var meta: [String: String] = [:]
    /// Largest inode and version ids ever used or reserved (ids are never reused).
    public var maxIno: InodeNumber = 0
    public var maxVersion: VersionID = 0
    /// The change log position this snapshot reflects: `changes(since: seq)` continues from it.
    public var seq: ChangeSeq = 0
    /// The commit that last put each of `nodes`, in the same order (what `Expectation.nodeAt`
    /// compares); 0, or missing at the end, where not known. An array beside the nodes, not a
    /// dictionary by inode number: a million-node load spent a sixth of its time hashing into one.
    public var nodeChangeSeqs: [ChangeSeq] = []
    public init() {}

    /// The commit that last put `nodes[i]` (0: not known).
    public func change(ofNodeAt i: Int) -> ChangeSeq { i < nodeChangeSeqs.count ? nodeChangeSeqs[i] : 0 }

    /// The same by inode number, built at each call (for checks and tests, not per node).
    public func nodeChangesByIno() -> [InodeNumber: ChangeSeq] {
        var out: [InodeNumber: ChangeSeq] = [:]
        out.reserveCapacity(nodes.count)
        for (i, n) in nodes.enumerated() { out[n.ino] = change(ofNodeAt: i) }
        return out
    }
}

/// The store assumes several writers (daemons of several views and devices): ids come from the
/// store, a batch says what it expects, and every commit is one entry of an ordered change log
/// that the other writers read to catch up.
public protocol MetadataStore: AnyObject, Sendable {
    func load() throws(StoreError) -> StoreSnapshot
    /// Check the batch's expectations and apply all its mutations in one transaction, in order,
    /// logging it under the next sequence number, which is returned. A failed expectation fails
    /// the whole batch with `.conflict`. `durable`: the transaction reaches stable storage before
    /// this returns (fsync semantics); otherwise it may be lost on power cut but never partially
    /// applied. An empty batch logs nothing (a durable one is a barrier) and returns the last
    /// sequence number.
    @discardableResult
    func commit(_ batch: Batch, durable: Bool) throws(StoreError) -> ChangeSeq
    /// The batches committed after `seq`, oldest first.
    func changes(since seq: ChangeSeq) throws(StoreError) -> [ChangeRecord]
    /// The batches committed after `seq` by writers other than `writer`, oldest first (a sync
    /// asks whether anyone else put versions since its last one: usually none did, and a store
    /// that can say so without reading its own batches does).
    func changes(since seq: ChangeSeq, notBy writer: String) throws(StoreError) -> [ChangeRecord]
    /// Drop all but the newest `count` change-log records, so the log does not grow forever. A
    /// writer further behind than that gets `.trimmed` from `changes(since:)` and reloads.
    func trimChanges(keepingLast count: Int) throws(StoreError)
    /// Reserve `count` inode numbers (never handed out again, to anyone).
    func reserveInodes(_ count: Int) throws(StoreError) -> ClosedRange<InodeNumber>
    /// Reserve `count` version ids.
    func reserveVersions(_ count: Int) throws(StoreError) -> ClosedRange<VersionID>
    /// All versions of a node, oldest first.
    func versions(of ino: InodeNumber) throws(StoreError) -> [VersionRecord]
    /// How many versions a node has, without reading their chunk lists (retention counts a
    /// file's versions at its first publish after a start: a big file's history is megabytes).
    func versionCount(of ino: InodeNumber) throws(StoreError) -> Int
    func version(_ id: VersionID) throws(StoreError) -> VersionRecord?
    /// Every version of that origin, by id (`ubiquityfs status`: recovered versions).
    func versions(withOrigin origin: VersionOrigin) throws(StoreError) -> [VersionRecord]
    /// Every version of every file, by id (retention's pass over the whole store).
    func allVersions() throws(StoreError) -> [VersionRecord]
    /// Free-space figures of the store's disk, for statfs.
    func capacity() -> StoreCapacity
    /// Every blob any version refers to (for garbage collection).
    func referencedBlobs() throws(StoreError) -> Set<BlobID>
    /// Waits at most `seconds` for a sign that another writer committed (a shared store's
    /// notification), returning early when one comes. A sign only wakes the caller, which then
    /// reads `changes(since:)`: a sign that is missed loses nothing. Stores with no such signs
    /// just wait, and the caller polls.
    func waitForChanges(_ seconds: Double)
    /// Whether the store answers, for a store on other machines; nil for one on this machine.
    func reachability() -> StoreReachability?
}

public extension MetadataStore {
    func versionCount(of ino: InodeNumber) throws(StoreError) -> Int { try versions(of: ino).count }
    func changes(since seq: ChangeSeq, notBy writer: String) throws(StoreError) -> [ChangeRecord] {
        try changes(since: seq).filter { $0.writer != writer }
    }
    func waitForChanges(_ seconds: Double) {
        if seconds > 0 { Thread.sleep(forTimeInterval: seconds) }
    }
    /// A store on this machine's disk is always there.
    func reachability() -> StoreReachability? { nil }
}

/// Whether a store on other machines answers (for `ubiquityfs status`).
public struct StoreReachability: Sendable, Equatable {
    public var online: Bool
    /// Since when it has been so, in nanoseconds since the epoch.
    public var since: Int64
    /// Why it is not (the last failure), or "".
    public var detail: String
    public init(online: Bool, since: Int64, detail: String) {
        self.online = online; self.since = since; self.detail = detail
    }
}

public struct StoreCapacity: Sendable, Equatable {
    public var blockSize: UInt64
    public var totalBlocks: UInt64
    public var freeBlocks: UInt64
    public var availableBlocks: UInt64
    public var totalFiles: UInt64
    public var freeFiles: UInt64
    public init(blockSize: UInt64, totalBlocks: UInt64, freeBlocks: UInt64, availableBlocks: UInt64,
                totalFiles: UInt64, freeFiles: UInt64) {
        self.blockSize = blockSize; self.totalBlocks = totalBlocks; self.freeBlocks = freeBlocks
        self.availableBlocks = availableBlocks; self.totalFiles = totalFiles; self.freeFiles = freeFiles
    }
}

public protocol BlobStore: AnyObject, Sendable {
    /// Store `bytes` (at most `chunkSize`) as a new immutable blob. `durable`: on stable storage
    /// before returning.
    func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef
    /// Read up to `buffer.count` bytes of `blob` from `offset`; returns the count read (short at the
    /// blob's end). Safe to call from many threads at once.
    func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int
    /// Make every blob written so far durable (one syncfs instead of one fsync per blob).
    func syncAll() throws(StoreError)
    /// Make durable every blob written *through this object* so far: enough when no other
    /// writer's commits name chunks it wrote. A store that cannot tell does `syncAll`.
    func syncWritten() throws(StoreError)
    func delete(_ blob: BlobID) throws(StoreError)
    /// Recompute a blob's checksum, for recovery and `check`.
    func verify(_ ref: ChunkRef) -> Bool
    /// Every blob stored, or (with a cutoff) every blob written before that time, in
    /// nanoseconds since the epoch: garbage collection leaves younger blobs alone, since another
    /// writer may have written them for a commit it has not made yet.
    func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID]
}

public extension BlobStore {
    func allBlobs() throws(StoreError) -> [BlobID] { try allBlobs(writtenBefore: nil) }
    func syncWritten() throws(StoreError) { try syncAll() }
}

/// What a store whose chunks live elsewhere (a shared store) keeps on this machine. The model asks
/// through these with no idea where chunks live; a store whose chunks are all local has none of
/// this and every answer is "local".
public protocol LocalChunks: AnyObject, Sendable {
    /// Whether `blob` can be read without the network.
    func isLocal(_ blob: BlobID) -> Bool
    /// Makes `chunk` local if it is not, checking what arrives against the chunk's length and
    /// checksum (a damaged download is never kept, and fails with `.corrupt`).
    func fetch(_ chunk: ChunkRef) throws(StoreError)
    /// Fetch these in the background (read-ahead), checked the same way; never waits.
    func prefetch(_ chunks: [ChunkRef])
    /// Fetch these now (checked) and keep them until evicted (`ubiquityfs pin`).
    func keep(_ chunks: [ChunkRef]) throws(StoreError)
    /// Drop the local copies (`ubiquityfs evict`); reading them fetches them again.
    func evict(_ blobs: [BlobID])
    /// Let these go to the cache's limit like any other (kept no longer, not dropped now).
    func release(_ blobs: [BlobID])
    /// Files and folders pinned (`ubiquityfs pin`): their content is kept as it changes. Kept on
    /// this machine's disk beside the chunks.
    var pinnedFiles: Set<InodeNumber> { get }
    func updatePinnedFiles(_ change: (inout Set<InodeNumber>) -> Void) throws(StoreError)
}

/// A mutable working copy. Byte offsets are file offsets; chunk `i` of the document is at
/// [i*chunkSize, ...) of the working copy. Only chunks marked dirty hold meaningful bytes; the
/// others are read from the base version. The file's logical size is the working copy's size.
public protocol WorkFile: AnyObject, Sendable {
    var ino: InodeNumber { get }
    func pread(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) -> Int
    func pwrite(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError)
    func truncate(to size: Int) throws(StoreError)
    /// Record that chunk `index` now lives in the working copy (persisted in the map, so recovery
    /// knows which chunks to take from here).
    func markDirty(_ index: Int) throws(StoreError)
    /// Whether the copy can hold a chunk in pages (`markPages`); else a chunk comes in whole.
    var keepsPages: Bool { get }
    /// Record that `pages` of chunk `index` (all it holds so far, not just the new ones) now
    /// live in the working copy, its other pages being the base version's. Written after the
    /// pages' bytes, so a crash between leaves the base's pages, never unwritten ones. A chunk
    /// marked dirty is whole, whatever pages were marked before.
    func markPages(_ index: Int, _ pages: PageSet) throws(StoreError)
    /// Mark the copy as made durable by an fsync (`sync` follows): recovery makes such a copy
    /// the current version, what was fsync'd with whatever came after it, as a file system
    /// shows a file after a crash. False where the copy cannot record it (then an fsync
    /// publishes instead). Cleared only with the copy (its publish, `setBase`).
    func markSynced() throws(StoreError) -> Bool
    /// Record the base version the dirty chunks apply to, and the logical size.
    func setBase(_ base: VersionID?, size: UInt64) throws(StoreError)
    /// Mark the working copy finished (every writer closed it: a saved document, which recovery
    /// makes current), with the document's modification time then; nil clears the mark, which
    /// any later change does first.
    func setFinished(mtime: Int64?) throws(StoreError)
    /// fsync the working copy and its map.
    func sync() throws(StoreError)
    /// Delete the working copy and its map.
    func remove()
    /// The file that holds chunk `index` alone, made exactly `length` bytes long (its tail past
    /// what was written reads as zeros), for a blob store to take as the chunk's blob by a name
    /// of its own (`ChunkAdopting`); nil where chunks do not have files of their own. A later
    /// change to the chunk copies the file first (a published working copy is removed anyway).
    func chunkFile(_ index: Int, length: Int) throws(StoreError) -> String?
}

public extension WorkFile {
    func chunkFile(_ index: Int, length: Int) throws(StoreError) -> String? { nil }
    var keepsPages: Bool { false }
    func markSynced() throws(StoreError) -> Bool { false }
    func markPages(_ index: Int, _ pages: PageSet) throws(StoreError) {
        throw StoreError(errno: ENOTSUP, "the working copy of inode \(ino) holds whole chunks only")
    }
}

/// A blob store on the same file system as the working copies: a working copy's chunk file
/// becomes a blob by a second name (a hard link), so published content is written once.
public protocol ChunkAdopting: AnyObject, Sendable {
    /// Makes `path` (`length` bytes whose checksum is `checksum`) a blob as well, the file
    /// keeping its name. `durable` as for `BlobStore.write`.
    func adopt(_ path: String, length: Int, checksum: UInt64, durable: Bool) throws(StoreError) -> ChunkRef
}

/// Blobs that are whole files on this machine (a read's reply can be spliced from them).
public protocol BlobFiles: AnyObject, Sendable {
    /// `blob`'s file, open for reading while the returned object lives.
    func file(_ blob: BlobID) throws(StoreError) -> BlobFile
    /// Have `blobs`' files read into the page cache, on a queue of the store's: the caller does
    /// not wait. A blob that cannot be opened is left for the read that needs it to report.
    func readAhead(_ blobs: [BlobID])
}

/// An open blob file; closed once no one holds it.
public final class BlobFile: Sendable {
    public let fd: Int32
    /// Its size when opened (a blob never changes).
    public let size: Int
    init(_ fd: Int32, size: Int) { self.fd = fd; self.size = size }
    deinit { close(fd) }
}

/// A working copy found at start-up: a daemon died before publishing it.
public struct RecoveredWork: Sendable {
    public var ino: InodeNumber
    public var base: VersionID?
    public var size: UInt64
    public var dirtyChunks: [Int]
    /// Chunks the copy holds some pages of (the rest are the base's), not in `dirtyChunks`.
    public var partialChunks: [Int: PageSet] = [:]
    /// How much of the base version the copy still shows: its least size since the base was
    /// set (a truncate below it and a growth again leaves zeros there, not the base's bytes).
    /// Nil where the copy did not record it (formats before 4).
    public var baseReach: UInt64?
    public var file: any WorkFile
    /// Its last writer had closed it (`setFinished(true)`) and nothing changed it since.
    public var finished: Bool
    /// An fsync made it durable (`markSynced`): it is the file's content, whatever came later.
    public var synced = false
    /// Its bytes are known whole: written since the machine last started, so the kernel's page
    /// cache kept them even though the daemon died (a kill, not a power cut). Unsynced writes of
    /// a working copy from before a restart may be torn.
    public var intact: Bool
    /// The document's modification time: as recorded with the finished mark, else when the
    /// working copy's data last changed (nanoseconds since the epoch; 0 if unknown).
    public var modified: Int64
    public init(ino: InodeNumber, base: VersionID?, size: UInt64, dirtyChunks: [Int], file: any WorkFile,
                finished: Bool = false, intact: Bool = false, modified: Int64 = 0) {
        self.ino = ino; self.base = base; self.size = size; self.dirtyChunks = dirtyChunks; self.file = file
        self.finished = finished; self.intact = intact; self.modified = modified
    }
}

public protocol WorkArea: AnyObject, Sendable {
    /// Create (replacing any previous) the working copy of `ino`, empty, of logical size 0.
    func create(ino: InodeNumber) throws(StoreError) -> any WorkFile
    /// Which boot of the machine this is (its kernel boot id): recorded by each writer while it
    /// runs, so that the next start can tell a writer's crash (same boot: the page cache kept
    /// every write) from a power cut or restart (another boot: unsynced writes may be lost).
    var bootID: String { get }
    /// Whether another writer (another daemon on this store) is running now.
    func otherWritersAlive() -> Bool
    /// Working copies left by writers that are gone (a previous run of this daemon, another
    /// daemon that died), never a live writer's.
    func leftovers() throws(StoreError) -> [RecoveredWork]
    /// The leftovers have been dealt with (each published or removed): forget where they were.
    func recoveryFinished()
}

public extension MetadataStore {
    /// A batch with no expectations (set-up, tests).
    @discardableResult
    func commit(_ mutations: [Mutation], durable: Bool) throws(StoreError) -> ChangeSeq {
        try commit(Batch(mutations), durable: durable)
    }
}

/// The parts of one backing store, opened together. Every part but `work` is shared by all the
/// store's writers; `work` is one writer's own.
public struct BackingStore: Sendable {
    public var metadata: any MetadataStore
    public var blobs: any BlobStore
    public var work: any WorkArea
    public var locks: any LockTable
    public var durability: any Durability
    /// This machine's copies of chunks that live elsewhere; nil when every chunk is local.
    public var localChunks: (any LocalChunks)?
    /// The queue of changes made while the store's servers were out of reach; nil for a store
    /// on this machine.
    public var offline: (any OfflineQueue)?
    /// Whether chunks written for a commit that failed may be deleted at once. False for a
    /// store where a commit's outcome can be unknown (a server's answer lost on the way): the
    /// commit may have landed, so its chunks are left to garbage collection, which frees them
    /// only if no version names them.
    public var deletesChunksOfFailedCommits: Bool
    /// Whether an fsync publishes the working copy (so what it made durable is on the store's
    /// servers, not only on this machine's disk) rather than making the working copy durable
    /// where it is. By default, where chunks live elsewhere (`localChunks`).
    public var fsyncPublishes: Bool
    /// `durability` defaults to the local-disk machinery over these parts (`LocalDurability`);
    /// a store whose commits are durable on their own passes its own.
    public init(metadata: any MetadataStore, blobs: any BlobStore, work: any WorkArea, locks: any LockTable,
                durability: (any Durability)? = nil, localChunks: (any LocalChunks)? = nil,
                deletesChunksOfFailedCommits: Bool = true, offline: (any OfflineQueue)? = nil, fsyncPublishes: Bool? = nil) {
        self.metadata = metadata; self.blobs = blobs; self.work = work; self.locks = locks
        self.offline = offline
        self.durability = durability ?? LocalDurability(metadata: metadata, blobs: blobs, work: work)
        self.localChunks = localChunks
        self.deletesChunksOfFailedCommits = deletesChunksOfFailedCommits
        self.fsyncPublishes = fsyncPublishes ?? (localChunks != nil)
    }
}

/// Checksum of chunk content: 64-bit FNV-1a over 8-byte words, then the tail bytes. Not
/// cryptographic: it detects torn or missing blobs, not tampering.
public func contentChecksum(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    let prime: UInt64 = 0x0000_0100_0000_01b3
    let words = bytes.count / 8
    var i = 0
    while i < words {
        hash = (hash ^ bytes.loadUnaligned(fromByteOffset: i * 8, as: UInt64.self)) &* prime
        i += 1
    }
    var j = words * 8
    while j < bytes.count {
        hash = (hash ^ UInt64(bytes[j])) &* prime
        j += 1
    }
    return hash ^ UInt64(bytes.count)
}
