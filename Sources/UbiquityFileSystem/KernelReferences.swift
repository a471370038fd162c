// The nodes the kernel holds: how many references it has to each (entry replies less forgets)
// and the name it last got each by (a hint for replaying another writer's change to it).
//
// The kernel keeps every inode it was given until memory runs short, so after a million creates
// it holds a million: a `[InodeNumber: UInt64]` of counts beside a `[InodeNumber: KernelName]`
// of names, each name an array of its own on the heap, took about 130 bytes a node (the RSS a
// growing namespace had beyond a fresh mount's). Here a node is a 32-byte record in one array
// (positions by `PositionIndex`) and its name is in one shared byte buffer: about 50 bytes.

import UbiquityStore

struct KernelReferences {
    private var index = PositionIndex()
    private var refs: [Ref] = []
    private var names: [UInt8] = []
    /// Bytes of `names` no record points to any more.
    private var garbage = 0

    private struct Ref {
        var ino: InodeNumber
        var count: UInt64
        var parent: InodeNumber
        var offset: UInt32
        /// 0: no name known (names are never empty).
        var length: UInt16
    }

    /// How many nodes the kernel holds.
    var count: Int { refs.count }

    func holds(_ ino: InodeNumber) -> Bool { position(of: ino) != nil }

    /// The kernel's references to `ino` (nil: it holds none).
    func references(to ino: InodeNumber) -> UInt64? {
        position(of: ino).map { refs[$0].count }
    }

    /// The name the kernel last got `ino` by, if it holds it and was told one.
    func name(of ino: InodeNumber) -> (parent: InodeNumber, name: [UInt8])? {
        guard let i = position(of: ino), refs[i].length > 0 else { return nil }
        let r = refs[i]
        return (r.parent, Array(names[Int(r.offset)..<Int(r.offset) + Int(r.length)]))
    }

    /// One more reference to `ino`, given as `name` in `parent` when both are known.
    mutating func add(_ ino: InodeNumber, parent: InodeNumber?, name: [UInt8]?) {
        let i: Int
        if let found = position(of: ino) {
            i = found
            refs[i].count += 1
        } else {
            refs.append(Ref(ino: ino, count: 1, parent: 0, offset: 0, length: 0))
            i = refs.count - 1
            withIndex { index, keys in index.insert(ino, at: i, keys: keys) }
        }
        if let parent, let name { setName(i, parent, name) }
    }

    /// The kernel moved its entry for `ino` to `name` in `parent`: kept if a name was known.
    mutating func moved(_ ino: InodeNumber, parent: InodeNumber, name: [UInt8]) {
        guard let i = position(of: ino), refs[i].length > 0 else { return }
        setName(i, parent, name)
    }

    /// The kernel dropped `count` references to `ino`: returns how many it had (0: none), and
    /// forgets the node once none are left.
    mutating func drop(_ ino: InodeNumber, count: UInt64) -> UInt64 {
        guard let i = position(of: ino) else { return 0 }
        let had = refs[i].count
        if had > count {
            refs[i].count = had - count
            return had
        }
        garbage += Int(refs[i].length)
        _ = withIndex { index, keys in index.remove(ino, keys: keys) }
        let last = refs.count - 1
        if i < last {
            let moving = refs[last].ino
            withIndex { index, keys in index.move(moving, to: i, keys: keys) }
            refs[i] = refs[last]
        }
        refs.removeLast()
        if refs.isEmpty {
            self = KernelReferences()
        } else {
            compactIfWorthIt()
        }
        return had
    }

    // MARK: Storage

    private func position(of ino: InodeNumber) -> Int? {
        refs.withUnsafeBufferPointer { all in index.find(ino) { all[$0].ino } }
    }

    /// `body` with the index moved out (see `NodeTable.withIndex`).
    private mutating func withIndex<R>(_ body: (inout PositionIndex, (Int) -> InodeNumber) -> R) -> R {
        var moved = index
        index = PositionIndex()
        defer { index = moved }
        return refs.withUnsafeBufferPointer { all in body(&moved) { all[$0].ino } }
    }

    private mutating func setName(_ i: Int, _ parent: InodeNumber, _ name: [UInt8]) {
        precondition(!name.isEmpty && name.count <= Int(UInt16.max), "a name the kernel gave is empty or too long")
        let r = refs[i]
        refs[i].parent = parent
        if r.length > 0 && names[Int(r.offset)..<Int(r.offset) + Int(r.length)].elementsEqual(name) { return }
        garbage += Int(r.length)
        precondition(names.count + name.count <= Int(UInt32.max), "the kernel's names exceed 4 GiB")
        refs[i].offset = UInt32(names.count)
        refs[i].length = UInt16(name.count)
        names.append(contentsOf: name)
        compactIfWorthIt()
    }

    /// The names again without the bytes of the ones dropped or replaced, once those are half.
    private mutating func compactIfWorthIt() {
        guard garbage > 4096 && garbage > names.count / 2 else { return }
        var kept: [UInt8] = []
        kept.reserveCapacity(names.count - garbage)
        for i in refs.indices where refs[i].length > 0 {
            let start = Int(refs[i].offset)
            refs[i].offset = UInt32(kept.count)
            kept.append(contentsOf: names[start..<start + Int(refs[i].length)])
        }
        names = kept
        garbage = 0
    }
}
