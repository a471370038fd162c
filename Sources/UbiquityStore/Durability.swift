// Durability: what makes commits survive a power cut, and what repairs the store after one. The
// model sees only barriers (`sync`, `syncMetadata`) and a writer's start and clean stop; how a
// store keeps its promise is its own. A store whose commits and content writes are durable on
// their own (a database server, an object store) needs none of the machinery below.
//
// Stores on a local disk with a page cache (the embedded store, and the in-memory store, which
// simulates that disk) commit and write content without fsync, for speed, and keep the promise
// like this (`LocalDurability`):
// - `running/<writer>` = the boot a writer runs in, from its start to its clean stop. A mark of
//   another boot means the machine stopped under that writer (a power cut, a crash of the system).
// - `synced-seq` = a change-log position up to which everything, content included, was made
//   durable by a sync (the content, then a durable commit of the mark). The content is the
//   chunks this writer wrote since its last sync (an fdatasync each), or everything (one
//   syncfs) on its first sync, whenever another writer committed versions meanwhile (their
//   chunks are in other processes' writes, which only a syncfs reaches), when the change log
//   cannot say (trimmed, unreadable), or past the blob store's limit of listed chunks.
// - At a writer's start after such a stop, every version committed after the mark (the change
//   log says which) has its chunks checked against their checksums; a file whose current content
//   did not reach the disk goes back to its newest whole version of its own (failing that, to
//   what a rename over another file replaced; failing that, empty), and versions that lost content
//   leave its history (their bytes are gone; a restore of one would give garbage). Where the log
//   was trimmed past the mark, every version of each file changed since is checked. The reverts are ordinary batches of the
//   change log (expecting the node unchanged, so a file another writer published since is left
//   alone), so the model applies them as it applies any other writer's.
// The single-writer version's marks (`running` = "1", `synced-version` = a version id) are read
// the same way.

import Foundation

public protocol Durability: AnyObject, Sendable {
    /// Start `writer` on the store whose state `snapshot` is: repair what an earlier stop of the
    /// machine under running writers may have left (see above), then mark `writer` running.
    /// Returns what was repaired, for the log; the repairs are in the change log after
    /// `snapshot.seq`.
    func begin(writer: String, snapshot: StoreSnapshot) throws(StoreError) -> [String]
    /// A barrier: every commit so far, and every content chunk it names, is durable once this
    /// returns (fsync of a file, the periodic sync, a clean stop).
    func sync() throws(StoreError)
    /// A barrier for the namespace only: every commit so far is durable (fsync of a folder).
    func syncMetadata() throws(StoreError)
    /// `writer` stops cleanly: everything is synced and its running mark removed.
    func end(writer: String) throws(StoreError)
}

public final class LocalDurability: Durability, @unchecked Sendable {
    public static let runningPrefix = "running/"
    public static let syncedKey = "synced-seq"
    static let legacyRunningKey = "running"
    static let legacySyncedKey = "synced-version"

    private let metadata: any MetadataStore
    private let blobs: any BlobStore
    private let work: any WorkArea
    // `mutex` serializes syncs and guards `syncedThrough` and `writer`.
    private let mutex = StoreMutex()
    /// The last position this writer synced through: nothing to do while the log is not past it.
    private var syncedThrough: ChangeSeq = -1
    /// The writer `begin` started: commits of its own name only chunks its blob store wrote.
    private var writer: String?

    public init(metadata: any MetadataStore, blobs: any BlobStore, work: any WorkArea) {
        self.metadata = metadata
        self.blobs = blobs
        self.work = work
    }

    public static func runningKey(_ writer: String) -> String { runningPrefix + writer }

    /// The change log's position now (an empty batch commits nothing and returns it).
    private func position() throws(StoreError) -> ChangeSeq {
        try metadata.commit(Batch([]), durable: false)
    }

    public func begin(writer: String, snapshot: StoreSnapshot) throws(StoreError) -> [String] {
        var repairs: [String] = []
        let boot = work.bootID
        let stale = snapshot.meta.filter { $0.key.hasPrefix(Self.runningPrefix) && $0.value != boot }.map(\.key)
        let legacy = snapshot.meta[Self.legacyRunningKey] == "1"
        if !stale.isEmpty || legacy {
            let synced = ChangeSeq(snapshot.meta[Self.syncedKey] ?? "0") ?? 0
            let legacySynced = VersionID(snapshot.meta[Self.legacySyncedKey] ?? "0") ?? 0
            // The versions committed after the mark, from the change log; all versions of the
            // files changed since, where the log no longer reaches that far back.
            var candidates: [InodeNumber: Set<VersionID>?] = [:]
            var fromLog = !legacy
            if fromLog {
                do {
                    for record in try metadata.changes(since: synced) {
                        for m in record.mutations {
                            switch m {
                            case .putVersion(let v): candidates[v.ino, default: []]?.insert(v.id)
                            case .moveVersions(let from, let to):
                                if let ids = candidates.removeValue(forKey: from) { candidates[to, default: []]?.formUnion(ids ?? []) }
                            default: break
                            }
                        }
                    }
                } catch where error.kind == .trimmed {
                    fromLog = false
                }
            }
            if !fromLog {
                for (i, n) in snapshot.nodes.enumerated() where n.kind == .regular {
                    let change = snapshot.change(ofNodeAt: i)
                    if change > synced || (legacy && (n.currentVersion ?? 0) > legacySynced) { candidates[n.ino] = .some(nil) }
                }
            }
            // Each node with the commit that last put it, by inode number.
            var nodes: [InodeNumber: (node: NodeRecord, change: ChangeSeq)] = [:]
            if !candidates.isEmpty {
                for (i, n) in snapshot.nodes.enumerated() where nodes[n.ino] == nil { nodes[n.ino] = (n, snapshot.change(ofNodeAt: i)) }
            }
            var whole: [BlobID: Bool] = [:]
            // A chunk counts as lost only if it fails twice (a read error is not a loss).
            func isWhole(_ v: VersionRecord) -> Bool {
                v.chunks.allSatisfy { c in
                    if let known = whole[c.blob] { return known }
                    let ok = blobs.verify(c) || blobs.verify(c)
                    whole[c.blob] = ok
                    return ok
                }
            }
            var checked = 0
            for (ino, ids) in candidates.sorted(by: { $0.key < $1.key }) {
                guard let (n, change) = nodes[ino], n.kind == .regular else { continue }
                let all = try metadata.versions(of: ino)
                let suspects = all.filter { ids == nil || ids!.contains($0.id) }
                checked += suspects.count
                let lost = suspects.filter { !isWhole($0) }
                if lost.isEmpty { continue }
                let lostIDs = Set(lost.map(\.id))
                var mutations: [Mutation] = lost.map { .deleteVersion($0.id) }
                var reverted: String?
                if let version = n.currentVersion, lostIDs.contains(version) {
                    // Back to the newest whole version of the file's own line (a recovered or
                    // conflict version is never made current by itself). A version a rename over
                    // another file moved in is content this file never held: only when the file
                    // has no whole version of its own does the name go back to what it held
                    // before that rename (as a disk that keeps a rename over a file only with the
                    // renamed file's content), rather than to nothing.
                    let usable = all.filter { !lostIDs.contains($0.id) && $0.origin != .recovered && $0.origin != .conflict }
                    let good = usable.last { $0.movedFrom == nil && $0.id < version } ?? usable.last { $0.movedFrom != nil }
                    var node = n
                    node.currentVersion = good?.id
                    node.size = good?.size ?? 0
                    mutations.insert(.putNode(node), at: 0)
                    reverted = "inode \(ino): version \(version) did not reach the disk before the machine stopped; "
                        + (good.map { "went back to version \($0.id)" } ?? "no whole version left, the file is now empty")
                }
                do {
                    try metadata.commit(Batch(mutations, expecting: [.nodeAt(ino: ino, change: change)], writer: writer),
                                        durable: false)
                } catch {
                    // Published again since (another writer verifying at once, or one that
                    // started after the stop and published): that content stands.
                    if error.kind == .conflict { continue }
                    throw error
                }
                if let reverted { repairs.append(reverted) }
                let others = lost.filter { $0.id != n.currentVersion }.map { String($0.id) }
                if !others.isEmpty {
                    repairs.append("inode \(ino): version\(others.count == 1 ? "" : "s") \(others.joined(separator: ", ")) "
                                   + "did not reach the disk before the machine stopped; removed from its history")
                }
            }
            repairs.insert("the machine stopped under \(max(stale.count, 1)) running writer\(stale.count > 1 ? "s" : "") "
                           + "after change \(synced), the last one synced: checked \(checked) version\(checked == 1 ? "" : "s") "
                           + "of \(candidates.count) file\(candidates.count == 1 ? "" : "s") committed since", at: 0)
            // Verified: the writers that stopped with the machine are gone (only now: a failure
            // above leaves the marks, so the next start verifies again).
            var done: [Mutation] = stale.map { .deleteMeta(key: $0) }
            if legacy { done.append(.deleteMeta(key: Self.legacyRunningKey)) }
            try metadata.commit(Batch(done, writer: writer), durable: true)
        }
        try metadata.commit(Batch([.setMeta(key: Self.runningKey(writer), value: boot)], writer: writer), durable: true)
        mutex.withLock { self.writer = writer }
        return repairs
    }

    public func sync() throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in
            let upTo = try position()
            if upTo <= syncedThrough { return }   // this writer's last sync covered it
            // Content first, then the mark, whose durable commit syncs every earlier commit.
            if othersMayHaveWritten(since: syncedThrough) {
                try blobs.syncAll()       // one syncfs: every chunk written so far, whoever wrote it
            } else {
                try blobs.syncWritten()   // the chunks this writer wrote since its last sync
            }
            let after = try metadata.commit(Batch([.setMeta(key: Self.syncedKey, value: String(upTo))]), durable: true)
            // Commits that landed during the syncfs may name chunks it did not cover: only with
            // none in between does the mark's own position count as synced.
            syncedThrough = after == upTo + 1 ? after : upTo
        }
    }

    /// Whether a commit after `seq` may name chunks another writer wrote: one of another
    /// writer that puts a version (other changes name no new chunk), or any commit when this is
    /// the first sync or the log cannot say (trimmed, unreadable). Caller holds `mutex`.
    private func othersMayHaveWritten(since seq: ChangeSeq) -> Bool {
        guard let writer, seq >= 0 else { return true }
        let records: [ChangeRecord]
        do { records = try metadata.changes(since: seq, notBy: writer) } catch { return true }   // a syncfs covers it all
        return records.contains { record in
            record.mutations.contains { if case .putVersion = $0 { true } else { false } }
        }
    }

    public func syncMetadata() throws(StoreError) {
        // A durable commit of an empty batch is the metadata store's barrier.
        try metadata.commit(Batch([]), durable: true)
    }

    public func end(writer: String) throws(StoreError) {
        try sync()
        try metadata.commit(Batch([.deleteMeta(key: Self.runningKey(writer))], writer: writer), durable: true)
    }
}
