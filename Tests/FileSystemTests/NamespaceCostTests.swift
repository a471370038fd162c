// What a metadata change costs must not depend on how big the namespace is. Timing that belongs in
// `scripts/bench`; here the tables' storage identity shows whether a change copied them.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class NamespaceCostTests: XCTestCase {
    func testChangesDoNotCopyTheNamespace() throws {
        let fs = try UbiquityFileSystem(store: makeMemoryStore(), containers: Sample.all, view: .drive)
        let docs = try fs.ino("SugoiApp")
        var files: [UInt64] = []
        for i in 0..<300 { files.append(try fs.makeFile(docs, "f\(i)", b("x"))) }
        let folder = try fs.mkdir(parent: docs, name: b("folder"), mode: 0o755, caller: owner).ino
        try fs.setxattr(files[0], name: b("user.tag"), value: b("one"), flags: 0)

        try fs.unlink(parent: docs, name: b("f5"))   // makes the container's Recently Deleted
        // Changes that add no entry to any table, so no table needs to grow.
        let before = fs.namespaceStorageIdentity
        _ = try fs.setattr(files[1], AttributeChanges(mode: 0o600), handle: nil, caller: owner)
        XCTAssertEqual(fs.namespaceStorageIdentity, before, "chmod copied the namespace")
        try fs.rename(parent: docs, name: b("f2"), newParent: docs, newName: b("renamed"), flags: [])
        try fs.setxattr(files[0], name: b("user.tag"), value: b("two"), flags: 0)
        try fs.unlink(parent: docs, name: b("f3"))
        try fs.rmdir(parent: docs, name: b("folder"))
        try fs.writeFile(files[4], b("content"))   // a publish
        XCTAssertEqual(fs.namespaceStorageIdentity, before, "a change copied the namespace")
        _ = folder
    }
}
