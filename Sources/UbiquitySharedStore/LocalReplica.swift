// This machine's copy of the shared store's namespace, so that a daemon can start while the
// servers are out of reach (a laptop opened on a train) and show what it last knew.
//
// It follows exactly the stream the model applies: what `load` returned, then every record the
// change log gave and every commit of this machine, in log order. So at any moment it holds the
// servers' state at one position, the position the model was at. Writes go to an embedded
// SQLite database in the local folder, from a queue of their own: the model never waits for
// them, except when the first change is queued (`settle`), which is the state queued changes
// build on and must be on disk before they are.

import Foundation
import UbiquityStore

final class LocalReplica: @unchecked Sendable {
    private let db: SQLiteMetadataStore
    private let queue = DispatchQueue(label: "ubiquityfs.replica")
    private let log: @Sendable (String) -> Void
    // Guarded by `queue`:
    /// The position held, nil when the copy is not whole.
    private var position: ChangeSeq?
    /// This machine's commits that came before the records between them and `position`.
    private var ahead: [ChangeSeq: ChangeRecord] = [:]
    /// Held as it is for queued changes (`settle`) until the next `reset`.
    private var frozen = false
    /// Commits waiting for a gap that never fills this long mean the copy lost its way.
    static let aheadLimit = 10_000

    init(path: String, log: @escaping @Sendable (String) -> Void) throws(StoreError) {
        db = try SQLiteMetadataStore(path: path)
        self.log = log
        position = try db.replicaPosition()
    }

    /// The store was loaded whole at `snapshot.seq`.
    func reset(to snapshot: StoreSnapshot) {
        queue.async { [self] in
            ahead = [:]
            frozen = false
            guard perform({ () throws(StoreError) in try db.replace(with: snapshot) }) else { return }
            position = snapshot.seq
        }
    }

    /// The change log gave `records`, every commit after `since`.
    func read(_ records: [ChangeRecord], after since: ChangeSeq) {
        guard !records.isEmpty else { return }
        queue.async { [self] in
            guard let held = position, !frozen else { return }
            if since > held { return lost("the change log was read from \(since), past the copy's \(held)") }
            apply(records.filter { $0.seq > held })
        }
    }

    /// This machine committed `record`.
    func committed(_ record: ChangeRecord) {
        queue.async { [self] in
            guard let held = position, !frozen, record.seq > held else { return }
            if record.seq == held + 1 { return apply([record]) }
            ahead[record.seq] = record
            if ahead.count > Self.aheadLimit { lost("\(ahead.count) commits wait for the records before them") }
        }
    }

    /// Waits for every write so far and makes them durable; the position now held, which stays
    /// until the next `reset` (it is the state the queued changes build on).
    func settle() -> ChangeSeq? {
        queue.sync { () -> ChangeSeq? in
            guard position != nil else { return nil }
            frozen = true
            // An empty durable commit is a barrier: everything before it is on disk.
            guard perform({ () throws(StoreError) in _ = try db.commit(Batch([], writer: "replica"), durable: true) }) else {
                return nil
            }
            return position
        }
    }

    /// The state held, or nil when there is no whole copy.
    func load() throws(StoreError) -> StoreSnapshot? {
        let result = queue.sync { () -> Result<StoreSnapshot?, StoreError> in
            guard position != nil else { return .success(nil) }
            do throws(StoreError) { return .success(try db.loadReplica()) } catch { return .failure(error) }
        }
        return try result.get()
    }

    /// The changes queued over the copy were sent: it no longer shows what this machine did,
    /// so it is not whole until the next `reset`.
    func invalidate() {
        queue.sync { lost(nil) }
    }

    /// A version the copy holds: the current ones, and those made since it was loaded.
    func version(_ id: VersionID) -> VersionRecord? {
        queue.sync { try? db.version(id) }
    }

    // Called on `queue`.

    private func apply(_ records: [ChangeRecord]) {
        guard var last = records.last?.seq else { return }
        var run = records
        // This machine's commits that the records reached.
        ahead = ahead.filter { $0.key > last }
        while let next = ahead.removeValue(forKey: last + 1) {
            run.append(next)
            last = next.seq
        }
        guard perform({ () throws(StoreError) in try db.replicate(run) }) else { return }
        position = last
    }

    private func lost(_ why: String?) {
        if let why {
            log("this machine's copy of the namespace is dropped (\(why)); it is made again at the next start "
                + "with the servers in reach")
        }
        ahead = [:]
        frozen = false
        position = nil
        try? db.dropReplicaPosition()
    }

    /// Runs a write; a failure drops the copy (it would no longer be one position's state).
    private func perform(_ body: () throws(StoreError) -> Void) -> Bool {
        do throws(StoreError) { try body() } catch {
            lost("writing it failed: \(error.message)")
            return false
        }
        return true
    }
}
