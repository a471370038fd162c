// Programs that watch the mount (a file manager's folder view, an editor, `tail -f`) learn of
// changes through inotify, and the kernel raises inotify events only for changes made through
// it: what another writer changed reaches this mount as cache invalidations, which raise none.
// So the change feed replays each such change through the mount as the operation a local
// program would have made (a mknod for a new file, an unlink, a rename, a truncate to the same
// size for new content), and the FUSE bridge answers its own replays from what the namespace
// already holds, changing nothing. Only changes in folders the kernel holds are replayed:
// nothing can be watching the others.

import Foundation
import UbiquityStore

/// A name in this view: the folder's node, the name in it, and its path from the mount root.
public struct ViewName: Sendable, Hashable {
    public let parent: UInt64
    public let name: [UInt8]
    /// Relative to the mount root, components joined by "/".
    public let path: [UInt8]
    public init(parent: UInt64, name: [UInt8], path: [UInt8]) {
        self.parent = parent
        self.name = name
        self.path = path
    }
}

/// Another writer's change as a program watching this mount would have seen it made here.
public enum WatchEvent: Sendable, Equatable {
    /// A new name for what `node` is.
    case created(ViewName, node: Attributes)
    /// A name that went. `was`: what the kernel is told it named, to unlink it once more (for a
    /// folder that moved out of the view, a stand-in id: see `ghostIDs`).
    case removed(ViewName, was: Attributes)
    /// A name that moved; `replaced`: what the new name named before, if anything.
    case moved(from: ViewName, to: ViewName, node: Attributes, replaced: Attributes?)
    /// New content (`content`) or new attributes only (mode, owner, times, extended
    /// attributes) of what the name names.
    case changed(ViewName, node: Attributes, content: Bool)
}

/// A change noted while a batch is applied, before the paths are known (a later batch of the
/// same round may move the folder).
enum PendingWatch {
    case created(parent: InodeNumber, name: [UInt8])
    case removed(parent: InodeNumber, name: [UInt8], was: Attributes)
    case moved(from: (InodeNumber, [UInt8]), to: (InodeNumber, [UInt8]), replaced: Attributes?)
    case changed(InodeNumber, content: Bool)
}

extension UbiquityFileSystem {
    /// Node ids the kernel is told for a folder that moved out of this view (into a container's
    /// private part, through the app view): rmdir marks the kernel's inode dead, and the folder
    /// lives on, so it may come back under its id while the kernel still holds that inode (a
    /// shell's working folder). A folder moved into Recently Deleted is removed under its own
    /// id, as a local rm -r removes it. Far above any id the store hands out.
    static let ghostIDs: ClosedRange<UInt64> = (1 << 62)...UInt64.max

    /// What `mutations` (another writer's batch, not yet applied) change for watchers, noted
    /// against the namespace as it is before them. Caller holds commits and ns (write).
    func watches(before mutations: [Mutation]) -> [PendingWatch] {
        var removals: [(parent: InodeNumber, name: [UInt8], child: InodeNumber)] = []
        var names: [(d: DirentRecord, replaced: InodeNumber?)] = []
        var touched: [(ino: InodeNumber, content: Bool)] = []
        for m in mutations {
            switch m {
            case .deleteDirent(let p, let name):
                if let old = state.children[p]?[name] { removals.append((p, name, old)) }
            case .putDirent(let d):
                let old = state.children[d.parent]?[d.name]
                if old != d.child { names.append((d, old)) }
            case .putNode(let n):
                // A new node is a new name's; a folder's own times change with its entries.
                if let before = state.nodes[n.ino], before.kind != .directory, before != n {
                    touched.append((n.ino, before.currentVersion != n.currentVersion || before.size != n.size))
                }
            case .putXattr(let x):
                if state.nodes[x.ino] != nil { touched.append((x.ino, false)) }
            case .deleteXattr(let ino, _):
                if state.nodes[ino] != nil { touched.append((ino, false)) }
            default: break
            }
        }
        var out: [PendingWatch] = []
        var moved: Set<InodeNumber> = []
        var replacedNames: Set<[UInt8]> = []
        for (d, replaced) in names {
            let was = replaced.flatMap { watchAttributes(of: $0) }
            if let i = removals.firstIndex(where: { $0.child == d.child }) {
                let from = removals.remove(at: i)
                out.append(.moved(from: (from.parent, from.name), to: (d.parent, d.name), replaced: was))
            } else {
                out.append(.created(parent: d.parent, name: d.name))
            }
            moved.insert(d.child)
            if replaced != nil { replacedNames.insert(Array(d.parent.bytes) + d.name) }
        }
        for r in removals where !replacedNames.contains(Array(r.parent.bytes) + r.name) {
            guard let was = watchAttributes(of: r.child) else { continue }
            out.append(.removed(parent: r.parent, name: r.name, was: was))
        }
        for t in touched where !moved.contains(t.ino) { out.append(.changed(t.ino, content: t.content)) }
        return out
    }

    private func watchAttributes(of ino: InodeNumber) -> Attributes? {
        guard let n = state.nodes[ino] else { return nil }
        return attributes(n, doc: docsLock.withLock { docs[ino] })
    }

    /// Caller holds commits.
    private func nextGhostID() -> UInt64 {
        ghostCount += 1
        return Self.ghostIDs.lowerBound + ghostCount
    }

    /// The replays for what `pending` noted, against the namespace as it is now, kept to
    /// folders the kernel holds. Caller holds commits.
    func watchEvents(_ pending: [PendingWatch]) -> [WatchEvent] {
        guard !pending.isEmpty else { return [] }
        var paths: [InodeNumber: [UInt8]?] = [:]
        func path(_ dir: InodeNumber) -> [UInt8]? {
            if let p = paths[dir] { return p }
            let p = viewPath(of: dir)
            paths[dir] = p
            return p
        }
        func viewName(_ parent: InodeNumber, _ name: [UInt8]) -> ViewName? {
            guard let p = path(parent) else { return nil }
            return ViewName(parent: parent, name: name, path: p.isEmpty ? name : p + [0x2f] + name)
        }
        func current(_ parent: InodeNumber, _ name: [UInt8]) -> Attributes? {
            guard let ino = state.children[parent]?[name], let n = state.nodes[ino] else { return nil }
            return attributes(n, doc: docsLock.withLock { docs[ino] })
        }
        // A changed file is replayed once a round (new content if any of its changes had
        // some), by one of its names in a folder the kernel holds.
        var changed: [InodeNumber: Bool] = [:]
        for case .changed(let ino, let content) in pending { changed[ino] = (changed[ino] ?? false) || content }
        var changedNames: [InodeNumber: (InodeNumber, [UInt8])] = [:]
        if !changed.isEmpty {
            for dir in kernelHeldFolders() {
                for (name, child) in state.children[dir] ?? [:] where changed[child] != nil && changedNames[child] == nil {
                    changedNames[child] = (dir, name)
                }
            }
        }
        var out: [WatchEvent] = []
        for w in pending {
            switch w {
            case .created(let parent, let name):
                guard kernelHolds(parent), let node = current(parent, name), let v = viewName(parent, name) else { continue }
                out.append(.created(v, node: node))
            case .removed(let parent, let name, let was):
                guard kernelHolds(parent), let v = viewName(parent, name) else { continue }
                out.append(.removed(v, was: was))
            case .moved(let from, let to, let replaced):
                guard kernelHolds(from.0) || kernelHolds(to.0), let node = current(to.0, to.1) else { continue }
                switch (viewName(from.0, from.1), viewName(to.0, to.1)) {
                case (let f?, let t?): out.append(.moved(from: f, to: t, node: node, replaced: replaced))
                case (nil, let t?) where kernelHolds(to.0): out.append(.created(t, node: node))
                case (let f?, nil) where kernelHolds(from.0):
                    // Into Recently Deleted is a removal, as a local one is; elsewhere, a stand-in.
                    var was = node
                    if was.kind == .directory && state.trashed[was.ino] == nil { was.ino = nextGhostID() }
                    out.append(.removed(f, was: was))
                default: break
                }
            case .changed(let ino, _):
                guard let content = changed.removeValue(forKey: ino), let (parent, name) = changedNames[ino],
                      let node = current(parent, name), let v = viewName(parent, name) else { continue }
                out.append(.changed(v, node: node, content: content))
            }
        }
        return out
    }

    /// The path of folder `dir` from the mount root in this view ([] for the root), or nil if
    /// the view does not show it.
    func viewPath(of dir: InodeNumber) -> [UInt8]? {
        if dir == Self.rootID { return [] }
        guard let n = state.nodes[dir], n.kind == .directory, let c = state.containers[n.container],
              policy.isShown(c), let top = policy.containerFolderIno(c, in: state) else { return nil }
        var parts: [[UInt8]] = []
        var at = dir
        while at != top {
            // Folders have one name; a cycle is impossible, but never loop on a damaged store.
            guard parts.count < 4096, let p = state.parent[at],
                  let name = state.children[p]?.first(where: { $0.value == at })?.key else { return nil }
            parts.append(name)
            at = p
        }
        parts.append(policy.containerFolderName(c))
        return Array(parts.reversed().joined(separator: [0x2f]))
    }
}

private extension UInt64 {
    var bytes: [UInt8] { withUnsafeBytes(of: self) { Array($0) } }
}
