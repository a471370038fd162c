// Where each record of a dense array is, by its inode number: a hash table of 4-byte slots.
//
// A `[InodeNumber: UInt32]` keeps the key beside each position, 12 bytes a bucket, and about two
// buckets an entry. Here a slot holds only the position (plus one; 0 is empty) and the key is
// read from the record it points to, so the table costs about 8 bytes an entry. Linear probing;
// a removal shifts the entries after it back instead of leaving a tombstone. Keys are inode
// numbers the store hands out, and the ids the daemon makes above them (stand-ins from 2^62,
// the desktop trash's from 2^48): none chosen by users, so a fixed multiplicative hash whose top
// bits pick the slot (Fibonacci hashing) spreads them, high bits included.
//
// The owner keeps its records in positions 0..<count without gaps and passes their keys in
// (`keys`): the index never holds a copy of them.

import UbiquityStore

struct PositionIndex {
    private var slots: [UInt32] = []
    private(set) var count = 0
    /// 64 less log2 of the number of slots.
    private var shift: UInt64 = 64

    /// The slot `key` would sit in with no collision.
    private func home(_ key: InodeNumber) -> Int {
        Int(truncatingIfNeeded: (key &* 0x9E37_79B9_7F4A_7C15) >> shift)
    }

    /// The position of `key`, if it is in the index.
    func find(_ key: InodeNumber, keys: (Int) -> InodeNumber) -> Int? {
        slot(of: key, keys: keys).map { Int(slots[$0]) - 1 }
    }

    private func slot(of key: InodeNumber, keys: (Int) -> InodeNumber) -> Int? {
        guard !slots.isEmpty else { return nil }
        let mask = slots.count - 1
        var i = home(key)
        while true {
            let s = slots[i]
            if s == 0 { return nil }
            if keys(Int(s) - 1) == key { return i }
            i = (i + 1) & mask
        }
    }

    /// Adds `key` (not in the index) at `position`. `keys` must answer for every position
    /// already in the index.
    mutating func insert(_ key: InodeNumber, at position: Int, keys: (Int) -> InodeNumber) {
        precondition(position < Int(UInt32.max), "more records than a position index holds")
        if (count + 1) * 4 > slots.count * 3 { grow(keys: keys) }
        place(key, UInt32(position + 1))
        count += 1
    }

    /// `key`, in the index, is now at `position` (its record moved).
    mutating func move(_ key: InodeNumber, to position: Int, keys: (Int) -> InodeNumber) {
        guard let i = slot(of: key, keys: keys) else { preconditionFailure("moving a key the index lacks") }
        slots[i] = UInt32(position + 1)
    }

    /// Removes `key`; returns its position, nil if it was not in the index.
    @discardableResult
    mutating func remove(_ key: InodeNumber, keys: (Int) -> InodeNumber) -> Int? {
        guard var hole = slot(of: key, keys: keys) else { return nil }
        let position = Int(slots[hole]) - 1
        let mask = slots.count - 1
        slots[hole] = 0
        count -= 1
        // Entries after the hole that could sit in it (their home is not between the hole and
        // them) move back, so that no search stops short at it.
        var j = hole
        while true {
            j = (j + 1) & mask
            let s = slots[j]
            if s == 0 { break }
            let h = home(keys(Int(s) - 1))
            let stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j)
            if !stays {
                slots[hole] = s
                slots[j] = 0
                hole = j
            }
        }
        if count == 0 {
            slots = []
            shift = 64
        }
        return position
    }

    /// Room for `n` entries without growing.
    mutating func reserveCapacity(_ n: Int, keys: (Int) -> InodeNumber) {
        var capacity = max(8, slots.count)
        while n * 4 > capacity * 3 { capacity *= 2 }
        if capacity > slots.count { rebuild(capacity: capacity, keys: keys) }
    }

    private mutating func grow(keys: (Int) -> InodeNumber) {
        rebuild(capacity: max(8, slots.count * 2), keys: keys)
    }

    private mutating func rebuild(capacity: Int, keys: (Int) -> InodeNumber) {
        let old = slots
        slots = Array(repeating: 0, count: capacity)
        shift = UInt64(64 - capacity.trailingZeroBitCount)
        for s in old where s != 0 { place(keys(Int(s) - 1), s) }
    }

    private mutating func place(_ key: InodeNumber, _ value: UInt32) {
        let mask = slots.count - 1
        var i = home(key)
        while slots[i] != 0 { i = (i + 1) & mask }
        slots[i] = value
    }

    /// The slots' buffer (see `Namespace.storageIdentity`).
    var storageIdentity: UInt {
        withUnsafeBytes(of: slots) { $0.load(as: UInt.self) }
    }
}

/// A record that carries the inode number a `DenseRecords` finds it by.
protocol InodeKeyed {
    var ino: InodeNumber { get }
}

/// Records in one array without gaps, found by inode number through a `PositionIndex`. A removal
/// moves the last record into the hole, so positions are only good until the next removal.
struct DenseRecords<Record: InodeKeyed> {
    private(set) var all: [Record] = []
    private var index = PositionIndex()

    var count: Int { all.count }

    func position(of ino: InodeNumber) -> Int? {
        all.withUnsafeBufferPointer { records in index.find(ino) { records[$0].ino } }
    }

    /// The record at `position`; a new value must keep its inode number.
    subscript(position: Int) -> Record {
        get { all[position] }
        set { all[position] = newValue }
    }

    /// Adds `record`, whose inode number is not here yet; returns its position.
    @discardableResult
    mutating func append(_ record: Record) -> Int {
        all.append(record)
        let at = all.count - 1
        withIndex { index, keys in index.insert(record.ino, at: at, keys: keys) }
        return at
    }

    /// Removes the record of `ino`, if any, and returns it.
    @discardableResult
    mutating func remove(_ ino: InodeNumber) -> Record? {
        guard let i = withIndex({ index, keys in index.remove(ino, keys: keys) }) else { return nil }
        let removed = all[i], last = all.count - 1
        if i < last {
            let moving = all[last].ino
            withIndex { index, keys in index.move(moving, to: i, keys: keys) }
            all[i] = all[last]
        }
        all.removeLast()
        return removed
    }

    mutating func reserveCapacity(_ n: Int) {
        all.reserveCapacity(n)
        withIndex { index, keys in index.reserveCapacity(n, keys: keys) }
    }

    /// Its buffers (see `Namespace.storageIdentity`).
    var storageIdentity: [UInt] {
        [index.storageIdentity, withUnsafeBytes(of: all) { $0.load(as: UInt.self) }]
    }

    /// `body` with the index and the records' keys. The index is moved out while `body` changes
    /// it (no copy: it is the only reference to its storage), so that the records can be read
    /// meanwhile; `keys` reads them through a buffer pointer valid only during `body`, which the
    /// index's methods never keep.
    private mutating func withIndex<R>(_ body: (inout PositionIndex, (Int) -> InodeNumber) -> R) -> R {
        var moved = index
        index = PositionIndex()
        defer { index = moved }
        return all.withUnsafeBufferPointer { records in body(&moved) { records[$0].ino } }
    }
}
