// Inode invalidations the kernel answered ENOENT are sent again while the kernel holds the node,
// until heard or for the span; names' and what the kernel let go are not.

import Foundation
import XCTest
@testable import UbiquityFileSystem

final class UnheardInvalidationsTests: XCTestCase {
    /// What the fake kernel was sent, and what it will not hear yet.
    final class Kernel: @unchecked Sendable {
        let lock = NSLock()
        var calls: [KernelInvalidation] = []        // every change sent, served or not
        var deaf: [KernelInvalidation: Int] = [:]   // ENOENT for this many more tries
        var held: Set<KernelInvalidation> = []
        var serving = true

        init(held: Set<KernelInvalidation>, deaf: [KernelInvalidation: Int]) {
            self.held = held
            self.deaf = deaf
        }
        func send(_ changes: [KernelInvalidation]) -> [KernelInvalidation]? {
            lock.withLock {
                calls += changes
                guard serving else { return nil }
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
        func count(_ c: KernelInvalidation) -> Int { lock.withLock { calls.filter { $0 == c }.count } }
        func settle(_ c: KernelInvalidation, below limit: Double) -> Int {
            let deadline = Date().addingTimeInterval(limit)
            var last = count(c)
            while Date() < deadline {
                usleep(100_000)
                let now = count(c)
                if now == last && now > 0 { return now }
                last = now
            }
            return last
        }
    }

    private func retrying(_ kernel: Kernel, span: UInt64 = 5_000_000_000) -> UnheardInvalidations {
        UnheardInvalidations(span: span, send: { kernel.send($0) }, held: { kernel.stillHeld($0) })
    }

    func testANodeIsSentAgainUntilTheKernelHearsIt() throws {
        let node = KernelInvalidation.node(7)
        let kernel = Kernel(held: [node], deaf: [node: 3])
        let unheard = retrying(kernel)
        defer { unheard.stop() }
        unheard.add([node, node])
        XCTAssertEqual(kernel.settle(node, below: 3), 4, "three unheard tries, then the one heard; once though added twice")
    }

    func testANodeTheKernelLetGoOrANameIsNotSentAgain() throws {
        let node = KernelInvalidation.node(8), name = KernelInvalidation.entry(parent: 1, name: Array("x".utf8))
        let kernel = Kernel(held: [name], deaf: [node: 100, name: 100])
        let unheard = retrying(kernel)
        defer { unheard.stop() }
        unheard.add([node, name])
        usleep(300_000)
        XCTAssertEqual(kernel.count(node), 0, "not held")
        XCTAssertEqual(kernel.count(name), 0, "names wait for the folder's lock: never unheard this way")
    }

    func testANodeNeverHeardIsGivenUpAfterTheSpan() throws {
        let node = KernelInvalidation.node(9)
        let kernel = Kernel(held: [node], deaf: [node: 100_000])
        let unheard = retrying(kernel, span: 300_000_000)
        defer { unheard.stop() }
        unheard.add([node])
        let tries = kernel.settle(node, below: 5)
        XCTAssertGreaterThan(tries, 3, "tried again within the span")
        XCTAssertLessThan(tries, 20, "backing off, and given up after it")
        usleep(300_000)
        XCTAssertEqual(kernel.count(node), tries)
    }

    func testNothingIsSentOnceTheSessionStopsServingOrOnceStopped() throws {
        let node = KernelInvalidation.node(10)
        let kernel = Kernel(held: [node], deaf: [node: 100_000])
        kernel.serving = false
        let unheard = retrying(kernel)
        unheard.add([node])
        XCTAssertEqual(kernel.settle(node, below: 3), 1, "one call, nothing sent: given up")
        kernel.lock.withLock { kernel.serving = true }
        unheard.stop()
        unheard.add([node])
        usleep(200_000)
        XCTAssertEqual(kernel.count(node), 1, "stopped")
    }
}
