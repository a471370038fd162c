// UbiquityFileSystem: the filesystem model. Operations take plain values and return plain values;
// nothing here knows FUSE (the bridge in UbiquityFuse adapts it), so almost everything is tested
// without a kernel.
//
// Node ids. Kernel node ids are the store's inode numbers, which are never reused; the mount root
// is 1 and the only node that is not in the store. In the drive view each container folder *is*
// the container's Documents node (as Finder shows it), so everything below the root is real.
// All metadata lives in memory (`Namespace`), so `forget` has nothing to free and a node can
// always be found by id while it exists.
//
// Consistency. Every namespace change runs under `commits`, which serializes changes: the
// operation reads the namespace, stages its mutations, commits them to the metadata store in one
// transaction, and only then applies them to memory, taking the namespace lock (`ns`) for writing
// just for that. The commit is the linearization point; if it fails (full disk, I/O error) memory
// is untouched and the caller gets the errno. Serializing changes keeps memory and store in the
// same order without a second queue. Lookups, getattr and readdir take `ns` shared, never do I/O
// under it, and never wait for a commit.
//
// Lock order: Document.lock → commits → ns (namespace) → docsLock. Never the reverse.

import Foundation
import UbiquityStore

public final class UbiquityFileSystem: @unchecked Sendable {
    public static let rootID: UInt64 = 1

    public let view: View
    let store: BackingStore
    let device: String
    let mountTime = nowNanoseconds()
    let ownerUID = getuid()
    let ownerGID = getgid()
    /// Publish files held open after this long without a change.
    public var idlePublishNanoseconds: UInt64 = 2_000_000_000
    /// Which old versions go and how long Recently Deleted keeps items (see `RetentionPolicy`):
    /// the store's setting, the defaults until one is set. Setting it commits it for every
    /// writer on the store.
    public var retention: RetentionPolicy {
        get { ns.read { Self.storedRetention(in: state.meta) } }
        set {
            do { try setRetention(newValue) } catch { log("storing the retention settings failed: \(error)") }
        }
    }
    static let retentionKey = "settings.retention"

    /// The retention setting a store's `meta` holds (the defaults if none).
    public static func storedRetention(in meta: [String: String]) -> RetentionPolicy {
        meta[retentionKey].flatMap { RetentionPolicy.parse($0) } ?? RetentionPolicy()
    }

    public func setRetention(_ policy: RetentionPolicy) throws(FSError) {
        try typed {
            try mutate { s in
                if s.base.meta[Self.retentionKey] != policy.spec { s.add(.setMeta(key: Self.retentionKey, value: policy.spec)) }
            }
        }
    }

    /// Versions kept per file at most. Pruning runs when a file has half as many again (and at
    /// each collection), so it costs one listing per many publishes.
    public var versionsToKeep: Int {
        get { retention.maxPerFile }
        set { retention.maxPerFile = newValue }
    }
    /// Publish when the last writer closes (flush), not at the release after it. Off only in
    /// tests, to stand for a daemon killed between the two.
    var publishesOnClose = true
    /// Wall-clock time (ns) for Recently Deleted's dates and expiry; tests move it on.
    public var clock: @Sendable () -> Int64 = { nowNanoseconds() }

    /// Serializes every change to `state` (this writer's commits, other writers' batches). Its
    /// holder reads `state` without `ns` (nobody else changes it), stages, commits to the store,
    /// and takes `ns` for writing only to apply: lookups never wait for store I/O.
    let commits = Lock()
    let ns = RWLock()
    let state: Namespace                      // written under commits + ns (write); read under either
    let ids: IDPool                           // guarded by commits
    /// What other writers changed since the change feed last asked (catch-ups inside `mutate`
    /// apply remote batches too).
    var pendingInvalidations: [KernelInvalidation] = []   // guarded by commits
    /// Files whose current version another writer changed, for open documents to follow (done
    /// by the change feed, which holds no document lock: lock order is document, then commits).
    var pendingRebases: Set<InodeNumber> = []   // guarded by commits
    /// Failed tries to settle each queued batch (the change feed's thread alone uses it).
    var settleFailures: [UInt64: (count: Int, next: UInt64)] = [:]
    /// The first wait before a queued batch that failed to settle is tried again (doubling).
    var settleBackoff: UInt64 = 1_000_000_000
    /// Other writers' changes to replay for programs watching the mount (see WatchEvents.swift).
    var pendingWatches: [PendingWatch] = []   // guarded by commits
    var ghostCount: UInt64 = 0                // guarded by commits
    /// Files other writers changed lately: the kernel caches their attributes for no time.
    var changedElsewhere = RecentRemoteChanges()   // written under commits + ns (write); read under ns
    /// This daemon as a writer of the store's change log.
    public let writerID: String
    var versionCounts: [InodeNumber: Int] = [:] // guarded by commits; filled on first publish
    /// What this view shows and allows; set once, in init (it names the active containers).
    var policy: ViewPolicy

    /// Files another writer deleted (replaced by its rename, say) while this kernel still held
    /// them by their old name: kept here, read-only, until the kernel forgets them, so that an
    /// open racing with that writer's change reads the file as it was, as on a local disk.
    var ghosts: [InodeNumber: (node: NodeRecord, chunks: [ChunkRef])] = [:]   // guarded by docsLock

    let docsLock = Lock()
    var docs: [InodeNumber: Document] = [:]   // guarded by docsLock
    var handles: [UInt64: Handle] = [:]       // guarded by docsLock
    var nextHandle: UInt64 = 1                // guarded by docsLock
    /// Kernel references (entry replies minus forgets) of nodes, counted only when the bridge
    /// reports them: a node whose last name is gone lives on while the kernel still refers to
    /// it (an O_PATH descriptor, a removed working folder), as on a local filesystem.
    /// With the name the kernel last got each by (a hint: checked against the namespace before
    /// use), for a replay of another writer's change (see WatchEvents.swift).
    var kernelRefs = KernelReferences()  // guarded by docsLock
    /// For each file the kernel opened, the version current at its last open (0: none yet):
    /// what its page cache may hold, besides what was written through it (`keepsKernelCache`).
    var kernelContent: [InodeNumber: VersionID] = [:]  // guarded by docsLock
    struct KernelName { let parent: InodeNumber; let name: [UInt8] }

    /// Lock requests waiting for another owner's lock to go (see Locks.swift).
    let lockWaiters = LockWaiters()
    let lockHandles = LockHandles()

    enum Handle {
        case file(Document, flags: Int32)
        case directory([DirectoryEntry])
        /// A file of the desktop trash's `info/` (see DesktopTrash.swift).
        case trash(TrashNode, flags: Int32)
    }
    let trashPlaceholders = TrashPlaceholders()
    let trashNameCache = TrashNameCache()
    let trashedTrees = TrashedTrees()
    /// Downloads that keep pinned files' new content (see `followPins`), one at a time, in order.
    let pinWork = DispatchQueue(label: "ubiquityfs.pins", qos: .utility)

    /// Messages for the daemon's log (recovery, registration changes, failed background publishes).
    public var log: @Sendable (String) -> Void = { _ in }

    /// Open the model over `store`, registering `containers` (creating the root and `Documents`
    /// of new ones) and recovering working copies a crashed daemon left behind.
    /// `retention`: a new retention setting for the store, stored before the start-up's own
    /// collection prunes by it.
    public init(store: BackingStore, containers: [ContainerInfo], view: View,
                device: String = ProcessInfo.processInfo.hostName, snapshot: StoreSnapshot? = nil,
                retention: RetentionPolicy? = nil, log: @escaping @Sendable (String) -> Void = { _ in }) throws {
        self.store = store
        self.view = view
        self.device = device
        self.log = log
        var active: [String: ContainerInfo] = [:]
        for c in containers where c.active { active[c.identifier] = c }
        policy = ViewPolicy(view: view, active: active)
        let loaded = try snapshot ?? store.metadata.load()
        state = Namespace(snapshot: loaded)
        ids = IDPool(store: store.metadata)
        writerID = "\(device) pid \(getpid()) \(UInt32.random(in: 0...UInt32.max))"
        // The store repairs what a stop of the machine may have left (files whose content did not
        // reach the disk go back to their last whole version) as batches of its change log.
        for repair in try store.durability.begin(writer: writerID, snapshot: loaded) { log(repair) }
        try commits.withLock { try catchUpLocked() }
        // Ids to make files with should the store's servers go out of reach later.
        do { try store.offline?.prepare() } catch { throw FSError(error) }
        try register(containers)
        if let retention, retention != self.retention {
            try setRetention(retention)
            log("retention set for the store: \(retention.spec)")
        }
        try removeOrphans()
        do { try recoverWorkingCopies() } catch let e as FSError where e.errno == ENOSPC || e.errno == EDQUOT {
            // A full disk must not keep the mount down (from it alone can space be freed): the
            // copies stay, and the periodic recovery publishes them once there is room.
            log("recovering working copies waits for room on the store's disk: \(e)")
        }
        do { try collectGarbage() } catch {
            // Started out of reach of a shared store's servers: the hourly collection runs once they answer.
            guard store.offline?.queued.fromLocalCopy == true, store.metadata.reachability()?.online == false else { throw error }
            log("the start-up collection waits for the store's servers: \(error)")
        }
    }

    /// Guards the periodic tasks' clocks.
    let syncLock = Lock()
    var lastSync: UInt64 = monotonicNanoseconds()   // guarded by syncLock
    /// Blobs found unreferenced by the last garbage collection while other writers ran.
    var garbageSeen: Set<BlobID> = []   // guarded by syncLock
    var lastCollection: UInt64 = monotonicNanoseconds()   // guarded by syncLock
    var lastAdoption: UInt64 = monotonicNanoseconds()     // guarded by syncLock

    // MARK: - registration and recovery

    private func register(_ containers: [ContainerInfo]) throws {
        try mutate { s in
            for c in containers {
                var rootIno: InodeNumber
                if let existing = s.base.containers[c.identifier], s.node(existing.rootIno) != nil {
                    rootIno = existing.rootIno
                } else {
                    rootIno = try s.newIno()
                    s.put(newNode(ino: rootIno, container: c.identifier, kind: .directory, mode: 0o755,
                                  caller: Caller(uid: ownerUID, gid: ownerGID)))
                }
                if s.base.children[rootIno]?[documentsName] == nil {
                    let docs = try s.newIno()
                    s.put(newNode(ino: docs, container: c.identifier, kind: .directory, mode: 0o755,
                                  caller: Caller(uid: ownerUID, gid: ownerGID)))
                    s.add(.putDirent(DirentRecord(parent: rootIno, name: documentsName, child: docs)))
                    var root = s.node(rootIno)!
                    root.nlink += 1
                    s.put(root)
                }
                let record = ContainerRecord(identifier: c.identifier, bundleIdentifier: c.bundleIdentifier,
                                             name: c.name, isPublic: c.isPublic, folderLevels: c.folderLevels,
                                             registeredVersion: c.registeredVersion, manifestPath: c.manifestPath,
                                             rootIno: rootIno)
                if s.base.containers[c.identifier] != record { s.add(.putContainer(record)) }
            }
        }
    }

    // MARK: - view resolution (callers hold ns, or commits while staging)

    // The rules are `ViewPolicy`'s; these read them over this model's namespace.
    typealias Target = ViewPolicy.Target
    /// `target` for a change: a ghost (see `ghosts`) is read-only, ESTALE, so that no change
    /// brings back a node another writer deleted.
    func changeableTarget(_ ino: UInt64) throws -> Target {
        if state.nodes[ino] == nil, docsLock.withLock({ ghosts[ino] != nil }) {
            throw FSError(ESTALE, "node \(ino) was deleted by another writer").routine()
        }
        return try target(ino)
    }

    /// What `ino` is in this view. A file another writer deleted while this kernel still held
    /// it is its ghost (see `ghosts`). Any other node another writer deleted while the kernel
    /// holds it (a folder) is ESTALE, not ENOENT: on ESTALE the kernel walks the path again
    /// with its names checked, as for NFS, and finds what the name is now. Caller holds ns.
    func target(_ ino: UInt64) throws -> Target {
        do { return try policy.target(ino, in: state) } catch let e as FSError where e.errno == ENOENT && state.nodes[ino] == nil {
            if let ghost = docsLock.withLock({ ghosts[ino] }) { return .node(ghost.node) }
            if docsLock.withLock({ kernelRefs.holds(ino) }) {
                throw FSError(ESTALE, "node \(ino) was deleted by another writer").routine()
            }
            throw e
        }
    }
    private func isShown(_ c: ContainerRecord) -> Bool { policy.isShown(c) }
    private func shownContainers() -> [ContainerRecord] { policy.shownContainers(in: state) }
    private func containerFolderName(_ c: ContainerRecord) -> [UInt8] { policy.containerFolderName(c) }
    private func containerFolderIno(_ c: ContainerRecord) -> InodeNumber? { policy.containerFolderIno(c, in: state) }
    private func documentsIno(_ c: ContainerRecord) -> InodeNumber? { policy.documentsIno(c, in: state) }
    private func depth(of dir: InodeNumber, in c: ContainerRecord, _ ns: Namespace? = nil) -> Int? {
        policy.depth(of: dir, in: c, ns ?? state)
    }
    private func visible(_ n: NodeRecord) -> Bool { policy.visible(n, in: state) }
    private func check(name: [UInt8]) throws { try ViewPolicy.check(name: name) }
    private func checkLevels(moving n: NodeRecord, into dir: NodeRecord) throws {
        try policy.checkLevels(moving: n, into: dir, in: state)
    }

    /// A folder in which entries may be changed, or the error to refuse with. `removing`: only
    /// to remove entries, which is allowed in a folder in Recently Deleted (emptying the
    /// desktop's trash deletes a trashed tree from the bottom up).
    private func writableDirectory(_ ino: UInt64, removing: Bool = false) throws -> NodeRecord {
        switch try target(ino) {
        case .root: throw FSError.readOnly("the mount root is read-only")
        case .node(let n):
            guard n.kind == .directory else { throw FSError.notDir() }
            if n.nlink == 0 || (!removing && state.isInTrash(n.ino)) { throw FSError.noEntry("the folder was removed") }
            return n
        }
    }


    // MARK: - attributes

    /// The mount root: read-only, one subfolder per shown container. Caller holds ns.
    private func rootAttributes() -> Attributes {
        Attributes(ino: Self.rootID, mode: UInt32(S_IFDIR) | 0o555, nlink: UInt32(2 + shownContainers().count),
                   uid: ownerUID, gid: ownerGID, size: 4096, blocks: 8, atime: mountTime, mtime: mountTime,
                   ctime: mountTime, rdev: 0)
    }

    /// Attributes of a real node; `doc` (looked up under ns) overrides size and times while open.
    func attributes(_ n: NodeRecord, doc: Document?) -> Attributes {
        var size = n.size
        var mtime = n.mtime
        var ctime = n.ctime
        var allocated: UInt64
        if let doc {
            let st = doc.stat()
            size = st.size
            mtime = max(st.mtime, n.mtime)
            ctime = max(st.ctime, n.ctime)
            allocated = st.allocated
        } else {
            allocated = allocatedBytes(state.chunks[n.ino] ?? [])
        }
        switch n.kind {
        case .directory: size = 4096; allocated = 4096
        case .symlink: size = UInt64(n.target.count); allocated = 0
        case .regular: break
        default: size = 0; allocated = 0
        }
        // An item in Recently Deleted has no name in any view: to a program that still has it
        // open it is unlinked, as on a local disk.
        let nlink = state.trashed[n.ino] == nil ? n.nlink : 0
        return Attributes(ino: n.ino, mode: n.kind.typeBits | n.mode, nlink: nlink, uid: n.uid, gid: n.gid,
                          size: size, blocks: (allocated + 511) / 512, atime: n.atime, mtime: mtime, ctime: ctime,
                          rdev: n.rdev, changingElsewhere: changedElsewhere.contains(n.ino))
    }

    private func attributesOfTarget(_ t: Target, ino: UInt64) -> Attributes {
        switch t {
        case .root: return rootAttributes()
        case .node(let n): return attributes(n, doc: docsLock.withLock { docs[n.ino] })
        }
    }

    public func getattr(_ ino: UInt64) throws(FSError) -> Attributes {
        try typed {
            if let t = trashNode(ino) { return try trashAttributes(t) }
            return try ns.read { attributesOfTarget(try target(ino), ino: ino) }
        }
    }

    // MARK: - kernel references

    /// The kernel was given an entry for `ino` (lookup, create, mkdir, readdirplus, …), as
    /// `name` in folder `parent` when given: a file's name is what a replay of another writer's
    /// change to it goes by (see WatchEvents.swift).
    public func remember(_ ino: UInt64, parent: UInt64? = nil, name: [UInt8]? = nil) {
        guard ino != Self.rootID else { return }
        docsLock.withLock {
            kernelRefs.add(ino, parent: parent, name: name)
        }
    }

    /// Whether the kernel may be given `ino` for a replay: it still has a name (Recently
    /// Deleted counts), or the kernel holds it already. The kernel forgets what it is given, and
    /// the forget of a node with no name deletes it, which another writer may still have open.
    public func mayGiveKernel(_ ino: UInt64) -> Bool {
        if kernelHolds(ino) { return true }
        return ns.read { (state.nodes[ino]?.nlink ?? 0) > 0 }
    }

    /// The kernel moved its entry for `ino` to `name` in `parent` (a replayed rename).
    public func kernelMoved(_ ino: UInt64, parent: UInt64, name: [UInt8]) {
        docsLock.withLock {
            kernelRefs.moved(ino, parent: parent, name: name)
        }
    }

    /// The kernel dropped `count` references to `ino`.
    public func forget(_ ino: UInt64, count: UInt64) {
        let (gone, counted) = docsLock.withLock { () -> (Bool, UInt64) in
            let c = kernelRefs.drop(ino, count: count)
            if c > count { return (false, c) }
            kernelContent[ino] = nil   // the kernel dropped the inode, and its pages with it
            return (c > 0, c)
        }
        // The kernel forgets only what it was given: more is a counting bug here, not its.
        if count > counted && ino != Self.rootID {
            log("internal error: the kernel forgot \(count) references to inode \(ino), which had \(counted)")
        }
        if gone {
            docsLock.withLock { _ = ghosts.removeValue(forKey: ino) }
            do { try deleteIfUnreferenced(ino) } catch { log("deleting unlinked inode \(ino) failed: \(error)") }
        }
    }

    /// Whether the kernel holds `ino` (the root always): only then can anything watch it.
    func kernelHolds(_ ino: InodeNumber) -> Bool {
        ino == Self.rootID || docsLock.withLock { kernelRefs.holds(ino) }
    }

    /// The name the kernel last got `ino` by, if it holds it.
    func kernelName(of ino: InodeNumber) -> KernelName? {
        docsLock.withLock { kernelRefs.name(of: ino).map { KernelName(parent: $0.parent, name: $0.name) } }
    }

    /// Caller holds docsLock.
    private func isReferenced(_ ino: InodeNumber) -> Bool {
        (docs[ino]?.opens ?? 0) > 0 || kernelRefs.holds(ino)
    }

    /// Delete a node with no name left once nothing refers to it any more.
    func deleteIfUnreferenced(_ ino: InodeNumber) throws {
        guard isNameless(ino) else { return }
        let doc: Document? = docsLock.withLock {
            guard !isReferenced(ino), let doc = docs[ino] else { return nil }
            docs[ino] = nil
            return doc
        }
        doc?.discard()
        try mutate { s in
            if let n = s.node(ino), n.nlink == 0, docsLock.withLock({ !isReferenced(ino) && docs[ino] == nil }) {
                s.add(.deleteNode(n.ino))
            }
        }
    }

    /// A file deleted for good that nothing has open: its unpublished working copy goes now (no
    /// name or handle reaches it again), so its space comes back at once even while the kernel
    /// still holds the node, which waits for the kernel's forget. (An unpublished copy a full
    /// disk left would otherwise keep that disk full.)
    func discardUnreachableWork(_ ino: InodeNumber) {
        guard isNameless(ino) else { return }
        let doc: Document? = docsLock.withLock {
            guard let doc = docs[ino], doc.opens == 0 else { return nil }
            docs[ino] = nil
            // The kernel's pages may hold the discarded writes: a reopen (through /proc) drops them.
            kernelContent[ino] = nil
            return doc
        }
        doc?.discard()
    }

    // MARK: - lookup and listing

    /// `forKernel`: the answer goes to the kernel, which holds the node from then on (see
    /// `remember`): counted before the namespace can change, so another writer's change applied
    /// after these attributes were read finds the node held, and the change feed invalidates it.
    public func lookup(parent: UInt64, name: [UInt8], forKernel: Bool = false) throws(FSError) -> Attributes {
        try typed {
            if name.count > nameMax { throw FSError(ENAMETOOLONG, "name longer than \(nameMax) bytes") }
            if let t = trashNode(parent) { return try remembered(trashLookup(t, name), parent, name, forKernel) }
            if parent == Self.rootID, offersDesktopTrash, name == desktopTrashName {
                return try remembered(trashAttributes(.top), parent, name, forKernel)
            }
            return try ns.read { () throws -> Attributes in try remembered(lookupLocked(parent: parent, name: name), parent, name, forKernel) }
        }
    }

    private func remembered(_ a: Attributes, _ parent: UInt64, _ name: [UInt8], _ forKernel: Bool) -> Attributes {
        if forKernel { remember(a.ino, parent: parent, name: name) }
        return a
    }

    /// Caller holds ns.
    private func lookupLocked(parent: UInt64, name: [UInt8]) throws -> Attributes {
        let t = try target(parent)
        if name == [0x2e] { return attributesOfTarget(t, ino: parent) }
        if name == [0x2e, 0x2e] { return try parentAttributes(t) }
        switch t {
        case .root:
            guard let c = shownContainers().first(where: { containerFolderName($0) == name }),
                  let folder = containerFolderIno(c), let n = state.nodes[folder] else {
                throw FSError.noEntry()
            }
            return attributes(n, doc: nil)
        case .node(let dir):
            guard dir.kind == .directory else { throw FSError.notDir() }
            guard let child = state.children[dir.ino]?[name], let n = state.nodes[child], visible(n) else {
                throw FSError.noEntry()
            }
            return attributes(n, doc: docsLock.withLock { docs[n.ino] })
        }
    }

    /// Whether the kernel may remember that `name` is missing from `parent` (a negative entry)
    /// for its cache time. Only where the store has no such name, in a folder of the namespace:
    /// there every name that appears other than through this mount's kernel is invalidated by
    /// name (another writer's through the change feed, the daemon's own conflict copies and
    /// restores as it makes them). Not for a name that is there but hidden (a folder past the
    /// container's levels shows once its tree is in the desktop trash, with no change to its
    /// name); never at the mount root or in the desktop trash's own folders, whose names are
    /// worked out, not stored.
    public func absenceMayBeCached(in parent: UInt64, name: [UInt8]) -> Bool {
        guard parent != Self.rootID, trashNode(parent) == nil else { return false }
        return ns.read {
            guard case .node(let dir)? = try? target(parent) else { return false }
            return dir.kind == .directory && visible(dir) && state.children[parent]?[name] == nil
        }
    }

    /// Whether the kernel may keep `folder`'s listing from one opendir to the next. Only for a
    /// folder of the namespace: the kernel drops the listing itself when a name changes through
    /// this mount, and every name that changes otherwise invalidates the folder (as for
    /// negative entries above). Never the mount root or the desktop trash's folders, whose
    /// listings are worked out, and change with no change to them.
    public func listingMayBeCached(_ folder: UInt64) -> Bool {
        guard folder != Self.rootID, trashNode(folder) == nil else { return false }
        return ns.read {
            guard case .node(let dir)? = try? target(folder) else { return false }
            return dir.kind == .directory && visible(dir)
        }
    }

    private func parentAttributes(_ t: Target) throws -> Attributes {
        switch t {
        case .root: return rootAttributes()
        case .node(let n):
            guard let c = state.containers[n.container] else { throw FSError.noEntry() }
            if n.ino == containerFolderIno(c) { return rootAttributes() }
            guard let p = state.parent[n.ino], let pn = state.nodes[p] else { throw FSError.noEntry() }
            return attributes(pn, doc: nil)
        }
    }

    /// Snapshot a folder's entries (".", ".." included) for a directory handle, so that listing
    /// offsets stay stable while the folder changes.
    public func opendir(_ ino: UInt64) throws(FSError) -> UInt64 {
        try typed {
            // (The trash's listing takes ns itself.)
            let trash = try trashNode(ino).map { try trashListing($0) }
            let entries: [DirectoryEntry] = try ns.read {
                if let trash {
                    return trash.enumerated().map { DirectoryEntry(name: $1.name, ino: $1.ino, kind: $1.kind, nextOffset: $0 + 1) }
                }
                let t = try target(ino)
                var list: [(name: [UInt8], ino: UInt64, kind: NodeKind)] = [([0x2e], ino, .directory)]
                switch t {
                case .root:
                    list.append(([0x2e, 0x2e], ino, .directory))
                    for c in shownContainers() {
                        if let folder = containerFolderIno(c) { list.append((containerFolderName(c), folder, .directory)) }
                    }
                case .node(let dir):
                    guard dir.kind == .directory else { throw FSError.notDir() }
                    list.append(([0x2e, 0x2e], (try? parentAttributes(t).ino) ?? Self.rootID, .directory))
                    for (name, child) in (state.children[dir.ino] ?? [:]).sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
                        guard let n = state.nodes[child], visible(n) else { continue }
                        list.append((name, child, n.kind))
                    }
                }
                return list.enumerated().map { DirectoryEntry(name: $1.name, ino: $1.ino, kind: $1.kind, nextOffset: $0 + 1) }
            }
            return docsLock.withLock {
                let h = nextHandle
                nextHandle += 1
                handles[h] = .directory(entries)
                return h
            }
        }
    }

    /// Entries from `offset` on (0 = the start).
    public func readdir(handle: UInt64, offset: Int) throws(FSError) -> [DirectoryEntry] {
        try typed {
            let entries: [DirectoryEntry] = try docsLock.withLock {
                guard case .directory(let e) = handles[handle] else { throw FSError(EBADF, "not a directory handle") }
                return e
            }
            guard offset < entries.count else { return [] }
            return Array(entries[max(0, offset)...])
        }
    }

    public func releasedir(handle: UInt64) {
        docsLock.withLock { _ = handles.removeValue(forKey: handle) }
    }

    // MARK: - creating

    public func mkdir(parent: UInt64, name: [UInt8], mode: UInt32, caller: Caller) throws(FSError) -> Attributes {
        try typed {
            try check(name: name)
            if let a = try trashMkdir(parent, name) { return a }
            return try mutate { s in
                let dir = try writableDirectory(parent)
                if state.children[dir.ino]?[name] != nil { throw FSError(EEXIST, "already exists") }
                if case .drive = view, let c = state.containers[dir.container], let limit = policy.active[c.identifier]?.maxDepth {
                    guard let d = depth(of: dir.ino, in: c) else { throw FSError(EPERM, "outside Documents") }
                    if d + 1 > limit {
                        throw FSError(EPERM, "\(c.name) allows \(levelsWord(limit)) folder level(s)")
                    }
                }
                var p = dir
                var mode = mode & 0o7777
                var owner = caller
                if p.mode & UInt32(S_ISGID) != 0 { owner.gid = p.gid; mode |= UInt32(S_ISGID) }
                let ino = try s.newIno()
                let n = newNode(ino: ino, container: p.container, kind: .directory, mode: mode, caller: owner)
                s.put(n)
                s.add(.putDirent(DirentRecord(parent: p.ino, name: name, child: ino)))
                p.nlink += 1
                p.mtime = n.ctime
                p.ctime = n.ctime
                s.put(p)
                return attributes(n, doc: nil)
            }
        }
    }

    /// mknod for regular files, FIFOs, sockets and devices (devices and FIFOs are metadata only).
    public func mknod(parent: UInt64, name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller) throws(FSError) -> Attributes {
        try typed {
            let kind = NodeKind(mode: mode)
            if kind == .directory { return try self.mkdir(parent: parent, name: name, mode: mode, caller: caller) }
            if kind == .symlink { throw FSError(EINVAL, "mknod cannot make a symlink") }
            return try createNode(parent: parent, name: name, kind: kind, mode: mode, caller: caller, rdev: rdev, target: [])
        }
    }

    public func symlink(parent: UInt64, name: [UInt8], target: [UInt8], caller: Caller) throws(FSError) -> Attributes {
        try typed {
            if target.count >= Int(PATH_MAX) { throw FSError(ENAMETOOLONG, "symlink target too long") }
            // As symlink(2) on Linux: an empty target names nothing.
            if target.isEmpty { throw FSError(ENOENT, "a symbolic link needs a target") }
            return try createNode(parent: parent, name: name, kind: .symlink, mode: 0o777, caller: caller, rdev: 0, target: target)
        }
    }

    /// The name the store keeps for itself: the Recently Deleted folder in a container's root.
    private func isReserved(_ name: [UInt8], in p: NodeRecord) -> Bool {
        name == recentlyDeletedName && state.containers[p.container]?.rootIno == p.ino
    }

    /// `sideBySide`: a name already taken gets the new file as `Name 2.ext` instead of `EEXIST`.
    private func createNode(parent: UInt64, name asked: [UInt8], kind: NodeKind, mode: UInt32, caller: Caller,
                            rdev: UInt64, target: [UInt8], sideBySide: Bool = false) throws -> Attributes {
        try check(name: asked)
        var placed = asked
        let attrs = try mutate { s in
            var p = try writableDirectory(parent)
            var name = asked
            if state.children[p.ino]?[name] != nil {
                guard sideBySide, !isReserved(name, in: p) else { throw FSError(EEXIST, "already exists") }
                name = freeName(name) { state.children[p.ino]?[$0] != nil }
            }
            placed = name
            var owner = caller
            if p.mode & UInt32(S_ISGID) != 0 { owner.gid = p.gid }
            let ino = try s.newIno()
            let n = newNode(ino: ino, container: p.container, kind: kind, mode: mode, caller: owner,
                            rdev: kind == .characterDevice || kind == .blockDevice ? rdev : 0, target: target)
            s.put(n)
            s.add(.putDirent(DirentRecord(parent: p.ino, name: name, child: ino)))
            p.mtime = n.ctime
            p.ctime = n.ctime
            s.put(p)
            return attributes(n, doc: nil)
        }
        if placed != asked { placedBeside(parent: parent, asked: asked, placed: placed, what: "created") }
        return attrs
    }

    /// Create and open a regular file. Returns its attributes and a file handle.
    ///
    /// The kernel asks to create only a name it believes free, so a taken name means another
    /// writer (device, view) made it after this one last looked. Without `O_EXCL` the new file
    /// lands beside it as `Name 2.ext`, as iCloud does, so neither device's file is lost; with
    /// `O_EXCL` the caller gets `EEXIST`, because lock files and `mkstemp` rely on it.
    public func create(parent: UInt64, name: [UInt8], mode: UInt32, flags: Int32, caller: Caller) throws(FSError) -> (Attributes, UInt64) {
        try typed {
            if let t = trashNode(parent) { return try trashCreate(t, name, flags: flags) }
            let attrs = try createNode(parent: parent, name: name, kind: .regular, mode: mode, caller: caller, rdev: 0, target: [],
                                       sideBySide: flags & O_EXCL == 0)
            let handle = try open(attrs.ino, flags: flags & ~O_TRUNC)
            return (attrs, handle)
        }
    }

    public func readlink(_ ino: UInt64) throws(FSError) -> [UInt8] {
        try typed {
            try ns.read {
                guard case .node(let n) = try target(ino), n.kind == .symlink else { throw FSError(EINVAL, "not a symlink") }
                return n.target
            }
        }
    }

    public func link(_ ino: UInt64, newParent: UInt64, newName: [UInt8]) throws(FSError) -> Attributes {
        try typed {
            try check(name: newName)
            return try mutate { s in
                guard case .node(var n) = try changeableTarget(ino) else { throw FSError(EPERM, "cannot link the mount root") }
                if n.kind == .directory { throw FSError(EPERM, "cannot hard-link a folder") }
                var p = try writableDirectory(newParent)
                if p.container != n.container { throw FSError(EXDEV, "hard links cannot cross containers") }
                if state.children[p.ino]?[newName] != nil { throw FSError(EEXIST, "already exists") }
                if n.nlink == 0 || state.trashed[n.ino] != nil { throw FSError(ENOENT, "file was deleted") }
                if n.nlink >= 65000 { throw FSError(EMLINK, "too many links") }
                let now = nowNanoseconds()
                n.nlink += 1
                n.ctime = now
                s.put(n)
                s.add(.putDirent(DirentRecord(parent: p.ino, name: newName, child: n.ino)))
                p.mtime = now
                p.ctime = now
                s.put(p)
                return attributes(n, doc: docsLock.withLock { docs[n.ino] })
            }
        }
    }

    // MARK: - removing

    public func unlink(parent: UInt64, name: [UInt8]) throws(FSError) {
        try typed {
            if let t = trashNode(parent) { return try trashRemove(t, name, directory: false) }
            try remove(parent: parent, name: name, directory: false)
        }
    }

    public func rmdir(parent: UInt64, name: [UInt8]) throws(FSError) {
        try typed {
            if let t = trashNode(parent) { return try trashRemove(t, name, directory: true) }
            try remove(parent: parent, name: name, directory: true)
        }
    }

    private func remove(parent: UInt64, name: [UInt8], directory: Bool) throws {
        if name.count > nameMax { throw FSError(ENAMETOOLONG, "name too long") }
        if directory && name == [0x2e] { throw FSError(EINVAL, "cannot remove .") }
        if directory && name == [0x2e, 0x2e] { throw FSError(ENOTEMPTY, "cannot remove ..") }
        try mutate { s in
            var p = try writableDirectory(parent, removing: true)
            guard let child = state.children[p.ino]?[name], var n = state.nodes[child], visible(n) else {
                throw FSError.noEntry()
            }
            try protectDocuments(parent: p, name: name)
            let now = nowNanoseconds()
            if directory {
                guard n.kind == .directory else { throw FSError.notDir() }
                if !(state.children[n.ino]?.isEmpty ?? true) { throw FSError(ENOTEMPTY, "folder is not empty") }
                if try !stageTrash(&s, &n, from: p, name: name, now: now) {
                    s.add(.deleteDirent(parent: p.ino, name: name))
                    dropFolder(&s, &n, now: now)
                }
                p.nlink -= 1
            } else {
                if n.kind == .directory { throw FSError(EISDIR, "is a folder") }
                // The last name of a document goes to Recently Deleted; another name just goes.
                if try n.nlink > 1 || !stageTrash(&s, &n, from: p, name: name, now: now) {
                    s.add(.deleteDirent(parent: p.ino, name: name))
                    dropLink(&s, &n, now: now)
                }
            }
            p.mtime = now
            p.ctime = now
            s.put(p)
        }
    }

    /// One name of `n` is gone: lower its link count; delete it when none is left and it is not open.
    func dropLink(_ s: inout Staging, _ n: inout NodeRecord, now: Int64) {
        n.nlink -= 1
        n.ctime = now
        let referenced = docsLock.withLock { isReferenced(n.ino) }
        if n.nlink == 0 && !referenced {
            s.add(.deleteNode(n.ino))
        } else {
            s.put(n)
        }
    }

    /// A folder's only name is gone: delete it, or keep it nameless while the kernel still refers
    /// to it (a process's working folder).
    func dropFolder(_ s: inout Staging, _ n: inout NodeRecord, now: Int64) {
        if docsLock.withLock({ isReferenced(n.ino) }) {
            n.nlink = 0
            n.ctime = now
            s.put(n)
        } else {
            s.add(.deleteNode(n.ino))
        }
    }

    private func protectDocuments(parent: NodeRecord, name: [UInt8]) throws {
        if name == documentsName, let c = state.containers[parent.container], c.rootIno == parent.ino {
            throw FSError(EPERM, "a container's Documents folder cannot be removed or renamed")
        }
    }

    // MARK: - rename

    public func rename(parent: UInt64, name: [UInt8], newParent: UInt64, newName: [UInt8], flags: RenameFlags) throws(FSError) {
        try typed {
            try check(name: newName)
            if name.count > nameMax { throw FSError(ENAMETOOLONG, "name too long") }
            if flags.contains(.noReplace) && flags.contains(.exchange) { throw FSError(EINVAL, "RENAME_NOREPLACE with RENAME_EXCHANGE") }
            if flags.rawValue & ~3 != 0 { throw FSError(EINVAL, "unsupported rename flags") }
            if try trashRename(parent: parent, name: name, newParent: newParent, newName: newName, flags: flags) { return }
            // A target name that was free when this rename was first staged but is taken once it
            // caught up with another writer was made by that writer meanwhile: the moved item
            // lands beside it as `Name 2.ext` rather than replacing what this caller never saw.
            var targetWasFree: Bool?
            var placed = newName
            try mutate { s in
                let from = try writableDirectory(parent)
                let to = try writableDirectory(newParent)
                guard let srcIno = state.children[from.ino]?[name], var src = state.nodes[srcIno], visible(src) else {
                    throw FSError.noEntry()
                }
                if from.container != to.container { throw FSError(EXDEV, "cannot move between containers") }
                try protectDocuments(parent: from, name: name)
                var newName = newName
                let taken = state.children[to.ino]?[newName]
                if targetWasFree == nil { targetWasFree = taken == nil }
                if targetWasFree == true, let t = taken, t != srcIno, !flags.contains(.noReplace), !flags.contains(.exchange),
                   !isReserved(newName, in: to) {
                    newName = freeName(newName) { state.children[to.ino]?[$0] != nil }
                }
                placed = newName
                let dstIno = state.children[to.ino]?[newName]
                var dst = dstIno.flatMap { state.nodes[$0] }
                if let d = dst, !visible(d) { throw FSError(EEXIST, "a folder the app made, hidden at this level, has that name") }
                if dst != nil { try protectDocuments(parent: to, name: newName) }
                if dstIno == srcIno { return }   // two names of one file: POSIX says do nothing
                if flags.contains(.noReplace), dst != nil { throw FSError(EEXIST, "already exists") }
                if flags.contains(.exchange), dst == nil { throw FSError.noEntry("nothing to exchange with") }
                // A folder cannot move into itself.
                if src.kind == .directory, isAncestor(src.ino, of: to.ino) { throw FSError(EINVAL, "cannot move a folder into itself") }
                if flags.contains(.exchange), let d = dst, d.kind == .directory, isAncestor(d.ino, of: from.ino) {
                    throw FSError(EINVAL, "cannot move a folder into itself")
                }
                try checkLevels(moving: src, into: to)
                if src.kind == .directory && from.ino != to.ino {
                    // Two writers moving folders into each other at once could make a cycle: this
                    // move holds only while every folder above its new place stays where it is.
                    var cur: InodeNumber? = to.ino
                    while let c = cur { s.expectUnchanged(c); cur = state.parent[c] }
                }
                if flags.contains(.exchange), let d = dst, d.kind == .directory, from.ino != to.ino {
                    var cur: InodeNumber? = from.ino
                    while let c = cur { s.expectUnchanged(c); cur = state.parent[c] }
                }
                if flags.contains(.exchange), let d = dst { try checkLevels(moving: d, into: from) }

                let now = nowNanoseconds()
                var parents: [InodeNumber: NodeRecord] = [from.ino: from]
                parents[to.ino] = to
                if flags.contains(.exchange), var d = dst {
                    s.add(.putDirent(DirentRecord(parent: from.ino, name: name, child: d.ino)))
                    s.add(.putDirent(DirentRecord(parent: to.ino, name: newName, child: src.ino)))
                    if from.ino != to.ino {
                        if src.kind == .directory { parents[from.ino]!.nlink -= 1; parents[to.ino]!.nlink += 1 }
                        if d.kind == .directory { parents[to.ino]!.nlink -= 1; parents[from.ino]!.nlink += 1 }
                    }
                    d.ctime = now
                    s.put(d)
                } else {
                    if var d = dst {
                        if src.kind == .directory {
                            guard d.kind == .directory else { throw FSError.notDir("cannot replace a file with a folder") }
                            if !(state.children[d.ino]?.isEmpty ?? true) { throw FSError(ENOTEMPTY, "target folder is not empty") }
                            s.add(.deleteDirent(parent: to.ino, name: newName))
                            dropFolder(&s, &d, now: now)
                            parents[to.ino]!.nlink -= 1
                        } else {
                            if d.kind == .directory { throw FSError(EISDIR, "cannot replace a folder with a file") }
                            s.add(.deleteDirent(parent: to.ino, name: newName))
                            // (The kernel's own reference to the replaced file does not count here.)
                            let lastName = d.nlink == 1 && docsLock.withLock({ (docs[d.ino]?.opens ?? 0) == 0 })
                            if lastName && d.kind == .regular && src.kind == .regular {
                                // An editor's atomic save: the document's history goes on with the new file.
                                s.add(.moveVersions(from: d.ino, to: src.ino))
                            }
                            dropLink(&s, &d, now: now)
                        }
                        dst = d
                    }
                    s.add(.deleteDirent(parent: from.ino, name: name))
                    s.add(.putDirent(DirentRecord(parent: to.ino, name: newName, child: src.ino)))
                    if src.kind == .directory && from.ino != to.ino {
                        parents[from.ino]!.nlink -= 1
                        parents[to.ino]!.nlink += 1
                    }
                }
                src.ctime = now
                s.put(src)
                for var p in parents.values {
                    p.mtime = now
                    p.ctime = now
                    s.put(p)
                }
            }
            if placed != newName {
                placedBeside(parent: newParent, asked: newName, placed: placed, what: "moved",
                             also: [.entry(parent: parent, name: name)])
            }
            // The kernel moves its entry with the rename: the name a replay goes by moves too.
            if let moved = ns.read({ state.children[newParent]?[placed] }) {
                docsLock.withLock {
                    kernelRefs.moved(moved, parent: newParent, name: placed)
                }
            }
        }
    }

    private func isAncestor(_ a: InodeNumber, of b: InodeNumber) -> Bool {
        var cur: InodeNumber? = b
        while let c = cur {
            if c == a { return true }
            cur = state.parent[c]
        }
        return false
    }

    // MARK: - setattr

    public func setattr(_ ino: UInt64, _ changes: AttributeChanges, handle: UInt64?, caller: Caller) throws(FSError) -> Attributes {
        try typed {
            if let t = trashNode(ino) {
                // Only a placeholder's size changes (an O_TRUNC); times and modes stay as shown.
                if case .infoFile = t, changes.size != nil { throw FSError(EACCES, "computed from Recently Deleted") }
                if case .placeholder(let id) = t, let size = changes.size {
                    guard size <= 1 << 20 else { throw FSError(EFBIG, "trash info files are small") }
                    trashPlaceholders.update(id) { p in
                        p.bytes = Array(p.bytes.prefix(Int(size))) + [UInt8](repeating: 0, count: max(0, Int(size) - p.bytes.count))
                    }
                }
                return try trashAttributes(t)
            }
            if let size = changes.size {
                try ns.read { _ = try changeableTarget(ino) }
                let doc = try document(for: ino, handle: handle)
                defer { closeTemporary(doc, handle: handle) }
                try ns.read {
                    guard case .node(let n) = try changeableTarget(ino) else { throw FSError.readOnly("read-only") }
                    if n.kind == .directory { throw FSError(EISDIR, "is a folder") }
                    if n.kind != .regular { throw FSError(EINVAL, "not a regular file") }
                }
                if size > UInt64(Int64.max) { throw FSError(EFBIG, "too large") }
                let through = handle.flatMap { h in isFileHandle(h) ? h : nil }
                do { try changing(doc) { try doc.truncate(to: size, handle: through) } } catch { throw FSError(error) }
            }
            return try mutate { s in
                guard case .node(var n) = try changeableTarget(ino) else { throw FSError.readOnly("the mount root is read-only") }
                let now = nowNanoseconds()
                var changed = false
                if let mode = changes.mode { n.mode = mode & 0o7777; changed = true }
                if changes.uid != nil || changes.gid != nil {
                    if let uid = changes.uid { n.uid = uid }
                    if let gid = changes.gid { n.gid = gid }
                    // As the kernel does: a change of owner drops set-user-ID, and set-group-ID with group-exec.
                    if changes.mode == nil && n.kind != .directory { n.mode = Self.droppingSetID(n.mode, keepsGroup: true) }
                    changed = true
                }
                let doc = docsLock.withLock { docs[n.ino] }
                if let a = changes.atime {
                    n.atime = { if case .at(let t) = a { return t } else { return now } }()
                    changed = true
                }
                if let m = changes.mtime {
                    let t: Int64 = { if case .at(let t) = m { return t } else { return now } }()
                    n.mtime = t
                    doc?.setTimes(mtime: t)
                    changed = true
                }
                if changes.size != nil { changed = true }
                if changed {
                    n.ctime = now
                    doc?.setTimes(ctime: now)
                    s.put(n)
                }
                return attributes(n, doc: doc)
            }
        }
    }

    /// A mode without set-user-ID, and without set-group-ID where the group may execute or,
    /// when `keepsGroup` is false, at all (without group-exec the bit marks mandatory locking,
    /// which a member of the file's group keeps: the kernel's rule for ext4).
    public static func droppingSetID(_ mode: UInt32, keepsGroup: Bool) -> UInt32 {
        var mode = mode & ~UInt32(S_ISUID)
        if mode & 0o010 != 0 || !keepsGroup { mode &= ~UInt32(S_ISGID) }
        return mode
    }

    /// What a write, a truncation or a chown does to a regular file's set-ID bits when the
    /// kernel leaves that to the file system (and says when). `inGroup` answers whether the
    /// caller belongs to a group: asked only for set-group-ID without group-exec on a file of a
    /// group other than the caller's own, and outside the model's locks. Nothing is committed
    /// for a file without the bits, the usual case.
    public func dropSetID(_ ino: UInt64, caller: Caller, inGroup: (UInt32) -> Bool) throws(FSError) {
        guard trashNode(ino) == nil else { return }
        /// The group whose membership decides set-group-ID, if it is asked.
        func asks(_ n: NodeRecord) -> UInt32? {
            n.mode & UInt32(S_ISGID) != 0 && n.mode & 0o010 == 0 && caller.uid != 0 && caller.gid != n.gid ? n.gid : nil
        }
        func dropped(_ n: NodeRecord, member: [UInt32: Bool]) -> UInt32 {
            guard n.kind == .regular, n.mode & UInt32(S_ISUID | S_ISGID) != 0 else { return n.mode }
            // A group changed meanwhile, not asked about: the bit goes (the safe side).
            let keepsGroup = asks(n).map { member[$0] ?? false } ?? true
            return Self.droppingSetID(n.mode, keepsGroup: keepsGroup)
        }
        let node = ns.read { () -> NodeRecord? in
            guard case .node(let n)? = try? changeableTarget(ino), n.kind == .regular,
                  n.mode & UInt32(S_ISUID | S_ISGID) != 0 else { return nil }
            return n
        }
        guard let node else { return }
        var member: [UInt32: Bool] = [:]
        if let gid = asks(node) { member[gid] = inGroup(gid) }
        guard dropped(node, member: member) != node.mode else { return }
        try typed {
            try mutate { s in
                guard case .node(var n) = try changeableTarget(ino) else { return }
                let mode = dropped(n, member: member)
                guard mode != n.mode else { return }
                let now = nowNanoseconds()
                n.mode = mode
                n.ctime = now
                docsLock.withLock { docs[n.ino] }?.setTimes(ctime: now)
                s.put(n)
            }
        }
    }

    // MARK: - extended attributes (user.* only)

    private static let userPrefix = Array("user.".utf8)
    static let pidAttribute = Array("user.ubiquityfs.daemon-pid".utf8)
    /// The store folder this mount serves, for commands given a path in the mount
    /// (`ubiquityfs versions PATH`); set by the daemon, empty when the model has no folder.
    static let storeAttribute = Array("user.ubiquityfs.store".utf8)
    public var storeLocation = ""

    /// The most bytes of attribute names a listxattr can return (Linux's XATTR_LIST_MAX).
    static let xattrListMax = 65536
    /// The most bytes of attribute values kept per file.
    static let xattrValuesMax = 1 << 20

    public func setxattr(_ ino: UInt64, name: [UInt8], value: [UInt8], flags: Int32) throws(FSError) {
        try typed {
            guard name.starts(with: Self.userPrefix), name.count > Self.userPrefix.count else {
                throw FSError(EOPNOTSUPP, "only user.* extended attributes are supported").routine()
            }
            if name.count > 255 { throw FSError(ERANGE, "attribute name too long") }
            if value.count > 65536 { throw FSError(E2BIG, "attribute value too large") }
            if trashNode(ino) != nil { throw FSError(EPERM, "the trash folder keeps no attributes") }
            if Self.statusAttributes.contains(name) {
                // Computed, not stored: a write changes nothing and succeeds, so that `cp -a`,
                // `cp --preserve=xattr` and `rsync -X` between mounts (whose versions and
                // containers differ) do not fail on them.
                _ = try getxattr(ino, name: name)   // ENODATA where the item has none
                if flags & xattrCreate != 0 { throw FSError(EEXIST, "attribute exists") }
                return
            }
            try mutate { s in
                guard case .node(var n) = try changeableTarget(ino) else { throw FSError(EPERM, "the mount root has no extended attributes") }
                let exists = state.xattrs[n.ino]?[name] != nil
                if flags & xattrCreate != 0 && exists { throw FSError(EEXIST, "attribute exists") }
                if flags & xattrReplace != 0 && !exists { throw FSError(ENODATA, "no such attribute") }
                // Linux lists a file's attribute names in at most 64 KiB (a longer list could
                // not be read back), and the store keeps at most 1 MiB of values per file: past
                // either, ENOSPC, as ext4 says when an inode's attribute space is full.
                let attrs = state.xattrs[n.ino] ?? [:]
                if !exists {
                    let listed = attrs.keys.reduce(0) { $0 + $1.count + 1 } + Self.statusAttributes.reduce(0) { $0 + $1.count + 1 }
                    if listed + name.count + 1 > Self.xattrListMax {
                        throw FSError(ENOSPC, "no room for another extended attribute (their names fill \(listed) bytes)")
                    }
                }
                let stored = attrs.values.reduce(0) { $0 + $1.count } - (attrs[name]?.count ?? 0)
                if stored + value.count > Self.xattrValuesMax {
                    throw FSError(ENOSPC, "no room for this extended attribute value (the others hold \(stored) bytes)")
                }
                s.add(.putXattr(XattrRecord(ino: n.ino, name: name, value: value)))
                n.ctime = nowNanoseconds()
                s.put(n)
            }
        }
    }

    public func getxattr(_ ino: UInt64, name: [UInt8]) throws(FSError) -> [UInt8] {
        try typed {
            // Other namespaces are not supported, as setxattr says. ENODATA here would tell
            // `ls -l` to ask again for every file (two round trips each, for the SELinux label
            // and the ACL: half of a cold listing); EOPNOTSUPP lets it stop asking this mount.
            guard name.starts(with: Self.userPrefix) else {
                throw FSError(EOPNOTSUPP, "only user.* extended attributes are supported").routine()
            }
            if trashNode(ino) != nil { throw FSError(ENODATA, "no such attribute") }
            if ino == Self.rootID && name == Self.pidAttribute { return Array(String(getpid()).utf8) }
            if ino == Self.rootID && name == Self.storeAttribute && !storeLocation.isEmpty { return Array(storeLocation.utf8) }
            if Self.statusAttributes.contains(name) {
                guard case .node(let n) = try ns.read({ try target(ino) }), let v = try statusAttribute(name, of: n) else {
                    throw FSError(ENODATA, "no such attribute")
                }
                return Array(v.utf8)
            }
            return try ns.read {
                guard case .node(let n) = try target(ino), let v = state.xattrs[n.ino]?[name] else {
                    throw FSError(ENODATA, "no such attribute")
                }
                return v
            }
        }
    }

    public func listxattr(_ ino: UInt64) throws(FSError) -> [[UInt8]] {
        try typed {
            if trashNode(ino) != nil { return [] }
            return try ns.read {
                guard case .node(let n) = try target(ino) else { return [] }
                let computed = n.kind == .regular ? Self.statusAttributes : [Self.containerAttribute]
                return computed + (state.xattrs[n.ino] ?? [:]).keys.filter { !Self.statusAttributes.contains($0) }
                    .sorted { $0.lexicographicallyPrecedes($1) }
            }
        }
    }

    public func removexattr(_ ino: UInt64, name: [UInt8]) throws(FSError) {
        try typed {
            if trashNode(ino) != nil { throw FSError(ENODATA, "no such attribute") }
            try mutate { s in
                guard case .node(var n) = try changeableTarget(ino) else { throw FSError(ENODATA, "no such attribute") }
                guard name.starts(with: Self.userPrefix) else { throw FSError(EOPNOTSUPP, "only user.* extended attributes are supported").routine() }
                // Computed: removing one changes nothing (`rsync -X` removes what its source lacks).
                if Self.statusAttributes.contains(name) {
                    guard try statusAttribute(name, of: n) != nil else { throw FSError(ENODATA, "no such attribute") }
                    return
                }
                guard state.xattrs[n.ino]?[name] != nil else { throw FSError(ENODATA, "no such attribute") }
                s.add(.deleteXattr(ino: n.ino, name: name))
                n.ctime = nowNanoseconds()
                s.put(n)
            }
        }
    }

    // MARK: - misc

    /// access(2) by mode bits (with `default_permissions` the kernel checks first; this serves
    /// `access` calls and model tests).
    public func access(_ ino: UInt64, mask: Int32, caller: Caller) throws(FSError) {
        try typed {
            let a = try getattr(ino)
            if mask == F_OK { return }
            if mask & W_OK != 0, ino == Self.rootID {
                throw FSError(EACCES, "read-only folder").routine()
            }
            if caller.uid == 0 {
                if mask & X_OK != 0, a.kind != .directory, a.mode & 0o111 == 0 { throw FSError(EACCES, "not executable").routine() }
                return
            }
            let bits: UInt32 = caller.uid == a.uid ? (a.mode >> 6) & 7 : caller.gid == a.gid ? (a.mode >> 3) & 7 : a.mode & 7
            if UInt32(mask) & ~bits & 7 != 0 { throw FSError(EACCES, "permission denied").routine() }
        }
    }

    public func statfs() -> FileSystemStatistics {
        let c = store.metadata.capacity()
        return FileSystemStatistics(blockSize: c.blockSize, totalBlocks: c.totalBlocks, freeBlocks: c.freeBlocks,
                                    availableBlocks: c.availableBlocks, totalFiles: c.totalFiles,
                                    freeFiles: c.freeFiles, nameMax: UInt64(nameMax))
    }

    /// For tests: see `Namespace.storageIdentity`.
    var namespaceStorageIdentity: [UInt] { ns.read { state.storageIdentity } }

    /// Every container registered in the store (for `containers` and tests).
    public var registeredContainers: [ContainerRecord] {
        ns.read { state.containers.values.sorted { $0.identifier < $1.identifier } }
    }
}

let documentsName = Array("Documents".utf8)

func levelsWord(_ limit: Int) -> String { limit == 0 ? "no" : "\(limit)" }
