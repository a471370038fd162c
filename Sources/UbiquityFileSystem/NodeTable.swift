// Every node of the namespace by inode number, as a dictionary would hold them, in less memory.
//
// A `[InodeNumber: NodeRecord]` keeps a 128-byte slot per bucket, and a hash table sized for a
// million entries has two million buckets (it never fills past three quarters): 268 MB, half of
// it empty. Here the records sit in one array, without gaps, and the hash table holds only
// their positions (12 bytes a bucket): about 145 MB at a million nodes. A removal moves the
// last record into the hole.

import UbiquityStore

struct NodeTable: Sequence {
    private var position: [InodeNumber: UInt32] = [:]
    private var records: [NodeRecord] = []

    init() {}

    var count: Int { records.count }
    var isEmpty: Bool { records.isEmpty }
    /// Every node, in no particular order.
    var values: [NodeRecord] { records }

    mutating func reserveCapacity(_ n: Int) {
        position.reserveCapacity(n)
        records.reserveCapacity(n)
    }

    /// The node `ino`; set a node (whose `ino` is the key) or nil to remove it.
    subscript(ino: InodeNumber) -> NodeRecord? {
        get { position[ino].map { records[Int($0)] } }
        set {
            if let n = newValue {
                precondition(n.ino == ino, "node \(n.ino) put under inode \(ino)")
                if let i = position[ino] {
                    records[Int(i)] = n
                } else {
                    position[ino] = UInt32(records.count)
                    records.append(n)
                }
            } else if let i = position.removeValue(forKey: ino) {
                let last = records.removeLast()
                if Int(i) < records.count {
                    records[Int(i)] = last
                    position[last.ino] = i
                }
            }
        }
    }

    /// Its two buffers (see `Namespace.storageIdentity`).
    var storageIdentity: [UInt] {
        [withUnsafeBytes(of: position) { $0.load(as: UInt.self) }, withUnsafeBytes(of: records) { $0.load(as: UInt.self) }]
    }

    func makeIterator() -> some IteratorProtocol<(key: InodeNumber, value: NodeRecord)> {
        records.lazy.map { (key: $0.ino, value: $0) }.makeIterator()
    }
}
