// Which blob files a read has read ahead: the next chunks of a file read in order with large
// requests (the kernel's read-ahead) once the run is long enough, each named once; none for
// random, small or short reads.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class ReadAheadTests: XCTestCase {
    private let kib = 1024
    private let mib = UInt64(chunkSize)

    /// A published file of 40 chunks whose blob ids are 101…140, chunk 35 a hole.
    private func document() -> Document {
        let chunks = (0..<40).map { i in
            i == 35 ? ChunkRef(blob: 0, length: UInt32(chunkSize), checksum: 0)
                    : ChunkRef(blob: BlobID(101 + i), length: UInt32(chunkSize), checksum: 0)
        }
        let node = NodeRecord(ino: 9, container: Sample.testDrive.identifier, kind: .regular, mode: 0o644, uid: 0, gid: 0,
                              nlink: 1, size: 40 * mib, atime: 0, mtime: 0, ctime: 0, btime: 0, currentVersion: 1)
        return Document(node: node, chunks: chunks, store: makeMemoryStore())
    }

    private func blobs(_ chunks: ClosedRange<Int>, without hole: Int? = nil) -> [BlobID] {
        chunks.filter { $0 != hole }.map { BlobID(101 + $0) }
    }

    /// Reads of `step` bytes from `from` to `to` in order: what each named.
    private func readInOrder(_ doc: Document, from: UInt64, to: UInt64, step: Int = 1000 * 1024) -> [(end: UInt64, named: [BlobID])] {
        var out: [(UInt64, [BlobID])] = []
        var offset = from
        while offset < to {
            let count = Int(min(UInt64(step), to - offset))
            out.append((offset + UInt64(count), doc.blobsToReadAhead(offset: offset, count: count)))
            offset += UInt64(count)
        }
        return out
    }

    func testASequentialReadNamesTheNextChunksOnceItIsARun() {
        let doc = document()
        let window = UInt64(Document.readAheadChunks) * mib
        let reads = readInOrder(doc, from: 0, to: 40 * mib)
        // Nothing until the run has covered twice the window: a page fault's read-around or a
        // look at a file's start is not a run.
        XCTAssertTrue(reads.filter { $0.end < 2 * window }.allSatisfy { $0.named.isEmpty })
        let first = reads.firstIndex { !$0.named.isEmpty }!
        XCTAssertEqual(reads[first].named.count, Document.readAheadChunks, "the whole window at once")
        XCTAssertTrue(reads.allSatisfy { $0.named.count <= Document.readAheadChunks })
        // Then each read names the chunk it brings into reach, each chunk once, up to the end.
        XCTAssertEqual(reads.flatMap(\.named), blobs(17...39, without: 35), "the hole (chunk 35) is never named")
        let lateDoc = document()
        _ = readInOrder(lateDoc, from: 0, to: 10 * mib)
        XCTAssertEqual(readInOrder(lateDoc, from: 10 * mib, to: 20 * mib).flatMap(\.named), blobs(17...27),
                       "a run that began at the start counts from there")
    }

    func testRequestsOutOfOrderStillCountAsSequential() {
        let doc = document()
        _ = readInOrder(doc, from: 0, to: 20_480_000)   // named through chunk 27
        // Two requests of the kernel's read-ahead answered in the other order.
        XCTAssertEqual(doc.blobsToReadAhead(offset: 21_504_000, count: 1000 * kib), blobs(28...29))
        XCTAssertEqual(doc.blobsToReadAhead(offset: 20_480_000, count: 1000 * kib), [])
        XCTAssertEqual(doc.blobsToReadAhead(offset: 22_528_000, count: 1000 * kib), blobs(30...30))
    }

    func testRandomSmallAndShortReadsNameNothing() {
        let doc = document()
        // A random reader's misses: a few pages each, wherever they fall.
        for offset in [30 * mib, 5 * mib, 5 * mib + 16 * 1024, 20 * mib] {
            XCTAssertEqual(doc.blobsToReadAhead(offset: offset, count: 16 * kib), [])
        }
        // A page fault's read-around: four large requests together, then elsewhere.
        XCTAssertTrue(readInOrder(doc, from: 10 * mib, to: 14 * mib).allSatisfy { $0.named.isEmpty })
        XCTAssertTrue(readInOrder(doc, from: 30 * mib, to: 34 * mib).allSatisfy { $0.named.isEmpty })
        // A look at the file's start, twice.
        XCTAssertTrue(readInOrder(doc, from: 0, to: 2 * mib).allSatisfy { $0.named.isEmpty })
        XCTAssertTrue(readInOrder(doc, from: 0, to: 2 * mib).allSatisfy { $0.named.isEmpty })
        // A run long enough after a jump names again, from where it has got to.
        XCTAssertFalse(readInOrder(doc, from: 4 * mib, to: 24 * mib).allSatisfy { $0.named.isEmpty })
    }
}
