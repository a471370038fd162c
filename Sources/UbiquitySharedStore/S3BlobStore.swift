// Content chunks in an S3-compatible object store, through libcurl, which signs each request
// with AWS Signature V4. One object per chunk, `PREFIX/chunks/<16 hex digits of the id>`, written
// once and never changed; ids come from the store's counter in PostgreSQL, so machines never
// pick the same one.
//
// The payload is sent unsigned (`x-amz-content-sha256: UNSIGNED-PAYLOAD`): curl 7.88 would
// otherwise sign a hash of an empty body, which RGW rejects, and every chunk carries its own
// checksum in its version's chunk list, which `verify` checks.
//
// Credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or from a file only its
// owner can read (UBIQUITYFS_S3_CREDENTIALS, by default $XDG_CONFIG_HOME/ubiquityfs/s3-credentials,
// with `access_key = …` and `secret_key = …` lines); never from the command line.

import CCurl
import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Where the chunks live: `s3://BUCKET?endpoint=URL&region=REGION&prefix=PATH`.
public struct S3Location: Sendable, Equatable, CustomStringConvertible {
    public var bucket: String
    public var endpoint: String
    public var region: String
    public var prefix: String

    public var description: String {
        var text = "s3://\(bucket)?endpoint=\(endpoint)&region=\(region)"
        if !prefix.isEmpty { text += "&prefix=\(prefix)" }
        return text
    }

    /// Parses `s3://BUCKET?endpoint=…`; nil if `text` is not an s3 URL.
    static func parse(_ text: String) throws(StoreError) -> S3Location? {
        guard text.hasPrefix("s3://") else { return nil }
        let rest = text.dropFirst(5)
        let parts = rest.split(separator: "?", maxSplits: 1)
        let bucket = String(parts.first ?? "")
        // S3's bucket naming rules (RGW needs at least 3 characters).
        let allowed = bucket.allSatisfy { $0.isASCII && ($0.isLowercase || $0.isNumber || $0 == "-" || $0 == ".") }
        guard bucket.count >= 3, bucket.count <= 63, allowed, bucket.first?.isLetter == true || bucket.first?.isNumber == true else {
            throw StoreError(errno: EINVAL, "'\(bucket)' is not a bucket name: 3 to 63 lowercase letters, digits, '-' and '.'")
        }
        var endpoint = "", region = "us-east-1", prefix = ""
        for pair in parts.count > 1 ? parts[1].split(separator: "&") : [] {
            let kv = pair.split(separator: "=", maxSplits: 1).map(String.init)
            guard kv.count == 2 else { throw StoreError(errno: EINVAL, "\(text): '\(pair)' is not KEY=VALUE") }
            switch kv[0] {
            case "endpoint": endpoint = kv[1]
            case "region": region = kv[1]
            case "prefix": prefix = kv[1].trimmingCharacters(in: CharacterSet(charactersIn: "/"))
            default: throw StoreError(errno: EINVAL, "\(text): unknown option '\(kv[0])' (endpoint, region, prefix)")
            }
        }
        if endpoint.isEmpty { endpoint = "https://s3.\(region).amazonaws.com" }
        while endpoint.hasSuffix("/") { endpoint.removeLast() }
        guard endpoint.hasPrefix("http://") || endpoint.hasPrefix("https://") else {
            throw StoreError(errno: EINVAL, "\(text): the endpoint must be an http:// or https:// URL")
        }
        guard region.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" }) else {
            throw StoreError(errno: EINVAL, "\(text): '\(region)' is not a region name")
        }
        return S3Location(bucket: bucket, endpoint: endpoint, region: region, prefix: prefix)
    }
}

/// The access key pair, from the environment or a private file.
struct S3Credentials {
    var access: String
    var secret: String

    static func load() throws(StoreError) -> S3Credentials {
        let env = ProcessInfo.processInfo.environment
        if let access = env["AWS_ACCESS_KEY_ID"], let secret = env["AWS_SECRET_ACCESS_KEY"], !access.isEmpty, !secret.isEmpty {
            return S3Credentials(access: access, secret: secret)
        }
        let config = env["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? ((env["HOME"] ?? NSHomeDirectory()) + "/.config")
        let path = env["UBIQUITYFS_S3_CREDENTIALS"] ?? config + "/ubiquityfs/s3-credentials"
        var st = stat()
        guard stat(path, &st) == 0 else {
            throw StoreError(errno: EACCES, "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or write "
                             + "access_key = … and secret_key = … lines to \(path) (mode 600)")
        }
        if st.st_mode & 0o077 != 0 {
            throw StoreError(errno: EACCES, "the S3 credentials file \(path) can be read by other users (mode "
                             + "\(String(st.st_mode & 0o777, radix: 8))): run chmod 600 \(path)")
        }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw StoreError(errno: EACCES, "cannot read the S3 credentials file \(path)")
        }
        var values: [String: String] = [:]
        for line in text.split(whereSeparator: \.isNewline) {
            let kv = line.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            if kv.count == 2 { values[kv[0]] = kv[1] }
        }
        guard let access = values["access_key"], let secret = values["secret_key"], !access.isEmpty, !secret.isEmpty else {
            throw StoreError(errno: EINVAL, "\(path) needs access_key = … and secret_key = … lines")
        }
        return S3Credentials(access: access, secret: secret)
    }
}

private let curlReady: Bool = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK }()

/// What a request sends and where its answer goes, for libcurl's callbacks.
private final class Exchange {
    var body: UnsafeRawBufferPointer?
    var sent = 0
    /// The caller's buffer for a ranged GET, or nil to collect into `collected`.
    var sink: UnsafeMutableRawBufferPointer?
    var received = 0
    var collected: [UInt8] = []
}

private let writeCallback: ubiquityfs_curl_io = { data, size, count, context in
    let n = size * count
    guard let data, let context else { return n }
    let x = Unmanaged<Exchange>.fromOpaque(context).takeUnretainedValue()
    if let sink = x.sink {
        let room = min(n, sink.count - x.received)
        if room > 0 { (sink.baseAddress! + x.received).copyMemory(from: data, byteCount: room) }
        x.received += max(room, 0)
    } else if x.collected.count < 8 << 20 {
        x.collected.append(contentsOf: UnsafeRawBufferPointer(start: data, count: n))
    }
    return n
}

private let readCallback: ubiquityfs_curl_io = { data, size, count, context in
    guard let data, let context else { return 0 }
    let x = Unmanaged<Exchange>.fromOpaque(context).takeUnretainedValue()
    guard let body = x.body else { return 0 }
    let n = min(size * count, body.count - x.sent)
    if n > 0 { UnsafeMutableRawPointer(data).copyMemory(from: body.baseAddress! + x.sent, byteCount: n) }
    x.sent += n
    return n
}

final class S3Client: @unchecked Sendable {
    let location: S3Location
    private let credentials: S3Credentials
    private let timeout: Double
    let reachability: Reachability?
    // `condition` guards `idle` and `made`: curl handles are reused (keeping their connections)
    // but never used by two threads at once.
    private let condition = NSCondition()
    private var idle: [UnsafeMutableRawPointer] = []
    private var made = 0
    private let limit = 8

    init(_ location: S3Location, timeout: Double, reachability: Reachability? = nil) throws(StoreError) {
        guard curlReady else { throw StoreError(errno: EIO, "libcurl could not be initialized") }
        self.location = location
        self.timeout = timeout
        self.reachability = reachability
        credentials = try S3Credentials.load()
    }

    deinit { for h in idle { curl_easy_cleanup(h) } }

    /// A free handle; nil when none was made or freed within the timeout (every handle is
    /// busy waiting for a service that does not answer).
    private func handle() -> UnsafeMutableRawPointer? {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date().addingTimeInterval(timeout)
        while idle.isEmpty && made >= limit {
            if !condition.wait(until: deadline) && idle.isEmpty && made >= limit { return nil }
        }
        if let h = idle.popLast() { return h }
        guard let h = curl_easy_init() else { return nil }
        made += 1
        return h
    }

    private func giveBack(_ h: UnsafeMutableRawPointer) {
        condition.lock()
        idle.append(h)
        condition.signal()
        condition.unlock()
    }

    /// The URL of `key` in the bucket (path style, which RGW and MinIO take), with `query`.
    func url(_ key: String?, query: String? = nil) -> String {
        var u = location.endpoint + "/" + location.bucket
        if let key { u += "/" + key }
        if let query { u += "?" + query }
        return u
    }

    /// One request; retried a few times when the service says it is busy or broke the connection.
    /// Returns the HTTP status.
    func perform(_ method: String, _ url: String, body: UnsafeRawBufferPointer? = nil, range: ClosedRange<Int>? = nil,
                 into sink: UnsafeMutableRawBufferPointer? = nil, collected: inout [UInt8], received: inout Int) throws(StoreError) -> Int {
        var attempt = 0
        while true {
            attempt += 1
            let x = Exchange()
            x.body = body
            x.sink = sink
            let (code, status) = once(method, url, range: range, x)
            collected = x.collected
            received = x.received
            if code == CURLE_OK && !(500...599).contains(status) {
                reachability?.ok()
                return status
            }
            let transient = code == CURLE_OK || [CURLE_GOT_NOTHING, CURLE_SEND_ERROR, CURLE_RECV_ERROR].contains(code)
            if transient && attempt < 3 {
                usleep(UInt32(100_000 * attempt))
                continue
            }
            let error = code != CURLE_OK
                ? StoreError(.unavailable, "S3 \(method) \(url): \(String(cString: curl_easy_strerror(code)))")
                : StoreError(.unavailable, "S3 \(method) \(url): the service answered \(status)")
            reachability?.failed(error.message)
            throw error
        }
    }

    private func once(_ method: String, _ url: String, range: ClosedRange<Int>?, _ x: Exchange) -> (CURLcode, Int) {
        guard let h = handle() else { return (CURLE_OPERATION_TIMEDOUT, 0) }
        defer { giveBack(h) }
        curl_easy_reset(h)
        var headers: UnsafeMutablePointer<curl_slist>?
        headers = curl_slist_append(headers, "x-amz-content-sha256:UNSIGNED-PAYLOAD")
        // Not "Expect:" to drop the 100-continue round trip: curl 7.88 signs that header though it
        // never sends it, and the service then rejects the signature.
        if let range { headers = curl_slist_append(headers, "Range: bytes=\(range.lowerBound)-\(range.upperBound)") }
        defer { curl_slist_free_all(headers) }
        let context = Unmanaged.passUnretained(x).toOpaque()
        _ = ubiquityfs_curl_set_string(h, CURLOPT_URL, url)
        _ = ubiquityfs_curl_set_string(h, CURLOPT_AWS_SIGV4, "aws:amz:\(location.region):s3")
        _ = ubiquityfs_curl_set_string(h, CURLOPT_USERNAME, credentials.access)
        _ = ubiquityfs_curl_set_string(h, CURLOPT_PASSWORD, credentials.secret)
        _ = ubiquityfs_curl_set_list(h, CURLOPT_HTTPHEADER, headers)
        _ = ubiquityfs_curl_set_long(h, CURLOPT_NOSIGNAL, 1)
        _ = ubiquityfs_curl_set_long(h, CURLOPT_CONNECTTIMEOUT_MS, Int(min(timeout, 30) * 1000))
        _ = ubiquityfs_curl_set_long(h, CURLOPT_TIMEOUT_MS, Int(timeout * 1000))
        _ = ubiquityfs_curl_set_io(h, CURLOPT_WRITEFUNCTION, writeCallback)
        _ = ubiquityfs_curl_set_pointer(h, CURLOPT_WRITEDATA, context)
        switch method {
        case "PUT":
            _ = ubiquityfs_curl_set_long(h, CURLOPT_UPLOAD, 1)
            _ = ubiquityfs_curl_set_io(h, CURLOPT_READFUNCTION, readCallback)
            _ = ubiquityfs_curl_set_pointer(h, CURLOPT_READDATA, context)
            _ = ubiquityfs_curl_set_offset(h, CURLOPT_INFILESIZE_LARGE, curl_off_t(x.body?.count ?? 0))
        case "GET":
            break
        default:
            _ = ubiquityfs_curl_set_string(h, CURLOPT_CUSTOMREQUEST, method)
            if method == "HEAD" { _ = ubiquityfs_curl_set_long(h, CURLOPT_NOBODY, 1) }
        }
        let code = curl_easy_perform(h)
        return (code, ubiquityfs_curl_response_code(h))
    }

    /// The service's error code in an error reply (`<Code>NoSuchKey</Code>`).
    static func errorCode(_ body: [UInt8]) -> String {
        let text = String(decoding: body, as: UTF8.self)
        guard let start = text.range(of: "<Code>"), let end = text.range(of: "</Code>", range: start.upperBound..<text.endIndex) else { return "" }
        return String(text[start.upperBound..<end.lowerBound])
    }

    func fail(_ what: String, _ status: Int, _ body: [UInt8]) -> StoreError {
        let code = Self.errorCode(body)
        let detail = code.isEmpty ? "HTTP \(status)" : "\(code) (HTTP \(status))"
        switch (status, code) {
        case (404, _): return StoreError(.notFound, "S3 \(what): \(detail)")
        case (403, "QuotaExceeded"), (507, _): return StoreError(.noSpace, "S3 \(what): \(detail)")
        case (403, _): return StoreError(errno: EACCES, "S3 \(what): access denied, \(detail): check the credentials")
        default: return StoreError(errno: EIO, "S3 \(what): \(detail)")
        }
    }

    /// Creates the bucket unless it is there (and ours) already; true if it made it.
    func createBucket() throws(StoreError) -> Bool {
        var body: [UInt8] = []
        var n = 0
        let head = try perform("HEAD", url(nil), collected: &body, received: &n)
        if head == 200 { return false }
        if head != 404 { throw fail("look for bucket \(location.bucket)", head, body) }
        let status = try perform("PUT", url(nil), body: UnsafeRawBufferPointer(start: nil, count: 0), collected: &body, received: &n)
        if status == 200 { return true }
        if status == 409 && Self.errorCode(body) == "BucketAlreadyOwnedByYou" { return false }
        throw fail("create bucket \(location.bucket)", status, body)
    }
}

public final class S3BlobStore: RemoteChunks, @unchecked Sendable {
    let client: S3Client
    private let ids: IDReserve
    private let reachability: Reachability?
    private var keyPrefix: String { client.location.prefix.isEmpty ? "chunks/" : client.location.prefix + "/chunks/" }

    /// The servers' clock (nanoseconds since the epoch), which the collection's cutoff is read
    /// against: nil, this machine's.
    private let serverClock: (() throws(StoreError) -> Int64)?

    init(_ location: S3Location, timeout: Double, ids: IDReserve, reachability: Reachability? = nil,
         serverClock: (() throws(StoreError) -> Int64)? = nil) throws(StoreError) {
        client = try S3Client(location, timeout: timeout, reachability: reachability)
        self.ids = ids
        self.reachability = reachability
        self.serverClock = serverClock
    }

    /// The object that says which store the bucket's chunks (under the prefix) belong to.
    private var markerKey: String { client.location.prefix.isEmpty ? "ubiquityfs-store" : client.location.prefix + "/ubiquityfs-store" }

    /// The store id the marker holds; nil when there is none.
    func readMarker() throws(StoreError) -> String? {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256, alignment: 1)
        defer { buffer.deallocate() }
        var collected: [UInt8] = []
        var received = 0
        let status = try client.perform("GET", client.url(markerKey), into: buffer, collected: &collected, received: &received)
        let body = Array(UnsafeRawBufferPointer(rebasing: buffer[..<min(received, 256)]))
        if status == 404 { return nil }
        guard status == 200 else { throw client.fail("GET \(markerKey)", status, body) }
        return String(decoding: body, as: UTF8.self)
    }

    func writeMarker(_ id: String) throws(StoreError) {
        var body: [UInt8] = []
        var n = 0
        let bytes = Array(id.utf8)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(bytes.count, 1), alignment: 1)
        defer { buffer.deallocate() }
        buffer.copyBytes(from: bytes)
        let status = try client.perform("PUT", client.url(markerKey), body: UnsafeRawBufferPointer(rebasing: buffer[..<bytes.count]),
                                        collected: &body, received: &n)
        guard status == 200 else { throw client.fail("PUT \(markerKey)", status, body) }
    }

    func key(_ id: BlobID) -> String {
        let hex = String(id, radix: 16)
        return keyPrefix + String(repeating: "0", count: 16 - hex.count) + hex
    }

    public func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef {
        let id = try newBlobID()
        try put(id, bytes)
        return ChunkRef(blob: id, length: UInt32(bytes.count), checksum: contentChecksum(bytes))
    }

    func newBlobID() throws(StoreError) -> BlobID { try ids.takeBlobID(online: reachability?.current.online != false) }
    func primeIDs() throws(StoreError) { try ids.prime() }

    func put(_ id: BlobID, _ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        guard bytes.count <= chunkSize else {
            throw StoreError(errno: EINVAL, "blob of \(bytes.count) bytes is larger than a chunk (\(chunkSize))")
        }
        var body: [UInt8] = []
        var n = 0
        // An empty chunk still needs a body pointer for the read callback's arithmetic.
        let status = try withUnsafeBytes(of: UInt8(0)) { (zero) throws(StoreError) -> Int in
            try client.perform("PUT", client.url(key(id)), body: bytes.count > 0 ? bytes : UnsafeRawBufferPointer(start: zero.baseAddress, count: 0),
                               collected: &body, received: &n)
        }
        guard status == 200 else { throw client.fail("PUT chunk \(key(id))", status, body) }
    }

    func has(_ id: BlobID) throws(StoreError) -> Bool {
        var body: [UInt8] = []
        var n = 0
        let status = try client.perform("HEAD", client.url(key(id)), collected: &body, received: &n)
        switch status {
        case 200: return true
        case 404: return false
        default: throw client.fail("HEAD chunk \(key(id))", status, body)
        }
    }

    public func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        if blob == 0 || buffer.isEmpty { return 0 }   // the hole
        guard offset >= 0 else { throw StoreError(errno: EINVAL, "read \(key(blob)): negative offset \(offset)") }
        var body: [UInt8] = []
        var received = 0
        let status = try client.perform("GET", client.url(key(blob)), range: offset...(offset + buffer.count - 1),
                                        into: buffer, collected: &body, received: &received)
        switch status {
        case 206: return received
        case 200:
            // The whole object, the range ignored: right only from its start.
            guard offset == 0 else { throw StoreError(errno: EIO, "S3 GET chunk \(key(blob)): the service ignored the byte range") }
            return received
        case 416: return 0   // past the end
        default: throw client.fail("GET chunk \(key(blob))", status, Array(UnsafeRawBufferPointer(rebasing: buffer[..<min(received, buffer.count)])))
        }
    }

    /// A PUT that returned is durable in the object store.
    public func syncAll() throws(StoreError) {}

    public func delete(_ blob: BlobID) throws(StoreError) {
        var body: [UInt8] = []
        var n = 0
        let status = try client.perform("DELETE", client.url(key(blob)), collected: &body, received: &n)
        guard status == 204 || status == 200 || status == 404 else { throw client.fail("DELETE chunk \(key(blob))", status, body) }
    }

    public func verify(_ ref: ChunkRef) -> Bool {
        guard !ref.isHole else { return true }
        var bytes = [UInt8](repeating: 0, count: Int(ref.length) + 1)
        guard let n = try? bytes.withUnsafeMutableBytes({ (b) throws(StoreError) -> Int in try read(ref.blob, at: 0, into: b) }) else { return false }
        return n == Int(ref.length) && bytes.withUnsafeBytes { contentChecksum(UnsafeRawBufferPointer(rebasing: $0.prefix(n))) } == ref.checksum
    }

    public func allBlobs(writtenBefore localCutoff: Int64?) throws(StoreError) -> [BlobID] {
        var out: [BlobID] = []
        // The object store stamps objects with its own clock: the cutoff is an age, counted back
        // from the servers' now, so a machine whose clock runs ahead never takes a young chunk
        // for an old one.
        var cutoff = localCutoff
        if let localCutoff, let serverClock { cutoff = try serverClock() - (nowNanoseconds() - localCutoff) }
        // Pages follow the last key (start-after), not continuation tokens: curl 7.88 signs a
        // query holding an encoded token differently from how the service checks it.
        var after: String?
        let dates = ISO8601DateFormatter()
        dates.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let plain = ISO8601DateFormatter()
        repeat {
            var query = "list-type=2&prefix=" + percentEncode(keyPrefix)
            if let after { query += "&start-after=" + percentEncode(after) }
            var body: [UInt8] = []
            var n = 0
            let status = try client.perform("GET", client.url(nil, query: query), collected: &body, received: &n)
            guard status == 200 else { throw client.fail("list chunks", status, body) }
            let text = String(decoding: body, as: UTF8.self)
            var last: String?
            for entry in elements("Contents", in: text) {
                last = elements("Key", in: entry).first ?? last
                guard let key = elements("Key", in: entry).first, key.hasPrefix(keyPrefix),
                      let id = UInt64(key.dropFirst(keyPrefix.count), radix: 16) else { continue }
                if let cutoff {
                    guard let stamp = elements("LastModified", in: entry).first,
                          let date = dates.date(from: stamp) ?? plain.date(from: stamp),
                          Int64(date.timeIntervalSince1970 * 1e9) < cutoff else { continue }
                }
                out.append(id)
            }
            after = elements("IsTruncated", in: text).first == "true" ? last.map(unescapeXML) : nil
        } while after != nil
        return out
    }
}

/// The texts of every `<name>…</name>` element in `xml` (flat: enough for S3's list replies).
private func elements(_ name: String, in xml: String) -> [String] {
    var out: [String] = []
    var rest = xml[...]
    while let open = rest.range(of: "<\(name)>"), let close = rest.range(of: "</\(name)>", range: open.upperBound..<rest.endIndex) {
        out.append(String(rest[open.upperBound..<close.lowerBound]))
        rest = rest[close.upperBound...]
    }
    return out
}

private func unescapeXML(_ s: String) -> String {
    s.replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
        .replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&apos;", with: "'")
        .replacingOccurrences(of: "&amp;", with: "&")
}

/// RFC 3986 unreserved characters stay; everything else is %XX (what SigV4's canonical query wants).
private func percentEncode(_ s: String) -> String {
    var out = ""
    for byte in s.utf8 {
        let c = Character(UnicodeScalar(byte))
        if c.isASCII && (c.isLetter || c.isNumber || "-_.~".contains(c)) {
            out.append(c)
        } else {
            out += String(format: "%%%02X", byte)
        }
    }
    return out
}
