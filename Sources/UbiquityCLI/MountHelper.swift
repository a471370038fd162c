// Mounting from /etc/fstab and `mount -t fuse.ubiquityfs`: mount(8) hands fuse.* types to
// mount.fuse3, which runs `ubiquityfs SOURCE MOUNTPOINT -o OPTIONS` (having dropped user, nouser,
// users, auto, noauto, nofail and _netdev, and added dev,suid unless nodev or nosuid was given).
// This turns that into `ubiquityfs mount …`.
// Also the checks every mount makes of its mount point.

import Foundation

/// Options the kernel or libfuse takes as they are.
private let passedOptions: Set<String> = [
    "ro", "noexec", "exec", "nosuid", "nodev", "allow_other", "allow_root", "auto_unmount",
    "noatime", "atime", "sync", "async", "dirsync",
]

/// Options of an fstab line that concern mount(8), systemd or the desktop, not this filesystem.
private let ignoredOptions: Set<String> = [
    "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group", "nofail", "_netdev",
    "nobootwait", "silent", "loud",
    // mount.fuse3 adds these to every line that does not say nodev or nosuid; files synced from
    // another device must not be honoured as setuid or as devices (libfuse's default).
    "dev", "suid",
    // libfuse does not take these; relatime is what the kernel does anyway.
    "relatime", "norelatime", "strictatime",
]

/// UbiquityFS's own, as `ubiquityfs mount` options.
private let valuedOptions: [String: String] = [
    "apps": "--apps", "app": "--app", "cache_seconds": "--cache-seconds", "keep_versions": "--keep-versions",
    "retention": "--retention", "keep_deleted_days": "--keep-deleted-days", "read_ahead": "--read-ahead",
    "io_uring_threads": "--io-uring-threads",
]
private let flagOptions: [String: String] = [
    "allow_non_empty": "--allow-non-empty", "apply_manifest_changes": "--apply-manifest-changes",
]

/// `ubiquityfs SOURCE MOUNTPOINT [-o OPTIONS]…` as `ubiquityfs mount` arguments. SOURCE is the
/// store folder, or `ubiquityfs` (or `none`, `default`) for the default one.
func mountHelperArguments(_ args: [String]) throws -> [String] {
    var positionals: [String] = []
    var options: [String] = []
    var i = 0
    while i < args.count {
        let arg = args[i]
        if arg == "-o" {
            guard i + 1 < args.count else { throw UsageError(message: "-o needs a value") }
            options += splitOptions(args[i + 1])
            i += 1
        } else if arg.hasPrefix("-o") {
            options += splitOptions(String(arg.dropFirst(2)))
        } else if ["-n", "-s", "-v", "-f"].contains(arg) {
            // What mount(8) may pass on (no mtab, sloppy, verbose, fake): nothing to do here.
        } else if arg.hasPrefix("-") {
            throw UsageError(message: "unknown option \(arg)")
        } else {
            positionals.append(arg)
        }
        i += 1
    }
    guard positionals.count == 2 else {
        throw UsageError(message: positionals.count < 2 ? "missing the mount point" : "unexpected argument \(positionals[2])")
    }
    guard positionals[0].hasPrefix("/") || ["ubiquityfs", "none", "default"].contains(positionals[0]) else {
        throw UsageError(message: "the store must be an absolute path (or ubiquityfs for the default one)")
    }
    var out = ["mount"]
    let source = positionals[0]
    if !["ubiquityfs", "none", "default"].contains(source) { out += ["--store", source] }
    var passed: [String] = []
    for option in options {
        let (name, value) = option.split(separator: "=", maxSplits: 1).map(String.init).pairOrNil()
        if passedOptions.contains(option) {
            passed.append(option)
        } else if ignoredOptions.contains(option) || ignoredOptions.contains(name) || name.hasPrefix("x-") || name == "comment" {
            // (`user=NAME` is how mount(8) tells the helper who mounted a `user` line.)
            continue
        } else if let flag = valuedOptions[name] {
            guard let value, !value.isEmpty else { throw UsageError(message: "mount option \(name) needs a value (\(name)=…)") }
            out += [flag, value]
        } else if let flag = flagOptions[name], value == nil {
            out.append(flag)
        } else {
            let ours = (valuedOptions.keys.map { $0 + "=" } + flagOptions.keys).sorted().joined(separator: ", ")
            throw UsageError(message: "unknown mount option '\(option)'; UbiquityFS takes \(ours), and ro, noexec, nosuid, nodev, allow_other, allow_root")
        }
    }
    if !passed.isEmpty { out += ["-o", passed.joined(separator: ",")] }
    return out + [positionals[1]]
}

/// Comma-separated options; a backslash escapes a comma (as libfuse reads them).
private func splitOptions(_ text: String) -> [String] {
    var out: [String] = []
    var current = ""
    var escaped = false
    for c in text {
        if escaped { current.append(c); escaped = false } else if c == "\\" { escaped = true } else if c == "," {
            if !current.isEmpty { out.append(current) }
            current = ""
        } else { current.append(c) }
    }
    if !current.isEmpty { out.append(current) }
    return out
}

private extension Array where Element == String {
    /// `[name]` or `[name, value]` as a pair.
    func pairOrNil() -> (String, String?) { (self.first ?? "", count > 1 ? self[1] : nil) }
}

/// Why `path` cannot take a mount, or nil: already a mount point (a mount over a mount hides
/// the first), or a folder with files in it (they would be hidden until the unmount), unless
/// `allowNonEmpty`.
func mountpointProblem(_ path: String, allowNonEmpty: Bool) -> String? {
    // systemd's automount point (x-systemd.automount) is autofs until the first access mounts.
    if let type = mountType(at: path), type != "autofs" {
        // statfs always asks the daemon (a stat may be answered from the kernel's cache).
        var st = statvfs()
        if statvfs(path, &st) != 0 && errno == ENOTCONN {
            return "\(path) is a mount whose daemon is gone; clear it with 'fusermount3 -u \(path)', then mount again"
        }
        let how = type == "fuse.ubiquityfs" ? "'ubiquityfs unmount \(path)'" : "'umount \(path)'"
        return "\(path) is already a mount point (\(type)); unmount it first with \(how), or choose another folder"
    }
    if !allowNonEmpty, let items = try? FileManager.default.contentsOfDirectory(atPath: path), !items.isEmpty {
        return "\(path) is not empty (\(items.count) item\(items.count == 1 ? "" : "s")); a mount would hide what is there until it is unmounted. "
            + "Choose an empty folder, or pass --allow-non-empty (allow_non_empty in fstab)"
    }
    return nil
}

/// The filesystem type of the mount whose mount point is `path`, if there is one.
func mountType(at path: String) -> String? { mountedEntry(at: path)?.type }

/// The mount on top at `path` (a path with no symlinks): its filesystem type and its device
/// ("major:minor"; a FUSE mount's is "0:N", N naming its connection in fusectl). Read from
/// /proc, never through the mount, which may not be serving yet.
func mountedEntry(at path: String) -> (type: String, device: String)? {
    guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return nil }
    var found: (type: String, device: String)?
    for line in text.split(separator: "\n") {
        // id parent major:minor root MOUNTPOINT options [optional…] - TYPE source super-options
        let fields = line.split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count > 4, unescapeMountField(fields[4]) == path,
              let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count else { continue }
        found = (String(fields[dash + 1]), String(fields[2]))   // the last one listed is the one on top
    }
    return found
}

/// The kernel writes space, tab, newline and backslash in mount fields as octal escapes.
func unescapeMountField(_ field: Substring) -> String {
    var bytes: [UInt8] = []
    let raw = Array(field.utf8)
    var i = 0
    while i < raw.count {
        if raw[i] == 0x5c, i + 3 < raw.count, let v = UInt8(String(decoding: raw[(i + 1)...(i + 3)], as: UTF8.self), radix: 8) {
            bytes.append(v)
            i += 4
        } else {
            bytes.append(raw[i])
            i += 1
        }
    }
    return String(decoding: bytes, as: UTF8.self)
}
