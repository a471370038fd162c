// Changing the namespace: every change is staged over the in-memory namespace, committed to the
// store as one batch that states what it read, and applied to memory in commit order; other
// writers' batches arrive through the same path from the store's change log (`catchUp`). See
// the design comment at the top of FileSystem.swift for the locking.

import Foundation
import UbiquityStore

extension UbiquityFileSystem {

    /// Stage with `body` over the namespace, commit what it staged, apply it to memory: all under
    /// `commits`, with `ns` held (for writing) only to apply, so readers never wait for the store.
    ///
    /// Other writers share the store, so the batch carries what it read (`Namespace.expectations`).
    /// If another writer changed any of that first, the commit fails with a conflict: the model
    /// catches up from the change log and stages the operation again over the fresh state, where
    /// it succeeds or fails as a local race would (`EEXIST`, `ENOENT`, `ENOTEMPTY`, …).
    ///
    /// `extra`: expectations beyond what the staging read (a queued batch settled as it was
    /// made); with `retryConflicts` false a conflict is thrown (as the StoreError), not staged
    /// again; `token`: the change-log token to commit under; `committed` is told the position.
    @discardableResult
    func mutate<T>(expecting extra: [Expectation] = [], retryConflicts: Bool = true, token: String? = nil,
                   committed: ((ChangeSeq) -> Void)? = nil, _ body: (inout Staging) throws -> T) throws -> T {
        var garbage: Set<BlobID> = []
        var deleted: [InodeNumber] = []
        let result = try commits.withLock { () throws -> T in
            var attempts = 0
            while true {
                // `state` changes only under `commits`, so it is read here without `ns`.
                var staging = Staging(state, ids: ids)
                let result = try body(&staging)
                if staging.mutations.isEmpty { return result }
                settleConflicts(&staging)
                let freed = try blobsFreed(by: staging)
                let batch = Batch(staging.mutations,
                                  expecting: extra + state.expectations(for: staging.mutations, unchanged: staging.unchanged),
                                  writer: writerID, position: state.seq, token: token,
                                  expectationsReadAtPosition: extra.isEmpty)
                let seq: ChangeSeq
                do throws(StoreError) { seq = try store.metadata.commit(batch, durable: false) } catch {
                    guard error.kind == .conflict else { throw FSError(error) }
                    guard retryConflicts else { throw error }   // the caller settles it another way
                    guard attempts < Self.conflictRetries else { throw FSError(error) }
                    attempts += 1
                    // Writers committing to one folder at once can keep beating each other's
                    // retries: past a few, wait a random while (up to a few ms) so one gets through.
                    if attempts > 4 { usleep(UInt32.random(in: 0...UInt32(min(attempts, 16) * 200))) }
                    try catchUpLocked()
                    continue
                }
                committed?(seq)
                for (ino, count) in staging.versionCounts { versionCounts[ino] = count }
                if seq == state.seq + 1 {
                    applyCommitted([ChangeRecord(seq: seq, writer: writerID, mutations: batch.mutations)])
                } else {
                    // Others committed in between: apply theirs and ours in log order. The batch
                    // is committed whatever happens here, so a failure to read the log must not
                    // be reported as the operation's (the change feed catches up later).
                    do { try catchUpLocked() } catch { log("catching up after commit \(seq) failed: \(error)") }
                }
                garbage = freed
                for case .deleteNode(let ino) in batch.mutations { deleted.append(ino) }
                return result
            }
        }
        free(garbage)
        // Another daemon may still lock a deleted node through a file it has open (and through
        // the lock file it has open): its lock file stays until a daemon starts alone.
        if !deleted.isEmpty, !store.work.otherWritersAlive() {
            for ino in deleted { store.locks.forget(ino) }
        }
        return result
    }

    /// How often an operation is staged again after conflicts before it gives up (with `EIO`:
    /// the store kept changing under it for that long).
    static let conflictRetries = 32

    /// Apply one committed batch to memory. `remote`: another writer's, so the version counts it
    /// touches are no longer known (this writer's own are counted as it stages them). Caller
    /// holds commits and ns (write).
    func applyLocked(_ mutations: [Mutation], seq: ChangeSeq, remote: Bool, chunks: [VersionID: [ChunkRef]]) {
        state.apply(mutations, seq: seq, chunks: chunks)
        for m in mutations {
            switch m {
            case .deleteNode(let ino): versionCounts[ino] = nil
            case .putVersion(let v) where remote: versionCounts[v.ino] = nil
            case .moveVersions(let from, let to) where remote: versionCounts[from] = nil; versionCounts[to] = nil
            default: break
            }
        }
    }

    /// Apply every batch committed since this namespace's position (other writers' and any of
    /// this writer's it has not applied). Caller holds commits.
    func catchUpLocked() throws {
        let records: [ChangeRecord]
        do { records = try store.metadata.changes(since: state.seq) } catch {
            if error.kind == .trimmed { return try reloadLocked() }
            throw FSError(error)
        }
        applyCommitted(records)
    }

    /// The change log no longer reaches back to this namespace's position (this daemon was
    /// stopped for long, say on a suspended machine, while others wrote): load the store's state
    /// again and note for the kernel and for open documents everything that differs. Caller
    /// holds commits.
    func reloadLocked() throws {
        let snapshot: StoreSnapshot
        do { snapshot = try store.metadata.load() } catch { throw FSError(error) }
        let fresh = Namespace(snapshot: snapshot)
        let (found, changed) = state.differences(to: fresh)
        var invalidations = found
        ns.write {
            // The desktop trash's names are not nodes: what left the trash or came into it, each
            // named as the namespace it is in names it.
            let before = state.trashed
            let gone = offersDesktopTrash ? before.values.filter { fresh.trashed[$0.ino] != $0 } : []
            if !gone.isEmpty { invalidations += trashInvalidations(of: Array(gone)) }
            state.replace(with: fresh)
            let came = offersDesktopTrash ? state.trashed.values.filter { before[$0.ino] != $0 } : []
            if !came.isEmpty { invalidations += trashInvalidations(of: Array(came)) }
            versionCounts = [:]
            pendingInvalidations += invalidations
            pendingRebases.formUnion(changed)
            let now = monotonicNanoseconds()
            for ino in changed where state.nodes[ino]?.kind == .regular { changedElsewhere.note(ino, now: now) }
        }
        log("the store's change log no longer reaches back to this daemon's position; loaded the namespace again "
            + "(\(changed.count) nodes differed)")
    }

    /// Change-log records kept when the log is trimmed (at start and every hour). A daemon
    /// further behind than this reloads its namespace; a running one is never more than a tenth
    /// of a second behind.
    static let changeLogKept = 100_000

    /// Apply committed batches past the namespace's position, in log order, and note for the
    /// kernel what other writers changed (`pendingInvalidations`, sent by the change feed).
    /// Caller holds commits, not ns: the chunk lists the batches make current without carrying
    /// them are read from the store first, so ns is held for writing only while memory changes.
    func applyCommitted(_ all: [ChangeRecord]) {
        let records = all.filter { $0.seq > state.seq }
        guard let first = records.first else { return }
        guard first.seq == state.seq + 1 else {
            // A gap (a log another implementation trimmed without saying so): never apply past it.
            do { try reloadLocked() } catch { log("the change log skips from \(state.seq) to \(first.seq), and loading the namespace again failed: \(error)") }
            return
        }
        let chunks = chunksNeeded(by: records)
        // Files whose content another writer changed, with their chunks before (for pins).
        var changedContent: [InodeNumber: [ChunkRef]] = [:]
        // Files whose new version these records leave out (its chunk list went with a delete
        // later in them): their chunks stay as they were, so a ghost is made of the record as
        // it was too, not of the new size over the old chunks.
        var heldBack: [InodeNumber: NodeRecord] = [:]
        ns.write {
            // Without a change feed draining them (a model in a test), keep the newest only.
            if pendingInvalidations.count > 1_000_000 { pendingInvalidations.removeFirst(500_000) }
            if pendingWatches.count > 100_000 { pendingWatches.removeFirst(50_000) }
            for r in records {
                let remote = r.writer != writerID
                if remote {
                    // The mount root lists containers by name: a renamed or re-registered one
                    // changes its entries.
                    for case .putContainer(let c) in r.mutations {
                        pendingInvalidations.append(.node(Self.rootID))
                        for old in [state.containers[c.identifier], c].compactMap({ $0 }) {
                            pendingInvalidations.append(.entry(parent: Self.rootID, name: Array(old.name.utf8)))
                            pendingInvalidations.append(.entry(parent: Self.rootID, name: Array(old.identifier.utf8)))
                        }
                    }
                }
                let trashBefore = trashedItems(touchedBy: r.mutations)
                let watches = remote ? watches(before: r.mutations) : []
                if remote {
                    for case .deleteNode(let ino) in r.mutations where kernelHolds(ino) {
                        guard var n = heldBack[ino] ?? state.nodes[ino], n.kind != .directory else { continue }
                        n.nlink = 0
                        let chunks = state.chunks[ino] ?? []
                        docsLock.withLock { ghosts[ino] = (n, chunks) }
                    }
                }
                if remote {
                    for case .putNode(let n) in r.mutations where n.kind == .regular && n.currentVersion != state.nodes[n.ino]?.currentVersion {
                        if changedContent[n.ino] == nil { changedContent[n.ino] = state.chunks[n.ino] ?? [] }
                        if let v = n.currentVersion, chunks[v] == nil {
                            if heldBack[n.ino] == nil { heldBack[n.ino] = state.nodes[n.ino] }
                        } else {
                            heldBack[n.ino] = nil   // its chunks and its record agree again
                        }
                    }
                }
                applyLocked(r.mutations, seq: r.seq, remote: remote, chunks: chunks)
                pendingWatches += watches
                if !trashBefore.isEmpty { pendingInvalidations += trashInvalidations(before: trashBefore) }
                guard remote else { continue }
                let now = monotonicNanoseconds()
                for m in r.mutations {
                    if case .putNode(let n) = m {
                        pendingRebases.insert(n.ino)
                        // Files only: a size the kernel keeps decides what a read returns.
                        if n.kind == .regular { changedElsewhere.note(n.ino, now: now) }
                    }
                    switch m {
                    case .putDirent(let d): pendingInvalidations.append(.entry(parent: d.parent, name: d.name)); pendingInvalidations.append(.node(d.parent))
                    case .deleteDirent(let parent, let name): pendingInvalidations.append(.entry(parent: parent, name: name)); pendingInvalidations.append(.node(parent))
                    case .putNode(let n): pendingInvalidations.append(.node(n.ino))
                    case .deleteNode(let ino): pendingInvalidations.append(.node(ino))
                    case .putXattr(let x): pendingInvalidations.append(.node(x.ino))
                    case .deleteXattr(let ino, _): pendingInvalidations.append(.node(ino))
                    default: break
                    }
                }
            }
        }
        followPins(changedContent)
    }

    /// The chunk lists of the versions `records` make current: from the batch when it carries
    /// the version (a publish), else from the store (a revert, a restore). Caller holds commits,
    /// so `state` is the namespace the records follow on from.
    func chunksNeeded(by records: [ChangeRecord]) -> [VersionID: [ChunkRef]] {
        var current: [InodeNumber: VersionID?] = [:]
        var out: [VersionID: [ChunkRef]] = [:]
        // A big file's version whose shared list went with a delete later in these records is
        // left out of them (the store no longer has it): nothing to look for, nor to say.
        var deleted = Set<InodeNumber>(), deletedVersions = Set<VersionID>()
        for r in records {
            for m in r.mutations {
                if case .deleteNode(let ino) = m { deleted.insert(ino) }
                if case .deleteVersion(let id) = m { deletedVersions.insert(id) }
            }
        }
        for r in records {
            var carried: [VersionID: [ChunkRef]] = [:]
            for case .putVersion(let v) in r.mutations { carried[v.id] = v.chunks }
            for case .putNode(let n) in r.mutations {
                let before = current[n.ino] ?? state.nodes[n.ino]?.currentVersion
                current[n.ino] = n.currentVersion
                guard let v = n.currentVersion, v != before, out[v] == nil else { continue }
                if let c = carried[v] { out[v] = c; continue }
                if deleted.contains(n.ino) || deletedVersions.contains(v) { continue }
                do {
                    if let found = try store.metadata.version(v) { out[v] = found.chunks }
                    else { log("inode \(n.ino): its current version \(v) is not in the store") }
                } catch { log("reading version \(v) of inode \(n.ino) failed: \(error)") }
            }
        }
        return out
    }

    /// Apply what other writers (another view, another device) committed since the last look,
    /// and say what the kernel may have cached of it. The change feed calls this a few times a
    /// second: the store is asked without the namespace lock, which is taken only to apply.
    @discardableResult
    public func catchUp() throws(FSError) -> [KernelInvalidation] {
        try catchUpForKernel().invalidations
    }

    /// Whether the store answers, for a store on other machines (nil: it is on this machine).
    public var storeReachability: StoreReachability? { store.metadata.reachability() }

    /// Waits at most `seconds` for a sign that another writer committed (see
    /// `MetadataStore.waitForChanges`).
    public func waitForStoreChanges(_ seconds: Double) {
        store.metadata.waitForChanges(seconds)
    }

    /// The invalidations of `changes` that concern what the kernel holds: it answers the rest
    /// ENOENT, and a delete into Recently Deleted alone makes five for the desktop trash's
    /// folders (a system call each). A node counts as held from before the kernel is given it
    /// (`remember`) until it forgets it.
    public func heldByKernel(_ changes: [KernelInvalidation]) -> [KernelInvalidation] {
        docsLock.withLock {
            changes.filter { change in
                switch change {
                case .node(let ino): return ino == Self.rootID || kernelRefs.holds(ino)
                case .entry(let parent, _): return parent == Self.rootID || kernelRefs.holds(parent)
                }
            }
        }
    }

    /// `catchUp`, and the same changes as replays for programs watching the mount (see
    /// WatchEvents.swift): the change feed sends the invalidations first, then replays.
    public func catchUpForKernel() throws(FSError) -> (invalidations: [KernelInvalidation], watches: [WatchEvent]) {
        try typed {
            // First, so files stay uncached no longer than their time while the store is out of reach.
            commits.withLock {
                let now = monotonicNanoseconds()
                if changedElsewhere.hasExpired(now: now) { ns.write { changedElsewhere.prune(now: now) } }
            }
            let from = ns.read { state.seq }
            var records: [ChangeRecord] = []
            var trimmed = false
            do throws(StoreError) { records = try store.metadata.changes(since: from) } catch {
                guard error.kind == .trimmed else { throw FSError(error) }
                trimmed = true
            }
            let (all, rebases, watches) = try commits.withLock { () throws -> ([KernelInvalidation], [(NodeRecord, [ChunkRef])], [WatchEvent]) in
                // Records at or below the position were applied meanwhile (this writer's own commits
                // catch up too); the rest follow on from it with no gap.
                if trimmed { try catchUpLocked() } else { applyCommitted(records) }
                let watches = watchEvents(pendingWatches)
                pendingWatches = []
                guard !pendingInvalidations.isEmpty || !pendingRebases.isEmpty else { return ([], [], watches) }
                defer { pendingInvalidations = []; pendingRebases = [] }
                let open = docsLock.withLock { Set(docs.keys) }
                let rebases = pendingRebases.filter(open.contains).compactMap { ino in
                    state.nodes[ino].map { ($0, state.chunks[ino] ?? []) }
                }
                return (pendingInvalidations, rebases, watches)
            }
            // No namespace lock here: a document's lock comes before it.
            for (node, chunks) in rebases {
                docsLock.withLock { docs[node.ino] }?.rebase(on: node, chunks: chunks)
            }
            var seen: Set<KernelInvalidation> = []
            return (all.filter { seen.insert($0).inserted }, watches)
        }
    }

    /// An item asked for under `asked` in `parent` landed as `placed`, because the name was
    /// taken (by another writer since this mount last looked, or by a folder hidden at this
    /// level). The kernel caches `asked` as this item (it is answered for the name it asked), so
    /// the change feed tells it to drop both names. The kernel applies that only once the create
    /// or rename it corrects has finished: both hold the folder's lock.
    func placedBeside(parent: UInt64, asked: [UInt8], placed: [UInt8], what: String, also: [KernelInvalidation] = []) {
        log("\(what) \(String(decoding: asked, as: UTF8.self)) as \(String(decoding: placed, as: UTF8.self)): the name was taken")
        commits.withLock {
            pendingInvalidations += [.entry(parent: parent, name: asked), .entry(parent: parent, name: placed), .node(parent)] + also
        }
    }

    /// Blobs no version refers to once `staging` commits: those of deleted files' versions and
    /// of pruned versions. Caller holds commits.
    func blobsFreed(by staging: Staging) throws -> Set<BlobID> {
        var movedAway: Set<InodeNumber> = []
        var deletedVersions: Set<VersionID> = []
        for m in staging.mutations {
            if case .moveVersions(let from, _) = m { movedAway.insert(from) }
            if case .deleteVersion(let id) = m { deletedVersions.insert(id) }
        }
        var freed: Set<BlobID> = []
        for case .deleteNode(let ino) in staging.mutations where !movedAway.contains(ino) && state.nodes.kind(of: ino) == .regular {
            do {
                for v in try store.metadata.versions(of: ino) { freed.formUnion(v.chunks.lazy.filter { !$0.isHole }.map(\.blob)) }
            } catch {
                // Servers out of reach (the delete is queued): the garbage collection frees
                // these chunks later, once no version names them.
                if error.kind == .unavailable { continue }
                throw FSError(error)
            }
        }
        return freed.union(staging.prunedBlobs)
    }

    /// Delete blob files after the commit that unreferenced them (a crash in between leaves
    /// garbage that start-up collects, never a reference to a missing blob). While another
    /// daemon runs on the store it may still be reading them (a file it has open that was
    /// deleted here), so they are left to the garbage collection's grace period instead.
    func free(_ blobs: Set<BlobID>) {
        guard !blobs.isEmpty, !store.work.otherWritersAlive() else { return }
        for blob in blobs {
            do { try store.blobs.delete(blob) } catch { log("freeing content chunk \(blob) failed: \(error)") }
        }
    }

    func newNode(ino: InodeNumber, container: String, kind: NodeKind, mode: UInt32,
                         caller: Caller, rdev: UInt64 = 0, target: [UInt8] = []) -> NodeRecord {
        let now = nowNanoseconds()
        return NodeRecord(ino: ino, container: container, kind: kind, mode: mode & 0o7777, uid: caller.uid,
                          gid: caller.gid, nlink: kind == .directory ? 2 : 1, size: kind == .symlink ? UInt64(target.count) : 0,
                          atime: now, mtime: now, ctime: now, btime: now, rdev: rdev, target: target)
    }
}
