// A synced working copy's page log, `<ino>.<copy id>.log` beside its chunk files: after the first
// fsync of a copy (a full sync: the chunk files, their folder, the map's synced halves), each
// fsync that wrote a few pages writes them here in one batch and syncs this one file, where a
// full sync takes at least two `fdatasync`s (the chunk file, the map) and a folder's `fsync` for
// a new chunk file. The first such fsync makes the file (and syncs its folder). Reads, writes and publishing never look here: the chunk files hold every
// byte; the log only says, after a power cut, what an fsync made durable.
//
// A batch, little endian:
//    0  magic "UBQWLOG1"
//    8  u64 epoch: the map's (header offset 80) when the batch was written
//   16  u64 the copy's logical size at the fsync
//   24  u32 n, the pages in the batch; u32 0
//   32  u64 checksum (`contentChecksum` of the whole batch with these 8 bytes zero)
//   40  n entries of 16 bytes: u64 chunk index, u32 page in the chunk, u32 bytes of it within
//       the size
//       then n pages of `pageSize` bytes (zeros past each entry's length)
//
// Recovery on a new boot reads batches from the start while each is whole and of the map's
// epoch, and writes their pages into the chunk files, in order (a later batch's page is newer).
// A full sync gives the map a new epoch once the chunk files and synced halves hold everything
// the log held, and the next batches are written from the start again: batches of another epoch
// are never applied, since chunk files may hold newer synced bytes than they do. The file is
// zeros ahead of its batches (written `growth` at a time), so that a batch overwrites blocks it
// has; reading stops at the first bytes that are not a whole batch of the epoch.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

enum PageLog {
    static let magic: [UInt8] = Array("UBQWLOG1".utf8)
    static let headerSize = 40
    static let entrySize = 16
    static let checksumAt = 32
    /// Pages one batch holds at most (a larger fsync is a full sync).
    static let batchPages = 256
    /// The log's length at most: past it, the next fsync is a full sync, which empties it.
    static let limit = 16 << 20
    /// The log is zeros ahead of its batches, written this much at a time.
    static let growth = 256 << 10

    static func batchBytes(_ pages: Int) -> Int { headerSize + pages * (entrySize + pageSize) }

    struct Page: Equatable {
        var chunk: Int
        var page: Int
        var bytes: [UInt8]
    }

    struct Batch: Equatable {
        var size: UInt64
        var pages: [Page]
    }

    /// One batch's bytes. Each page's `bytes` is at most `pageSize` long.
    static func encode(epoch: UInt64, size: UInt64, pages: [Page]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: batchBytes(pages.count))
        out.withUnsafeMutableBytes { raw in
            raw.copyBytes(from: magic)
            raw.storeBytes(of: epoch.littleEndian, toByteOffset: 8, as: UInt64.self)
            raw.storeBytes(of: size.littleEndian, toByteOffset: 16, as: UInt64.self)
            raw.storeBytes(of: UInt32(pages.count).littleEndian, toByteOffset: 24, as: UInt32.self)
            for (i, p) in pages.enumerated() {
                let entry = headerSize + i * entrySize
                raw.storeBytes(of: UInt64(p.chunk).littleEndian, toByteOffset: entry, as: UInt64.self)
                raw.storeBytes(of: UInt32(p.page).littleEndian, toByteOffset: entry + 8, as: UInt32.self)
                raw.storeBytes(of: UInt32(p.bytes.count).littleEndian, toByteOffset: entry + 12, as: UInt32.self)
                let at = headerSize + pages.count * entrySize + i * pageSize
                UnsafeMutableRawBufferPointer(rebasing: raw[at..<(at + p.bytes.count)]).copyBytes(from: p.bytes)
            }
            let sum = contentChecksum(UnsafeRawBufferPointer(raw))
            raw.storeBytes(of: sum.littleEndian, toByteOffset: checksumAt, as: UInt64.self)
        }
        return out
    }

    /// The whole batches of `epoch` from the start of `bytes`, up to the first that is not one.
    /// The log may be torn or garbage: every read stays inside `bytes`, since a header is read
    /// only once it fits, and a batch's entries and pages only once its page count (at most
    /// `batchPages`) says the whole batch fits; entries out of range end the reading.
    static func decode(_ bytes: [UInt8], epoch: UInt64) -> [Batch] {
        var batches: [Batch] = []
        var at = 0
        bytes.withUnsafeBytes { raw in
            while raw.count - at >= headerSize {
                let head = UnsafeRawBufferPointer(rebasing: raw[at..<(at + headerSize)])
                guard head.prefix(8).elementsEqual(magic),
                      UInt64(littleEndian: head.loadUnaligned(fromByteOffset: 8, as: UInt64.self)) == epoch else { return }
                let size = UInt64(littleEndian: head.loadUnaligned(fromByteOffset: 16, as: UInt64.self))
                let n = Int(UInt32(littleEndian: head.loadUnaligned(fromByteOffset: 24, as: UInt32.self)))
                guard n <= batchPages, raw.count - at >= batchBytes(n) else { return }
                var copy = [UInt8](UnsafeRawBufferPointer(rebasing: raw[at..<(at + batchBytes(n))]))
                let stored = copy.withUnsafeMutableBytes { c -> UInt64 in
                    let s = UInt64(littleEndian: c.loadUnaligned(fromByteOffset: checksumAt, as: UInt64.self))
                    c.storeBytes(of: 0, toByteOffset: checksumAt, as: UInt64.self)
                    return s
                }
                guard copy.withUnsafeBytes({ contentChecksum($0) }) == stored else { return }
                var pages: [Page] = []
                for i in 0..<n {
                    let entry = at + headerSize + i * entrySize
                    let chunk = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: entry, as: UInt64.self))
                    let page = Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: entry + 8, as: UInt32.self)))
                    let length = Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: entry + 12, as: UInt32.self)))
                    guard chunk < UInt64(Int.max / chunkSize), page < PageSet.count, length <= pageSize else { return }
                    let data = at + headerSize + n * entrySize + i * pageSize
                    pages.append(Page(chunk: Int(chunk), page: page, bytes: Array(raw[data..<(data + length)])))
                }
                batches.append(Batch(size: size, pages: pages))
                at += batchBytes(n)
            }
        }
        return batches
    }
}
