// A file's history as the user works with it: restoring a version, the conflict copies shown
// beside a file whose edit lost a race, and resolving them (`ubiquityfs restore / resolve /
// status`). Every operation here is a commit like any other, so the other writers on the store
// see it through the change log, and nothing in it deletes content a version still holds.

import Foundation
import UbiquityStore

/// An unresolved conflict: a version published on a base that was no longer current. It stays in
/// the file's history, and a copy of it is shown beside the file until the user resolves it.
///
/// Recorded in the store's `meta` table as `conflict.<version>` = `<file> <copy> <copy version>`,
/// so recording one takes no table of its own and reaches other writers through the change log.
/// Copy 0 means the copy is still owed: it is made right after the commit that recorded the
/// conflict, or by the next start or hourly collection if that failed or the daemon stopped.
public struct Conflict: Sendable, Equatable, MetaRecord {
    public var version: VersionID
    public var file: InodeNumber
    /// The visible copy and its first version (nil while owed).
    public var copy: InodeNumber?
    public var copyVersion: VersionID?

    static let prefix = "conflict."
    var key: String { Self.prefix + String(version) }
    var value: String { "\(file) \(copy ?? 0) \(copyVersion ?? 0)" }

    init(version: VersionID, file: InodeNumber, copy: InodeNumber? = nil, copyVersion: VersionID? = nil) {
        self.version = version; self.file = file; self.copy = copy; self.copyVersion = copyVersion
    }

    init?(key: String, value: String) {
        guard key.hasPrefix(Self.prefix), let v = VersionID(key.dropFirst(Self.prefix.count)) else { return nil }
        let f = value.split(separator: " ").compactMap { UInt64($0) }
        guard f.count == 3 else { return nil }
        self.init(version: v, file: f[0], copy: f[1] == 0 ? nil : f[1], copyVersion: f[2] == 0 ? nil : VersionID(truncatingIfNeeded: f[2]))
    }

    var id: VersionID { version }
}

/// A record kept in the store's `meta` table as `<prefix><id>` = value, of which the namespace
/// keeps a table by id in step with the batches it applies.
protocol MetaRecord {
    associatedtype ID: Hashable & LosslessStringConvertible
    static var prefix: String { get }
    var id: ID { get }
    init?(key: String, value: String)
}

extension MetaRecord {
    static func all(in meta: [String: String]) -> [ID: Self] {
        var out: [ID: Self] = [:]
        for (k, v) in meta where k.hasPrefix(prefix) {
            if let r = Self(key: k, value: v) { out[r.id] = r }
        }
        return out
    }

    /// Keep `table` in step with one change of `meta`.
    static func note(key: String, value: String?, in table: inout [ID: Self]) {
        guard key.hasPrefix(prefix), let id = ID(String(key.dropFirst(prefix.count))) else { return }
        table[id] = value.flatMap { Self(key: key, value: $0) }
    }
}

/// What `resolve` keeps.
public enum KeepChoice: Sendable, Equatable {
    /// The current version; the conflict copies go (their content stays in the history).
    case current
    /// That version becomes current (a conflict version, or any other of the file's).
    case version(VersionID)
    /// Both: the conflict copies stay, as ordinary files.
    case both
}

/// What `resolve` did.
public struct Resolution: Sendable, Equatable {
    /// Conflicts it marked resolved.
    public var resolved: [VersionID] = []
    /// Conflict copies it removed.
    public var removedCopies: [InodeNumber] = []
    /// Conflict copies edited since they were made: kept as ordinary files, never removed.
    public var keptCopies: [InodeNumber] = []
    /// The version made current (`.version`).
    public var restored: VersionID?
}

extension Namespace {
    /// One name of `ino` (its folder and the name in it); for a folder its only one. A scan for
    /// files, which have no parent map: only rare commands (a conflict, a restore) ask.
    func firstName(of ino: InodeNumber) -> (parent: InodeNumber, name: [UInt8])? {
        if let p = parent[ino], let name = children[p]?.name(of: ino) { return (p, name) }
        for (p, entries) in children {
            if let name = entries.name(of: ino) { return (p, name) }
        }
        return nil
    }

    /// Every name of `ino`.
    func names(of ino: InodeNumber) -> [(parent: InodeNumber, name: [UInt8])] {
        var out: [(InodeNumber, [UInt8])] = []
        for (p, entries) in children {
            for name in entries.names(of: ino) { out.append((p, name)) }
        }
        return out
    }
}

extension UbiquityFileSystem {
    /// Publish version `id` of file `ino` again as its current version (origin `restored`); the
    /// version it replaces stays in the history. With `name`, the content goes to a new file of
    /// that name beside it instead, and the file is left as it is. Durable when it returns.
    /// Returns the file that now holds the content.
    @discardableResult
    public func restore(_ ino: InodeNumber, version id: VersionID, as name: [UInt8]? = nil) throws(FSError) -> InodeNumber {
        try typed {
            try commits.withLock { try catchUpLocked() }   // a command acts on the store as it is now
            let v = try fileVersion(ino, id)
            if let name { return try publishCopy(of: v, beside: ino, name: name, origin: .restored) ?? ino }
            try makeCurrent(v, of: ino)
            try syncPublished()
            return ino
        }
    }

    /// Resolve every unresolved conflict of file `ino`, keeping `keep`.
    public func resolve(_ ino: InodeNumber, keep: KeepChoice) throws(FSError) -> Resolution {
        try typed {
            try commits.withLock { try catchUpLocked() }
            var out = Resolution()
            if case .version(let id) = keep {
                try makeCurrent(try fileVersion(ino, id), of: ino)
                out.restored = ns.read { state.nodes[ino]?.currentVersion }
            }
            try mutate { s in
                out.resolved = []; out.removedCopies = []; out.keptCopies = []
                let conflicts = s.base.conflicts.values.filter { $0.file == ino }
                guard !conflicts.isEmpty else {
                    if case .version = keep { return }
                    throw FSError(ENOENT, "the file has no unresolved conflict").routine()
                }
                let now = nowNanoseconds()
                for c in conflicts.sorted(by: { $0.version < $1.version }) {
                    s.add(.deleteMeta(key: c.key))
                    out.resolved.append(c.version)
                    guard keep != .both, let copy = c.copy, var n = s.node(copy), s.base.trashed[copy] == nil else { continue }
                    // A copy the user edited (or is editing) holds content the history does not:
                    // it stays.
                    let editing = docsLock.withLock { docs[copy]?.hasUnpublishedChanges ?? false }
                    guard n.currentVersion == c.copyVersion, !editing else { out.keptCopies.append(copy); continue }
                    // Into Recently Deleted, like any delete (its content is in the file's history too).
                    for (parent, name) in s.base.names(of: copy) {
                        guard var p = s.node(parent) else { continue }
                        if try n.nlink > 1 || !stageTrash(&s, &n, from: p, name: name, now: now) {
                            s.add(.deleteDirent(parent: parent, name: name))
                            dropLink(&s, &n, now: now)
                        }
                        p.mtime = now
                        p.ctime = now
                        s.put(p)
                        // No kernel request made this change.
                        pendingInvalidations.append(.entry(parent: parent, name: name))
                        pendingInvalidations.append(.node(parent))
                    }
                    out.removedCopies.append(copy)
                }
            }
            try syncPublished()
            return out
        }
    }

    static let statusNameAttribute = Array("user.ubiquity.status".utf8)
    static let versionAttribute = Array("user.ubiquity.version".utf8)
    static let containerAttribute = Array("user.ubiquity.container".utf8)
    /// Read-only attributes on every item, computed from the store: what `getfattr -d` shows of
    /// an item's state. (Folders have only the container.)
    static let statusAttributes = [containerAttribute, statusNameAttribute, versionAttribute]

    /// The value of status attribute `name` for `n`, or nil if it has none.
    func statusAttribute(_ name: [UInt8], of n: NodeRecord) throws -> String? {
        if name == Self.containerAttribute { return n.container }
        guard n.kind == .regular else { return nil }
        if name == Self.versionAttribute { return n.currentVersion.map(String.init) ?? "none" }
        // current (downloaded or not, on a shared store), or what needs the user: unsaved changes here, an unresolved conflict (the
        // file's or, for a conflict copy, its own), or a version recovered after a crash that is
        // newer than the current one.
        if docsLock.withLock({ docs[n.ino]?.hasUnpublishedChanges ?? false }) { return "pending" }
        if ns.read({ state.conflicts.values.contains { $0.file == n.ino || $0.copy == n.ino } }) { return "conflict" }
        let versions: [VersionRecord]
        do { versions = try store.metadata.versions(of: n.ino) } catch { throw FSError(error) }
        if let newest = versions.last, newest.origin == .recovered, newest.id > (n.currentVersion ?? 0) { return "recovered" }
        // Current. Where content lives elsewhere, whether this machine has all of it.
        if store.localChunks != nil { return isDownloaded(n.ino) ? "downloaded" : "not-downloaded" }
        return "current"
    }

    /// Unresolved conflicts, oldest first.
    public func unresolvedConflicts() -> [Conflict] {
        ns.read { state.conflicts.values.sorted { $0.version < $1.version } }
    }

    /// Versions recovered from working copies a stopped daemon left, of files that still exist.
    public func recoveredVersions() throws(FSError) -> [VersionRecord] {
        let all: [VersionRecord]
        do { all = try store.metadata.versions(withOrigin: .recovered) } catch { throw FSError(error) }
        return ns.read { all.filter { state.nodes[$0.ino].map { $0.nlink > 0 } ?? false } }
    }

    /// Each device that published a version or deleted an item still on record, with the time
    /// of its last such change, newest first.
    public func deviceActivity() throws(FSError) -> [(device: String, last: Int64)] {
        let versions: [VersionRecord]
        do { versions = try store.metadata.allVersions() } catch { throw FSError(error) }
        var last: [String: Int64] = [:]
        for v in versions where !v.device.isEmpty { last[v.device] = max(last[v.device] ?? .min, v.created) }
        for r in ns.read({ Array(state.trashed.values) }) where !r.device.isEmpty {
            last[r.device] = max(last[r.device] ?? .min, r.deleted)
        }
        return last.map { ($0.key, $0.value) }.sorted { ($0.last, $0.device) > ($1.last, $1.device) }
    }

    /// Files held open here with changes not yet published.
    public func pendingPublishes() -> [InodeNumber] {
        docsLock.withLock { docs.values.filter(\.hasUnpublishedChanges).map(\.ino) }.sorted()
    }

    /// Where `ino` is, as the drive view shows it: `ContainerName/path/in/Documents`, or
    /// `identifier:/path` for something outside Documents. Nil if it has no name.
    public func displayPath(of ino: InodeNumber) -> String? {
        ns.read { displayPathLocked(of: ino) }
    }

    /// `displayPath`; caller holds ns (or commits).
    func displayPathLocked(of ino: InodeNumber) -> String? {
        guard let n = state.nodes[ino], let c = state.containers[n.container] else { return nil }
        var parts: [String] = []
        var cur = ino
        let docs = state.children[c.rootIno]?[documentsName]
        while cur != c.rootIno && cur != docs {
            guard let (p, name) = state.firstName(of: cur) else { return nil }
            parts.append(String(decoding: name, as: UTF8.self))
            cur = p
        }
        let path = parts.reversed().joined(separator: "/")
        return cur == docs ? ([c.name] + parts.reversed()).joined(separator: "/") : c.identifier + ":/" + path
    }

    /// Version `id`, which must be one of file `ino`'s.
    private func fileVersion(_ ino: InodeNumber, _ id: VersionID) throws -> VersionRecord {
        guard let n = ns.read({ state.nodes[ino] }), n.nlink > 0 else { throw FSError(ENOENT, "no such file") }
        guard n.kind == .regular else { throw FSError(EISDIR, "only a file has versions") }
        let v: VersionRecord?
        do { v = try store.metadata.version(id) } catch { throw FSError(error) }
        guard let v, v.ino == ino else { throw FSError(EINVAL, "version \(id) is not one of this file's versions") }
        return v
    }

    /// Make a new version with `v`'s content current on `ino`. Its chunks stay this file's,
    /// which pruning counts (it looks at every version of the file).
    private func makeCurrent(_ v: VersionRecord, of ino: InodeNumber) throws {
        let node = try mutate { s -> NodeRecord in
            guard var n = s.node(ino), n.nlink > 0 else { throw FSError(ENOENT, "the file is gone") }
            // Read before commits was taken: pruning may have deleted it (and freed its chunks) since.
            let still: VersionRecord?
            do { still = try store.metadata.version(v.id) } catch { throw FSError(error) }
            guard still != nil else { throw FSError(ENOENT, "version \(v.id) was pruned meanwhile") }
            let id = try s.newVersion()
            let now = nowNanoseconds()
            s.add(.putVersion(VersionRecord(id: id, ino: ino, created: now, size: v.size, chunks: v.chunks,
                                            origin: .restored, device: self.device)))
            try prune(&s, ino: ino, adding: v.chunks)
            n.size = v.size
            n.mtime = now
            n.ctime = now
            n.currentVersion = id
            s.put(n)
            // No kernel request made this change: drop what the kernel holds of the file.
            pendingInvalidations.append(.node(ino))
            pendingRebases.insert(ino)
            return n
        }
        // A document open here with no changes of its own reads the restored content at once;
        // one with changes publishes them as a conflict.
        docsLock.withLock { docs[ino] }?.rebase(on: node, chunks: v.chunks)
        log("inode \(ino): version \(v.id) restored as current version \(node.currentVersion ?? 0)")
    }

    /// A new file named `name` beside `ino` (in the folder of its first name) holding `v`'s
    /// content, copied: blobs belong to one file's history, so freeing them never has to look
    /// beyond that file. `conflict`: the copy is that conflict's (its record is completed in the
    /// same commit), and is skipped if another writer made it first. Returns the new file, nil
    /// when skipped.
    @discardableResult
    func publishCopy(of v: VersionRecord, beside ino: InodeNumber, name: [UInt8]?, origin: VersionOrigin,
                     conflict: Conflict? = nil) throws -> InodeNumber? {
        guard let (parent, fileName) = ns.read({ state.trashed[ino] == nil ? state.firstName(of: ino) : nil }) else {
            throw FSError(ENOENT, "the file has no name to put a copy beside (deleted, or in Recently Deleted)")
        }
        if let name { try ViewPolicy.check(name: name) }
        let chunks = try copyContent(v.chunks)
        var committed = false
        defer {
            if !committed && store.deletesChunksOfFailedCommits { for c in chunks where !c.isHole { try? store.blobs.delete(c.blob) } }
        }
        let made = try mutate { s -> InodeNumber? in
            if let conflict, s.base.conflicts[conflict.version] != conflict { return nil }
            guard let file = s.node(ino), var p = s.node(parent), p.kind == .directory else {
                throw FSError(ENOENT, "the file's folder is gone")
            }
            let copyName: [UInt8]
            if let name {
                if s.base.children[parent]?[name] != nil { throw FSError(EEXIST, "\(String(decoding: name, as: UTF8.self)) already exists") }
                copyName = name
            } else {
                copyName = conflictCopyName(fileName, device: v.device, created: v.created) { s.base.children[parent]?[$0] != nil }
            }
            let copy = try s.newIno()
            let vid = try s.newVersion()
            let now = nowNanoseconds()
            var n = newNode(ino: copy, container: file.container, kind: .regular, mode: file.mode,
                            caller: Caller(uid: file.uid, gid: file.gid))
            n.size = v.size
            n.mtime = conflict == nil ? now : v.created
            n.currentVersion = vid
            s.put(n)
            s.add(.putVersion(VersionRecord(id: vid, ino: copy, created: now, size: v.size, chunks: chunks,
                                            origin: origin, device: v.device)))
            s.add(.putDirent(DirentRecord(parent: parent, name: copyName, child: copy)))
            p.mtime = now
            p.ctime = now
            s.put(p)
            if var c = conflict {
                c.copy = copy
                c.copyVersion = vid
                s.add(.setMeta(key: c.key, value: c.value))
            }
            // Made by no kernel request: the folder's listing and the name are new to the kernel.
            pendingInvalidations.append(.entry(parent: parent, name: copyName))
            pendingInvalidations.append(.node(parent))
            return copy
        }
        guard let made else { return nil }
        committed = true
        try syncPublished()
        return made
    }

    /// Conflict copies owed (their daemon stopped between recording the conflict and making the
    /// copy, or the copy failed, or the file had no name then): at start and with each hourly
    /// collection. Another daemon making the same copy at once is safe: both commits change the
    /// file's folder, so one of them is staged again, sees the copy made, and adds nothing.
    func makeOwedConflictCopies() {
        for c in ns.read({ state.conflicts.values.filter { $0.copy == nil } }) {
            makeConflictCopy(c)
        }
    }

    /// Show conflict `c` beside its file. A failure is logged: the conflict version holds the
    /// content whatever happens, and the copy stays owed.
    func makeConflictCopy(_ c: Conflict) {
        do {
            let v: VersionRecord?
            do { v = try store.metadata.version(c.version) } catch { throw FSError(error) }
            guard let v else {
                // The version is gone (it did not reach the disk before a power cut): nothing is
                // left to show, and a record kept would be owed forever.
                try mutate { s in if s.base.conflicts[c.version] == c { s.add(.deleteMeta(key: c.key)) } }
                log("inode \(c.file): conflict version \(c.version) is gone; its conflict is dropped")
                return
            }
            guard let copy = try publishCopy(of: v, beside: c.file, name: nil, origin: .conflict, conflict: c) else { return }
            log("inode \(c.file): conflict version \(c.version) is shown beside it as \(displayPath(of: copy) ?? "inode \(copy)")")
        } catch {
            log("inode \(c.file): the copy of conflict version \(c.version) could not be made yet: \(error)")
        }
    }

    /// `chunks`' content in new blobs (holes stay holes).
    func copyContent(_ chunks: [ChunkRef]) throws -> [ChunkRef] {
        var out: [ChunkRef] = []
        var buffer = [UInt8](repeating: 0, count: chunkSize)
        do {
            for c in chunks {
                if c.isHole { out.append(.hole); continue }
                let length = Int(c.length)
                let n = try buffer.withUnsafeMutableBytes { b throws(StoreError) in
                    try store.blobs.read(c.blob, at: 0, into: UnsafeMutableRawBufferPointer(rebasing: b[0..<length]))
                }
                guard n == length else { throw StoreError(errno: EIO, "content chunk \(c.blob) is shorter than its version says") }
                out.append(try buffer.withUnsafeBytes { b throws(StoreError) in
                    try store.blobs.write(UnsafeRawBufferPointer(rebasing: b[0..<length]), durable: false)
                })
            }
        } catch {
            for c in out where !c.isHole { try? store.blobs.delete(c.blob) }
            throw FSError(error)
        }
        return out
    }

    /// Conflict records `s` leaves pointing at nothing, settled in the same batch: a file's
    /// history moved by an atomic save takes its conflicts along; a deleted file's conflicts go
    /// with its versions (the copies stay, as ordinary files); a deleted copy resolves its
    /// conflict (the content stays in the file's history). Caller holds commits (in `mutate`).
    func settleConflicts(_ s: inout Staging) {
        guard !s.base.conflicts.isEmpty else { return }
        var moved: [InodeNumber: InodeNumber] = [:]
        var deleted: Set<InodeNumber> = []
        for m in s.mutations {
            if case .moveVersions(let from, let to) = m { moved[from] = to }
            if case .deleteNode(let ino) = m { deleted.insert(ino) }
        }
        guard !moved.isEmpty || !deleted.isEmpty else { return }
        for var c in s.base.conflicts.values {
            if let copy = c.copy, let to = moved[copy] {
                // An editor saved over the copy: the saved file is the copy now (an edited one,
                // so never removed by `resolve`).
                c.copy = to
                s.add(.setMeta(key: c.key, value: c.value))
            } else if let copy = c.copy, deleted.contains(copy) {
                s.add(.deleteMeta(key: c.key))
            } else if let to = moved[c.file] {
                c.file = to
                s.add(.setMeta(key: c.key, value: c.value))
            } else if deleted.contains(c.file) {
                s.add(.deleteMeta(key: c.key))
            }
        }
    }
}

/// `Report (conflict from HOST 2026-12-01 10.42).txt` for `Report.txt`, as iCloud names a
/// conflict copy; ` 2`, ` 3`, … inside the parentheses while the name is `taken`. The stem is
/// shortened (on a character boundary) to keep the name within `nameMax` bytes.
func conflictCopyName(_ fileName: [UInt8], device: String, created: Int64, taken: ([UInt8]) -> Bool) -> [UInt8] {
    let f = DateFormatter()
    f.locale = Locale(identifier: "en_US_POSIX")
    f.dateFormat = "yyyy-MM-dd HH.mm"
    let when = f.string(from: Date(timeIntervalSince1970: TimeInterval(created) / 1e9))
    let host = device.isEmpty ? "another device" : device
    var n = 1
    while true {
        let candidate = nameInserting(" (conflict from \(host) \(when)\(n == 1 ? "" : " \(n)"))", into: fileName)
        if !taken(candidate) || n > 10_000 { return candidate }
        n += 1
    }
}
