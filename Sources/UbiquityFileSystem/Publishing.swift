// Publishing: a document's working copy becomes a version of the file (one metadata commit,
// between `Document.preparePublish` and `Publication.finish`), with version retention, and the periodic tasks of a running daemon
// (idle publishes, the sync every 30 s, taking over dead daemons' working copies, the hourly
// collection), and the publish of everything at a stop.

import Foundation
import UbiquityStore

extension UbiquityFileSystem {
    /// Publish `doc`'s working copy: as the file's current version, or with `beside`, as a
    /// version of that origin beside the current one, leaving the file as it is (recovery of a
    /// copy that cannot be trusted to be the file's content). `durable`: the store's barrier
    /// before the working copy goes. The one path for every publish, recovery's included.
    /// `bringingBack`: a file another writer deleted meanwhile comes back (see below); false in
    /// recovery, where the delete may have been the dead daemon's own.
    func publish(_ doc: Document, durable: Bool, beside: VersionOrigin? = nil, bringingBack: Bool = true,
                 removeLater: ((any WorkFile) -> Void)? = nil) throws {
        // A nameless file is never published (it is deleted once nothing refers to it). If its
        // last name goes while this publish runs, the commit below adds nothing and the
        // unfinished publication deletes the chunks it wrote.
        if isNameless(doc.ino) { return }
        let barrier = { try self.store.durability.sync() }
        // Published meanwhile (an idle publish, without a barrier): the barrier is still owed.
        guard let p = try doc.preparePublish() else {
            if durable { try barrier() }
            return
        }
        // What an fsync made durable in the working copy stays durable as a version.
        let sync: (() throws -> Void)? = durable || p.synced ? barrier : nil
        let (chunks, size, mtime, ctime) = (p.chunks, p.size, p.mtime, p.ctime)
        let committed = try mutate { s -> (VersionID, Conflict?)? in
            guard var n = s.node(doc.ino), n.nlink > 0 else { return nil }
            let id = try s.newVersion()
            if let origin = beside {
                s.add(.putVersion(VersionRecord(id: id, ino: n.ino, created: nowNanoseconds(), size: size,
                                                chunks: chunks, origin: origin, device: self.device)))
                return (id, nil)
            }
            if n.currentVersion != doc.baseVersion {
                // Another writer published this file since this edit began: never overwrite
                // that. This edit is kept as a version beside it, origin `conflict` (on the
                // node as it is now: if it changes or goes meanwhile, this is staged again).
                s.expectUnchanged(n.ino)
                s.add(.putVersion(VersionRecord(id: id, ino: n.ino, created: nowNanoseconds(), size: size,
                                                chunks: chunks, origin: .conflict, device: self.device)))
                // Unresolved until the user says; its copy beside the file is made next.
                let conflict = Conflict(version: id, file: n.ino)
                s.add(.setMeta(key: conflict.key, value: conflict.value))
                // The kernel may hold this edit's size and times: the file shows the other's.
                // An open document follows the current version once it has no changes left.
                self.pendingInvalidations.append(.node(n.ino))
                self.pendingRebases.insert(n.ino)
                self.log("inode \(n.ino) was published elsewhere since this edit began; "
                         + "the edit is kept as conflict version \(id)")
                return (id, conflict)
            }
            s.add(.putVersion(VersionRecord(id: id, ino: n.ino, created: nowNanoseconds(), size: size,
                                            chunks: chunks, origin: .published, device: self.device)))
            try self.prune(&s, ino: n.ino, adding: chunks)
            n.size = size
            n.mtime = max(n.mtime, mtime)
            n.ctime = max(n.ctime, ctime)
            n.currentVersion = id
            s.put(n)
            return (id, nil)
        }
        // The file is gone: `p` goes unfinished, and its chunks with it.
        guard let (id, conflict) = committed else { return }
        try p.finish(as: id, sync: sync, removeLater: removeLater)
        // Another writer (another mount, device) deleted the file while this edit went on: the
        // edit brings it back, as iCloud does (before any conflict copy is put beside it). A
        // delete here while it is open is this mount's own, and stays: a program may unlink a
        // file it still writes.
        // The same if a folder it is in went to Recently Deleted whole. Just the file (and the
        // folders it needs) comes back: the other items deleted with it stay deleted.
        if beside == nil && bringingBack { bringBackIfDeletedElsewhere(doc.ino, why: "edited here") }
        if let conflict { makeConflictCopy(conflict) }
    }

    /// `ino`, if another writer put it (or a folder it is in) in Recently Deleted, comes back from
    /// there with the folders it needs; the other items deleted with it stay deleted.
    func bringBackIfDeletedElsewhere(_ ino: InodeNumber, why: String) {
        guard let (item, r) = ns.read({ () -> (InodeNumber, TrashRecord)? in
            if let r = state.trashed[ino] { return (ino, r) }
            guard !state.trashedFolders.isEmpty, let f = trashedAncestorLocked(of: ino), let r = state.trashed[f] else { return nil }
            return (f, r)
        }), r.writer != writerID else { return }
        do {
            _ = try restoreFromTrash(item, withChildren: false)
            log("inode \(ino) was deleted on \(r.device) while \(why): it comes back as \(displayPath(of: ino) ?? "?")")
        } catch { log("inode \(ino) was deleted on \(r.device) while \(why); it stays in Recently Deleted: \(error)") }
    }

    /// Count the version being added to `ino`; past the per-file limit (plus slack), stage the
    /// deletion of the versions the retention policy lets go, and note the blobs only they used.
    /// Caller holds commits (inside `mutate`).
    func prune(_ s: inout Staging, ino: InodeNumber, adding chunks: [ChunkRef]) throws {
        let keep = max(Self.storedRetention(in: state.meta).maxPerFile, 2)
        let count: Int
        if let known = versionCounts[ino] { count = known + 1 } else {
            do { count = try store.metadata.versionCount(of: ino) + 1 } catch {
                // Servers out of reach (the publish is queued): old versions are pruned at a
                // later publish, or by the hourly pass.
                if error.kind == .unavailable { return }
                throw FSError(error)
            }
        }
        s.versionCounts[ino] = count
        guard count > keep + keep / 2 else { return }
        // The version being added is the newest and stays: one fewer place for the others.
        // (Read from `state`: this runs under commits, inside a staging.)
        var policy = Self.storedRetention(in: state.meta)
        policy.maxPerFile = keep - 1
        let removed = try stagePrune(&s, ino: ino, policy: policy, alsoUsed: Set(chunks.map(\.blob)))
        s.versionCounts[ino] = count - removed
    }

    /// Stage the deletion of `ino`'s versions that `policy` (or `extra`) lets go, keeping its
    /// current version, unresolved conflicts and what a file the kernel still shows; note the
    /// blobs no remaining version uses (`alsoUsed`: a version being added, what an open document
    /// reads). Returns how many went. Caller holds commits (inside `mutate`), so no document
    /// lock: lock order is document, then commits.
    @discardableResult
    func stagePrune(_ s: inout Staging, ino: InodeNumber, policy: RetentionPolicy, extra: Set<VersionID> = [],
                    alsoUsed: Set<BlobID> = []) throws -> Int {
        let all: [VersionRecord]
        do { all = try store.metadata.versions(of: ino) } catch { throw FSError(error) }
        // A file replaced by rename that the kernel still refers to keeps showing its current
        // version, which moved to this file's history.
        var keep = Set(state.nodes.values.lazy.filter { $0.nlink == 0 }.compactMap(\.currentVersion))
        if let current = state.nodes[ino]?.currentVersion { keep.insert(current) }
        for c in state.conflicts.values where c.file == ino { keep.insert(c.version) }
        let doomed = policy.doomed(all, keep: keep, now: clock()).union(extra.subtracting(keep))
        guard !doomed.isEmpty else { return 0 }
        var stillUsed = alsoUsed
        for v in all where !doomed.contains(v.id) { stillUsed.formUnion(v.chunks.map(\.blob)) }
        var removed = 0
        for v in all where doomed.contains(v.id) {
            s.add(.deleteVersion(v.id))
            removed += 1
            for c in v.chunks where !c.isHole && !stillUsed.contains(c.blob) { s.prunedBlobs.insert(c.blob) }
        }
        return removed
    }

    /// The retention policy over every file, with each container's space limit for old
    /// versions (the oldest go first). One commit per file that loses versions. At start and
    /// with each hourly collection.
    func pruneAll() throws {
        let all: [VersionRecord]
        do { all = try store.metadata.allVersions() } catch { throw FSError(error) }
        let now = clock()
        let retention = self.retention
        var byFile: [InodeNumber: [VersionRecord]] = [:]
        for v in all { byFile[v.ino, default: []].append(v) }
        var doomed: [InodeNumber: Set<VersionID>] = [:]
        var old: [String: [VersionRecord]] = [:]   // by container: versions that stay, not current
        ns.read {
            for (ino, versions) in byFile {
                guard let n = state.nodes[ino] else { continue }
                var keep: Set<VersionID> = n.currentVersion.map { [$0] } ?? []
                for c in state.conflicts.values where c.file == ino { keep.insert(c.version) }
                let d = retention.doomed(versions, keep: keep, now: now)
                if !d.isEmpty { doomed[ino] = d }
                // What the space limit may take: old versions past the first day, never one
                // recovered after a crash (it may be the only copy of an edit).
                old[n.container, default: []] += versions.filter {
                    !keep.contains($0.id) && !d.contains($0.id) && $0.origin != .recovered && now - $0.created >= retention.allFor
                }
            }
        }
        for (_, versions) in old {
            var total = versions.reduce(UInt64(0)) { $0 + $1.size }
            for v in versions.sorted(by: { ($0.created, $0.id) < ($1.created, $1.id) }) where total > retention.maxBytesPerContainer {
                doomed[v.ino, default: []].insert(v.id)
                total -= v.size
            }
        }
        var removed = 0
        for (ino, ids) in doomed {
            // A document open here may be editing on an old version (its publish becomes a
            // conflict that reuses those chunks). Its base only moves on to newer versions.
            let reading = docsLock.withLock { docs[ino] }?.baseBlobs() ?? []
            removed += try mutate { s -> Int in
                let n = try stagePrune(&s, ino: ino, policy: retention, extra: ids, alsoUsed: reading)
                if n > 0 { s.versionCounts[ino] = nil }
                return n
            }
        }
        if removed > 0 { log("retention: \(removed) old versions deleted") }
    }

    /// Publish files held open that have not changed for the idle time. The daemon calls this
    /// periodically.
    public func publishIdle() {
        let now = monotonicNanoseconds()
        for doc in docsLock.withLock({ Array(docs.values) })
        where doc.hasUnpublishedChanges && now &- doc.stat().lastChange >= idlePublishNanoseconds {
            do {
                try publish(doc, durable: false)
                dropIfIdle(doc)
            } catch { log("idle publish of inode \(doc.ino) failed: \(error)") }
        }
        // Every 30 s, a sync makes all versions published since durable (the store skips it when
        // nothing was committed since).
        if syncLock.withLock({ now &- lastSync >= 30_000_000_000 }) {
            do { try syncPublished() } catch { log("periodic sync failed: \(error)") }
        }
        // Every 5 s, the working copies of daemons on this store that died meanwhile: a file
        // saved and closed on a mount whose daemon was killed reaches this one without waiting
        // for a daemon to start.
        if syncLock.withLock({ Self.due(&lastAdoption, every: 5_000_000_000, now: now) }) {
            do { try recoverWorkingCopies() } catch { log("recovering a stopped daemon's working copies failed: \(error)") }
        }
        // Every hour, garbage that other writers left to the grace period.
        if syncLock.withLock({ Self.due(&lastCollection, every: 3_600_000_000_000, now: now) }) {
            do { try collectGarbage() } catch { log("garbage collection failed: \(error)") }
        }
    }

    /// Whether `interval` has passed since `last`; if so `last` becomes `now`. Caller holds syncLock.
    static func due(_ last: inout UInt64, every interval: UInt64, now: UInt64) -> Bool {
        guard now &- last >= interval else { return false }
        last = now
        return true
    }

    /// Publish every working copy with changes (unmount, SIGTERM). Returns the failures.
    @discardableResult
    public func publishAll() -> [FSError] {
        var failures: [FSError] = []
        // One sync for all of them; each working copy is deleted only once its version is durable.
        var published: [any WorkFile] = []
        for doc in docsLock.withLock({ Array(docs.values) }) where doc.hasUnpublishedChanges {
            do {
                try publish(doc, durable: false, removeLater: { published.append($0) })
                dropIfIdle(doc)
            } catch {
                failures.append(FSError(error))
                log("publish of inode \(doc.ino) at unmount failed, its working copy is kept for recovery: \(error)")
            }
        }
        do {
            try syncPublished()
            for work in published { work.remove() }
        } catch {
            failures.append(FSError(error))
            log("the final sync failed; \(published.count) published working copies are kept for recovery: \(error)")
        }
        return failures
    }

    /// Publish everything and record a clean stop (the daemon calls this last).
    @discardableResult
    public func stop() -> [FSError] {
        var failures = publishAll()
        if failures.isEmpty {
            do { try store.durability.end(writer: writerID) }
            catch { failures.append(FSError(EIO, "recording the clean stop failed: \(error)")) }
        }
        return failures
    }
}
