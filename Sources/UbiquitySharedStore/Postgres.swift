// A small client over libpq: one connection, prepared statements, parameters and results in
// binary (no SQL is ever built from values), and a deadline on every round trip.
//
// Every call waits at most `timeout` for the server: libpq's blocking calls would wait for as long
// as TCP retries a cut link (many minutes), and a filesystem must answer, if only with an error. A
// connection that misses its deadline or breaks is dropped; the next call connects again. Calls
// are not thread-safe: each owner guards its connection with a lock.

import CPostgres
import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// A statement parameter, sent in binary with its type, so the server never parses a value.
enum PGValue {
    case int(Int64?)
    case text(String)
    case bytes([UInt8])
    /// Bytes the caller keeps alive for the call (a chunk, without a copy into an array).
    case buffer(UnsafeRawBufferPointer)

    var oid: Oid {
        switch self {
        case .int: return 20      // int8
        case .text: return 25     // text
        case .bytes, .buffer: return 17   // bytea
        }
    }
}

/// How a server error is handled: the SQLSTATE classes that matter here.
struct PGFailure: Error {
    var sqlState: String
    var message: String
    /// The transaction lost a race with another (serialization failure, deadlock): run it again.
    var mustRetry: Bool { sqlState == "40001" || sqlState == "40P01" }
    var isUniqueViolation: Bool { sqlState == "23505" }
}

/// The rows of one statement's result, in binary format.
final class PGResult {
    let handle: OpaquePointer
    init(_ handle: OpaquePointer) { self.handle = handle }
    deinit { PQclear(handle) }

    var count: Int { Int(PQntuples(handle)) }
    /// Rows changed by an INSERT, UPDATE or DELETE.
    var affected: Int { Int(String(cString: PQcmdTuples(handle))) ?? 0 }

    func isNull(_ row: Int, _ column: Int) -> Bool { PQgetisnull(handle, Int32(row), Int32(column)) != 0 }

    /// An integer column of any width (int2, int4, int8), big-endian on the wire.
    func int(_ row: Int, _ column: Int) -> Int64 {
        let length = Int(PQgetlength(handle, Int32(row), Int32(column)))
        guard let base = PQgetvalue(handle, Int32(row), Int32(column)) else { return 0 }
        let raw = UnsafeRawPointer(base)
        switch length {
        case 8: return Int64(bigEndian: raw.loadUnaligned(as: Int64.self))
        case 4: return Int64(Int32(bigEndian: raw.loadUnaligned(as: Int32.self)))
        case 2: return Int64(Int16(bigEndian: raw.loadUnaligned(as: Int16.self)))
        case 1: return Int64(raw.load(as: UInt8.self))   // bool
        default: return 0
        }
    }

    func uint(_ row: Int, _ column: Int) -> UInt64 { UInt64(bitPattern: int(row, column)) }

    func withBytes<R>(_ row: Int, _ column: Int, _ body: (UnsafeRawBufferPointer) throws(StoreError) -> R) throws(StoreError) -> R {
        let length = Int(PQgetlength(handle, Int32(row), Int32(column)))
        guard length > 0, let base = PQgetvalue(handle, Int32(row), Int32(column)) else {
            return try body(UnsafeRawBufferPointer(start: nil, count: 0))
        }
        return try body(UnsafeRawBufferPointer(start: UnsafeRawPointer(base), count: length))
    }

    func bytes(_ row: Int, _ column: Int) -> [UInt8] {
        (try? withBytes(row, column) { [UInt8]($0) }) ?? []
    }

    func text(_ row: Int, _ column: Int) -> String {
        (try? withBytes(row, column) { String(decoding: $0, as: UTF8.self) }) ?? ""
    }
}

/// Where and how to reach the server. `url` is a libpq connection URI without a password.
struct PGTarget: Sendable {
    var url: String
    /// The longest any call waits for the server, in seconds.
    var timeout: Double
    var applicationName: String = "ubiquityfs"
    /// Told of every answer and every failure to get one.
    var reachability: Reachability? = nil
}

/// Whether the servers of a shared store answer: every connection and request reports here.
final class Reachability: @unchecked Sendable {
    // `lock` guards `state`.
    private let lock = NSLock()
    private var state = StoreReachability(online: true, since: nowNanoseconds(), detail: "")

    func ok() {
        lock.lock()
        if !state.online { state = StoreReachability(online: true, since: nowNanoseconds(), detail: "") }
        lock.unlock()
    }

    func failed(_ why: String) {
        lock.lock()
        if state.online { state = StoreReachability(online: false, since: nowNanoseconds(), detail: why) } else { state.detail = why }
        lock.unlock()
    }

    var current: StoreReachability {
        lock.lock()
        defer { lock.unlock() }
        return state
    }
}

/// Checks a store URL before anything connects with it: it must not carry a password (it would be
/// on the command line, in `ps` and in logs), and a password file libpq would read must be private.
func checkPostgresURL(_ url: String) throws(StoreError) {
    var message: UnsafeMutablePointer<CChar>?
    guard let options = PQconninfoParse(url, &message) else {
        let text = message.map { String(cString: $0).trimmingCharacters(in: .whitespacesAndNewlines) } ?? "malformed"
        if let message { PQfreemem(message) }
        throw StoreError(errno: EINVAL, "the store URL cannot be read: \(text)")
    }
    defer { PQconninfoFree(options) }
    var passfile: String?
    var i = 0
    while let keyword = options[i].keyword {
        let name = String(cString: keyword)
        if let value = options[i].val {
            if name == "password" {
                throw StoreError(errno: EINVAL, "the store URL holds a password, which would show on the command line and in "
                                 + "logs: remove it and put it in ~/.pgpass, in a 0600 file named by PGPASSFILE, or in PGPASSWORD")
            }
            if name == "passfile" { passfile = String(cString: value) }
        }
        i += 1
    }
    let file = passfile ?? ProcessInfo.processInfo.environment["PGPASSFILE"]
        ?? (ProcessInfo.processInfo.environment["HOME"].map { $0 + "/.pgpass" })
    if let file {
        var st = stat()
        if stat(file, &st) == 0, st.st_mode & 0o077 != 0 {
            throw StoreError(errno: EACCES, "the password file \(file) can be read by other users (mode "
                             + "\(String(st.st_mode & 0o777, radix: 8))), so PostgreSQL's client would ignore it: run chmod 600 \(file)")
        }
    }
}

/// One connection to the server, opened on first use and again after it breaks.
final class PGConnection {
    let target: PGTarget
    private var conn: OpaquePointer?
    private var prepared: [String: String] = [:]
    /// Channels to LISTEN on, again after each reconnect.
    private var channels: [String] = []
    /// Called after a new connection is made (the caller re-reads what it may have missed).
    var onConnect: (() -> Void)?

    init(_ target: PGTarget) { self.target = target }
    deinit { drop() }

    var isConnected: Bool { conn.map { PQstatus($0) == CONNECTION_OK } ?? false }

    /// The server process serving this connection (0 when not connected).
    var backendPID: Int32 { conn.map { PQbackendPID($0) } ?? 0 }

    /// Close the connection (a broken or timed-out one, or at the end).
    func drop() {
        if let conn { PQfinish(conn) }
        conn = nil
        prepared = [:]
    }

    private func unavailable(_ what: String) -> StoreError {
        let error = StoreError(.unavailable, "PostgreSQL at \(redacted(target.url)): \(what)")
        target.reachability?.failed(error.message)
        return error
    }

    /// Connects if needed.
    func connect() throws(StoreError) {
        if let conn, PQstatus(conn) == CONNECTION_OK { return }
        drop()
        var keys = ["dbname", "connect_timeout", "application_name", "keepalives", "keepalives_idle",
                    "keepalives_interval", "keepalives_count", "tcp_user_timeout", "options"]
        let seconds = max(2, Int(target.timeout.rounded(.up)))
        // The server ends a transaction whose client went quiet (a machine that lost its link
        // after taking the row every commit needs would otherwise stall every other machine
        // until TCP gave up, hours later). Commits are always durable.
        let options = "-c idle_in_transaction_session_timeout=\(seconds * 2000) -c synchronous_commit=on"
        var values = [target.url, String(seconds), target.applicationName, "1", String(max(1, seconds / 2)), "1",
                      String(max(1, seconds / 2)), String(seconds * 1000), options]
        // A host name is looked up here, within the timeout: libpq's own lookup blocks, for as
        // long as the resolver tries servers that do not answer. libpq still uses the name for
        // the password file and TLS.
        if let host = hostName(of: target.url) {
            keys.append("hostaddr")
            values.append(try lookUp(host, timeout: target.timeout))
        }
        let ckeys = keys.map { strdup($0) } + [nil]
        let cvalues = values.map { strdup($0) } + [nil]
        defer {
            ckeys.forEach { free($0) }
            cvalues.forEach { free($0) }
        }
        // Started, then driven with poll() and one deadline: PQconnectdbParams would wait
        // connect_timeout for each address the name has.
        let handle = ckeys.map { UnsafePointer($0) }.withUnsafeBufferPointer { k in
            cvalues.map { UnsafePointer($0) }.withUnsafeBufferPointer { v in
                PQconnectStartParams(k.baseAddress, v.baseAddress, 1)
            }
        }
        guard let handle else { throw unavailable("out of memory") }
        func failed() -> StoreError {
            let message = String(cString: PQerrorMessage(handle)).trimmingCharacters(in: .whitespacesAndNewlines)
            PQfinish(handle)
            if message.contains("password authentication failed") || message.contains("no password supplied") {
                return StoreError(errno: EACCES, "PostgreSQL at \(redacted(target.url)) refused the login: \(message)")
            }
            return unavailable(message)
        }
        if PQstatus(handle) == CONNECTION_BAD { throw failed() }
        let deadline = Date().addingTimeInterval(target.timeout)
        var state = PGRES_POLLING_WRITING
        while state != PGRES_POLLING_OK {
            if state == PGRES_POLLING_FAILED { throw failed() }
            let left = deadline.timeIntervalSinceNow
            if left <= 0 {
                PQfinish(handle)
                throw unavailable("no answer within \(target.timeout) s")
            }
            var fds = pollfd(fd: PQsocket(handle), events: Int16(state == PGRES_POLLING_READING ? POLLIN : POLLOUT), revents: 0)
            let rc = poll(&fds, 1, Int32(min(left, 3600) * 1000) + 1)
            // libpq may be asked again only once the socket is ready: it takes a call as that.
            if rc == 0 || (rc < 0 && errno == EINTR) { continue }
            if rc < 0 {
                PQfinish(handle)
                throw unavailable("poll failed")
            }
            state = PQconnectPoll(handle)
        }
        PQsetnonblocking(handle, 1)
        conn = handle
        for channel in channels {
            _ = try run("LISTEN \(channel)", [])   // channel names are constants of this program
        }
        onConnect?()
    }

    /// Run `sql` (a constant of this program; values only as parameters) and return its rows.
    @discardableResult
    func query(_ sql: String, _ params: [PGValue] = []) throws(StoreError) -> PGResult {
        do {
            return try execute(sql, params)
        } catch let failure as PGFailure {
            throw StoreError(errno: failure.sqlState == "53100" ? ENOSPC : EIO,
                             "PostgreSQL: \(failure.message) (SQLSTATE \(failure.sqlState))")
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(errno: EIO, "PostgreSQL: \(error)")
        }
    }

    /// As `query`, but a server error comes back as `PGFailure` for the caller to judge.
    @discardableResult
    func execute(_ sql: String, _ params: [PGValue]) throws -> PGResult {
        try connect()
        let name: String
        if let known = prepared[sql] {
            name = known
        } else {
            name = "s\(prepared.count)"
            let types = params.map(\.oid)
            let sent = types.withUnsafeBufferPointer { PQsendPrepare(conn, name, sql, Int32(types.count), $0.baseAddress) }
            if sent == 0 { throw lost("cannot send a statement") }
            _ = try finish(sql)
            prepared[sql] = name
        }
        return try withParameters(params) { (values, lengths, formats) throws -> PGResult in
            if PQsendQueryPrepared(conn, name, Int32(params.count), values, lengths, formats, 1) == 0 {
                throw lost("cannot send a statement")
            }
            return try finish(sql)
        }
    }

    /// Run a statement that is not prepared (LISTEN, transaction control).
    @discardableResult
    func run(_ sql: String, _ params: [PGValue]) throws(StoreError) -> PGResult {
        do {
            try connect()
            if PQsendQuery(conn, sql) == 0 { throw lost("cannot send a statement") }
            return try finish(sql)
        } catch let failure as PGFailure {
            throw StoreError(errno: EIO, "PostgreSQL: \(failure.message) (SQLSTATE \(failure.sqlState))")
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(errno: EIO, "PostgreSQL: \(error)")
        }
    }

    /// Runs `body` in a transaction begun with `begin`: committed if it returns, rolled back
    /// (or dropped with the connection) if it throws.
    func transaction<R>(_ begin: String = "BEGIN", _ body: () throws(StoreError) -> R) throws(StoreError) -> R {
        try run(begin, [])
        do throws(StoreError) {
            let result = try body()
            try run("COMMIT", [])
            return result
        } catch {
            if isConnected { _ = try? run("ROLLBACK", []) }
            throw error
        }
    }

    /// Subscribe to `channel` (now and after every reconnect).
    func listen(_ channel: String) throws(StoreError) {
        if !channels.contains(channel) { channels.append(channel) }
        if isConnected { _ = try run("LISTEN \(channel)", []) } else { try connect() }
    }

    /// Waits up to `seconds` for a notification; true if one (or more) arrived. Connects first
    /// (a reconnect runs `onConnect`, which re-reads what a dropped connection may have missed).
    func waitForNotification(_ seconds: Double) throws(StoreError) -> Bool {
        try connect()
        if drainNotifications() { return true }
        var fds = pollfd(fd: PQsocket(conn), events: Int16(POLLIN), revents: 0)
        let rc = poll(&fds, 1, Int32(seconds * 1000))
        if rc < 0 { return false }
        if rc == 0 { return false }
        if PQconsumeInput(conn) == 0 {
            drop()
            throw unavailable("the connection broke")
        }
        return drainNotifications()
    }

    private func drainNotifications() -> Bool {
        var any = false
        while let n = PQnotifies(conn) {
            any = true
            PQfreemem(n)
        }
        return any
    }

    private func lost(_ what: String) -> StoreError {
        let message = conn.map { String(cString: PQerrorMessage($0)).trimmingCharacters(in: .whitespacesAndNewlines) } ?? ""
        drop()
        return unavailable(message.isEmpty ? what : "\(what): \(message)")
    }

    /// Flush the request, then wait (with the deadline) for every result; the last one is kept,
    /// and the first error is thrown once the connection is idle again.
    private func finish(_ sql: String) throws -> PGResult {
        // The deadline is for silence, not for the whole answer: a large result that keeps
        // coming (a load of a big namespace) is not cut off.
        var deadline = Date().addingTimeInterval(target.timeout)
        while true {
            let flushed = PQflush(conn)
            if flushed == 0 { break }
            if flushed < 0 { throw lost("cannot send a statement") }
            try waitSocket(Int16(POLLOUT | POLLIN), until: deadline)
            if PQconsumeInput(conn) == 0 { throw lost("the connection broke") }
        }
        var last: PGResult?
        var failure: PGFailure?
        while true {
            while PQisBusy(conn) != 0 {
                try waitSocket(Int16(POLLIN), until: deadline)
                if PQconsumeInput(conn) == 0 { throw lost("the connection broke") }
                deadline = Date().addingTimeInterval(target.timeout)
            }
            guard let r = PQgetResult(conn) else { break }
            let result = PGResult(r)
            switch PQresultStatus(r) {
            case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY:
                last = result
            default:
                if failure == nil {
                    let state = PQresultErrorField(r, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
                    let text = String(cString: PQresultErrorMessage(r)).trimmingCharacters(in: .whitespacesAndNewlines)
                    failure = PGFailure(sqlState: state, message: text)
                }
            }
        }
        if PQstatus(conn) != CONNECTION_OK { throw lost("the connection broke") }
        target.reachability?.ok()
        if let failure {
            if failure.sqlState.hasPrefix("08") || failure.sqlState.hasPrefix("57P") {
                drop()
                throw unavailable(failure.message)
            }
            throw failure
        }
        guard let last else { throw lost("no result for \(sql.prefix(40))") }
        return last
    }

    private func waitSocket(_ events: Int16, until deadline: Date) throws {
        while true {
            let left = deadline.timeIntervalSinceNow
            if left <= 0 {
                drop()
                throw unavailable("no answer within \(target.timeout) s")
            }
            var fds = pollfd(fd: PQsocket(conn), events: events, revents: 0)
            let rc = poll(&fds, 1, Int32(min(left, 3600) * 1000) + 1)
            if rc > 0 { return }
            if rc < 0 && errno != EINTR { throw lost("poll failed") }
        }
    }
}

/// Binary parameter arrays for libpq, alive for the call: every value's bytes in one buffer.
private func withParameters<R>(_ params: [PGValue],
                               _ body: (UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?) throws -> R) throws -> R {
    var packed: [UInt8] = []
    var spans: [(offset: Int, count: Int)?] = []   // nil: NULL or a caller's buffer
    for p in params {
        let start = packed.count
        switch p {
        case .int(let value?): withUnsafeBytes(of: value.bigEndian) { packed.append(contentsOf: $0) }
        case .int(nil), .buffer: spans.append(nil); continue
        case .text(let s): packed.append(contentsOf: s.utf8)
        case .bytes(let b): packed.append(contentsOf: b)
        }
        spans.append((start, packed.count - start))
    }
    packed.append(0)   // never empty, so every span has an address
    let formats = [Int32](repeating: 1, count: params.count)
    return try packed.withUnsafeBufferPointer { (all) throws -> R in
        let base = UnsafeRawPointer(all.baseAddress!)
        var pointers: [UnsafePointer<CChar>?] = []
        var lengths: [Int32] = []
        for (i, p) in params.enumerated() {
            if let span = spans[i] {
                pointers.append((base + span.offset).assumingMemoryBound(to: CChar.self))
                lengths.append(Int32(span.count))
            } else if case .buffer(let b) = p {
                // A zero-length value needs a non-nil pointer (nil is NULL).
                pointers.append(b.baseAddress.map { $0.assumingMemoryBound(to: CChar.self) } ?? base.assumingMemoryBound(to: CChar.self))
                lengths.append(Int32(b.count))
            } else {
                pointers.append(nil)
                lengths.append(0)
            }
        }
        return try pointers.withUnsafeBufferPointer { v in
            try lengths.withUnsafeBufferPointer { l in
                try formats.withUnsafeBufferPointer { f in try body(v.baseAddress, l.baseAddress, f.baseAddress) }
            }
        }
    }
}

/// The URL without anything after `?` (options may name files) and without a user's password.
/// The one host name (not an address, a socket folder or a list) a connection string names.
func hostName(of url: String) -> String? {
    guard let options = PQconninfoParse(url, nil) else { return nil }
    defer { PQconninfoFree(options) }
    var host: String?, hostaddr: String?
    var i = 0
    while let keyword = options[i].keyword {
        if let value = options[i].val {
            switch String(cString: keyword) {
            case "host": host = String(cString: value)
            case "hostaddr": hostaddr = String(cString: value)
            default: break
            }
        }
        i += 1
    }
    guard let host, !host.isEmpty, hostaddr == nil, !host.hasPrefix("/"), !host.hasPrefix("@"), !host.contains(",") else { return nil }
    var v4 = in_addr(), v6 = in6_addr()
    if inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1 { return nil }
    return host
}

/// The first address of `host`, looked up on a thread of its own so that the caller waits at
/// most `timeout` seconds (a lookup that outlasts it finishes unheeded).
func lookUp(_ host: String, timeout: Double) throws(StoreError) -> String {
    final class Answer: @unchecked Sendable {
        let done = DispatchSemaphore(value: 0)
        let lock = NSLock()
        var address: String?   // guarded by lock
        var failure = ""       // guarded by lock
    }
    let answer = Answer()
    Thread.detachNewThread {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, nil, &hints, &found)
        var text: String?
        if rc == 0, let first = found {
            var buffer = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            if getnameinfo(first.pointee.ai_addr, first.pointee.ai_addrlen, &buffer, socklen_t(buffer.count), nil, 0, NI_NUMERICHOST) == 0 {
                text = String(cString: buffer)
            }
        }
        if let found { freeaddrinfo(found) }
        answer.lock.withLock {
            answer.address = text
            if text == nil { answer.failure = rc == 0 ? "no address" : String(cString: gai_strerror(rc)) }
        }
        answer.done.signal()
    }
    guard answer.done.wait(timeout: .now() + timeout) == .success else {
        throw StoreError(.unavailable, "looking up \(host) took longer than \(timeout) s")
    }
    let (address, failure) = answer.lock.withLock { (answer.address, answer.failure) }
    guard let address else { throw StoreError(.unavailable, "cannot look up \(host): \(failure)") }
    return address
}

func redacted(_ url: String) -> String {
    String(url.split(separator: "?", maxSplits: 1).first ?? "")
}
