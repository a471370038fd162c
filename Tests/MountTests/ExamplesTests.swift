// Runs the examples of docs/SEMANTICS.md: every ```console block, in order, on one fresh mount of
// the sample manifests, from the mount's root. A line `$ COMMAND` runs COMMAND with bash; the lines
// after it, up to the next command, are what it must print (standard output and error together).

import Foundation
import XCTest

final class ExamplesTests: MountTestCase {
    struct Step { var command: String; var output: [String]; var line: Int }

    static func examples(in text: String) -> [[Step]] {
        var blocks: [[Step]] = []
        var current: [Step]?
        for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init).enumerated() {
            if line == "```console" { current = []; continue }
            guard var steps = current else { continue }
            if line == "```" {
                blocks.append(steps)
                current = nil
                continue
            }
            if line.hasPrefix("$ ") {
                steps.append(Step(command: String(line.dropFirst(2)), output: [], line: number + 1))
            } else if !steps.isEmpty {
                steps[steps.count - 1].output.append(line)
            }
            current = steps
        }
        return blocks
    }

    func testTheExamplesOfSemanticsHold() throws {
        let text = try String(contentsOfFile: Self.packageRoot + "/docs/SEMANTICS.md", encoding: .utf8)
        let blocks = Self.examples(in: text)
        XCTAssertGreaterThanOrEqual(blocks.count, 4, "SEMANTICS.md has its examples")
        try mount()
        var env = environment
        env["LC_ALL"] = "C"
        for block in blocks {
            for step in block {
                let r = Command.run(["bash", "-c", "cd \(shellQuote(mountPoint)) && { \(step.command); } 2>&1"],
                                    timeout: 60, environment: env)
                let got = r.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
                XCTAssertEqual(got.last == "" ? Array(got.dropLast()) : got, step.output,
                               "SEMANTICS.md line \(step.line): $ \(step.command)")
            }
        }
        try unmount()
    }
}
