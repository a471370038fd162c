// Opening the shared store: metadata, change log and locks on PostgreSQL; content chunks in
// PostgreSQL (`bytea`) or an S3-compatible object store; working copies, cached chunks and the
// queue of changes made while the servers are out of reach in a local folder of this machine
// (they are one writer's own, as in the embedded store).

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Where a shared store keeps its content chunks: chosen at `init-store`, recorded in the store.
public enum ChunkLocation: Sendable, Equatable, CustomStringConvertible {
    /// In the metadata database (`ubiquityfs.blobs`).
    case postgres
    /// In a bucket of an S3-compatible object store.
    case s3(S3Location)

    public var description: String {
        switch self {
        case .postgres: return "postgres"
        case .s3(let location): return location.description
        }
    }

    /// Whether both name the same chunks: the same database, or the same bucket and prefix
    /// (each machine may reach that bucket through an endpoint of its own).
    func isSamePlace(as other: ChunkLocation) -> Bool {
        switch (self, other) {
        case (.postgres, .postgres): return true
        case (.s3(let a), .s3(let b)): return a.bucket == b.bucket && a.prefix == b.prefix
        default: return false
        }
    }
}

/// Whether `location` names a shared store (a PostgreSQL URL) rather than a folder.
public func isSharedStoreURL(_ location: String) -> Bool {
    location.hasPrefix("postgres://") || location.hasPrefix("postgresql://")
}

/// Checks a shared store's URL before it is used: no password in it, a private password file.
public func checkSharedStoreURL(_ url: String) throws(StoreError) {
    try checkPostgresURL(url)
}

/// Parses `--chunks`: `postgres`, or `s3://BUCKET?endpoint=URL[&region=R][&prefix=P]`.
public func parseChunkLocation(_ text: String) throws(StoreError) -> ChunkLocation {
    if text == "postgres" || text == "postgresql" { return .postgres }
    if let s3 = try S3Location.parse(text) { return .s3(s3) }
    throw StoreError(errno: EINVAL, "--chunks takes 'postgres' or s3://BUCKET?endpoint=URL, not '\(text)'")
}

/// A shared store's commits and chunk writes are durable when they return (the server's commit,
/// the object store's PUT), so there is nothing to sync and nothing to repair after a power cut
/// of this machine; its working copies are recovered by the model, as the embedded store's are.
/// `begin` and `end` record the writer's presence, for the other machines.
final class SharedDurability: Durability, @unchecked Sendable {
    private let metadata: PostgresMetadataStore
    /// Opened out of reach: asking would wait out the timeout.
    private let unreached: Bool
    init(metadata: PostgresMetadataStore, unreached: Bool) {
        self.metadata = metadata
        self.unreached = unreached
    }
    func begin(writer: String, snapshot: StoreSnapshot) throws(StoreError) -> [String] {
        if unreached {
            // Announced once the servers answer.
            metadata.keepPresent(writer)
            return []
        }
        do { try metadata.announce(writer) } catch {
            if error.kind != .unavailable { throw error }
        }
        return []
    }
    func sync() throws(StoreError) {}
    func syncMetadata() throws(StoreError) {}
    func end(writer: String) throws(StoreError) {
        do { try metadata.withdraw(writer) } catch {
            // Stopped while out of reach (what it queued waits on this machine's disk): its
            // presence runs out with its lease instead.
            if error.kind != .unavailable { throw error }
        }
    }
}

/// This machine's working copies, in a local folder; other writers are alive when another daemon
/// here uses the folder or one runs on any machine of the store.
final class SharedWorkArea: WorkArea, @unchecked Sendable {
    let local: LocalWorkArea
    private let metadata: PostgresMetadataStore
    init(local: LocalWorkArea, metadata: PostgresMetadataStore) {
        self.local = local
        self.metadata = metadata
    }
    func create(ino: InodeNumber) throws(StoreError) -> any WorkFile { try local.create(ino: ino) }
    var bootID: String { local.bootID }
    func otherWritersAlive() -> Bool { local.otherWritersAlive() || metadata.othersPresent() }
    func leftovers() throws(StoreError) -> [RecoveredWork] { try local.leftovers() }
    func recoveryFinished() { local.recoveryFinished() }
}

/// Creates the schema (and what the chunk location needs) if missing, recording where chunks
/// live; refuses a newer schema, and a chunk location other than the recorded one. Returns what
/// it did, for the user.
public func initSharedStore(url: String, chunks: ChunkLocation, timeout: Double = 10) throws(StoreError) -> [String] {
    try checkPostgresURL(url)
    let c = PGConnection(PGTarget(url: url, timeout: timeout))
    let before = try schemaState(c)
    try checkSchema(c, url: url, create: true)
    let fresh = try c.query("INSERT INTO ubiquityfs.config(key, value) VALUES('chunks', $1) ON CONFLICT (key) DO NOTHING",
                            [.text(chunks.description)]).affected > 0
    let recorded = try recordedChunks(c, url: url)
    if !recorded.isSamePlace(as: chunks) {
        throw StoreError(errno: EINVAL, "\(redacted(url)) keeps its chunks in \(recorded), not \(chunks)")
    }
    var done: [String] = []
    if case .s3(let location) = chunks {
        let blobs = try S3BlobStore(location, timeout: timeout, ids: IDReserve { _ in 0...0 })
        let id = try storeID(c, url: url)
        let marker = (try? blobs.readMarker()) ?? nil
        if marker == id {
            done.append("the bucket \(location.bucket) at \(location.endpoint) is there already")
        } else if let marker {
            throw StoreError(errno: EINVAL, "the bucket \(location.bucket) at \(location.endpoint) holds another store's chunks "
                             + "(its marker says \(marker)): choose another bucket or prefix")
        } else {
            // A bucket (or a marker) is made only for the place this store records: not at another
            // endpoint, which may be another service with a bucket of the same name.
            guard fresh || recorded == chunks else {
                throw StoreError(errno: EINVAL, "\(location.endpoint) has no bucket \(location.bucket) with this store's chunks; "
                                 + "the store records \(recorded)")
            }
            let created = try blobs.client.createBucket()
            try blobs.writeMarker(id)
            done.append(created ? "created the bucket \(location.bucket) at \(location.endpoint)"
                                : "the bucket \(location.bucket) at \(location.endpoint) is there already")
        }
    }
    switch before {
    case .missing:
        done.insert("created a UbiquityFS store (schema version \(postgresSchemaVersion)) in \(redacted(url)), chunks in \(chunks)", at: 0)
    case .version(let v):
        done.insert("\(redacted(url)) already holds a UbiquityFS store (schema version \(v)), chunks in \(recorded)", at: 0)
    }
    return done
}

/// The store's own id, which its bucket's marker object repeats.
func storeID(_ c: PGConnection, url: String) throws(StoreError) -> String {
    let r = try c.query("SELECT value FROM ubiquityfs.config WHERE key = 'store_id'")
    guard r.count == 1 else { throw StoreError(.corrupt, "\(redacted(url)): the store has no id") }
    return r.text(0, 0)
}

/// Where the store at `url` keeps its chunks, as `init-store` recorded it.
func recordedChunks(_ c: PGConnection, url: String) throws(StoreError) -> ChunkLocation {
    let r = try c.query("SELECT value FROM ubiquityfs.config WHERE key = 'chunks'")
    guard r.count == 1 else { throw StoreError(.corrupt, "\(redacted(url)): the store does not say where its chunks are") }
    do { return try parseChunkLocation(r.text(0, 0)) } catch {
        throw StoreError(.corrupt, "\(redacted(url)): the store keeps its chunks in \(r.text(0, 0)), which this ubiquityfs cannot reach")
    }
}

/// How many bytes of chunks a machine keeps unless told otherwise (`--cache-size`).
public let defaultCacheLimit: Int64 = 10 << 30

/// Which store a local folder belongs to, kept in it (`store.json`): its queue, cached chunks,
/// copy of the namespace and reserved ids name that store's nodes and chunks, and no other's.
struct LocalIdentity: Codable, Equatable {
    var store: String
    var chunks: String

    static func read(_ path: String) throws(StoreError) -> LocalIdentity? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        do { return try JSONDecoder().decode(LocalIdentity.self, from: data) } catch {
            throw StoreError(.corrupt, "\(path) cannot be read: \(error)")
        }
    }

    func write(_ path: String) throws(StoreError) { try writeJSONDurably(self, to: path) }
}

/// Opens the shared store at `url`, with this machine's working copies in `localDirectory`
/// (made `0700`). `chunks`, when given, must be where the store keeps them. `lockLease`: how long
/// this machine's locks outlast its last word to the server (it dies, or its link is cut).
///
/// With the servers out of reach, a local folder that holds a copy of the store's namespace
/// (kept by an earlier daemon) opens from it, and changes are queued until they answer.
public func openSharedStore(url: String, chunks: ChunkLocation? = nil, localDirectory: String, timeout: Double = 10,
                            lockLease: Int = 15, cacheLimit: Int64 = defaultCacheLimit,
                            log: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) -> BackingStore {
    try makeDirectories(localDirectory, mode: 0o700)
    try tightenPermissions(of: localDirectory, log: log)
    let queueFolder = localDirectory + "/queue"
    let queueLock = try QueueLock(folder: queueFolder, log: log)
    let identityPath = localDirectory + "/store.json"
    let identity = try LocalIdentity.read(identityPath)
    // One account of whether the servers answer, kept by every connection and request.
    let reachability = Reachability()
    let metadata: PostgresMetadataStore
    var unreached = false
    do throws(StoreError) {
        metadata = try PostgresMetadataStore(url: url, timeout: timeout, capacityPath: localDirectory, create: false,
                                             reachability: reachability)
    } catch {
        guard error.kind == .unavailable, identity != nil, queueLock.held else {
            if error.kind == .unavailable && identity == nil {
                throw StoreError(error.kind, error.message + " (this machine has no copy of the store to start from: "
                                 + "it needs the servers once)")
            }
            if error.kind == .unavailable && !queueLock.held {
                throw StoreError(error.kind, error.message + " (another daemon on \(localDirectory) keeps this machine's "
                                 + "copy of the store, so this one cannot start from it)")
            }
            throw error
        }
        metadata = try PostgresMetadataStore(url: url, timeout: timeout, capacityPath: localDirectory, create: false,
                                             reachability: reachability, check: false)
        unreached = true
        log("the store's servers are out of reach (\(error.message)): starting from this machine's copy of its namespace; "
            + "changes are queued here until they answer")
    }
    let recorded: ChunkLocation
    let storeIdentifier: String
    if unreached, let identity {
        recorded = try parseChunkLocation(identity.chunks)
        storeIdentifier = identity.store
    } else {
        let (id, place) = try metadata.identity()
        recorded = place
        storeIdentifier = id
        if let identity, identity.store != id {
            throw StoreError(errno: EINVAL, "\(localDirectory) is this machine's folder for another store (id \(identity.store)), "
                             + "not for \(redacted(url)) (id \(id)): give another --local, or remove that folder "
                             + "if nothing queued in it is wanted")
        }
        let now = LocalIdentity(store: id, chunks: place.description)
        if queueLock.held && identity != now { try now.write(identityPath) }
    }
    if let chunks, !chunks.isSamePlace(as: recorded) {
        throw StoreError(errno: EINVAL, "\(redacted(url)) keeps its chunks in \(recorded); --chunks \(chunks) names another place")
    }
    // Ids reserved ahead are kept on disk by the daemon that owns the local folder's queue.
    let idsPath = { (name: String) -> String? in queueLock.held ? queueFolder + "/" + name + ".ids" : nil }
    // This machine's way to the chunks, when it gave one (its own endpoint of the same bucket).
    let remote: any RemoteChunks
    var checkBucket: () throws(StoreError) -> Void = {}
    switch chunks ?? recorded {
    case .postgres:
        remote = try PostgresBlobStore(url: url, timeout: timeout, connections: 4, reachability: reachability,
                                       idsPath: idsPath("chunks"))
    case .s3(let location):
        let s3 = try S3BlobStore(location, timeout: timeout,
                                 ids: IDReserve(path: idsPath("chunks")) { (count) throws(StoreError) in
                                     try metadata.reserveBlobs(count)
                                 },
                                 reachability: reachability,
                                 serverClock: { () throws(StoreError) in try metadata.serverNanoseconds() })
        // The bucket this machine reaches must be the store's: a wrong endpoint or a service with
        // a bucket of the same name would take chunks the other machines never find. Out of
        // reach, it is checked when the servers answer, before anything is uploaded.
        checkBucket = { () throws(StoreError) in
            let marker = try s3.readMarker()
            guard marker == storeIdentifier else {
                throw StoreError(errno: EINVAL, "the bucket \(location.bucket) at \(location.endpoint) "
                                 + (marker == nil ? "does not hold this store's chunks" : "holds another store's chunks")
                                 + ": check --chunks (the store records \(recorded))")
            }
        }
        if !unreached { try checkBucket() }
        remote = s3
    }
    // What a start out of reach could not check, checked at the servers' first answer: that the
    // address still holds this folder's store (not one made anew meanwhile).
    let firstContact = { () throws(StoreError) in
        try metadata.checkSchemaNow()
        let (id, _) = try metadata.identity()
        guard id == storeIdentifier else {
            throw StoreError(errno: EINVAL, "\(redacted(url)) now holds another store (id \(id)) than the one this machine's "
                             + "folder \(localDirectory) is for (id \(storeIdentifier)): what is queued there stays there")
        }
        try checkBucket()
    }
    let cache = try ChunkCache(remote: remote, directory: localDirectory + "/cache", limit: cacheLimit,
                               reachability: reachability, log: log)
    let work = SharedWorkArea(local: try LocalWorkArea(directory: localDirectory), metadata: metadata)
    let locks = try PostgresLockTable(url: url, timeout: timeout, leaseSeconds: lockLease, reachability: reachability, log: log)
    let replica = queueLock.held ? try LocalReplica(path: localDirectory + "/replica.sqlite", log: log) : nil
    let journal = try JournalingMetadataStore(inner: metadata, cache: cache, folder: queueFolder, lock: queueLock,
                                              replica: replica, unreached: unreached, firstContact: firstContact,
                                              idsPath: idsPath, log: log)
    return BackingStore(metadata: journal, blobs: cache, work: work, locks: locks,
                        durability: SharedDurability(metadata: metadata, unreached: unreached), localChunks: cache,
                        deletesChunksOfFailedCommits: false, offline: journal)
}
