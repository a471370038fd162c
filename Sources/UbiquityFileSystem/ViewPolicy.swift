// What one view of the store shows and allows, as a pure value: which containers appear at the
// mount root and under which folder names, which node ids resolve, how deep folders may go. It
// owns no state beyond the view and the active registrations and takes the namespace to read as
// an argument, so its rules are the same whichever lock the caller holds (`ns` to read, or
// `commits` while staging a change).

import Foundation
import UbiquityStore

struct ViewPolicy: Sendable {
    let view: View
    /// Active registrations by container identifier (inactive ones are not shown).
    let active: [String: ContainerInfo]

    enum Target {
        case root
        case node(NodeRecord)
    }

    /// What a kernel node id names in this view.
    func target(_ ino: UInt64, in ns: Namespace) throws -> Target {
        if ino == UbiquityFileSystem.rootID { return .root }
        guard let n = ns.nodes[ino], let c = ns.containers[n.container], isShown(c) else {
            throw FSError.noEntry("no node \(ino)")
        }
        // The drive view reaches only what is inside Documents. The kernel asks only about ids
        // this view gave it, so the check is for folders: another view may move a folder the
        // kernel knows out of Documents. A removed folder has no path at all but may still be a
        // process's working folder.
        if case .drive = view, n.kind == .directory, n.nlink > 0, depth(of: n.ino, in: c, ns) == nil, !ns.isInTrash(n.ino) {
            throw FSError.noEntry("node \(ino) is outside Documents")
        }
        return .node(n)
    }

    func isShown(_ c: ContainerRecord) -> Bool {
        guard active[c.identifier] != nil else { return false }
        switch view {
        case .drive: return c.isPublic
        case .app(let bundle): return c.bundleIdentifier == bundle
        }
    }

    func shownContainers(in ns: Namespace) -> [ContainerRecord] {
        ns.containers.values.filter(isShown).sorted { $0.identifier < $1.identifier }
    }

    func containerFolderName(_ c: ContainerRecord) -> [UInt8] {
        switch view {
        case .drive: return Array(c.name.utf8)
        case .app: return Array(c.identifier.utf8)
        }
    }

    /// The node a container's folder at the mount root shows: Documents in the drive view (as
    /// Finder shows iCloud Drive), the whole container in the app view.
    func containerFolderIno(_ c: ContainerRecord, in ns: Namespace) -> InodeNumber? {
        switch view {
        case .drive: return documentsIno(c, in: ns)
        case .app: return c.rootIno
        }
    }

    func documentsIno(_ c: ContainerRecord, in ns: Namespace) -> InodeNumber? {
        ns.children[c.rootIno]?[documentsName]
    }

    /// Folder depth below Documents (Documents = 0), or nil if `dir` is not inside Documents.
    func depth(of dir: InodeNumber, in c: ContainerRecord, _ ns: Namespace) -> Int? {
        guard let docs = ns.children[c.rootIno]?[documentsName] else { return nil }
        var d = 0
        var cur = dir
        while cur != docs {
            guard let p = ns.parent[cur] else { return nil }
            cur = p
            d += 1
        }
        return d
    }

    /// Levels of folders below `dir` (0 if it holds no folder).
    func height(of dir: InodeNumber, in ns: Namespace) -> Int {
        var best = 0
        for child in (ns.children[dir] ?? [:]).values where ns.nodes.kind(of: child) == .directory {
            best = max(best, 1 + height(of: child, in: ns))
        }
        return best
    }

    /// In the drive view, folders deeper than the container's level limit are not shown.
    func visible(_ n: NodeRecord, in ns: Namespace) -> Bool {
        // Recently Deleted (a folder in the container's root) is the store's, never a view's.
        if n.kind == .directory, let root = ns.containers[n.container]?.rootIno,
           ns.children[root]?[recentlyDeletedName] == n.ino { return false }
        guard case .drive = view, n.kind == .directory, let c = ns.containers[n.container],
              let limit = active[c.identifier]?.maxDepth else { return true }
        // A tree in Recently Deleted shows whole through the desktop's trash.
        guard let d = depth(of: n.ino, in: c, ns) else { return ns.isInTrash(n.ino) }
        return d <= limit
    }

    /// Drive view: moving a folder tree must not put any of it past the container's level limit.
    func checkLevels(moving n: NodeRecord, into dir: NodeRecord, in ns: Namespace) throws {
        guard case .drive = view, n.kind == .directory, let c = ns.containers[dir.container],
              let limit = active[c.identifier]?.maxDepth else { return }
        guard let d = depth(of: dir.ino, in: c, ns) else { throw FSError(EPERM, "outside Documents") }
        // Staying at its depth or moving up puts nothing deeper than it already is (a tree may
        // hold folders the app made past the limit).
        if let from = ns.parent[n.ino], let old = depth(of: from, in: c, ns), d <= old { return }
        if d + 1 + height(of: n.ino, in: ns) > limit {
            throw FSError(EPERM, "\(c.name) allows \(levelsWord(limit)) folder level(s)")
        }
    }

    /// A name a folder entry may have.
    static func check(name: [UInt8]) throws {
        if name.count > nameMax { throw FSError(ENAMETOOLONG, "name longer than \(nameMax) bytes") }
        if name.isEmpty || name == [0x2e] || name == [0x2e, 0x2e] || name.contains(0x2f) || name.contains(0) {
            throw FSError(EINVAL, "invalid name")
        }
    }
}
