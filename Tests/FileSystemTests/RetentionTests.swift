// The retention policy over simulated days: every version for a day, the newest of each hour for
// a week, of each day for 30 days; a cap per file and a space limit per container; the current
// version and unresolved conflicts always stay.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class RetentionTests: XCTestCase {
    let hour = RetentionPolicy.hour
    let day = RetentionPolicy.day

    private func version(_ id: VersionID, at created: Int64, origin: VersionOrigin = .published, size: UInt64 = 1) -> VersionRecord {
        VersionRecord(id: id, ino: 10, created: created, size: size, chunks: [], origin: origin, device: "A")
    }

    func testTheBuckets() {
        let now: Int64 = 1_000 * day
        var versions: [VersionRecord] = []
        var id: VersionID = 0
        // One version every 10 minutes for 40 days.
        var t = now - 40 * day
        while t <= now {
            id += 1
            versions.append(version(id, at: t))
            t += 10 * 60 * 1_000_000_000
        }
        let current = id
        let doomed = RetentionPolicy().doomed(versions, keep: [current], now: now)
        let kept = versions.filter { !doomed.contains($0.id) }
        let age = { (v: VersionRecord) in now - v.created }
        XCTAssertEqual(kept.filter { age($0) < day }.count, versions.filter { age($0) < day }.count, "all of the last day")
        let hourly = kept.filter { age($0) >= day && age($0) < 7 * day }
        XCTAssertEqual(Set(hourly.map { $0.created / hour }).count, hourly.count, "one per hour in the week")
        XCTAssertGreaterThanOrEqual(hourly.count, 6 * 24 - 1)
        let daily = kept.filter { age($0) >= 7 * day }
        XCTAssertEqual(Set(daily.map { $0.created / day }).count, daily.count, "one per day after the week")
        XCTAssertTrue(daily.allSatisfy { age($0) < 30 * day }, "nothing older than 30 days")
        XCTAssertGreaterThanOrEqual(daily.count, 22)
        // The newest of each bucket is the one kept.
        for v in hourly {
            XCTAssertFalse(versions.contains { $0.created / hour == v.created / hour && $0.created > v.created && age($0) >= day })
        }
    }

    func testWhatAlwaysStays() {
        let now: Int64 = 1_000 * day
        let versions = [version(1, at: now - 90 * day), version(2, at: now - 60 * day, origin: .conflict),
                        version(3, at: now - 10 * day - 5, origin: .recovered), version(4, at: now - 10 * day)]
        let doomed = RetentionPolicy().doomed(versions, keep: [1, 2], now: now)
        XCTAssertEqual(doomed, [], "the current version and an unresolved conflict stay, a recovered version is not thinned")
        XCTAssertEqual(RetentionPolicy().doomed(versions, keep: [4], now: now), [1, 2], "past 30 days everything else goes")
        var capped = RetentionPolicy()
        capped.maxPerFile = 2
        let young = (1...5).map { version(VersionID($0), at: now - Int64($0)) }
        XCTAssertEqual(capped.doomed(young, keep: [1], now: now), [3, 4, 5], "the cap keeps the newest")
    }

    func testParse() {
        let p = RetentionPolicy.parse("all=12h,hourly=3d,daily=90d,space=512M")
        XCTAssertEqual(p?.allFor, 12 * hour)
        XCTAssertEqual(p?.hourlyFor, 3 * day)
        XCTAssertEqual(p?.dailyFor, 90 * day)
        XCTAssertEqual(p?.maxBytesPerContainer, 512 << 20)
        XCTAssertEqual(RetentionPolicy.parse("space=1000")?.maxBytesPerContainer, 1000)
        XCTAssertEqual(RetentionPolicy.parse("daily=30d"), RetentionPolicy())
        let custom = RetentionPolicy.parse("all=2h,max=50,deleted=90d")!
        XCTAssertEqual(custom.maxPerFile, 50)
        XCTAssertEqual(custom.deletedFor, 90 * day)
        XCTAssertEqual(RetentionPolicy.parse(custom.spec), custom, "spec round-trips")
        XCTAssertEqual(RetentionPolicy.parse("space=1G", over: custom)?.maxPerFile, 50, "over the current settings")
        for bad in ["all=1x", "hourly", "weekly=2d", "all=8d", "space=-1G", "max=1"] {
            XCTAssertNil(RetentionPolicy.parse(bad), bad)
        }
    }

    /// A stop between a pruning commit and the deletion of its chunks (here: every chunk deletion
    /// fails, as if the daemon were killed right after the commit) leaves chunks nothing refers
    /// to, never a version without its chunks; the next collection deletes them.
    func testPruningAndEmptyingAreCrashSafe() throws {
        let base = makeMemoryStore()
        let plan = FaultPlan()
        let fs = try UbiquityFileSystem(store: faultInjecting(base, plan: plan), containers: Sample.all, view: .drive)
        let blobs = base.blobs as! MemoryBlobStore
        let docs = try fs.ino("SugoiApp")
        fs.versionsToKeep = 2
        let f = try fs.makeFile(docs, "f", b("v0"))
        plan.fail(.blobDelete, errno: EIO)
        for i in 1...6 { try fs.writeFile(f, b("v\(i)")) }
        let g = try fs.makeFile(docs, "g", b("gone"))
        try fs.unlink(parent: docs, name: b("g"))
        try fs.emptyTrash()
        XCTAssertGreaterThan(plan.failureCount(.blobDelete), 0)
        func referenced() throws -> Set<BlobID> { try base.metadata.referencedBlobs() }
        XCTAssertTrue(try referenced().isSubset(of: Set(blobs.blobIDs)), "every version still has its chunks")
        XCTAssertGreaterThan(Set(blobs.blobIDs).subtracting(try referenced()).count, 0, "garbage left behind")
        plan.clearAll()
        for id in blobs.blobIDs { blobs.backdate(id, by: 11 * 60 * 1_000_000_000) }
        try fs.collectGarbage()
        XCTAssertEqual(Set(blobs.blobIDs), try referenced(), "the next collection deleted exactly the garbage")
        assertBytes(try fs.contents(f), b("v6"))
        _ = g
    }

    /// The settings are the store's: another writer prunes by them too.
    func testTheSettingsAreTheStores() throws {
        let store = makeMemoryStore()
        let one = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        let two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertEqual(two.retention, RetentionPolicy())
        one.versionsToKeep = 7
        try two.catchUp()
        XCTAssertEqual(two.retention.maxPerFile, 7)
        let three = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertEqual(three.retention.maxPerFile, 7, "and every later one")
    }

    /// Over the model, with its clock moved on: the hourly collection thins old versions and
    /// frees their content; the space limit drops the oldest of a container first.
    func testTheCollectionPrunesOverSimulatedDays() throws {
        let store = makeMemoryStore()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        let start = nowNanoseconds()
        let clock = LockedClock(start)
        fs.clock = { clock.now }
        let docs = try fs.ino("SugoiApp")
        let f = try fs.makeFile(docs, "log.txt", b("v0"))
        // Versions are stamped with the real clock: stamp them as if made over 40 days.
        for i in 1...40 { try fs.writeFile(f, b("v\(i)")) }
        let made = try store.metadata.versions(of: f)
        XCTAssertEqual(made.count, 41)
        let hours = Set(made.dropLast().map { $0.created / hour }).count   // 1, or 2 across an hour's end
        clock.now = start + 12 * hour
        try fs.collectGarbage()
        XCTAssertEqual(try store.metadata.versions(of: f).count, 41, "all of the last day")
        clock.now = start + 2 * day
        try fs.collectGarbage()
        XCTAssertEqual(try store.metadata.versions(of: f).count, hours + 1, "the newest of their hour, and the current one")
        clock.now = start + 31 * day
        try fs.collectGarbage()
        XCTAssertEqual(try store.metadata.versions(of: f).map(\.size), [3], "only the current one")
        assertBytes(try fs.contents(f), b("v40"))
        XCTAssertEqual((store.blobs as! MemoryBlobStore).blobIDs.count, 1, "the pruned versions' content is freed")

        // The space limit takes old versions past their first day, oldest first; never a young
        // one, never a recovered one.
        let g = try fs.makeFile(docs, "g.txt", b("12345"))
        for i in 0..<4 { try fs.writeFile(g, b("abcd\(i)")) }
        let madeG = nowNanoseconds()
        fs.retention.maxBytesPerContainer = 4
        clock.now = madeG
        try fs.collectGarbage()
        XCTAssertEqual(try store.metadata.versions(of: g).count, 5, "all younger than a day")
        clock.now = madeG + 2 * day
        fs.retention.maxBytesPerContainer = 1 << 30
        try fs.collectGarbage()
        let hoursG = Set(try store.metadata.versions(of: g).dropLast().map { $0.created / hour }).count
        XCTAssertEqual(try store.metadata.versions(of: g).count, hoursG + 1, "the newest of its hour stays")
        fs.retention.maxBytesPerContainer = 4
        try fs.collectGarbage()
        let left = try store.metadata.versions(of: g)
        XCTAssertEqual(left.count, 1, "over the space limit: only the current one")
        XCTAssertEqual(left.last?.id, try store.metadata.load().nodes.first { $0.ino == g }?.currentVersion)
        assertBytes(try fs.contents(g), b("abcd3"))
    }
}
