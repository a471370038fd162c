// What `--store` names: the embedded store's folder, or a shared store's PostgreSQL URL.
//
// Every store has a folder on this machine. The embedded store is its folder. A shared store has
// a local folder of its own (`--local`, by default one per URL under $XDG_DATA_HOME) holding this
// machine's working copies, the daemon's log, pid and control socket, and a `shared-store` file
// naming the URL, so that commands given only the folder (a mount's `user.ubiquityfs.store`) find
// the store again.

import Foundation
import UbiquityFileSystem
import UbiquitySharedStore
import UbiquityStore

/// What a shared store's local folder records about it.
struct SharedStoreRecord: Codable, Equatable {
    var url: String
    /// As `--chunks` gave it (nil: wherever the store says).
    var chunks: String?
    /// The mount's `--cache-size`, so that a command that opens the store itself keeps to it.
    var cacheSize: Int64?
}

let sharedStoreFile = "shared-store"

/// The default local folder of the shared store at `url`: readable, one per server and database.
func defaultLocalFolder(for url: String) -> String {
    let env = ProcessInfo.processInfo.environment
    let base = env["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? (home() + "/.local/share")
    var key = url.split(separator: "?", maxSplits: 1).first.map(String.init) ?? url
    if let scheme = key.range(of: "://") { key = String(key[scheme.upperBound...]) }
    let safe = String(key.map { $0.isLetter || $0.isNumber || $0 == "." || $0 == "-" || $0 == "@" ? $0 : "_" })
    return base + "/ubiquityfs-shared/" + (safe.isEmpty ? "default" : safe)
}

/// The folder `--store` (with `--local` and `--chunks`) names; for a shared store its local
/// folder, made if missing and recording the URL.
func storeFolder(_ p: Parsed) throws -> String {
    guard let store = p.value("--store"), isSharedStoreURL(store) else {
        if p.value("--local") != nil { throw UsageError(message: "--local is for a shared store (--store postgres://…)") }
        if p.value("--chunks") != nil { throw UsageError(message: "--chunks is for a shared store (--store postgres://…)") }
        return absolutePath(p.value("--store") ?? defaultStoreDirectory())
    }
    let chunks = p.value("--chunks")
    do {
        try checkSharedStoreURL(store)
        if let chunks { _ = try parseChunkLocation(chunks) }
    } catch {
        throw UsageError(message: error.message)
    }
    let folder = absolutePath(p.value("--local") ?? defaultLocalFolder(for: store))
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true,
                                            attributes: [.posixPermissions: 0o700])
    let path = folder + "/" + sharedStoreFile
    let existing = sharedStore(in: folder)
    if let existing, existing.url != store {
        throw UsageError(message: "\(folder) is the local folder of another shared store (\(existing.url)); give this one its own with --local DIR")
    }
    // What this command gives replaces what an earlier one recorded; the rest stays.
    var record = existing ?? SharedStoreRecord(url: store)
    if let chunks { record.chunks = chunks }
    if let size = p.value("--cache-size").flatMap({ RetentionPolicy.bytes($0) }) { record.cacheSize = Int64(size) }
    if existing != record {
        let data = try JSONEncoder().encode(record)
        guard FileManager.default.createFile(atPath: path, contents: data, attributes: [.posixPermissions: 0o600]) else {
            throw UsageError(message: "cannot write \(path)")
        }
    }
    return folder
}

/// The shared store whose local folder `folder` is, if it is one.
func sharedStore(in folder: String) -> SharedStoreRecord? {
    guard let data = FileManager.default.contents(atPath: folder + "/" + sharedStoreFile) else { return nil }
    return try? JSONDecoder().decode(SharedStoreRecord.self, from: data)
}

/// Whether `folder` holds a store (or is a shared store's local folder) that commands may open.
func hasStore(_ folder: String) -> Bool {
    sharedStore(in: folder) != nil || FileManager.default.fileExists(atPath: folder + "/metadata.sqlite3")
}

/// What to show for the store of `folder` (a shared store by its URL).
func storeLabel(_ folder: String) -> String {
    sharedStore(in: folder).map { $0.url } ?? folder
}

/// Opens the store of `folder` as a daemon does.
func openStore(_ folder: String, lockLease: Int = 15, timeout: Double = 10,
               log: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) -> BackingStore {
    if let shared = sharedStore(in: folder) {
        return try openSharedStore(url: shared.url, chunks: try shared.chunks.map { (c) throws(StoreError) in try parseChunkLocation(c) },
                                   localDirectory: folder, timeout: timeout, lockLease: lockLease,
                                   cacheLimit: shared.cacheSize ?? defaultCacheLimit, log: log)
    }
    return try openEmbeddedStore(directory: folder, log: log)
}

/// The metadata of the store of `folder`, to read while a daemon may serve it (changes nothing).
func readOnlyMetadata(_ folder: String) throws -> any MetadataStore {
    if let shared = sharedStore(in: folder) { return try PostgresMetadataStore(url: shared.url) }
    let db = folder + "/metadata.sqlite3"
    guard FileManager.default.fileExists(atPath: db) else { throw UsageError(message: "no store in \(folder)") }
    return try SQLiteMetadataStore(readOnlyPath: db)
}

/// The registered containers of the store of `folder` ([] when it has no store yet).
func registeredContainers(_ folder: String) throws -> [ContainerRecord] {
    guard hasStore(folder) else { return [] }
    let metadata = try readOnlyMetadata(folder)
    if let sqlite = metadata as? SQLiteMetadataStore { return try sqlite.containers() }
    if let shared = metadata as? PostgresMetadataStore { return try shared.containers() }
    return try metadata.load().containers
}

// MARK: - init-store

let initStoreCommand = Subcommand(
    name: "init-store",
    summary: "create a shared store: its tables in a PostgreSQL database, and where its chunks live",
    usage: "init-store --store postgres://USER@HOST[:PORT]/DATABASE [--chunks postgres|s3://BUCKET?endpoint=URL]",
    options: [
        ("--store=", "the PostgreSQL URL, without a password (it comes from ~/.pgpass, PGPASSFILE or PGPASSWORD)"),
        ("--chunks=", "where content chunks live: postgres (in the database itself; the default) or s3://BUCKET?endpoint=URL[&region=R][&prefix=P]"),
    ],
    positionals: 0...0,
    run: { p in
        guard let url = p.value("--store"), isSharedStoreURL(url) else {
            throw UsageError(message: "init-store needs --store postgres://USER@HOST/DATABASE (an embedded store needs no set-up)")
        }
        do throws(StoreError) {
            try checkSharedStoreURL(url)
            let chunks = try parseChunkLocation(p.value("--chunks") ?? "postgres")
            for line in try initSharedStore(url: url, chunks: chunks) { writeOut(line) }
        } catch {
            writeError("ubiquityfs init-store: \(error.message)")
            return ExitCode.failure
        }
        return ExitCode.success
    })

// MARK: - evict and pin

private func contentCommand(_ name: String, summary: String) -> Subcommand {
    Subcommand(
        name: name,
        summary: summary,
        usage: "\(name) PATH | \(name) --store URL [--local DIR] CONTAINER/PATH",
        options: [("--store=", "the shared store, to name the file or folder as CONTAINER/PATH without a mount"),
                  ("--local=", "this machine's folder for the shared store, if not the default")],
        positionals: 1...1,
        run: { p in
            let (storeDir, ino) = try locate(p.positionals[0], p)
            return try runControl(ControlRequest(command: name == "evict" ? "evict" : "pin", ino: ino), storeDir: storeDir)
        })
}

let evictCommand = contentCommand(
    "evict", summary: "drop this machine's copy of a file's (or a folder's) content; reading it downloads it again")
let pinCommand = contentCommand(
    "pin", summary: "download a file's (or a folder's) content now and keep it on this machine until evicted")
