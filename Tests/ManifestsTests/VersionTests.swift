import XCTest
import UbiquityManifests

final class VersionTests: XCTestCase {
    func testCompareTable() {
        let table: [(String, String, Int)] = [
            ("1", "1", 0), ("1", "2", -1), ("2", "1", 1),
            ("1.10", "1.9", 1), ("1.9", "1.10", -1),
            ("2", "2.0", 0), ("2.0.0", "2", 0), ("2.0.1", "2", 1), ("2", "2.0.1", -1),
            ("10", "9", 1), ("01", "1", 0), ("1.01", "1.1", 0), ("007", "7.0", 0),
            ("3", "3.0.0.0.0", 0), ("0", "0.0", 0), ("1.2.3", "1.2.4", -1), ("1.3", "1.2.99", 1),
            ("99999999999999999999999", "99999999999999999999998", 1),
            ("100000000000000000000", "99999999999999999999", 1),
        ]
        for (a, b, expected) in table {
            XCTAssertEqual(compareBundleVersions(a, b), expected, "\(a) vs \(b)")
        }
    }

    func testInvalidVersionsGiveNil() {
        for bad in ["", ".", "1.", ".1", "1..2", "1.a", "a", "1.0b3", "1 ", " 1", "-1", "+1", "1,2", "１", "1.2-beta", "٣"] {
            XCTAssertNil(compareBundleVersions(bad, "1"), bad)
            XCTAssertNil(compareBundleVersions("1", bad), bad)
        }
    }
}
