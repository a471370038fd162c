// `ubiquityfs fsck`: checks that a store's tables agree with each other and with its content
// chunks, whichever implementation holds them. It reads the namespace, then every version,
// then the list of chunks, and reports what no sequence of commits could have made: names of
// nodes that are not there, link counts that do not match the names, versions of files that
// are gone, chunks a version names that the blob store lacks (and, with `full`, chunks whose
// bytes no longer match their checksum). It writes nothing to the tables.
//
// It is meant for a store no daemon serves: one that runs may commit between the three reads,
// and a file unlinked while open is nameless until its daemon stops (such files are noted, not
// counted as problems).

import Foundation

public struct StoreCheckReport: Sendable {
    /// One line per problem.
    public var problems: [String] = []
    /// Things that are fine but worth saying (nameless files, chunks no version names yet).
    public var notes: [String] = []
    public var nodes = 0, entries = 0, versions = 0, chunks = 0
    public var summary: String {
        "checked \(nodes) nodes, \(entries) names, \(versions) versions, \(chunks) chunks: "
            + (problems.isEmpty ? "no problems" : "\(problems.count) problem\(problems.count == 1 ? "" : "s")")
    }
}

/// Checks `store` (see the top of this file). `full`: read every chunk a version names and
/// compare it with its checksum.
public func checkStore(_ store: BackingStore, full: Bool) throws(StoreError) -> StoreCheckReport {
    let snapshot = try store.metadata.load()
    let versions = try store.metadata.allVersions()
    let blobs = Set(try store.blobs.allBlobs(writtenBefore: nil))
    var report = StoreCheckReport()
    report.nodes = snapshot.nodes.count
    report.entries = snapshot.dirents.count
    report.versions = versions.count
    report.chunks = blobs.count
    func problem(_ line: String) { report.problems.append(line) }

    var nodes: [InodeNumber: NodeRecord] = [:]
    for n in snapshot.nodes { nodes[n.ino] = n }
    let roots = Set(snapshot.containers.map(\.rootIno))
    var names: [InodeNumber: Int] = [:]
    var subfolders: [InodeNumber: Int] = [:]
    for d in snapshot.dirents {
        let shown = "the name \(printableName(d.name)) in folder \(d.parent)"
        guard let parent = nodes[d.parent] else { problem("\(shown): the folder does not exist"); continue }
        if parent.kind != .directory { problem("\(shown): inode \(d.parent) is not a folder") }
        guard let child = nodes[d.child] else { problem("\(shown) names inode \(d.child), which does not exist"); continue }
        names[d.child, default: 0] += 1
        if child.kind == .directory { subfolders[d.parent, default: 0] += 1 }
    }

    for (i, n) in snapshot.nodes.enumerated() {
        let count = names[n.ino] ?? 0
        switch n.kind {
        case .directory:
            if roots.contains(n.ino) {
                if count > 0 { problem("folder \(n.ino) is a container's root and also has \(count) name\(count == 1 ? "" : "s")") }
            } else if count == 0 && n.nlink == 0 {
                report.notes.append("folder \(n.ino) has no name (removed while in use; removed when a daemon starts alone)")
            } else if count == 0 {
                problem("folder \(n.ino) has no name")
            } else if count > 1 {
                problem("folder \(n.ino) has \(count) names")
            }
            let expected = 2 + UInt32(subfolders[n.ino] ?? 0)
            if n.nlink != expected && !(count == 0 && n.nlink == 0) { problem("folder \(n.ino) has link count \(n.nlink), and \(expected) by its subfolders") }
        default:
            if count == 0 && n.nlink == 0 {
                report.notes.append("inode \(n.ino) has no name (unlinked while open; removed when a daemon starts alone)")
            } else if n.nlink != UInt32(count) {
                problem("inode \(n.ino) has link count \(n.nlink) and \(count) name\(count == 1 ? "" : "s")")
            }
        }
        if n.kind == .regular {
            if n.currentVersion == nil && n.size != 0 {
                problem("inode \(n.ino) has size \(n.size) and no content")
            }
        } else if n.currentVersion != nil {
            problem("inode \(n.ino) is not a regular file and has content (version \(n.currentVersion!))")
        }
        if n.kind == .symlink && n.target.isEmpty { problem("symbolic link \(n.ino) has no target") }
        if n.ino > snapshot.maxIno { problem("inode \(n.ino) is above the store's highest inode number \(snapshot.maxIno)") }
        let seq = snapshot.change(ofNodeAt: i)
        if seq > snapshot.seq {
            problem("inode \(n.ino) was last changed at \(seq), after the change log's end \(snapshot.seq)")
        }
    }

    var byID: [VersionID: VersionRecord] = [:]
    for v in versions { byID[v.id] = v }
    for n in snapshot.nodes {
        guard let id = n.currentVersion else { continue }
        guard let v = byID[id] else { problem("inode \(n.ino): its current version \(id) does not exist"); continue }
        if v.ino != n.ino {
            // A file replaced by a rename while open keeps reading the content it had, which
            // went to the file that replaced it (the replaced one has no name by then).
            if n.nlink == 0 { continue }
            problem("inode \(n.ino): its current version \(id) is inode \(v.ino)'s")
        }
        if v.size != n.size { problem("inode \(n.ino) has size \(n.size), and its current version \(id) \(v.size)") }
    }
    let blobStore = store.blobs
    for v in versions {
        let shown = "version \(v.id) of inode \(v.ino)"
        if nodes[v.ino] == nil { problem("\(shown): the inode does not exist") }
        if v.id > snapshot.maxVersion { problem("\(shown) is above the store's highest version id \(snapshot.maxVersion)") }
        let span = (v.size + UInt64(chunkSize) - 1) / UInt64(chunkSize)
        if UInt64(v.chunks.count) != span {
            problem("\(shown) has \(v.chunks.count) chunks for \(v.size) bytes (\(span) expected)")
        }
        for (i, c) in v.chunks.enumerated() where !c.isHole {
            if c.length > UInt32(chunkSize) { problem("\(shown): chunk \(i) is \(c.length) bytes, more than a chunk") }
            if !blobs.contains(c.blob) {
                problem("\(shown): chunk \(i) (\(String(c.blob, radix: 16))) is missing")
            } else if full && !blobStore.verify(c) {
                problem("\(shown): chunk \(i) (\(String(c.blob, radix: 16))) does not match its checksum")
            }
        }
    }
    let named = Set(versions.flatMap { $0.chunks.lazy.filter { !$0.isHole }.map(\.blob) })
    let spare = blobs.subtracting(named).count
    if spare > 0 {
        report.notes.append("\(spare) chunk\(spare == 1 ? "" : "s") no version names (garbage collection frees them)")
    }

    for x in snapshot.xattrs where nodes[x.ino] == nil {
        problem("extended attribute \(printableName(x.name)) of inode \(x.ino), which does not exist")
    }
    for c in snapshot.containers {
        guard let root = nodes[c.rootIno] else { problem("container \(c.identifier): its root folder \(c.rootIno) does not exist"); continue }
        if root.kind != .directory { problem("container \(c.identifier): its root \(c.rootIno) is not a folder") }
    }
    return report
}

/// A name as text for a report line (bytes that are not UTF-8 as \xNN).
package func printableName(_ name: [UInt8]) -> String {
    // C0 and C1 controls, DEL and the Unicode line separators would move a terminal's cursor or
    // split the line: such a name is printed byte by byte, escaped.
    if let s = String(validating: name, as: UTF8.self),
       !s.unicodeScalars.contains(where: { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) || $0.value == 0x2028 || $0.value == 0x2029 }) {
        return "'" + s + "'"
    }
    return "'" + name.map { $0 >= 0x20 && $0 < 0x7f ? String(UnicodeScalar($0)) : String(format: "\\x%02x", $0) }.joined() + "'"
}
