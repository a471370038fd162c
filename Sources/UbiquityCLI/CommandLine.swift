// The `ubiquityfs` command line: parse, then validate, then run. Every subcommand has --help;
// a usage error prints the usage line and exits 64 (EX_USAGE).

import Foundation

public enum ExitCode {
    public static let success: Int32 = 0
    public static let failure: Int32 = 1
    public static let usage: Int32 = 64
}

struct UsageError: Error {
    var message: String
}

/// Parsed options of one subcommand: flags, options with values (repeatable), positionals.
struct Parsed: Sendable {
    var flags: Set<String> = []
    var values: [String: [String]] = [:]
    var positionals: [String] = []
    /// The arguments as given (the daemon a detaching mount starts gets the same).
    var raw: [String] = []
    func value(_ name: String) -> String? { values[name]?.last }
}

struct Subcommand: Sendable {
    let name: String
    let summary: String
    let usage: String
    /// Option name → help text; names ending in "=" take a value.
    let options: [(String, String)]
    let positionals: ClosedRange<Int>
    let run: @Sendable (Parsed) throws -> Int32

    var help: String {
        var text = "usage: ubiquityfs \(usage)\n\n\(summary)\n"
        text += "\noptions:\n"
        do {
            for (name, help) in options {
                let shown = name.hasSuffix("=") ? "\(name.dropLast()) VALUE" : name
                text += "  \(shown.padding(toLength: 30, withPad: " ", startingAt: 0)) \(help)\n"
            }
        }
        text += "  \("--help".padding(toLength: 30, withPad: " ", startingAt: 0)) show this help\n"
        return text
    }

    func parse(_ args: [String]) throws -> Parsed {
        var parsed = Parsed()
        parsed.raw = args
        let valued = Set(options.map(\.0).filter { $0.hasSuffix("=") }.map { String($0.dropLast()) })
        let plain = Set(options.map(\.0).filter { !$0.hasSuffix("=") })
        var i = 0
        while i < args.count {
            let arg = args[i]
            if arg == "--" {
                parsed.positionals += args[(i + 1)...]
                break
            }
            if arg.hasPrefix("-") && arg != "-" {
                var name = arg
                var inline: String?
                if let eq = arg.firstIndex(of: "="), arg.hasPrefix("--") {
                    name = String(arg[..<eq])
                    inline = String(arg[arg.index(after: eq)...])
                } else if arg.hasPrefix("-o") && arg.count > 2 {
                    name = "-o"
                    inline = String(arg.dropFirst(2))
                }
                if valued.contains(name) {
                    if let inline {
                        parsed.values[name, default: []].append(inline)
                    } else {
                        guard i + 1 < args.count else { throw UsageError(message: "\(name) needs a value") }
                        parsed.values[name, default: []].append(args[i + 1])
                        i += 1
                    }
                } else if plain.contains(name) && inline == nil {
                    parsed.flags.insert(name)
                } else {
                    throw UsageError(message: "unknown option \(arg)")
                }
            } else {
                parsed.positionals.append(arg)
            }
            i += 1
        }
        if !positionals.contains(parsed.positionals.count) {
            if parsed.positionals.count < positionals.lowerBound {
                throw UsageError(message: "missing argument")
            }
            throw UsageError(message: "unexpected argument \(parsed.positionals[positionals.upperBound])")
        }
        return parsed
    }
}

func writeError(_ text: String) {
    let line = text.hasSuffix("\n") ? text : text + "\n"
    _ = line.withCString { write(2, $0, strlen($0)) }
}

/// Rows as columns padded to their widest cell, two spaces apart, on stdout.
func writeTable(_ rows: [[String]]) {
    for line in formatTable(rows) { writeOut(line) }
}

/// Rows as lines of columns; control characters in a cell (a file name may hold a newline or
/// an escape sequence) are shown escaped, so each row stays one line and nothing reaches the
/// terminal as a command.
func formatTable(_ rows: [[String]]) -> [String] {
    let rows = rows.map { $0.map(escapingControlCharacters) }
    guard let first = rows.first else { return [] }
    let widths = (0..<first.count).map { c in rows.map { $0[c].count }.max() ?? 0 }
    return rows.map { row in
        row.enumerated().map { $1.padding(toLength: widths[$0], withPad: " ", startingAt: 0) }
            .joined(separator: "  ").trimmingCharacters(in: .whitespaces)
    }
}

/// `text` with C0 and C1 control characters and DEL as `\n`, `\t`, `\xNN` or `\u{NNNN}`.
func escapingControlCharacters(_ text: String) -> String {
    guard text.unicodeScalars.contains(where: { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) }) else { return text }
    var out = ""
    for u in text.unicodeScalars {
        switch u.value {
        case 0x0a: out += "\\n"
        case 0x09: out += "\\t"
        case 0..<0x20, 0x7f: out += String(format: "\\x%02x", u.value)
        case 0x80...0x9f: out += String(format: "\\u{%04x}", u.value)
        default: out.unicodeScalars.append(u)
        }
    }
    return out
}

func writeOut(_ text: String) {
    let line = text.hasSuffix("\n") ? text : text + "\n"
    _ = line.withCString { write(1, $0, strlen($0)) }
}

let subcommands: [Subcommand] = [mountCommand, unmountCommand, initStoreCommand, containersCommand, checkCommand, fsckCommand, versionsCommand,
                                 restoreCommand, resolveCommand, trashCommand, statusCommand, evictCommand, pinCommand,
                                 installCommand, uninstallCommand, installServiceCommand, uninstallServiceCommand,
                                 importCommand, exportCommand, completionCommand, manpageCommand]
func allSubcommands() -> [Subcommand] { subcommands }

let mainUsage = """
usage: ubiquityfs COMMAND [OPTIONS]

Mount the iCloud-style ubiquitous containers that app manifests (Info.plist) declare.

commands:
\(subcommands.map { "  \($0.name.padding(toLength: subcommands.map(\.name.count).max()! + 1, withPad: " ", startingAt: 0)) \($0.summary)" }.joined(separator: "\n"))

Run 'ubiquityfs COMMAND --help' for a command's options.
"""

/// Entry point: returns the process exit code.
public func runCommandLine(_ arguments: [String]) -> Int32 {
    guard let first = arguments.first else {
        writeError(mainUsage)
        return ExitCode.usage
    }
    if first == "--help" || first == "-h" || first == "help" {
        writeOut(mainUsage)
        return ExitCode.success
    }
    if first == guardArgument { return runConnectionGuard(Array(arguments.dropFirst())) }
    guard let command = subcommands.first(where: { $0.name == first }) else {
        // `mount.fuse3` (fstab, `mount -t fuse.ubiquityfs`) runs `ubiquityfs SOURCE MOUNTPOINT -o OPTS`.
        // (Only with -o, which mount.fuse3 always passes: a mistyped command is not a mount.)
        if arguments.count >= 3, !first.hasPrefix("-"), arguments.contains(where: { $0.hasPrefix("-o") }) {
            do { return runCommandLine(try mountHelperArguments(arguments)) } catch let e as UsageError {
                writeError("ubiquityfs: \(e.message)\nusage (from mount.fuse3 or fstab): ubiquityfs STORE|ubiquityfs MOUNTPOINT [-o OPTIONS]")
                return ExitCode.usage
            } catch {
                writeError("ubiquityfs: \(error)")
                return ExitCode.failure
            }
        }
        writeError("ubiquityfs: unknown command '\(first)'\n\n\(mainUsage)")
        return ExitCode.usage
    }
    let rest = Array(arguments.dropFirst())
    if rest.first == "--help" || rest.first == "-h" || rest.last == "--help" {
        writeOut(command.help)
        return ExitCode.success
    }
    do {
        return try command.run(try command.parse(rest))
    } catch let e as UsageError {
        writeError("ubiquityfs \(command.name): \(e.message)\nusage: ubiquityfs \(command.usage)")
        return ExitCode.usage
    } catch {
        writeError("ubiquityfs \(command.name): \(error)")
        return ExitCode.failure
    }
}

// MARK: - default locations (XDG)

func defaultAppsDirectory() -> String {
    let env = ProcessInfo.processInfo.environment
    if let x = env["XDG_CONFIG_HOME"], !x.isEmpty { return x + "/ubiquityfs/apps" }
    return home() + "/.config/ubiquityfs/apps"
}

func defaultStoreDirectory() -> String {
    let env = ProcessInfo.processInfo.environment
    if let x = env["XDG_DATA_HOME"], !x.isEmpty { return x + "/ubiquityfs" }
    return home() + "/.local/share/ubiquityfs"
}

/// $HOME as the XDG spec says, falling back to the password database.
func home() -> String {
    if let h = ProcessInfo.processInfo.environment["HOME"], !h.isEmpty { return h }
    return NSHomeDirectory()
}

func absolutePath(_ path: String) -> String {
    if path.hasPrefix("/") { return (path as NSString).standardizingPath }
    return ((FileManager.default.currentDirectoryPath as NSString).appendingPathComponent(path) as NSString).standardizingPath
}
