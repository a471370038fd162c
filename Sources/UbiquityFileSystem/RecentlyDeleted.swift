// Recently Deleted: what a user deletes from a container's Documents (unlink of a file's last
// name, rmdir) moves, in the same one commit, into a folder of the container's own that no view
// shows, with its versions, for 30 days (`RetentionPolicy.deletedFor`); `ubiquityfs trash` lists,
// restores and empties it. So a delete stays a metadata change (`rm -rf` moves names, copies
// nothing) and is undone as one. An app's private data outside Documents is deleted for real,
// as on iCloud.

import Foundation
import UbiquityStore

/// The folder in each container's root that holds its Recently Deleted items, each named by its
/// inode number.
let recentlyDeletedName = Array(".ubiquityfs-recently-deleted".utf8)

/// One item in Recently Deleted, recorded in the store's `meta` table as `deleted.<ino>` =
/// `<folder it was in> <deletion time, ns> <name in hex> <trash name in hex, or -> <writer>`, so
/// it reaches other writers through the change log with the move that made it.
public struct TrashRecord: Sendable, Equatable, MetaRecord {
    public var ino: InodeNumber
    /// The folder it was deleted from, and its name there.
    public var parent: InodeNumber
    public var name: [UInt8]
    public var deleted: Int64
    /// The name the desktop's trash gave it (a rename into `.Trash-UID/files/NAME`), if any.
    public var trashName: [UInt8]?
    /// The writer (daemon) that deleted it; its first word is the device.
    public var writer: String
    public var device: String { writer.split(separator: " ").first.map(String.init) ?? "" }

    static let prefix = "deleted."
    var key: String { Self.prefix + String(ino) }
    /// The writer `fsck --repair` records for the lost+found it makes: an item it put in Recently
    /// Deleted was rescued, not deleted, so it never expires by age (emptying does take it).
    public static func repairWriter(device: String) -> String { "\(device) fsck-repair pid \(getpid())" }
    var isRescued: Bool {
        // The second word (words part at runs of spaces), by bytes: expiry asks this of every
        // item at each start.
        let w = writer.utf8
        var i = w.startIndex, words = 0
        while i < w.endIndex {
            if w[i] == 0x20 { i = w.index(after: i); continue }
            let end = w[i...].firstIndex(of: 0x20) ?? w.endIndex
            words += 1
            if words == 2 { return w[i..<end].elementsEqual("fsck-repair".utf8) }
            i = end
        }
        return false
    }
    var value: String { "\(parent) \(deleted) \(Self.hex(name)) \(trashName.map(Self.hex) ?? "-") \(writer)" }

    init(ino: InodeNumber, parent: InodeNumber, name: [UInt8], deleted: Int64, trashName: [UInt8]? = nil, writer: String) {
        self.ino = ino; self.parent = parent; self.name = name; self.deleted = deleted; self.trashName = trashName
        self.writer = writer
    }

    // By hand: `String(format:)` per byte was a twentieth of a delete's CPU.
    private static let hexDigits = Array("0123456789abcdef".utf8)
    private static func hex(_ bytes: [UInt8]) -> String {
        var out = [UInt8](); out.reserveCapacity(bytes.count * 2)
        for b in bytes { out.append(hexDigits[Int(b >> 4)]); out.append(hexDigits[Int(b & 15)]) }
        return String(decoding: out, as: UTF8.self)
    }

    private static func unhex(_ text: UnsafeBufferPointer<UInt8>.SubSequence) -> [UInt8]? {
        guard text.count % 2 == 0 else { return nil }
        func digit(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x30...0x39: c - 0x30
            case 0x61...0x66: c - 0x61 + 10
            case 0x41...0x46: c - 0x41 + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(text.count / 2)
        var i = text.startIndex
        while i < text.endIndex {
            guard let hi = digit(text[i]), let lo = digit(text[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }

    // Parsed by bytes (every record is read at each start; `split` on characters was a tenth of
    // a start with many items in Recently Deleted).
    init?(key: String, value: String) {
        guard key.hasPrefix(Self.prefix), let ino = InodeNumber(key.dropFirst(Self.prefix.count)) else { return nil }
        var value = value
        let fields: (InodeNumber, Int64, [UInt8], [UInt8]?, String)? = value.withUTF8 { b in
            var f: [Range<Int>] = []
            var start = 0
            for i in 0..<b.count where b[i] == 0x20 && f.count < 4 {
                f.append(start..<i)
                start = i + 1
            }
            f.append(start..<b.count)
            func text(_ r: Range<Int>) -> Substring { Substring(decoding: b[r], as: UTF8.self) }
            guard f.count >= 4, let parent = InodeNumber(text(f[0])), let deleted = Int64(text(f[1])),
                  let name = Self.unhex(b[f[2]]) else { return nil }
            let dash = f[3].count == 1 && b[f[3].lowerBound] == 0x2d
            return (parent, deleted, name, dash ? nil : Self.unhex(b[f[3]]), f.count > 4 ? String(decoding: b[f[4]], as: UTF8.self) : "")
        }
        guard let (parent, deleted, name, trashName, writer) = fields else { return nil }
        self.init(ino: ino, parent: parent, name: name, deleted: deleted, trashName: trashName, writer: writer)
    }

    var id: InodeNumber { ino }
}

extension Namespace {
    /// Whether folder `dir` is in Recently Deleted, or inside a folder that is (a tree the
    /// desktop's trash took whole).
    func isInTrash(_ dir: InodeNumber) -> Bool {
        var cur = dir
        while true {
            if trashed[cur] != nil { return true }
            guard let p = parent[cur] else { return false }
            cur = p
        }
    }
}

/// The nodes inside folders that went to Recently Deleted whole, with the folder each is in:
/// worked out once per change of Recently Deleted (nothing moves into such a tree otherwise),
/// not at every publish.
final class TrashedTrees: @unchecked Sendable {
    private let lock = Lock()
    private var stamp: Int64 = -1
    private var folderOf: [InodeNumber: InodeNumber] = [:]
    func folder(of ino: InodeNumber, at stamp: Int64, build: () -> [InodeNumber: InodeNumber]) -> InodeNumber? {
        lock.withLock {
            if self.stamp != stamp { folderOf = build(); self.stamp = stamp }
            return folderOf[ino]
        }
    }
}

/// An item of Recently Deleted as `ubiquityfs trash list` shows it.
public struct TrashItem: Sendable, Equatable {
    public var ino: InodeNumber
    public var container: String
    /// Where it was, as the drive view shows it (`TestDrive/Drafts/Report.txt`).
    public var originalPath: String
    public var deleted: Int64
    public var device: String
    public var kind: NodeKind
    public var size: UInt64
}

extension UbiquityFileSystem {
    /// Stage the move of `n` (its last name `name` in `p`) into its container's Recently Deleted,
    /// if it is inside Documents; false if it is not (the caller deletes it for real). Caller
    /// holds commits (in `mutate`) and updates `p`'s link count (for a folder) and times.
    func stageTrash(_ s: inout Staging, _ n: inout NodeRecord, from p: NodeRecord, name: [UInt8], now: Int64,
                    trashName: [UInt8]? = nil) throws -> Bool {
        guard let c = s.base.containers[n.container], policy.depth(of: p.ino, in: c, s.base) != nil else { return false }
        var folder: NodeRecord
        if let f = recentlyDeletedFolder(of: c, in: s) {
            folder = f
        } else {
            // Made on the first delete, private to the store's owner.
            folder = newNode(ino: try s.newIno(), container: c.identifier, kind: .directory, mode: 0o700,
                             caller: Caller(uid: ownerUID, gid: ownerGID))
            guard var root = s.node(c.rootIno) else { return false }
            root.nlink += 1
            s.put(root)
            s.put(folder)
            s.add(.putDirent(DirentRecord(parent: c.rootIno, name: recentlyDeletedName, child: folder.ino)))
        }
        s.add(.deleteDirent(parent: p.ino, name: name))
        s.add(.putDirent(DirentRecord(parent: folder.ino, name: Array(String(n.ino).utf8), child: n.ino)))
        // A folder's `..` counts in Recently Deleted's links; a file changes nothing of it (a
        // put would be one more row written per delete).
        if n.kind == .directory {
            folder.nlink += 1
            s.put(folder)
        }
        n.ctime = now
        s.put(n)
        // Its name in the desktop trash, chosen now, so that it never moves (`name.2.ext`, … if
        // another item has it).
        var chosen = trashName ?? name
        var k = 2
        while trashName == nil, s.base.trashNamesInUse[chosen] != nil, k < 100_000 { chosen = gioUniqueName(name, k); k += 1 }
        let record = TrashRecord(ino: n.ino, parent: p.ino, name: name, deleted: clock(), trashName: chosen, writer: writerID)
        s.add(.setMeta(key: record.key, value: record.value))
        // A deleted conflict copy resolves its conflict (its content stays in the file's history).
        for conflict in s.base.conflicts.values where conflict.copy == n.ino { s.add(.deleteMeta(key: conflict.key)) }
        return true
    }

    /// Container `c`'s Recently Deleted folder, if it was made. Caller holds commits.
    private func recentlyDeletedFolder(of c: ContainerRecord, in s: Staging) -> NodeRecord? {
        s.base.children[c.rootIno]?[recentlyDeletedName].flatMap { s.node($0) }
    }

    /// Recently Deleted items, newest first; of one container (name or identifier) if given.
    public func trashItems(container: String? = nil) -> [TrashItem] {
        ns.read {
            state.trashed.values.compactMap { r -> TrashItem? in
                guard let n = state.nodes[r.ino], let c = state.containers[n.container] else { return nil }
                if let container, c.name != container && c.identifier != container { return nil }
                return TrashItem(ino: r.ino, container: c.name, originalPath: trashOriginalPath(r), deleted: r.deleted,
                                 device: r.device, kind: n.kind, size: n.kind == .regular ? n.size : 0)
            }.sorted { ($0.deleted, $0.ino) > ($1.deleted, $1.ino) }
        }
    }

    /// Where a trashed item was. Caller holds ns.
    func trashOriginalPath(_ r: TrashRecord) -> String {
        let name = String(decoding: r.name, as: UTF8.self)
        if let up = state.trashed[r.parent] { return trashOriginalPath(up) + "/" + name }
        return (displayPathLocked(of: r.parent) ?? "?") + "/" + name
    }

    /// Put item `ino` back where it was deleted from (under `Name 2.ext` if the name is taken
    /// now), after its folder if that was deleted too (just the folder: the other items deleted
    /// from it stay); a folder brings back what was deleted from it, unless `withChildren` is
    /// false. Returns where it is now.
    @discardableResult
    public func restoreFromTrash(_ ino: InodeNumber, withChildren: Bool = true) throws(FSError) -> String {
        try restoreFromTrash(ino, to: nil, name: nil, withChildren: withChildren)
    }

    /// `restoreFromTrash`, or with `folder` and `name` to that place instead (a move out of the
    /// desktop's trash: `EEXIST` if the name is taken).
    @discardableResult
    func restoreFromTrash(_ ino: InodeNumber, to destination: InodeNumber?, name: [UInt8]?,
                          withChildren: Bool = true) throws(FSError) -> String {
        try typed {
            try commits.withLock { try catchUpLocked() }
            guard let r = ns.read({ state.trashed[ino] }) else { throw FSError(ENOENT, "item \(ino) is not in Recently Deleted") }
            if destination == nil, ns.read({ state.trashed[r.parent] != nil }) {
                _ = try restoreFromTrash(r.parent, withChildren: false)
            }
            try mutate { s in
                guard let r = s.base.trashed[ino], var n = s.node(ino), let c = s.base.containers[n.container],
                      var folder = recentlyDeletedFolder(of: c, in: s) else {
                    throw FSError(ENOENT, "item \(ino) is not in Recently Deleted")
                }
                // Back to its folder if that is still in Documents, else to Documents itself.
                var target = destination ?? r.parent
                if let destination {
                    guard let f = s.node(destination), f.kind == .directory, f.container == n.container,
                          s.base.trashed[destination] == nil, policy.depth(of: destination, in: c, s.base) != nil else {
                        throw FSError(EXDEV, "an item goes back only into its own container's Documents")
                    }
                    if let name, s.base.children[destination]?[name] != nil { throw FSError(EEXIST, "already exists") }
                    if let name { try ViewPolicy.check(name: name) }
                    try policy.checkLevels(moving: n, into: f, in: s.base)
                } else if s.node(target)?.kind != .directory || s.base.trashed[target] != nil
                    || policy.depth(of: target, in: c, s.base) == nil {
                    guard let docs = s.base.children[c.rootIno]?[documentsName] else { throw FSError(ENOENT, "the container has no Documents") }
                    target = docs
                }
                var p = s.node(target)!
                let name = name ?? freeName(r.name) { s.base.children[target]?[$0] != nil }
                let now = nowNanoseconds()
                s.add(.deleteDirent(parent: folder.ino, name: Array(String(ino).utf8)))
                s.add(.putDirent(DirentRecord(parent: target, name: name, child: ino)))
                s.add(.deleteMeta(key: r.key))
                if n.kind == .directory { folder.nlink -= 1; p.nlink += 1 }
                s.put(folder)
                n.ctime = now
                s.put(n)
                p.mtime = now
                p.ctime = now
                s.put(p)
                pendingInvalidations.append(.entry(parent: target, name: name))
                pendingInvalidations.append(.node(target))
                pendingInvalidations.append(.node(ino))
            }
            // What was deleted from a folder comes back with it, newest first: of two deleted
            // under one name, the later keeps the name.
            let children = ns.read { state.trashed.values.filter { $0.parent == ino }.sorted { ($0.deleted, $0.ino) > ($1.deleted, $1.ino) } }
            for child in children.map(\.ino) where destination == nil && withChildren {
                _ = try restoreFromTrash(child)
            }
            return displayPath(of: ino) ?? "inode \(ino)"
        }
    }

    /// Delete items of Recently Deleted for good (their versions and content go): `ino`, or every
    /// item deleted before `before` (of one container if given). Returns how many went.
    @discardableResult
    public func emptyTrash(_ ino: InodeNumber? = nil, deletedBefore before: Int64? = nil, container: String? = nil) throws(FSError) -> Int {
        try typed {
            try commits.withLock { try catchUpLocked() }
            let doomed: [InodeNumber]
            if let ino {
                guard ns.read({ state.trashed[ino] }) != nil else { throw FSError(ENOENT, "item \(ino) is not in Recently Deleted") }
                doomed = [ino]
            } else {
                // Oldest first: a folder `rm -rf` deleted goes after what was in it, so an
                // emptying cut short leaves whole trees behind, restorable as they were.
                // Only what it needs of each record (no paths, no devices: this runs at every
                // start and collection, over every item).
                doomed = ns.read {
                    state.trashed.values.filter { r in
                        guard let n = state.nodes[r.ino], let c = state.containers[n.container] else { return false }
                        if let container, c.name != container && c.identifier != container { return false }
                        return before == nil || (r.deleted < before! && !r.isRescued)
                    }.sorted { ($0.deleted, $0.ino) < ($1.deleted, $1.ino) }.map(\.ino)
                }
            }
            var count = 0
            // One commit per item: a long emptying never holds the namespace for long.
            for item in doomed {
                var files: [InodeNumber] = []
                let purged = try mutate { s -> Bool in
                    files = []
                    guard let r = s.base.trashed[item], var n = s.node(item), let c = s.base.containers[n.container],
                          var folder = recentlyDeletedFolder(of: c, in: s) else { return false }
                    let now = nowNanoseconds()
                    s.add(.deleteDirent(parent: folder.ino, name: Array(String(item).utf8)))
                    s.add(.deleteMeta(key: r.key))
                    if n.kind == .directory {
                        folder.nlink -= 1
                        purgeContents(&s, of: n.ino, now: now, files: &files)
                        dropFolder(&s, &n, now: now)
                    } else {
                        dropLink(&s, &n, now: now)
                        files.append(n.ino)
                    }
                    s.put(folder)
                    return true
                }
                if purged { count += 1 }
                for ino in files { discardUnreachableWork(ino) }
            }
            return count
        }
    }

    /// Everything inside folder `dir` goes for good (a folder that went to Recently Deleted whole).
    private func purgeContents(_ s: inout Staging, of dir: InodeNumber, now: Int64, files: inout [InodeNumber]) {
        for (name, child) in s.base.children[dir] ?? [:] {
            guard var n = s.node(child) else { continue }
            s.add(.deleteDirent(parent: dir, name: name))
            if n.kind == .directory {
                purgeContents(&s, of: child, now: now, files: &files)
                dropFolder(&s, &n, now: now)
            } else {
                dropLink(&s, &n, now: now)
                files.append(n.ino)
            }
        }
    }

    /// The folder in Recently Deleted that `ino` is inside, moved there whole with what was in
    /// it (the desktop's trash takes a folder so), if any. Caller holds ns.
    func trashedAncestorLocked(of ino: InodeNumber) -> InodeNumber? {
        guard !state.trashedFolders.isEmpty else { return nil }
        return trashedTrees.folder(of: ino, at: state.trashChangedAt) {
            var out: [InodeNumber: InodeNumber] = [:]
            for f in state.trashedFolders where !(state.children[f]?.isEmpty ?? true) {
                var stack = [f]
                while let dir = stack.popLast() {
                    for child in (state.children[dir] ?? [:]).values {
                        out[child] = f
                        if state.parent[child] == dir { stack.append(child) }
                    }
                }
            }
            return out
        }
    }

    /// Items older than the retention's `deletedFor` go for good (at start and every hour).
    func expireTrash() {
        let keep = retention.deletedFor
        do {
            let n = try emptyTrash(deletedBefore: clock() - keep)
            if n > 0 { log("Recently Deleted: \(n) items older than \(Double(keep) / Double(RetentionPolicy.day)) days deleted for good") }
        } catch { log("Recently Deleted: expiring old items failed: \(error)") }
    }
}

/// `name`, or `name 2.ext`, `name 3.ext`, … (iCloud's rule) while `taken`.
func freeName(_ name: [UInt8], taken: ([UInt8]) -> Bool) -> [UInt8] {
    guard taken(name) else { return name }
    var n = 2
    while true {
        let candidate = nameInserting(" \(n)", into: name)
        if !taken(candidate) || n > 100_000 { return candidate }
        n += 1
    }
}

/// `name` with `text` put before its extension (`Report.txt` → `Report<text>.txt`; a leading dot
/// is no extension), the stem shortened on a character boundary to keep it within `nameMax`.
func nameInserting(_ text: String, into name: [UInt8]) -> [UInt8] {
    let whole = String(decoding: name, as: UTF8.self)
    var stem = whole
    var ext = ""
    if let dot = whole.lastIndex(of: "."), dot != whole.startIndex {
        stem = String(whole[..<dot])
        ext = String(whole[dot...])
    }
    // An extension too long to keep a stem beside it is no extension.
    if text.utf8.count + ext.utf8.count >= nameMax { stem = whole; ext = "" }
    let tail = text + ext
    while stem.utf8.count + tail.utf8.count > nameMax, !stem.isEmpty { stem.removeLast() }
    return Array((stem + tail).utf8)
}
