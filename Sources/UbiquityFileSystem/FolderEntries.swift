// One folder's entries, name → child, as a `[[UInt8]: InodeNumber]` would hold them, in less
// memory.
//
// In a dictionary each name is an array of its own on the heap (a 32-byte header, the bytes,
// rounded up by malloc: 48 bytes for a 10-byte name) and its slot 16 bytes more, in a table
// filled to three quarters at most: about 75 bytes an entry. Here the names sit one after
// another in one byte buffer and the table is 16-byte slots (where the name starts, its length,
// a few bits of its hash, the child) with linear probing: about 40 bytes an entry. A removal
// leaves a tombstone in the table and its bytes in the buffer until either is worth
// rebuilding.
//
// Names are hashed with the standard library's `Hasher`, seeded per process, as a dictionary's
// keys are: names come from users, and a fixed hash would let chosen names make one folder's
// look-ups slow. A name too long for a slot's 16-bit length (the kernel passes at most 1,024
// bytes, but a damaged store or another writer may hold anything) goes to a plain dictionary
// beside the table, so that no name in a store keeps a daemon from starting.

import Foundation
import UbiquityStore

struct FolderEntries: Sequence, Equatable, ExpressibleByDictionaryLiteral {
    private var bytes: [UInt8] = []
    private var slots: [Slot] = []
    /// Live entries.
    private(set) var count = 0
    /// Slots in use: live entries and tombstones.
    private var occupied = 0
    /// Bytes of `bytes` that belong to removed names.
    private var garbage = 0
    /// Entries whose names are longer than a slot can say.
    private var long: [[UInt8]: InodeNumber] = [:]

    private struct Slot {
        var offset: UInt32 = 0
        var length: UInt16 = 0
        var state: UInt8 = Slot.empty
        /// Eight bits of the name's hash: most mismatches end here, without comparing bytes.
        var tag: UInt8 = 0
        var child: InodeNumber = 0

        static let empty: UInt8 = 0
        static let live: UInt8 = 1
        static let removed: UInt8 = 2
    }

    init() {}

    init(dictionaryLiteral elements: ([UInt8], InodeNumber)...) {
        for (name, child) in elements { self[name] = child }
    }

    var isEmpty: Bool { count == 0 }

    subscript(name: [UInt8]) -> InodeNumber? {
        get {
            if name.count > Self.slotNameLimit { return long[name] }
            guard let i = find(name, hash(name)) else { return nil }
            return slots[i].child
        }
        set {
            if let newValue { insert(name, newValue) } else { removeValue(forKey: name) }
        }
    }

    @discardableResult
    mutating func removeValue(forKey name: [UInt8]) -> InodeNumber? {
        if name.count > Self.slotNameLimit {
            guard let child = long.removeValue(forKey: name) else { return nil }
            count -= 1
            if count == 0 { self = FolderEntries() }
            return child
        }
        guard let i = find(name, hash(name)) else { return nil }
        let child = slots[i].child
        slots[i].state = Slot.removed
        count -= 1
        garbage += Int(slots[i].length)
        if count == 0 {
            self = FolderEntries()
        } else if garbage > 4096 && garbage > bytes.count / 2 {
            rebuild(capacity: slots.count)
        }
        return child
    }

    /// The children, in no particular order.
    var values: some Sequence<InodeNumber> { lazy.map { $0.value } }

    /// The names, in no particular order.
    var keys: some Sequence<[UInt8]> { lazy.map { $0.key } }

    /// A name of `child` here, if it has one (a scan).
    func name(of child: InodeNumber) -> [UInt8]? {
        slots.first { $0.state == Slot.live && $0.child == child }.map { nameBytes($0) }
            ?? long.first { $0.value == child }?.key
    }

    /// Every name of `child` here (a scan).
    func names(of child: InodeNumber) -> [[UInt8]] {
        slots.filter { $0.state == Slot.live && $0.child == child }.map { nameBytes($0) }
            + long.filter { $0.value == child }.map(\.key)
    }

    func makeIterator() -> Iterator { Iterator(entries: self, rest: long.makeIterator()) }

    /// The slots' entries, then the long names'.
    struct Iterator: IteratorProtocol {
        fileprivate let entries: FolderEntries
        fileprivate var slot = 0
        fileprivate var rest: [[UInt8]: InodeNumber].Iterator

        mutating func next() -> (key: [UInt8], value: InodeNumber)? {
            while slot < entries.slots.count {
                let s = entries.slots[slot]
                slot += 1
                if s.state == Slot.live { return (entries.nameBytes(s), s.child) }
            }
            return rest.next()
        }
    }

    static func == (a: FolderEntries, b: FolderEntries) -> Bool {
        guard a.count == b.count, a.long == b.long else { return false }
        for s in a.slots where s.state == Slot.live {
            let found = a.bytes.withUnsafeBufferPointer { all in
                b.find(UnsafeBufferPointer(rebasing: all[Int(s.offset)..<Int(s.offset) + Int(s.length)]))
            }
            guard let j = found, b.slots[j].child == s.child else { return false }
        }
        return true
    }

    // MARK: The table

    /// Names longer than this go to `long`.
    static let slotNameLimit = Int(UInt16.max)

    private func nameBytes(_ s: Slot) -> [UInt8] {
        Array(bytes[Int(s.offset)..<Int(s.offset) + Int(s.length)])
    }

    private func hash(_ name: UnsafeBufferPointer<UInt8>) -> Int {
        var h = Hasher()
        h.combine(bytes: UnsafeRawBufferPointer(name))
        return h.finalize()
    }

    private func hash(_ name: [UInt8]) -> Int {
        name.withUnsafeBufferPointer { hash($0) }
    }

    private static func tag(_ hash: Int) -> UInt8 { UInt8(truncatingIfNeeded: UInt(bitPattern: hash) >> 56) }

    private func find(_ name: [UInt8], _ hash: Int) -> Int? {
        name.withUnsafeBufferPointer { find($0, hash) }
    }

    private func find(_ name: UnsafeBufferPointer<UInt8>) -> Int? {
        find(name, hash(name))
    }

    /// The slot holding `name`, if any.
    private func find(_ name: UnsafeBufferPointer<UInt8>, _ hash: Int) -> Int? {
        guard !slots.isEmpty else { return nil }
        let mask = slots.count - 1, tag = Self.tag(hash)
        var i = hash & mask
        return bytes.withUnsafeBufferPointer { all -> Int? in
            while true {
                let s = slots[i]
                if s.state == Slot.empty { return nil }
                // Bytes are compared only for a name of one or more bytes whose live slot has as
                // many: that slot's bytes are in `bytes`, so neither base address is nil, and
                // offset + length stays within `bytes` (set when the name was copied in).
                if s.state == Slot.live && s.tag == tag && Int(s.length) == name.count
                    && (name.isEmpty || memcmp(all.baseAddress! + Int(s.offset), name.baseAddress!, name.count) == 0) {
                    return i
                }
                i = (i + 1) & mask
            }
        }
    }

    private mutating func insert(_ name: [UInt8], _ child: InodeNumber) {
        if name.count > Self.slotNameLimit {
            if long.updateValue(child, forKey: name) == nil { count += 1 }
            return
        }
        let h = hash(name)
        if let i = find(name, h) {
            slots[i].child = child
            return
        }
        // At most three quarters of the slots in use, tombstones counted.
        if (occupied + 1) * 4 > slots.count * 3 {
            // Twice the slots when the live entries would fill half of them; else the same
            // number, rid of tombstones.
            rebuild(capacity: Swift.max(8, (count + 1) * 2 > slots.count ? slots.count * 2 : slots.count))
        }
        precondition(bytes.count + name.count <= Int(UInt32.max), "a folder's names exceed 4 GiB")
        let mask = slots.count - 1
        var i = h & mask
        while slots[i].state == Slot.live { i = (i + 1) & mask }
        if slots[i].state == Slot.empty { occupied += 1 }
        slots[i] = Slot(offset: UInt32(bytes.count), length: UInt16(name.count), state: Slot.live, tag: Self.tag(h),
                        child: child)
        bytes.append(contentsOf: name)
        count += 1
    }

    /// The live entries again, in `capacity` slots (a power of two) and a buffer without garbage.
    private mutating func rebuild(capacity: Int) {
        let old = slots, oldBytes = bytes
        slots = Array(repeating: Slot(), count: capacity)
        bytes = []
        bytes.reserveCapacity(oldBytes.count - garbage)
        occupied = 0
        garbage = 0
        let mask = capacity - 1
        // Each live slot's offset and length were set when its name was copied into `oldBytes`.
        oldBytes.withUnsafeBufferPointer { all in
            for s in old where s.state == Slot.live {
                let name = UnsafeBufferPointer(rebasing: all[Int(s.offset)..<Int(s.offset) + Int(s.length)])
                let h = hash(name)
                var i = h & mask
                while slots[i].state != Slot.empty { i = (i + 1) & mask }
                slots[i] = Slot(offset: UInt32(bytes.count), length: s.length, state: Slot.live, tag: Self.tag(h),
                                child: s.child)
                bytes.append(contentsOf: name)
                occupied += 1
            }
        }
    }
}
