// `ubiquityfs fsck --repair`: mends what `checkStore` finds, in one commit of the change log,
// and never deletes what a user wrote. What has lost every name (a file or folder no folder
// names, versions whose file is gone) goes to a folder `lost+found` in its container's Recently
// Deleted, from where `ubiquityfs trash restore` brings it back. What only points at nothing
// (a name of a node that does not exist, an attribute of one) is removed; counts and sizes are
// set to what the names and versions say. Missing or damaged chunks cannot be mended here: the
// lines left say which files to restore from an older version.
//
// It works on the store's tables, not on a running model: run it with no daemon on the store.

import Foundation
import UbiquityStore

/// What `repairStore` did, one line each.
public struct StoreRepair: Sendable {
    public var done: [String] = []
}

/// Mends `store` (see the top of this file) as `writer` (a device's name first, as a daemon's).
public func repairStore(_ store: BackingStore, writer: String) throws(StoreError) -> StoreRepair {
    let now = nowNanoseconds()
    let snapshot = try store.metadata.load()
    let versions = try store.metadata.allVersions()
    var repair = StoreRepair()
    var mutations: [Mutation] = []

    let before: [InodeNumber: NodeRecord] = Dictionary(snapshot.nodes.map { ($0.ino, $0) }, uniquingKeysWith: { a, _ in a })
    var nodes = before
    let containers = snapshot.containers.sorted { $0.identifier < $1.identifier }
    let roots = Set(containers.map(\.rootIno))
    var byID: [VersionID: VersionRecord] = [:]
    var byIno: [InodeNumber: [VersionRecord]] = [:]
    for v in versions { byID[v.id] = v; byIno[v.ino, default: []].append(v) }

    // Names that point at nothing, or hang from something that is not a folder, go.
    var dirents: [DirentRecord] = []
    for d in snapshot.dirents {
        let why: String?
        if before[d.parent] == nil { why = "its folder does not exist" }
        else if before[d.parent]?.kind != .directory { why = "inode \(d.parent) is not a folder" }
        else if before[d.child] == nil { why = "it names inode \(d.child), which does not exist" }
        else { why = nil }
        if let why {
            mutations.append(.deleteDirent(parent: d.parent, name: d.name))
            repair.done.append("removed the name \(printableName(d.name)) in folder \(d.parent): \(why)")
        } else {
            dirents.append(d)
        }
    }
    func counts(_ dirents: [DirentRecord]) -> (names: [InodeNumber: UInt32], subfolders: [InodeNumber: UInt32]) {
        var names: [InodeNumber: UInt32] = [:], subfolders: [InodeNumber: UInt32] = [:]
        for d in dirents {
            names[d.child, default: 0] += 1
            if nodes[d.child]?.kind == .directory { subfolders[d.parent, default: 0] += 1 }
        }
        return (names, subfolders)
    }
    let named = counts(dirents)
    let kept = dirents.count   // names added below come after these
    func child(_ parent: InodeNumber, _ name: [UInt8]) -> InodeNumber? {
        dirents.first { $0.parent == parent && $0.name == name }?.child
    }

    // What is lost, by container: nodes with a link count and no name, and the versions of
    // files that are gone (which say nothing of their container: they go to the first one).
    var lost: [String: [NodeRecord]] = [:]
    for n in snapshot.nodes.sorted(by: { $0.ino < $1.ino }) where !roots.contains(n.ino) {
        guard named.names[n.ino] == nil && n.nlink != 0 else { continue }
        if containers.contains(where: { $0.identifier == n.container }) {
            lost[n.container, default: []].append(n)
        } else {
            repair.done.append("left inode \(n.ino): it has no name and belongs to no container (\(n.container))")
        }
    }
    // Versions whose inode is gone do not say their container: the change log does, while it
    // still holds the inode's making; otherwise they go to the first public container.
    let orphanVersions = byIno.keys.filter { before[$0] == nil }.sorted()
    var home: [InodeNumber: String] = [:]
    if !orphanVersions.isEmpty {
        let wanted = Set(orphanVersions)
        for record in (try? store.metadata.changes(since: 0)) ?? [] {
            for case .putNode(let n) in record.mutations where wanted.contains(n.ino) { home[n.ino] = n.container }
        }
        let fallback = (containers.first { $0.isPublic } ?? containers.first)?.identifier
        for gone in orphanVersions {
            if !containers.contains(where: { $0.identifier == home[gone] }) { home[gone] = fallback }
            if let c = home[gone] { lost[c, default: []] += [] }
        }
    }

    // A lost+found folder in the Recently Deleted of each container with something lost (and the
    // Recently Deleted folder itself where it was never made).
    let needed = lost.count * 2 + orphanVersions.count
    var fresh = needed > 0 ? Array(try store.metadata.reserveInodes(needed)) : []
    var trashNames = Set<[UInt8]>()
    for (key, value) in snapshot.meta {
        if let r = TrashRecord(key: key, value: value) { trashNames.insert(r.trashName ?? r.name) }
    }
    let lostName = Array("lost+found".utf8)
    for c in containers {
        guard let items = lost[c.identifier], let root = nodes[c.rootIno] else { continue }
        func folder(_ ino: InodeNumber) -> NodeRecord {
            NodeRecord(ino: ino, container: c.identifier, kind: .directory, mode: 0o700, uid: root.uid, gid: root.gid,
                       nlink: 2, size: 0, atime: now, mtime: now, ctime: now, btime: now)
        }
        let trash: InodeNumber
        if let t = child(c.rootIno, recentlyDeletedName), nodes[t]?.kind == .directory {
            trash = t
        } else {
            trash = fresh.removeFirst()
            nodes[trash] = folder(trash)
            dirents.append(DirentRecord(parent: c.rootIno, name: recentlyDeletedName, child: trash))
        }
        let found = fresh.removeFirst()
        nodes[found] = folder(found)
        dirents.append(DirentRecord(parent: trash, name: Array(String(found).utf8), child: found))
        var chosen = lostName
        var k = 2
        while trashNames.contains(chosen) { chosen = gioUniqueName(lostName, k); k += 1 }
        trashNames.insert(chosen)
        let record = TrashRecord(ino: found, parent: child(c.rootIno, documentsName) ?? c.rootIno, name: lostName,
                                 deleted: now, trashName: chosen, writer: writer)
        mutations.append(.setMeta(key: record.key, value: record.value))
        let shown = "lost+found in \(c.name)'s Recently Deleted (item \(found))"
        for n in items {
            let label = (n.kind == .directory ? "folder-" : "file-") + String(n.ino)
            dirents.append(DirentRecord(parent: found, name: Array(label.utf8), child: n.ino))
            repair.done.append("moved inode \(n.ino), which had no name, to \(shown) as \(label)")
        }
        do {
            for gone in orphanVersions where home[gone] == c.identifier {
                let vs = byIno[gone] ?? []
                guard let newest = vs.max(by: { $0.id < $1.id }) else { continue }
                let ino = fresh.removeFirst()
                nodes[ino] = NodeRecord(ino: ino, container: c.identifier, kind: .regular, mode: 0o600, uid: root.uid,
                                        gid: root.gid, nlink: 1, size: newest.size, atime: now, mtime: newest.created,
                                        ctime: now, btime: newest.created, currentVersion: newest.id)
                for v in vs { byIno[ino, default: []].append(v); byID[v.id]?.ino = ino }
                byIno[gone] = nil
                mutations.append(.moveVersions(from: gone, to: ino))
                let label = "file-\(gone)"
                dirents.append(DirentRecord(parent: found, name: Array(label.utf8), child: ino))
                repair.done.append("gave the \(vs.count) version\(vs.count == 1 ? "" : "s") of inode \(gone), which does not exist, "
                                   + "to a new file in \(shown) as \(label)")
            }
        }
    }
    for d in dirents[kept...] { mutations.append(.putDirent(d)) }

    // Link counts from the names, as they are now; sizes and current versions from the versions.
    let final = counts(dirents)
    for ino in nodes.keys.sorted() {
        guard var n = nodes[ino] else { continue }
        let old = before[ino]
        let names = final.names[ino] ?? 0
        if n.kind == .directory {
            let expected = 2 + (final.subfolders[ino] ?? 0)
            if (names > 0 || roots.contains(ino)) && n.nlink != expected {
                let mine = expected - (named.subfolders[ino] ?? 0) - 2   // the folders put in it here
                if let old, old.nlink + mine != expected {
                    repair.done.append("set the link count of folder \(ino) to \(expected - mine) by its subfolders (it was \(old.nlink))")
                }
                n.nlink = expected
            }
        } else if names > 0 && n.nlink != names {
            if let old, (named.names[ino] ?? 0) > 0 {
                repair.done.append("set the link count of inode \(ino) to \(names), its number of names (it was \(old.nlink))")
            }
            n.nlink = names
        }
        if n.kind == .regular {
            if let id = n.currentVersion, byID[id] == nil {
                if let newest = (byIno[ino] ?? []).max(by: { $0.id < $1.id }) {
                    n.currentVersion = newest.id
                    repair.done.append("made version \(newest.id) the current version of inode \(ino) (its version \(id) does not exist)")
                } else {
                    n.currentVersion = nil
                    repair.done.append("emptied inode \(ino): its current version \(id) does not exist and it has no other")
                }
            }
            if let id = n.currentVersion, let v = byID[id], v.ino == ino, v.size != n.size {
                repair.done.append("set the size of inode \(ino) to \(v.size), its current version's (it was \(n.size))")
                n.size = v.size
            } else if n.currentVersion == nil && n.size != 0 {
                repair.done.append("set the size of inode \(ino) to 0: it has no content (it was \(n.size))")
                n.size = 0
            }
        }
        if n != old {
            if old != nil { n.ctime = max(n.ctime, now) }
            mutations.append(.putNode(n))
        }
    }

    for x in snapshot.xattrs where before[x.ino] == nil {
        mutations.append(.deleteXattr(ino: x.ino, name: x.name))
        repair.done.append("removed the extended attribute \(printableName(x.name)) of inode \(x.ino), which does not exist")
    }

    if !mutations.isEmpty {
        // New nodes before the names that point at them, for stores that look.
        let (puts, rest) = (mutations.filter { if case .putNode = $0 { return true }; return false },
                            mutations.filter { if case .putNode = $0 { return false }; return true })
        _ = try store.metadata.commit(Batch(puts + rest, writer: writer), durable: true)
    }
    return repair
}
