// A compact binary encoding of a batch's mutations, for the change log. Every commit writes one,
// so it must be cheap (JSON cost more than the rest of a commit). Little endian; lengths as
// LEB128 varints; a leading format byte so a later layout can be told apart.

import Foundation

package enum BatchCoding {
    static let format: UInt8 = 1

    package static func encode(_ mutations: [Mutation]) -> [UInt8] {
        var w = Writer()
        w.byte(format)
        w.varint(UInt64(mutations.count))
        for m in mutations {
            switch m {
            case .putNode(let n):
                w.byte(1)
                w.u64(n.ino); w.string(n.container); w.byte(n.kind.rawValue)
                w.u32(n.mode); w.u32(n.uid); w.u32(n.gid); w.u32(n.nlink); w.u64(n.size)
                w.i64(n.atime); w.i64(n.mtime); w.i64(n.ctime); w.i64(n.btime); w.u64(n.rdev)
                w.bytes(n.target); w.optional(n.currentVersion)
            case .deleteNode(let ino): w.byte(2); w.u64(ino)
            case .putDirent(let d): w.byte(3); w.u64(d.parent); w.bytes(d.name); w.u64(d.child)
            case .deleteDirent(let parent, let name): w.byte(4); w.u64(parent); w.bytes(name)
            case .putXattr(let x): w.byte(5); w.u64(x.ino); w.bytes(x.name); w.bytes(x.value)
            case .deleteXattr(let ino, let name): w.byte(6); w.u64(ino); w.bytes(name)
            case .putVersion(let v):
                // 13: one moved in from another file (a replica's copy of a snapshot); 7 otherwise.
                w.byte(v.movedFrom == nil ? 7 : 13)
                w.i64(v.id); w.u64(v.ino); w.i64(v.created); w.u64(v.size)
                w.string(v.origin.rawValue); w.string(v.device)
                w.varint(UInt64(v.chunks.count))
                for c in v.chunks { w.u64(c.blob); w.u32(c.length); w.u64(c.checksum) }
                if let from = v.movedFrom { w.u64(from) }
            case .putContainer(let c):
                w.byte(8)
                w.string(c.identifier); w.string(c.bundleIdentifier); w.string(c.name)
                w.byte(c.isPublic ? 1 : 0); w.string(c.folderLevels); w.string(c.registeredVersion)
                w.string(c.manifestPath); w.u64(c.rootIno)
            case .setMeta(let key, let value): w.byte(9); w.string(key); w.string(value)
            case .deleteMeta(let key): w.byte(10); w.string(key)
            case .moveVersions(let from, let to): w.byte(11); w.u64(from); w.u64(to)
            case .deleteVersion(let id): w.byte(12); w.i64(id)
            }
        }
        return w.out
    }

    /// The mutations, or nil if the bytes are not a batch of this format.
    package static func decode(_ bytes: [UInt8]) -> [Mutation]? {
        var r = Reader(bytes: bytes)
        guard r.byte() == format, let count = r.varint(), count <= UInt64(bytes.count) else { return nil }
        var out: [Mutation] = []
        out.reserveCapacity(Int(count))
        for _ in 0..<count {
            guard let m = r.mutation() else { return nil }
            out.append(m)
        }
        return r.atEnd ? out : nil
    }

    private struct Writer {
        var out: [UInt8] = []
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
    }

    private struct Reader {
        let bytes: [UInt8]
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

        mutating func mutation() -> Mutation? {
            guard let tag = byte() else { return nil }
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
                var chunks: [ChunkRef] = []
                chunks.reserveCapacity(Int(count))
                for _ in 0..<count {
                    guard let blob = u64(), let length = u32(), let checksum = u64() else { return nil }
                    chunks.append(ChunkRef(blob: blob, length: length, checksum: checksum))
                }
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
