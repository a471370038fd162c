// `import` and `export`: moving documents between a local folder and a container (turning iCloud
// on or off for a folder). Both go through a mount of the store, so every file is published,
// versioned and coordinated as any save is: the user's own drive-view or app-view mount if one
// serves the store, else a private one at STORE/transfer-mount for the length of the command.
//
// First a plan: every item is checked against the destination (the container's folder levels,
// names, kinds, what is already there), and if anything does not fit, all of it is reported
// and nothing is copied. Then each file is written under a partial name, synced, renamed to
// its name and read back against the source, so a name never holds half a file. An item whose
// destination already holds the same bytes is skipped, which is how a command cut short (a
// kill -9) resumes: run it again.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

let importCommand = Subcommand(
    name: "import",
    summary: "copy (or --move) a local folder into a container, checked against its folder levels first",
    usage: "import LOCAL_DIR CONTAINER[/PATH] [--move] [--store DIR] [--apps DIR]",
    options: [
        ("--move", "delete each local file once its copy is verified (and the emptied folders)"),
        ("--store=", "store folder (default $XDG_DATA_HOME/ubiquityfs)"),
        ("--apps=", "folder of app manifests, for a private mount (default $XDG_CONFIG_HOME/ubiquityfs/apps)"),
    ],
    positionals: 2...2,
    run: { p in
        try transfer(p, exporting: false, local: p.positionals[0], remote: p.positionals[1], removeSource: p.flags.contains("--move"))
    })

let exportCommand = Subcommand(
    name: "export",
    summary: "copy a container's documents (or one folder of them) to a local folder; --remove-from-cloud moves them",
    usage: "export CONTAINER[/PATH] LOCAL_DIR [--keep-in-cloud | --remove-from-cloud] [--store DIR] [--apps DIR]",
    options: [
        ("--keep-in-cloud", "leave the documents in the container (the default)"),
        ("--remove-from-cloud", "move each verified document to the container's Recently Deleted"),
        ("--store=", "store folder (default $XDG_DATA_HOME/ubiquityfs)"),
        ("--apps=", "folder of app manifests, for a private mount (default $XDG_CONFIG_HOME/ubiquityfs/apps)"),
    ],
    positionals: 2...2,
    run: { p in
        if p.flags.contains("--keep-in-cloud") && p.flags.contains("--remove-from-cloud") {
            throw UsageError(message: "--keep-in-cloud and --remove-from-cloud exclude each other")
        }
        return try transfer(p, exporting: true, local: p.positionals[1], remote: p.positionals[0],
                            removeSource: p.flags.contains("--remove-from-cloud"))
    })

/// One item of a tree, by its path relative to the tree's root.
private struct Item {
    enum Kind: Equatable {
        case folder, file, symlink(String), other
        var word: String {
            switch self {
            case .folder: return "a folder"
            case .file: return "a file"
            case .symlink: return "a symbolic link"
            case .other: return "a FIFO, socket or device"
            }
        }
    }
    var path: String
    var kind: Kind
    var size: UInt64
}

private func transfer(_ p: Parsed, exporting: Bool, local: String, remote: String, removeSource: Bool) throws -> Int32 {
    let verb = exporting ? "export" : "import"
    let storeDir = try storeFolder(p)
    guard hasStore(storeDir) else {
        throw UsageError(message: "no store in \(storeDir) (mount it once, or name it with --store)")
    }
    let parts = remote.split(separator: "/").map(String.init)
    guard let name = parts.first else { throw UsageError(message: "name the container as CONTAINER[/PATH], e.g. TestDrive/Imported") }
    let containers = try registeredContainers(storeDir)
    guard let container = containers.first(where: { $0.name == name || $0.identifier == name }) else {
        throw UsageError(message: "no container named \(name) in the store (see 'ubiquityfs containers')")
    }
    let inside = Array(parts.dropFirst())
    if inside.contains(where: { $0 == "." || $0 == ".." }) {
        throw UsageError(message: "\(remote): a path in the container cannot have . or .. in it")
    }
    let localRoot = absolutePath(local)

    // One transfer per store at a time: two copying the same files would write each other's
    // partial files.
    let lock = open(storeDir + "/transfer.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    guard lock >= 0 else { throw TransferError("cannot open \(storeDir)/transfer.lock: \(String(cString: strerror(errno)))") }
    defer { close(lock) }
    guard flock(lock, LOCK_EX | LOCK_NB) == 0 else {
        writeError("ubiquityfs \(verb): another import or export is running on the store \(storeDir); run this one when it is done")
        return ExitCode.failure
    }
    let mount = try TransferMount(store: storeDir, apps: absolutePath(p.value("--apps") ?? defaultAppsDirectory()))
    defer { mount.finish() }
    guard let documents = mount.documents(of: container) else {
        writeError("ubiquityfs \(verb): \(container.name) is not in the mount at \(mount.path) (a private container shows only in its app's view)")
        return ExitCode.failure
    }
    let remoteRoot = ([documents] + inside).joined(separator: "/")
    // Each folder on the way must be a real folder in the container, not a link out of it.
    var walked = documents
    for part in inside {
        walked += "/" + part
        guard let kind = kindAt(walked) else { break }
        guard kind == .folder else {
            writeError("ubiquityfs \(verb): \(remote): \(part) is not a folder in the container")
            return ExitCode.failure
        }
    }
    // Never both ends of one tree: every file would look copied already, and a move would
    // delete the only copy.
    let realLocal = realPath(localRoot), realRemote = realPath(remoteRoot)
    if realLocal == realRemote || realLocal.hasPrefix(realRemote + "/") || realRemote.hasPrefix(realLocal + "/") {
        writeError("ubiquityfs \(verb): \(localRoot) and \(remote) are the same files, or one holds the other")
        return ExitCode.failure
    }
    let (source, destination) = exporting ? (remoteRoot, localRoot) : (localRoot, remoteRoot)

    // The plan.
    var problems: [String] = []
    var isDir: ObjCBool = false
    guard FileManager.default.fileExists(atPath: source, isDirectory: &isDir), isDir.boolValue else {
        writeError("ubiquityfs \(verb): \(exporting ? remote : source) is not a folder")
        return ExitCode.failure
    }
    let items = scan(source, problems: &problems)
    // The folder levels hold in the drive view; an app's own view has none.
    let limit: Int? = exporting || !mount.isDriveView(documents, of: container) ? nil : levelsLimit(container.folderLevels)
    var existing: [String: Item.Kind] = [:]
    let depthBelow = exporting ? 0 : inside.count
    for item in items {
        if item.path.split(separator: "/").contains(where: { $0.utf8.count > 255 }) {
            problems.append("\(item.path): a name longer than 255 bytes")
        }
        if case .folder = item.kind, let limit, depthBelow + item.path.split(separator: "/").count > limit {
            problems.append("\(item.path): \(container.name) allows \(limit == 0 ? "no folders" : "one level of folders") (NSUbiquitousContainerSupportedFolderLevels \(container.folderLevels))")
        }
        let target = destination + "/" + item.path
        if let kind = kindAt(target) {
            existing[item.path] = kind
            switch (item.kind, kind) {
            case (.folder, .folder): break
            case (.file, .file):
                if !sameBytes(source + "/" + item.path, target) {
                    problems.append("\(item.path): \(exporting ? "the local" : "the container's") copy exists with other content; move it away, or \(verb) elsewhere")
                }
            case (.symlink(let a), .symlink(let b)) where a == b: break
            default: problems.append("\(item.path): the destination has something else of that name (\(kind.word), not \(item.kind.word))")
            }
        }
    }
    if let limit, inside.count > limit {
        problems.append("\(remote): deeper than \(container.name)'s folder levels allow (\(container.folderLevels))")
    }
    if !problems.isEmpty {
        writeError("ubiquityfs \(verb): nothing was copied; \(problems.count == 1 ? "1 item does" : "\(problems.count) items do") not fit:")
        for problem in problems { writeError("  " + problem) }
        return ExitCode.failure
    }

    // The copy.
    let progress = Progress(verb: verb, files: items.filter { $0.kind == .file }.count, bytes: items.reduce(0) { $0 + $1.size })
    var failures: [String] = []
    var skipped = 0, failedFiles = 0
    do {
        try FileManager.default.createDirectory(atPath: destination, withIntermediateDirectories: true)
    } catch {
        writeError("ubiquityfs \(verb): cannot make \(destination): \(error)")
        return ExitCode.failure
    }
    let stop = StopOnSignal()
    defer { stop.restore() }
    for item in items {
        if stop.requested {
            failures.append("interrupted: the rest was not copied")
            break
        }
        let from = source + "/" + item.path, to = destination + "/" + item.path
        do {
            switch item.kind {
            case .other:
                break   // never an item: the plan reports these
            case .folder:
                if existing[item.path] == nil { try makeFolder(to) }
            case .symlink(let target):
                if existing[item.path] == nil { try check(symlink(target, to), "symlink \(to)") }
                if removeSource, !sameFile(from, to) {
                    try syncFolder(of: to)
                    try check(unlink(from), "remove \(from)")
                }
            case .file:
                if existing[item.path] == nil {
                    try copyFile(from, to)
                } else {
                    skipped += 1
                }
                if !sameBytes(from, to, dropCache: true) { throw TransferError("the copy does not read back as the original") }
                if removeSource {
                    guard !sameFile(from, to) else { throw TransferError("the copy is the original itself; it stays") }
                    try syncFolder(of: to)
                    try check(unlink(from), "remove \(from)")
                }
                progress.done(bytes: item.size)
            }
        } catch {
            failures.append("\(item.path): \(error)")
            writeError("ubiquityfs \(verb): \(item.path): \(error)")
            if case .file = item.kind {
                failedFiles += 1
                progress.done(bytes: item.size)
            }
        }
    }
    if removeSource && failures.isEmpty {
        // The emptied folders, deepest first, and the source itself.
        for folder in items.filter({ $0.kind == .folder }).map(\.path).sorted(by: { $0.count > $1.count }) {
            _ = rmdir(source + "/" + folder)
        }
        _ = rmdir(source)
    }
    progress.finish(skipped: skipped, failed: failedFiles)
    if !failures.isEmpty {
        writeError("ubiquityfs \(verb): \(failures.count) item\(failures.count == 1 ? "" : "s") failed; run the same command again to retry:")
        for f in failures { writeError("  " + f) }
        return ExitCode.failure
    }
    return ExitCode.success
}

private struct TransferError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

private func check(_ rc: Int32, _ what: String) throws {
    if rc != 0 { throw TransferError("\(what): \(String(cString: strerror(errno)))") }
}

/// Every item under `root`, folders before what is in them, by name; what cannot go (FIFOs,
/// sockets, devices, unreadable folders) into `problems`. Partial files of an earlier run are
/// not items.
private func scan(_ root: String, problems: inout [String]) -> [Item] {
    var out: [Item] = []
    func walk(_ rel: String) {
        let dir = rel.isEmpty ? root : root + "/" + rel
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: dir) else {
            problems.append("\(rel.isEmpty ? "." : rel): cannot list: \(String(cString: strerror(errno)))")
            return
        }
        for name in names.sorted() where !isPartial(name) {
            let path = rel.isEmpty ? name : rel + "/" + name
            var st = stat()
            guard lstat(root + "/" + path, &st) == 0 else { problems.append("\(path): \(String(cString: strerror(errno)))"); continue }
            switch st.st_mode & S_IFMT {
            case S_IFDIR:
                out.append(Item(path: path, kind: .folder, size: 0))
                walk(path)
            case S_IFREG: out.append(Item(path: path, kind: .file, size: UInt64(st.st_size)))
            case S_IFLNK:
                let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: root + "/" + path)) ?? ""
                out.append(Item(path: path, kind: .symlink(target), size: 0))
            default: problems.append("\(path): not a file, folder or symbolic link (a FIFO, socket or device stays where it is)")
            }
        }
    }
    walk("")
    return out
}

/// The partial file of `name` (FNV-1a of the name: short whatever the name's length, and the
/// same on every run, so a run that was cut short leaves one partial per file at most).
private let partialPrefix = ".ubiquityfs-partial-"
private func partialName(of name: String) -> String {
    var h: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in name.utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
    return partialPrefix + String(h, radix: 16)
}
private func isPartial(_ name: String) -> Bool { name.hasPrefix(partialPrefix) }

private func kindAt(_ path: String) -> Item.Kind? {
    var st = stat()
    guard lstat(path, &st) == 0 else { return nil }
    switch st.st_mode & S_IFMT {
    case S_IFDIR: return .folder
    case S_IFLNK: return .symlink((try? FileManager.default.destinationOfSymbolicLink(atPath: path)) ?? "")
    case S_IFREG: return .file
    default: return .other
    }
}

private func makeFolder(_ path: String) throws {
    if mkdir(path, 0o755) != 0 && errno != EEXIST { throw TransferError("mkdir: \(String(cString: strerror(errno)))") }
}

/// Copy `from` to `to` through `.NAME.ubiquityfs-partial` beside it: written, synced, renamed.
private func copyFile(_ from: String, _ to: String) throws {
    let folder = (to as NSString).deletingLastPathComponent, name = (to as NSString).lastPathComponent
    let partial = folder + "/" + partialName(of: name)
    let input = open(from, O_RDONLY | O_CLOEXEC)
    guard input >= 0 else { throw TransferError("cannot read: \(String(cString: strerror(errno)))") }
    defer { close(input) }
    var st = stat()
    fstat(input, &st)
    // A partial file left by a run that was cut short goes first; the new one is made afresh
    // (never through a link someone put at its name), private until it is complete.
    unlink(partial)
    let output = open(partial, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
    guard output >= 0 else { throw TransferError("cannot write \(partial): \(String(cString: strerror(errno)))") }
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    var failure: String?
    while failure == nil {
        let n = read(input, &buffer, buffer.count)
        if n < 0 { if errno == EINTR { continue }; failure = "read: \(String(cString: strerror(errno)))"; break }
        if n == 0 { break }
        var off = 0
        while off < n {
            let w = buffer[off..<n].withUnsafeBytes { write(output, $0.baseAddress, $0.count) }
            if w < 0 { if errno == EINTR { continue }; failure = "write: \(String(cString: strerror(errno)))"; break }
            off += w
        }
    }
    if failure == nil, fchmod(output, st.st_mode & 0o7777) != 0 { failure = "chmod: \(String(cString: strerror(errno)))" }
    if failure == nil, fsync(output) != 0 { failure = "fsync: \(String(cString: strerror(errno)))" }
    if close(output) != 0, failure == nil { failure = "close: \(String(cString: strerror(errno)))" }
    if let failure {
        unlink(partial)
        throw TransferError(failure)
    }
    var times = [st.st_atim, st.st_mtim]
    _ = utimensat(AT_FDCWD, partial, &times, 0)
    try check(rename(partial, to), "rename into place")
}

/// Whether two files hold the same bytes; `dropCache` first asks the kernel to forget its cached
/// pages of `b`, so that they are read again from where they are kept.
private func sameBytes(_ a: String, _ b: String, dropCache: Bool = false) -> Bool {
    // Non-blocking, and regular files only: a FIFO put at a name must not hang the command.
    let fa = open(a, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW), fb = open(b, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)
    defer { if fa >= 0 { close(fa) }; if fb >= 0 { close(fb) } }
    guard fa >= 0, fb >= 0 else { return false }
    var sa = stat(), sb = stat()
    guard fstat(fa, &sa) == 0, fstat(fb, &sb) == 0, sa.st_mode & S_IFMT == S_IFREG, sb.st_mode & S_IFMT == S_IFREG,
          sa.st_size == sb.st_size else { return false }
    if dropCache { _ = posix_fadvise(fb, 0, 0, POSIX_FADV_DONTNEED) }
    var ba = [UInt8](repeating: 0, count: 1 << 20), bb = [UInt8](repeating: 0, count: 1 << 20)
    while true {
        let na = readFully(fa, &ba), nb = readFully(fb, &bb)
        if na != nb || na < 0 { return false }
        if na == 0 { return true }
        if ba[0..<na] != bb[0..<nb] { return false }
    }
}

private func readFully(_ fd: Int32, _ buffer: inout [UInt8]) -> Int {
    var total = 0
    while total < buffer.count {
        let n = buffer[total...].withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 { if errno == EINTR { continue }; return -1 }
        if n == 0 { break }
        total += n
    }
    return total
}

/// A mount of the store to transfer through: the user's, or a private one of this command's
/// own at STORE/transfer-mount.PID (one per command, so two never share or unmount each other's).
private final class TransferMount {
    let path: String
    private let privateMount: Bool
    static let privatePrefix = "/transfer-mount."

    init(store: String, apps: String) throws {
        let mounts = Self.mounts(of: store)
        // A private mount whose command is gone (killed) is unmounted and its folder removed.
        // Right after the kill the kernel may still hold the dead command's files for a moment
        // (the unmount is EBUSY), so it is tried again for a while.
        for m in mounts where m.hasPrefix(store + Self.privatePrefix) {
            let owner = pid_t(m.dropFirst(store.count + Self.privatePrefix.count)) ?? 0
            guard owner <= 0 || hasExited(owner) else { continue }
            var tries = 0
            while isMounted(m), tries < 40 {
                if runProgram(runningBinary(), ["unmount", m]) == 0 { break }
                tries += 1
                usleep(250_000)
            }
            if isMounted(m) { throw TransferError("the private mount of a command that was killed, \(m), stays busy; try again in a moment") }
            _ = rmdir(m)
        }
        if let mine = mounts.first(where: { !$0.hasPrefix(store + Self.privatePrefix) }) {
            path = mine
            privateMount = false
            return
        }
        let mnt = store + Self.privatePrefix + String(getpid())
        try FileManager.default.createDirectory(atPath: mnt, withIntermediateDirectories: true)
        let status = runProgram(runningBinary(), ["mount", "--store", store, "--apps", apps, mnt])
        guard status == 0 else {
            _ = rmdir(mnt)
            throw TransferError("cannot mount the store at \(mnt) for the transfer (status \(status))")
        }
        path = mnt
        privateMount = true
    }

    /// Mount points of UbiquityFS mounts that serve `store`.
    static func mounts(of store: String) -> [String] {
        guard let text = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line -> String? in
            let f = line.split(separator: " ")
            guard f.count > 2, f[2] == "fuse.ubiquityfs" else { return nil }
            let mnt = unescapeMountField(f[1])
            return storeOfMount(mnt) == store ? mnt : nil
        }
    }

    /// Where the container's Documents folder is in this mount: `NAME` in a drive view,
    /// `IDENTIFIER/Documents` in its app's view.
    func documents(of c: ContainerRecord) -> String? {
        if isDriveView(path + "/" + c.name, of: c) { return path + "/" + c.name }
        let app = path + "/" + c.identifier + "/Documents"
        return FileManager.default.fileExists(atPath: app) ? app : nil
    }

    /// Whether `documents` is `c`'s folder in a drive view (where its folder levels hold).
    func isDriveView(_ documents: String, of c: ContainerRecord) -> Bool {
        guard documents == path + "/" + c.name else { return false }
        var buffer = [UInt8](repeating: 0, count: 1024)
        let n = buffer.withUnsafeMutableBytes { c_getxattr(documents, "user.ubiquity.container", $0.baseAddress, $0.count) }
        return n > 0 && String(decoding: buffer[0..<n], as: UTF8.self) == c.identifier
    }

    func finish() {
        guard privateMount else { return }
        if runProgram(runningBinary(), ["unmount", path]) == 0 { _ = rmdir(path) }
    }
}

/// The deepest folder level a container's setting allows (nil: any), as the filesystem reads it.
private func levelsLimit(_ levels: String) -> Int? {
    switch levels {
    case "Any": return nil
    case "One": return 1
    default: return 0
    }
}

private func realPath(_ path: String) -> String {
    guard let r = realpath(path, nil) else { return path }
    defer { free(r) }
    return String(cString: r)
}

/// Whether two paths name one file (the same device and inode).
private func sameFile(_ a: String, _ b: String) -> Bool {
    var sa = stat(), sb = stat()
    return lstat(a, &sa) == 0 && lstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino
}

/// Make the name just given to `path` durable before its source goes.
private func syncFolder(of path: String) throws {
    let fd = open((path as NSString).deletingLastPathComponent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { throw TransferError("cannot open the folder of \(path): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    try check(fsync(fd), "fsync the folder of \(path)")
}

/// SIGINT, SIGTERM and SIGHUP ask the copy to stop after the item in hand, so the command still
/// unmounts its private mount and says what was not copied.
nonisolated(unsafe) private var stopRequested: sig_atomic_t = 0
private final class StopOnSignal {
    private var saved: [(Int32, sighandler_t?)] = []
    init() {
        stopRequested = 0
        for sig in [SIGINT, SIGTERM, SIGHUP] { saved.append((sig, signal(sig) { _ in stopRequested = 1 })) }
    }
    var requested: Bool { stopRequested != 0 }
    func restore() { for (sig, handler) in saved { signal(sig, handler) } }
}

/// Progress on stderr: one line redrawn in place on a terminal, a plain line a second otherwise.
private final class Progress {
    let verb: String, files: Int, bytes: UInt64
    private var doneFiles = 0, doneBytes: UInt64 = 0
    private let start = Date()
    private var last = Date.distantPast
    private let terminal = isatty(2) == 1

    init(verb: String, files: Int, bytes: UInt64) {
        self.verb = verb; self.files = files; self.bytes = bytes
    }

    func done(bytes b: UInt64) {
        doneFiles += 1
        doneBytes += b
        let now = Date()
        if now.timeIntervalSince(last) >= (terminal ? 0.1 : 1) || doneFiles == files {
            last = now
            show(final: false)
        }
    }

    private func line() -> String {
        let elapsed = max(Date().timeIntervalSince(start), 0.001)
        let rate = Double(doneBytes) / elapsed
        let left = rate > 0 ? Double(bytes - min(doneBytes, bytes)) / rate : 0
        return "\(verb): \(doneFiles)/\(files) files, \(size(doneBytes))/\(size(bytes)), \(size(UInt64(rate)))/s, \(clock(left)) left"
    }

    private func show(final: Bool) {
        if terminal {
            let width = 24
            let filled = files == 0 ? width : width * doneFiles / files
            let bar = "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled) + "] "
            writeRaw("\r" + bar + line() + "  ")
        } else {
            writeError(line())
        }
    }

    func finish(skipped: Int, failed: Int) {
        if terminal { writeRaw("\n") }
        let elapsed = Date().timeIntervalSince(start)
        var summary = "\(verb): \(doneFiles - failed) of \(files) files (\(size(bytes))) in \(String(format: "%.1f", elapsed)) s"
        if skipped > 0 { summary += ", \(skipped) already there" }
        if failed > 0 { summary += ", \(failed) failed" }
        writeError(summary)
    }

    private func writeRaw(_ s: String) { _ = s.withCString { write(2, $0, strlen($0)) } }

    private func size(_ n: UInt64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var v = Double(n), u = 0
        while v >= 1024, u < units.count - 1 { v /= 1024; u += 1 }
        return u == 0 ? "\(n) B" : String(format: "%.1f", v) + " " + units[u]
    }

    private func clock(_ seconds: Double) -> String {
        let s = Int(seconds.rounded(.up))
        return String(format: "%d:%02d", s / 60, s % 60)
    }
}
