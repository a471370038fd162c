// Reading a manifests folder.

import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Manifests larger than this are refused (an Info.plist is a few KiB).
let maximumManifestSize = 16 << 20

/// Byte-wise order, so that sorting does not depend on locale or Unicode normalization.
func precedesByBytes(_ a: String, _ b: String) -> Bool {
    a.utf8.lexicographicallyPrecedes(b.utf8)
}

func joinPath(_ directory: String, _ name: String) -> String {
    if directory.isEmpty { return name }
    return directory.hasSuffix("/") ? directory + name : directory + "/" + name
}

/// The manifest files of a folder, as paths relative to it, sorted by bytes: `NAME.plist` files, and
/// `NAME/Info.plist` one level down. Names starting with "." are skipped (editor and macOS litter).
func manifestCandidates(in directory: String) throws -> [String] {
    let fm = FileManager.default
    var found: [String] = []
    for name in try fm.contentsOfDirectory(atPath: directory) where !name.hasPrefix(".") {
        let full = joinPath(directory, name)
        var isDirectory: ObjCBool = false
        let exists = fm.fileExists(atPath: full, isDirectory: &isDirectory)
        if exists && isDirectory.boolValue {
            let inner = joinPath(full, "Info.plist")
            var innerIsDirectory: ObjCBool = false
            if fm.fileExists(atPath: inner, isDirectory: &innerIsDirectory), !innerIsDirectory.boolValue {
                found.append(name + "/Info.plist")
            } else if name.hasSuffix(".plist") {
                found.append(name)   // a folder that looks like a manifest gets a diagnostic
            }
        } else if name.hasSuffix(".plist") {
            found.append(name)   // includes broken links, which then get a diagnostic
        }
    }
    return found.sorted(by: precedesByBytes)
}

/// Every *.plist in `directory` (non-recursive, sorted by file name; also accept `DIR/NAME/Info.plist` one level down). Bad manifests give diagnostics and are left out; the others load.
///
/// Rules: a manifest with any error is left out entirely (warnings do not exclude it). When two
/// manifests declare the same CFBundleIdentifier, or the same container identifier, the one whose path
/// sorts later is left out. Paths are `directory` joined with the file's relative path. A missing or
/// unreadable folder gives one error with the folder as the file, and no manifests.
public func loadManifests(directory: String) -> ManifestLoad {
    let fm = FileManager.default
    var isDirectory: ObjCBool = false
    guard fm.fileExists(atPath: directory, isDirectory: &isDirectory) else {
        return ManifestLoad(manifests: [], diagnostics: [
            Diagnostic(severity: .error, file: directory, key: nil, message: "the manifests folder does not exist",
                       fix: "create it and put the apps' Info.plist files in it, or name another folder"),
        ])
    }
    guard isDirectory.boolValue else {
        return ManifestLoad(manifests: [], diagnostics: [
            Diagnostic(severity: .error, file: directory, key: nil, message: "is not a folder",
                       fix: "name the folder that holds the apps' Info.plist files"),
        ])
    }
    let candidates: [String]
    do {
        candidates = try manifestCandidates(in: directory)
    } catch {
        return ManifestLoad(manifests: [], diagnostics: [
            Diagnostic(severity: .error, file: directory, key: nil, message: "the manifests folder cannot be read",
                       fix: "check its permissions"),
        ])
    }

    var manifests: [AppManifest] = []
    var diagnostics: [Diagnostic] = []
    var bundleOwners: [String: String] = [:]      // bundle identifier -> manifest path
    var containerOwners: [String: String] = [:]   // container identifier -> manifest path
    for relative in candidates {
        let path = joinPath(directory, relative)
        let bytes: [UInt8]
        switch readManifestFile(path) {
        case .bytes(let b): bytes = b
        case .problem(let problem):
            diagnostics.append(problem)
            continue
        }
        var parser = ManifestParser(path: path)
        let parsed = parser.parse(bytes)
        diagnostics += parser.diagnostics
        guard let manifest = parsed else { continue }

        if let owner = bundleOwners[manifest.bundleIdentifier] {
            diagnostics.append(Diagnostic(
                severity: .error, file: path, key: Keys.bundleIdentifier,
                message: "\(oneLine(manifest.bundleIdentifier).text) is already declared by \(owner), so this manifest is left out",
                fix: "give each app its own bundle identifier, or remove one of the two manifests"))
            continue
        }
        if let clash = manifest.containers.first(where: { containerOwners[$0.identifier] != nil }) {
            diagnostics.append(Diagnostic(
                severity: .error, file: path, key: "\(Keys.containers).\(clash.identifier)",
                message: "\(oneLine(clash.identifier).text) is already declared by \(containerOwners[clash.identifier]!), so this manifest is left out",
                fix: "declare each container in one manifest only"))
            continue
        }
        bundleOwners[manifest.bundleIdentifier] = path
        for container in manifest.containers { containerOwners[container.identifier] = path }
        manifests.append(manifest)
    }
    return ManifestLoad(manifests: manifests, diagnostics: diagnostics)
}

private enum FileRead {
    case bytes([UInt8])
    case problem(Diagnostic)
}

private func readManifestFile(_ path: String) -> FileRead {
    func problem(_ message: String, _ fix: String) -> FileRead {
        .problem(Diagnostic(severity: .error, file: path, key: nil, message: message, fix: fix))
    }
    var info = stat()
    guard stat(path, &info) == 0 else {
        let reason = errno
        if lstat(path, &info) == 0, (info.st_mode & mode_t(S_IFMT)) == mode_t(S_IFLNK) {
            return problem("the file cannot be read: it is a broken symbolic link", "point the link at a manifest or remove it")
        }
        return problem("the file cannot be read: \(String(cString: strerror(reason)))", "check that it exists and is readable")
    }
    if (info.st_mode & mode_t(S_IFMT)) == mode_t(S_IFDIR) {
        return problem("is a folder, not a manifest file (and it holds no Info.plist)",
                       "put the app's Info.plist inside it, or rename or remove the folder")
    }
    // Never open a FIFO, socket or device: reading one could block the daemon.
    guard (info.st_mode & mode_t(S_IFMT)) == mode_t(S_IFREG) else {
        return problem("is not a regular file (a FIFO, socket or device)", "remove it from the manifests folder")
    }
    guard Int(info.st_size) <= maximumManifestSize else {
        return problem("the file is \(info.st_size) bytes, too large for an Info.plist", "remove it from the manifests folder")
    }
    guard let data = FileManager.default.contents(atPath: path) else {
        return problem(access(path, R_OK) == 0 ? "the file cannot be read" : "the file cannot be read: permission denied",
                       "make it readable by the user running ubiquityfs")
    }
    return .bytes([UInt8](data))
}
