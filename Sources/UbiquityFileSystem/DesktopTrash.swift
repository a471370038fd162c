// The desktop's trash is Recently Deleted. GIO (Nautilus, PCManFM, Thunar, `gio trash`) trashes
// a file on a mount by finding `$topdir/.Trash-$UID`, making `files/` and `info/` in it, claiming
// `info/NAME.trashinfo` with an exclusive create, renaming the file to `files/NAME` and writing
// the info file (a temporary file renamed over it). The drive view's root offers that folder to
// the store's user, made of nothing but Recently Deleted:
// - `files/` lists every Recently Deleted item of every shown container under a trash name (the
//   name GIO gave it, else its own; `name.2.ext`, … when two are alike); a rename into it from
//   any container is a move to Recently Deleted (never EXDEV), a rename out of it a restore,
//   and deleting in it deletes for good;
// - `info/` lists a true `.trashinfo` for each item (`Path=` relative to the mount,
//   `DeletionDate=`), computed, plus the files GIO makes there, kept in memory until it
//   renames or deletes them.
// Every other name at the root stays refused. Nodes here have numbers of their own, above every
// store inode number.

import Foundation
import UbiquityStore

enum TrashNode: Hashable, Sendable {
    /// `expunged/` is where GVfs's trash moves an item to delete it for good: a move there is
    /// that delete, and it is always empty.
    case top, files, info, expunged
    /// The `.trashinfo` of a Recently Deleted item.
    case infoFile(InodeNumber)
    /// A file GIO made in `info/` (its exclusive claim, or the temporary file of its write).
    case placeholder(UInt64)

    static let base: UInt64 = 0xFFF0_0000_0000_0000
    private static let infoBit: UInt64 = 1 << 48
    private static let placeholderBit: UInt64 = 2 << 48
    private static let low: UInt64 = (1 << 48) - 1

    var ino: UInt64 {
        switch self {
        case .top: return Self.base + 1
        case .files: return Self.base + 2
        case .info: return Self.base + 3
        case .expunged: return Self.base + 4
        case .infoFile(let i): return Self.base | Self.infoBit | (i & Self.low)
        case .placeholder(let id): return Self.base | Self.placeholderBit | (id & Self.low)
        }
    }

    init?(ino: UInt64) {
        guard ino & Self.base == Self.base else { return nil }
        switch ino & ~Self.low {
        case Self.base:
            switch ino {
            case Self.base + 1: self = .top
            case Self.base + 2: self = .files
            case Self.base + 3: self = .info
            case Self.base + 4: self = .expunged
            default: return nil
            }
        case Self.base | Self.infoBit: self = .infoFile(ino & Self.low)
        case Self.base | Self.placeholderBit: self = .placeholder(ino & Self.low)
        default: return nil
        }
    }
}

/// What GIO wrote in `info/`: name, bytes, time; per daemon, in memory (the info that counts is
/// computed from Recently Deleted).
final class TrashPlaceholders: @unchecked Sendable {
    /// `alias`: the item whose info this file now stands for (it was renamed over that info, or
    /// was GIO's claim of it). The kernel may hold the name bound to this file's number, so it
    /// stays, serving the computed info, until the item leaves.
    struct File { var name: [UInt8]; var bytes: [UInt8]; var mtime: Int64; var alias: InodeNumber? = nil }
    private let lock = Lock()
    private var files: [UInt64: File] = [:]
    private var next: UInt64 = 1
    private var changed: Int64 = 0
    /// When a file here was last made, renamed or removed (info/'s mtime).
    var changedAt: Int64 { lock.withLock { changed } }

    func add(_ name: [UInt8]) -> UInt64 {
        lock.withLock {
            changed = nowNanoseconds()
            defer { next += 1 }
            files[next] = File(name: name, bytes: [], mtime: nowNanoseconds())
            return next
        }
    }
    func get(_ id: UInt64) -> File? { lock.withLock { files[id] } }
    func id(named name: [UInt8]) -> UInt64? { lock.withLock { files.first { $0.value.name == name }?.key } }
    func all() -> [(UInt64, File)] { lock.withLock { files.map { ($0.key, $0.value) } } }
    func remove(_ id: UInt64) { lock.withLock { changed = nowNanoseconds(); _ = files.removeValue(forKey: id) } }
    func rename(_ id: UInt64, to name: [UInt8], alias: InodeNumber? = nil) {
        lock.withLock {
            changed = nowNanoseconds()
            for (other, f) in files where f.name == name && other != id { files[other] = nil }
            files[id]?.name = name
            if let alias { files[id]?.alias = alias }
        }
    }
    /// Forget files standing for the info of items no longer in the trash.
    func dropAliases(keeping items: Set<InodeNumber>) {
        lock.withLock { files = files.filter { $0.value.alias.map(items.contains) ?? true } }
    }
    func update(_ id: UInt64, _ change: (inout File) -> Void) { lock.withLock { if files[id] != nil { change(&files[id]!) } } }

    /// Info names of items that just left the trash through it (restored, or deleted for good):
    /// the file manager deletes the info file next, and that must not fail.
    private var left: [[UInt8]: UInt64] = [:]
    private var leftPruned: UInt64 = 0
    func noteLeft(_ name: [UInt8]) {
        let now = monotonicNanoseconds()
        lock.withLock {
            // Pruned once a second, not at each call: GIO empties a trash item by item.
            if now &- leftPruned >= 1_000_000_000 {
                left = left.filter { now &- $0.value < 60_000_000_000 }
                leftPruned = now
            }
            left[name] = now
        }
    }
    func takeLeft(_ name: [UInt8]) -> Bool { lock.withLock { left.removeValue(forKey: name) != nil } }
}

struct TrashNames: Sendable {
    var byName: [[UInt8]: InodeNumber] = [:]
    var byIno: [InodeNumber: [UInt8]] = [:]
    /// Every item by name, for the listings of `files/` and `info/`.
    var sorted: [(name: [UInt8], ino: InodeNumber, kind: NodeKind)] = []
    /// The next number to try for each wanted name that is taken (GIO's `name.N.ext`).
    var next: [[UInt8]: Int] = [:]

    /// Give item `ino` the name it wants, or the first free `name.N.ext` after it; `sorting`:
    /// put it in `sorted` too (else the caller sorts once at the end).
    mutating func add(_ ino: InodeNumber, wanting wanted: [UInt8], kind: NodeKind, sorting: Bool = true) {
        var name = wanted
        var n = next[wanted] ?? 2
        while byName[name] != nil { name = gioUniqueName(wanted, n); n += 1 }
        next[wanted] = n
        byName[name] = ino
        byIno[ino] = name
        if sorting { sorted.insert((name, ino, kind), at: position(of: name)) } else { sorted.append((name, ino, kind)) }
    }

    mutating func remove(_ ino: InodeNumber) {
        guard let name = byIno.removeValue(forKey: ino) else { return }
        byName[name] = nil
        let i = position(of: name)
        if i < sorted.count, sorted[i].ino == ino { sorted.remove(at: i) }
    }

    /// Where `name` is in `sorted`, or would go.
    private func position(of name: [UInt8]) -> Int {
        var low = 0, high = sorted.count
        while low < high {
            let mid = (low + high) / 2
            if sorted[mid].name.lexicographicallyPrecedes(name) { low = mid + 1 } else { high = mid }
        }
        return low
    }
}

/// The desktop trash's names as of the namespace's trash edits it has followed.
final class TrashNameCache: @unchecked Sendable {
    let lock = Lock()
    // Guarded by lock.
    var epoch: UInt64?
    var applied = 0
    var names = TrashNames()
    /// Whether two items wanted one name when `names` were worked out (some may be `name.N`).
    var uniquified = false
    /// How many times the names were worked out from scratch (for tests).
    var rebuilds = 0
}

extension UbiquityFileSystem {
    /// `.Trash-<uid>` of the store's user (the daemon's).
    var desktopTrashName: [UInt8] { Array(".Trash-\(ownerUID)".utf8) }
    private static let filesName = Array("files".utf8)
    private static let infoName = Array("info".utf8)
    private static let expungedName = Array("expunged".utf8)
    private static let infoSuffix = Array(".trashinfo".utf8)

    /// Whether this view has the desktop trash (the drive view does).
    var offersDesktopTrash: Bool { if case .drive = view { return true } else { return false } }

    func trashNode(_ ino: UInt64) -> TrashNode? {
        guard offersDesktopTrash else { return nil }
        return TrashNode(ino: ino)
    }

    /// Trash names of the Recently Deleted items of shown containers: the one GIO gave, else the
    /// item's own name; `name.2.ext`, `name.3.ext`, … (GIO's rule) for later alike ones, in
    /// deletion order. While no two items want one name (the usual case: a delete picks a free
    /// one), each name is the wanted one, and the names follow the namespace's trash edits one
    /// by one; else they are worked out whole at each change. Caller holds ns.
    func trashNames() -> TrashNames {
        trashNameCache.lock.withLock {
            let c = trashNameCache
            if c.epoch != state.trashEpoch || c.applied > state.trashEdits.count
                || (c.applied < state.trashEdits.count && (state.trashNameCollisions > 0 || c.uniquified)) {
                var names = TrashNames()
                let items = state.trashed.values.filter(isShownInTrash).sorted { ($0.deleted, $0.ino) < ($1.deleted, $1.ino) }
                for r in items {
                    names.add(r.ino, wanting: r.trashName ?? r.name, kind: state.nodes.kind(of: r.ino) ?? .regular, sorting: false)
                }
                names.sorted.sort { $0.name.lexicographicallyPrecedes($1.name) }
                c.names = names
                c.uniquified = state.trashNameCollisions > 0
                c.rebuilds += 1
                c.epoch = state.trashEpoch
                c.applied = state.trashEdits.count
            }
            if c.applied < state.trashEdits.count {
                // Every edited item out first, then back as it is now: an item that left frees
                // its name before one that came meanwhile wanting it is named.
                let edited = state.trashEdits[c.applied...]
                c.applied = state.trashEdits.count
                for ino in edited { c.names.remove(ino) }
                var added = Set<InodeNumber>()
                for ino in edited where added.insert(ino).inserted {
                    if let r = state.trashed[ino], isShownInTrash(r) {
                        c.names.add(ino, wanting: r.trashName ?? r.name, kind: state.nodes.kind(of: ino) ?? .regular)
                    }
                }
            }
            return c.names
        }
    }

    /// Whether Recently Deleted item `r` is in a shown container. Caller holds ns.
    private func isShownInTrash(_ r: TrashRecord) -> Bool {
        state.nodes[r.ino].flatMap { state.containers[$0.container] }.map(policy.isShown) ?? false
    }

    /// What a `.trashinfo` path keeps as it is (the rest is percent-encoded).
    private static let infoPathCharacters: CharacterSet = {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~/")
        return allowed
    }()

    /// The `.trashinfo` text of item `r`. Caller holds ns.
    func trashInfo(_ r: TrashRecord) -> [UInt8] {
        // Local time, as GIO writes it. Not a DateFormatter: a listing of info/ sizes every item.
        var seconds = time_t(r.deleted / 1_000_000_000)
        var t = tm()
        localtime_r(&seconds, &t)
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
        let when = "\(t.tm_year + 1900)-\(two(t.tm_mon + 1))-\(two(t.tm_mday))T\(two(t.tm_hour)):\(two(t.tm_min)):\(two(t.tm_sec))"
        let path = trashOriginalPath(r).addingPercentEncoding(withAllowedCharacters: Self.infoPathCharacters) ?? ""
        return Array("[Trash Info]\nPath=\(path)\nDeletionDate=\(when)\n".utf8)
    }

    /// The Recently Deleted items `mutations` put in or take out, with their records before
    /// (nil: not yet in). Caller holds ns.
    func trashedItems(touchedBy mutations: [Mutation]) -> [InodeNumber: TrashRecord?] {
        guard offersDesktopTrash else { return [:] }
        var out: [InodeNumber: TrashRecord?] = [:]
        for m in mutations {
            let key: String
            switch m {
            case .setMeta(let k, _): key = k
            case .deleteMeta(let k): key = k
            default: continue
            }
            guard key.hasPrefix(TrashRecord.prefix), let ino = InodeNumber(key.dropFirst(TrashRecord.prefix.count)),
                  out[ino] == nil else { continue }
            out[ino] = .some(state.trashed[ino])
        }
        return out
    }

    /// What the kernel may hold of the desktop trash that changed with these items (deleted or
    /// restored anywhere: a plain `rm`, the CLI, another device): the folders' attributes and
    /// listings, and the items' names before and after. Caller holds ns, after the change.
    func trashInvalidations(before: [InodeNumber: TrashRecord?]) -> [KernelInvalidation] {
        trashInvalidations(of: before.flatMap { ino, old in [old, state.trashed[ino]].compactMap { $0 } })
    }

    /// The same for records that came or went (before or after the change). When several items
    /// want one name, the listing numbers all but the first (`name.2.ext`, …), so the numbered
    /// names shift too. Caller holds ns.
    func trashInvalidations(of records: [TrashRecord]) -> [KernelInvalidation] {
        var out: [KernelInvalidation] = [.node(TrashNode.files.ino), .node(TrashNode.info.ino)]
        for r in records {
            let wanted = r.trashName ?? r.name
            let alike = state.trashNameCounts[wanted] ?? 0
            for name in [wanted] + (alike > 0 ? (2...(alike + 1)).map { gioUniqueName(wanted, $0) } : []) {
                out.append(.entry(parent: TrashNode.files.ino, name: name))
                out.append(.entry(parent: TrashNode.info.ino, name: name + Self.infoSuffix))
            }
            out.append(.node(TrashNode.infoFile(r.ino).ino))
        }
        return out
    }

    func trashAttributes(_ node: TrashNode) throws -> Attributes {
        func dir(_ ino: UInt64, links: UInt32, changed: Int64 = 0) -> Attributes {
            let t = max(mountTime, changed)
            return Attributes(ino: ino, mode: UInt32(S_IFDIR) | 0o700, nlink: links, uid: ownerUID, gid: ownerGID, size: 4096,
                              blocks: 8, atime: t, mtime: t, ctime: t, rdev: 0)
        }
        func file(_ ino: UInt64, _ bytes: Int, _ mtime: Int64) -> Attributes {
            Attributes(ino: ino, mode: UInt32(S_IFREG) | 0o600, nlink: 1, uid: ownerUID, gid: ownerGID, size: UInt64(bytes),
                       blocks: UInt64(bytes + 511) / 512, atime: mtime, mtime: mtime, ctime: mtime, rdev: 0)
        }
        switch node {
        case .top: return dir(node.ino, links: 5)
        // GVfs lists files/ again only when its mtime moved.
        case .files: return dir(node.ino, links: 2, changed: ns.read { state.trashChangedAt })
        case .info: return dir(node.ino, links: 2, changed: max(ns.read { state.trashChangedAt }, trashPlaceholders.changedAt))
        case .expunged: return dir(node.ino, links: 2)
        case .infoFile(let i):
            return try ns.read {
                guard let r = state.trashed[i] else { throw FSError.noEntry("no longer in the trash") }
                return file(node.ino, trashInfo(r).count, r.deleted)
            }
        case .placeholder(let id):
            guard let p = trashPlaceholders.get(id) else { throw FSError.noEntry("no such file") }
            if let item = p.alias {
                let a = try trashAttributes(.infoFile(item))
                return file(node.ino, Int(a.size), a.mtime)
            }
            return file(node.ino, p.bytes.count, p.mtime)
        }
    }

    /// lookup of `name` in trash folder `dir`.
    func trashLookup(_ dir: TrashNode, _ name: [UInt8]) throws -> Attributes {
        if name == [0x2e] { return try trashAttributes(dir) }
        switch dir {
        case .top:
            if name == [0x2e, 0x2e] { return try getattr(Self.rootID) }
            if name == Self.filesName { return try trashAttributes(.files) }
            if name == Self.infoName { return try trashAttributes(.info) }
            if name == Self.expungedName { return try trashAttributes(.expunged) }
            throw FSError.noEntry()
        case .files:
            if name == [0x2e, 0x2e] { return try trashAttributes(.top) }
            guard let ino = ns.read({ trashNames().byName[name] }) else { throw FSError.noEntry() }
            return try getattr(ino)
        case .expunged:
            if name == [0x2e, 0x2e] { return try trashAttributes(.top) }
            throw FSError.noEntry()
        case .info:
            if name == [0x2e, 0x2e] { return try trashAttributes(.top) }
            if let id = trashPlaceholders.id(named: name) { return try trashAttributes(.placeholder(id)) }
            guard let ino = infoItem(named: name) else { throw FSError.noEntry() }
            return try trashAttributes(.infoFile(ino))
        default:
            throw FSError.notDir()
        }
    }

    /// Whether `name` is the `.trashinfo` of an item of `names`.
    private func isInfoName(_ name: [UInt8], in names: TrashNames) -> Bool {
        name.count > Self.infoSuffix.count && name.suffix(Self.infoSuffix.count).elementsEqual(Self.infoSuffix)
            && names.byName[Array(name.dropLast(Self.infoSuffix.count))] != nil
    }

    /// The item whose `.trashinfo` is `name`.
    private func infoItem(named name: [UInt8]) -> InodeNumber? {
        guard name.count > Self.infoSuffix.count, name.suffix(Self.infoSuffix.count).elementsEqual(Self.infoSuffix) else { return nil }
        return ns.read { trashNames().byName[Array(name.dropLast(Self.infoSuffix.count))] }
    }

    func trashListing(_ dir: TrashNode) throws -> [(name: [UInt8], ino: UInt64, kind: NodeKind)] {
        var list: [(name: [UInt8], ino: UInt64, kind: NodeKind)] = [([0x2e], dir.ino, .directory)]
        switch dir {
        case .top:
            list.append(([0x2e, 0x2e], Self.rootID, .directory))
            list.append((Self.filesName, TrashNode.files.ino, .directory))
            list.append((Self.infoName, TrashNode.info.ino, .directory))
            list.append((Self.expungedName, TrashNode.expunged.ino, .directory))
        case .expunged:
            list.append(([0x2e, 0x2e], TrashNode.top.ino, .directory))
        case .files:
            list.append(([0x2e, 0x2e], TrashNode.top.ino, .directory))
            list += ns.read { trashNames().sorted }.lazy.map { ($0.name, $0.ino, $0.kind) }
        case .info:
            list.append(([0x2e, 0x2e], TrashNode.top.ino, .directory))
            let names = ns.read { trashNames() }
            list.reserveCapacity(names.sorted.count + 2)
            for item in names.sorted { list.append((item.name + Self.infoSuffix, TrashNode.infoFile(item.ino).ino, .regular)) }
            for (id, p) in trashPlaceholders.all() where p.alias == nil && !isInfoName(p.name, in: names) {
                list.append((p.name, TrashNode.placeholder(id).ino, .regular))
            }
        default:
            throw FSError.notDir()
        }
        return list
    }

    /// mkdir in the trash (or of it at the root): it is always there, so EEXIST, as GIO expects.
    func trashMkdir(_ parent: UInt64, _ name: [UInt8]) throws -> Attributes? {
        if parent == Self.rootID, offersDesktopTrash, name == desktopTrashName { throw FSError(EEXIST, "the trash folder exists") }
        guard let dir = trashNode(parent) else { return nil }
        if dir == .top, name == Self.filesName || name == Self.infoName || name == Self.expungedName { throw FSError(EEXIST, "exists") }
        throw FSError(EPERM, "nothing else can be made in the trash folder")
    }

    /// create in `info/`: a placeholder (GIO's claim, or its temporary file).
    func trashCreate(_ dir: TrashNode, _ name: [UInt8], flags: Int32) throws -> (Attributes, UInt64) {
        guard dir == .info else { throw FSError(EPERM, "only a move puts something in the trash") }
        try ViewPolicy.check(name: name)
        trashPlaceholders.dropAliases(keeping: ns.read { Set(state.trashed.keys) })
        let existing = trashPlaceholders.id(named: name)
        if infoItem(named: name) != nil || (existing != nil && flags & O_EXCL != 0) { throw FSError(EEXIST, "exists") }
        let id = existing ?? trashPlaceholders.add(name)
        if flags & O_TRUNC != 0 { trashPlaceholders.update(id) { $0.bytes = [] } }
        return (try trashAttributes(.placeholder(id)), trashHandle(.placeholder(id), flags: flags))
    }

    func trashHandle(_ node: TrashNode, flags: Int32) -> UInt64 {
        docsLock.withLock {
            defer { nextHandle += 1 }
            handles[nextHandle] = .trash(node, flags: flags)
            return nextHandle
        }
    }

    func trashOpen(_ node: TrashNode, flags: Int32) throws -> UInt64 {
        switch node {
        case .infoFile:
            if Self.mayWrite(flags) { throw FSError(EACCES, "computed from Recently Deleted") }
        case .placeholder(let id):
            guard let p = trashPlaceholders.get(id) else { throw FSError.noEntry() }
            if p.alias != nil && Self.mayWrite(flags) { throw FSError(EACCES, "computed from Recently Deleted") }
            if flags & O_TRUNC != 0 { trashPlaceholders.update(id) { $0.bytes = [] } }
        default:
            throw FSError(EISDIR, "is a folder")
        }
        _ = try trashAttributes(node)
        return trashHandle(node, flags: flags)
    }

    func trashBytes(_ node: TrashNode) throws -> [UInt8] {
        switch node {
        case .infoFile(let i):
            return try ns.read {
                guard let r = state.trashed[i] else { throw FSError.noEntry("no longer in the trash") }
                return trashInfo(r)
            }
        case .placeholder(let id):
            guard let p = trashPlaceholders.get(id) else { throw FSError.noEntry() }
            if let item = p.alias { return try trashBytes(.infoFile(item)) }
            return p.bytes
        default:
            throw FSError(EISDIR, "is a folder")
        }
    }

    func trashWrite(_ node: TrashNode, offset: UInt64, bytes: UnsafeRawBufferPointer) throws -> Int {
        guard case .placeholder(let id) = node else { throw FSError(EACCES, "computed from Recently Deleted") }
        guard offset + UInt64(bytes.count) <= 1 << 20 else { throw FSError(EFBIG, "trash info files are small") }
        trashPlaceholders.update(id) { p in
            let end = Int(offset) + bytes.count
            if p.bytes.count < end { p.bytes += [UInt8](repeating: 0, count: end - p.bytes.count) }
            p.bytes.replaceSubrange(Int(offset)..<end, with: bytes)
            p.mtime = nowNanoseconds()
        }
        return bytes.count
    }

    /// unlink or rmdir in the trash: in `files/` it deletes the item for good; in `info/` it
    /// drops a placeholder (an item's computed info goes with the item).
    func trashRemove(_ dir: TrashNode, _ name: [UInt8], directory: Bool) throws {
        switch dir {
        case .files:
            guard let ino = ns.read({ trashNames().byName[name] }) else { throw FSError.noEntry() }
            let (kind, empty) = ns.read { (state.nodes.kind(of: ino), state.children[ino]?.isEmpty ?? true) }
            if directory && kind != .directory { throw FSError.notDir() }
            if !directory && kind == .directory { throw FSError(EISDIR, "is a folder") }
            if directory && !empty { throw FSError(ENOTEMPTY, "folder is not empty") }
            try emptyTrash(ino)
            trashPlaceholders.noteLeft(name + Self.infoSuffix)
        case .info:
            if let id = trashPlaceholders.id(named: name) { trashPlaceholders.remove(id); return }
            if trashPlaceholders.takeLeft(name) { return }
            guard infoItem(named: name) != nil else { throw FSError.noEntry() }
        case .top:
            throw FSError(EPERM, "the trash folder's own folders stay")
        default:
            throw FSError.notDir()
        }
    }

    /// A rename into, out of or inside the trash folder; nil if it involves none of it.
    func trashRename(parent: UInt64, name: [UInt8], newParent: UInt64, newName: [UInt8], flags: RenameFlags) throws -> Bool {
        let from = trashNode(parent), to = trashNode(newParent)
        if from == nil && to == nil { return false }
        if flags.contains(.exchange) { throw FSError(EINVAL, "no exchange with the trash") }
        switch (from, to) {
        case (.info?, .info?):
            // GIO's write of an info file: its temporary file renamed over the claim.
            guard let id = trashPlaceholders.id(named: name) else {
                throw infoItem(named: name) != nil ? FSError(EPERM, "computed from Recently Deleted") : FSError.noEntry()
            }
            if flags.contains(.noReplace), trashPlaceholders.id(named: newName) != nil || infoItem(named: newName) != nil {
                throw FSError(EEXIST, "exists")
            }
            // Over an item's info: the file stands for that info from now on (the kernel binds
            // the name to its number).
            trashPlaceholders.rename(id, to: newName, alias: infoItem(named: newName))
        case (nil, .files?):
            let ino = try moveToTrash(parent: parent, name: name, trashName: newName)
            // GIO's claim of the info name stands for the item's info.
            if let id = trashPlaceholders.id(named: newName + Self.infoSuffix) {
                trashPlaceholders.rename(id, to: newName + Self.infoSuffix, alias: ino)
            }
        case (.files?, .expunged?):
            // GVfs's delete for good.
            guard let ino = ns.read({ trashNames().byName[name] }) else { throw FSError.noEntry() }
            try emptyTrash(ino)
            trashPlaceholders.noteLeft(name + Self.infoSuffix)
        case (.files?, nil):
            guard let ino = ns.read({ trashNames().byName[name] }) else { throw FSError.noEntry() }
            try restoreFromTrash(ino, to: newParent, name: newName)
            trashPlaceholders.noteLeft(name + Self.infoSuffix)
        default:
            throw FSError(EPERM, "not a move into or out of the trash")
        }
        return true
    }

    /// Move `name` in `parent` (in a container's Documents) to Recently Deleted under
    /// `trashName`, folders with what is in them.
    private func moveToTrash(parent: UInt64, name: [UInt8], trashName: [UInt8]) throws -> InodeNumber {
        try ViewPolicy.check(name: trashName)
        if ns.read({ trashNames().byName[trashName] }) != nil { throw FSError(EEXIST, "the trash has an item of that name") }
        return try mutate { s -> InodeNumber in
            let t = try target(parent)
            guard case .node(var p) = t else { throw FSError.readOnly("the mount root is read-only") }
            guard p.kind == .directory, p.nlink > 0, !state.isInTrash(p.ino) else { throw FSError.noEntry() }
            guard let child = state.children[p.ino]?[name], var n = state.nodes[child], policy.visible(n, in: state) else {
                throw FSError.noEntry()
            }
            // One name of several is not the file: refusing lets the file manager offer to
            // delete just that name.
            if n.kind != .directory && n.nlink > 1 { throw FSError(EXDEV, "a file with other names stays; only this name can be deleted") }
            if name == documentsName, let c = state.containers[p.container], c.rootIno == p.ino {
                throw FSError(EPERM, "a container's Documents folder cannot be trashed")
            }
            let now = nowNanoseconds()
            guard try stageTrash(&s, &n, from: p, name: name, now: now, trashName: trashName) else {
                throw FSError(EXDEV, "only what is in Documents goes to the trash")
            }
            if n.kind == .directory { p.nlink -= 1 }
            p.mtime = now
            p.ctime = now
            s.put(p)
            return n.ino
        }
    }
}

/// GIO's unique trash name: `name.N.ext` (the number before the first dot), `name.N` without one.
func gioUniqueName(_ name: [UInt8], _ n: Int) -> [UInt8] {
    guard let dot = name.firstIndex(of: 0x2e), dot != name.startIndex else { return name + Array(".\(n)".utf8) }
    return Array(name[..<dot]) + Array(".\(n)".utf8) + Array(name[dot...])
}
