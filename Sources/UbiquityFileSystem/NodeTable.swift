// Every node of the namespace by inode number, as a dictionary would hold them, in less memory.
//
// A `[InodeNumber: NodeRecord]` keeps a 128-byte slot per bucket, and a hash table sized for a
// million entries has two million buckets (it never fills past three quarters): 268 MB, half of
// it empty. Here the records sit in one array, without gaps, and the hash table holds only
// their positions (12 bytes a bucket): about 153 MB at a million nodes with the commits
// below. A removal moves the last record into the hole. Beside each record, the commit that
// last put it (what a batch's `Expectation.nodeAt` compares), which took a second hash table
// with as many buckets.

import UbiquityStore

struct NodeTable: Sequence {
    private var position: [InodeNumber: UInt32] = [:]
    private var records: [NodeRecord] = []
    /// `changes[i]`: the commit that last put `records[i]` (0: not known).
    private var changes: [ChangeSeq] = []

    init() {}

    var count: Int { records.count }
    var isEmpty: Bool { records.isEmpty }
    /// Every node, in no particular order.
    var values: [NodeRecord] { records }

    mutating func reserveCapacity(_ n: Int) {
        position.reserveCapacity(n)
        records.reserveCapacity(n)
        changes.reserveCapacity(n)
    }

    subscript(ino: InodeNumber) -> NodeRecord? {
        position[ino].map { records[Int($0)] }
    }

    mutating func remove(_ ino: InodeNumber) {
        guard let i = position.removeValue(forKey: ino).map(Int.init) else { return }
        let last = records.removeLast(), lastChange = changes.removeLast()
        if i < records.count {
            records[i] = last
            changes[i] = lastChange
            position[last.ino] = UInt32(i)
        }
    }

    /// Put `n` (new or replacing the node of its number), as put by commit `change`.
    mutating func put(_ n: NodeRecord, change: ChangeSeq) {
        if let i = position[n.ino].map(Int.init) {
            records[i] = n
            changes[i] = change
        } else {
            position[n.ino] = UInt32(records.count)
            records.append(n)
            changes.append(change)
        }
    }

    /// The commit that last put node `ino` (0 if not known), nil if there is no such node.
    func change(of ino: InodeNumber) -> ChangeSeq? {
        position[ino].map { changes[Int($0)] }
    }

    /// Its two buffers (see `Namespace.storageIdentity`).
    var storageIdentity: [UInt] {
        func bits<T>(_ x: T) -> UInt { withUnsafeBytes(of: x) { $0.load(as: UInt.self) } }
        return [bits(position), bits(records), bits(changes)]
    }

    func makeIterator() -> some IteratorProtocol<(key: InodeNumber, value: NodeRecord)> {
        records.lazy.map { (key: $0.ino, value: $0) }.makeIterator()
    }
}
