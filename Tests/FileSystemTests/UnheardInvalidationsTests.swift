// Invalidations the kernel answered ENOENT are sent again while the kernel holds their node:
// a node's until it is heard (or 2 s), a name's a few times, nothing the kernel let go.

import Foundation
import XCTest
@testable import UbiquityFileSystem

final class UnheardInvalidationsTests: XCTestCase {
    /// What the fake kernel was sent, and what it will not hear yet.
    final class Kernel: @unchecked Sendable {
        let lock = NSLock()
        var sent: [KernelInvalidation] = []
        var deaf: [KernelInvalidation: Int] = [:]   // ENOENT for this many more tries
        var held: Set<KernelInvalidation> = []
        var serving = true

        func send(_ changes: [KernelInvalidation]) -> [KernelInvalidation]? {
            lock.withLock {
                guard serving else { return nil }
                sent += changes
                return changes.filter { c in
                    guard let n = deaf[c], n > 0 else { return false }
                    deaf[c] = n - 1
                    return true
                }
            }
        }
        func stillHeld(_ changes: [KernelInvalidation]) -> [KernelInvalidation] {
            lock.withLock { changes.filter(held.contains) }
        }
        func count(_ c: KernelInvalidation) -> Int { lock.withLock { sent.filter { $0 == c }.count } }
    }

    func testANodeIsSentAgainUntilTheKernelHearsIt() throws {
        let kernel = Kernel()
        let node = KernelInvalidation.node(7)
        kernel.held = [node]
        kernel.deaf[node] = 3
        let unheard = UnheardInvalidations(send: kernel.send, held: kernel.stillHeld)
        defer { unheard.stop() }
        unheard.add([node])
        let deadline = Date().addingTimeInterval(1.5)
        while kernel.count(node) < 4 && Date() < deadline { usleep(5_000) }
        XCTAssertEqual(kernel.count(node), 4, "three unheard tries, then the one heard")
        usleep(150_000)
        XCTAssertEqual(kernel.count(node), 4, "heard: not sent again")
    }

    func testANodeTheKernelLetGoIsNotSentAgain() throws {
        let kernel = Kernel()
        let node = KernelInvalidation.node(8)
        kernel.deaf[node] = 100
        let unheard = UnheardInvalidations(send: kernel.send, held: kernel.stillHeld)
        defer { unheard.stop() }
        unheard.add([node])
        usleep(200_000)
        XCTAssertEqual(kernel.count(node), 0)
    }

    func testANameIsSentAgainAFewTimesOnly() throws {
        let kernel = Kernel()
        let entry = KernelInvalidation.entry(parent: 5, name: Array("x".utf8))
        kernel.held = [entry]
        kernel.deaf[entry] = 1_000
        let node = KernelInvalidation.node(9)
        kernel.held.insert(node)
        kernel.deaf[node] = 1_000
        let unheard = UnheardInvalidations(send: kernel.send, held: kernel.stillHeld)
        defer { unheard.stop() }
        unheard.add([entry, node])
        usleep(900_000)
        XCTAssertEqual(kernel.count(entry), UnheardInvalidations.entryDelays.count)
        let tries = kernel.count(node)
        XCTAssertGreaterThan(tries, 10, "a held node is tried again for 2 s")
        usleep(1_400_000)
        let final = kernel.count(node)
        usleep(200_000)
        XCTAssertEqual(kernel.count(node), final, "given up after 2 s")
        XCTAssertLessThan(final, 60, "backing off to 50 ms between tries")
    }

    func testNothingIsSentOnceStoppedOrOnceTheSessionStopsServing() throws {
        let kernel = Kernel()
        let node = KernelInvalidation.node(10)
        kernel.held = [node]
        kernel.deaf[node] = 1_000
        let unheard = UnheardInvalidations(send: kernel.send, held: kernel.stillHeld)
        unheard.add([node])
        usleep(30_000)
        kernel.lock.withLock { kernel.serving = false }
        usleep(100_000)
        let tries = kernel.count(node)
        unheard.stop()
        unheard.add([node])
        usleep(100_000)
        XCTAssertEqual(kernel.count(node), tries)
    }
}
