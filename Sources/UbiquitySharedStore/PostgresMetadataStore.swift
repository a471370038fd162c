// The shared store's metadata on PostgreSQL: the same tables and change log as the embedded store,
// one transaction per batch.
//
// Ordering: a commit first takes the `seq` row of `ubiquityfs.store` (UPDATE … RETURNING), which
// every commit of every machine updates, so commits are serialized there and take positions in
// commit order. Expectations are checked after that, under READ COMMITTED, so each check sees
// every commit before this one: no two writers can both find a name free.
//
// Durability: PostgreSQL's commits are durable (synchronous_commit stays on even for a
// non-durable batch: another machine may already have built on a commit, so a server crash must
// not take it back).
//
// A connection lost while COMMIT was on its way leaves it unknown whether the batch landed. Each
// batch carries a random token in its change-log row: after reconnecting the store looks for it,
// so a batch is never applied twice and never reported failed when it landed.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

public final class PostgresMetadataStore: MetadataStore, @unchecked Sendable {
    // `mutex` guards `connection` (one statement at a time); `listenMutex` guards `listener`.
    private let mutex = StoreMutex()
    private let connection: PGConnection
    private let listenMutex = StoreMutex()
    private let listener: PGConnection
    private let url: String
    /// The local folder whose disk `capacity()` reports (working copies and cached chunks).
    private let capacityPath: String
    // `presenceMutex` guards `present` and `heartbeat`.
    private let presenceMutex = StoreMutex()
    /// Writers of this process announced in `presence`, renewed until withdrawn.
    private var present: Set<String> = []
    private var heartbeat: Thread?
    /// How long a daemon counts as running after its last renewal: long, since a machine cut off
    /// from the server goes on serving its programs, and what waits for every other writer to be
    /// gone (removing files unlinked while open) must not run under its feet.
    static let presenceSeconds: Int64 = 3600

    /// Connects to the store at `url` (a libpq URI without a password). `create`: make the schema
    /// if the database has none (`init-store`); otherwise a missing schema is a clear error.
    private let reachable: Reachability

    public convenience init(url: String, timeout: Double = 10, capacityPath: String = "/", create: Bool = false) throws(StoreError) {
        try self.init(url: url, timeout: timeout, capacityPath: capacityPath, create: create, reachability: Reachability())
    }

    /// `check`: whether to check the schema now (false: the servers are out of reach, and
    /// `checkSchemaNow` runs once they answer, before anything else is sent).
    init(url: String, timeout: Double, capacityPath: String, create: Bool, reachability: Reachability,
         check: Bool = true) throws(StoreError) {
        try checkPostgresURL(url)
        self.url = url
        self.capacityPath = capacityPath
        reachable = reachability
        connection = PGConnection(PGTarget(url: url, timeout: timeout, reachability: reachability))
        listener = PGConnection(PGTarget(url: url, timeout: timeout, applicationName: "ubiquityfs change feed",
                                         reachability: reachability))
        if check { try checkSchema(connection, url: url, create: create) }
    }

    /// The check `init` left for when the servers answer.
    func checkSchemaNow() throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in try checkSchema(connection, url: url, create: false) }
    }

    /// The store's id and where it keeps its chunks, as `init-store` recorded them.
    func identity() throws(StoreError) -> (id: String, chunks: ChunkLocation) {
        try mutex.withLock { () throws(StoreError) in (try storeID(connection, url: url), try recordedChunks(connection, url: url)) }
    }

    // MARK: Rows

    /// The lists the versions of the batch being committed were stored against, for its
    /// change-log row. Guarded by mutex (commits run under it).
    private var sharedInBatch: BatchCoding.SharedChunks = [:]

    private static let nodeColumns = "ino, container, kind, mode, uid, gid, nlink, size, atime, mtime, ctime, btime, rdev, target, current_version"
    /// A version row with the shared list it names, if any; queries add `WHERE v.…`.
    private static let versionSelect = """
        SELECT v.id, v.ino, v.created, v.size, v.origin, v.device, v.chunks, v.moved_from, v.list, l.chunks
        FROM ubiquityfs.versions v LEFT JOIN ubiquityfs.chunk_lists l ON l.id = v.list
        """

    private func corrupt(_ what: String) -> StoreError {
        StoreError(.corrupt, "\(redacted(url)): \(what)")
    }

    private func node(_ r: PGResult, _ i: Int, containers: TextInterner) throws(StoreError) -> NodeRecord {
        let ino = r.uint(i, 0)
        guard let raw = UInt8(exactly: r.int(i, 2)), let kind = NodeKind(rawValue: raw) else {
            throw corrupt("node \(ino) has unknown kind \(r.int(i, 2))")
        }
        return NodeRecord(ino: ino, container: try r.withBytes(i, 1, containers.text), kind: kind,
                          mode: UInt32(truncatingIfNeeded: r.int(i, 3)), uid: UInt32(truncatingIfNeeded: r.int(i, 4)),
                          gid: UInt32(truncatingIfNeeded: r.int(i, 5)), nlink: UInt32(truncatingIfNeeded: r.int(i, 6)),
                          size: r.uint(i, 7), atime: r.int(i, 8), mtime: r.int(i, 9), ctime: r.int(i, 10),
                          btime: r.int(i, 11), rdev: r.uint(i, 12), target: r.bytes(i, 13),
                          currentVersion: r.isNull(i, 14) ? nil : r.int(i, 14))
    }

    private func version(_ r: PGResult, _ i: Int) throws(StoreError) -> VersionRecord {
        let id = r.int(i, 0)
        guard let origin = VersionOrigin(rawValue: r.text(i, 4)) else {
            throw corrupt("version \(id) has unknown origin \(r.text(i, 4))")
        }
        if !r.isNull(i, 8) && r.isNull(i, 9) {
            throw corrupt("version \(id) names chunk list \(r.int(i, 8)), which is missing")
        }
        let chunks = try r.withBytes(i, 6) { (stored) throws(StoreError) in
            try r.withBytes(i, 9) { list in ChunkDelta.chunks(stored, list: r.isNull(i, 8) ? nil : list) }
        }
        guard let chunks else {
            throw corrupt("version \(id) has a malformed chunk list")
        }
        return VersionRecord(id: id, ino: r.uint(i, 1), created: r.int(i, 2), size: r.uint(i, 3),
                             chunks: chunks, origin: origin, device: r.text(i, 5),
                             movedFrom: r.isNull(i, 7) ? nil : r.uint(i, 7))
    }

    private func versions(_ r: PGResult) throws(StoreError) -> [VersionRecord] {
        var out: [VersionRecord] = []
        out.reserveCapacity(r.count)
        for i in 0..<r.count { out.append(try version(r, i)) }
        return out
    }

    /// Runs `body` in a read-only transaction that sees one state of the database.
    private func reading<R>(_ body: () throws(StoreError) -> R) throws(StoreError) -> R {
        try mutex.withLock { () throws(StoreError) -> R in
            try connection.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", body)
        }
    }

    // MARK: MetadataStore

    public func load() throws(StoreError) -> StoreSnapshot {
        try reading { () throws(StoreError) -> StoreSnapshot in
            let c = connection
            var s = StoreSnapshot()
            let nodes = try c.query("SELECT \(Self.nodeColumns), change_seq FROM ubiquityfs.nodes ORDER BY ino")
            s.nodes.reserveCapacity(nodes.count)
            s.nodeChangeSeqs.reserveCapacity(nodes.count)
            let containers = TextInterner()
            for i in 0..<nodes.count {
                let n = try node(nodes, i, containers: containers)
                s.nodes.append(n)
                s.nodeChangeSeqs.append(nodes.int(i, 15))
            }
            let dirents = try c.query("SELECT parent, name, child FROM ubiquityfs.dirents")
            s.dirents.reserveCapacity(dirents.count)
            for i in 0..<dirents.count {
                s.dirents.append(DirentRecord(parent: dirents.uint(i, 0), name: dirents.bytes(i, 1), child: dirents.uint(i, 2)))
            }
            let xattrs = try c.query("SELECT ino, name, value FROM ubiquityfs.xattrs")
            for i in 0..<xattrs.count {
                s.xattrs.append(XattrRecord(ino: xattrs.uint(i, 0), name: xattrs.bytes(i, 1), value: xattrs.bytes(i, 2)))
            }
            s.containers = try readContainers()
            s.currentVersions = try versions(c.query("""
                \(Self.versionSelect)
                WHERE v.id IN (SELECT current_version FROM ubiquityfs.nodes WHERE current_version IS NOT NULL) ORDER BY v.id
                """))
            let meta = try c.query("SELECT key, value FROM ubiquityfs.meta")
            for i in 0..<meta.count { s.meta[meta.text(i, 0)] = meta.text(i, 1) }
            let counters = try self.counters()
            s.maxIno = UInt64(bitPattern: counters["max_ino"] ?? 0)
            s.maxVersion = counters["max_version"] ?? 0
            s.seq = counters["seq"] ?? 0
            return s
        }
    }

    /// The rows of `ubiquityfs.store`. Call inside a transaction.
    private func counters() throws(StoreError) -> [String: Int64] {
        let r = try connection.query("SELECT key, value FROM ubiquityfs.store")
        var out: [String: Int64] = [:]
        for i in 0..<r.count { out[r.text(i, 0)] = r.int(i, 1) }
        return out
    }

    private func readContainers() throws(StoreError) -> [ContainerRecord] {
        let r = try connection.query("""
            SELECT identifier, bundle_identifier, name, is_public, folder_levels, registered_version,
                   manifest_path, root_ino FROM ubiquityfs.containers ORDER BY identifier
            """)
        return (0..<r.count).map { i in
            ContainerRecord(identifier: r.text(i, 0), bundleIdentifier: r.text(i, 1), name: r.text(i, 2),
                            isPublic: r.int(i, 3) != 0, folderLevels: r.text(i, 4), registeredVersion: r.text(i, 5),
                            manifestPath: r.text(i, 6), rootIno: r.uint(i, 7))
        }
    }

    /// The registered containers alone, for `ubiquityfs containers`.
    public func containers() throws(StoreError) -> [ContainerRecord] {
        try mutex.withLock { () throws(StoreError) -> [ContainerRecord] in try readContainers() }
    }

    public func commit(_ batch: Batch, durable: Bool) throws(StoreError) -> ChangeSeq {
        var unknown: Int32?
        return try commit(batch, token: batch.token ?? UUID().uuidString, unknownOutcome: &unknown)
    }

    /// Commits `batch` under `token` (the change-log row's, which tells whether it landed).
    /// When it fails with the answer to COMMIT lost and no way yet to tell whether it landed,
    /// `unknownOutcome` is the server process that had it (see `landed(token:backend:)`).
    func commit(_ batch: Batch, token: String, unknownOutcome: inout Int32?) throws(StoreError) -> ChangeSeq {
        unknownOutcome = nil
        return try mutex.withLock { () throws(StoreError) -> ChangeSeq in
            var attempt = 0
            while true {
                attempt += 1
                var committing = false
                var backend: Int32 = 0
                do {
                    return try commitOnce(batch, token: token, committing: &committing, backend: &backend)
                } catch let failure as PGFailure {
                    if connection.isConnected { _ = try? connection.run("ROLLBACK", []) }
                    if failure.mustRetry && attempt < 20 {
                        usleep(UInt32.random(in: 1_000...(5_000 * UInt32(min(attempt, 10)))))
                        continue
                    }
                    throw StoreError(errno: failure.sqlState == "53100" ? ENOSPC : EIO,
                                     "PostgreSQL: \(failure.message) (SQLSTATE \(failure.sqlState))")
                } catch let error as StoreError {
                    if connection.isConnected { _ = try? connection.run("ROLLBACK", []) }
                    if error.kind == .unavailable && committing && !batch.mutations.isEmpty {
                        // COMMIT was sent and the answer lost: did it land? Only once the server
                        // process that had it is gone can its absence be trusted.
                        do throws(StoreError) {
                            if let seq = try landedLocked(token: token, backend: backend) { return seq }
                        } catch {
                            unknownOutcome = backend
                            throw error
                        }
                    }
                    throw error
                } catch {
                    throw StoreError(errno: EIO, "PostgreSQL: \(error)")
                }
            }
        }
    }

    /// Whether the batch committed under `token` landed, and where (nil: it did not), once the
    /// server process `backend` that had it is gone. Throws if that cannot be known yet.
    func landed(token: String, backend: Int32) throws(StoreError) -> ChangeSeq? {
        try mutex.withLock { () throws(StoreError) -> ChangeSeq? in try landedLocked(token: token, backend: backend) }
    }

    /// The server's clock, in nanoseconds since the epoch (the clock chunks are judged old by:
    /// the servers' clocks are taken to agree, a machine's may not).
    func serverNanoseconds() throws(StoreError) -> Int64 {
        try mutex.withLock { () throws(StoreError) -> Int64 in
            try connection.query("SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint").int(0, 0)
        }
    }

    /// Whether the servers answer now (one short statement).
    func probe() -> Bool {
        (try? mutex.withLock { () throws(StoreError) in _ = try connection.query("SELECT 1") }) != nil
    }

    /// After a lost answer to COMMIT: ends the server process that had the transaction (if it
    /// is still there), waits for it to go, then looks for the batch's token. Nil: it did not
    /// land. Throws if that cannot be known.
    private func landedLocked(token: String, backend: Int32) throws(StoreError) -> ChangeSeq? {
        let deadline = Date().addingTimeInterval(connection.target.timeout)
        if backend != 0 {
            _ = try? connection.query("SELECT pg_terminate_backend($1::integer)", [.int(Int64(backend))])
            while try connection.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1::integer", [.int(Int64(backend))]).count > 0 {
                if Date() > deadline {
                    throw StoreError(.unavailable, "\(redacted(url)): whether a commit landed is not known yet (its server "
                                     + "process \(backend) is still there)")
                }
                usleep(20_000)
            }
        }
        for table in ["changes", "tokens"] {
            let found = try connection.query("SELECT seq FROM ubiquityfs.\(table) WHERE token = $1", [.text(token)])
            if found.count > 0 { return found.int(0, 0) }
        }
        return nil
    }

    private func commitOnce(_ batch: Batch, token: String, committing: inout Bool, backend: inout Int32) throws -> ChangeSeq {
        let c = connection
        try c.run("BEGIN", [])
        backend = c.backendPID
        if batch.mutations.isEmpty {
            // Nothing to log. PostgreSQL's commits are durable, so a durable empty batch (a
            // barrier) has nothing to wait for either.
            for e in batch.expectations { try check(e) }
            let seq = try c.execute("SELECT value FROM ubiquityfs.store WHERE key = 'seq'", []).int(0, 0)
            try c.run("COMMIT", [])
            return seq
        }
        // Takes the row every commit updates: from here this transaction is the only committer.
        let seq = try c.execute("UPDATE ubiquityfs.store SET value = value + 1 WHERE key = 'seq' RETURNING value", []).int(0, 0)
        for e in batch.expectations { try check(e) }
        var maxIno: UInt64 = 0
        var maxVersion: Int64 = 0
        sharedInBatch = [:]
        defer { sharedInBatch = [:] }
        for mutation in batch.mutations { try apply(mutation, seq: seq, maxIno: &maxIno, maxVersion: &maxVersion) }
        // A big file's version names its shared list in the log as in its row.
        try c.execute("INSERT INTO ubiquityfs.changes(seq, writer, token, batch) VALUES($1, $2, $3, $4)",
                      [.int(seq), .text(batch.writer), .text(token), .bytes(BatchCoding.encode(batch.mutations, shared: sharedInBatch))])
        // The high-water marks, compared unsigned as the embedded store does (row-locked:
        // reservations move them outside the commit order).
        if maxIno != 0 {
            let current = try c.execute("SELECT value FROM ubiquityfs.store WHERE key = 'max_ino' FOR UPDATE", []).uint(0, 0)
            if maxIno > current {
                try c.execute("UPDATE ubiquityfs.store SET value = $1 WHERE key = 'max_ino'", [.int(Int64(bitPattern: maxIno))])
            }
        }
        if maxVersion != 0 {
            try c.execute("UPDATE ubiquityfs.store SET value = GREATEST(value, $1) WHERE key = 'max_version'", [.int(maxVersion)])
        }
        try c.execute("SELECT pg_notify($1, $2)", [.text(changeChannel), .text(String(seq))])
        committing = true
        try c.run("COMMIT", [])
        return seq
    }

    /// Throws `.conflict` unless `e` holds; call inside the commit's transaction.
    private func check(_ e: Expectation) throws {
        let c = connection
        let holds: Bool
        switch e {
        case .nameFree(let parent, let name):
            holds = try c.execute("SELECT 1 FROM ubiquityfs.dirents WHERE parent = $1 AND name = $2",
                                  [.int(Int64(bitPattern: parent)), .bytes(name)]).count == 0
        case .nameIs(let parent, let name, let child):
            let r = try c.execute("SELECT child FROM ubiquityfs.dirents WHERE parent = $1 AND name = $2",
                                  [.int(Int64(bitPattern: parent)), .bytes(name)])
            holds = r.count == 1 && r.uint(0, 0) == child
        case .nodeAt(let ino, let change):
            let r = try c.execute("SELECT change_seq FROM ubiquityfs.nodes WHERE ino = $1", [.int(Int64(bitPattern: ino))])
            holds = r.count == 1 && r.int(0, 0) == change
        case .containerRoot(let identifier, let root):
            let r = try c.execute("SELECT root_ino FROM ubiquityfs.containers WHERE identifier = $1", [.text(identifier)])
            holds = (r.count == 1 ? r.uint(0, 0) : nil) == root
        case .metaIs(let key, let value):
            let r = try c.execute("SELECT value FROM ubiquityfs.meta WHERE key = $1", [.text(key)])
            holds = (r.count == 1 ? r.text(0, 0) : nil) == value
        }
        if !holds { throw StoreError(.conflict, "\(redacted(url)): expected \(e), which no longer holds") }
    }

    private func apply(_ mutation: Mutation, seq: ChangeSeq, maxIno: inout UInt64, maxVersion: inout Int64) throws {
        let c = connection
        switch mutation {
        case .putNode(let n):
            try c.execute("""
                INSERT INTO ubiquityfs.nodes(\(Self.nodeColumns), change_seq)
                VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
                ON CONFLICT (ino) DO UPDATE SET container = EXCLUDED.container, kind = EXCLUDED.kind,
                    mode = EXCLUDED.mode, uid = EXCLUDED.uid, gid = EXCLUDED.gid, nlink = EXCLUDED.nlink,
                    size = EXCLUDED.size, atime = EXCLUDED.atime, mtime = EXCLUDED.mtime, ctime = EXCLUDED.ctime,
                    btime = EXCLUDED.btime, rdev = EXCLUDED.rdev, target = EXCLUDED.target,
                    current_version = EXCLUDED.current_version, change_seq = EXCLUDED.change_seq
                """, [.int(Int64(bitPattern: n.ino)), .text(n.container), .int(Int64(n.kind.rawValue)), .int(Int64(n.mode)),
                      .int(Int64(n.uid)), .int(Int64(n.gid)), .int(Int64(n.nlink)), .int(Int64(bitPattern: n.size)),
                      .int(n.atime), .int(n.mtime), .int(n.ctime), .int(n.btime), .int(Int64(bitPattern: n.rdev)),
                      .bytes(n.target), .int(n.currentVersion), .int(seq)])
            if maxIno == 0 || n.ino > maxIno { maxIno = n.ino }
        case .deleteNode(let ino):
            // The lists only its versions name go with them.
            for sql in ["DELETE FROM ubiquityfs.nodes WHERE ino = $1", "DELETE FROM ubiquityfs.xattrs WHERE ino = $1",
                        """
                        DELETE FROM ubiquityfs.chunk_lists l WHERE l.id IN (SELECT list FROM ubiquityfs.versions WHERE ino = $1)
                        AND NOT EXISTS (SELECT 1 FROM ubiquityfs.versions o WHERE o.list = l.id AND o.ino <> $1)
                        """,
                        "DELETE FROM ubiquityfs.versions WHERE ino = $1"] {
                try c.execute(sql, [.int(Int64(bitPattern: ino))])
            }
        case .putDirent(let d):
            try c.execute("""
                INSERT INTO ubiquityfs.dirents(parent, name, child) VALUES($1, $2, $3)
                ON CONFLICT (parent, name) DO UPDATE SET child = EXCLUDED.child
                """, [.int(Int64(bitPattern: d.parent)), .bytes(d.name), .int(Int64(bitPattern: d.child))])
        case .deleteDirent(let parent, let name):
            try c.execute("DELETE FROM ubiquityfs.dirents WHERE parent = $1 AND name = $2",
                          [.int(Int64(bitPattern: parent)), .bytes(name)])
        case .putXattr(let x):
            try c.execute("""
                INSERT INTO ubiquityfs.xattrs(ino, name, value) VALUES($1, $2, $3)
                ON CONFLICT (ino, name) DO UPDATE SET value = EXCLUDED.value
                """, [.int(Int64(bitPattern: x.ino)), .bytes(x.name), .bytes(x.value)])
        case .deleteXattr(let ino, let name):
            try c.execute("DELETE FROM ubiquityfs.xattrs WHERE ino = $1 AND name = $2", [.int(Int64(bitPattern: ino)), .bytes(name)])
        case .putVersion(let v):
            let (list, chunks) = try storedChunks(of: v)
            if let list { sharedInBatch[v.id] = (list, chunks) }
            // Plain INSERT: versions are immutable, a second put of one id is an error.
            try c.execute("""
                INSERT INTO ubiquityfs.versions(id, ino, created, size, origin, device, chunks, moved_from, list)
                VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9)
                """,
                          [.int(v.id), .int(Int64(bitPattern: v.ino)), .int(v.created), .int(Int64(bitPattern: v.size)),
                           .text(v.origin.rawValue), .text(v.device), .bytes(chunks),
                           .int(v.movedFrom.map { Int64(bitPattern: $0) }), .int(list)])
            maxVersion = max(maxVersion, v.id)
        case .putContainer(let r):
            try c.execute("""
                INSERT INTO ubiquityfs.containers(identifier, bundle_identifier, name, is_public, folder_levels,
                    registered_version, manifest_path, root_ino) VALUES($1, $2, $3, $4, $5, $6, $7, $8)
                ON CONFLICT (identifier) DO UPDATE SET bundle_identifier = EXCLUDED.bundle_identifier,
                    name = EXCLUDED.name, is_public = EXCLUDED.is_public, folder_levels = EXCLUDED.folder_levels,
                    registered_version = EXCLUDED.registered_version, manifest_path = EXCLUDED.manifest_path,
                    root_ino = EXCLUDED.root_ino
                """, [.text(r.identifier), .text(r.bundleIdentifier), .text(r.name), .int(r.isPublic ? 1 : 0),
                      .text(r.folderLevels), .text(r.registeredVersion), .text(r.manifestPath),
                      .int(Int64(bitPattern: r.rootIno))])
        case .deleteVersion(let id):
            let gone = try c.execute("DELETE FROM ubiquityfs.versions WHERE id = $1 RETURNING list", [.int(id)])
            if gone.count == 1, !gone.isNull(0, 0) {
                try c.execute("""
                    DELETE FROM ubiquityfs.chunk_lists WHERE id = $1
                    AND NOT EXISTS (SELECT 1 FROM ubiquityfs.versions WHERE list = $1)
                    """, [.int(gone.int(0, 0))])
            }
        case .moveVersions(let from, let to):
            try c.execute("UPDATE ubiquityfs.versions SET ino = $2, moved_from = coalesce(moved_from, $1) WHERE ino = $1",
                          [.int(Int64(bitPattern: from)), .int(Int64(bitPattern: to))])
        case .deleteMeta(let key):
            try c.execute("DELETE FROM ubiquityfs.meta WHERE key = $1", [.text(key)])
        case .setMeta(let key, let value):
            try c.execute("""
                INSERT INTO ubiquityfs.meta(key, value) VALUES($1, $2)
                ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
                """, [.text(key), .text(value)])
        }
    }

    /// As the embedded store's (see there): how a big file's version is stored, against the
    /// list its file's newest version names, or in a new list of its own id. Inside the
    /// commit's transaction.
    private func storedChunks(of v: VersionRecord) throws -> (list: Int64?, bytes: [UInt8]) {
        guard v.chunks.count >= ChunkDelta.sharedListMinimum else { return (nil, ChunkPacking.pack(v.chunks)) }
        let c = connection
        let found = try c.execute("""
            SELECT l.id, l.chunks FROM ubiquityfs.versions v JOIN ubiquityfs.chunk_lists l ON l.id = v.list
            WHERE v.ino = $1 ORDER BY v.id DESC LIMIT 1
            """, [.int(Int64(bitPattern: v.ino))])
        var base: (id: Int64, chunks: [ChunkRef])?
        if found.count == 1 {
            guard let chunks = try found.withBytes(0, 1, { ChunkPacking.unpack($0) }) else {
                throw corrupt("chunk list \(found.int(0, 0)) is malformed")
            }
            base = (found.int(0, 0), chunks)
        }
        if let shared = ChunkDelta.shared(v.chunks, over: base) { return (shared.list, shared.changes) }
        try c.execute("INSERT INTO ubiquityfs.chunk_lists(id, chunks) VALUES($1, $2) ON CONFLICT (id) DO NOTHING",
                      [.int(v.id), .bytes(ChunkPacking.pack(v.chunks))])
        return (v.id, ChunkDelta.pack(count: v.chunks.count, []))
    }

    public func changes(since seq: ChangeSeq) throws(StoreError) -> [ChangeRecord] {
        try reading { () throws(StoreError) -> [ChangeRecord] in
            let trimmed = try connection.query("SELECT value FROM ubiquityfs.store WHERE key = 'trimmed_through'").int(0, 0)
            if seq < trimmed {
                throw StoreError(.trimmed, "\(redacted(url)): the change log was trimmed through \(trimmed), past \(seq)")
            }
            let r = try connection.query("SELECT seq, writer, batch FROM ubiquityfs.changes WHERE seq > $1 ORDER BY seq", [.int(seq)])
            var out: [ChangeRecord] = []
            out.reserveCapacity(r.count)
            // A list a row names and that is gone went with a version a later row deletes.
            let connection = self.connection
            let lists = ChunkListReader { (id) throws(StoreError) -> [UInt8]? in
                let found = try connection.query("SELECT chunks FROM ubiquityfs.chunk_lists WHERE id = $1", [.int(id)])
                return found.count == 1 ? found.bytes(0, 0) : nil
            }
            for i in 0..<r.count {
                let decoded = BatchCoding.decode(r.bytes(i, 2), lists: lists.list)
                if let error = lists.error { throw error }
                guard let mutations = decoded else {
                    throw corrupt("change \(r.int(i, 0)) cannot be read")
                }
                out.append(ChangeRecord(seq: r.int(i, 0), writer: r.text(i, 1), mutations: mutations))
            }
            return out
        }
    }

    /// How long the tokens of trimmed change-log rows are kept.
    static let tokenDays: Int64 = 90

    public func trimChanges(keepingLast count: Int) throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in
            try connection.transaction { () throws(StoreError) in
                let last = try connection.query("SELECT value FROM ubiquityfs.store WHERE key = 'seq'").int(0, 0)
                let cut = last - ChangeSeq(count)
                // The mark first, in the same transaction: a reader sees both or neither.
                let moved = try connection.query("UPDATE ubiquityfs.store SET value = $1 WHERE key = 'trimmed_through' AND value < $1",
                                                 [.int(cut)])
                if moved.affected > 0 {
                    // Their tokens stay a while: a machine cut off with a COMMIT whose answer was
                    // lost asks by its token when it is back.
                    try connection.query("""
                        INSERT INTO ubiquityfs.tokens(token, seq, trimmed)
                        SELECT token, seq, \(Self.serverMillis) FROM ubiquityfs.changes WHERE seq <= $1
                        ON CONFLICT (token) DO NOTHING
                        """, [.int(cut)])
                    try connection.query("DELETE FROM ubiquityfs.changes WHERE seq <= $1", [.int(cut)])
                }
                try connection.query("DELETE FROM ubiquityfs.tokens WHERE trimmed < \(Self.serverMillis) - $1",
                                     [.int(Self.tokenDays * 86_400_000)])
            }
        }
    }

    public func reserveInodes(_ count: Int) throws(StoreError) -> ClosedRange<InodeNumber> {
        let range = try reserve("max_ino", count, floor: 1)
        return InodeNumber(bitPattern: range.lowerBound)...InodeNumber(bitPattern: range.upperBound)
    }

    public func reserveVersions(_ count: Int) throws(StoreError) -> ClosedRange<VersionID> {
        try reserve("max_version", count, floor: 0)
    }

    /// Blob ids for this store's chunks (ids must be unique across machines).
    func reserveBlobs(_ count: Int) throws(StoreError) -> ClosedRange<Int64> {
        try reserve("max_blob", count, floor: 0)
    }

    /// Advance a high-water mark by `count` in one statement (its own durable transaction).
    private func reserve(_ key: String, _ count: Int, floor: Int64) throws(StoreError) -> ClosedRange<Int64> {
        precondition(count > 0)
        return try mutex.withLock { () throws(StoreError) -> ClosedRange<Int64> in
            // Inode 1 is the mount root (FUSE_ROOT_ID): store nodes start at 2.
            let r = try connection.query("UPDATE ubiquityfs.store SET value = GREATEST(value, $2) + $3 WHERE key = $1 RETURNING value",
                                         [.text(key), .int(floor), .int(Int64(count))])
            guard r.count == 1 else { throw corrupt("the counter \(key) is missing") }
            let last = r.int(0, 0)
            return (last - Int64(count) + 1)...last
        }
    }

    public func versions(of ino: InodeNumber) throws(StoreError) -> [VersionRecord] {
        try mutex.withLock { () throws(StoreError) -> [VersionRecord] in
            try versions(connection.query("\(Self.versionSelect) WHERE v.ino = $1 ORDER BY v.id",
                                          [.int(Int64(bitPattern: ino))]))
        }
    }

    public func versionCount(of ino: InodeNumber) throws(StoreError) -> Int {
        try mutex.withLock { () throws(StoreError) -> Int in
            let r = try connection.query("SELECT count(*) FROM ubiquityfs.versions WHERE ino = $1", [.int(Int64(bitPattern: ino))])
            return Int(r.int(0, 0))
        }
    }

    public func version(_ id: VersionID) throws(StoreError) -> VersionRecord? {
        try mutex.withLock { () throws(StoreError) -> VersionRecord? in
            try versions(connection.query("\(Self.versionSelect) WHERE v.id = $1", [.int(id)])).first
        }
    }

    public func versions(withOrigin origin: VersionOrigin) throws(StoreError) -> [VersionRecord] {
        try mutex.withLock { () throws(StoreError) -> [VersionRecord] in
            try versions(connection.query("\(Self.versionSelect) WHERE v.origin = $1 ORDER BY v.id",
                                          [.text(origin.rawValue)]))
        }
    }

    public func allVersions() throws(StoreError) -> [VersionRecord] {
        try mutex.withLock { () throws(StoreError) -> [VersionRecord] in
            try versions(connection.query("\(Self.versionSelect) ORDER BY v.id"))
        }
    }

    public func capacity() -> StoreCapacity { capacityOfFilesystem(at: capacityPath) }

    public func referencedBlobs() throws(StoreError) -> Set<BlobID> {
        try mutex.withLock { () throws(StoreError) -> Set<BlobID> in
            // Every entry of every list, whole or shared, and of every version's changes (as the
            // embedded store counts them).
            var out: Set<BlobID> = []
            let r = try connection.query("SELECT chunks, list FROM ubiquityfs.versions")
            for i in 0..<r.count {
                let shared = !r.isNull(i, 1)
                guard let chunks = try r.withBytes(i, 0, { shared ? ChunkDelta.changes($0)?.map(\.chunk) : ChunkPacking.unpack($0) }) else {
                    throw corrupt("a version's chunk list is corrupt")
                }
                for c in chunks where !c.isHole { out.insert(c.blob) }
            }
            let lists = try connection.query("SELECT chunks FROM ubiquityfs.chunk_lists")
            for i in 0..<lists.count {
                guard let chunks = try lists.withBytes(i, 0, { ChunkPacking.unpack($0) }) else {
                    throw corrupt("a shared chunk list is corrupt")
                }
                for c in chunks where !c.isHole { out.insert(c.blob) }
            }
            return out
        }
    }

    // MARK: Presence

    private static let serverMillis = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

    /// Records `writer` as running, and keeps renewing that while it is (out of reach, from
    /// when the servers answer again: the error is thrown, and the renewals go on).
    func announce(_ writer: String) throws(StoreError) {
        defer { keepPresent(writer) }
        try renewPresence(writer)
    }

    /// Renews the presence of this process's writers now (the servers answer again).
    func renewPresence() {
        for w in presenceMutex.withLock({ present }) { try? renewPresence(w) }
    }

    /// Renews `writer`'s presence from now on (the first renewal when the servers answer).
    func keepPresent(_ writer: String) {
        presenceMutex.withLock {
            present.insert(writer)
            guard heartbeat == nil else { return }
            let t = Thread { [weak self] in
                while true {
                    Thread.sleep(forTimeInterval: 60)
                    guard let self else { return }
                    // Out of reach, a try would hold the connection for the timeout, for nothing.
                    guard self.reachable.current.online else { continue }
                    for w in self.presenceMutex.withLock({ self.present }) { try? self.renewPresence(w) }
                }
            }
            t.name = "presence"
            heartbeat = t
            t.start()
        }
    }

    private func renewPresence(_ writer: String) throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in
            _ = try connection.query("""
                INSERT INTO ubiquityfs.presence(writer, lease_until) VALUES($1, \(Self.serverMillis) + $2)
                ON CONFLICT (writer) DO UPDATE SET lease_until = EXCLUDED.lease_until
                """, [.text(writer), .int(Self.presenceSeconds * 1000)])
        }
    }

    /// `writer` stopped cleanly.
    func withdraw(_ writer: String) throws(StoreError) {
        presenceMutex.withLock { _ = present.remove(writer) }
        try mutex.withLock { () throws(StoreError) in
            _ = try connection.query("DELETE FROM ubiquityfs.presence WHERE writer = $1", [.text(writer)])
        }
    }

    /// Whether a daemon other than this process's runs on any machine (unknown counts as yes:
    /// what waits for the others to be gone waits a little longer).
    func othersPresent() -> Bool {
        // Out of reach, asking would wait out the timeout to learn nothing.
        if !reachable.current.online { return true }
        let mine = presenceMutex.withLock { present }
        let live: [String]? = try? mutex.withLock { () throws(StoreError) -> [String] in
            let r = try connection.query("SELECT writer FROM ubiquityfs.presence WHERE lease_until > \(Self.serverMillis)")
            return (0..<r.count).map { r.text($0, 0) }
        }
        guard let live else { return true }
        return live.contains { !mine.contains($0) }
    }

    public func reachability() -> StoreReachability? { reachable.current }

    /// Waits on the LISTEN connection. Offline, it waits out the time (the caller's reads fail
    /// and say so).
    public func waitForChanges(_ seconds: Double) {
        let waited: Bool = listenMutex.withLock {
            do throws(StoreError) {
                try listener.listen(changeChannel)
                _ = try listener.waitForNotification(seconds)
                return true
            } catch {
                return false
            }
        }
        if !waited { Thread.sleep(forTimeInterval: seconds) }
    }
}
