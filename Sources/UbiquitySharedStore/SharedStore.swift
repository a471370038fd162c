// Opening the shared store: metadata, change log and locks on PostgreSQL; content chunks in
// PostgreSQL (`bytea`) or, later, an S3-compatible object store; working copies in a local folder
// of this machine (they are one writer's own, as in the embedded store).

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Where a shared store keeps its content chunks.
public enum ChunkLocation: Sendable, Equatable {
    /// In the metadata database (`ubiquityfs.blobs`).
    case postgres
}

/// Whether `location` names a shared store (a PostgreSQL URL) rather than a folder.
public func isSharedStoreURL(_ location: String) -> Bool {
    location.hasPrefix("postgres://") || location.hasPrefix("postgresql://")
}

/// Parses `--chunks`: `postgres` (the default).
public func parseChunkLocation(_ text: String?) throws(StoreError) -> ChunkLocation {
    switch text {
    case nil, "postgres", "postgresql": return .postgres
    case let other?:
        throw StoreError(errno: EINVAL, "--chunks takes 'postgres', not '\(other)'")
    }
}

/// A shared store's commits and chunk writes are durable when they return (the server's commit,
/// the object store's PUT), so there is nothing to sync and nothing to repair after a power cut
/// of this machine; its working copies are recovered by the model, as the embedded store's are.
final class SharedDurability: Durability, @unchecked Sendable {
    func begin(writer: String, snapshot: StoreSnapshot) throws(StoreError) -> [String] { [] }
    func sync() throws(StoreError) {}
    func syncMetadata() throws(StoreError) {}
    func end(writer: String) throws(StoreError) {}
}

/// Creates the schema (and what the chunk location needs) if missing; refuses a newer schema.
/// Returns what it did, for the user.
public func initSharedStore(url: String, chunks: ChunkLocation, timeout: Double = 10) throws(StoreError) -> [String] {
    try checkPostgresURL(url)
    let c = PGConnection(PGTarget(url: url, timeout: timeout))
    let before = try schemaState(c)
    try checkSchema(c, url: url, create: true)
    var done: [String] = []
    switch before {
    case .missing: done.append("created the UbiquityFS schema (version \(postgresSchemaVersion)) in \(redacted(url))")
    case .version(let v): done.append("\(redacted(url)) already holds a UbiquityFS store (schema version \(v))")
    }
    return done
}

/// Opens the shared store at `url`, with this machine's working copies in `localDirectory`
/// (made `0700`).
public func openSharedStore(url: String, chunks: ChunkLocation, localDirectory: String, timeout: Double = 10,
                            log: (String) -> Void = { _ in }) throws(StoreError) -> BackingStore {
    try makeDirectories(localDirectory, mode: 0o700)
    try tightenPermissions(of: localDirectory, log: log)
    let metadata = try PostgresMetadataStore(url: url, timeout: timeout, capacityPath: localDirectory)
    let blobs: any BlobStore
    switch chunks {
    case .postgres: blobs = try PostgresBlobStore(url: url, timeout: timeout)
    }
    let work = try LocalWorkArea(directory: localDirectory)
    let locks = try PostgresLockTable(url: url, timeout: timeout)
    return BackingStore(metadata: metadata, blobs: blobs, work: work, locks: locks, durability: SharedDurability())
}
