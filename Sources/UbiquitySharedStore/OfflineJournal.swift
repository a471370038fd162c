// Changes made while the shared store's servers are out of reach: queued on this machine, sent
// in order once they answer.
//
// The model commits as it always does. When a commit finds the servers gone, the batch goes to
// a journal in the local folder (one file per batch, synced before the commit returns) and the
// model is given the next position after the one it staged over, so it applies the batch to
// memory as usual. Later batches queue behind it, without trying the servers (each try could
// wait out the timeout). Chunks written meanwhile wait in the chunk cache's outbox; ids come
// from ranges reserved ahead while the servers answered.
//
// The change feed tries the servers every second. Once they answer: the outbox is uploaded, and
// each queued batch is committed with the expectations it was made with. Those that name a
// queued batch's position name where that batch landed instead. A batch already sent (its
// answer lost, or this daemon killed before it forgot it) is found by its token and not sent
// twice. Then the model must load the store again (its positions were this machine's own): the
// next `changes` says `.trimmed` and commits fail with `.conflict` until `load`.
//
// A batch whose expectations fail (another machine changed what it read) stops the sending:
// it and those after it are the model's to settle over the state of now (`OfflineQueue`), so
// that what the user wrote is kept beside what the other machine did, never over it.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// One queued batch, as kept on disk.
struct JournalEntry: Codable, Equatable {
    var id: UInt64
    /// The position the model was given for it.
    var position: ChangeSeq
    /// The token of its change-log row: whether it landed is looked up by it.
    var token: String
    /// The server process that had it when the answer to its COMMIT was lost (it may have
    /// landed: looked up by token once that process is gone).
    var backend: Int32?
    /// When it was made, in nanoseconds since the epoch.
    var made: Int64
    var writer: String
    var mutations: [Mutation]
    var expectations: [Expectation]
}

/// The journal's own record, kept beside the entries.
struct JournalState: Codable, Equatable {
    /// Queued positions follow on from this one (the position the first queued batch was staged over).
    var base: ChangeSeq = 0
    /// Where sent batches landed, by the position they were given.
    var landed: [ChangeSeq: ChangeSeq] = [:]
    /// For batches the model settled in parts: the nodes it put as the batch had them (an
    /// expectation of the batch's position holds for these alone).
    var partial: [ChangeSeq: [InodeNumber]] = [:]
    /// Sending stopped at a batch whose expectations failed: the rest are the model's to settle.
    var settling = false
    /// The model's position the first queued batch was staged over: the position this machine's
    /// copy of the namespace must hold for a start out of reach to show the queued changes over it.
    var over: ChangeSeq?
}

/// The `flock` of a local folder's queue: the daemon that holds it keeps the queue, the copy of
/// the namespace and the reserved ids; another daemon on the same folder keeps none of them.
final class QueueLock: @unchecked Sendable {
    private let fd: Int32?
    var held: Bool { fd != nil }

    init(folder: String, log: @Sendable (String) -> Void) throws(StoreError) {
        try makeDirectories(folder, mode: 0o700)
        let fd = open(folder + "/lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        if fd < 0 { throw StoreError(errno: errno, "cannot open \(folder)/lock") }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            close(fd)
            self.fd = nil
            log("another daemon on this machine's local folder keeps the queue of changes made out of reach of the "
                + "store; this one's changes fail while the servers do not answer")
            return
        }
        self.fd = fd
    }

    deinit { if let fd { close(fd) } }
}

final class JournalingMetadataStore: MetadataStore, OfflineQueue, @unchecked Sendable {
    let inner: PostgresMetadataStore
    private let cache: ChunkCache
    private let folder: String
    private let log: @Sendable (String) -> Void
    private let inodes: IDReserve
    private let versionIDs: IDReserve

    // `mutex` guards everything below. It is held while queued batches are sent, so commits
    // made meanwhile wait and keep their order behind them.
    private let mutex = StoreMutex()
    private var entries: [JournalEntry] = []   // oldest first
    private var state = JournalState()
    private var nextID: UInt64 = 1
    /// The queued batches were sent: the model's positions are its own until it loads again.
    private var mustReload = false
    /// Queued batches whose token was looked up in the change log and not found.
    private var checkedTokens: Set<UInt64> = []
    /// Files made or written by batches sent as they were made (see `takeSent`).
    private var sentFiles: Set<InodeNumber> = []
    /// The newest position the servers gave (commits, change log, load).
    private var known: ChangeSeq = 0
    /// When the servers were last tried while batches wait (monotonic nanoseconds).
    private var lastTry: UInt64 = 0
    static let retryInterval: UInt64 = 1_000_000_000
    /// The queue folder's lock, held while this store is open: one daemon's queue per folder.
    /// Not held when another daemon on this machine's local folder holds it: then this one
    /// queues nothing (its changes fail while the servers are out of reach).
    private let queueLock: QueueLock
    /// This machine's copy of the namespace (nil without the queue's lock).
    private let replica: LocalReplica?
    /// The servers have not answered since this daemon started from the copy of the namespace.
    private var unreached: Bool
    /// The checks a start out of reach left for the servers' first answer (that they are still
    /// this folder's store, and the bucket its bucket), run before anything is sent.
    private let firstContact: () throws(StoreError) -> Void
    private var contacted: Bool
    private var lastContactFailure = ""
    /// Chunks of queued batches checked on the servers (`ChunkCache.secure`) by this daemon, and
    /// those neither the servers nor this machine had.
    private var secured: Set<BlobID> = []
    private var missingChunks: Set<BlobID> = []
    private var lastSecureFailure = ""

    init(inner: PostgresMetadataStore, cache: ChunkCache, folder: String, lock: QueueLock, replica: LocalReplica?,
         unreached: Bool = false, firstContact: @escaping () throws(StoreError) -> Void = {},
         idsPath: (String) -> String? = { _ in nil }, log: @escaping @Sendable (String) -> Void) throws(StoreError) {
        self.inner = inner
        self.cache = cache
        self.folder = folder
        self.log = log
        queueLock = lock
        self.replica = replica
        self.unreached = unreached
        self.firstContact = firstContact
        contacted = !unreached
        inodes = try IDReserve(path: idsPath("inodes")) { (n) throws(StoreError) in
            let r = try inner.reserveInodes(n)
            return Int64(bitPattern: r.lowerBound)...Int64(bitPattern: r.upperBound)
        }
        versionIDs = try IDReserve(path: idsPath("versions")) { (n) throws(StoreError) in try inner.reserveVersions(n) }
        guard lock.held else { return }
        let decoder = JSONDecoder()
        let names: [String]
        do { names = try FileManager.default.contentsOfDirectory(atPath: folder) } catch {
            throw StoreError(errno: EIO, "cannot list the queue of changes in \(folder): \(error)")
        }
        for name in names.sorted() where name == "state.json" || name.hasSuffix(".batch") || name.hasSuffix(".tmp") {
            let path = folder + "/" + name
            if name.hasSuffix(".tmp") { _ = unlink(path); continue }   // a write a crash cut short
            guard let data = FileManager.default.contents(atPath: path) else { continue }
            if name == "state.json" {
                do { state = try decoder.decode(JournalState.self, from: data) } catch {
                    throw StoreError(.corrupt, "the queue of changes in \(folder) cannot be read (\(name)): \(error)")
                }
            } else if name.hasSuffix(".batch") {
                do { entries.append(try decoder.decode(JournalEntry.self, from: data)) } catch {
                    throw StoreError(.corrupt, "the queue of changes in \(folder) cannot be read (\(name)): \(error)")
                }
            }
        }
        entries.sort { $0.id < $1.id }
        nextID = (entries.last?.id ?? 0) + 1
        if entries.isEmpty {
            // A state left by a crash after the last entry went (settling with nothing to settle).
            if state != JournalState() {
                state = JournalState()
                try saveState()
            }
            // Chunks a crash left in the outbox with no batch naming them: their batch landed,
            // or never was; either way nothing waits for them.
            cache.landed(cache.outboxIDs)
        }
        if !entries.isEmpty {
            log("\(entries.count) change\(entries.count == 1 ? "" : "s") made while the store was out of reach "
                + (state.settling ? "wait to be settled" : "wait to be sent"))
        }
    }

    public func prepare() throws(StoreError) {
        // Out of reach, asking would wait out the timeout: the ids kept on disk serve meanwhile.
        if mutex.withLock({ unreached }) { return }
        do throws(StoreError) {
            try inodes.prime()
            try versionIDs.prime()
            try cache.remote.primeIDs()
        } catch {
            // Started out of reach with no ids kept: files can be made once the servers answer.
            guard error.kind == .unavailable, mutex.withLock({ unreached }) else { throw error }
            log("no ids are reserved ahead on this machine: new files cannot be made until the servers answer")
        }
    }

    // MARK: The journal on disk

    private func entryPath(_ id: UInt64) -> String {
        folder + "/" + String(repeating: "0", count: max(0, 20 - String(id).count)) + String(id) + ".batch"
    }

    private func saveState() throws(StoreError) {
        try writeJSONDurably(state, to: folder + "/state.json")
    }

    /// Forgets the oldest entry, which landed at `seq` (nil: it was settled with nothing
    /// committed) with `nodes` as it had them (nil: all). The state first: a crash before the
    /// entry goes leaves it to be found by its token.
    private func forgetFirst(landedAt seq: ChangeSeq?, nodes: Set<InodeNumber>? = nil,
                             releasing release: Bool = true) throws(StoreError) {
        let e = entries.removeFirst()
        if let seq {
            state.landed[e.position] = seq
            if let nodes { state.partial[e.position] = nodes.sorted() }
        }
        if entries.isEmpty { state = JournalState() }
        try saveState()
        if unlink(entryPath(e.id)) != 0 && errno != ENOENT {
            throw StoreError(errno: errno, "cannot remove \(entryPath(e.id))")
        }
        try fsyncDirectory(folder)
        if release {
            cache.named(Self.chunks(of: e.mutations))
            cache.landed(stillUnnamed(Self.chunks(of: e.mutations)))
        }
    }

    /// Those of `chunks` no queued batch names (they may leave the outbox). Caller holds mutex.
    private func stillUnnamed(_ chunks: [BlobID]) -> [BlobID] {
        guard !entries.isEmpty else { return chunks }
        var named: Set<BlobID> = []
        for e in entries { named.formUnion(Self.chunks(of: e.mutations)) }
        return chunks.filter { !named.contains($0) }
    }

    /// The chunks the versions of `mutations` name.
    static func chunks(of mutations: [Mutation]) -> [BlobID] {
        var out: [BlobID] = []
        for case .putVersion(let v) in mutations { out += v.chunks.lazy.filter { !$0.isHole }.map(\.blob) }
        return out
    }

    /// Queues `batch` (`backend`: the server process that had its COMMIT when the answer was
    /// lost); returns the position the model gets for it. Caller holds mutex.
    private func enqueue(_ batch: Batch, token: String, backend: Int32? = nil) throws(StoreError) -> ChangeSeq {
        try cache.hold(Self.chunks(of: batch.mutations))
        let after = max(batch.position > 0 ? batch.position : known, entries.last?.position ?? 0)
        if entries.isEmpty {
            state = JournalState(base: after, over: batch.position > 0 ? batch.position : nil)
            // The copy of the namespace these changes build on goes to disk first.
            if let replica, let over = state.over {
                let held = replica.settle()
                if held != over {
                    log("this machine's copy of the namespace is at \(held.map(String.init) ?? "no position"), not at \(over) "
                        + "where the queued changes start: a start out of reach is refused until the servers answer")
                }
            }
            try saveState()
        }
        let e = JournalEntry(id: nextID, position: after + 1, token: token, backend: backend, made: nowNanoseconds(),
                             writer: batch.writer, mutations: batch.mutations, expectations: batch.expectations)
        try writeJSONDurably(e, to: entryPath(e.id))
        nextID += 1
        entries.append(e)
        if entries.count == 1 {
            log("the store is out of reach: changes are queued on this machine and sent when it answers")
        }
        return e.position
    }

    /// The expectations of a queued batch in positions of the servers: a queued position names
    /// where that batch landed, or one no node has (the batch did not land as it was).
    private func translated(_ expectations: [Expectation]) -> [Expectation] {
        expectations.map { e in
            guard case .nodeAt(let ino, let change) = e, change > state.base else { return e }
            guard let seq = state.landed[change], state.partial[change].map({ $0.contains(ino) }) ?? true else {
                return .nodeAt(ino: ino, change: -1)
            }
            return .nodeAt(ino: ino, change: seq)
        }
    }

    /// See `ChunkCache.secure`; what neither the servers nor this machine have is named in the
    /// log (those parts of the file read `EIO`). Caller holds mutex.
    private func secureChunks(of e: JournalEntry) throws(StoreError) {
        let ids = Self.chunks(of: e.mutations)
        let unchecked = ids.filter { !secured.contains($0) }
        if !unchecked.isEmpty {
            missingChunks.formUnion(try cache.secure(unchecked))
            secured.formUnion(unchecked)
        }
        let lost = Set(ids).intersection(missingChunks)
        guard !lost.isEmpty else { return }
        for case .putVersion(let v) in e.mutations {
            let n = v.chunks.filter { lost.contains($0.blob) }.count
            if n > 0 {
                log("version \(v.id) of inode \(v.ino), saved while the store was out of reach, names \(n) chunk\(n == 1 ? "" : "s") "
                    + "of its earlier content that another machine freed meanwhile and this machine has no copy of: "
                    + "those parts read EIO")
            }
        }
    }

    private var waitingToSend: Bool { !entries.isEmpty && !state.settling }
    /// What the model sees is this machine's alone: queued changes, or a start out of reach.
    private var offlineView: Bool { waitingToSend || unreached }

    /// Sends the queued batches in order, each after the chunks it names. Caller holds mutex.
    /// Throws when the servers do not answer (what is left stays queued).
    private func send() throws(StoreError) {
        if unreached {
            // The first word from the servers since a start out of reach (`sendIfDue` ran the
            // checks that start left).
            guard contacted else { throw StoreError(.unavailable, "the store's servers were not checked yet") }
            inner.renewPresence()
            unreached = false
            log("the store's servers answer: what changed meanwhile is loaded")
        }
        var sent = 0
        while let e = entries.first, !state.settling {
            // Sent before (the answer lost, or this daemon stopped before forgetting it)?
            if let seq = try inner.landed(token: e.token, backend: e.backend ?? 0) {
                try forgetFirst(landedAt: seq)
                sent += 1
                continue
            }
            if e.backend != nil {
                // That server process is gone and the batch did not land: never end that
                // process number again (it may be another session's by now).
                entries[0].backend = nil
                try writeJSONDurably(entries[0], to: entryPath(e.id))
            }
            try cache.upload(Self.chunks(of: e.mutations))
            try secureChunks(of: e)
            var unknown: Int32?
            let seq: ChangeSeq
            do throws(StoreError) {
                seq = try inner.commit(Batch(e.mutations, expecting: translated(e.expectations), writer: e.writer),
                                       token: e.token, unknownOutcome: &unknown)
            } catch {
                if error.kind == .unavailable {
                    if let unknown {
                        // It may have landed: the token says so at the next try, once that
                        // server process is gone.
                        entries[0].backend = unknown
                        try writeJSONDurably(entries[0], to: entryPath(e.id))
                    }
                    throw error
                }
                // What it expected no longer holds (or the server refuses it): the model settles
                // it, and the rest after it, over the state of now.
                state.settling = true
                try saveState()
                log("a change made while the store was out of reach no longer applies as it was (\(error.message)); "
                    + "it and the \(entries.count - 1) after it are settled beside what the other machines did")
                break
            }
            known = max(known, seq)
            for m in e.mutations {
                if case .putVersion(let v) = m { sentFiles.insert(v.ino) }
                if case .putDirent(let d) = m { sentFiles.insert(d.child) }
            }
            try forgetFirst(landedAt: seq)
            sent += 1
        }
        if sent > 0 {
            log("sent \(sent) change\(sent == 1 ? "" : "s") made while the store was out of reach")
            // The copy no longer shows them, until the load that follows replaces it.
            replica?.invalidate()
        }
        mustReload = true
    }

    public func sendIfDue() {
        let now = monotonicNanoseconds()
        let due = mutex.withLock { () -> Bool in
            guard offlineView || (state.settling && cache.waiting.chunks > 0), now &- lastTry >= Self.retryInterval else {
                return false
            }
            lastTry = now
            return true
        }
        // The probe and the chunks go without the mutex: they may take long, and commits must
        // not wait for them.
        guard due, inner.probe() else { return }
        if !mutex.withLock({ contacted }) {
            do throws(StoreError) { try firstContact() } catch {
                let message = error.message
                let fresh = mutex.withLock { () -> Bool in
                    defer { lastContactFailure = message }
                    return lastContactFailure != message
                }
                if fresh { log("the store's servers answer, but nothing is sent to them: \(message)") }
                return
            }
            mutex.withLock { contacted = true }
        }
        do throws(StoreError) { try cache.upload() } catch {
            log("uploading the chunks written while the store was out of reach failed; tried again later: \(error.message)")
            return
        }
        // The earlier content queued batches name, checked once, without the mutex (a round
        // trip per chunk: commits must not wait for them).
        let unchecked = mutex.withLock { Array(Set(entries.flatMap { Self.chunks(of: $0.mutations) }).subtracting(secured)) }
        if !unchecked.isEmpty {
            do throws(StoreError) {
                let lost = try cache.secure(unchecked)
                mutex.withLock {
                    secured.formUnion(unchecked)
                    missingChunks.formUnion(lost)
                }
            } catch {
                log("checking the chunks of the changes made while the store was out of reach failed; tried again later: "
                    + error.message)
                return
            }
        }
        mutex.withLock {
            guard offlineView else { return }
            do throws(StoreError) { try send() } catch {
                log("sending the changes made while the store was out of reach failed; tried again later: \(error.message)")
            }
        }
    }

    // MARK: MetadataStore

    public func load() throws(StoreError) -> StoreSnapshot {
        let local = try mutex.withLock { () throws(StoreError) -> StoreSnapshot? in
            if unreached { return try fromReplica() }
            if waitingToSend {
                do throws(StoreError) { try send() } catch {
                    if error.kind == .unavailable, replica != nil { return try fromReplica() }
                    let n = entries.count
                    throw StoreError(error.kind, "\(n) change\(n == 1 ? "" : "s") made while the store was out of reach "
                                     + "wait to be sent, and sending failed: \(error.message)")
                }
            }
            return nil
        }
        if let local { return local }
        let s = try inner.load()
        replica?.reset(to: s)
        mutex.withLock {
            mustReload = false
            known = max(known, s.seq)
        }
        return s
    }

    /// The namespace as this machine last knew it, for a start out of reach; queued batches
    /// come after it through `changes`. Caller holds mutex.
    private func fromReplica() throws(StoreError) -> StoreSnapshot {
        guard let snapshot = try replica?.load() else {
            throw StoreError(.unavailable, "the store's servers are out of reach, and this machine has no whole copy of its "
                             + "namespace to start from")
        }
        // The queued batches must follow on from the copy: none sent yet, made over its position.
        if waitingToSend,
           state.over != snapshot.seq || !state.landed.isEmpty || entries.first?.position != state.base + 1 {
            throw StoreError(.unavailable, "the store's servers are out of reach, and this machine's copy of the namespace "
                             + "(at \(snapshot.seq)) is not the state its queued changes were made over "
                             + "(\(state.over.map(String.init) ?? "unknown")\(state.landed.isEmpty ? "" : ", some already sent")): "
                             + "they wait for the servers")
        }
        unreached = true
        mustReload = false
        known = max(known, snapshot.seq)
        return snapshot
    }

    public func commit(_ batch: Batch, durable: Bool) throws(StoreError) -> ChangeSeq {
        try mutex.withLock { () throws(StoreError) -> ChangeSeq in
            if mustReload {
                if batch.mutations.isEmpty { return known }
                throw StoreError(.conflict, "the changes made while the store was out of reach were sent: the namespace is loaded again first")
            }
            let token = batch.token ?? UUID().uuidString
            if waitingToSend {
                // Behind the queued batches, in order (a barrier has nothing to wait for: the
                // journal is on disk).
                return batch.mutations.isEmpty ? entries.last!.position : try enqueue(batch, token: token)
            }
            let queues = queueLock.held && !batch.mutations.isEmpty && !state.settling
            if unreached {
                // Started out of reach: queued at once, as behind queued batches.
                if batch.mutations.isEmpty { return known }
                guard queues else { throw StoreError(.unavailable, "the store is out of reach") }
                return try enqueue(batch, token: token)
            }
            var unknown: Int32?
            do throws(StoreError) {
                // Chunks of this batch written while the servers were out of reach (or when an
                // upload failed) go first.
                let chunks = Self.chunks(of: batch.mutations)
                if cache.waiting.chunks > 0 { try cache.upload(chunks) }
                let seq = try inner.commit(batch, token: token, unknownOutcome: &unknown)
                known = max(known, seq)
                if !batch.mutations.isEmpty {
                    replica?.committed(ChangeRecord(seq: seq, writer: batch.writer, mutations: batch.mutations))
                }
                cache.named(chunks)
                if cache.waiting.chunks > 0 { cache.landed(stillUnnamed(chunks)) }
                return seq
            } catch {
                // While queued batches are being settled, a change that cannot be sent fails.
                guard error.kind == .unavailable, queues else { throw error }
                return try enqueue(batch, token: token, backend: unknown)
            }
        }
    }

    public func changes(since seq: ChangeSeq) throws(StoreError) -> [ChangeRecord] {
        let queued: [ChangeRecord]? = try mutex.withLock { () throws(StoreError) -> [ChangeRecord]? in
            if mustReload {
                throw StoreError(.trimmed, "the changes made while the store was out of reach were sent: load the namespace again")
            }
            guard offlineView else { return nil }
            guard waitingToSend else { return [] }
            return entries.filter { $0.position > seq }.map { ChangeRecord(seq: $0.position, writer: $0.writer, mutations: $0.mutations) }
        }
        if let queued { return queued }
        let records = try inner.changes(since: seq)
        replica?.read(records, after: seq)
        if let last = records.last { mutex.withLock { known = max(known, last.seq) } }
        return records
    }

    /// While batches wait to be sent the servers are out of reach: what only they know fails
    /// at once rather than after the timeout.
    private func unlessQueued() throws(StoreError) {
        if mutex.withLock({ offlineView }) {
            throw StoreError(.unavailable, "the store is out of reach (changes made here are queued)")
        }
    }

    public func trimChanges(keepingLast count: Int) throws(StoreError) {
        try unlessQueued()
        try inner.trimChanges(keepingLast: count)
    }

    public func reserveInodes(_ count: Int) throws(StoreError) -> ClosedRange<InodeNumber> {
        let r = try inodes.take(count, online: !mutex.withLock { offlineView })
        return InodeNumber(bitPattern: r.lowerBound)...InodeNumber(bitPattern: r.upperBound)
    }

    public func reserveVersions(_ count: Int) throws(StoreError) -> ClosedRange<VersionID> {
        try versionIDs.take(count, online: !mutex.withLock { offlineView })
    }

    public func versions(of ino: InodeNumber) throws(StoreError) -> [VersionRecord] {
        try unlessQueued()
        return try inner.versions(of: ino)
    }

    public func versionCount(of ino: InodeNumber) throws(StoreError) -> Int {
        try unlessQueued()
        return try inner.versionCount(of: ino)
    }

    public func version(_ id: VersionID) throws(StoreError) -> VersionRecord? {
        if mutex.withLock({ offlineView }) {
            // A current version (a recovered working copy's base, say) is in the copy of the namespace.
            if let v = replica?.version(id) { return v }
            try unlessQueued()
        }
        return try inner.version(id)
    }

    public func versions(withOrigin origin: VersionOrigin) throws(StoreError) -> [VersionRecord] {
        try unlessQueued()
        return try inner.versions(withOrigin: origin)
    }

    public func allVersions() throws(StoreError) -> [VersionRecord] {
        try unlessQueued()
        return try inner.allVersions()
    }

    public func capacity() -> StoreCapacity { inner.capacity() }

    /// With the chunks queued batches name: they are not garbage, only not yet named on the servers.
    public func referencedBlobs() throws(StoreError) -> Set<BlobID> {
        try unlessQueued()
        var out = try inner.referencedBlobs()
        mutex.withLock { for e in entries { out.formUnion(Self.chunks(of: e.mutations)) } }
        return out
    }

    public func waitForChanges(_ seconds: Double) {
        if mutex.withLock({ offlineView }) { Thread.sleep(forTimeInterval: seconds) } else { inner.waitForChanges(seconds) }
    }

    public func reachability() -> StoreReachability? { inner.reachability() }

    // MARK: OfflineQueue

    public var queued: QueueState {
        let (chunks, bytes) = cache.waiting
        return mutex.withLock {
            QueueState(changes: state.settling ? 0 : entries.count, chunks: chunks, bytes: bytes,
                       since: entries.first?.made ?? 0, unsettled: state.settling ? entries.count : 0,
                       fromLocalCopy: unreached)
        }
    }

    public func nextUnsettled() -> QueuedBatch? {
        mutex.withLock { () -> QueuedBatch? in
            while state.settling, !mustReload, let e = entries.first {
                // Settled before a crash, before the queue could forget it? Its token says (asked
                // once per batch: this is called a few times a second while one waits).
                var landed: ChangeSeq?
                if !checkedTokens.contains(e.id) {
                    do throws(StoreError) { landed = try inner.landed(token: e.token, backend: 0) } catch { return nil }
                    if landed == nil { checkedTokens.insert(e.id) }
                }
                guard let landed else {
                    do throws(StoreError) { try secureChunks(of: e) } catch {
                        if error.message != lastSecureFailure {
                            log("checking the chunks of a change made while the store was out of reach failed: \(error.message)")
                        }
                        lastSecureFailure = error.message
                        return nil
                    }
                    return QueuedBatch(id: e.id, batch: Batch(e.mutations, expecting: translated(e.expectations), writer: e.writer,
                                                              token: e.token))
                }
                // Which of its nodes it put as they were is no longer known: none, to be safe.
                do throws(StoreError) { try forgetFirst(landedAt: landed, nodes: []) } catch { return nil }
            }
            return nil
        }
    }

    public func takeSent() -> Set<InodeNumber> {
        mutex.withLock { () -> Set<InodeNumber> in
            guard !mustReload else { return [] }
            defer { sentFiles = [] }
            return sentFiles
        }
    }

    public func setAside(_ id: UInt64) {
        mutex.withLock {
            guard let e = entries.first, e.id == id else { return }
            let aside = folder + "/set-aside"
            let target = aside + "/" + (entryPath(id) as NSString).lastPathComponent
            do throws(StoreError) {
                try makeDirectories(aside, mode: 0o700)
                guard rename(entryPath(id), target) == 0 else {
                    throw StoreError(errno: errno, "cannot move \(entryPath(id)) to \(aside)")
                }
                try fsyncDirectory(folder)
                // Its chunks stay in the outbox (kept on this machine): the file names them.
                try forgetFirst(landedAt: nil, releasing: false)
                log("a change made while the store was out of reach could not be settled; it is kept in \(target)")
            } catch {
                log("a change made while the store was out of reach could not be settled, nor set aside: \(error.message)")
            }
        }
    }

    public func settled(_ id: UInt64, at seq: ChangeSeq?, nodes: Set<InodeNumber>?) throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in
            guard entries.first?.id == id else { return }
            try forgetFirst(landedAt: seq, nodes: nodes)
            if entries.isEmpty { log("every change made while the store was out of reach is settled") }
        }
    }

}
