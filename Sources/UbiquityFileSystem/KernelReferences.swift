// The nodes the kernel holds: how many references it has to each (entry replies less forgets)
// and the name it last got each by (a hint for replaying another writer's change to it).
//
// The kernel keeps every inode it was given until memory runs short, so after a million creates
// it holds a million: a `[InodeNumber: UInt64]` of counts beside a `[InodeNumber: KernelName]`
// of names, each name an array of its own on the heap, took about 130 bytes a node (the RSS a
// growing namespace had beyond a fresh mount's). Here a node is a 32-byte record of a
// `DenseRecords` and its name is in one shared byte buffer: about 50 bytes.

import UbiquityStore

struct KernelReferences {
    private var refs = DenseRecords<Ref>()
    private var names: [UInt8] = []
    /// Bytes of `names` no record points to any more.
    private var garbage = 0

    private struct Ref: InodeKeyed {
        var ino: InodeNumber
        var count: UInt64
        var parent: InodeNumber
        var offset: UInt32
        /// 0: no name known (names are never empty).
        var length: UInt16
    }

    /// How many nodes the kernel holds.
    var count: Int { refs.count }

    func holds(_ ino: InodeNumber) -> Bool { refs.position(of: ino) != nil }

    /// The kernel's references to `ino` (nil: it holds none).
    func references(to ino: InodeNumber) -> UInt64? {
        refs.position(of: ino).map { refs[$0].count }
    }

    /// The name the kernel last got `ino` by, if it holds it and was told one.
    func name(of ino: InodeNumber) -> (parent: InodeNumber, name: [UInt8])? {
        guard let i = refs.position(of: ino), refs[i].length > 0 else { return nil }
        let r = refs[i]
        return (r.parent, Array(names[Int(r.offset)..<Int(r.offset) + Int(r.length)]))
    }

    /// One more reference to `ino`, given as `name` in `parent` when both are known.
    mutating func add(_ ino: InodeNumber, parent: InodeNumber?, name: [UInt8]?) {
        let i: Int
        if let found = refs.position(of: ino) {
            i = found
            refs[i].count += 1
        } else {
            i = refs.append(Ref(ino: ino, count: 1, parent: 0, offset: 0, length: 0))
        }
        if let parent, let name { setName(i, parent, name) }
    }

    /// The kernel moved its entry for `ino` to `name` in `parent`: kept if a name was known.
    mutating func moved(_ ino: InodeNumber, parent: InodeNumber, name: [UInt8]) {
        guard let i = refs.position(of: ino), refs[i].length > 0 else { return }
        setName(i, parent, name)
    }

    /// The kernel dropped `count` references to `ino`: returns how many it had (0: none), and
    /// forgets the node once none are left.
    mutating func drop(_ ino: InodeNumber, count: UInt64) -> UInt64 {
        guard let i = refs.position(of: ino) else { return 0 }
        let had = refs[i].count
        if had > count {
            refs[i].count = had - count
            return had
        }
        garbage += Int(refs[i].length)
        refs.remove(ino)
        if refs.count == 0 {
            self = KernelReferences()
        } else {
            compactIfWorthIt()
        }
        return had
    }

    // MARK: Names

    private mutating func setName(_ i: Int, _ parent: InodeNumber, _ name: [UInt8]) {
        let r = refs[i]
        refs[i].parent = parent
        if r.length > 0 && names[Int(r.offset)..<Int(r.offset) + Int(r.length)].elementsEqual(name) { return }
        garbage += Int(r.length)
        // The kernel gives names of 1 to 1,024 bytes; a damaged store's, passed on in a listing,
        // may be anything. One a record cannot say is no hint (a replay does without).
        guard !name.isEmpty && name.count <= Int(UInt16.max) else {
            refs[i].length = 0
            compactIfWorthIt()
            return
        }
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
        for i in 0..<refs.count where refs[i].length > 0 {
            let start = Int(refs[i].offset)
            refs[i].offset = UInt32(kept.count)
            kept.append(contentsOf: names[start..<start + Int(refs[i].length)])
        }
        names = kept
        garbage = 0
    }
}
