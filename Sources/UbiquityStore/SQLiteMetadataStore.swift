// The embedded metadata store: one SQLite connection in WAL mode.
//
// Durability: the connection runs with `synchronous=NORMAL` (a commit is atomic and survives a
// crash of the process, but the WAL is only fsync'ed at checkpoints, so a power cut may lose the
// last commits). `commit(_, durable: true)` switches that one transaction to `synchronous=FULL`,
// which makes SQLite fsync the WAL when the transaction commits — and since the WAL is appended in
// order, that one fsync also makes every earlier commit durable. A durable commit of an empty
// batch writes one small row under `synchronous=FULL`, as a barrier for the earlier commits (a
// passive WAL checkpoint would sync nothing while a reader pins the WAL, yet return success).
//
// Grouped commits (the embedded store's daemons): non-durable commits share one transaction, 64
// at most and for ~2 ms at most, each first appended to the daemon's journal so that it survives
// the daemon's death as a commit of its own would (CommitJournal.swift). Everything else that
// writes, and every durable commit, first commits the open group.
//
// Schema (version 1): `store_meta` holds the store's own keys (schema_version and the high-water
// marks max_ino / max_version, so deleted ids are never reused); `meta` holds the model's keys
// (`Mutation.setMeta`) and is returned whole by `load()`.

import CSQLite
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// SQLITE_TRANSIENT is a C cast macro that does not import: SQLite copies the bound bytes.
private var sqliteTransient: sqlite3_destructor_type {
    unsafeBitCast(-1, to: sqlite3_destructor_type.self)
}

/// SQLite result code → errno (SQLITE_FULL → ENOSPC, SQLITE_IOERR → EIO, everything else EIO).
func errnoForSQLite(_ code: Int32) -> Int32 {
    switch code & 0xff {
    case SQLITE_FULL: return ENOSPC
    case SQLITE_IOERR: return EIO
    default: return EIO
    }
}

/// 1: the single-writer store. 2: the change log (`changes`) and each node's last change.
/// 3: each version's `moved_from` (the file it was published for, when moved into another's).
/// 4: chunk lists shared between versions (`chunk_lists`, each version's `list`).
private let schemaVersion: Int64 = 4

private let schemaSQL = """
    CREATE TABLE IF NOT EXISTS store_meta(
        key TEXT PRIMARY KEY NOT NULL,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS meta(
        key TEXT PRIMARY KEY NOT NULL,
        value TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS nodes(
        ino INTEGER PRIMARY KEY,
        container TEXT NOT NULL,
        kind INTEGER NOT NULL,
        mode INTEGER NOT NULL,
        uid INTEGER NOT NULL,
        gid INTEGER NOT NULL,
        nlink INTEGER NOT NULL,
        size INTEGER NOT NULL,
        atime INTEGER NOT NULL,
        mtime INTEGER NOT NULL,
        ctime INTEGER NOT NULL,
        btime INTEGER NOT NULL,
        rdev INTEGER NOT NULL,
        target BLOB NOT NULL,
        current_version INTEGER,
        change_seq INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS changes(
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        writer TEXT NOT NULL,
        batch BLOB NOT NULL
    );
    CREATE TABLE IF NOT EXISTS dirents(
        parent INTEGER NOT NULL,
        name BLOB NOT NULL,
        child INTEGER NOT NULL,
        PRIMARY KEY(parent, name)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS xattrs(
        ino INTEGER NOT NULL,
        name BLOB NOT NULL,
        value BLOB NOT NULL,
        PRIMARY KEY(ino, name)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS versions(
        id INTEGER PRIMARY KEY,
        ino INTEGER NOT NULL,
        created INTEGER NOT NULL,
        size INTEGER NOT NULL,
        origin TEXT NOT NULL,
        device TEXT NOT NULL,
        chunks BLOB NOT NULL,
        moved_from INTEGER,
        list INTEGER
    );
    CREATE INDEX IF NOT EXISTS versions_by_ino ON versions(ino, id);
    CREATE TABLE IF NOT EXISTS chunk_lists(
        id INTEGER PRIMARY KEY,
        chunks BLOB NOT NULL
    );
    CREATE TABLE IF NOT EXISTS containers(
        identifier TEXT PRIMARY KEY NOT NULL,
        bundle_identifier TEXT NOT NULL,
        name TEXT NOT NULL,
        is_public INTEGER NOT NULL,
        folder_levels TEXT NOT NULL,
        registered_version TEXT NOT NULL,
        manifest_path TEXT NOT NULL,
        root_ino INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO store_meta(key, value) VALUES
        ('schema_version', \(schemaVersion)), ('max_ino', 0), ('max_version', 0);
    """

// MARK: - Packed chunk lists

/// Chunk list ↔ BLOB: per chunk blob u64, length u32, checksum u64, little endian (20 bytes).
package enum ChunkPacking {
    package static let entrySize = 20

    package static func pack(_ chunks: [ChunkRef]) -> [UInt8] {
        var out = [UInt8]()
        append(chunks, to: &out)
        return out
    }

    /// `pack`'s bytes added to `out`: one resize and plain stores, not an append per field (a
    /// 1 GiB file's list is 1,024 entries, written at every publish).
    package static func append(_ chunks: [ChunkRef], to out: inout [UInt8]) {
        let start = out.count
        out.append(contentsOf: repeatElement(0, count: chunks.count * entrySize))
        out.withUnsafeMutableBytes { raw in
            var i = start
            for c in chunks {
                raw.storeBytes(of: c.blob.littleEndian, toByteOffset: i, as: UInt64.self)
                raw.storeBytes(of: c.length.littleEndian, toByteOffset: i + 8, as: UInt32.self)
                raw.storeBytes(of: c.checksum.littleEndian, toByteOffset: i + 12, as: UInt64.self)
                i += entrySize
            }
        }
    }

    package static func unpack(_ bytes: UnsafeRawBufferPointer) -> [ChunkRef]? {
        guard bytes.count % entrySize == 0 else { return nil }
        let count = bytes.count / entrySize
        return [ChunkRef](unsafeUninitializedCapacity: count) { out, initialized in
            for k in 0..<count {
                let i = k * entrySize
                let blob = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                let length = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: i + 8, as: UInt32.self))
                let sum = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i + 12, as: UInt64.self))
                (out.baseAddress! + k).initialize(to: ChunkRef(blob: blob, length: length, checksum: sum))
            }
            initialized = count
        }
    }
}

// MARK: - The store

public final class SQLiteMetadataStore: MetadataStore, @unchecked Sendable {
    // `mutex` guards every use of the connection: `db` and the prepared statements in
    // `statements` (a statement is not usable from two threads at once), and the grouped
    // commits' state: `group`, `unsettled`, `settleError`, `timerArmed`, `lostSavepoint` and the
    // journal. Everything else is immutable after init.
    private let mutex = StoreMutex()
    private let db: OpaquePointer
    private var statements: [String: OpaquePointer] = [:]

    /// Where the database file lives (for `capacity()`).
    public let path: String
    private let folder: String
    /// The embedded store's `flock`; held for as long as this object lives.
    private let storeLock: StoreLock?
    /// The embedded store's space reserve, released when a commit finds the disk full.
    private let reserve: SpaceReserve?
    /// This daemon's journal of grouped commits (nil: every commit is a transaction of its own).
    private let journal: CommitJournal?
    private let log: @Sendable (String) -> Void
    /// The open group's transaction, if any.
    private var group: Group?
    /// A group failed to commit: its batches, acknowledged, are in the journal alone, and are
    /// applied before anything else reads or writes (`settleError` says why they are not yet).
    private var unsettled = false
    private var settleError: StoreError?
    private var timerArmed = false
    private let groupNanoseconds: UInt64
    /// `UBIQUITYFS_CHECK_EXPECTATIONS=1`: expectations a model read at the log's last position
    /// (skipped: they hold by construction) are checked too, and a batch whose do not hold fails
    /// with the disagreement logged. The test suite runs with it, so that a model that drifts
    /// from its store shows as a failure instead of a wrong commit.
    let checksCurrentExpectations: Bool
    static var checksCurrentExpectationsByDefault: Bool {
        ProcessInfo.processInfo.environment["UBIQUITYFS_CHECK_EXPECTATIONS"] == "1"
    }

    /// Opens (creating if missing) the database at `path`.
    public convenience init(path: String) throws(StoreError) {
        try self.init(path: path, storeLock: nil)
    }

    /// Opens an existing database only to read it (for commands that change nothing, such as
    /// `containers`): no schema set-up, no migration, no write lock; a commit fails.
    public init(readOnlyPath path: String) throws(StoreError) {
        let handle = try Self.connect(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, what: "open \(path) to read")
        sqlite3_busy_timeout(handle, 5000)
        var select = Self.versionSelect
        do throws(StoreError) {
            let version = try Self.scalarInt(handle, "SELECT value FROM store_meta WHERE key='schema_version'", path: path) ?? -1
            if version > schemaVersion || version < 1 {
                throw StoreError(.corrupt, "\(path): the store has schema version \(version), and this ubiquityfs "
                                 + "knows versions 1 to \(schemaVersion): use a newer ubiquityfs")
            }
            // A store no daemon of this version has opened yet (read, not migrated).
            if version < 3 { select = Self.versionSelectBefore3 } else if version < 4 { select = Self.versionSelectBefore4 }
        } catch {
            sqlite3_close_v2(handle)
            throw error
        }
        db = handle
        self.path = path
        folder = Self.folder(of: path)
        storeLock = nil
        reserve = nil
        journal = nil
        log = { _ in }
        groupNanoseconds = 0
        checksCurrentExpectations = false
        versionSelect = select
    }

    /// `journalFolder`: group non-durable commits, journaled there (the embedded store's daemons).
    /// `groupNanoseconds`: how long a group stays open at most (`.max`: until 64 batches or
    /// something else needs the connection; tests that stop a daemon with its group open).
    /// `checksCurrentExpectations`: see the property (from the environment unless given).
    init(path: String, storeLock: StoreLock?, reserve: SpaceReserve? = nil, journalFolder: String? = nil,
         groupNanoseconds: UInt64 = 2_000_000, checksCurrentExpectations: Bool = checksCurrentExpectationsByDefault,
         log: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) {
        // Create the database 0600 ourselves: SQLite would make it 0644 (less the umask), and it
        // gives its -wal and -shm files the database's mode.
        let fd = retryEINTR { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        if fd < 0 { throw systemError("create", path, errno) }
        close(fd)
        let journal = try journalFolder.map { (folder) throws(StoreError) in try CommitJournal(folder: folder) }
        let handle = try Self.connect(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, what: "open \(path)")
        sqlite3_extended_result_codes(handle, 1)
        do throws(StoreError) {
            try Self.setUp(handle, path: path)
        } catch {
            sqlite3_close_v2(handle)
            throw error
        }
        self.db = handle
        self.path = path
        self.folder = Self.folder(of: path)
        self.storeLock = storeLock
        self.reserve = reserve
        self.log = log
        self.journal = journal
        self.groupNanoseconds = groupNanoseconds
        self.checksCurrentExpectations = checksCurrentExpectations
        // A daemon that died with commits in its journal: they land first.
        if journal != nil { try mutex.withLock { () throws(StoreError) in try applyJournalsLocked() } }
    }

    deinit {
        closeGroupLocked()
        for statement in statements.values { sqlite3_finalize(statement) }
        sqlite3_close_v2(db)
    }

    /// A connection to `path`, or the error saying why not.
    private static func connect(_ path: String, _ flags: Int32, what: String) throws(StoreError) -> OpaquePointer {
        var handle: OpaquePointer?
        let rc = sqlite3_open_v2(path, &handle, flags, nil)
        guard rc == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let handle { sqlite3_close_v2(handle) }
            throw StoreError(errno: errnoForSQLite(rc), "\(what): \(message)")
        }
        return handle
    }

    /// The folder that holds the database at `path` (the store's folder).
    private static func folder(of path: String) -> String {
        let folder = (path as NSString).deletingLastPathComponent
        return folder.isEmpty ? "." : folder
    }

    /// Pragmas, schema, schema-version check.
    private static func setUp(_ db: OpaquePointer, path: String) throws(StoreError) {
        sqlite3_busy_timeout(db, 5000)
        let mode = try scalarText(db, "PRAGMA journal_mode=WAL", path: path)
        guard mode?.lowercased() == "wal" else {
            throw StoreError(errno: EIO, "\(path): cannot switch to WAL mode (journal_mode is \(mode ?? "?"))")
        }
        try exec(db, "PRAGMA synchronous=NORMAL", path: path)
        try exec(db, "PRAGMA foreign_keys=OFF", path: path)
        // 4 MiB of page cache (SQLite's default is 2 MiB). Pages beyond it are read back from the
        // kernel's page cache, which holds them anyway: at 100,000 items a change costs the same
        // as with 64 MiB (`scripts/bench namespace`), which the daemon kept besides.
        try exec(db, "PRAGMA cache_size=-4096", path: path)
        try exec(db, "BEGIN IMMEDIATE", path: path)
        do throws(StoreError) {
            try exec(db, schemaSQL, path: path)
            var version = try scalarInt(db, "SELECT value FROM store_meta WHERE key='schema_version'", path: path) ?? -1
            if version > schemaVersion || version < 1 {
                throw StoreError(.corrupt, "\(path): the store has schema version \(version), and this ubiquityfs "
                                 + "knows versions 1 to \(schemaVersion): use a newer ubiquityfs")
            }
            // Forward migrations, in one transaction with the check above.
            if version == 1 {
                // The change log table came with the schema above; nodes gain their last change.
                try exec(db, "ALTER TABLE nodes ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0", path: path)
                version = 2
            }
            if version == 2 {
                // (A table the schema above just made has the column already.)
                let has = try scalarInt(db, "SELECT count(*) FROM pragma_table_info('versions') WHERE name = 'moved_from'", path: path)
                if has == 0 { try exec(db, "ALTER TABLE versions ADD COLUMN moved_from INTEGER", path: path) }
                version = 3
            }
            if version == 3 {
                // Rows of a big file's versions stop holding whole lists: a daemon of an earlier
                // version still running on the store would read them wrong (it checked the
                // schema when it started).
                if LocalWorkArea.daemonRunning(in: folder(of: path) + "/work") {
                    throw StoreError(errno: EBUSY, "\(path): the store's schema must change to version 4, which the "
                                     + "earlier ubiquityfs still running on it cannot read: stop every mount of this store, then mount again")
                }
                let has = try scalarInt(db, "SELECT count(*) FROM pragma_table_info('versions') WHERE name = 'list'", path: path)
                if has == 0 { try exec(db, "ALTER TABLE versions ADD COLUMN list INTEGER", path: path) }
                version = 4
            }
            // Here, not in the schema above: a store older than 4 has no `list` column until now.
            try exec(db, "CREATE INDEX IF NOT EXISTS versions_by_list ON versions(list) WHERE list IS NOT NULL", path: path)
            try exec(db, "UPDATE store_meta SET value = \(version) WHERE key = 'schema_version'", path: path)
            try exec(db, "COMMIT", path: path)
        } catch {
            if sqlite3_get_autocommit(db) == 0 { sqlite3_exec(db, "ROLLBACK", nil, nil, nil) }
            throw error
        }
    }

    private static func error(_ db: OpaquePointer, _ rc: Int32, _ what: String) -> StoreError {
        StoreError(errno: errnoForSQLite(rc), "\(what): \(String(cString: sqlite3_errmsg(db))) (SQLite \(rc))")
    }

    private static func exec(_ db: OpaquePointer, _ sql: String, path: String) throws(StoreError) {
        let rc = sqlite3_exec(db, sql, nil, nil, nil)
        if rc != SQLITE_OK { throw error(db, rc, "\(path): \(sql.prefix(60))") }
    }

    private static func scalarText(_ db: OpaquePointer, _ sql: String, path: String) throws(StoreError) -> String? {
        var statement: OpaquePointer?
        var rc = sqlite3_prepare_v2(db, sql, -1, &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw error(db, rc, "\(path): \(sql)") }
        defer { sqlite3_finalize(statement) }
        rc = sqlite3_step(statement)
        if rc == SQLITE_ROW {
            return sqlite3_column_text(statement, 0).map { String(cString: $0) }
        }
        if rc != SQLITE_DONE { throw error(db, rc, "\(path): \(sql)") }
        return nil
    }

    private static func scalarInt(_ db: OpaquePointer, _ sql: String, path: String) throws(StoreError) -> Int64? {
        var statement: OpaquePointer?
        var rc = sqlite3_prepare_v2(db, sql, -1, &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw error(db, rc, "\(path): \(sql)") }
        defer { sqlite3_finalize(statement) }
        rc = sqlite3_step(statement)
        if rc == SQLITE_ROW { return sqlite3_column_int64(statement, 0) }
        if rc != SQLITE_DONE { throw error(db, rc, "\(path): \(sql)") }
        return nil
    }

    // MARK: Statement helpers (call with `mutex` held)

    private func fail(_ rc: Int32, _ what: String) -> StoreError {
        Self.error(db, rc, "\(path): \(what)")
    }

    private func prepared(_ sql: String) throws(StoreError) -> OpaquePointer {
        if let statement = statements[sql] { return statement }
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw fail(rc, "prepare \(sql)") }
        statements[sql] = statement
        return statement
    }

    /// Runs `sql` with `bind`, calling `row` for each result row.
    private func run(_ sql: String, bind: (Binder) throws(StoreError) -> Void = { _ in },
                     row: (Row) throws(StoreError) -> Void = { _ in }) throws(StoreError) {
        let statement = try prepared(sql)
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        try bind(Binder(statement: statement, store: self, sql: sql))
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { return }
            if rc != SQLITE_ROW { throw fail(rc, sql) }
            try row(Row(statement: statement))
        }
    }

    fileprivate struct Binder {
        let statement: OpaquePointer
        let store: SQLiteMetadataStore
        let sql: String
        private func check(_ rc: Int32) throws(StoreError) {
            if rc != SQLITE_OK { throw store.fail(rc, "bind \(sql)") }
        }
        func int(_ index: Int32, _ value: Int64) throws(StoreError) {
            try check(sqlite3_bind_int64(statement, index, value))
        }
        func uint(_ index: Int32, _ value: UInt64) throws(StoreError) {
            try int(index, Int64(bitPattern: value))
        }
        func null(_ index: Int32) throws(StoreError) {
            try check(sqlite3_bind_null(statement, index))
        }
        func text(_ index: Int32, _ value: String) throws(StoreError) {
            try check(sqlite3_bind_text(statement, index, value, -1, sqliteTransient))
        }
        func blob(_ index: Int32, _ value: [UInt8]) throws(StoreError) {
            if value.isEmpty {
                // A nil pointer would bind NULL: bind an empty blob instead.
                try check(sqlite3_bind_zeroblob(statement, index, 0))
                return
            }
            let rc = value.withUnsafeBytes {
                sqlite3_bind_blob(statement, index, $0.baseAddress, Int32($0.count), sqliteTransient)
            }
            try check(rc)
        }
    }

    fileprivate struct Row {
        let statement: OpaquePointer
        func int(_ column: Int32) -> Int64 { sqlite3_column_int64(statement, column) }
        func uint(_ column: Int32) -> UInt64 { UInt64(bitPattern: int(column)) }
        func isNull(_ column: Int32) -> Bool { sqlite3_column_type(statement, column) == SQLITE_NULL }
        func blob(_ column: Int32) -> [UInt8] {
            let count = Int(sqlite3_column_bytes(statement, column))
            guard count > 0, let base = sqlite3_column_blob(statement, column) else { return [] }
            return [UInt8](UnsafeRawBufferPointer(start: base, count: count))
        }
        func withBlob<R>(_ column: Int32, _ body: (UnsafeRawBufferPointer) -> R) -> R {
            let count = Int(sqlite3_column_bytes(statement, column))
            guard count > 0, let base = sqlite3_column_blob(statement, column) else {
                return body(UnsafeRawBufferPointer(start: nil, count: 0))
            }
            return body(UnsafeRawBufferPointer(start: base, count: count))
        }
        func text(_ column: Int32) -> String {
            let count = Int(sqlite3_column_bytes(statement, column))
            guard count > 0, let base = sqlite3_column_text(statement, column) else { return "" }
            return String(decoding: UnsafeRawBufferPointer(start: base, count: count), as: UTF8.self)
        }
    }

    // MARK: Row decoding

    private static let nodeColumns = "ino, container, kind, mode, uid, gid, nlink, size, atime, mtime, ctime, btime, rdev, target, current_version"
    /// A version row with the list it names, if any; queries add `WHERE v.…`.
    private static let versionSelect = """
        SELECT v.id, v.ino, v.created, v.size, v.origin, v.device, v.chunks, v.moved_from, v.list, l.chunks
        FROM versions v LEFT JOIN chunk_lists l ON l.id = v.list
        """
    private static let versionSelectBefore4 = "SELECT id, ino, created, size, origin, device, chunks, moved_from, NULL, NULL FROM versions v"
    private static let versionSelectBefore3 = "SELECT id, ino, created, size, origin, device, chunks, NULL, NULL, NULL FROM versions v"
    private var versionSelect = SQLiteMetadataStore.versionSelect

    private func decodeNode(_ r: Row, containers: TextInterner) throws(StoreError) -> NodeRecord {
        let ino = r.uint(0)
        guard let raw = UInt8(exactly: r.int(2)), let kind = NodeKind(rawValue: raw) else {
            throw StoreError(errno: EIO, "\(path): node \(ino) has unknown kind \(r.int(2))")
        }
        return NodeRecord(ino: ino, container: r.withBlob(1, containers.text), kind: kind,
                          mode: UInt32(truncatingIfNeeded: r.int(3)),
                          uid: UInt32(truncatingIfNeeded: r.int(4)),
                          gid: UInt32(truncatingIfNeeded: r.int(5)),
                          nlink: UInt32(truncatingIfNeeded: r.int(6)),
                          size: r.uint(7), atime: r.int(8), mtime: r.int(9), ctime: r.int(10),
                          btime: r.int(11), rdev: r.uint(12), target: r.blob(13),
                          currentVersion: r.isNull(14) ? nil : r.int(14))
    }

    private func decodeVersion(_ r: Row) throws(StoreError) -> VersionRecord {
        let id = r.int(0)
        guard let origin = VersionOrigin(rawValue: r.text(4)) else {
            throw StoreError(errno: EIO, "\(path): version \(id) has unknown origin \(r.text(4))")
        }
        if !r.isNull(8) && r.isNull(9) {
            throw StoreError(errno: EIO, "\(path): version \(id) names chunk list \(r.int(8)), which is missing")
        }
        let chunks = r.withBlob(6) { stored in r.withBlob(9) { list in ChunkDelta.chunks(stored, list: r.isNull(8) ? nil : list) } }
        guard let chunks else {
            throw StoreError(errno: EIO, "\(path): version \(id) has a malformed chunk list")
        }
        return VersionRecord(id: id, ino: r.uint(1), created: r.int(2), size: r.uint(3),
                             chunks: chunks, origin: origin, device: r.text(5), movedFrom: r.isNull(7) ? nil : r.uint(7))
    }

    // MARK: MetadataStore

    public func load() throws(StoreError) -> StoreSnapshot {
        try mutex.withLock { () throws(StoreError) -> StoreSnapshot in
            try settleLocked()
            return try loadLocked { () throws(StoreError) in try lastSeq() }
        }
    }

    /// The whole state, at the position `position` reads inside the transaction. Caller holds mutex.
    private func loadLocked(position: () throws(StoreError) -> ChangeSeq) throws(StoreError) -> StoreSnapshot {
        try run("BEGIN")
        do throws(StoreError) {
            var s = StoreSnapshot()
            let containers = TextInterner()
            try run("SELECT \(Self.nodeColumns), change_seq FROM nodes ORDER BY ino", row: { (r) throws(StoreError) in
                let n = try decodeNode(r, containers: containers)
                s.nodes.append(n)
                s.nodeChangeSeqs.append(r.int(15))
            })
            try run("SELECT parent, name, child FROM dirents", row: { r in
                s.dirents.append(DirentRecord(parent: r.uint(0), name: r.blob(1), child: r.uint(2)))
            })
            try run("SELECT ino, name, value FROM xattrs", row: { r in
                s.xattrs.append(XattrRecord(ino: r.uint(0), name: r.blob(1), value: r.blob(2)))
            })
            s.containers = try readContainers()
            try run("""
                \(versionSelect)
                WHERE v.id IN (SELECT current_version FROM nodes WHERE current_version IS NOT NULL) ORDER BY v.id
                """, row: { (r) throws(StoreError) in
                s.currentVersions.append(try decodeVersion(r))
            })
            try run("SELECT key, value FROM meta", row: { r in s.meta[r.text(0)] = r.text(1) })
            (s.maxIno, s.maxVersion) = try highWaterMarks()
            s.seq = try position()
            try run("COMMIT")
            return s
        } catch {
            rollbackIfNeeded()
            throw error
        }
    }

    // MARK: A replica: another store's state, kept at that store's positions

    // A machine's copy of a shared store's namespace is this schema with no change log of its
    // own: `store_meta.replica_seq` says which position of the other store it holds, and is
    // absent while the copy is not whole (never made, or a write to it failed).

    /// The position of the other store this database holds, or nil.
    package func replicaPosition() throws(StoreError) -> ChangeSeq? {
        try mutex.withLock { () throws(StoreError) -> ChangeSeq? in try replicaPositionLocked() }
    }

    private func replicaPositionLocked() throws(StoreError) -> ChangeSeq? {
        var seq: ChangeSeq?
        try run("SELECT value FROM store_meta WHERE key = 'replica_seq'", row: { r in seq = r.int(0) })
        return seq
    }

    /// The held state, or nil when the copy is not whole.
    package func loadReplica() throws(StoreError) -> StoreSnapshot? {
        precondition(journal == nil, "a replica's database groups no commits")
        return try mutex.withLock { () throws(StoreError) -> StoreSnapshot? in
            var whole = true
            let s = try loadLocked { () throws(StoreError) -> ChangeSeq in
                let seq = try replicaPositionLocked()
                whole = seq != nil
                return seq ?? 0
            }
            return whole ? s : nil
        }
    }

    /// Replaces every table with `snapshot`, in one transaction.
    package func replace(with snapshot: StoreSnapshot) throws(StoreError) {
        try replicaTransaction { () throws(StoreError) in
            for table in ["nodes", "dirents", "xattrs", "versions", "chunk_lists", "containers", "meta", "changes"] {
                try run("DELETE FROM \(table)")
            }
            var maxIno: UInt64 = 0, maxVersion: Int64 = 0
            for (i, n) in snapshot.nodes.enumerated() {
                try apply(.putNode(n), seq: snapshot.change(ofNodeAt: i), maxIno: &maxIno, maxVersion: &maxVersion)
            }
            for d in snapshot.dirents { try apply(.putDirent(d), seq: 0, maxIno: &maxIno, maxVersion: &maxVersion) }
            for x in snapshot.xattrs { try apply(.putXattr(x), seq: 0, maxIno: &maxIno, maxVersion: &maxVersion) }
            for v in snapshot.currentVersions { try apply(.putVersion(v), seq: 0, maxIno: &maxIno, maxVersion: &maxVersion) }
            for c in snapshot.containers { try apply(.putContainer(c), seq: 0, maxIno: &maxIno, maxVersion: &maxVersion) }
            for (key, value) in snapshot.meta { try apply(.setMeta(key: key, value: value), seq: 0, maxIno: &maxIno, maxVersion: &maxVersion) }
            return (snapshot.seq, max(maxIno, snapshot.maxIno), max(maxVersion, snapshot.maxVersion))
        }
    }

    /// Applies `records` (the next ones of the other store, in order), in one transaction.
    package func replicate(_ records: [ChangeRecord]) throws(StoreError) {
        guard let last = records.last else { return }
        try replicaTransaction { () throws(StoreError) in
            var (maxIno, maxVersion) = try highWaterMarks()
            for r in records {
                for m in r.mutations {
                    switch m {
                    case .putVersion(let v):
                        // A version seen twice (the copy was made after it) is the same version.
                        try apply(.deleteVersion(v.id), seq: r.seq, maxIno: &maxIno, maxVersion: &maxVersion)
                    case .putNode(let n):
                        // Only current versions are kept: the copy is for a start out of reach.
                        var old: VersionID?
                        try run("SELECT current_version FROM nodes WHERE ino = ?1", bind: { b throws(StoreError) in
                            try b.uint(1, n.ino)
                        }, row: { row in old = row.isNull(0) ? nil : row.int(0) })
                        if let old, old != n.currentVersion {
                            try apply(.deleteVersion(old), seq: r.seq, maxIno: &maxIno, maxVersion: &maxVersion)
                        }
                    default: break
                    }
                    try apply(m, seq: r.seq, maxIno: &maxIno, maxVersion: &maxVersion)
                }
            }
            return (last.seq, maxIno, maxVersion)
        }
    }

    /// Marks the copy as not whole (a write to it failed, or it fell behind).
    package func dropReplicaPosition() throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in try run("DELETE FROM store_meta WHERE key = 'replica_seq'") }
    }

    /// Runs `body` in a write transaction that ends by recording the position and high-water
    /// marks it returns.
    private func replicaTransaction(_ body: () throws(StoreError) -> (ChangeSeq, UInt64, Int64)) throws(StoreError) {
        precondition(journal == nil, "a replica's database groups no commits")
        try mutex.withLock { () throws(StoreError) in
            // A replica logs nothing: what `apply` notes for a change-log row is not kept.
            defer { sharedInBatch = [:] }
            try run("BEGIN IMMEDIATE")
            do throws(StoreError) {
                let (seq, maxIno, maxVersion) = try body()
                try run("INSERT OR REPLACE INTO store_meta(key, value) VALUES('max_ino', ?1), ('max_version', ?2), "
                        + "('replica_seq', ?3)") { b throws(StoreError) in
                    try b.uint(1, maxIno)
                    try b.int(2, maxVersion)
                    try b.int(3, seq)
                }
                try run("COMMIT")
            } catch {
                rollbackIfNeeded()
                throw error
            }
        }
    }

    public func commit(_ batch: Batch, durable: Bool) throws(StoreError) -> ChangeSeq {
        do throws(StoreError) {
            let seq = try commitOnce(batch, durable: durable)
            reserve?.restore()
            return seq
        } catch where error.kind == .noSpace && reserve?.release() == true {
            // The disk is full: the reserve's space lets this change (and the deletes that
            // free space) through.
            return try commitOnce(batch, durable: durable)
        }
    }

    private func commitOnce(_ batch: Batch, durable: Bool) throws(StoreError) -> ChangeSeq {
        try mutex.withLock { () throws(StoreError) -> ChangeSeq in
            if unsettled { try settleLocked() }
            if let journal, !durable, !batch.mutations.isEmpty, !journal.broken {
                return try groupedCommitLocked(batch)
            }
            // A transaction of its own, after the open group's (a durable one syncs both).
            try settleLocked()
            if durable { try run("PRAGMA synchronous=FULL") }
            defer { if durable { try? run("PRAGMA synchronous=NORMAL") } }
            var g = try beginWriteLocked()
            do throws(StoreError) {
                let seq: ChangeSeq
                if batch.mutations.isEmpty {
                    for e in batch.expectations { try check(e) }
                    // Nothing to log. A durable empty batch is a barrier for every earlier commit:
                    // a small write transaction under synchronous=FULL syncs the WAL, where a
                    // passive checkpoint would sync nothing while a reader pins the WAL.
                    if durable {
                        try run("INSERT OR REPLACE INTO store_meta(key, value) VALUES('barrier', "
                                + "COALESCE((SELECT value FROM store_meta WHERE key = 'barrier'), 0) + 1)")
                    }
                    seq = try lastSeq()
                } else {
                    seq = try applyLocked(batch, seq: nil, group: &g, journaled: false)
                }
                try endWriteLocked(g)
                return seq
            } catch {
                rollbackIfNeeded()
                for found in g.journals { found.finish(committed: false) }
                throw error
            }
        }
    }

    // MARK: Grouped commits

    /// A write transaction: the high-water marks as read at its start and as its batches moved
    /// them, and the journals it applied.
    private struct Group {
        var count = 0
        var maxIno: UInt64
        var maxVersion: Int64
        let storedMaxIno: UInt64
        let storedMaxVersion: Int64
        var journals: [CommitJournal.Found] = []
        /// It applies this daemon's own journal (a group of it failed to commit).
        let replaysOwn: Bool
        /// The change log's last position in the transaction (once the journals are applied).
        var lastSeq: ChangeSeq = 0
    }

    private static let groupLimit = 64
    private static let groupTimers = DispatchQueue(label: "ubiquityfs.commit-group")

    /// The batch joins the open group (one is opened if none is): acknowledged once journaled.
    private func groupedCommitLocked(_ batch: Batch) throws(StoreError) -> ChangeSeq {
        if group == nil {
            group = try beginWriteLocked()
            armTimerLocked()
        }
        let seq: ChangeSeq
        do throws(StoreError) {
            seq = try applyLocked(batch, seq: nil, group: &group!, journaled: true)
        } catch {
            guard let lost = lostSavepoint else {
                // An empty group holds the write lock for nothing.
                if group?.count == 0 { closeGroupLocked() }
                throw error
            }
            // The transaction is past saving: what the group acknowledged is in the journal.
            lostSavepoint = nil
            abandonGroupLocked(error)
            if lost.journaled { return lost.seq }
            throw error
        }
        group!.count += 1
        if group!.count >= Self.groupLimit { closeGroupLocked() }
        return seq
    }

    /// The lists the versions of the batch being applied were stored against (`storedChunks`),
    /// for its change-log row. Guarded by mutex.
    private var sharedInBatch: BatchCoding.SharedChunks = [:]

    /// Set by `applyLocked` when it failed and its savepoint could not be undone or released:
    /// the transaction must end. `journaled`: the batch reached the journal (it counts as committed).
    private var lostSavepoint: (seq: ChangeSeq, journaled: Bool)?

    /// One batch inside the open write transaction, under a savepoint so that a failed
    /// expectation undoes it alone. `seq`: the position a journal record was acknowledged with.
    private func applyLocked(_ batch: Batch, seq wanted: ChangeSeq?, group g: inout Group,
                             journaled: Bool) throws(StoreError) -> ChangeSeq {
        lostSavepoint = nil
        try run("SAVEPOINT batch")
        var seq: ChangeSeq = 0
        var inJournal = false
        do throws(StoreError) {
            // A model that staged over the log's last state read its expectations from the very
            // state they are checked against (the common case of a writer alone): they hold.
            let current = wanted == nil && batch.expectationsReadAtPosition && batch.position != 0
                && batch.position == g.lastSeq
            if !current || checksCurrentExpectations {
                for e in batch.expectations {
                    do throws(StoreError) { try check(e) } catch where current && error.kind == .conflict {
                        let why = "\(path): the model disagrees with the store at position \(g.lastSeq): \(error.message)"
                        log(why)
                        throw StoreError(.corrupt, why)
                    }
                }
            }
            // A big file's version names a shared list in the log, as in its row: known once
            // applied, so such a batch's row is written after (`sharedInBatch`).
            let sharesLists = batch.mutations.contains {
                if case .putVersion(let v) = $0 { return v.chunks.count >= ChunkDelta.sharedListMinimum }
                return false
            }
            let encoded = sharesLists ? [] : BatchCoding.encode(batch.mutations)
            if let wanted {
                try run("INSERT INTO changes(seq, writer, batch) VALUES(?1, ?2, ?3)") { b throws(StoreError) in
                    try b.int(1, wanted)
                    try b.text(2, batch.writer)
                    try b.blob(3, encoded)
                }
            } else {
                try run("INSERT INTO changes(writer, batch) VALUES(?1, ?2)") { b throws(StoreError) in
                    try b.text(1, batch.writer)
                    try b.blob(2, encoded)
                }
            }
            seq = sqlite3_last_insert_rowid(db)
            var maxIno = g.maxIno
            var maxVersion = g.maxVersion
            sharedInBatch = [:]
            defer { sharedInBatch = [:] }
            for mutation in batch.mutations {
                try apply(mutation, seq: seq, maxIno: &maxIno, maxVersion: &maxVersion)
            }
            if sharesLists {
                let compact = BatchCoding.encode(batch.mutations, shared: sharedInBatch)
                try run("UPDATE changes SET batch = ?2 WHERE seq = ?1") { b throws(StoreError) in
                    try b.int(1, seq)
                    try b.blob(2, compact)
                }
            }
            if journaled, let journal {
                try journal.append(BatchCoding.encodeRecord(seq: seq, batch: batch, encoded: sharesLists ? nil : encoded))
                inJournal = true
            }
            try run("RELEASE batch")
            g.maxIno = maxIno
            g.maxVersion = maxVersion
            g.lastSeq = seq
            return seq
        } catch {
            // ROLLBACK TO keeps the savepoint: it is released too.
            if inJournal || (try? run("ROLLBACK TO batch")) == nil || (try? run("RELEASE batch")) == nil {
                lostSavepoint = (seq, inJournal)
            }
            throw error
        }
    }

    /// BEGIN IMMEDIATE, then apply what journals hold that the store lacks — a dead daemon's
    /// last commits, or this one's whose group failed — so that they land on the state they were
    /// checked against, under the positions they were acknowledged with: while a daemon's group
    /// is open no one else can write, and every writer applies them before anything else.
    private func beginWriteLocked() throws(StoreError) -> Group {
        try run("BEGIN IMMEDIATE")
        var g = Group(maxIno: 0, maxVersion: 0, storedMaxIno: 0, storedMaxVersion: 0, replaysOwn: unsettled)
        do throws(StoreError) {
            let (maxIno, maxVersion) = try highWaterMarks()
            g = Group(maxIno: maxIno, maxVersion: maxVersion, storedMaxIno: maxIno, storedMaxVersion: maxVersion,
                      replaysOwn: unsettled)
            g.lastSeq = try lastSeq()
            if let journal {
                g.journals = CommitJournal.pending(in: journal.folder, own: journal, includeOwn: unsettled)
                if !g.journals.isEmpty { try replayLocked(into: &g) }
            }
            return g
        } catch {
            for found in g.journals { found.finish(committed: false) }
            rollbackIfNeeded()
            throw error
        }
    }

    /// Applies the journals' records past the store's last position in order of position,
    /// whichever journal holds each, up to the first that is missing or no longer fits.
    private func replayLocked(into g: inout Group) throws(StoreError) {
        var last = g.lastSeq
        var waiting: [ChangeSeq: Batch] = [:]
        for found in g.journals {
            for (seq, batch) in found.records where seq > last && waiting[seq] == nil { waiting[seq] = batch }
        }
        var why: String?
        while let batch = waiting.removeValue(forKey: last + 1) {
            do throws(StoreError) {
                _ = try applyLocked(batch, seq: last + 1, group: &g, journaled: false)
            } catch where error.kind == .conflict && lostSavepoint == nil {
                waiting[last + 1] = batch
                why = error.message
                break
            }
            last += 1
        }
        // Only a power cut (which may lose commits; these were never promised durable) leads
        // here: the rest were made on a state the store no longer has.
        if let first = waiting.keys.min() {
            log("\(journal?.folder ?? path): \(waiting.count) journaled commits from position \(first) cannot be applied "
                + "and are dropped: \(why ?? "the position before it, \(first - 1), is not in the store")")
        }
    }

    /// Records the high-water marks and commits; the journals applied are then done with.
    private func endWriteLocked(_ g: Group) throws(StoreError) {
        if g.maxIno != g.storedMaxIno {
            try run("UPDATE store_meta SET value = ?1 WHERE key = 'max_ino'") { b throws(StoreError) in
                try b.uint(1, g.maxIno)
            }
        }
        if g.maxVersion != g.storedMaxVersion {
            try run("UPDATE store_meta SET value = ?1 WHERE key = 'max_version'") { b throws(StoreError) in
                try b.int(1, g.maxVersion)
            }
        }
        try run("COMMIT")
        for found in g.journals { found.finish(committed: true) }
        if g.count > 0 || g.replaysOwn, let journal {
            // Should emptying fail, the records stay, at positions the store has (never applied twice).
            do throws(StoreError) { try journal.reset() } catch { log("\(error.message)") }
        }
        if g.replaysOwn {
            unsettled = false
            settleError = nil
        }
    }

    /// Commits the open group, if any. A failure leaves its batches to the journal (`unsettled`).
    private func closeGroupLocked() {
        guard let g = group else { return }
        group = nil
        do throws(StoreError) {
            try endWriteLocked(g)
        } catch {
            rollbackIfNeeded()
            for found in g.journals { found.finish(committed: false) }
            // The next call settles them (on a full disk, with the reserve's space).
            if g.count > 0 || g.replaysOwn { markUnsettledLocked(error) }
        }
    }

    /// Ends the open group's transaction without committing it.
    private func abandonGroupLocked(_ error: StoreError) {
        guard let g = group else { return }
        group = nil
        rollbackIfNeeded()
        for found in g.journals { found.finish(committed: false) }
        markUnsettledLocked(error)
    }

    private func markUnsettledLocked(_ error: StoreError) {
        if settleError == nil {
            log("\(path): a group of commits could not be committed (\(error.message)); they are kept in the journal "
                + "and applied before anything else")
        }
        unsettled = true
        settleError = error
    }

    /// Commits the open group, and applies what this daemon's journal alone holds (throwing
    /// while that cannot be done: nothing may read or write past acknowledged commits).
    private func settleLocked() throws(StoreError) {
        closeGroupLocked()
        guard unsettled else { return }
        do throws(StoreError) {
            do throws(StoreError) {
                try applyJournalsLocked()
            } catch where error.kind == .noSpace && reserve?.release() == true {
                try applyJournalsLocked()
            }
        } catch {
            settleError = error
            throw error
        }
    }

    /// `body` under the mutex, for a read: it runs inside the open group's transaction, if any,
    /// and only once what the journal alone holds is applied.
    private func reading<R>(_ body: () throws(StoreError) -> R) throws(StoreError) -> R {
        try mutex.withLock { () throws(StoreError) -> R in
            if unsettled { try settleLocked() }
            return try body()
        }
    }

    /// A write transaction that only applies what journals hold.
    private func applyJournalsLocked() throws(StoreError) {
        let g = try beginWriteLocked()
        do throws(StoreError) {
            try endWriteLocked(g)
        } catch {
            rollbackIfNeeded()
            for found in g.journals { found.finish(committed: false) }
            throw error
        }
    }

    /// How many times this daemon listed its journal folder.
    var journalListings: Int { mutex.withLock { journal?.listings ?? 0 } }

    /// Commits the open group ~2 ms after it opened (or sooner, a timer of a group closed early
    /// being still armed), so that other daemons of the store (waiting on the write lock) and
    /// readers are not held back by a quiet writer.
    private func armTimerLocked() {
        guard !timerArmed, groupNanoseconds != .max else { return }
        timerArmed = true
        Self.groupTimers.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: groupNanoseconds))) { [weak self] in
            guard let self else { return }
            self.mutex.withLock {
                self.timerArmed = false
                self.closeGroupLocked()
            }
        }
    }

    /// Throws `.conflict` unless `e` holds; call inside the write transaction.
    private func check(_ e: Expectation) throws(StoreError) {
        var holds = false
        switch e {
        case .nameFree(let parent, let name):
            holds = true
            try run("SELECT 1 FROM dirents WHERE parent = ?1 AND name = ?2", bind: { b throws(StoreError) in
                try b.uint(1, parent)
                try b.blob(2, name)
            }, row: { _ in holds = false })
        case .nameIs(let parent, let name, let child):
            try run("SELECT child FROM dirents WHERE parent = ?1 AND name = ?2", bind: { b throws(StoreError) in
                try b.uint(1, parent)
                try b.blob(2, name)
            }, row: { r in holds = r.uint(0) == child })
        case .nodeAt(let ino, let change):
            try run("SELECT change_seq FROM nodes WHERE ino = ?1", bind: { b throws(StoreError) in try b.uint(1, ino) },
                    row: { r in holds = r.int(0) == change })
        case .containerRoot(let identifier, let root):
            var found: InodeNumber?
            try run("SELECT root_ino FROM containers WHERE identifier = ?1",
                    bind: { b throws(StoreError) in try b.text(1, identifier) }, row: { r in found = r.uint(0) })
            holds = found == root
        case .metaIs(let key, let value):
            var found: String?
            try run("SELECT value FROM meta WHERE key = ?1", bind: { b throws(StoreError) in try b.text(1, key) },
                    row: { r in found = r.text(0) })
            holds = found == value
        }
        if !holds { throw StoreError(.conflict, "\(path): expected \(e), which no longer holds") }
    }

    /// The last sequence number handed out (0 before the first commit); call inside a transaction.
    private func lastSeq() throws(StoreError) -> ChangeSeq {
        var seq: ChangeSeq = 0
        try run("SELECT seq FROM sqlite_sequence WHERE name = 'changes'", row: { r in seq = r.int(0) })
        return seq
    }

    public func changes(since seq: ChangeSeq) throws(StoreError) -> [ChangeRecord] {
        try changes(since: seq, notBy: nil)
    }

    /// Only the other writers' batches are read and decoded (a sync after 10,000 unlinks of its
    /// own read them all).
    public func changes(since seq: ChangeSeq, notBy writer: String) throws(StoreError) -> [ChangeRecord] {
        try changes(since: seq, notBy: .some(writer))
    }

    private func changes(since seq: ChangeSeq, notBy writer: String?) throws(StoreError) -> [ChangeRecord] {
        try mutex.withLock { () throws(StoreError) -> [ChangeRecord] in
            try settleLocked()
            // A daemon of this store died with commits in its journal: they land now, not at
            // the next write of whoever polls.
            if let journal, CommitJournal.orphanExists(in: journal.folder, own: journal) {
                try applyJournalsLocked()
            }
            var result: [ChangeRecord] = []
            // A list a row names and that is gone went with a version a later row deletes.
            let lists = ChunkListReader { (id) throws(StoreError) -> [UInt8]? in
                var found: [UInt8]?
                try self.run("SELECT chunks FROM chunk_lists WHERE id = ?1", bind: { b throws(StoreError) in try b.int(1, id) },
                             row: { r in found = r.blob(0) })
                return found
            }
            // One read transaction: the trim mark and the rows from one state of the database.
            try run("BEGIN")
            defer { if (try? run("COMMIT")) == nil { rollbackIfNeeded() } }
            let trimmed = try trimmedThrough()
            if seq < trimmed {
                throw StoreError(.trimmed, "\(path): the change log was trimmed through \(trimmed), past \(seq)")
            }
            try run("SELECT seq, writer, batch FROM changes WHERE seq > ?1 AND writer IS NOT ?2 ORDER BY seq",
                    bind: { b throws(StoreError) in
                        try b.int(1, seq)
                        if let writer { try b.text(2, writer) }   // unbound: NULL, which every writer is not
                    },
                    row: { (r) throws(StoreError) in
                let decoded = BatchCoding.decode(r.blob(2), lists: lists.list)
                if let error = lists.error { throw error }
                guard let mutations = decoded else {
                    throw StoreError(.corrupt, "\(path): change \(r.int(0)) cannot be read")
                }
                result.append(ChangeRecord(seq: r.int(0), writer: r.text(1), mutations: mutations))
            })
            return result
        }
    }

    private func trimmedThrough() throws(StoreError) -> ChangeSeq {
        var trimmed: ChangeSeq = 0
        try run("SELECT value FROM store_meta WHERE key = 'trimmed_through'", row: { r in trimmed = r.int(0) })
        return trimmed
    }

    public func trimChanges(keepingLast count: Int) throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in
            try settleLocked()
            try run("BEGIN IMMEDIATE")
            do throws(StoreError) {
                let cut = try lastSeq() - ChangeSeq(count)
                if cut > (try trimmedThrough()) {
                    try run("DELETE FROM changes WHERE seq <= ?1") { b throws(StoreError) in try b.int(1, cut) }
                    try run("INSERT OR REPLACE INTO store_meta(key, value) VALUES('trimmed_through', ?1)") { b throws(StoreError) in
                        try b.int(1, cut)
                    }
                }
                try run("COMMIT")
            } catch {
                rollbackIfNeeded()
                throw error
            }
        }
    }

    public func reserveInodes(_ count: Int) throws(StoreError) -> ClosedRange<InodeNumber> {
        let (first, last) = try reserve("max_ino", count, floor: 1)
        return InodeNumber(bitPattern: first)...InodeNumber(bitPattern: last)
    }

    public func reserveVersions(_ count: Int) throws(StoreError) -> ClosedRange<VersionID> {
        let (first, last) = try reserve("max_version", count, floor: 0)
        return first...last
    }

    /// Advance a high-water mark by `count` in a durable transaction: a reservation lost to a
    /// power cut could hand out ids again that a surviving working copy is named by.
    private func reserve(_ key: String, _ count: Int, floor: Int64) throws(StoreError) -> (Int64, Int64) {
        do throws(StoreError) {
            return try reserveOnce(key, count, floor: floor)
        } catch where error.kind == .noSpace && reserve?.release() == true {
            return try reserveOnce(key, count, floor: floor)   // as for a commit: the reserve makes room
        }
    }

    private func reserveOnce(_ key: String, _ count: Int, floor: Int64) throws(StoreError) -> (Int64, Int64) {
        precondition(count > 0)
        return try mutex.withLock { () throws(StoreError) -> (Int64, Int64) in
            try settleLocked()
            try run("PRAGMA synchronous=FULL")
            defer { try? run("PRAGMA synchronous=NORMAL") }
            try run("BEGIN IMMEDIATE")
            do throws(StoreError) {
                var current: Int64 = 0
                try run("SELECT value FROM store_meta WHERE key = ?1", bind: { b throws(StoreError) in try b.text(1, key) },
                        row: { r in current = r.int(0) })
                // Inode 1 is the mount root (FUSE_ROOT_ID): store nodes start at 2.
                let first = max(current, floor) + 1
                let last = first + Int64(count) - 1
                try run("UPDATE store_meta SET value = ?1 WHERE key = ?2") { b throws(StoreError) in
                    try b.int(1, last)
                    try b.text(2, key)
                }
                try run("COMMIT")
                return (first, last)
            } catch {
                rollbackIfNeeded()
                throw error
            }
        }
    }

    /// The container registry (every schema version has it). Call with `mutex` held.
    private func readContainers() throws(StoreError) -> [ContainerRecord] {
        var out: [ContainerRecord] = []
        try run("""
            SELECT identifier, bundle_identifier, name, is_public, folder_levels,
                   registered_version, manifest_path, root_ino FROM containers ORDER BY identifier
            """, row: { r in
            out.append(ContainerRecord(
                identifier: r.text(0), bundleIdentifier: r.text(1), name: r.text(2),
                isPublic: r.int(3) != 0, folderLevels: r.text(4), registeredVersion: r.text(5),
                manifestPath: r.text(6), rootIno: r.uint(7)))
        })
        return out
    }

    /// The registered containers alone, for `ubiquityfs containers`.
    public func containers() throws(StoreError) -> [ContainerRecord] {
        try reading { () throws(StoreError) -> [ContainerRecord] in
            return try readContainers()
        }
    }

    /// (max_ino, max_version) from `store_meta`; call inside a transaction.
    private func highWaterMarks() throws(StoreError) -> (UInt64, Int64) {
        var ino: Int64 = 0
        var version: Int64 = 0
        try run("SELECT key, value FROM store_meta WHERE key IN ('max_ino', 'max_version')", row: { r in
            if r.text(0) == "max_ino" { ino = r.int(1) } else { version = r.int(1) }
        })
        return (UInt64(bitPattern: ino), version)
    }

    private func rollbackIfNeeded() {
        lostSavepoint = nil
        if sqlite3_get_autocommit(db) == 0 {
            try? run("ROLLBACK")
            if sqlite3_get_autocommit(db) == 0 { sqlite3_exec(db, "ROLLBACK", nil, nil, nil) }
        }
    }

    private func apply(_ mutation: Mutation, seq: ChangeSeq, maxIno: inout UInt64, maxVersion: inout Int64) throws(StoreError) {
        switch mutation {
        case .putNode(let n):
            try run("""
                INSERT OR REPLACE INTO nodes(\(Self.nodeColumns), change_seq)
                VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
                """) { b throws(StoreError) in
                try b.uint(1, n.ino)
                try b.text(2, n.container)
                try b.int(3, Int64(n.kind.rawValue))
                try b.int(4, Int64(n.mode))
                try b.int(5, Int64(n.uid))
                try b.int(6, Int64(n.gid))
                try b.int(7, Int64(n.nlink))
                try b.uint(8, n.size)
                try b.int(9, n.atime)
                try b.int(10, n.mtime)
                try b.int(11, n.ctime)
                try b.int(12, n.btime)
                try b.uint(13, n.rdev)
                try b.blob(14, n.target)
                if let v = n.currentVersion { try b.int(15, v) } else { try b.null(15) }
                try b.int(16, seq)
            }
            maxIno = max(maxIno, n.ino)
        case .deleteNode(let ino):
            // The lists only its versions name go with them.
            for sql in ["DELETE FROM nodes WHERE ino = ?1", "DELETE FROM xattrs WHERE ino = ?1",
                        """
                        DELETE FROM chunk_lists WHERE id IN (SELECT list FROM versions WHERE ino = ?1)
                        AND NOT EXISTS (SELECT 1 FROM versions o WHERE o.list = chunk_lists.id AND o.ino <> ?1)
                        """,
                        "DELETE FROM versions WHERE ino = ?1"] {
                try run(sql) { b throws(StoreError) in try b.uint(1, ino) }
            }
        case .putDirent(let d):
            try run("INSERT OR REPLACE INTO dirents(parent, name, child) VALUES(?1, ?2, ?3)") { b throws(StoreError) in
                try b.uint(1, d.parent)
                try b.blob(2, d.name)
                try b.uint(3, d.child)
            }
        case .deleteDirent(let parent, let name):
            try run("DELETE FROM dirents WHERE parent = ?1 AND name = ?2") { b throws(StoreError) in
                try b.uint(1, parent)
                try b.blob(2, name)
            }
        case .putXattr(let x):
            try run("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES(?1, ?2, ?3)") { b throws(StoreError) in
                try b.uint(1, x.ino)
                try b.blob(2, x.name)
                try b.blob(3, x.value)
            }
        case .deleteXattr(let ino, let name):
            try run("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2") { b throws(StoreError) in
                try b.uint(1, ino)
                try b.blob(2, name)
            }
        case .putVersion(let v):
            let (list, chunks) = try storedChunks(of: v)
            if let list { sharedInBatch[v.id] = (list, chunks) }
            // Plain INSERT: versions are immutable, a second put of one id is an error.
            try run("""
                INSERT INTO versions(id, ino, created, size, origin, device, chunks, moved_from, list)
                VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                """) { b throws(StoreError) in
                try b.int(1, v.id)
                try b.uint(2, v.ino)
                try b.int(3, v.created)
                try b.uint(4, v.size)
                try b.text(5, v.origin.rawValue)
                try b.text(6, v.device)
                try b.blob(7, chunks)
                if let from = v.movedFrom { try b.uint(8, from) }
                if let list { try b.int(9, list) }
            }
            maxVersion = max(maxVersion, v.id)
        case .putContainer(let c):
            try run("""
                INSERT OR REPLACE INTO containers(identifier, bundle_identifier, name, is_public,
                    folder_levels, registered_version, manifest_path, root_ino)
                VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                """) { b throws(StoreError) in
                try b.text(1, c.identifier)
                try b.text(2, c.bundleIdentifier)
                try b.text(3, c.name)
                try b.int(4, c.isPublic ? 1 : 0)
                try b.text(5, c.folderLevels)
                try b.text(6, c.registeredVersion)
                try b.text(7, c.manifestPath)
                try b.uint(8, c.rootIno)
            }
        case .deleteVersion(let id):
            var list: Int64?
            try run("SELECT list FROM versions WHERE id = ?1", bind: { b throws(StoreError) in try b.int(1, id) },
                    row: { r in list = r.isNull(0) ? nil : r.int(0) })
            try run("DELETE FROM versions WHERE id = ?1") { b throws(StoreError) in try b.int(1, id) }
            if let list {
                try run("DELETE FROM chunk_lists WHERE id = ?1 AND NOT EXISTS (SELECT 1 FROM versions WHERE list = ?1)") {
                    b throws(StoreError) in try b.int(1, list)
                }
            }
        case .moveVersions(let from, let to):
            try run("UPDATE versions SET ino = ?2, moved_from = coalesce(moved_from, ?1) WHERE ino = ?1") { b throws(StoreError) in
                try b.uint(1, from)
                try b.uint(2, to)
            }
        case .deleteMeta(let key):
            try run("DELETE FROM meta WHERE key = ?1") { b throws(StoreError) in try b.text(1, key) }
        case .setMeta(let key, let value):
            try run("INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)") { b throws(StoreError) in
                try b.text(1, key)
                try b.text(2, value)
            }
        }
    }

    /// How a version's chunk list is stored: whole in its row (no list) when short; else against
    /// the list the file's newest version names (`ChunkDelta.shared`: a publish changes a few
    /// chunks of a big file, an append its tail), or in a new list. A new list takes the id of
    /// the version it is made for, so a replay of the same batches (a journal, a replica) makes
    /// the same lists; a list of that id, if there is one, is that version's whole list already
    /// (versions never change). No list row changes: deleting a version deletes its list only
    /// when no other version names it. Caller holds mutex, inside a transaction.
    private func storedChunks(of v: VersionRecord) throws(StoreError) -> (list: Int64?, bytes: [UInt8]) {
        guard v.chunks.count >= ChunkDelta.sharedListMinimum else { return (nil, ChunkPacking.pack(v.chunks)) }
        var base: (id: Int64, chunks: [ChunkRef])?
        try run("""
            SELECT l.id, l.chunks FROM versions v JOIN chunk_lists l ON l.id = v.list
            WHERE v.ino = ?1 ORDER BY v.id DESC LIMIT 1
            """, bind: { b throws(StoreError) in try b.uint(1, v.ino) },
            row: { (r) throws(StoreError) in
                guard let chunks = r.withBlob(1, ChunkPacking.unpack) else {
                    throw StoreError(errno: EIO, "\(path): chunk list \(r.int(0)) is malformed")
                }
                base = (r.int(0), chunks)
            })
        if let shared = ChunkDelta.shared(v.chunks, over: base) { return (shared.list, shared.changes) }
        try run("INSERT OR IGNORE INTO chunk_lists(id, chunks) VALUES(?1, ?2)") { b throws(StoreError) in
            try b.int(1, v.id)
            try b.blob(2, ChunkPacking.pack(v.chunks))
        }
        return (v.id, ChunkDelta.pack(count: v.chunks.count, []))
    }

    public func versions(of ino: InodeNumber) throws(StoreError) -> [VersionRecord] {
        try reading { () throws(StoreError) -> [VersionRecord] in
            var result: [VersionRecord] = []
            try run("\(versionSelect) WHERE v.ino = ?1 ORDER BY v.id",
                    bind: { b throws(StoreError) in try b.uint(1, ino) },
                    row: { (r) throws(StoreError) in result.append(try decodeVersion(r)) })
            return result
        }
    }

    public func versionCount(of ino: InodeNumber) throws(StoreError) -> Int {
        try reading { () throws(StoreError) -> Int in
            var count = 0
            try run("SELECT count(*) FROM versions WHERE ino = ?1",
                    bind: { b throws(StoreError) in try b.uint(1, ino) },
                    row: { (r) throws(StoreError) in count = Int(r.int(0)) })
            return count
        }
    }

    public func allVersions() throws(StoreError) -> [VersionRecord] {
        try reading { () throws(StoreError) -> [VersionRecord] in
            var result: [VersionRecord] = []
            try run("\(versionSelect) ORDER BY v.id",
                    row: { (r) throws(StoreError) in result.append(try decodeVersion(r)) })
            return result
        }
    }

    public func versions(withOrigin origin: VersionOrigin) throws(StoreError) -> [VersionRecord] {
        try reading { () throws(StoreError) -> [VersionRecord] in
            var result: [VersionRecord] = []
            try run("\(versionSelect) WHERE v.origin = ?1 ORDER BY v.id",
                    bind: { b throws(StoreError) in try b.text(1, origin.rawValue) },
                    row: { (r) throws(StoreError) in result.append(try decodeVersion(r)) })
            return result
        }
    }

    public func version(_ id: VersionID) throws(StoreError) -> VersionRecord? {
        try reading { () throws(StoreError) -> VersionRecord? in
            var result: VersionRecord?
            try run("\(versionSelect) WHERE v.id = ?1",
                    bind: { b throws(StoreError) in try b.int(1, id) },
                    row: { (r) throws(StoreError) in result = try decodeVersion(r) })
            return result
        }
    }

    public func capacity() -> StoreCapacity {
        capacityOfFilesystem(at: folder)
    }

    public func referencedBlobs() throws(StoreError) -> Set<BlobID> {
        try reading { () throws(StoreError) -> Set<BlobID> in
            var result: Set<BlobID> = []
            // Every entry of every list, whole or shared, and of every version's changes: a
            // shared list may name chunks its versions all replaced, which keeps them a while
            // longer (collection only frees what nothing names).
            func add(_ chunks: [ChunkRef]?) throws(StoreError) {
                guard let chunks else { throw StoreError(errno: EIO, "\(path): a version's chunk list is corrupt") }
                for c in chunks where !c.isHole { result.insert(c.blob) }
            }
            try run("SELECT chunks, list FROM versions", row: { (r) throws(StoreError) in
                try add(r.withBlob(0, { r.isNull(1) ? ChunkPacking.unpack($0) : ChunkDelta.changes($0)?.map(\.chunk) }))
            })
            try run("SELECT chunks FROM chunk_lists", row: { (r) throws(StoreError) in
                try add(r.withBlob(0, { ChunkPacking.unpack($0) }))
            })
            return result
        }
    }

    // MARK: For tests

    /// How each version's chunk list is stored: the list it names and its row's bytes; the
    /// shared lists there are; and the bytes of each change-log row.
    func chunkListStorage() throws(StoreError)
        -> (versions: [(id: VersionID, list: Int64?, bytes: Int)], lists: [Int64], changeBytes: [Int]) {
        try mutex.withLock { () throws(StoreError) -> (versions: [(id: VersionID, list: Int64?, bytes: Int)], lists: [Int64], changeBytes: [Int]) in
            var versions: [(id: VersionID, list: Int64?, bytes: Int)] = [], lists: [Int64] = [], changeBytes: [Int] = []
            try run("SELECT id, list, length(chunks) FROM versions ORDER BY id", row: { r in
                versions.append((r.int(0), r.isNull(1) ? nil : r.int(1), Int(r.int(2))))
            })
            try run("SELECT id FROM chunk_lists ORDER BY id", row: { r in lists.append(r.int(0)) })
            try run("SELECT length(batch) FROM changes ORDER BY seq", row: { r in changeBytes.append(Int(r.int(0))) })
            return (versions, lists, changeBytes)
        }
    }

    /// The value of a pragma (e.g. "synchronous", "journal_mode"), as text.
    func pragma(_ name: String) throws(StoreError) -> String? {
        try mutex.withLock { () throws(StoreError) -> String? in
            var result: String?
            try run("PRAGMA \(name)", row: { r in result = r.text(0) })
            return result
        }
    }
}

/// statvfs of `path`'s filesystem; zeros if it fails.
package func capacityOfFilesystem(at path: String) -> StoreCapacity {
    var st = statvfs()
    guard retryEINTR({ statvfs(path, &st) }) == 0 else {
        return StoreCapacity(blockSize: 0, totalBlocks: 0, freeBlocks: 0, availableBlocks: 0,
                             totalFiles: 0, freeFiles: 0)
    }
    return StoreCapacity(blockSize: UInt64(st.f_frsize), totalBlocks: UInt64(st.f_blocks),
                         freeBlocks: UInt64(st.f_bfree), availableBlocks: UInt64(st.f_bavail),
                         totalFiles: UInt64(st.f_files), freeFiles: UInt64(st.f_ffree))
}
