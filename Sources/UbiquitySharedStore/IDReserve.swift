// Ids reserved ahead from the store's counters (inodes, versions, chunks), so that files can be
// made while the servers are out of reach, including by a daemon that starts then.
//
// What is left of the reserve is kept in a file of the local folder, written before any id it
// covers is handed out: an id is never handed out twice, even across a crash or a power cut.
// The file is ahead of memory by up to `step` ids (those are skipped after a crash, not reused).

import Foundation
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

final class IDReserve: @unchecked Sendable {
    private let mutex = StoreMutex()
    // Guarded by mutex:
    private var ranges: [Range<Int64>] = []
    /// Ids of `ranges[0]` below this may be handed out: the file no longer holds them.
    private var safeUntil: Int64 = .min
    private let reserve: (Int) throws(StoreError) -> ClosedRange<Int64>
    /// The file that keeps the reserve (nil: memory only, for a daemon that does not own the
    /// local folder's queue, or a command).
    private let path: String?
    /// How many are reserved at a time, and how few may be left before more are.
    let batch: Int, low: Int
    static let step: Int64 = 256

    init(path: String? = nil, batch: Int = 4096, low: Int = 1024,
         reserve: @escaping (Int) throws(StoreError) -> ClosedRange<Int64>) throws(StoreError) {
        self.path = path
        self.batch = batch; self.low = low; self.reserve = reserve
        guard let path, let data = FileManager.default.contents(atPath: path) else { return }
        do {
            let pairs = try JSONDecoder().decode([[Int64]].self, from: data)
            ranges = try pairs.map { pair in
                guard pair.count == 2, pair[0] <= pair[1] else { throw StoreError(.corrupt, "bad range") }
                return pair[0]..<pair[1]
            }
        } catch {
            throw StoreError(.corrupt, "\(path) cannot be read (ids reserved ahead): \(error)")
        }
    }

    /// Makes sure some are reserved (now, while the servers answer, unless the file kept some).
    func prime() throws(StoreError) {
        try mutex.withLock { () throws(StoreError) in
            if ranges.isEmpty { try topUp(batch) }
        }
    }

    /// Up to `count` consecutive ids (fewer when the reserve has fewer in one range). `online`:
    /// whether to top the reserve up from the servers first when it runs low.
    func take(_ count: Int, online: Bool) throws(StoreError) -> ClosedRange<Int64> {
        try mutex.withLock { () throws(StoreError) -> ClosedRange<Int64> in
            let left = ranges.reduce(0) { $0 + $1.count }
            if online && left < max(low, count) {
                do throws(StoreError) { try topUp(max(batch, count)) } catch {
                    if left == 0 || error.kind != .unavailable { throw error }
                }
            }
            guard let first = ranges.first else {
                throw StoreError(.unavailable, "the servers are out of reach and the ids reserved ahead are used up")
            }
            let n = Int64(min(count, first.count))
            let taken = first.lowerBound...(first.lowerBound + n - 1)
            ranges[0] = (first.lowerBound + n)..<first.upperBound
            if ranges[0].isEmpty { ranges.removeFirst() }
            if path != nil && taken.upperBound >= safeUntil {
                do throws(StoreError) { try save() } catch {
                    // Not handed out: put back, so memory and file agree.
                    if ranges.first?.lowerBound == taken.upperBound + 1 {
                        ranges[0] = taken.lowerBound..<ranges[0].upperBound
                    } else {
                        ranges.insert(taken.lowerBound..<(taken.upperBound + 1), at: 0)
                    }
                    throw error
                }
            }
            return taken
        }
    }

    /// One chunk id. Out of reach (`online` false) the ids left are used first: asking would wait
    /// out the timeout.
    func takeBlobID(online: Bool) throws(StoreError) -> BlobID {
        BlobID(bitPattern: try take(1, online: online).lowerBound)
    }

    /// Caller holds mutex.
    private func topUp(_ count: Int) throws(StoreError) {
        let r = try reserve(count)
        ranges.append(r.lowerBound..<(r.upperBound + 1))
        if path != nil { try save() }
    }

    /// Writes what is left, less the next `step` ids of the first range (those memory may hand
    /// out without writing again). Caller holds mutex.
    private func save() throws(StoreError) {
        guard let path else { return }
        var kept = ranges
        var until = Int64.min
        if let first = kept.first {
            until = min(first.lowerBound + Self.step, first.upperBound)
            kept[0] = until..<first.upperBound
        }
        try writeJSONDurably(kept.filter { !$0.isEmpty }.map { [$0.lowerBound, $0.upperBound] }, to: path)
        // Only once the file says so: a failed write leaves memory to write again next time.
        safeUntil = until
    }
}

/// Writes `value` as JSON to `path`, as `writeDurably` does.
func writeJSONDurably<T: Encodable>(_ value: T, to path: String) throws(StoreError) {
    let data: Data
    do { data = try JSONEncoder().encode(value) } catch { throw StoreError(errno: EIO, "cannot encode \(path): \(error)") }
    try writeDurably(data, to: path)
}

/// Writes `data` to `path` whole or not at all (a temporary file renamed over it), on disk with
/// its folder's entry when this returns.
func writeDurably(_ data: Data, to path: String) throws(StoreError) {
    let temp = path + ".tmp"
    let fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
    if fd < 0 { throw StoreError(errno: errno, "cannot write \(temp)") }
    var failure: Int32 = 0
    data.withUnsafeBytes { (b: UnsafeRawBufferPointer) in
        var done = 0
        while done < b.count {
            let n = write(fd, b.baseAddress! + done, b.count - done)
            if n < 0 { if errno == EINTR { continue }; failure = errno; return }
            done += n
        }
        if fsync(fd) != 0 { failure = errno }
    }
    close(fd)
    if failure != 0 || rename(temp, path) != 0 {
        let code = failure != 0 ? failure : errno
        _ = unlink(temp)
        throw StoreError(errno: code, "cannot write \(path)")
    }
    try fsyncDirectory((path as NSString).deletingLastPathComponent)
}
