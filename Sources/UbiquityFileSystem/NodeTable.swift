// Every node of the namespace by inode number, as a dictionary would hold them, in less memory.
//
// A `[InodeNumber: NodeRecord]` keeps a 128-byte slot per bucket, and a hash table sized for a
// million entries has two million buckets (it never fills past three quarters): 268 MB, half of
// it empty. Here the records sit in one array, without gaps, found by a `PositionIndex` that
// holds only their positions (about 8 bytes a node): a `DenseRecords`.
//
// Each record is packed into 88 bytes, the commit that last put it (what a batch's
// `Expectation.nodeAt` compares) included, where a `NodeRecord` takes 120 and the commit 8 more:
// the container is a number into a list of identifiers (a `String` is 16 bytes, and there are a
// handful of containers), and what only devices and symlinks have (`rdev`, `target`: 32 bytes)
// sits in a side table. At a million nodes that is 40 MB less.

import UbiquityStore

struct NodeTable: Sequence {
    private var records = DenseRecords<Packed>()
    /// `rdev` and `target` of the nodes that have either.
    private var extras: [InodeNumber: Extra] = [:]
    /// The container identifiers records refer to by number (never shrinks: there are few).
    private var containerNames: [String] = []
    private var containerNumbers: [String: UInt32] = [:]

    private struct Packed: InodeKeyed {
        var ino: InodeNumber
        var size: UInt64
        var atime: Int64
        var mtime: Int64
        var ctime: Int64
        var btime: Int64
        /// Meaningful when `flags` has `hasVersion`.
        var version: VersionID
        /// The commit that last put the node (0: not known).
        var change: ChangeSeq
        var mode: UInt32
        var uid: UInt32
        var gid: UInt32
        var nlink: UInt32
        var container: UInt32
        var kind: NodeKind
        var flags: UInt8

        static let hasVersion: UInt8 = 1
        static let hasExtra: UInt8 = 2
    }

    private struct Extra {
        var rdev: UInt64
        var target: [UInt8]
    }

    init() {}

    /// The bytes a node takes in the records array (for a test that keeps it packed).
    static var recordStride: Int { MemoryLayout<Packed>.stride }

    var count: Int { records.count }
    var isEmpty: Bool { records.count == 0 }
    /// Every node, in no particular order.
    var values: [NodeRecord] { records.all.map(unpack) }

    mutating func reserveCapacity(_ n: Int) {
        records.reserveCapacity(n)
    }

    subscript(ino: InodeNumber) -> NodeRecord? {
        records.position(of: ino).map { unpack(records[$0]) }
    }

    /// The kind of node `ino`, without building its record (the namespace's load asks it of every
    /// folder entry).
    func kind(of ino: InodeNumber) -> NodeKind? {
        records.position(of: ino).map { records[$0].kind }
    }

    mutating func remove(_ ino: InodeNumber) {
        guard let removed = records.remove(ino) else { return }
        if removed.flags & Packed.hasExtra != 0 { extras[ino] = nil }
    }

    /// Put `n` (new or replacing the node of its number), as put by commit `change`.
    mutating func put(_ n: NodeRecord, change: ChangeSeq) {
        let packed = pack(n, change: change)
        if packed.flags & Packed.hasExtra != 0 {
            extras[n.ino] = Extra(rdev: n.rdev, target: n.target)
        }
        if let i = records.position(of: n.ino) {
            if records[i].flags & Packed.hasExtra != 0 && packed.flags & Packed.hasExtra == 0 { extras[n.ino] = nil }
            records[i] = packed
        } else {
            records.append(packed)
        }
    }

    /// The commit that last put node `ino` (0 if not known), nil if there is no such node.
    func change(of ino: InodeNumber) -> ChangeSeq? {
        records.position(of: ino).map { records[$0].change }
    }

    /// Its buffers (see `Namespace.storageIdentity`).
    var storageIdentity: [UInt] {
        records.storageIdentity + [withUnsafeBytes(of: extras) { $0.load(as: UInt.self) }]
    }

    func makeIterator() -> some IteratorProtocol<(key: InodeNumber, value: NodeRecord)> {
        records.all.lazy.map { (key: $0.ino, value: unpack($0)) }.makeIterator()
    }

    private mutating func number(of container: String) -> UInt32 {
        if let k = containerNumbers[container] { return k }
        let k = UInt32(containerNames.count)
        containerNames.append(container)
        containerNumbers[container] = k
        return k
    }

    private mutating func pack(_ n: NodeRecord, change: ChangeSeq) -> Packed {
        var flags: UInt8 = 0
        if n.currentVersion != nil { flags |= Packed.hasVersion }
        if n.rdev != 0 || !n.target.isEmpty { flags |= Packed.hasExtra }
        return Packed(ino: n.ino, size: n.size, atime: n.atime, mtime: n.mtime, ctime: n.ctime, btime: n.btime,
                      version: n.currentVersion ?? 0, change: change, mode: n.mode, uid: n.uid, gid: n.gid,
                      nlink: n.nlink, container: number(of: n.container), kind: n.kind, flags: flags)
    }

    private func unpack(_ p: Packed) -> NodeRecord {
        let extra = p.flags & Packed.hasExtra != 0 ? extras[p.ino] : nil
        return NodeRecord(ino: p.ino, container: containerNames[Int(p.container)], kind: p.kind, mode: p.mode,
                          uid: p.uid, gid: p.gid, nlink: p.nlink, size: p.size, atime: p.atime, mtime: p.mtime,
                          ctime: p.ctime, btime: p.btime, rdev: extra?.rdev ?? 0, target: extra?.target ?? [],
                          currentVersion: p.flags & Packed.hasVersion != 0 ? p.version : nil)
    }
}
