// Advisory locks through the model: two models on one store (two daemons) share the store's lock
// table, and a waiting request is answered once, when the lock is free, interrupted or stopped.

import Foundation
import XCTest
import UbiquityFileSystem
import UbiquityStore

final class LockTests: XCTestCase {
    var store: BackingStore!
    var one: UbiquityFileSystem!
    var two: UbiquityFileSystem!
    var file: UInt64 = 0

    override func setUpWithError() throws {
        store = makeMemoryStore()
        one = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "A")
        two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
        file = try one.makeFile(try one.ino("SugoiApp"), "locked.db", b("x"))
    }

    override func tearDown() {
        one?.stopLockWaits()
        two?.stopLockWaits()
        one = nil
        two = nil
        store = nil
    }

    /// The answer each waiting request got, by name.
    final class Answers: @unchecked Sendable {
        private let condition = NSCondition()
        private var got: [String: Int32] = [:]
        func record(_ name: String, _ errno: Int32) {
            condition.lock()
            XCTAssertNil(got[name], "\(name) answered twice")
            got[name] = errno
            condition.broadcast()
            condition.unlock()
        }
        /// Wait (up to 10 s) until `name` is answered.
        func wait(_ name: String) -> Int32? {
            condition.lock()
            defer { condition.unlock() }
            let deadline = Date().addingTimeInterval(10)
            while got[name] == nil && condition.wait(until: deadline) {}
            return got[name]
        }
        func answer(_ name: String) -> Int32? {
            condition.lock()
            defer { condition.unlock() }
            return got[name]
        }
    }

    func testLocksThroughOneModelConflictThroughTheOther() throws {
        let all = LockRange.wholeFile
        XCTAssertTrue(try one.setLock(file, owner: 5, style: .posix, mode: .write, range: LockRange(start: 0, length: 10), pid: 100))
        XCTAssertFalse(try two.setLock(file, owner: 5, style: .posix, mode: .read, range: all, pid: 200),
                       "the same kernel owner number through another daemon is another owner")
        XCTAssertTrue(try two.setLock(file, owner: 5, style: .posix, mode: .read, range: LockRange(start: 10, length: 0), pid: 200))
        XCTAssertEqual(try two.testLock(file, owner: 6, mode: .write, range: LockRange(start: 0, length: 5))?.range.length, 10)
        XCTAssertEqual(try one.testLock(file, owner: 6, mode: .write, range: LockRange(start: 0, length: 1)),
                       HeldLock(mode: .write, range: LockRange(start: 0, length: 10), pid: 100))
        one.releaseLocks(file, owner: 5, style: .posix)
        XCTAssertTrue(try two.setLock(file, owner: 5, style: .posix, mode: .write, range: all, pid: 200))
        two.releaseLocks(file, owner: 5, style: .posix)

        XCTAssertTrue(try one.setLock(file, owner: 9, style: .flock, mode: .write, pid: 100))
        XCTAssertFalse(try two.setLock(file, owner: 9, style: .flock, mode: .read, pid: 200))
        XCTAssertTrue(try two.setLock(file, owner: 9, style: .posix, mode: .write, range: all, pid: 200),
                      "flock and fcntl locks do not meet")
    }

    /// The last release of an open file ends the locks of owners that locked through it alone
    /// (an open file description's own locks); an owner that also locked through another open
    /// file keeps its locks until that one goes too.
    func testTheLastReleaseOfAnOpenFileEndsLocksTakenThroughItAlone() throws {
        let h1 = try one.open(file, flags: O_RDWR)
        let h2 = try one.open(file, flags: O_RDWR)
        let part = { (start: Int64) in LockRange(start: start, length: 1) }
        XCTAssertTrue(try one.setLock(file, owner: 100, style: .posix, mode: .write, range: part(0), pid: 1, handle: h1))
        XCTAssertTrue(try one.setLock(file, owner: 200, style: .posix, mode: .write, range: part(1), pid: 2, handle: h1))
        XCTAssertTrue(try one.setLock(file, owner: 200, style: .posix, mode: .write, range: part(2), pid: 2, handle: h2))
        try one.release(handle: h1)
        XCTAssertNil(try two.testLock(file, owner: 9, mode: .write, range: part(0)), "owner 100 used h1 alone")
        XCTAssertNotNil(try two.testLock(file, owner: 9, mode: .write, range: part(1)), "owner 200 still has h2")
        try one.release(handle: h2)
        XCTAssertNil(try two.testLock(file, owner: 9, mode: .write, range: .wholeFile))
    }

    func testAWaiterGetsTheLockWhenTheOtherDaemonDropsIt() throws {
        let answers = Answers()
        XCTAssertTrue(try one.setLock(file, owner: 1, style: .flock, mode: .write, pid: 100))
        two.waitForLock(file, owner: 2, style: .flock, mode: .write, pid: 200,
                        interrupted: { false }, done: { answers.record("flock", $0) })
        two.waitForLock(file, owner: 3, style: .posix, mode: .read, range: LockRange(start: 5, length: 5), pid: 300,
                        interrupted: { false }, done: { answers.record("posix", $0) })
        XCTAssertEqual(answers.wait("posix"), 0, "the POSIX waiter is not behind the flock lock")
        usleep(50_000)
        XCTAssertNil(answers.answer("flock"), "still held")
        // The holder drops it through the other model: this one's poll finds it free.
        XCTAssertTrue(try one.setLock(file, owner: 1, style: .flock, mode: nil, pid: 100))
        XCTAssertEqual(answers.wait("flock"), 0)
        XCTAssertFalse(try one.setLock(file, owner: 1, style: .flock, mode: .read, pid: 100), "the waiter holds it now")
    }

    func testAWaiterInTheSameDaemonIsWokenByARelease() throws {
        let answers = Answers()
        XCTAssertTrue(try one.setLock(file, owner: 1, style: .posix, mode: .write, range: .wholeFile, pid: 100))
        one.waitForLock(file, owner: 2, style: .posix, mode: .write, range: LockRange(start: 100, length: 1), pid: 200,
                        interrupted: { false }, done: { answers.record("w", $0) })
        usleep(30_000)
        XCTAssertNil(answers.answer("w"))
        one.releaseLocks(file, owner: 1, style: .posix)   // the holder closed the file
        XCTAssertEqual(answers.wait("w"), 0)
        XCTAssertEqual(try two.testLock(file, owner: 7, mode: .read, range: .wholeFile)?.range,
                       LockRange(start: 100, length: 1))
    }

    func testAnInterruptedWaiterGetsEINTRAndTakesNothing() throws {
        let answers = Answers()
        let flag = Flag()
        XCTAssertTrue(try one.setLock(file, owner: 1, style: .posix, mode: .write, range: .wholeFile, pid: 100))
        two.waitForLock(file, owner: 2, style: .posix, mode: .write, range: .wholeFile, pid: 200,
                        interrupted: { flag.value }, done: { answers.record("w", $0) })
        usleep(30_000)
        flag.value = true
        XCTAssertEqual(answers.wait("w"), EINTR)
        one.releaseLocks(file, owner: 1, style: .posix)
        XCTAssertNil(try one.testLock(file, owner: 1, mode: .write, range: .wholeFile), "the interrupted waiter took nothing")
    }

    func testStoppingAnswersEveryWaiterWithEINTR() throws {
        let answers = Answers()
        XCTAssertTrue(try one.setLock(file, owner: 1, style: .flock, mode: .write, pid: 100))
        for i in 0..<5 {
            two.waitForLock(file, owner: UInt64(10 + i), style: .flock, mode: .read, pid: 200,
                            interrupted: { false }, done: { answers.record("w\(i)", $0) })
        }
        two.stopLockWaits()
        for i in 0..<5 { XCTAssertEqual(answers.answer("w\(i)"), EINTR, "answered before stop returns") }
        two.waitForLock(file, owner: 20, style: .flock, mode: .read, pid: 200,
                        interrupted: { false }, done: { answers.record("late", $0) })
        XCTAssertEqual(answers.answer("late"), EINTR, "a request after stop is answered at once")
    }

    func testAFailingLockTableGivesTheErrno() throws {
        let plan = FaultPlan()
        let faulty = try UbiquityFileSystem(store: faultInjecting(store, plan: plan), containers: Sample.all,
                                            view: .drive, device: "C")
        plan.fail(.lockSet, errno: EIO)
        assertErrno(EIO, try faulty.setLock(file, owner: 1, style: .posix, mode: .write, range: .wholeFile, pid: 1))
        plan.fail(.lockTest, errno: ENOLCK)
        assertErrno(ENOLCK, try faulty.testLock(file, owner: 1, mode: .write, range: .wholeFile))
        plan.fail(.lockTest, errno: EBADF)
        assertErrno(EIO, try faulty.testLock(file, owner: 1, mode: .write, range: .wholeFile),
                    "EBADF from the daemon's own descriptor is its bug, not the caller's")
        let answers = Answers()
        XCTAssertTrue(try one.setLock(file, owner: 1, style: .posix, mode: .write, range: .wholeFile, pid: 100))
        plan.fail(.lockSet, errno: EIO, .nthCall(2))
        faulty.waitForLock(file, owner: 2, style: .posix, mode: .write, range: .wholeFile, pid: 200,
                           interrupted: { false }, done: { answers.record("w", $0) })
        XCTAssertEqual(answers.wait("w"), EIO, "a waiter whose retry fails gets that errno")
        faulty.stopLockWaits()
    }
}

final class Flag: @unchecked Sendable {
    private let lock = NSLock()
    private var stored = false
    var value: Bool {
        get { lock.lock(); defer { lock.unlock() }; return stored }
        set { lock.lock(); stored = newValue; lock.unlock() }
    }
}
