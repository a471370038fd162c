// Commands that change a store (`restore`, `resolve`) or ask a daemon (`status`). When a daemon
// serves the store they go through it, over a Unix socket in the store folder that only the
// store's user may use, so the mount shows the result at once (the daemon tells the kernel);
// with no daemon the command opens the store itself, as a daemon would, for just that command.
// Either way the same code (`ControlHandler`) runs the command against the model.

import Foundation
import UbiquityFileSystem
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

struct ControlRequest: Codable, Sendable {
    var command: String
    var ino: UInt64?
    var version: Int64?
    var name: String?
    var keep: String?
    /// `trash`: list, restore or empty; a container; an age in days.
    var action: String?
    var container: String?
    var days: Double?
}

struct ControlReply: Codable, Sendable {
    var code: Int32
    var out: [String] = []
    var err: [String] = []
}

/// Runs one request against a model; the daemon's and the command's own model alike.
enum ControlHandler {
    static func handle(_ r: ControlRequest, fs: UbiquityFileSystem, daemon: Bool) -> ControlReply {
        var reply = ControlReply(code: ExitCode.success)
        do throws(FSError) {
            switch r.command {
            case "restore":
                guard let ino = r.ino, let id = r.version else { throw FSError(EINVAL, "restore needs a file and a version") }
                let was = fs.displayPath(of: ino) ?? "inode \(ino)"
                let made = try fs.restore(ino, version: id, as: r.name.map { Array($0.utf8) })
                reply.out.append(made == ino ? "\(was): version \(id) restored as the current version"
                                             : "\(was): version \(id) restored beside it as \(fs.displayPath(of: made) ?? "inode \(made)")")
            case "resolve":
                guard let ino = r.ino, let keepText = r.keep else { throw FSError(EINVAL, "resolve needs a file and --keep") }
                let keep: KeepChoice
                switch keepText {
                case "current": keep = .current
                case "both": keep = .both
                default:
                    guard let id = VersionID(keepText) else { throw FSError(EINVAL, "--keep takes current, both or a version id") }
                    keep = .version(id)
                }
                let path = fs.displayPath(of: ino) ?? "inode \(ino)"
                // Copies' names, while they still have them.
                let copies = Dictionary(fs.unresolvedConflicts().compactMap { c in c.copy.map { ($0, fs.displayPath(of: $0) ?? "inode \($0)") } },
                                        uniquingKeysWith: { a, _ in a })
                let result = try fs.resolve(ino, keep: keep)
                if let v = result.restored { reply.out.append("\(path): kept version \(keepText) (now current version \(v))") }
                for c in result.removedCopies { reply.out.append("removed the conflict copy \(copies[c] ?? "inode \(c)") (its content stays in the file's versions)") }
                for c in result.keptCopies { reply.out.append("kept \(copies[c] ?? "inode \(c)") as an ordinary file: it was edited since it was made") }
                if keep == .both { for c in copies.values.sorted() { reply.out.append("kept \(c) as an ordinary file") } }
                reply.out.append("\(path): \(result.resolved.count) conflict\(result.resolved.count == 1 ? "" : "s") resolved")
            case "status":
                reply.out = try status(fs, daemon: daemon)
            case "evict", "pin":
                guard let ino = r.ino else { throw FSError(EINVAL, "\(r.command) needs a file or folder") }
                let path = fs.displayPath(of: ino) ?? "inode \(ino)"
                let (files, bytes) = r.command == "evict" ? try fs.evictContent(ino) : try fs.keepContent(ino)
                let what = "\(files) file\(files == 1 ? "" : "s"), \(bytes) bytes"
                reply.out.append(r.command == "evict" ? "\(path): evicted (\(what)); reading downloads it again"
                                                      : "\(path): downloaded and kept on this machine (\(what))")
            case "trash":
                reply.out = try trash(r, fs: fs)
            default:
                throw FSError(EINVAL, "unknown request \(r.command)")
            }
        } catch {
            reply.code = ExitCode.failure
            reply.err.append("ubiquityfs \(r.command): \(error.message)")
        }
        return reply
    }

    private static func trash(_ r: ControlRequest, fs: UbiquityFileSystem) throws(FSError) -> [String] {
        switch r.action {
        case "list":
            let items = fs.trashItems(container: r.container)
            if items.isEmpty { return ["Recently Deleted is empty"] }
            var rows = [["ID", "DELETED", "KIND", "SIZE", "DEVICE", "FROM"]]
            for i in items {
                rows.append([String(i.ino), timestamp(i.deleted), i.kind == .directory ? "folder" : "file", String(i.size),
                             i.device.isEmpty ? "-" : i.device, i.originalPath])
            }
            return formatTable(rows)
        case "restore":
            var ino = r.ino
            if ino == nil, let path = r.name {
                // The newest item deleted from that path.
                ino = fs.trashItems().first { $0.originalPath == path }?.ino
                if ino == nil { throw FSError(ENOENT, "nothing deleted from \(path) is in Recently Deleted") }
            }
            guard let ino else { throw FSError(EINVAL, "restore needs an item") }
            return ["restored \(try fs.restoreFromTrash(ino))"]
        case "empty":
            let before = r.days.map { fs.clock() - Int64(min(max($0, 0), 36_500) * 86_400 * 1e9) }
            let n = try fs.emptyTrash(r.ino, deletedBefore: before, container: r.container)
            return ["deleted \(n) item\(n == 1 ? "" : "s") for good"]
        default:
            throw FSError(EINVAL, "trash takes list, restore or empty")
        }
    }

    private static func status(_ fs: UbiquityFileSystem, daemon: Bool) throws(FSError) -> [String] {
        var out: [String] = []
        if let r = fs.storeReachability {
            out.append(r.online ? "store: online since \(timestamp(r.since))"
                                : "store: offline since \(timestamp(r.since)): \(r.detail)")
        }
        if let q = fs.queuedChanges {
            if q.changes > 0 || q.chunks > 0 {
                out.append("queued: \(q.changes) change\(q.changes == 1 ? "" : "s"), \(q.chunks) chunk\(q.chunks == 1 ? "" : "s") "
                           + "(\(q.bytes) bytes)" + (q.since > 0 ? " since \(timestamp(q.since))" : "")
                           + ", sent when the store answers")
            } else {
                out.append("queued: none")
            }
            if q.fromLocalCopy {
                out.append("  started from this machine's copy of the namespace; the servers have not answered since")
            }
            if q.unsettled > 0 { out.append("  \(q.unsettled) sent that another machine's changes overtook, being settled") }
        }
        if daemon {
            let pending = fs.pendingPublishes()
            out.append("pending publishes: \(pending.isEmpty ? "none" : String(pending.count))")
            for ino in pending { out.append("  \(fs.displayPath(of: ino) ?? "inode \(ino)")") }
        } else {
            out.append("pending publishes: none (no daemon serves this store)")
        }
        let conflicts = fs.unresolvedConflicts()
        out.append("unresolved conflicts: \(conflicts.isEmpty ? "none" : String(conflicts.count))")
        if !conflicts.isEmpty {
            var rows = [["FILE", "VERSION", "COPY"]]
            for c in conflicts {
                rows.append([fs.displayPath(of: c.file) ?? "inode \(c.file)", String(c.version),
                             c.copy.flatMap(fs.displayPath(of:)) ?? "(being made)"])
            }
            out += formatTable(rows).map { "  " + $0 }
        }
        let trashed = fs.trashItems()
        out.append("Recently Deleted: \(trashed.count) item\(trashed.count == 1 ? "" : "s"), \(trashed.reduce(0) { $0 + $1.size }) bytes")
        // What only the store knows: said to be unknown while it cannot be reached.
        let recovered: [VersionRecord]
        do { recovered = try fs.recoveredVersions() } catch {
            out.append("recovered versions: unknown (\(error.message))")
            out.append("devices: unknown")
            return out
        }
        out.append("recovered versions: \(recovered.isEmpty ? "none" : String(recovered.count))")
        if !recovered.isEmpty {
            var rows = [["FILE", "VERSION", "CREATED", "SIZE", "DEVICE"]]
            for v in recovered {
                rows.append([fs.displayPath(of: v.ino) ?? "inode \(v.ino)", String(v.id), timestamp(v.created), String(v.size),
                             v.device.isEmpty ? "-" : v.device])
            }
            out += formatTable(rows).map { "  " + $0 }
        }
        let devices: [(device: String, last: Int64)]
        do { devices = try fs.deviceActivity() } catch {
            out.append("devices: unknown (\(error.message))")
            return out
        }
        out.append("devices: \(devices.isEmpty ? "none" : String(devices.count))")
        if !devices.isEmpty {
            out += formatTable([["DEVICE", "LAST CHANGE"]] + devices.map { [$0.device, timestamp($0.last)] }).map { "  " + $0 }
        }
        return out
    }
}

// MARK: - the daemon's side

/// The daemon's control socket: `STORE/control/<pid>.sock`, in a folder only the user can enter,
/// and a request is answered only for a peer of the daemon's own user. One request per
/// connection, answered in turn on this thread.
final class ControlServer: @unchecked Sendable {
    private let fs: UbiquityFileSystem
    private let log: @Sendable (String) -> Void
    private let path: String
    private var listener: Int32 = -1
    private let condition = NSCondition()
    private var stopping = false   // guarded by condition
    private var finished = false   // guarded by condition

    /// Run after each command that may have changed names, before the reply: waits until the
    /// kernel has been told what the command changed, so a name it made shows at once even
    /// where the kernel remembered it as missing.
    private let afterChange: @Sendable () -> Void

    init(storeDir: String, fs: UbiquityFileSystem, log: @escaping @Sendable (String) -> Void,
         afterChange: @escaping @Sendable () -> Void = {}) {
        self.fs = fs
        self.log = log
        self.afterChange = afterChange
        path = controlDirectory(storeDir) + "/\(getpid()).sock"
    }

    func start() throws {
        let dir = (path as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        // Ours, a real folder, private: else another user could stand in for this daemon.
        var st = stat()
        guard lstat(dir, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR, st.st_uid == getuid(), chmod(dir, 0o700) == 0 else {
            throw FSError(EPERM, "\(dir) is not a private folder of uid \(getuid())")
        }
        removeStaleSockets(in: dir)
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw FSError(errno, "control socket") }
        unlink(path)
        let rc = withSocketAddress(path) { bind(listener, $0, $1) }
        guard rc == 0, chmod(path, 0o600) == 0, listen(listener, 16) == 0 else {
            let e = errno
            close(listener)
            throw FSError(e, "cannot listen on \(path)")
        }
        let t = Thread { [self] in serve() }
        t.name = "control"
        t.start()
    }

    func stop() {
        condition.lock()
        stopping = true
        while listener >= 0 && !finished { condition.wait() }
        condition.unlock()
        unlink(path)
    }

    private func serve() {
        while true {
            condition.lock()
            let stop = stopping
            condition.unlock()
            if stop { break }
            var p = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 200) > 0 else { continue }
            let conn = accept(listener, nil, nil)
            guard conn >= 0 else { continue }
            _ = fcntl(conn, F_SETFD, FD_CLOEXEC)
            answer(conn)
            close(conn)
        }
        close(listener)
        condition.lock()
        finished = true
        condition.broadcast()
        condition.unlock()
    }

    private func answer(_ conn: Int32) {
        var cred = PeerCredentials()
        var len = socklen_t(MemoryLayout<PeerCredentials>.size)
        guard getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0, cred.uid == getuid() else {
            log("control: refused a request from uid \(cred.uid) (only uid \(getuid()) may use this daemon)")
            let refusal = ControlReply(code: ExitCode.failure, err: ["ubiquityfs: this store's daemon serves only uid \(getuid())"])
            if let encoded = try? JSONEncoder().encode(refusal) { _ = writeAll(conn, encoded) }
            return
        }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        _ = setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard let data = readAll(conn, limit: 1 << 20),
              let request = try? JSONDecoder().decode(ControlRequest.self, from: data) else {
            log("control: a malformed request was ignored")
            return
        }
        let reply = ControlHandler.handle(request, fs: fs, daemon: true)
        // `status` and `trash list` only read. (A command that failed in part may have changed
        // some names: it waits too.)
        if request.command != "status" && !(request.command == "trash" && request.action == "list") {
            afterChange()
            for line in reply.out + reply.err { log("control: \(request.command): \(line)") }
        }
        guard let encoded = try? JSONEncoder().encode(reply) else { return }
        _ = writeAll(conn, encoded)
    }

    /// Sockets of daemons that are gone (killed, so they could not remove theirs).
    private func removeStaleSockets(in dir: String) {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] where name.hasSuffix(".sock") {
            guard let pid = pid_t(name.dropLast(5)) else { continue }
            if hasExited(pid) { unlink(dir + "/" + name) }
        }
    }
}

/// `struct ucred` (SO_PEERCRED), which Glibc's module leaves out (it needs _GNU_SOURCE).
private struct PeerCredentials {
    var pid: pid_t = 0
    var uid: uid_t = 0
    var gid: gid_t = 0
}

func controlDirectory(_ storeDir: String) -> String { storeDir + "/control" }

/// Call `body` with a Unix socket address for `path`. A path longer than `sun_path` (108 bytes)
/// is reached through its folder's descriptor under /proc/self/fd.
private func withSocketAddress<T>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
    var dirFD: Int32 = -1
    var name = path
    if path.utf8.count >= 100 {
        dirFD = open((path as NSString).deletingLastPathComponent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        name = "/proc/self/fd/\(dirFD)/" + (path as NSString).lastPathComponent
    }
    defer { if dirFD >= 0 { close(dirFD) } }
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in
        let bytes = Array(name.utf8.prefix(raw.count - 1))
        raw.copyBytes(from: bytes)
        raw[bytes.count] = 0
    }
    return withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}

private func readAll(_ fd: Int32, limit: Int) -> Data? {
    var data = Data()
    var buffer = [UInt8](repeating: 0, count: 65536)
    while data.count <= limit {
        let n = read(fd, &buffer, buffer.count)
        if n < 0 && errno == EINTR { continue }
        if n < 0 { return nil }
        if n == 0 { return data }
        data.append(contentsOf: buffer[0..<n])
    }
    return nil
}

/// Send all of `data` on socket `fd`; a peer gone away is an error, never a SIGPIPE.
private func writeAll(_ fd: Int32, _ data: Data) -> Bool {
    data.withUnsafeBytes { raw in
        var off = 0
        while off < raw.count {
            let n = send(fd, raw.baseAddress! + off, raw.count - off, Int32(MSG_NOSIGNAL))
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            off += n
        }
        return true
    }
}

// MARK: - the command's side

/// Run `request` on the store in `storeDir`: through a daemon serving it, else here.
func runControl(_ request: ControlRequest, storeDir: String) throws -> Int32 {
    let reply = try sendToDaemon(request, storeDir: storeDir) ?? runHere(request, storeDir: storeDir)
    for line in reply.out { writeOut(line) }
    for line in reply.err { writeError(line) }
    return reply.code
}

/// The reply of the first daemon on the store that answers; nil when none does.
private func sendToDaemon(_ request: ControlRequest, storeDir: String) throws -> ControlReply? {
    let dir = controlDirectory(storeDir)
    let sockets = ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).filter { $0.hasSuffix(".sock") }.sorted()
    for name in sockets {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { continue }
        defer { close(fd) }
        guard withSocketAddress(dir + "/" + name, { connect(fd, $0, $1) }) == 0 else { continue }
        // Only a daemon of this user: another could answer with anything.
        var cred = PeerCredentials()
        var len = socklen_t(MemoryLayout<PeerCredentials>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0, cred.uid == getuid() else { continue }
        guard writeAll(fd, try JSONEncoder().encode(request)) else { continue }
        shutdown(fd, Int32(SHUT_WR))
        guard let data = readAll(fd, limit: 64 << 20), !data.isEmpty else {
            throw FSError(EIO, "the daemon behind \(dir)/\(name) did not answer; see \(storeDir)/ubiquityfs.log")
        }
        return try JSONDecoder().decode(ControlReply.self, from: data)
    }
    return nil
}

/// No daemon serves the store: open it here, as a daemon would (recovery included), for this
/// one request.
private func runHere(_ request: ControlRequest, storeDir: String) throws -> ControlReply {
    guard hasStore(storeDir) else {
        throw UsageError(message: "no store in \(storeDir)")
    }
    let logger = Logger(path: storeDir + "/ubiquityfs.log", toStderr: false)
    let log: @Sendable (String) -> Void = { logger.write("\(request.command): \($0)") }
    let store = try openStore(storeDir) { log($0) }
    let fs = try UbiquityFileSystem(store: store, containers: [], view: .drive, log: log)
    var reply = ControlHandler.handle(request, fs: fs, daemon: false)
    for failure in fs.stop() {
        reply.err.append("ubiquityfs \(request.command): closing the store: \(failure.message)")
        reply.code = ExitCode.failure
    }
    return reply
}

// MARK: - naming what a command acts on

/// The store folder and inode number a command's path names: a path in a mount (the mount
/// root's `user.ubiquityfs.store` names the store; inode numbers are the store's), or with
/// `store`, `CONTAINER/PATH` as the drive view shows it.
func locate(_ path: String, _ p: Parsed) throws -> (String, InodeNumber) {
    if p.value("--store") != nil {
        let dir = try storeFolder(p)
        let snapshot = try readOnlyMetadata(dir).load()
        return (dir, try resolveDrivePath(path, in: snapshot))
    }
    let full = absolutePath(path)
    var st = stat()
    guard lstat(full, &st) == 0 else {
        throw UsageError(message: "\(path): \(String(cString: strerror(errno)))")
    }
    guard let (root, _) = mountRoot(of: full, device: st.st_dev), let dir = storeOfMount(root) else {
        throw UsageError(message: "\(path) is not in a UbiquityFS mount; name it as CONTAINER/PATH with --store DIR|URL")
    }
    return (dir, InodeNumber(st.st_ino))
}

/// The topmost folder above `path` on the same device (the mount root), and its device.
func mountRoot(of path: String, device: dev_t) -> (String, dev_t)? {
    var root = (path as NSString).deletingLastPathComponent
    var top = path
    while true {
        var up = stat()
        guard stat(root, &up) == 0, up.st_dev == device, top != "/" else { break }
        top = root
        root = (root as NSString).deletingLastPathComponent
    }
    return (top, device)
}

/// The store a mount serves, from its root's `user.ubiquityfs.store`.
func storeOfMount(_ root: String) -> String? {
    var buffer = [UInt8](repeating: 0, count: 4096)
    let n = buffer.withUnsafeMutableBytes { c_getxattr(root, "user.ubiquityfs.store", $0.baseAddress, $0.count) }
    return n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : nil
}

/// CONTAINER/PATH as the drive view shows it: the container by name (or identifier), then the
/// path inside its Documents.
func resolveDrivePath(_ path: String, in snapshot: StoreSnapshot) throws -> InodeNumber {
    let parts = path.split(separator: "/").map { Array($0.utf8) }
    guard let first = parts.first, parts.count >= 2 else {
        throw UsageError(message: "\(path): name a file as CONTAINER/PATH, e.g. TestDrive/MyTextFile.txt")
    }
    let name = String(decoding: first, as: UTF8.self)
    guard let container = snapshot.containers.first(where: { $0.name == name || $0.identifier == name }) else {
        throw UsageError(message: "\(path): no container named \(name) in the store")
    }
    var children: [InodeNumber: [[UInt8]: InodeNumber]] = [:]
    for d in snapshot.dirents { children[d.parent, default: [:]][d.name] = d.child }
    guard var cur = children[container.rootIno]?[Array("Documents".utf8)] else {
        throw UsageError(message: "\(path): the container has no Documents folder")
    }
    for part in parts.dropFirst() {
        guard let next = children[cur]?[part] else {
            throw UsageError(message: "\(path): no such file in the store")
        }
        cur = next
    }
    return cur
}

// MARK: - the commands

let restoreCommand = Subcommand(
    name: "restore",
    summary: "publish an older version of a file again as its current version (or beside it with --as)",
    usage: "restore PATH --version ID [--as NAME] | restore --store DIR CONTAINER/PATH --version ID [--as NAME]",
    options: [("--version=", "the version to restore (see 'ubiquityfs versions')"),
              ("--as=", "restore into a new file of this name beside it, leaving the file as it is"),
              ("--store=", "store folder, to name the file as CONTAINER/PATH without a mount")],
    positionals: 1...1,
    run: { p in
        guard let text = p.value("--version"), let id = VersionID(text) else {
            throw UsageError(message: "--version needs a version id (see 'ubiquityfs versions PATH')")
        }
        if let name = p.value("--as"), name.isEmpty || name.contains("/") || name == "." || name == ".." {
            throw UsageError(message: "--as needs a file name (no folder), e.g. \"Report (old).txt\"")
        }
        let (storeDir, ino) = try locate(p.positionals[0], p)
        return try runControl(ControlRequest(command: "restore", ino: ino, version: id, name: p.value("--as")), storeDir: storeDir)
    })

let resolveCommand = Subcommand(
    name: "resolve",
    summary: "resolve a file's conflicts: keep the current version, another version, or both",
    usage: "resolve PATH --keep current|VERSION|both | resolve --store DIR CONTAINER/PATH --keep ...",
    options: [("--keep=", "current (remove the conflict copies), VERSION (make it current), or both (keep the copies as files)"),
              ("--store=", "store folder, to name the file as CONTAINER/PATH without a mount")],
    positionals: 1...1,
    run: { p in
        guard let keep = p.value("--keep"), keep == "current" || keep == "both" || VersionID(keep) != nil else {
            throw UsageError(message: "--keep needs current, both or a version id")
        }
        let (storeDir, ino) = try locate(p.positionals[0], p)
        return try runControl(ControlRequest(command: "resolve", ino: ino, keep: keep), storeDir: storeDir)
    })

let trashCommand = Subcommand(
    name: "trash",
    summary: "Recently Deleted: list it, restore an item to where it was, or empty it",
    usage: "trash list [CONTAINER] | trash restore ID|CONTAINER/PATH | trash empty [ID] [--older-than DAYS] [--container NAME]  [--store DIR]",
    options: [("--older-than=", "empty: only items deleted more than this many days ago"),
              ("--container=", "empty: only this container's items"),
              ("--store=", "store folder (default $XDG_DATA_HOME/ubiquityfs)")],
    positionals: 1...2,
    run: { p in
        let storeDir = try storeFolder(p)
        let action = p.positionals[0]
        var request = ControlRequest(command: "trash", action: action)
        let arg = p.positionals.count > 1 ? p.positionals[1] : nil
        switch action {
        case "list":
            request.container = arg
        case "restore":
            guard let arg else { throw UsageError(message: "trash restore needs an item: its ID (see 'trash list') or CONTAINER/PATH") }
            if let id = InodeNumber(arg) { request.ino = id } else { request.name = arg }
        case "empty":
            if let arg {
                guard let id = InodeNumber(arg) else { throw UsageError(message: "trash empty takes an item ID (see 'trash list')") }
                request.ino = id
            }
            if let days = p.value("--older-than") {
                guard let d = Double(days), d >= 0, d <= 36_500 else { throw UsageError(message: "--older-than needs a number of days from 0 to 36500") }
                request.days = d
            }
            request.container = p.value("--container")
        default:
            throw UsageError(message: "trash takes list, restore or empty")
        }
        return try runControl(request, storeDir: storeDir)
    })

let statusCommand = Subcommand(
    name: "status",
    summary: "pending publishes, unresolved conflicts and recovered versions of a mount or store",
    usage: "status [MOUNTPOINT] [--store DIR]",
    options: [("--store=", "store folder (default $XDG_DATA_HOME/ubiquityfs)")],
    positionals: 0...1,
    run: { p in
        var storeDir = try storeFolder(p)
        if let mount = p.positionals.first {
            guard let dir = storeOfMount(absolutePath(mount)) else {
                throw UsageError(message: "\(mount) is not the root of a UbiquityFS mount")
            }
            storeDir = dir
        }
        return try runControl(ControlRequest(command: "status"), storeDir: storeDir)
    })
