// Many threads on one model at once, and two models writing one store at once: every operation
// either happens whole or fails with a plain errno, and afterwards memory, store and the other
// writer agree.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class ConcurrencyTests: XCTestCase {
    /// The tree under a folder: path, kind, link count, size (and content for files).
    private func tree(_ fs: UbiquityFileSystem, _ root: UInt64) throws -> [String] {
        var out: [String] = []
        func walk(_ ino: UInt64, _ path: String) throws {
            for name in try fs.names(ino) {
                let a = try fs.lookup(parent: ino, name: b(name))
                var line = "\(path)/\(name) \(a.kind) nlink \(a.nlink) size \(a.size)"
                if a.kind == .regular { line += " " + String(decoding: try fs.contents(a.ino), as: UTF8.self) }
                out.append(line)
                if a.kind == .directory { try walk(a.ino, path + "/" + name) }
            }
        }
        try walk(root, "")
        return out
    }

    /// Random operations from `threads` threads at once over a few shared names, so that they race.
    private func hammer(_ writers: [UbiquityFileSystem], threads: Int, steps: Int, seed: UInt64) throws -> [String] {
        let unexpected = LogBox()
        let succeeded = LogBox()
        DispatchQueue.concurrentPerform(iterations: threads) { t in
            let fs = writers[t % writers.count]
            var rng = SplitMix64(seed: seed &+ UInt64(t))
            guard let docs = try? fs.ino("SugoiApp") else { unexpected.append("no SugoiApp"); return }
            let names = (0..<6).map { "n\($0)" }
            for step in 0..<steps {
                let name = names[Int(rng.next() % UInt64(names.count))]
                let other = names[Int(rng.next() % UInt64(names.count))]
                do {
                    switch rng.next() % 6 {
                    case 0: try fs.makeFile(docs, name, b("t\(t) s\(step)"))
                    case 1: _ = try fs.mkdir(parent: docs, name: b(name), mode: 0o755, caller: owner)
                    case 2: try fs.unlink(parent: docs, name: b(name))
                    case 3: try fs.rmdir(parent: docs, name: b(name))
                    case 4: try fs.rename(parent: docs, name: b(name), newParent: docs, newName: b(other), flags: [])
                    default:
                        let ino = try fs.lookup(parent: docs, name: b(name)).ino
                        try fs.writeFile(ino, b("w\(t)"))
                    }
                    if step % 10 == 0 { succeeded.append("") }
                } catch {
                    // The errnos a local race gives; anything else is a bug.
                    let e = errnoOf(error) ?? -1
                    if ![EEXIST, ENOENT, ENOTEMPTY, EISDIR, ENOTDIR].contains(e) {
                        unexpected.append("thread \(t) step \(step): \(error)")
                    }
                }
            }
        }
        // The races must not all be lost: a fair share of operations succeed.
        if succeeded.lines.count < threads * steps / 50 {
            unexpected.append("only \(succeeded.lines.count * 10) of \(threads * steps) operations succeeded")
        }
        return unexpected.lines
    }

    func testManyThreadsOnOneModel() throws {
        let store = makeMemoryStore()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertEqual(try hammer([fs], threads: 8, steps: 300, seed: 1), [])
        XCTAssertTrue(fs.publishAll().isEmpty)
        let docs = try fs.ino("SugoiApp")
        let reopened = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertEqual(try tree(reopened, try reopened.ino("SugoiApp")), try tree(fs, docs),
                       "memory and store agree")
        XCTAssertEqual(try fs.getattr(docs).nlink, UInt32(2 + (try tree(fs, docs)).filter { $0.contains(" directory ") }.count))
    }

    func testTwoModelsWritingOneStoreAtOnce() throws {
        let shared = makeMemoryStore()
        // Each writer has its own work area, as each daemon has its own folder.
        func writer() throws -> UbiquityFileSystem {
            try UbiquityFileSystem(store: BackingStore(metadata: shared.metadata, blobs: shared.blobs, work: MemoryWorkArea(),
                                                       locks: shared.locks),
                                   containers: Sample.all, view: .drive)
        }
        let one = try writer(), two = try writer()
        XCTAssertEqual(try hammer([one, two], threads: 6, steps: 200, seed: 7), [])
        XCTAssertTrue(one.publishAll().isEmpty)
        XCTAssertTrue(two.publishAll().isEmpty)
        // A conflict whose file had no name at that moment owes its copy, which any writer's
        // next collection (or start) makes: settled here, so a fresh start adds nothing.
        for fs in [one, two] {
            try fs.catchUp()
            fs.makeOwedConflictCopies()
        }
        try one.catchUp()
        try two.catchUp()
        let expected = try tree(one, try one.ino("SugoiApp"))
        XCTAssertEqual(try tree(two, try two.ino("SugoiApp")), expected, "the two writers agree")
        let fresh = try writer()
        XCTAssertEqual(try tree(fresh, try fresh.ino("SugoiApp")), expected, "and the store agrees")
    }

    /// A metadata commit in progress (a slow disk, a shared store far away) holds up no reader:
    /// lookup, getattr and readdir answer from memory meanwhile, and see the change once it is
    /// committed. The commit is held open by the fault plan, so nothing here depends on timing
    /// (the 10 s limits only turn a stall into a failure instead of a hang).
    func testReadersDoNotWaitForACommitInProgress() throws {
        let plan = FaultPlan()
        let fs = try UbiquityFileSystem(store: faultInjecting(makeMemoryStore(), plan: plan),
                                        containers: Sample.all, view: .drive)
        let docs = try fs.ino("SugoiApp")
        _ = try fs.makeFile(docs, "old.txt", b("x"))
        plan.hold(.commit)
        let made = DispatchSemaphore(value: 0)
        let result = ResultBox()
        Thread {
            do { result.set(try fs.mkdir(parent: docs, name: b("New"), mode: 0o755, caller: Caller(uid: 0, gid: 0)).ino) }
            catch { result.fail(error) }
            made.signal()
        }.start()
        let deadline = Date().addingTimeInterval(10)
        while plan.waiting(.commit) == 0 && Date() < deadline { usleep(1_000) }
        XCTAssertEqual(plan.waiting(.commit), 1, "the mkdir is committing")

        let read = DispatchSemaphore(value: 0)
        let seen = ResultBox()
        Thread {
            do {
                let file = try fs.lookup(parent: docs, name: b("old.txt"))
                _ = try fs.getattr(file.ino)
                let handle = try fs.opendir(docs)
                let names = try fs.readdir(handle: handle, offset: 0).map { String(decoding: $0.name, as: UTF8.self) }
                fs.releasedir(handle: handle)
                seen.set(UInt64(names.filter { $0 == "New" }.count))
            } catch { seen.fail(error) }
            read.signal()
        }.start()
        XCTAssertEqual(read.wait(timeout: .now() + 10), .success, "readers waited for the commit")
        XCTAssertEqual(try seen.get(), 0, "the folder is not there before its commit")
        plan.resume(.commit)
        XCTAssertEqual(made.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(try fs.lookup(parent: docs, name: b("New")).ino, try result.get())
    }
}

/// A value or an error handed back from another thread.
final class ResultBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Result<UInt64, Error>?
    func set(_ v: UInt64) { lock.lock(); value = .success(v); lock.unlock() }
    func fail(_ e: Error) { lock.lock(); value = .failure(e); lock.unlock() }
    func get() throws -> UInt64 {
        lock.lock(); defer { lock.unlock() }
        guard let value else { throw FSError(EIO, "no result") }
        return try value.get()
    }
}
