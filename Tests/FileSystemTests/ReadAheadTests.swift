// Which blob files a read has read ahead: the next chunks of a file read in order with large
// requests (the kernel's read-ahead), each named once; none for random or small reads.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class ReadAheadTests: XCTestCase {
    private let kib = 1024
    private let mib = UInt64(chunkSize)

    /// A published file of 40 chunks whose blob ids are 101…140, chunk 12 a hole.
    private func document() -> Document {
        let chunks = (0..<40).map { i in
            i == 12 ? ChunkRef(blob: 0, length: UInt32(chunkSize), checksum: 0)
                    : ChunkRef(blob: BlobID(101 + i), length: UInt32(chunkSize), checksum: 0)
        }
        let node = NodeRecord(ino: 9, container: Sample.testDrive.identifier, kind: .regular, mode: 0o644, uid: 0, gid: 0,
                              nlink: 1, size: 40 * mib, atime: 0, mtime: 0, ctime: 0, btime: 0, currentVersion: 1)
        return Document(node: node, chunks: chunks, store: makeMemoryStore())
    }

    private func blobs(_ chunks: ClosedRange<Int>, without hole: Int? = nil) -> [BlobID] {
        chunks.filter { $0 != hole }.map { BlobID(101 + $0) }
    }

    func testASequentialReadNamesTheNextChunksOnce() {
        let doc = document()
        let n = Document.readAheadChunks
        // The first read names the chunks after the one it reads.
        XCTAssertEqual(doc.blobsToReadAhead(offset: 0, count: 1000 * kib), blobs(1...n))
        // Each later one names the chunk it brings into reach (requests of 1000 KiB end inside
        // a chunk: now and then one names nothing), up to the file's end.
        var named = blobs(1...n)
        var offset: UInt64 = 1000 * UInt64(kib)
        while offset < 40 * mib {
            let count = Int(min(1000 * UInt64(kib), 40 * mib - offset))
            named += doc.blobsToReadAhead(offset: offset, count: count)
            offset += UInt64(count)
        }
        XCTAssertEqual(named, blobs(1...39, without: 12), "each chunk named once, in order, the hole left out")
    }

    func testRequestsOutOfOrderStillCountAsSequential() {
        let doc = document()
        _ = doc.blobsToReadAhead(offset: 0, count: 1000 * kib)
        // Two requests of the kernel's read-ahead answered in the other order.
        XCTAssertEqual(doc.blobsToReadAhead(offset: 2000 * UInt64(kib), count: 1000 * kib), blobs(9...10))
        XCTAssertEqual(doc.blobsToReadAhead(offset: 1000 * UInt64(kib), count: 1000 * kib), [])
        XCTAssertEqual(doc.blobsToReadAhead(offset: 3000 * UInt64(kib), count: 1000 * kib), blobs(11...11))
    }

    func testRandomAndSmallReadsNameNothing() {
        let doc = document()
        // A random reader's misses: a few pages each, wherever they fall.
        for offset in [30 * mib, 5 * mib, 5 * mib + 16 * 1024, 20 * mib] {
            XCTAssertEqual(doc.blobsToReadAhead(offset: offset, count: 16 * kib), [])
        }
        // A jump: nothing; reads in order after it start naming again from there.
        XCTAssertEqual(doc.blobsToReadAhead(offset: 30 * mib, count: 1000 * kib), [])
        XCTAssertEqual(doc.blobsToReadAhead(offset: 30 * mib + 1000 * UInt64(kib), count: 1000 * kib), blobs(32...39))
        // Reading the file again from its start is a new run.
        XCTAssertEqual(doc.blobsToReadAhead(offset: 0, count: 1000 * kib), [])
        XCTAssertEqual(doc.blobsToReadAhead(offset: 1000 * UInt64(kib), count: 1000 * kib), blobs(2...9))
    }
}
