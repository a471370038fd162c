// The shared store's tables, in a schema of their own (`ubiquityfs`) so they live beside anything
// else in the user's database. Kept to SQL that PostgreSQL's distributed peers (CockroachDB,
// YugabyteDB) also accept: no stored procedures, no advisory locks, `ON CONFLICT` upserts. The one
// PostgreSQL-only feature is LISTEN/NOTIFY, which only wakes other machines early (without it they
// poll the change log).
//
// `config` holds the store's settings (where its chunks live). `store` holds its counters: the schema version, the last change-log position (`seq`:
// every commit takes the next one while holding that row, so positions follow commit order and a
// reader that has seen N has seen every commit before it), the high-water marks of inode, version
// and blob ids (never reused), and how far the change log was trimmed. `presence` lists the daemons
// running on any machine (each renews a lease), so that work which must wait for every other
// writer to be gone (removing files unlinked while open, freeing chunks at once) knows of the
// other machines; `writers` holds the leases of lock holders.

import Foundation
import UbiquityStore

/// 1: the first shared schema. 2: `tokens`, the tokens of trimmed change-log rows. 3: each
/// version's `moved_from` (the file it was published for, when moved into another's history).
/// 4: chunk lists shared between a big file's versions (`chunk_lists`, each version's `list`).
let postgresSchemaVersion: Int64 = 4

/// The channel other machines LISTEN on; a commit NOTIFYs it.
let changeChannel = "ubiquityfs_changes"

let postgresSchemaSQL = """
    CREATE SCHEMA IF NOT EXISTS ubiquityfs;
    CREATE TABLE IF NOT EXISTS ubiquityfs.store(
        key text PRIMARY KEY,
        value bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.config(
        key text PRIMARY KEY,
        value text NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.meta(
        key text PRIMARY KEY,
        value text NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.nodes(
        ino bigint PRIMARY KEY,
        container text NOT NULL,
        kind integer NOT NULL,
        mode bigint NOT NULL,
        uid bigint NOT NULL,
        gid bigint NOT NULL,
        nlink bigint NOT NULL,
        size bigint NOT NULL,
        atime bigint NOT NULL,
        mtime bigint NOT NULL,
        ctime bigint NOT NULL,
        btime bigint NOT NULL,
        rdev bigint NOT NULL,
        target bytea NOT NULL,
        current_version bigint,
        change_seq bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.changes(
        seq bigint PRIMARY KEY,
        writer text NOT NULL,
        token text NOT NULL UNIQUE,
        batch bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.tokens(
        token text PRIMARY KEY,
        seq bigint NOT NULL,
        trimmed bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.dirents(
        parent bigint NOT NULL,
        name bytea NOT NULL,
        child bigint NOT NULL,
        PRIMARY KEY(parent, name)
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.xattrs(
        ino bigint NOT NULL,
        name bytea NOT NULL,
        value bytea NOT NULL,
        PRIMARY KEY(ino, name)
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.versions(
        id bigint PRIMARY KEY,
        ino bigint NOT NULL,
        created bigint NOT NULL,
        size bigint NOT NULL,
        origin text NOT NULL,
        device text NOT NULL,
        chunks bytea NOT NULL,
        moved_from bigint,
        list bigint
    );
    CREATE INDEX IF NOT EXISTS versions_by_ino ON ubiquityfs.versions(ino, id);
    CREATE INDEX IF NOT EXISTS versions_by_list ON ubiquityfs.versions(list) WHERE list IS NOT NULL;
    CREATE TABLE IF NOT EXISTS ubiquityfs.chunk_lists(
        id bigint PRIMARY KEY,
        chunks bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.containers(
        identifier text PRIMARY KEY,
        bundle_identifier text NOT NULL,
        name text NOT NULL,
        is_public bigint NOT NULL,
        folder_levels text NOT NULL,
        registered_version text NOT NULL,
        manifest_path text NOT NULL,
        root_ino bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.blobs(
        id bigint PRIMARY KEY,
        written bigint NOT NULL,
        data bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.presence(
        writer text PRIMARY KEY,
        lease_until bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.writers(
        writer text PRIMARY KEY,
        lease_until bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.lock_nodes(
        node bigint PRIMARY KEY
    );
    CREATE TABLE IF NOT EXISTS ubiquityfs.locks(
        node bigint NOT NULL,
        writer text NOT NULL,
        owner bigint NOT NULL,
        style integer NOT NULL,
        pid bigint NOT NULL,
        segments bytea NOT NULL,
        PRIMARY KEY(node, writer, owner, style)
    );
    INSERT INTO ubiquityfs.config(key, value) VALUES('store_id', md5(random()::text || clock_timestamp()::text))
        ON CONFLICT (key) DO NOTHING;
    INSERT INTO ubiquityfs.store(key, value) VALUES
        ('schema_version', \(postgresSchemaVersion)), ('seq', 0), ('max_ino', 0), ('max_version', 0),
        ('max_blob', 0), ('trimmed_through', 0)
        ON CONFLICT (key) DO NOTHING;
    """

/// What `init-store` and a daemon's start find in the database.
enum SchemaState: Equatable {
    case missing
    case version(Int64)
}

func schemaState(_ c: PGConnection) throws(StoreError) -> SchemaState {
    let exists = try c.query("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'ubiquityfs' AND table_name = 'store'")
    if exists.int(0, 0) == 0 { return .missing }
    let r = try c.query("SELECT value FROM ubiquityfs.store WHERE key = 'schema_version'")
    return r.count == 0 ? .missing : .version(r.int(0, 0))
}

/// Refuses a schema this binary does not know; brings an older one forward (`migrate`).
func checkSchema(_ c: PGConnection, url: String, create: Bool) throws(StoreError) {
    switch try schemaState(c) {
    case .missing:
        guard create else {
            throw StoreError(.notFound, "\(redacted(url)) holds no UbiquityFS store yet: create it with "
                             + "'ubiquityfs init-store --store \(redacted(url))'")
        }
        try c.run("BEGIN", [])
        do throws(StoreError) {
            try c.run(postgresSchemaSQL, [])
            try c.run("COMMIT", [])
        } catch {
            c.drop()   // the server rolls back what the dropped connection began
            throw error
        }
    case .version(let v) where v > postgresSchemaVersion:
        throw StoreError(.corrupt, "\(redacted(url)): the store has schema version \(v), and this ubiquityfs knows "
                         + "versions 1 to \(postgresSchemaVersion): use a newer ubiquityfs")
    case .version(let v) where v < 1:
        throw StoreError(.corrupt, "\(redacted(url)): the store's schema version \(v) is not one ubiquityfs ever wrote")
    case .version(let v) where v < postgresSchemaVersion:
        try migrate(c, from: v)
    case .version:
        break
    }
}

/// Brings a schema of version `from` forward, one step at a time, each in a transaction that
/// moves the version only from the one it found (another machine migrating at the same time
/// finds the work done).
private func migrate(_ c: PGConnection, from: Int64) throws(StoreError) {
    let steps: [Int64: String] = [
        // A COMMIT whose answer was lost is looked up by its token even after the change log
        // dropped its row.
        1: "CREATE TABLE IF NOT EXISTS ubiquityfs.tokens(token text PRIMARY KEY, seq bigint NOT NULL, trimmed bigint NOT NULL)",
        // A power cut's revert goes back only to a file's own versions.
        2: "ALTER TABLE ubiquityfs.versions ADD COLUMN IF NOT EXISTS moved_from bigint",
        // A big file's versions share a chunk list (rows written before stay whole).
        3: """
            ALTER TABLE ubiquityfs.versions ADD COLUMN IF NOT EXISTS list bigint;
            CREATE INDEX IF NOT EXISTS versions_by_list ON ubiquityfs.versions(list) WHERE list IS NOT NULL;
            CREATE TABLE IF NOT EXISTS ubiquityfs.chunk_lists(id bigint PRIMARY KEY, chunks bytea NOT NULL)
            """,
    ]
    for version in from..<postgresSchemaVersion {
        guard let sql = steps[version] else {
            throw StoreError(.corrupt, "no way from schema version \(version) to \(version + 1)")
        }
        if version == 3 {
            // Rows of a big file's versions stop holding whole lists: a daemon of an earlier
            // version still running on any machine would read them wrong (it checked the schema
            // when it started).
            let present = try c.query("""
                SELECT writer FROM ubiquityfs.presence
                WHERE lease_until > (extract(epoch FROM clock_timestamp()) * 1000)::bigint ORDER BY writer
                """)
            if present.count > 0 {
                let writers = (0..<present.count).map { present.text($0, 0) }.joined(separator: ", ")
                throw StoreError(errno: EBUSY, "the store's schema must change to version 4, which the earlier ubiquityfs "
                                 + "still running on it cannot read (\(writers)): stop every mount of it on every machine, "
                                 + "then mount again (a daemon that stopped without unmounting keeps its place for an hour)")
            }
        }
        try c.transaction { () throws(StoreError) in
            try c.run(sql, [])
            try c.query("UPDATE ubiquityfs.store SET value = $1 WHERE key = 'schema_version' AND value = $2",
                        [.int(version + 1), .int(version)])
        }
    }
}
