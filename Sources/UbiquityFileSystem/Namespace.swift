// The in-memory namespace: every node, folder entry and extended attribute, loaded from the store
// at start-up and changed only by applying the same `Mutation`s that were just committed to the
// store. So memory and store cannot drift: a batch is committed first, then applied here.
//
// A class, not a struct: there is exactly one namespace, changed in place. As a struct, the
// `Staging` of an operation held a second reference to its dictionaries while `apply` changed
// them, so Swift copied them all on every change: a mkdir cost 184 µs in an empty namespace and
// 21 ms with 100,000 items. Changed under the filesystem's `commits` and
// namespace (write) locks together; read under either.

import UbiquityStore

final class Namespace: @unchecked Sendable {
    var nodes = NodeTable()
    var children: [InodeNumber: FolderEntries] = [:]
    /// Parent of every folder (folders have exactly one name).
    var parent: [InodeNumber: InodeNumber] = [:]
    var xattrs: [InodeNumber: [[UInt8]: [UInt8]]] = [:]
    /// Chunk list of every regular file's current version.
    var chunks: [InodeNumber: [ChunkRef]] = [:]
    var containers: [String: ContainerRecord] = [:]
    var meta: [String: String] = [:]
    /// Unresolved conflicts by conflict version, kept from `meta` (see `Conflict`).
    private(set) var conflicts: [VersionID: Conflict] = [:]
    /// Items in Recently Deleted by node, kept from `meta` (see `TrashRecord`).
    private(set) var trashed: [InodeNumber: TrashRecord] = [:]
    /// Their trash names (the desktop trash's `files/` entries), to choose a free one at a delete.
    private(set) var trashNamesInUse: [[UInt8]: InodeNumber] = [:]
    /// When an item last came into or left Recently Deleted here (wall clock at apply): the
    /// desktop trash's folders carry it as their mtime, which GVfs compares to know it must
    /// list them again.
    private(set) var trashChangedAt: Int64 = 0
    /// The folders among `trashed` (a file published inside one looks for it).
    private(set) var trashedFolders: Set<InodeNumber> = []
    /// How many items of `trashed` want each trash name (more than one: the desktop's trash
    /// shows the later ones as `name.2.ext`, …).
    private(set) var trashNameCounts: [[UInt8]: Int] = [:]
    /// How many trash names more than one item wants (two writers deleting alike names at
    /// once). While there are any, the desktop trash's names are worked out whole at each change.
    private(set) var trashNameCollisions = 0
    /// The items whose Recently Deleted record changed, in order, since `trashEpoch` began: the
    /// desktop trash's names follow them one by one, instead of being worked out again for
    /// every item at each change (GIO lists the trash again after each item it deletes, so
    /// emptying 17,000 items took minutes).
    private(set) var trashEdits: [InodeNumber] = []
    /// Moves on when `trashEdits` no longer tells every change (a reload, a container's change,
    /// or many edits): the names are then worked out again from scratch.
    private(set) var trashEpoch: UInt64 = 0
    var maxIno: InodeNumber = 0
    var maxVersion: VersionID = 0
    /// The change log position this namespace reflects: every batch up to it is applied.
    var seq: ChangeSeq = 0
    /// Chunk lists of the versions the batch being applied makes current (read by the applier).
    private var loadedChunks: [VersionID: [ChunkRef]] = [:]

    init() {}

    init(snapshot: StoreSnapshot) {
        // Sized up front: growing a table of a million entries rehashes it some twenty times.
        nodes.reserveCapacity(snapshot.nodes.count)
        chunks.reserveCapacity(snapshot.currentVersions.count)
        for (i, n) in snapshot.nodes.enumerated() { nodes.put(n, change: snapshot.change(ofNodeAt: i)) }
        for d in snapshot.dirents {
            children[d.parent, default: [:]][d.name] = d.child
            if nodes.kind(of: d.child) == .directory { parent[d.child] = d.parent }
        }
        for x in snapshot.xattrs { xattrs[x.ino, default: [:]][x.name] = x.value }
        for v in snapshot.currentVersions where nodes[v.ino]?.currentVersion == v.id { chunks[v.ino] = v.chunks }
        for c in snapshot.containers { containers[c.identifier] = c }
        meta = snapshot.meta
        conflicts = Conflict.all(in: meta)
        trashed = TrashRecord.all(in: meta)
        for r in trashed.values {
            trashNamesInUse[r.trashName ?? r.name] = r.ino
            trashNameCounts[r.trashName ?? r.name, default: 0] += 1
        }
        trashNameCollisions = trashNameCounts.values.filter { $0 > 1 }.count
        trashedFolders = Set(trashed.keys.filter { nodes.kind(of: $0) == .directory })
        maxIno = snapshot.maxIno
        maxVersion = snapshot.maxVersion
        seq = snapshot.seq
    }

    /// Take every table of `other` (a namespace loaded again from the store).
    func replace(with other: Namespace) {
        nodes = other.nodes
        children = other.children
        parent = other.parent
        xattrs = other.xattrs
        chunks = other.chunks
        containers = other.containers
        meta = other.meta
        conflicts = other.conflicts
        trashed = other.trashed
        trashNamesInUse = other.trashNamesInUse
        trashedFolders = other.trashedFolders
        trashNameCounts = other.trashNameCounts
        trashNameCollisions = other.trashNameCollisions
        trashChangedAt = nowNanoseconds()
        startTrashEpoch()
        maxIno = other.maxIno
        maxVersion = other.maxVersion
        seq = other.seq
    }

    /// What the kernel may hold that `other` changes: the names that differ (and their
    /// folders), the nodes that differ; and those nodes.
    func differences(to other: Namespace) -> ([KernelInvalidation], Set<InodeNumber>) {
        var out: [KernelInvalidation] = []
        var changed: Set<InodeNumber> = []
        for (ino, n) in nodes where other.nodes[ino] != n || other.xattrs[ino] != xattrs[ino] || other.chunks[ino] != chunks[ino] {
            out.append(.node(ino))
            changed.insert(ino)
        }
        for (ino, _) in other.nodes where nodes[ino] == nil { changed.insert(ino) }
        if containers != other.containers {
            // The mount root's entries are named after containers (by name or by identifier).
            out.append(.node(UbiquityFileSystem.rootID))
            for c in Array(containers.values) + Array(other.containers.values) {
                out.append(.entry(parent: UbiquityFileSystem.rootID, name: Array(c.name.utf8)))
                out.append(.entry(parent: UbiquityFileSystem.rootID, name: Array(c.identifier.utf8)))
            }
        }
        // Names on either side: the kernel may hold a name as missing (a negative entry) too.
        for folder in Set(children.keys).union(other.children.keys) {
            let names = children[folder] ?? [:], theirs = other.children[folder] ?? [:]
            guard names != theirs else { continue }
            out.append(.node(folder))
            for (name, child) in names where theirs[name] != child { out.append(.entry(parent: folder, name: name)) }
            for name in theirs.keys where names[name] == nil { out.append(.entry(parent: folder, name: name)) }
        }
        return (out, changed)
    }

    /// Apply the batch the store committed as `seq` (this writer's or another's, in log order).
    /// `chunks` holds the chunk list of every version the batch makes current (the applier reads
    /// those the batch does not carry, such as a revert's, from the store beforehand, as no I/O
    /// is done under the namespace lock).
    func apply(_ batch: [Mutation], seq: ChangeSeq, chunks: [VersionID: [ChunkRef]]) {
        loadedChunks = chunks
        for m in batch { apply(m, seq: seq) }
        loadedChunks = [:]
        self.seq = max(self.seq, seq)
    }

    private func apply(_ m: Mutation, seq: ChangeSeq) {
        switch m {
        case .putNode(let n):
            let old = nodes[n.ino]
            nodes.put(n, change: seq)
            maxIno = max(maxIno, n.ino)
            if n.kind == .directory, children[n.ino] == nil { children[n.ino] = [:] }
            if let v = n.currentVersion, v != old?.currentVersion {
                // Missing only if the store could not say (logged by the applier).
                if let c = loadedChunks[v] { chunks[n.ino] = c }
            }
            if n.currentVersion == nil { chunks[n.ino] = nil }
            if trashed[n.ino] != nil, old?.container != n.container || old?.kind != n.kind { noteTrashEdit(n.ino) }
        case .deleteNode(let ino):
            if trashed[ino] != nil { noteTrashEdit(ino) }
            nodes.remove(ino)
            children[ino] = nil
            parent[ino] = nil
            xattrs[ino] = nil
            chunks[ino] = nil
        case .putDirent(let d):
            children[d.parent, default: [:]][d.name] = d.child
            if nodes.kind(of: d.child) == .directory { parent[d.child] = d.parent }
        case .deleteDirent(let p, let name):
            if let child = children[p]?.removeValue(forKey: name), parent[child] == p,
               nodes.kind(of: child) == .directory {
                parent[child] = nil
            }
        case .putXattr(let x):
            xattrs[x.ino, default: [:]][x.name] = x.value
        case .deleteXattr(let ino, let name):
            xattrs[ino]?[name] = nil
        case .putVersion(let v):
            maxVersion = max(maxVersion, v.id)
        case .putContainer(let c):
            containers[c.identifier] = c
            startTrashEpoch()   // what the desktop trash shows depends on the containers
        case .moveVersions, .deleteVersion:
            break   // only older versions move; current chunk lists are unchanged
        case .setMeta(let key, let value):
            meta[key] = value
            Conflict.note(key: key, value: value, in: &conflicts)
            noteTrash(key: key, value: value)
        case .deleteMeta(let key):
            meta[key] = nil
            Conflict.note(key: key, value: nil, in: &conflicts)
            noteTrash(key: key, value: nil)
        }
    }
}

extension Namespace {
    /// Keep `trashed` and `trashNamesInUse` in step with one change of `meta`.
    private func noteTrash(key: String, value: String?) {
        guard key.hasPrefix(TrashRecord.prefix), let ino = InodeNumber(key.dropFirst(TrashRecord.prefix.count)) else { return }
        if let old = trashed[ino] {
            let name = old.trashName ?? old.name
            if trashNamesInUse[name] == ino { trashNamesInUse[name] = nil }
            if let n = trashNameCounts[name] {
                trashNameCounts[name] = n > 1 ? n - 1 : nil
                if n == 2 { trashNameCollisions -= 1 }
            }
        }
        TrashRecord.note(key: key, value: value, in: &trashed)
        if let new = trashed[ino] {
            trashNamesInUse[new.trashName ?? new.name] = ino
            trashNameCounts[new.trashName ?? new.name, default: 0] += 1
            if trashNameCounts[new.trashName ?? new.name] == 2 { trashNameCollisions += 1 }
        }
        if trashed[ino] != nil, nodes.kind(of: ino) == .directory { trashedFolders.insert(ino) } else { trashedFolders.remove(ino) }
        trashChangedAt = nowNanoseconds()
        noteTrashEdit(ino)
    }

    private func noteTrashEdit(_ ino: InodeNumber) {
        if trashEdits.count >= Self.trashEditsKept { startTrashEpoch() } else { trashEdits.append(ino) }
    }

    /// Past this many edits, the desktop trash's names are worked out again once instead.
    static let trashEditsKept = 4096

    private func startTrashEpoch() {
        trashEpoch &+= 1
        trashEdits = []
    }

    /// The storage of each top-level table, to let tests check that a change is made in place
    /// (a copy on write gives a table new storage). A native Dictionary is one pointer to it.
    var storageIdentity: [UInt] {
        func bits<K, V>(_ d: [K: V]) -> UInt { withUnsafeBytes(of: d) { $0.load(as: UInt.self) } }
        return nodes.storageIdentity + [bits(children), bits(parent), bits(xattrs), bits(chunks)]
    }

    /// What `batch` assumes of the store, read from this namespace (which it was staged over):
    /// every node it changes is at the change this namespace last saw, every name it sets or
    /// removes is as this namespace has it, every container it registers is as registered here.
    /// New nodes need nothing: their ids are reserved by the store, so unique.
    func expectations(for batch: [Mutation], unchanged: [InodeNumber] = []) -> [Expectation] {
        var out: [Expectation] = []
        var seenNodes: Set<InodeNumber> = []
        var seenNames: Set<[UInt8]> = []   // parent (8 bytes, little endian) + name
        var seenContainers: Set<String> = []
        var seenMeta: Set<String> = []
        func node(_ ino: InodeNumber) {
            guard seenNodes.insert(ino).inserted, let change = nodes.change(of: ino) else { return }
            out.append(.nodeAt(ino: ino, change: change))
        }
        func name(_ parent: InodeNumber, _ name: [UInt8]) {
            var key = withUnsafeBytes(of: parent.littleEndian) { Array($0) }
            key += name
            guard seenNames.insert(key).inserted else { return }
            if let child = children[parent]?[name] {
                out.append(.nameIs(parent: parent, name: name, child: child))
            } else {
                out.append(.nameFree(parent: parent, name: name))
            }
        }
        for ino in unchanged { node(ino) }
        for m in batch {
            switch m {
            case .putNode(let n): node(n.ino)
            case .deleteNode(let ino): node(ino)
            case .putDirent(let d): name(d.parent, d.name)
            case .deleteDirent(let parent, let n): name(parent, n)
            case .putContainer(let c):
                if seenContainers.insert(c.identifier).inserted {
                    out.append(.containerRoot(identifier: c.identifier, root: containers[c.identifier]?.rootIno))
                }
            case .setMeta(let key, _), .deleteMeta(let key):
                // A record another writer may change at once (a conflict resolved there while a
                // copy is made here): it must still be as this namespace read it.
                if seenMeta.insert(key).inserted { out.append(.metaIs(key: key, value: meta[key])) }
            case .putXattr, .deleteXattr, .putVersion, .moveVersions, .deleteVersion:
                break   // rows of a node whose change is expected, or the writer's own
            }
        }
        return out
    }
}

/// Inode and version ids reserved from the store in blocks, handed out one by one. Ids are never
/// reused, so ids left in a block when the daemon stops are simply skipped. Guarded by the
/// filesystem's namespace lock (used only while staging).
final class IDPool: @unchecked Sendable {
    /// One reserved block and the next id in it.
    private struct Block<ID: BinaryInteger> {
        var range: ClosedRange<ID>?
        var next: ID = 0
        mutating func take(refill: () throws(StoreError) -> ClosedRange<ID>) throws(StoreError) -> ID {
            if range == nil || next > range!.upperBound {
                let r = try refill()
                range = r
                next = r.lowerBound
            }
            defer { next += 1 }
            return next
        }
    }

    private let store: any MetadataStore
    private var inodes = Block<InodeNumber>()
    private var versions = Block<VersionID>()
    static let block = 256

    init(store: any MetadataStore) { self.store = store }

    func inode() throws(StoreError) -> InodeNumber {
        try inodes.take { () throws(StoreError) in try store.reserveInodes(Self.block) }
    }

    func version() throws(StoreError) -> VersionID {
        try versions.take { () throws(StoreError) in try store.reserveVersions(Self.block) }
    }
}

/// The changes one operation makes, staged over the namespace it read: reads see staged nodes.
/// `base` is the namespace itself (not a copy), which the operation only reads.
struct Staging {
    let base: Namespace
    private(set) var mutations: [Mutation] = []
    /// Blobs of versions this batch prunes that no remaining version uses.
    var prunedBlobs: Set<BlobID> = []
    /// Nodes the operation read but does not change, whose change must still fail it (the
    /// folders above a folder's new place: a concurrent move could make a cycle).
    private(set) var unchanged: [InodeNumber] = []
    /// Version counts to record once the batch commits (a retried staging must not count twice).
    var versionCounts: [InodeNumber: Int] = [:]
    mutating func expectUnchanged(_ ino: InodeNumber) { unchanged.append(ino) }
    private var staged: [InodeNumber: NodeRecord] = [:]
    private let ids: IDPool

    init(_ base: Namespace, ids: IDPool) {
        self.base = base
        self.ids = ids
    }

    func node(_ ino: InodeNumber) -> NodeRecord? { staged[ino] ?? base.nodes[ino] }

    mutating func put(_ n: NodeRecord) {
        staged[n.ino] = n
        mutations.append(.putNode(n))
    }
    mutating func add(_ m: Mutation) { mutations.append(m) }
    func newIno() throws -> InodeNumber {
        do { return try ids.inode() } catch { throw FSError(error) }
    }
    func newVersion() throws -> VersionID {
        do { return try ids.version() } catch { throw FSError(error) }
    }
}
