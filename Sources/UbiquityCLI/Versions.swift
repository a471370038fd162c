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
        let (storeDir, ino) = try locate(p.positionals[0], p)
        let metadata = try readOnlyMetadata(storeDir)
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

func timestamp(_ nanoseconds: Int64) -> String {
    let date = Date(timeIntervalSince1970: TimeInterval(nanoseconds) / 1e9)
    let f = DateFormatter()
    f.locale = Locale(identifier: "en_US_POSIX")
    f.dateFormat = "yyyy-MM-dd HH:mm:ss"
    return f.string(from: date)
}
