// Start-up and background recovery: nodes left without a name, garbage collection of content
// no version names, and working copies that a daemon which died left unpublished (its own at
// start-up, or another daemon's on the store while this one runs). What a stop of the machine
// may have left is the store's to repair (`Durability.begin`), before any of this runs.

import Foundation
import UbiquityStore

extension UbiquityFileSystem {
    /// Files unlinked while open when the previous daemon stopped. While another daemon runs,
    /// nameless nodes may be its open files: they wait for a start with no other daemon.
    func removeOrphans() throws {
        guard !store.work.otherWritersAlive() else { return }
        try mutate { s in
            for (ino, n) in s.base.nodes where n.nlink == 0 { s.add(.deleteNode(ino)) }
        }
    }

    /// Delete blobs no version refers to (deleted files, failed publishes) that were written
    /// more than `garbageGrace` ago: a younger one may be another writer's, written for a commit
    /// it has not made yet. While other writers run, a blob must also have been unreferenced at
    /// the collection before (an hour earlier): one of them may still be reading a file deleted
    /// here a moment ago. Runs at start-up and every hour.
    func collectGarbage() throws {
        makeOwedConflictCopies()
        expireTrash()
        do { try pruneAll() } catch { log("retention: pruning old versions failed: \(error)") }
        do { try store.metadata.trimChanges(keepingLast: Self.changeLogKept) } catch {
            log("trimming the store's change log failed: \(error)")
        }
        let cutoff = nowNanoseconds() - Self.garbageGrace
        let candidates = try store.blobs.allBlobs(writtenBefore: cutoff)
        // Listed first, then the references: a blob committed in between is in the references.
        let referenced = candidates.isEmpty ? [] : try store.metadata.referencedBlobs()
        // Content an open file here still reads (another writer deleted it, or pruned its base),
        // and the content of ghosts, which the kernel may open and read until it forgets them.
        let open = docsLock.withLock { () -> Set<BlobID> in
            var blobs = docs.values.reduce(into: Set<BlobID>()) { $0.formUnion($1.baseBlobs()) }
            for ghost in ghosts.values { blobs.formUnion(ghost.chunks.lazy.filter { !$0.isHole }.map(\.blob)) }
            return blobs
        }
        let unreferenced = Set(candidates).subtracting(referenced).subtracting(open)
        let alone = !store.work.otherWritersAlive()
        let doomed = syncLock.withLock { () -> Set<BlobID> in
            let doomed = alone ? unreferenced : unreferenced.intersection(garbageSeen)
            garbageSeen = unreferenced.subtracting(doomed)
            return doomed
        }
        var freed = 0
        for blob in doomed {
            try store.blobs.delete(blob)
            freed += 1
        }
        if freed > 0 { log("freed \(freed) unreferenced content chunks") }
    }

    /// How old an unreferenced blob must be before garbage collection deletes it.
    static let garbageGrace: Int64 = 10 * 60 * 1_000_000_000

    /// Make everything published so far durable (the store records it, so that its check after a
    /// power cut covers only what came later).
    func syncPublished() throws {
        do { try store.durability.sync() } catch { throw FSError(error) }
        syncLock.withLock { lastSync = monotonicNanoseconds() }
    }

    /// Working copies a daemon that died left unpublished. One whose last writer had closed it is
    /// a finished document, and one an fsync made durable holds what the program asked to keep:
    /// either is published as the daemon would have published it (current, or a conflict if its
    /// base is no longer current). Any other (still open at the crash, possibly torn by a power
    /// cut) is kept as a `recovered` version beside the current one, for the user to restore.
    func recoverWorkingCopies() throws {
        // Started from this machine's copy of a shared store's namespace: a file made just
        // before a crash may be missing from it, so its working copy waits for the servers'
        // namespace (the change feed's next round after they answer) rather than being dropped.
        if store.offline?.queued.fromLocalCopy == true { return }
        for leftover in try store.work.leftovers() {
            let node = ns.read { state.nodes[leftover.ino] }
            guard let node, node.nlink > 0, node.kind == .regular else {
                leftover.file.remove()
                continue
            }
            var baseChunks: [ChunkRef] = []
            // A base gone from the history (its content lost to a power cut) leaves the copy's
            // pages without the bytes around them: never current then.
            var baseKnown = leftover.base == nil
            if let b = leftover.base, let v = try store.metadata.version(b) {
                baseChunks = v.chunks
                baseKnown = true
            }
            let doc = Document(recovered: leftover, base: baseChunks, baseVersion: leftover.base,
                               mtime: leftover.finished ? leftover.modified : max(node.mtime, leftover.modified),
                               store: store)
            if baseKnown && ((leftover.finished && leftover.intact) || leftover.synced) {
                // Durable, as every publish below: the working copy is deleted once this commits.
                // On a base that is no longer current it is a conflict, like any other publish.
                // A file in Recently Deleted stays there (the dead daemon may have deleted it
                // itself, after the close or fsync): its content is there for a restore.
                try publish(doc, durable: true, bringingBack: false)
                // A change no kernel request made: the kernel may hold the old size and times.
                // And a document open here follows it, unless it has changes of its own (those
                // then publish as a conflict).
                commits.withLock {
                    pendingInvalidations.append(.node(node.ino))
                    pendingRebases.insert(node.ino)
                }
                let why = leftover.synced ? "fsync'ed" : "closed"
                log(leftover.base == node.currentVersion
                    ? "published inode \(node.ino), \(why) before the daemon stopped, as its current version"
                    : "inode \(node.ino), \(why) before the daemon stopped, was edited on an older version: kept as a conflict")
                continue
            }
            try publish(doc, durable: true, beside: .recovered)
            log("recovered the unpublished working copy of inode \(node.ino) as a version (the current version is unchanged)")
        }
        store.work.recoveryFinished()
    }
}
