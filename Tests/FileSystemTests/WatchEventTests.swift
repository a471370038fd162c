// What one model replays for watchers of what another writer changed: each kind of change as
// the event a local change raises, with its path in this view, only in folders the kernel
// holds, never for this writer's own changes.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class WatchEventTests: TwoWritersTestCase {

    /// What `two` replays now, one short line each.
    private func replays() throws -> [String] {
        try two.catchUpForKernel().watches.map { w in
            func p(_ v: ViewName) -> String { String(decoding: v.path, as: UTF8.self) }
            switch w {
            case .created(let v, let node): return "+ \(p(v)) \(node.kind)"
            case .removed(let v, let was): return "- \(p(v)) \(was.kind)"
            case .moved(let from, let to, _, let replaced): return "\(p(from)) -> \(p(to))" + (replaced == nil ? "" : " over")
            case .changed(let v, _, let content): return "~ \(p(v)) " + (content ? "content" : "attributes")
            }
        }
    }

    func testEachKindOfChangeIsReplayedInTheFoldersTheKernelHolds() throws {
        let docs = try two.ino("SugoiApp")
        two.remember(docs)
        XCTAssertEqual(try replays(), [])

        let f = try one.makeFile(docs, "a.txt")
        XCTAssertEqual(try replays(), ["+ SugoiApp/a.txt regular"])
        // The replay gave the kernel the file by its name, which a change to it goes by.
        two.remember(f, parent: docs, name: b("a.txt"))
        try one.writeFile(f, b("content"))
        XCTAssertEqual(try replays(), ["~ SugoiApp/a.txt content"])
        _ = try one.setattr(f, AttributeChanges(mode: 0o600), handle: nil, caller: owner)
        try one.setxattr(f, name: b("user.tag"), value: b("blue"), flags: 0)
        XCTAssertEqual(try replays(), ["~ SugoiApp/a.txt attributes"], "one replay per file and round")

        let drafts = try one.mkdir(parent: docs, name: b("Drafts"), mode: 0o755, caller: owner).ino
        XCTAssertEqual(try replays(), ["+ SugoiApp/Drafts directory"])
        try one.rename(parent: docs, name: b("a.txt"), newParent: drafts, newName: b("b.txt"), flags: [])
        XCTAssertEqual(try replays(), ["SugoiApp/a.txt -> SugoiApp/Drafts/b.txt"])
        two.kernelMoved(f, parent: drafts, name: b("b.txt"))

        // Nobody can watch a folder the kernel does not hold.
        _ = try one.makeFile(drafts, "c.txt")
        XCTAssertEqual(try replays(), [])
        two.remember(drafts)
        try one.writeFile(f, b("again"))
        XCTAssertEqual(try replays(), ["~ SugoiApp/Drafts/b.txt content"])
        // A file the kernel does not hold has no watcher of its own; its folder's see new names.
        let g = try one.makeFile(drafts, "d.txt")
        XCTAssertEqual(try replays(), ["+ SugoiApp/Drafts/d.txt regular"])
        try one.writeFile(g, b("unseen"))
        XCTAssertEqual(try replays(), [])
        try one.unlink(parent: drafts, name: b("d.txt"))
        XCTAssertEqual(try replays(), ["- SugoiApp/Drafts/d.txt regular"])

        try one.rename(parent: drafts, name: b("c.txt"), newParent: drafts, newName: b("b.txt"), flags: [])
        XCTAssertEqual(try replays(), ["SugoiApp/Drafts/c.txt -> SugoiApp/Drafts/b.txt over"])
        try one.unlink(parent: drafts, name: b("b.txt"))
        XCTAssertEqual(try replays(), ["- SugoiApp/Drafts/b.txt regular"])
        try one.rmdir(parent: docs, name: b("Drafts"))
        let removed = try two.catchUpForKernel().watches
        guard case .removed(let v, let was)? = removed.first, removed.count == 1 else {
            return XCTFail("\(removed)")
        }
        XCTAssertEqual(String(decoding: v.path, as: UTF8.self), "SugoiApp/Drafts")
        XCTAssertTrue(UbiquityFileSystem.ghostIDs.contains(was.ino),
                      "a folder that lives on in Recently Deleted goes under a stand-in: the kernel marks what it removes dead")

        // This writer's own changes raised their events as they were made.
        _ = try two.makeFile(docs, "mine.txt", b("mine"))
        XCTAssertEqual(try replays(), [])
        XCTAssertEqual(try one.catchUpForKernel().watches, [], "the kernel holds nothing of the first writer's")
    }

    /// A folder moved out of the drive view (into the container's private part, through the
    /// app view) is removed here under a stand-in id: the folder lives on, and the kernel marks
    /// what it removes dead. In the app view, Recently Deleted is hidden too: a remote delete
    /// is a removal there, a restore a new name.
    func testAFolderMovedOutOfTheViewIsRemovedUnderAStandIn() throws {
        let app = try UbiquityFileSystem(store: store, containers: Sample.all,
                                         view: .app(bundleIdentifier: Sample.sugoi.bundleIdentifier), device: "C")
        let docs = try two.ino("SugoiApp")
        two.remember(docs)
        let box = try app.ino("iCloud.com.example.SugoiApp/Documents")
        let folder = try app.mkdir(parent: box, name: b("Box"), mode: 0o755, caller: owner).ino
        XCTAssertEqual(try replays(), ["+ SugoiApp/Box directory"])
        try app.rename(parent: box, name: b("Box"), newParent: try app.ino("iCloud.com.example.SugoiApp"),
                       newName: b("Box"), flags: [])
        let removed = try two.catchUpForKernel().watches
        guard case .removed(let v, let was)? = removed.first, removed.count == 1 else { return XCTFail("\(removed)") }
        XCTAssertEqual(String(decoding: v.path, as: UTF8.self), "SugoiApp/Box")
        XCTAssertNotEqual(was.ino, folder)
        XCTAssertTrue(UbiquityFileSystem.ghostIDs.contains(was.ino))

        // The app view watching, the drive view deleting and restoring.
        let appDocs = try app.ino("iCloud.com.example.SugoiApp/Documents")
        app.remember(appDocs)
        _ = try app.catchUpForKernel()
        let file = try two.makeFile(docs, "kept.txt", b("kept"))
        func appReplays() throws -> [String] {
            try app.catchUpForKernel().watches.map { w in
                switch w {
                case .created(let v, _): return "+ " + String(decoding: v.path, as: UTF8.self)
                case .removed(let v, _): return "- " + String(decoding: v.path, as: UTF8.self)
                case .moved(let f, let t, _, _): return String(decoding: f.path + [0x20] + t.path, as: UTF8.self)
                case .changed(let v, _, _): return "~ " + String(decoding: v.path, as: UTF8.self)
                }
            }
        }
        XCTAssertEqual(try appReplays(), ["+ iCloud.com.example.SugoiApp/Documents/kept.txt",
                                          "~ iCloud.com.example.SugoiApp/Documents/kept.txt"],
                       "made and written in one round: the new name, then its content by it")
        try two.unlink(parent: docs, name: b("kept.txt"))
        XCTAssertEqual(try appReplays(), ["- iCloud.com.example.SugoiApp/Documents/kept.txt"])
        _ = try two.restoreFromTrash(file)
        XCTAssertEqual(try appReplays(), ["+ iCloud.com.example.SugoiApp/Documents/kept.txt"])
    }
}
