// `ubiquityfs versions`: the published versions of one file, oldest first, read from the store
// (read-only, so it works beside a running daemon, which commits every version before it says
// so). A path in a mount names its store by the mount root's `user.ubiquityfs.store` attribute
// and its node by its inode number, which is the store's; without a mount, `--store DIR
// CONTAINER/PATH` walks the store's namespace as the drive view shows it.

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

let versionsCommand = Subcommand(
    name: "versions",
    summary: "list a file's versions: id, time, size, device, origin, and which one is current",
    usage: "versions PATH | versions --store DIR CONTAINER/PATH",
    options: [("--store=", "store folder, to name the file as CONTAINER/PATH without a mount")],
    positionals: 1...1,
    run: { p in
        let (storeDir, ino) = try locate(p.positionals[0], store: p.value("--store"))
        let db = storeDir + "/metadata.sqlite3"
        guard FileManager.default.fileExists(atPath: db) else {
            throw UsageError(message: "no store in \(storeDir)")
        }
        let metadata = try SQLiteMetadataStore(readOnlyPath: db)
        let snapshot = try metadata.load()
        guard let node = snapshot.nodes.first(where: { $0.ino == ino }) else {
            throw UsageError(message: "\(p.positionals[0]) is not in the store \(storeDir) (deleted meanwhile?)")
        }
        guard node.kind == .regular else { throw UsageError(message: "\(p.positionals[0]) is not a file") }
        let versions = try metadata.versions(of: ino)
        var rows = [["ID", "CREATED", "SIZE", "DEVICE", "ORIGIN", "CURRENT"]]
        for v in versions {
            rows.append([String(v.id), timestamp(v.created), String(v.size), v.device.isEmpty ? "-" : v.device,
                         originName(v.origin), v.id == node.currentVersion ? "yes" : ""])
        }
        writeTable(rows)
        if versions.isEmpty { writeOut("(no published version: the file is empty and was never saved)") }
        return ExitCode.success
    })

/// The names users see for a version's origin.
private func originName(_ origin: VersionOrigin) -> String {
    switch origin {
    case .published: return "edit"
    case .recovered: return "recovered"
    case .conflict: return "conflict"
    case .restored: return "restored"
    }
}

private func timestamp(_ nanoseconds: Int64) -> String {
    let date = Date(timeIntervalSince1970: TimeInterval(nanoseconds) / 1e9)
    let f = DateFormatter()
    f.locale = Locale(identifier: "en_US_POSIX")
    f.dateFormat = "yyyy-MM-dd HH:mm:ss"
    return f.string(from: date)
}

/// The store folder and inode number a command's path names.
private func locate(_ path: String, store: String?) throws -> (String, InodeNumber) {
    if let store {
        let dir = absolutePath(store)
        let db = dir + "/metadata.sqlite3"
        guard FileManager.default.fileExists(atPath: db) else { throw UsageError(message: "no store in \(dir)") }
        let snapshot = try SQLiteMetadataStore(readOnlyPath: db).load()
        return (dir, try resolve(path, in: snapshot))
    }
    let full = absolutePath(path)
    var st = stat()
    guard lstat(full, &st) == 0 else {
        throw UsageError(message: "\(path): \(String(cString: strerror(errno)))")
    }
    // The mount root is the topmost folder on the same device.
    var root = (full as NSString).deletingLastPathComponent
    var top = full
    while true {
        var up = stat()
        guard stat(root, &up) == 0, up.st_dev == st.st_dev, top != "/" else { break }
        top = root
        root = (root as NSString).deletingLastPathComponent
    }
    var buffer = [UInt8](repeating: 0, count: 4096)
    let n = buffer.withUnsafeMutableBytes { c_getxattr(top, "user.ubiquityfs.store", $0.baseAddress, $0.count) }
    guard n > 0 else {
        throw UsageError(message: "\(path) is not in a UbiquityFS mount; name it as CONTAINER/PATH with --store DIR")
    }
    return (String(decoding: buffer[0..<n], as: UTF8.self), InodeNumber(st.st_ino))
}

/// CONTAINER/PATH as the drive view shows it: the container by name (or identifier), then the
/// path inside its Documents.
private func resolve(_ path: String, in snapshot: StoreSnapshot) throws -> InodeNumber {
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
