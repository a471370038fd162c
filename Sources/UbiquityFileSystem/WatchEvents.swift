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
    /// A name that went. `was`: what the kernel is told it named, to unlink it once more (its
    /// own id or a stand-in, see `standIn`).
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
    /// Stand-in node ids the kernel is told for a removed name whose own id it must not get
    /// (see `standIn`): far above any id the store hands out, below the desktop trash's.
    static let ghostIDs: Range<UInt64> = (1 << 62)..<(1 << 63)

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

    /// What the kernel is told a name that went named, for the replay to unlink it (`was`: as
    /// it was noted). A file's own id when the kernel holds it already, or when it lives on in
    /// Recently Deleted; a stand-in otherwise: a folder that lives on, because rmdir marks the
    /// kernel's inode dead and the folder may come back under its id (a restore) while the
    /// kernel still holds that inode (a shell's working folder), so that it would list as
    /// empty and take no new file; and a node without a name, whose id the kernel would
    /// forget again at once, which here means deleting what another writer may still have
    /// open. Caller holds commits.
    private func standIn(for was: Attributes) -> Attributes {
        var a = was
        if let n = state.nodes[was.ino] {
            a = attributes(n, doc: docsLock.withLock { docs[n.ino] })
            if n.kind != .directory && (kernelHolds(n.ino) || n.nlink > 0) { return a }
        }
        ghostCount += 1
        a.ino = Self.ghostIDs.lowerBound + ghostCount
        return a
    }

    /// The replays for what `pending` noted, against the namespace as it is now, kept to
    /// folders the kernel holds. Caller holds commits.
    func watchEvents(_ pending: [PendingWatch]) -> [WatchEvent] {
        guard !pending.isEmpty else { return [] }
        var paths: [InodeNumber: [UInt8]?] = [:]
        func path(_ dir: InodeNumber) -> [UInt8]? { viewPath(of: dir, memo: &paths) }
        func viewName(_ parent: InodeNumber, _ name: [UInt8]) -> ViewName? {
            guard Self.isPlainName(name), let p = path(parent) else { return nil }
            return ViewName(parent: parent, name: name, path: p.isEmpty ? name : p + [0x2f] + name)
        }
        /// What the name names now, if this view shows it.
        func current(_ parent: InodeNumber, _ name: [UInt8]) -> Attributes? {
            guard let ino = state.children[parent]?[name], let n = state.nodes[ino], policy.visible(n, in: state) else { return nil }
            return attributes(n, doc: docsLock.withLock { docs[ino] })
        }
        // A changed file is replayed once a round (new content if any of its changes had
        // some), by the name the kernel holds it by.
        var changed: [InodeNumber: Bool] = [:]
        for case .changed(let ino, let content) in pending { changed[ino] = (changed[ino] ?? false) || content }
        var out: [WatchEvent] = []
        // Names this round's replays give the kernel, which a change to the same file goes by.
        var named: [InodeNumber: KernelName] = [:]
        for w in pending {
            switch w {
            case .created(let parent, let name):
                guard kernelHolds(parent), let node = current(parent, name), let v = viewName(parent, name) else { continue }
                out.append(.created(v, node: node))
                named[node.ino] = KernelName(parent: parent, name: name)
            case .removed(let parent, let name, let was):
                guard kernelHolds(parent), let v = viewName(parent, name) else { continue }
                out.append(.removed(v, was: standIn(for: was)))
            case .moved(let from, let to, let replaced):
                guard kernelHolds(from.0) || kernelHolds(to.0) else { continue }
                let node = current(to.0, to.1)
                switch (viewName(from.0, from.1), node.flatMap { _ in viewName(to.0, to.1) }) {
                case (let f?, let t?):
                    out.append(.moved(from: f, to: t, node: node!, replaced: replaced.map { standIn(for: $0) }))
                    named[node!.ino] = KernelName(parent: to.0, name: to.1)
                case (nil, let t?) where kernelHolds(to.0):
                    out.append(.created(t, node: node!))
                    named[node!.ino] = KernelName(parent: to.0, name: to.1)
                case (let f?, nil) where kernelHolds(from.0):
                    // Out of this view: into Recently Deleted (a removal, as a local one is) or
                    // into what only the app view shows.
                    guard let ino = state.children[to.0]?[to.1], let was = watchAttributes(of: ino) else { continue }
                    out.append(.removed(f, was: standIn(for: was)))
                default: break
                }
            case .changed(let ino, _):
                guard let content = changed.removeValue(forKey: ino), let k = named[ino] ?? kernelName(of: ino),
                      state.children[k.parent]?[k.name] == ino, let node = current(k.parent, k.name),
                      let v = viewName(k.parent, k.name) else { continue }
                out.append(.changed(v, node: node, content: content))
            }
        }
        return out
    }

    /// A name a path may carry as one component. Another writer's names were checked when it
    /// made them; a damaged or hostile store must still never lead a replay out of the mount.
    static func isPlainName(_ name: [UInt8]) -> Bool {
        !name.isEmpty && name != [0x2e] && name != [0x2e, 0x2e] && !name.contains(0x2f) && !name.contains(0)
    }

    /// The path of folder `dir` from the mount root in this view ([] for the root), or nil if
    /// the view does not show it (Recently Deleted, a folder past the container's levels).
    /// `memo` keeps the folders' paths found on the way, for the other events of the round.
    func viewPath(of dir: InodeNumber, memo: inout [InodeNumber: [UInt8]?]) -> [UInt8]? {
        if dir == Self.rootID { return [] }
        if let known = memo[dir] { return known }
        // Folders have one name, and a cycle is impossible; the walk still stops on a damaged store.
        var chain: [InodeNumber] = []
        var at = dir
        var found: [UInt8]??
        while found == nil {
            if let known = memo[at] { found = .some(known); break }
            guard chain.count < 4096, let n = state.nodes[at], n.kind == .directory, let c = state.containers[n.container],
                  policy.isShown(c), let top = policy.containerFolderIno(c, in: state), policy.visible(n, in: state) else {
                found = .some(nil)
                break
            }
            chain.append(at)
            if at == top {
                let name = policy.containerFolderName(c)
                found = .some(Self.isPlainName(name) ? [] : nil)
                break
            }
            guard let p = state.parent[at] else { found = .some(nil); break }
            at = p
        }
        // Down the chain again: each folder's path is its parent's and its name.
        var path = found!
        for (i, folder) in chain.enumerated().reversed() {
            if let base = path {
                let n = state.nodes[folder]!
                let c = state.containers[n.container]!
                if i == chain.count - 1 && folder == policy.containerFolderIno(c, in: state) {
                    path = base + policy.containerFolderName(c)
                } else if let p = state.parent[folder],
                          let name = state.children[p]?.name(of: folder), Self.isPlainName(name) {
                    path = base.isEmpty ? name : base + [0x2f] + name
                } else {
                    path = nil
                }
            }
            memo[folder] = path
        }
        return path
    }
}

private extension UInt64 {
    var bytes: [UInt8] { withUnsafeBytes(of: self) { Array($0) } }
}
