// A compact binary encoding of a batch's mutations, for the change log. Every commit writes one,
// so it must be cheap (JSON cost more than the rest of a commit). Little endian; lengths as
// LEB128 varints; a leading format byte so a later layout can be told apart. In a store's change
// log a big file's version names its shared chunk list and carries only its changes from it
// (tags 14, 15); a journal's records carry whole lists.

import Foundation

package enum BatchCoding {
    static let format: UInt8 = 1

    package static func encode(_ mutations: [Mutation]) -> [UInt8] {
        var w = Writer()
        w.byte(format)
        w.mutations(mutations)
        return w.out
    }

    /// How a store stored a version's list (`storedChunks`): the shared list it names and its
    /// changes from it (`ChunkDelta`).
    package typealias SharedChunks = [VersionID: (list: Int64, changes: [UInt8])]

    /// `encode`, with the versions in `shared` written as the list they name and their changes
    /// (tags 14 and 15), not their whole lists: a store's change log, whose readers resolve
    /// them through its `chunk_lists` (`decode(_:lists:)`).
    package static func encode(_ mutations: [Mutation], shared: SharedChunks) -> [UInt8] {
        var w = Writer()
        w.shared = shared
        w.byte(format)
        w.mutations(mutations)
        return w.out
    }

    /// A grouped commit's record in its writer's journal: its position, writer, expectations and
    /// mutations (a replay checks the expectations as the commit did). `encoded`: the mutations
    /// as `encode` made them for the change log, reused.
    package static func encodeRecord(seq: ChangeSeq, batch: Batch, encoded: [UInt8]? = nil) -> [UInt8] {
        var w = Writer()
        w.byte(format)
        w.i64(seq)
        w.string(batch.writer)
        w.varint(UInt64(batch.expectations.count))
        for e in batch.expectations {
            switch e {
            case .nameFree(let parent, let name): w.byte(1); w.u64(parent); w.bytes(name)
            case .nameIs(let parent, let name, let child): w.byte(2); w.u64(parent); w.bytes(name); w.u64(child)
            case .nodeAt(let ino, let change): w.byte(3); w.u64(ino); w.i64(change)
            case .containerRoot(let identifier, let root):
                w.byte(4); w.string(identifier); w.optional(root.map { Int64(bitPattern: $0) })
            case .metaIs(let key, let value):
                w.byte(5); w.string(key); w.byte(value == nil ? 0 : 1); w.string(value ?? "")
            }
        }
        if let encoded, encoded.first == format {
            w.out.reserveCapacity(w.out.count + encoded.count)
            w.out.append(contentsOf: encoded[1...])
        } else {
            w.mutations(batch.mutations)
        }
        return w.out
    }

    /// A record `encodeRecord` made, or nil if the bytes are not one.
    package static func decodeRecord(_ bytes: [UInt8]) -> (seq: ChangeSeq, batch: Batch)? {
        var r = Reader(bytes: bytes)
        guard r.byte() == format, let seq = r.i64(), let writer = r.string(), let count = r.varint(),
              count <= UInt64(bytes.count) else { return nil }
        var expectations: [Expectation] = []
        for _ in 0..<count {
            guard let e = r.expectation() else { return nil }
            expectations.append(e)
        }
        guard let mutationCount = r.varint(), mutationCount <= UInt64(bytes.count) else { return nil }
        var mutations: [Mutation] = []
        mutations.reserveCapacity(Int(mutationCount))
        for _ in 0..<mutationCount {
            // A journal's records carry whole lists (a replay may make the lists they would name).
            guard case .mutation(let m) = r.mutation() else { return nil }
            mutations.append(m)
        }
        guard r.atEnd else { return nil }
        return (seq, Batch(mutations, expecting: expectations, writer: writer))
    }

    /// The mutations, or nil if the bytes are not a batch of this format. `lists`: a shared
    /// list's packed entries by id (nil: gone). A version naming a list that is gone is left
    /// out: a list goes only with the last version naming it, so that version was deleted by a
    /// later batch; and a version whose changes do not fit its list is malformed (nil).
    package static func decode(_ bytes: [UInt8], lists: (Int64) -> [UInt8]? = { _ in nil }) -> [Mutation]? {
        withoutActuallyEscaping(lists) { lists in
            var r = Reader(bytes: bytes, lists: lists)
            guard r.byte() == format, let count = r.varint(), count <= UInt64(bytes.count) else { return nil }
            var out: [Mutation] = []
            out.reserveCapacity(Int(count))
            for _ in 0..<count {
                switch r.mutation() {
                case .mutation(let m): out.append(m)
                case .skipped: continue
                case nil: return nil
                }
            }
            return r.atEnd ? out : nil
        }
    }

    private struct Writer {
        var out: [UInt8] = []
        var shared: SharedChunks = [:]
        mutating func byte(_ b: UInt8) { out.append(b) }
        mutating func varint(_ v: UInt64) {
            var v = v
            while v >= 0x80 { out.append(UInt8(v & 0x7f) | 0x80); v >>= 7 }
            out.append(UInt8(v))
        }
        mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { out.append(contentsOf: $0) } }
        mutating func i64(_ v: Int64) { u64(UInt64(bitPattern: v)) }
        mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { out.append(contentsOf: $0) } }
        mutating func bytes(_ b: [UInt8]) { varint(UInt64(b.count)); out.append(contentsOf: b) }
        mutating func string(_ s: String) { bytes(Array(s.utf8)) }
        mutating func optional(_ v: Int64?) {
            if let v { byte(1); i64(v) } else { byte(0) }
        }

        mutating func mutations(_ mutations: [Mutation]) {
            // Sized once: a version's chunk list would otherwise grow the buffer several times.
            out.reserveCapacity(out.count + mutations.reduce(16) { total, m in
                if case .putVersion(let v) = m, shared[v.id] == nil { return total + 96 + v.chunks.count * ChunkPacking.entrySize }
                return total + 96
            })
            varint(UInt64(mutations.count))
            for m in mutations {
                switch m {
                case .putNode(let n):
                    byte(1)
                    u64(n.ino); string(n.container); byte(n.kind.rawValue)
                    u32(n.mode); u32(n.uid); u32(n.gid); u32(n.nlink); u64(n.size)
                    i64(n.atime); i64(n.mtime); i64(n.ctime); i64(n.btime); u64(n.rdev)
                    bytes(n.target); optional(n.currentVersion)
                case .deleteNode(let ino): byte(2); u64(ino)
                case .putDirent(let d): byte(3); u64(d.parent); bytes(d.name); u64(d.child)
                case .deleteDirent(let parent, let name): byte(4); u64(parent); bytes(name)
                case .putXattr(let x): byte(5); u64(x.ino); bytes(x.name); bytes(x.value)
                case .deleteXattr(let ino, let name): byte(6); u64(ino); bytes(name)
                case .putVersion(let v):
                    // 13: one moved in from another file (a replica's copy of a snapshot); 7 otherwise.
                    // 14 and 15 the same with a shared list and the changes from it.
                    let list = shared[v.id]
                    switch (list != nil, v.movedFrom != nil) {
                    case (false, false): byte(7)
                    case (false, true): byte(13)
                    case (true, false): byte(14)
                    case (true, true): byte(15)
                    }
                    i64(v.id); u64(v.ino); i64(v.created); u64(v.size)
                    string(v.origin.rawValue); string(v.device)
                    if let list {
                        i64(list.list)
                        bytes(list.changes)
                    } else {
                        varint(UInt64(v.chunks.count))
                        ChunkPacking.append(v.chunks, to: &out)
                    }
                    if let from = v.movedFrom { u64(from) }
                case .putContainer(let c):
                    byte(8)
                    string(c.identifier); string(c.bundleIdentifier); string(c.name)
                    byte(c.isPublic ? 1 : 0); string(c.folderLevels); string(c.registeredVersion)
                    string(c.manifestPath); u64(c.rootIno)
                case .setMeta(let key, let value): byte(9); string(key); string(value)
                case .deleteMeta(let key): byte(10); string(key)
                case .moveVersions(let from, let to): byte(11); u64(from); u64(to)
                case .deleteVersion(let id): byte(12); i64(id)
                }
            }
        }
    }

    private enum Decoded {
        case mutation(Mutation)
        /// A version whose shared list is gone (see `decode`).
        case skipped
    }

    private struct Reader {
        let bytes: [UInt8]
        var lists: (Int64) -> [UInt8]? = { _ in nil }
        var at = 0
        var atEnd: Bool { at == bytes.count }
        mutating func byte() -> UInt8? {
            guard at < bytes.count else { return nil }
            defer { at += 1 }
            return bytes[at]
        }
        mutating func varint() -> UInt64? {
            var v: UInt64 = 0
            var shift: UInt64 = 0
            while let b = byte() {
                v |= UInt64(b & 0x7f) << shift
                if b < 0x80 { return v }
                shift += 7
                if shift > 63 { return nil }
            }
            return nil
        }
        mutating func u64() -> UInt64? {
            guard bytes.count - at >= 8 else { return nil }
            var v: UInt64 = 0
            for i in 0..<8 { v |= UInt64(bytes[at + i]) << (8 * UInt64(i)) }
            at += 8
            return v
        }
        mutating func i64() -> Int64? { u64().map { Int64(bitPattern: $0) } }
        mutating func u32() -> UInt32? {
            guard bytes.count - at >= 4 else { return nil }
            var v: UInt32 = 0
            for i in 0..<4 { v |= UInt32(bytes[at + i]) << (8 * UInt32(i)) }
            at += 4
            return v
        }
        mutating func data() -> [UInt8]? {
            guard let n = varint(), n <= UInt64(bytes.count - at) else { return nil }
            defer { at += Int(n) }
            return Array(bytes[at..<(at + Int(n))])
        }
        mutating func string() -> String? { data().map { String(decoding: $0, as: UTF8.self) } }
        mutating func optional() -> Int64?? {
            guard let flag = byte() else { return nil }
            if flag == 0 { return .some(nil) }
            guard flag == 1, let v = i64() else { return nil }
            return .some(v)
        }

        mutating func expectation() -> Expectation? {
            switch byte() {
            case 1:
                guard let parent = u64(), let name = data() else { return nil }
                return .nameFree(parent: parent, name: name)
            case 2:
                guard let parent = u64(), let name = data(), let child = u64() else { return nil }
                return .nameIs(parent: parent, name: name, child: child)
            case 3:
                guard let ino = u64(), let change = i64() else { return nil }
                return .nodeAt(ino: ino, change: change)
            case 4:
                guard let identifier = string(), let root = optional() else { return nil }
                return .containerRoot(identifier: identifier, root: root.map { UInt64(bitPattern: $0) })
            case 5:
                guard let key = string(), let present = byte(), present <= 1, let value = string() else { return nil }
                return .metaIs(key: key, value: present == 1 ? value : nil)
            default: return nil
            }
        }

        mutating func mutation() -> Decoded? {
            guard let tag = byte() else { return nil }
            if tag == 14 || tag == 15 { return sharedVersion(movedIn: tag == 15) }
            return plainMutation(tag).map { .mutation($0) }
        }

        mutating func sharedVersion(movedIn: Bool) -> Decoded? {
            guard let id = i64(), let ino = u64(), let created = i64(), let size = u64(),
                  let rawOrigin = string(), let origin = VersionOrigin(rawValue: rawOrigin), let device = string(),
                  let list = i64(), let changes = data() else { return nil }
            var movedFrom: InodeNumber?
            if movedIn {
                guard let from = u64() else { return nil }
                movedFrom = from
            }
            guard let packed = lists(list) else { return .skipped }
            guard let chunks = changes.withUnsafeBytes({ c in packed.withUnsafeBytes { ChunkDelta.resolve(c, over: $0) } }) else {
                return nil
            }
            return .mutation(.putVersion(VersionRecord(id: id, ino: ino, created: created, size: size, chunks: chunks,
                                                       origin: origin, device: device, movedFrom: movedFrom)))
        }

        mutating func plainMutation(_ tag: UInt8) -> Mutation? {
            switch tag {
            case 1:
                guard let ino = u64(), let container = string(), let rawKind = byte(), let kind = NodeKind(rawValue: rawKind),
                      let mode = u32(), let uid = u32(), let gid = u32(), let nlink = u32(), let size = u64(),
                      let atime = i64(), let mtime = i64(), let ctime = i64(), let btime = i64(), let rdev = u64(),
                      let target = data(), let current = optional() else { return nil }
                return .putNode(NodeRecord(ino: ino, container: container, kind: kind, mode: mode, uid: uid, gid: gid,
                                           nlink: nlink, size: size, atime: atime, mtime: mtime, ctime: ctime,
                                           btime: btime, rdev: rdev, target: target, currentVersion: current))
            case 2: return u64().map { .deleteNode($0) }
            case 3:
                guard let parent = u64(), let name = data(), let child = u64() else { return nil }
                return .putDirent(DirentRecord(parent: parent, name: name, child: child))
            case 4:
                guard let parent = u64(), let name = data() else { return nil }
                return .deleteDirent(parent: parent, name: name)
            case 5:
                guard let ino = u64(), let name = data(), let value = data() else { return nil }
                return .putXattr(XattrRecord(ino: ino, name: name, value: value))
            case 6:
                guard let ino = u64(), let name = data() else { return nil }
                return .deleteXattr(ino: ino, name: name)
            case 7, 13:
                guard let id = i64(), let ino = u64(), let created = i64(), let size = u64(),
                      let rawOrigin = string(), let origin = VersionOrigin(rawValue: rawOrigin), let device = string(),
                      let count = varint(), count <= UInt64(bytes.count - at) / 20 else { return nil }
                // The same layout as a version row's packed list.
                let end = at + Int(count) * ChunkPacking.entrySize
                guard let chunks = bytes[at..<end].withUnsafeBytes({ ChunkPacking.unpack($0) }) else { return nil }
                at = end
                var movedFrom: InodeNumber?
                if tag == 13 {
                    guard let from = u64() else { return nil }
                    movedFrom = from
                }
                return .putVersion(VersionRecord(id: id, ino: ino, created: created, size: size, chunks: chunks,
                                                 origin: origin, device: device, movedFrom: movedFrom))
            case 8:
                guard let identifier = string(), let bundle = string(), let name = string(), let isPublic = byte(),
                      let levels = string(), let version = string(), let manifest = string(), let root = u64() else { return nil }
                return .putContainer(ContainerRecord(identifier: identifier, bundleIdentifier: bundle, name: name,
                                                     isPublic: isPublic != 0, folderLevels: levels, registeredVersion: version,
                                                     manifestPath: manifest, rootIno: root))
            case 9:
                guard let key = string(), let value = string() else { return nil }
                return .setMeta(key: key, value: value)
            case 10: return string().map { .deleteMeta(key: $0) }
            case 11:
                guard let from = u64(), let to = u64() else { return nil }
                return .moveVersions(from: from, to: to)
            case 12: return i64().map { .deleteVersion($0) }
            default: return nil
            }
        }
    }
}
