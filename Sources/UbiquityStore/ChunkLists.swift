// Chunk lists shared between a big file's versions (schema 4 of both stores): a version row
// names a list in `chunk_lists` and holds only the entries it changed from it (`ChunkDelta`),
// and a read of the change log fetches each list it names once (`ChunkListReader`).

import Foundation

/// A version's chunk list as its differences from a shared list (`chunk_lists`): u32 the list's
/// length, then per changed entry its u32 index (increasing) and the entry as `ChunkPacking`
/// packs it, little endian. Every index at or past the shared list's length is among them.
package enum ChunkDelta {
    package static let entrySize = 4 + ChunkPacking.entrySize
    /// Chunk lists at least this long are shared between a file's versions; shorter ones (files
    /// under 64 MiB) are stored whole in the version's row.
    package static let sharedListMinimum = 64

    /// How a version's list of `sharedListMinimum` entries or more is stored against `base`
    /// (the list its file's newest version names): that list and the changes from it, or nil
    /// when there is none or the changes are more than a quarter of it, and a new list (of the
    /// version's own id) is due. A version is then read with one list at most.
    package static func shared(_ chunks: [ChunkRef], over base: (id: Int64, chunks: [ChunkRef])?) -> (list: Int64, changes: [UInt8])? {
        guard let base else { return nil }
        let changes = differences(chunks, from: base.chunks)
        guard changes.count * entrySize <= chunks.count * ChunkPacking.entrySize / 4 else { return nil }
        return (base.id, pack(count: chunks.count, changes))
    }

    /// The entries of `chunks` that differ from `base`, or lie past its end.
    static func differences(_ chunks: [ChunkRef], from base: [ChunkRef]) -> [(index: Int, chunk: ChunkRef)] {
        var out: [(index: Int, chunk: ChunkRef)] = []
        for (i, c) in chunks.enumerated() where i >= base.count || base[i] != c { out.append((i, c)) }
        return out
    }

    package static func pack(count: Int, _ changes: [(index: Int, chunk: ChunkRef)]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 4 + changes.count * entrySize)
        out.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(count).littleEndian, toByteOffset: 0, as: UInt32.self)
            var i = 4
            for (index, c) in changes {
                raw.storeBytes(of: UInt32(index).littleEndian, toByteOffset: i, as: UInt32.self)
                raw.storeBytes(of: c.blob.littleEndian, toByteOffset: i + 4, as: UInt64.self)
                raw.storeBytes(of: c.length.littleEndian, toByteOffset: i + 12, as: UInt32.self)
                raw.storeBytes(of: c.checksum.littleEndian, toByteOffset: i + 16, as: UInt64.self)
                i += entrySize
            }
        }
        return out
    }

    /// The changes alone (nil: malformed, or indexes not increasing).
    package static func changes(_ bytes: UnsafeRawBufferPointer) -> [(index: Int, chunk: ChunkRef)]? {
        guard bytes.count >= 4, (bytes.count - 4) % entrySize == 0 else { return nil }
        var out: [(index: Int, chunk: ChunkRef)] = []
        out.reserveCapacity((bytes.count - 4) / entrySize)
        var i = 4
        while i < bytes.count {
            let index = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt32.self)))
            if let last = out.last, last.index >= index { return nil }
            let blob = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i + 4, as: UInt64.self))
            let length = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: i + 12, as: UInt32.self))
            let sum = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i + 16, as: UInt64.self))
            out.append((index, ChunkRef(blob: blob, length: length, checksum: sum)))
            i += entrySize
        }
        return out
    }

    /// A version row's whole list: its `chunks` column as it is (`list` nil: the row names no
    /// shared list), or its changes resolved over the shared list it names.
    package static func chunks(_ stored: UnsafeRawBufferPointer, list: UnsafeRawBufferPointer?) -> [ChunkRef]? {
        guard let list else { return ChunkPacking.unpack(stored) }
        return resolve(stored, over: list)
    }

    /// The whole list: `list` (packed) cut or extended to the stored length, the changes applied.
    /// Nil when malformed: a change past the length, or an entry past the list's end missing.
    package static func resolve(_ bytes: UnsafeRawBufferPointer, over list: UnsafeRawBufferPointer) -> [ChunkRef]? {
        guard bytes.count >= 4, var chunks = ChunkPacking.unpack(list), let changes = changes(bytes) else { return nil }
        let count = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)))
        let shared = min(count, chunks.count)
        guard changes.filter({ $0.index >= shared }).count == count - shared, changes.last.map({ $0.index < count }) ?? true else {
            return nil
        }
        if chunks.count > count { chunks.removeLast(chunks.count - count) }
        chunks.reserveCapacity(count)
        for (index, c) in changes {
            if index < chunks.count { chunks[index] = c } else { chunks.append(c) }
        }
        return chunks
    }
}

/// The shared lists a read of the change log names, each fetched once, in the read's
/// transaction (`decode(_:lists:)` takes `list`). A list that is gone is nil; a failed fetch is
/// nil too, and `error` says why (the read must fail, not leave the version out).
package final class ChunkListReader {
    private let fetch: (Int64) throws(StoreError) -> [UInt8]?
    private var known: [Int64: [UInt8]?] = [:]
    package private(set) var error: StoreError?

    package init(_ fetch: @escaping (Int64) throws(StoreError) -> [UInt8]?) { self.fetch = fetch }

    package func list(_ id: Int64) -> [UInt8]? {
        if let found = known[id] { return found }
        do {
            let found = try fetch(id)
            known[id] = found
            return found
        } catch {
            self.error = self.error ?? error
            return nil
        }
    }
}
