import Foundation
import XCTest
@testable import UbiquityStore

/// The space reserve of the embedded store (the full-disk path itself runs on a real small disk
/// in the mount tests' DiskFullTests).
final class SpaceReserveTests: XCTestCase {
    private var folder = ""

    override func setUpWithError() throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("reserve-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: folder)
    }

    /// Two daemons on one store each hold a view of the one reserve file: when one gives it up,
    /// the other learns it at its next content write (within 100 ms) and says so, instead of
    /// writing content into the space freed for names.
    func testAReleaseByAnotherDaemonIsNoticed() throws {
        let said = LockedBox<[String]>([])
        let one = SpaceReserve(directory: folder, log: { _ in })
        let two = SpaceReserve(directory: folder, log: { line in said.update { $0.append(line) } })
        one.start()
        two.start()
        try two.checkRoom(for: "a write")
        XCTAssertFalse(two.isReleased)
        XCTAssertTrue(one.release(), "the first release frees the file")
        XCTAssertEqual(try FileManager.default.attributesOfItem(atPath: folder + "/reserve")[.size] as? Int, 0)
        usleep(150_000)
        // The disk here has room: the second daemon notices, then takes the reserve back at once.
        try two.checkRoom(for: "a write")
        XCTAssertTrue(said.value.contains { $0.hasPrefix("another daemon of the store released its reserve") }, "\(said.value)")
        XCTAssertTrue(said.value.contains { $0.contains("its reserve is in place") }, "\(said.value)")
        XCTAssertEqual(try FileManager.default.attributesOfItem(atPath: folder + "/reserve")[.size] as? Int, Int(two.size))
    }
}
