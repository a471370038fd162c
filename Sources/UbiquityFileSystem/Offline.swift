// Changes a shared store queued while its servers were out of reach, and could not send as they
// were made because another machine changed what they read: settled here over the state of now,
// keeping what the user wrote beside what the other machine did, never over it.
//
// Each such batch is first tried again as it was (an earlier queued batch may have been settled
// in a way that makes it hold). If it still does not hold, it is staged again, part by part:
// - items it made are placed where it made them, under a free name if the name was taken
//   (`Notes 2.txt`), in the container's Documents folder if their folder is gone;
// - content it published becomes the current version if nothing changed the file meanwhile,
//   else a conflict version with its copy beside the file, as a publish on a stale base does
//   online; a file deleted meanwhile comes back from Recently Deleted with it;
// - attributes and extended attributes of a file nothing changed meanwhile are applied;
// - the rest (renames, deletes, links, settings over what another machine changed) is dropped
//   with a line in the log: the other machine's change stands, and no content is lost by that.

import Foundation
import UbiquityStore

extension UbiquityFileSystem {
    /// What the store holds queued on this machine (nil: a store on this machine's disk).
    public var queuedChanges: QueueState? { store.offline?.queued }

    /// Sends what the store queued if its servers answer again (the change feed calls this
    /// before it reads the change log).
    public func sendQueuedChanges() { store.offline?.sendIfDue() }

    /// Settles every batch the store hands over (see above). The change feed calls this after
    /// each catch-up; a failure (servers gone again) leaves the rest for the next call.
    public func settleQueuedChanges() {
        guard let queue = store.offline else { return }
        // Sent as they were made, into a folder another machine deleted meanwhile: back in sight.
        for ino in queue.takeSent() { bringBackIfDeletedElsewhere(ino, why: "made or saved here out of reach of the store") }
        let now = monotonicNanoseconds()
        while let q = queue.nextUnsettled() {
            if let f = settleFailures[q.id], now < f.next { return }   // backing off
            do {
                let (seq, nodes) = try settle(q.batch)
                do { try queue.settled(q.id, at: seq, nodes: nodes) } catch { throw FSError(error) }
                settleFailures = [:]
            } catch {
                log("settling a change made while the store was out of reach failed; tried again later: \(error)")
                // Out of reach again, it waits; failing for another reason, it must not hold up
                // the queue for ever.
                if store.metadata.reachability()?.online != false {
                    var f = settleFailures[q.id] ?? (count: 0, next: 0)
                    f.count += 1
                    // 1 s, 2 s, 4 s, 8 s between tries: a passing failure does not set it aside.
                    f.next = now + (UInt64(1) << min(f.count - 1, 10)) * settleBackoff
                    settleFailures[q.id] = f
                    if f.count >= Self.settleAttempts { queue.setAside(q.id) }
                }
                return
            }
        }
    }

    /// How often a queued batch is tried before it is set aside.
    static let settleAttempts = 5

    /// Commits under the batch's token, so that a crash before the store forgets the batch
    /// does not settle it twice. Returns the position it was committed at (nil: nothing of it
    /// was) and the nodes it put as the batch had them (nil: all of them).
    func settle(_ batch: Batch) throws -> (ChangeSeq?, Set<InodeNumber>?) {
        var position: ChangeSeq?
        do {
            try mutate(expecting: batch.expectations, retryConflicts: false, token: batch.token,
                       committed: { position = $0 }) { s in
                for m in batch.mutations {
                    if case .putNode(let n) = m { s.put(n) } else { s.add(m) }
                }
            }
            invalidateNamesOf(batch)
            return (position, nil)
        } catch let e as StoreError where e.kind == .conflict {
            // Staged again below.
        }
        var copies: [Conflict] = []
        var restore: [InodeNumber] = []
        var notes: [String] = []
        var kept: Set<InodeNumber> = []
        try mutate(token: batch.token, committed: { position = $0 }) { s in
            copies = []; restore = []; notes = []
            kept = salvage(batch, into: &s, copies: &copies, restore: &restore, notes: &notes)
        }
        invalidateNamesOf(batch)
        for n in notes { log(n) }
        for ino in restore {
            do { _ = try restoreFromTrash(ino, withChildren: false) } catch {
                log("inode \(ino) was deleted elsewhere while edited offline here; it stays in Recently Deleted: \(error)")
            }
        }
        for c in copies { makeConflictCopy(c) }
        return (position, kept)
    }

    /// The kernel may hold what the mount showed between loading the store again and settling
    /// `batch` (its items absent, names it made unknown, for as long as the cache time): it
    /// forgets the names and nodes the batch touches.
    private func invalidateNamesOf(_ batch: Batch) {
        var out: [KernelInvalidation] = []
        for m in batch.mutations {
            switch m {
            case .putDirent(let d): out += [.entry(parent: d.parent, name: d.name), .node(d.parent), .node(d.child)]
            case .deleteDirent(let parent, let name): out += [.entry(parent: parent, name: name), .node(parent)]
            case .putNode(let n): out.append(.node(n.ino))
            case .putXattr(let x): out.append(.node(x.ino))
            case .deleteXattr(let ino, _): out.append(.node(ino))
            default: break
            }
        }
        commits.withLock { pendingInvalidations += out }
    }

    /// Stages what of `batch` can be kept over the state of now (see the top of this file).
    /// Returns the nodes put as the batch had them. Caller holds commits (inside `mutate`).
    func salvage(_ batch: Batch, into s: inout Staging, copies: inout [Conflict], restore: inout [InodeNumber],
                 notes: inout [String]) -> Set<InodeNumber> {
        var kept: Set<InodeNumber> = []
        let now = state
        func unchanged(_ ino: InodeNumber) -> Bool {
            batch.expectations.contains { e in
                if case .nodeAt(let i, let c) = e { return i == ino && now.nodes.change(of: ino) == c }
                return false
            }
        }
        var last: [InodeNumber: NodeRecord] = [:]
        var deleted: Set<InodeNumber> = []
        var published: [InodeNumber: VersionRecord] = [:]
        for m in batch.mutations {
            switch m {
            case .putNode(let n): last[n.ino] = n
            case .deleteNode(let ino): deleted.insert(ino)
            case .putVersion(let v): published[v.ino] = v
            default: break
            }
        }
        let made = Set(last.keys.filter { now.nodes[$0] == nil && !deleted.contains($0) })
        var placed: Set<InodeNumber> = []
        var staged: [InodeNumber: Set<[UInt8]>] = [:]
        var dropped: [String] = []
        func place(_ n: NodeRecord, asked parent: InodeNumber, name asked: [UInt8]) {
            var folder = parent
            // A folder in Recently Deleted counts as gone: what was made in it stays in sight.
            let trashed = ns.read { now.trashed[folder] != nil || trashedAncestorLocked(of: folder) != nil }
            if s.node(folder)?.kind != .directory || trashed {
                guard let c = now.containers[n.container], let docs = policy.documentsIno(c, in: now) else {
                    dropped.append("inode \(n.ino) (its folder and container are gone)")
                    return
                }
                folder = docs
            }
            let name = freeName(asked) { now.children[folder]?[$0] != nil || staged[folder]?.contains($0) == true }
            staged[folder, default: []].insert(name)
            if !placed.contains(n.ino) { s.put(n); placed.insert(n.ino); kept.insert(n.ino) }
            s.add(.putDirent(DirentRecord(parent: folder, name: name, child: n.ino)))
            // The kernel saw these names as they were before the store was loaded again.
            pendingInvalidations += [.entry(parent: folder, name: name), .entry(parent: parent, name: asked), .node(folder)]
            if !made.contains(folder), var p = s.node(folder) {
                p.mtime = max(p.mtime, n.ctime)
                p.ctime = max(p.ctime, n.ctime)
                if n.kind == .directory { p.nlink += 1 }
                s.put(p)
            }
            if folder != parent || name != asked {
                notes.append("\(String(decoding: asked, as: UTF8.self)), made while the store was out of reach, is kept as "
                             + "\(String(decoding: name, as: UTF8.self))"
                             + (folder != parent ? " in its container's Documents folder (its folder was deleted)" : " (the name was taken)"))
            }
        }
        // Items the batch made, in the order it named them.
        for case .putDirent(let d) in batch.mutations where made.contains(d.child) {
            if let n = last[d.child] { place(n, asked: d.parent, name: d.name) }
        }
        for m in batch.mutations {
            switch m {
            case .putDirent(let d) where made.contains(d.child): break
            case .putNode(let n) where made.contains(n.ino): break
            case .putVersion(let v) where made.contains(v.ino):
                if placed.contains(v.ino) { s.add(m) } else { dropped.append("version \(v.id) of inode \(v.ino), which has no name") }
            case .putVersion(var v):
                let publishes = last[v.ino]?.currentVersion == v.id
                if var n = s.node(v.ino) {
                    pendingInvalidations.append(.node(v.ino))
                    pendingRebases.insert(v.ino)
                    if publishes && unchanged(v.ino) {
                        s.add(m)
                        if let ours = last[v.ino] {
                            // Its content and attributes; its names and link count as they are now.
                            n.currentVersion = v.id
                            n.size = ours.size
                            n.mode = ours.mode; n.uid = ours.uid; n.gid = ours.gid; n.atime = ours.atime
                            n.mtime = max(n.mtime, ours.mtime)
                            n.ctime = max(n.ctime, ours.ctime)
                        }
                        s.put(n)
                        kept.insert(v.ino)
                    } else if publishes {
                        v.origin = .conflict
                        s.add(.putVersion(v))
                        let c = Conflict(version: v.id, file: v.ino)
                        s.add(.setMeta(key: c.key, value: c.value))
                        copies.append(c)
                        if now.trashed[v.ino] != nil { restore.append(v.ino) }
                        notes.append("inode \(v.ino) changed elsewhere while edited here out of reach of the store; "
                                     + "the edit is kept as conflict version \(v.id)")
                    } else {
                        s.add(m)   // a version beside the current one
                    }
                } else if var n = last[v.ino] {
                    // Gone for good elsewhere: the edit comes back as a file of its own.
                    n.nlink = 1
                    let docs = now.containers[n.container].flatMap { policy.documentsIno($0, in: now) } ?? 0
                    place(n, asked: docs, name: Array("Recovered file \(v.ino)".utf8))
                    if placed.contains(v.ino) { s.add(m) } else { dropped.append("version \(v.id) of inode \(v.ino)") }
                } else {
                    dropped.append("version \(v.id) of inode \(v.ino) (the file is gone)")
                }
            case .putNode(let n):
                if published[n.ino] != nil { break }   // with its content, above
                if n.kind != .directory, var cur = s.node(n.ino), unchanged(n.ino) {
                    // Its attributes; its names, link count and content stay as they are now
                    // (the name changes of the batch may be dropped below).
                    cur.mode = n.mode; cur.uid = n.uid; cur.gid = n.gid
                    cur.atime = n.atime; cur.mtime = n.mtime; cur.ctime = max(cur.ctime, n.ctime)
                    s.put(cur)
                } else if !placed.contains(n.ino) {
                    // A folder's own record (times, link count) follows what is placed in it.
                    dropped.append("the attributes of inode \(n.ino)")
                }
            case .putXattr(let x):
                if placed.contains(x.ino) || (s.node(x.ino) != nil && unchanged(x.ino)) { s.add(m) }
                else { dropped.append("extended attribute \(String(decoding: x.name, as: UTF8.self)) of inode \(x.ino)") }
            case .deleteXattr(let ino, let name):
                if s.node(ino) != nil && unchanged(ino) { s.add(m) }
                else { dropped.append("removal of extended attribute \(String(decoding: name, as: UTF8.self)) of inode \(ino)") }
            case .putDirent(let d):
                if let saved = s.node(d.child), saved.kind == .regular, let target = now.children[d.parent]?[d.name],
                   target != d.child, now.nodes.kind(of: target) == .regular, let (from, fromName) = now.firstName(of: d.child),
                   batch.mutations.contains(.deleteDirent(parent: from, name: fromName)), s.node(d.parent)?.kind == .directory {
                    // An atomic save (a temporary file renamed over the original) over a file
                    // another machine changed meanwhile: the saved file goes beside the
                    // original as its conflict copy rather than under its temporary name.
                    let name = conflictCopyName(d.name, device: device, created: saved.mtime) {
                        now.children[d.parent]?[$0] != nil || staged[d.parent]?.contains($0) == true
                    }
                    staged[d.parent, default: []].insert(name)
                    s.add(.deleteDirent(parent: from, name: fromName))
                    s.add(.putDirent(DirentRecord(parent: d.parent, name: name, child: d.child)))
                    pendingInvalidations += [.entry(parent: from, name: fromName), .entry(parent: d.parent, name: name),
                                             .entry(parent: d.parent, name: d.name), .node(from), .node(d.parent)]
                    notes.append("\(String(decoding: d.name, as: UTF8.self)) changed elsewhere while saved here out of reach of the "
                                 + "store; the save is kept beside it as \(String(decoding: name, as: UTF8.self))")
                } else {
                    dropped.append("the name \(String(decoding: d.name, as: UTF8.self)) for inode \(d.child)")
                }
            case .deleteDirent(_, let name): dropped.append("the removal of \(String(decoding: name, as: UTF8.self))")
            case .deleteNode(let ino): dropped.append("the deletion of inode \(ino)")
            case .moveVersions(let from, let to): dropped.append("the move of inode \(from)'s versions to inode \(to)")
            case .deleteVersion(let id): dropped.append("the removal of version \(id)")
            case .setMeta(let key, _), .deleteMeta(let key): dropped.append("the setting \(key)")
            case .putContainer(let c): dropped.append("the registration of \(c.identifier)")
            }
        }
        if !dropped.isEmpty {
            notes.append("made while the store was out of reach and overtaken by another machine's change, so dropped "
                         + "(that change stands): " + dropped.joined(separator: "; "))
        }
        return kept
    }
}
