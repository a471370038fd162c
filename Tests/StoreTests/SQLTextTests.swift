// Every SQL statement the stores send is text of this program with values bound as parameters:
// no value (a name, a path, a token, anything a user or another machine gave) is ever spliced
// into SQL. This test reads the sources and fails on SQL text that interpolates or concatenates
// anything but the few constants listed here.

import Foundation
import XCTest

final class SQLTextTests: XCTestCase {
    /// What SQL text may interpolate, each a constant of this program: column lists (the
    /// version query of each store, the embedded one's one of three chosen at open), the
    /// server-clock expression, table names from a fixed list (`for table in [...]`), the schema
    /// number being migrated to, the LISTEN channel, and the pragma a test reads.
    static let constants: Set<String> = ["Self.nodeColumns", "Self.versionSelect",
                                         "versionSelect", "Self.serverMillis", "table",
                                         "version", "channel", "name"]

    nonisolated(unsafe) static let sql = try! Regex(#"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|PRAGMA|LISTEN|NOTIFY|BEGIN|COMMIT|ROLLBACK|WITH)\b"#)
    nonisolated(unsafe) static let clause = try! Regex(#"\b(FROM|WHERE|VALUES|ORDER BY|ON CONFLICT|RETURNING)\b"#)
    nonisolated(unsafe) static let interpolation = try! Regex(#"\\\(([^()]*)\)"#)
    nonisolated(unsafe) static let concatenation = try! Regex(#""\s*\+\s*[A-Za-z_(]|[A-Za-z_)\]]\s*\+\s*""#)

    /// Whether a string literal reads as SQL rather than as prose about it (a log line).
    static func looksLikeSQL(_ literal: Substring) -> Bool {
        literal.firstMatch(of: sql) != nil || literal.firstMatch(of: clause) != nil
    }

    /// One line per piece of SQL in `text` that splices in something that is not a constant;
    /// `statements` counts the lines with SQL.
    static func problems(in text: String, file: String, statements: inout Int) -> [String] {
        var out: [String] = []
        for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let code = line.components(separatedBy: " // ").first ?? ""
            let literals = code.split(separator: "\"", omittingEmptySubsequences: false).enumerated()
                .filter { $0.offset % 2 == 1 }.map(\.element).filter(looksLikeSQL)
            guard !literals.isEmpty else { continue }
            statements += 1
            let shown = "\(file):\(number + 1): \(line.trimmingCharacters(in: .whitespaces))"
            for literal in literals {
                for match in literal.matches(of: interpolation) where !constants.contains(String(match.output[1].substring ?? "")) {
                    out.append("interpolates \(literal[match.range]): \(shown)")
                }
            }
            if code.contains(concatenation) { out.append("concatenates: \(shown)") }
        }
        return out
    }

    func testNoValueIsSplicedIntoSQL() throws {
        let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Sources")
        var files: [String] = []
        var statements = 0
        var problems: [String] = []
        for module in ["UbiquityStore", "UbiquitySharedStore"] {
            for name in try FileManager.default.contentsOfDirectory(atPath: sources.path + "/" + module) where name.hasSuffix(".swift") {
                let text = try String(contentsOfFile: sources.path + "/" + module + "/" + name, encoding: .utf8)
                files.append(name)
                problems += Self.problems(in: text, file: name, statements: &statements)
            }
        }
        XCTAssertTrue(files.contains("SQLiteMetadataStore.swift") && files.contains("PostgresMetadataStore.swift"), "\(files)")
        XCTAssertGreaterThan(statements, 80, "the stores' SQL was found")
        XCTAssertEqual(problems, [])
    }

    /// The check finds what it is for, and leaves prose and bound parameters alone.
    func testTheCheckFindsSplicedValues() {
        var n = 0
        let bad = """
            try run("SELECT seq FROM changes WHERE token = '\\(token)'")
            try c.query("DELETE FROM ubiquityfs.nodes WHERE ino = " + String(ino))
            """
        XCTAssertEqual(Self.problems(in: bad, file: "bad", statements: &n).count, 2)
        let good = """
            try run("SELECT seq FROM changes WHERE token = ?1") { b in try b.text(1, token) }
            log("the store has schema version \\(version) and \\(count) nodes")
            try c.query("\\(Self.versionSelect) WHERE v.id = $1", [.int(id)])
            """
        XCTAssertEqual(Self.problems(in: good, file: "good", statements: &n), [])
    }
}
