import Foundation
import XCTest
@testable import UbiquityManifests
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Seeded fuzzing of the manifest readers: mutated XML and binary property lists, read through the
/// daemon's entry points (`ManifestParser.parse`, which `loadManifests` calls for each file, and
/// `loadManifests(directory:)` itself). Every input must finish quickly and either load or be
/// refused with one-line diagnostics that name the file; a crash kills the test process.
///
/// Seeds are fixed so that CI runs the same inputs each time and a failure repeats; every failure
/// names its seed and iteration. For local runs (CI sets none of these): UBIQUITYFS_FUZZ_SEED=N runs
/// other inputs, UBIQUITYFS_FUZZ_SCALE=N runs N times as many, UBIQUITYFS_FUZZ_ITERATION=N runs only
/// iteration N and saves it to a file (in a folder of its own, `ubiquityfs check --apps` reads it).
final class FuzzTests: XCTestCase {
    /// Per-input wall-time limit (debug build). Typical inputs take about a millisecond, so this only
    /// trips on a hang or a blowup (quadratic work, amplification).
    static let perInputLimit = 2.0
    /// Hard stop for a true hang: the watchdog aborts the process naming the input.
    static let hangLimit = 30.0
    /// Bound on each whole fuzz test, however many inputs it reads.
    static let perTestLimit = 120.0

    static let xmlMutants = 10_000
    static let binaryMutants = 10_000
    static let mutantsInOneFolder = 300

    private static var seedOverride: UInt64? {
        ProcessInfo.processInfo.environment["UBIQUITYFS_FUZZ_SEED"].flatMap { UInt64($0) }
    }

    private static var scale: Int {
        max(1, ProcessInfo.processInfo.environment["UBIQUITYFS_FUZZ_SCALE"].flatMap { Int($0) } ?? 1)
    }

    override class func setUp() {
        super.setUp()
        FuzzGuard.shared.start()
    }

    // MARK: Tests

    func testMutatedXMLManifests() {
        let corpus = Corpus.shared
        runMutants(name: "XML", seed: Self.seedOverride ?? 1, count: Self.xmlMutants * Self.scale) { rng in
            var mutator = Mutator(rng: rng, corpus: corpus.xml)
            let base = mutator.rng.pick(corpus.xml)
            let bytes = mutator.mutateXML(base.bytes)
            return (bytes, "\(base.name) " + mutator.steps.joined(separator: ", "))
        }
    }

    func testMutatedBinaryManifests() {
        let corpus = Corpus.shared
        runMutants(name: "binary", seed: Self.seedOverride ?? 2, count: Self.binaryMutants * Self.scale) { rng in
            var mutator = Mutator(rng: rng, corpus: corpus.binary)
            let base = mutator.rng.pick(corpus.binary)
            let bytes = mutator.mutateBinary(base.bytes)
            return (bytes, "\(base.name) " + mutator.steps.joined(separator: ", "))
        }
    }

    /// Every truncation of every good manifest: inside a tag, an entity, a UTF-8 sequence, the
    /// binary header, object area, offset table or trailer.
    func testEveryTruncation() {
        var failures = 0
        var count = 0
        for file in Corpus.shared.xml + Corpus.shared.binary {
            for length in 0..<file.bytes.count {
                count += 1
                let label = "\(file.name) truncated to \(length) bytes"
                if let problem = Oracle.judge(Array(file.bytes.prefix(length)), label: label), failures < 20 {
                    failures += 1
                    XCTFail(problem)
                }
            }
        }
        print("fuzz: \(count) truncations read")
    }

    /// Hand-built hostile structures, each past a limit a random mutation rarely reaches.
    func testHostileInputs() {
        let inputs = Hostile.all()
        var slowest = (seconds: 0.0, label: "")
        for (label, bytes) in inputs {
            let t0 = DispatchTime.now().uptimeNanoseconds
            if let problem = Oracle.judge(bytes, label: label) { XCTFail(problem) }
            let seconds = Double(DispatchTime.now().uptimeNanoseconds - t0) / 1e9
            if seconds > slowest.seconds { slowest = (seconds, label) }
            if ProcessInfo.processInfo.environment["UBIQUITYFS_FUZZ_VERBOSE"] != nil { print(String(format: "fuzz: %.3f s %@", seconds, label)) }
        }
        print("fuzz: \(inputs.count) hostile inputs; slowest \(String(format: "%.2f", slowest.seconds)) s: \(slowest.label)")
    }

    /// A few hundred mutants beside the good sample manifests in one folder: every good manifest still
    /// loads and registers its containers, and each bad file gets its own lines.
    func testMutantsBesideGoodManifests() throws {
        let seed = Self.seedOverride ?? 3
        let dir = TempDir()
        defer { dir.remove() }
        let samples = try FileManager.default.contentsOfDirectory(atPath: samplesAppsPath).filter { $0.hasSuffix(".plist") }.sorted()
        for name in samples {
            dir.write(name, [UInt8](try XCTUnwrap(FileManager.default.contents(atPath: samplesAppsPath + "/" + name))))
        }
        // Mutant names sort after the samples' (lower case after upper case), so on a clash of bundle
        // identifiers, containers or names the sample keeps them, as the rules say. Each mutant gets
        // bundle identifiers of its own first, so that those still valid load and are registered too.
        var mutants: [String: String] = [:]   // file name -> how it was made
        for i in 0..<Self.mutantsInOneFolder {
            var mutator = Mutator(rng: SplitMix64(seed: seed, iteration: i), corpus: Corpus.shared.xml)
            let binary = i % 2 == 1
            let base = mutator.rng.pick(binary ? Corpus.shared.binary : Corpus.shared.xml)
            mutator.corpus = binary ? Corpus.shared.binary : Corpus.shared.xml
            let own = Self.renamed(base.bytes, from: "com.example.", to: "com.fuzz\(i).")
            let bytes = binary ? mutator.mutateBinary(own) : mutator.mutateXML(own)
            let name = String(format: "zz-mutant-%04d.plist", i)
            let how = "folder fuzz seed \(seed) iteration \(i) (\(base.name) " + mutator.steps.joined(separator: ", ") + ")"
            // Alone first, so that a crash names the mutant.
            if let problem = Oracle.judge(bytes, label: how) { XCTFail(problem) }
            dir.write(name, bytes)
            mutants[name] = how
        }

        let started = DispatchTime.now().uptimeNanoseconds
        let load = FuzzGuard.shared.reading("the mutants folder of seed \(seed)") { loadManifests(directory: dir.path) }
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
        XCTAssertLessThan(seconds, Self.perInputLimit * 5, "loading \(samples.count + mutants.count) manifests")

        // The samples load exactly as they do alone, without a word about them.
        let alone = loadManifests(directory: samplesAppsPath)
        XCTAssertEqual(alone.manifests.count, samples.count)
        for expected in alone.manifests {
            let name = (expected.path as NSString).lastPathComponent
            let loaded = load.manifests.first { $0.path == dir.file(name) }
            XCTAssertEqual(loaded?.bundleIdentifier, expected.bundleIdentifier, name)
            XCTAssertEqual(loaded?.bundleVersion, expected.bundleVersion, name)
            XCTAssertEqual(loaded?.containers, expected.containers, name)
            XCTAssertEqual(load.diagnostics.filter { $0.file == dir.file(name) }.map(\.description), [], name)
        }
        // ... and their containers are registered and active (mounted).
        let registered = register(previous: [], manifests: load.manifests, applyChanges: false)
        for d in registered.diagnostics {
            XCTAssertTrue(mutants[(d.file as NSString).lastPathComponent] != nil, "registration diagnostic about a sample: \(d)")
            let path = d.file
            for problem in Oracle.problems([d], loaded: d.severity == .warning, path: path) {
                XCTFail("registration: \(mutants[(path as NSString).lastPathComponent] ?? path): \(problem)")
            }
        }
        for container in alone.manifests.flatMap(\.containers) {
            let r = registered.registrations.first { $0.identifier == container.identifier }
            XCTAssertEqual(r?.active, true, container.identifier)
            XCTAssertEqual(r?.settings, container.settings, container.identifier)
        }

        // Each mutant either loaded or has lines of its own that say why not.
        var refused = 0
        for (name, how) in mutants.sorted(by: { $0.key < $1.key }) {
            let path = dir.file(name)
            let diagnostics = load.diagnostics.filter { $0.file == path }
            let loaded = load.manifests.contains { $0.path == path }
            if !loaded { refused += 1 }
            if let problem = Oracle.problems(diagnostics, loaded: loaded, path: path).first {
                XCTFail("\(how): \(problem)")
            }
        }
        XCTAssertTrue(load.diagnostics.allSatisfy { d in mutants[(d.file as NSString).lastPathComponent] != nil },
                      "every diagnostic is about a mutant")
        XCTAssertGreaterThan(refused, Self.mutantsInOneFolder / 2, "most mutants are refused")
        XCTAssertGreaterThan(Self.mutantsInOneFolder - refused, 0, "some mutants load beside the samples")
        print("fuzz: \(mutants.count) mutants beside \(samples.count) samples in one folder, \(refused) refused, read in \(String(format: "%.2f", seconds)) s")
    }

    /// `bytes` with `from` replaced by `to` in its strings (a binary plist is written anew).
    static func renamed(_ bytes: [UInt8], from: String, to: String) -> [UInt8] {
        func rename(_ v: PlistValue) -> PlistValue {
            switch v {
            case .string(let s): return .string(s.replacingOccurrences(of: from, with: to))
            case .array(let items): return .array(items.map(rename))
            case .dictionary(let entries): return .dictionary(entries.map { (key: $0.key.replacingOccurrences(of: from, with: to), value: rename($0.value)) })
            default: return v
            }
        }
        if bytes.starts(with: Array("bplist".utf8)) {
            guard let value = try? readPropertyList(bytes).0 else { return bytes }
            return BinaryPlistWriter.write(rename(value))
        }
        return Array(String(decoding: bytes, as: UTF8.self).replacingOccurrences(of: from, with: to).utf8)
    }

    /// The good manifests themselves pass the oracle and load (else the fuzz tests prove nothing).
    func testCorpusLoads() {
        for file in Corpus.shared.xml + Corpus.shared.binary {
            var parser = ManifestParser(path: "corpus/" + file.name)
            XCTAssertNotNil(parser.parse(file.bytes), "\(file.name): \(parser.diagnostics)")
        }
        let latin1 = Corpus.shared.xml.first { $0.name == "Notes.plist (ISO-8859-1)" }
        var parser = ManifestParser(path: "latin1")
        XCTAssertEqual(latin1.flatMap { parser.parse($0.bytes) }?.containers.first?.settings.name, "Notes Café")
        XCTAssertGreaterThanOrEqual(Corpus.shared.xml.count, 4)
        XCTAssertGreaterThanOrEqual(Corpus.shared.binary.count, 4)
    }

    // MARK: Driver

    private func runMutants(name: String, seed: UInt64, count: Int,
                            make: (SplitMix64) -> (bytes: [UInt8], how: String)) {
        let started = DispatchTime.now().uptimeNanoseconds
        var failures = 0
        var loaded = 0
        var slowest = (seconds: 0.0, iteration: 0)
        var reading = 0.0
        let only = ProcessInfo.processInfo.environment["UBIQUITYFS_FUZZ_ITERATION"].flatMap { Int($0) }
        for i in only.map({ [$0] }) ?? Array(0..<count) {
            let (bytes, how) = make(SplitMix64(seed: seed, iteration: i))
            if only != nil {
                let file = NSTemporaryDirectory() + "fuzz-\(name)-\(seed)-\(i).plist"
                FileManager.default.createFile(atPath: file, contents: Data(bytes))
                FileHandle.standardError.write(Data("fuzz: \(how) saved to \(file)\n".utf8))   // unbuffered: before a crash
            }
            let label = "\(name) fuzz seed \(seed) iteration \(i) (\(how))"
            let t0 = DispatchTime.now().uptimeNanoseconds
            let verdict = Oracle.read(bytes, label: label)
            let seconds = Double(DispatchTime.now().uptimeNanoseconds - t0) / 1e9
            if seconds > slowest.seconds { slowest = (seconds, i) }
            reading += seconds
            if verdict.loaded { loaded += 1 }
            if let problem = verdict.problem {
                failures += 1
                if failures <= 20 { XCTFail(problem) }
            }
        }
        let total = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
        XCTAssertLessThan(total, Self.perTestLimit, "\(count) \(name) mutants")
        if only != nil { return }
        XCTAssertLessThan(loaded, count / 2, "most \(name) mutants are refused (else the mutator is not mutating)")
        print("fuzz: \(count) \(name) mutants (seed \(seed)) in \(String(format: "%.1f", total)) s (\(String(format: "%.1f", reading)) s reading): \(count - loaded) refused, \(loaded) loaded, \(failures) failed; slowest \(String(format: "%.3f", slowest.seconds)) s at iteration \(slowest.iteration)")
    }
}

// MARK: - PRNG

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, and the same numbers on every platform and Swift
/// version, unlike the standard library's `random(in:using:)` algorithms, which may change.
struct SplitMix64 {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    /// An independent stream per iteration, so one iteration repeats without running those before it.
    init(seed: UInt64, iteration: Int) {
        var mix = SplitMix64(seed: seed ^ (UInt64(iteration) &* 0xD1B5_4A32_D192_ED03))
        state = mix.next()
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// 0..<n (the modulo bias is irrelevant here).
    mutating func below(_ n: Int) -> Int { n <= 1 ? 0 : Int(next() % UInt64(n)) }
    mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    mutating func pick<T>(_ items: [T]) -> T { items[below(items.count)] }
    mutating func byte() -> UInt8 { UInt8(truncatingIfNeeded: next()) }
    /// Mostly small, sometimes large: 1...8 half the time, up to `max` otherwise.
    mutating func size(max: Int) -> Int { chance(50) ? 1 + below(8) : 1 + below(Swift.max(1, max)) }
}

// MARK: - Oracle

enum Oracle {
    struct Verdict {
        var loaded: Bool
        var problem: String?
    }

    /// Reads `bytes` as the daemon does for one manifest file; the problem, if any, names `label`.
    static func read(_ bytes: [UInt8], label: String) -> Verdict {
        let path = "apps/Fuzz.plist"
        let started = DispatchTime.now().uptimeNanoseconds
        var parser = ManifestParser(path: path)
        let manifest = FuzzGuard.shared.reading(label) { parser.parse(bytes) }
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
        var found = problems(parser.diagnostics, loaded: manifest != nil, path: path)
        if seconds > FuzzTests.perInputLimit {
            found.insert(String(format: "took %.2f s (limit %.0f s)", seconds, FuzzTests.perInputLimit), at: 0)
        }
        guard let first = found.first else { return Verdict(loaded: manifest != nil, problem: nil) }
        return Verdict(loaded: manifest != nil, problem: "\(label): \(first) [\(bytes.count) bytes: \(preview(bytes))]")
    }

    static func judge(_ bytes: [UInt8], label: String) -> String? { read(bytes, label: label).problem }

    /// What is wrong with a file's diagnostics, if anything.
    static func problems(_ diagnostics: [Diagnostic], loaded: Bool, path: String) -> [String] {
        var out: [String] = []
        let errors = diagnostics.filter { $0.severity == .error }
        if loaded && !errors.isEmpty { out.append("loaded despite \(errors.count) errors") }
        if !loaded && errors.isEmpty { out.append("left out without an error saying why: \(diagnostics.map(\.description))") }
        // A file that is not a property list (or not a dictionary) is one line, not one per key.
        if diagnostics.contains(where: { $0.key == nil }) && diagnostics.count != 1 {
            out.append("a file-level error is not the file's only line: \(diagnostics.map(\.description))")
        }
        for d in diagnostics {
            let line = d.description
            var shown: String { String(reflecting: String(line.prefix(300))) }
            if !line.hasPrefix(path + ": ") { out.append("the line does not start with the file: \(shown)") }
            if line.unicodeScalars.contains(where: isLineBreak) { out.append("more than one line: \(shown)") }
            if d.message.trimmingCharacters(in: .whitespaces).isEmpty { out.append("empty message: \(shown)") }
            if d.severity == .error && d.fix.isEmpty { out.append("an error without what to do: \(shown)") }
            if line.utf8.count > 2_000 { out.append("a line of \(line.utf8.count) bytes: \(shown)") }
            if line.contains("Optional(") || line.contains("Error Domain=") || line.contains("PlistReadError") {
                out.append("a debug description in the line: \(shown)")
            }
        }
        return out
    }

    static func isLineBreak(_ s: Unicode.Scalar) -> Bool {
        switch s.value {
        case 0x0A, 0x0B, 0x0C, 0x0D, 0x85, 0x2028, 0x2029: return true
        default: return false
        }
    }

    /// Start of the input, printable, for the failure message.
    static func preview(_ bytes: [UInt8]) -> String {
        String(reflecting: String(decoding: bytes.prefix(80), as: UTF8.self))
    }
}

// MARK: - Crash and hang reporting

/// A crash ends the test process with no XCTest message, so keep the current input's label where a
/// signal handler can print it; and abort with that label when one input runs past `hangLimit`.
final class FuzzGuard: @unchecked Sendable {
    static let shared = FuzzGuard()

    private let lock = NSLock()
    private var label = ""
    private var since: UInt64 = 0   // 0: not reading
    private var started = false

    func start() {
        lock.lock()
        defer { lock.unlock() }
        guard !started else { return }
        started = true
        installCrashHandlers()
        let thread = Thread { [self] in
            while true {
                Thread.sleep(forTimeInterval: 0.25)
                lock.lock()
                let (label, since) = (self.label, self.since)
                lock.unlock()
                if since != 0, Double(DispatchTime.now().uptimeNanoseconds - since) / 1e9 > FuzzTests.hangLimit {
                    let message = "\nfuzz: HANG: \(label) has run for over \(Int(FuzzTests.hangLimit)) s; stopping\n"
                    FileHandle.standardError.write(Data(message.utf8))
                    crashTextLength = 0   // the abort is no crash of the reader
                    abort()
                }
            }
        }
        thread.start()
    }

    func reading<T>(_ label: String, _ body: () -> T) -> T {
        setCrashText("\nfuzz: CRASH while reading \(label)\n")
        lock.lock()
        (self.label, since) = (label, DispatchTime.now().uptimeNanoseconds)
        lock.unlock()
        defer {
            lock.lock()
            since = 0
            lock.unlock()
            crashTextLength = 0
        }
        return body()
    }
}

private let crashTextCapacity = 1024
nonisolated(unsafe) private let crashText = UnsafeMutablePointer<CChar>.allocate(capacity: crashTextCapacity)
nonisolated(unsafe) private var crashTextLength = 0
nonisolated(unsafe) private let previousActions = UnsafeMutablePointer<sigaction>.allocate(capacity: 65)

private func setCrashText(_ s: String) {
    let bytes = Array(s.utf8.prefix(crashTextCapacity))
    bytes.withUnsafeBufferPointer { b in
        UnsafeMutableRawPointer(crashText).copyMemory(from: b.baseAddress!, byteCount: b.count)
    }
    crashTextLength = bytes.count
}

/// Prints the label, puts back the previous handler (Swift's backtracer) and returns: the faulting
/// instruction runs again and that handler reports it as usual.
private let crashHandler: @convention(c) (Int32) -> Void = { signal in
    if crashTextLength > 0 { _ = write(2, crashText, crashTextLength) }
    _ = sigaction(signal, previousActions + Int(signal), nil)
}

private func installCrashHandlers() {
    // A stack overflow's SIGSEGV needs a stack of its own to run the handler on.
    var current = stack_t()
    if sigaltstack(nil, &current) == 0, current.ss_flags & Int32(SS_DISABLE) != 0 {
        let size = 1 << 16
        var alternate = stack_t(ss_sp: UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16), ss_flags: 0, ss_size: size)
        _ = sigaltstack(&alternate, nil)
    }
    for signal in [SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE, SIGABRT] {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = crashHandler
        action.sa_flags = Int32(SA_ONSTACK)
        _ = sigaction(signal, &action, previousActions + Int(signal))
    }
}

// MARK: - Corpus

/// The good manifests mutants start from: the samples, and each in the other format, written both by
/// the tests' order-keeping writer and by Foundation's.
final class Corpus: Sendable {
    struct File: Sendable {
        let name: String
        let bytes: [UInt8]
    }

    static let shared = Corpus()

    let xml: [File]
    let binary: [File]

    private init() {
        var xml: [File] = []
        var binary: [File] = []
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: samplesAppsPath)) ?? []).filter { $0.hasSuffix(".plist") }.sorted()
        for name in names {
            guard let data = FileManager.default.contents(atPath: samplesAppsPath + "/" + name) else { continue }
            let bytes = [UInt8](data)
            if bytes.starts(with: Array("bplist".utf8)) { binary.append(File(name: name, bytes: bytes)) } else { xml.append(File(name: name, bytes: bytes)) }
            if let value = try? readPropertyList(bytes).0 {
                binary.append(File(name: name + " (test writer)", bytes: BinaryPlistWriter.write(value)))
            }
            if let object = try? PropertyListSerialization.propertyList(from: data, options: [], format: nil) {
                if let b = try? PropertyListSerialization.data(fromPropertyList: object, format: .binary, options: 0) {
                    binary.append(File(name: name + " (Foundation binary)", bytes: [UInt8](b)))
                }
                if let x = try? PropertyListSerialization.data(fromPropertyList: object, format: .xml, options: 0) {
                    xml.append(File(name: name + " (Foundation XML)", bytes: [UInt8](x)))
                }
            }
        }
        // The XML reader's other encodings: UTF-16 with a byte order mark, and a declared ISO-8859-1.
        if let notes = xml.first(where: { $0.name == "Notes.plist" }) {
            let text = String(decoding: notes.bytes, as: UTF8.self)
            let utf16 = text.replacingOccurrences(of: "encoding=\"UTF-8\"", with: "encoding=\"UTF-16\"")
            xml.append(File(name: "Notes.plist (UTF-16LE)", bytes: [0xFF, 0xFE] + utf16.utf16.flatMap { [UInt8($0 & 0xFF), UInt8($0 >> 8)] }))
            xml.append(File(name: "Notes.plist (UTF-16BE)", bytes: [0xFE, 0xFF] + utf16.utf16.flatMap { [UInt8($0 >> 8), UInt8($0 & 0xFF)] }))
            let latin1 = text.replacingOccurrences(of: "encoding=\"UTF-8\"", with: "encoding=\"ISO-8859-1\"")
                .replacingOccurrences(of: "<string>Notes</string>\n\t\t\t<key>", with: "<string>Notes Café</string>\n\t\t\t<key>")
            xml.append(File(name: "Notes.plist (ISO-8859-1)", bytes: latin1.unicodeScalars.map { UInt8(truncatingIfNeeded: $0.value) }))
        }
        // One with several containers, $(…) references, a UTF-16 name and a long dictionary.
        let containers = containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER).Zeta", settingsXML(name: "<string>Café ☕ $(PRODUCT_NAME:upper)</string>", levels: "<string>One</string>"))
            + containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)", settingsXML(isPublic: "<false/>", name: nil, levels: nil))
            + (0..<16).map { containerXML("iCloud.com.x.Foo.S\($0)", settingsXML(name: "<string>S\($0)</string>")) }.joined()
        let multi = appXML(name: "Multi", containers: containers,
                           extra: "<key>Numbers</key><array><integer>-7</integer><real>2.5</real><data>AAEC</data><date>2024-01-01T00:00:00Z</date></array>\n")
        xml.append(File(name: "multi (generated)", bytes: Array(multi.utf8)))
        if case .dictionary(var entries)? = try? readPropertyList(Array(multi.utf8)).0 {
            entries.removeAll { $0.key == "Numbers" }   // the test writer writes no dates
            entries.append((key: "Numbers", value: .array([.integer(-7), .integer(1 << 40), .real(2.5), .data([0, 1, 2])])))
            binary.append(File(name: "multi (test writer)", bytes: BinaryPlistWriter.write(.dictionary(entries))))
        }
        self.xml = xml
        self.binary = binary
    }
}

// MARK: - Mutations

struct Mutator {
    var rng: SplitMix64
    var corpus: [Corpus.File]
    /// What was done, for the failure message.
    private(set) var steps: [String] = []

    init(rng: SplitMix64, corpus: [Corpus.File]) {
        self.rng = rng
        self.corpus = corpus
    }

    // MARK: XML

    static let xmlTokens: [String] = [
        "<dict>", "</dict>", "<array>", "</array>", "<key>", "</key>", "<string>", "</string>", "<true/>", "<false/>",
        "<integer>", "</integer>", "<real>", "</real>", "<data>", "</data>", "<date>", "</date>", "<plist>", "</plist>",
        "<dict/>", "<array/>", "<string/>", "<key/>", "<plist version=\"1.0\">", "<x>", "</x>", "<ns:dict>", "<dict a='1' a='2'>",
        "<!DOCTYPE plist [<!ENTITY e \"ent\">]>", "&e;", "&amp;", "&lt;", "&gt;", "&quot;", "&#0;", "&#x0;", "&#xD800;",
        "&#1114112;", "&#x10FFFF;", "&#65;", "&#x1F600;", "&undefined;", "&", "&#", "&#x;",
        "<!DOCTYPE plist [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;\"><!ENTITY c \"&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;\"><!ENTITY d \"&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;\">]>",
        "&d;", "<!DOCTYPE plist [<!ENTITY r \"&r;\">]>", "&r;",
        "<!DOCTYPE plist [<!ENTITY z SYSTEM \"/dev/zero\">]>", "&z;", "<!DOCTYPE plist SYSTEM \"/dev/zero\">",
        "<!DOCTYPE plist [<!ENTITY % p SYSTEM \"/dev/zero\"> %p;]>",
        "<![CDATA[x]]>", "<![CDATA[<dict>]]>", "<![CDATA[", "]]>", "<!--", "-->", "<!-- c -->", "<?pi x?>",
        "<?xml version=\"1.0\"?>", "<?xml version=\"1.1\" encoding=\"UTF-16\"?>", "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>",
        "\0", "\n", "\r", "\r\n", "\u{2028}", "\u{85}", "\u{0B}", "\t", " ", "\u{FEFF}", "\u{FFFE}", "\u{FFFF}", "\u{1F600}", "é", "e\u{301}",
        "$(", "$()", "$(PRODUCT_NAME)", "$(PRODUCT_BUNDLE_IDENTIFIER)", "$(PRODUCT_NAME:lower:rfc1034identifier)", "$(X:bogus)",
        "$(\n)", "$(A\nB)", "$(PRODUCT_NAME:lo\nwer)", "$(CFBundleVersion)", "$(NSUbiquitousContainers)", ")",
        "99999999999999999999999999", "-9223372036854775809", "-9223372036854775808", "18446744073709551616",
        "0x", "0xFFFFFFFFFFFFFFFFF", "-0x8000000000000000", "1e999", "-1e-999", "nan", "inf", "+", "-", "0",
        "iCloud.", "iCloud.com.example.Notes", "com.example.Notes", "None", "One", "Any", "YES", "/", ".", "..",
        "CFBundleIdentifier", "CFBundleVersion", "CFBundleName", "NSUbiquitousContainers", "NSUbiquitousContainerName",
        "NSUbiquitousContainerIsDocumentScopePublic", "NSUbiquitousContainerSupportedFolderLevels",
    ]

    static let byteTokens: [[UInt8]] = [
        [0xFF], [0xFE], [0x80], [0xC0, 0xAF], [0xC3], [0xE2, 0x82], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80],
        [0xF8, 0x88, 0x80, 0x80, 0x80], [0xEF, 0xBB, 0xBF], [0xFE, 0xFF], [0xFF, 0xFE], [0x00, 0x00, 0xFE, 0xFF], [0x00], [0x1B],
    ]

    static let encodings = ["UTF-16", "UTF-16LE", "UTF-16BE", "UTF-32", "ISO-8859-1", "US-ASCII", "ASCII", "EBCDIC", "Shift_JIS",
                            "bogus", "", "UTF-8", "utf8", "UTF-7", "ISO-2022-JP", "windows-1252"]

    static let tagNames = ["dict", "array", "key", "string", "integer", "real", "date", "data", "true", "false", "plist", "x", "DICT", "key2", ""]

    mutating func mutateXML(_ input: [UInt8]) -> [UInt8] {
        var b = input
        for _ in 0..<(1 + rng.below(3)) {
            switch rng.below(19) {
            case 0, 1: flipBits(&b)
            case 2: setBytes(&b)
            case 3: truncate(&b)
            case 4: deleteRange(&b)
            case 5: insertRandomBytes(&b)
            case 6: duplicateRange(&b)
            case 7: splice(&b)
            case 8: swapTags(&b)
            case 9: renameTag(&b)
            case 10, 11: insertToken(&b)
            case 12: replaceText(&b)
            case 13: nest(&b)
            case 14: hugeValue(&b)
            case 15: insertBytesToken(&b)
            case 16: changeEncoding(&b)
            case 17: repeatElement(&b)
            default: insertToken(&b)
            }
        }
        return b
    }

    // MARK: Binary

    mutating func mutateBinary(_ input: [UInt8]) -> [UInt8] {
        var b = input
        for _ in 0..<(1 + rng.below(3)) {
            switch rng.below(18) {
            case 0, 1: flipBits(&b)
            case 2: setBytes(&b)
            case 3: truncate(&b)
            case 4: deleteRange(&b)
            case 5: insertRandomBytes(&b)
            case 6: duplicateRange(&b)
            case 7: splice(&b)
            case 8, 9: trailerField(&b)
            case 10: offsetEntry(&b)
            case 11, 12: marker(&b)
            case 13: lengthField(&b)
            case 14, 15: objectRef(&b)
            case 16: intSize(&b)
            default: restructure(&b)
            }
        }
        return b
    }

    // MARK: Byte-level

    private mutating func position(_ b: [UInt8]) -> Int { rng.below(b.count + 1) }

    /// Positions worth cutting or inserting at: markup and entity characters, multi-byte sequences,
    /// and for binary files the header, offset table and trailer.
    private mutating func interestingPosition(_ b: [UInt8]) -> Int {
        if b.isEmpty || rng.chance(30) { return position(b) }
        if b.starts(with: Array("bplist".utf8)), b.count > 40 {
            switch rng.below(4) {
            case 0: return rng.below(9)                                   // in the header
            case 1: return b.count - 32 + rng.below(33)                    // in the trailer
            case 2: if let layout = BinaryLayout(b) { return layout.tableOffset + rng.below(layout.numObjects * layout.offsetSize + 1) }
            default: if let layout = BinaryLayout(b) { return rng.pick(layout.offsets) + rng.below(3) }
            }
            return position(b)
        }
        for _ in 0..<32 {
            let i = rng.below(b.count)
            if Self.special[Int(b[i])] { return i + rng.below(2) }
        }
        return position(b)
    }

    /// Markup, entity and reference characters, and the bytes of multi-byte UTF-8 sequences.
    private static let special: [Bool] = (0...255).map { Array("<>&;/\"[]$()=".utf8).contains(UInt8($0)) || $0 >= 0x80 }

    private mutating func flipBits(_ b: inout [UInt8]) {
        guard !b.isEmpty else { return }
        let n = 1 + rng.below(4)
        for _ in 0..<n { b[rng.below(b.count)] ^= 1 << UInt8(rng.below(8)) }
        steps.append("flip \(n) bits")
    }

    private mutating func setBytes(_ b: inout [UInt8]) {
        guard !b.isEmpty else { return }
        let interesting: [UInt8] = [0, 0x01, 0x0A, 0x0D, 0x20, 0x22, 0x26, 0x2F, 0x3C, 0x3E, 0x7F, 0x80, 0xBF, 0xC0, 0xEF, 0xF0, 0xFE, 0xFF]
        let i = rng.below(b.count)
        b[i] = rng.chance(50) ? rng.pick(interesting) : rng.byte()
        steps.append("set byte \(i) to 0x\(String(b[i], radix: 16))")
    }

    private mutating func truncate(_ b: inout [UInt8]) {
        let i = min(interestingPosition(b), b.count)
        b.removeSubrange(i...)
        steps.append("truncate at \(i)")
    }

    private mutating func deleteRange(_ b: inout [UInt8]) {
        guard !b.isEmpty else { return }
        let i = rng.below(b.count)
        let n = min(rng.size(max: b.count / 2), b.count - i)
        b.removeSubrange(i..<(i + n))
        steps.append("delete \(n) at \(i)")
    }

    private mutating func insertRandomBytes(_ b: inout [UInt8]) {
        let i = min(interestingPosition(b), b.count)
        let n = rng.size(max: 64)
        b.insert(contentsOf: (0..<n).map { _ in rng.byte() }, at: i)
        steps.append("insert \(n) random bytes at \(i)")
    }

    private mutating func duplicateRange(_ b: inout [UInt8]) {
        guard !b.isEmpty else { return }
        let i = rng.below(b.count)
        let n = min(rng.size(max: b.count), b.count - i)
        let at = position(b)
        let copies = rng.chance(90) ? 1 : 1 + rng.below(200)
        let chunk = Array(b[i..<(i + n)])
        b.insert(contentsOf: repeated(chunk, copies), at: at)
        steps.append("copy \(n) bytes from \(i) to \(at) \(copies) times")
    }

    private mutating func splice(_ b: inout [UInt8]) {
        let other = rng.pick(corpus)
        let i = position(b)
        let j = rng.below(other.bytes.count + 1)
        b = Array(b.prefix(i)) + Array(other.bytes.dropFirst(j))
        steps.append("splice at \(i) with \(other.name) from \(j)")
    }

    // MARK: XML-aware

    /// Ranges of `<…>` tags.
    private func tags(_ b: [UInt8]) -> [Range<Int>] {
        var out: [Range<Int>] = []
        var start: Int?
        for (i, c) in b.enumerated() {
            if c == UInt8(ascii: "<") { start = i } else if c == UInt8(ascii: ">"), let s = start { out.append(s..<(i + 1)); start = nil }
        }
        return out
    }

    /// Ranges of text between `>` and `<`.
    private func texts(_ b: [UInt8]) -> [Range<Int>] {
        var out: [Range<Int>] = []
        var start: Int?
        for (i, c) in b.enumerated() {
            if c == UInt8(ascii: ">") { start = i + 1 } else if c == UInt8(ascii: "<"), let s = start { out.append(s..<i); start = nil }
        }
        return out
    }

    private mutating func swapTags(_ b: inout [UInt8]) {
        let t = tags(b)
        guard t.count >= 2 else { return flipBits(&b) }
        var x = rng.pick(t), y = rng.pick(t)
        if x.lowerBound > y.lowerBound { swap(&x, &y) }
        guard x.upperBound <= y.lowerBound else { return }
        let (bx, by) = (Array(b[x]), Array(b[y]))
        b.replaceSubrange(y, with: bx)
        b.replaceSubrange(x, with: by)
        steps.append("swap tags at \(x.lowerBound) and \(y.lowerBound)")
    }

    private mutating func renameTag(_ b: inout [UInt8]) {
        let t = tags(b)
        guard let tag = t.isEmpty ? nil : rng.pick(t) else { return flipBits(&b) }
        let inner = b[tag]
        let closing = inner.dropFirst().first == UInt8(ascii: "/")
        let selfClosing = inner.dropLast().last == UInt8(ascii: "/")
        let name = rng.pick(Self.tagNames)
        let replacement = "<" + (closing ? "/" : "") + name + (selfClosing ? "/" : "") + ">"
        b.replaceSubrange(tag, with: Array(replacement.utf8))
        steps.append("tag at \(tag.lowerBound) to \(replacement)")
    }

    private mutating func insertToken(_ b: inout [UInt8]) {
        let i = min(interestingPosition(b), b.count)
        let token = rng.pick(Self.xmlTokens)
        b.insert(contentsOf: Array(token.utf8), at: i)
        steps.append("insert \(String(reflecting: token).prefix(40)) at \(i)")
    }

    private mutating func insertBytesToken(_ b: inout [UInt8]) {
        let i = rng.chance(20) ? 0 : min(interestingPosition(b), b.count)
        let token = rng.pick(Self.byteTokens)
        if rng.chance(50), i < b.count {
            b.replaceSubrange(i..<min(b.count, i + token.count), with: token)
        } else {
            b.insert(contentsOf: token, at: i)
        }
        steps.append("bytes \(token.map { String($0, radix: 16) }) at \(i)")
    }

    private mutating func replaceText(_ b: inout [UInt8]) {
        let t = texts(b).filter { !$0.isEmpty }
        guard let range = t.isEmpty ? nil : rng.pick(t) else { return insertToken(&b) }
        let replacement: [UInt8]
        switch rng.below(4) {
        case 0: replacement = Array(rng.pick(Self.xmlTokens).utf8)
        case 1: replacement = Array(b[rng.pick(t)])
        case 2: replacement = (0..<rng.size(max: 40)).map { _ in rng.byte() }
        default: replacement = []
        }
        b.replaceSubrange(range, with: replacement)
        steps.append("text at \(range.lowerBound) replaced (\(replacement.count) bytes)")
    }

    private mutating func nest(_ b: inout [UInt8]) {
        let depths = [2, 3, 511, 512, 513, 600, 5_000, 100_000]
        // The deepest nesting is a 1.5 MB file: rarely, to keep the run short.
        let depth = rng.chance(3) ? 100_000 : rng.pick(Array(depths.dropLast()))
        let pairs: [(String, String)] = [("<array>", "</array>"), ("<dict><key>k</key>", "</dict>"), ("<plist>", "</plist>"), ("<x>", "</x>"),
                                         ("<array><string>s</string>", "</array>")]
        let (open, close) = rng.pick(pairs)
        let balanced = rng.chance(80)
        let text = String(repeating: open, count: depth) + "<true/>" + (balanced ? String(repeating: close, count: depth) : "")
        let boundaries = tags(b).map(\.upperBound)
        let at = boundaries.isEmpty ? position(b) : rng.pick(boundaries)
        b.insert(contentsOf: Array(text.utf8), at: at)
        steps.append("nest \(open) \(depth) deep\(balanced ? "" : " unclosed") at \(at)")
    }

    private mutating func hugeValue(_ b: inout [UInt8]) {
        let t = texts(b).filter { !$0.isEmpty }
        guard let range = t.isEmpty ? nil : rng.pick(t) else { return insertToken(&b) }
        let values = [
            "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
            "18446744073709551615", "18446744073709551616", "0xFFFFFFFFFFFFFFFF", "0x10000000000000000",
            "1.7976931348623157e308", "1e309", "-1e309", "4.9e-324", "1e-400", "NaN", "-inf", "0.0000000001",
            String(repeating: "9", count: 1 + rng.below(5_000)),
            "1." + String(repeating: "0", count: 1 + rng.below(1_000)) + "1",
            String(repeating: "1.", count: 1 + rng.below(1_000)) + "1",
            String(repeating: "A", count: 256),
            String(repeating: "$(PRODUCT_NAME)", count: 1 + rng.below(300)),
            "0001.00002.0", "1." + String(repeating: "9", count: 40),
        ]
        let value = rng.pick(values)
        b.replaceSubrange(range, with: Array(value.utf8))
        steps.append("value at \(range.lowerBound) to \(String(reflecting: value).prefix(40))")
    }

    private mutating func changeEncoding(_ b: inout [UInt8]) {
        let encoding = rng.pick(Self.encodings)
        let declaration = Array("<?xml version=\"1.0\" encoding=\"\(encoding)\"?>".utf8)
        if let end = b.firstIndex(of: UInt8(ascii: ">")), b.starts(with: Array("<?xml".utf8)) {
            b.replaceSubrange(0...end, with: declaration)
        } else {
            b.insert(contentsOf: declaration, at: 0)
        }
        // With a byte that is not UTF-8 somewhere, to see the reader's answer to the mismatch.
        if rng.chance(70), b.count > declaration.count {
            let i = declaration.count + rng.below(b.count - declaration.count)
            b.insert(contentsOf: rng.pick(Self.byteTokens), at: i)
        }
        steps.append("encoding \(encoding)")
    }

    /// Many copies of one element: wide dictionaries and arrays.
    private mutating func repeatElement(_ b: inout [UInt8]) {
        let t = tags(b)
        guard t.count >= 2 else { return duplicateRange(&b) }
        let i = rng.below(t.count - 1)
        let range = t[i].lowerBound..<t[i + 1].upperBound
        let copies = rng.chance(90) ? 2 + rng.below(50) : 1_000 + rng.below(20_000)
        let chunk = Array(b[range])
        b.insert(contentsOf: repeated(chunk, copies), at: range.upperBound)
        steps.append("repeat \(chunk.count) bytes at \(range.lowerBound) \(copies) times")
    }

    // MARK: Binary-aware

    static let interestingUInt64: [UInt64] = [0, 1, 2, 7, 8, 9, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x1_0000, 0x7FFF_FFFF, 0x8000_0000,
                                              0xFFFF_FFFF, 0x1_0000_0000, UInt64(Int64.max), UInt64(Int64.max) + 1, UInt64.max, UInt64.max - 1,
                                              UInt64.max / 2 / 8 + 1]

    private mutating func interestingValue(_ layout: BinaryLayout?, size: Int = 8) -> UInt64 {
        var values = Self.interestingUInt64
        if let l = layout {
            values += [UInt64(l.numObjects), UInt64(l.numObjects - 1), UInt64(l.numObjects + 1), UInt64(l.tableOffset),
                       UInt64(l.count), UInt64(l.count - 32), UInt64(l.count + 1)]
        }
        let v = rng.chance(80) ? rng.pick(values) : rng.next()
        return size >= 8 ? v : v & ((1 << UInt64(size * 8)) - 1)
    }

    private mutating func write(_ v: UInt64, size: Int, at position: Int, in b: inout [UInt8]) {
        for k in 0..<size where position + k >= 0 && position + k < b.count {
            b[position + k] = UInt8(truncatingIfNeeded: v >> UInt64(8 * (size - 1 - k)))
        }
    }

    private mutating func trailerField(_ b: inout [UInt8]) {
        guard let layout = BinaryLayout(b) else { return flipBits(&b) }
        let t = b.count - 32
        switch rng.below(5) {
        case 0:
            b[t + 6] = UInt8(rng.pick([0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 255]))
            steps.append("offset size \(b[t + 6])")
        case 1:
            b[t + 7] = UInt8(rng.pick([0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 255]))
            steps.append("ref size \(b[t + 7])")
        default:
            let field = rng.below(3)
            let v = interestingValue(layout)
            write(v, size: 8, at: t + 8 + 8 * field, in: &b)
            steps.append("\(["object count", "top object", "table offset"][field]) \(v)")
        }
    }

    private mutating func offsetEntry(_ b: inout [UInt8]) {
        guard let layout = BinaryLayout(b) else { return flipBits(&b) }
        let j = rng.below(layout.numObjects)
        let v: UInt64 = rng.chance(50) ? UInt64(rng.pick(layout.offsets)) : interestingValue(layout, size: layout.offsetSize)
        write(v, size: layout.offsetSize, at: layout.tableOffset + j * layout.offsetSize, in: &b)
        steps.append("offset of object \(j) to \(v)")
    }

    private mutating func marker(_ b: inout [UInt8]) {
        guard let layout = BinaryLayout(b) else { return flipBits(&b) }
        let markers: [UInt8] = [0x00, 0x08, 0x09, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x17, 0x1F, 0x22, 0x23, 0x24, 0x2F, 0x33, 0x34,
                                0x3F, 0x40, 0x4F, 0x50, 0x5F, 0x60, 0x6F, 0x70, 0x80, 0x8F, 0xA0, 0xA1, 0xAF, 0xB0, 0xC1, 0xCF, 0xD0, 0xD1,
                                0xDF, 0xE0, 0xF0, 0xFF]
        let j = rng.below(layout.numObjects)
        let o = layout.offsets[j]
        guard o < b.count else { return }
        let old = b[o]
        b[o] = rng.chance(70) ? rng.pick(markers) : (rng.chance(50) ? (old & 0xF0) | UInt8(rng.below(16)) : rng.byte())
        steps.append("marker of object \(j) 0x\(String(old, radix: 16)) to 0x\(String(b[o], radix: 16))")
    }

    /// An extended length (marker low nibble 0xF, then an integer object) with a huge or odd value.
    private mutating func lengthField(_ b: inout [UInt8]) {
        guard let layout = BinaryLayout(b) else { return flipBits(&b) }
        let j = rng.below(layout.numObjects)
        let o = layout.offsets[j]
        guard o + 2 < b.count else { return }
        let sizeLog = rng.chance(80) ? rng.below(4) : rng.below(16)
        b[o] = (b[o] & 0xF0) | 0x0F
        b[o + 1] = 0x10 | UInt8(sizeLog)
        let size = min(1 << sizeLog, 8)
        let v = interestingValue(layout, size: size)
        write(v, size: size, at: o + 2, in: &b)
        steps.append("length of object \(j) to \(v) in \(1 << sizeLog) bytes")
    }

    /// A reference inside an array or dictionary: to itself (a cycle), its first object, out of range.
    private mutating func objectRef(_ b: inout [UInt8]) {
        guard let layout = BinaryLayout(b) else { return flipBits(&b) }
        let collections = layout.offsets.indices.filter { layout.offsets[$0] < b.count && [0xA, 0xC, 0xD].contains(b[layout.offsets[$0]] >> 4) }
        guard let j = collections.isEmpty ? nil : rng.pick(collections) else { return marker(&b) }
        let o = layout.offsets[j]
        var p = o + 1
        var n = Int(b[o] & 0x0F)
        if n == 0x0F, p + 1 < b.count {   // extended length: int marker then the value
            let size = 1 << Int(b[p] & 0x0F)
            n = Int(clamping: min(BinaryLayout.readUInt(b, at: p + 1, size: min(size, 8)) ?? 0, UInt64(b.count)))
            p += 1 + size
        }
        let refCount = (b[o] >> 4 == 0xD ? 2 : 1) * n
        guard refCount > 0 else { return marker(&b) }
        let k = rng.below(refCount)
        let targets: [UInt64] = [UInt64(j), UInt64(layout.topObject), 0, UInt64(layout.numObjects), UInt64(layout.numObjects - 1),
                                 interestingValue(layout, size: layout.refSize), UInt64(rng.below(layout.numObjects))]
        let v = rng.pick(targets) & (layout.refSize >= 8 ? UInt64.max : (1 << UInt64(layout.refSize * 8)) - 1)
        write(v, size: layout.refSize, at: p + k * layout.refSize, in: &b)
        steps.append("ref \(k) of object \(j) to \(v)")
    }

    private mutating func intSize(_ b: inout [UInt8]) {
        guard let layout = BinaryLayout(b) else { return flipBits(&b) }
        let ints = layout.offsets.filter { $0 < b.count && [0x1, 0x2, 0x3].contains(b[$0] >> 4) }
        guard let o = ints.isEmpty ? nil : rng.pick(ints) else { return marker(&b) }
        b[o] = (b[o] & 0xF0) | UInt8(rng.below(16))
        if rng.chance(50) { write(rng.pick(Self.interestingUInt64), size: 8, at: o + 1, in: &b) }
        steps.append("number at \(o) to marker 0x\(String(b[o], radix: 16))")
    }

    /// Rewrites the object graph: deep chains, cycles, many references to one object, a DAG that
    /// doubles at each level, huge counts. Offsets stay valid, so the reader gets past the trailer.
    private mutating func restructure(_ b: inout [UInt8]) {
        let kind = rng.below(5)
        let refSize = 4
        func ref(_ k: Int) -> [UInt8] { BinaryLayout.bigEndian(UInt64(k), size: refSize) }
        var objects: [[UInt8]] = []
        switch kind {
        case 0:   // chain of one-element arrays or dictionaries
            let depth = rng.pick([2, 511, 512, 513, 5_000])
            let dict = rng.chance(50)
            for k in 0..<depth {
                if dict { objects.append([0xD1] + ref(depth + 1) + ref(k + 1)) } else { objects.append([0xA1] + ref(k + 1)) }
            }
            objects.append([0x09])
            objects.append([0x51, 0x6B])   // "k"
            steps.append("chain \(depth) deep\(dict ? " of dictionaries" : "")")
        case 1:   // cycle through n collections
            let n = 1 + rng.below(4)
            for k in 0..<n { objects.append([0xA1] + ref((k + 1) % n)) }
            steps.append("cycle of \(n)")
        case 2:   // DAG: each level two references to the next
            let levels = rng.pick([10, 20, 30, 40, 64])
            for k in 0..<levels { objects.append([0xA2] + ref(k + 1) + ref(k + 1)) }
            objects.append([0x5F, 0x10, 0x40] + Array(repeating: UInt8(ascii: "x"), count: 64))
            steps.append("doubling DAG \(levels) levels")
        case 3:   // one array with many references to one large string or data object
            // (Hostile.all() has the million-reference versions.)
            let refs = rng.pick([10, 1_000, 20_000])
            let size = rng.pick([10, 1_000, 20_000])
            objects.append([0xAF, 0x12] + BinaryLayout.bigEndian(UInt64(refs), size: 4) + repeated(ref(1), refs))
            objects.append([rng.chance(50) ? 0x5F : 0x4F, 0x12] + BinaryLayout.bigEndian(UInt64(size), size: 4) + Array(repeating: UInt8(ascii: "a"), count: size))
            steps.append("\(refs) references to one \(size)-byte object")
        default:  // a manifest dictionary whose containers all share one settings object and one key
            let n = rng.pick([10, 1_000, 20_000])
            // 0: top dict, 1..4: keys, 5: id, 6: version, 7: containers, 8: container key, 9: settings
            objects.append([0xD3] + ref(1) + ref(2) + ref(3) + ref(5) + ref(6) + ref(7))
            objects.append([0x5F, 0x10, 18] + Array("CFBundleIdentifier".utf8))
            objects.append([0x5F, 0x10, 15] + Array("CFBundleVersion".utf8))
            objects.append([0x5F, 0x10, 22] + Array("NSUbiquitousContainers".utf8))
            objects.append([0x5F, 0x10, 25] + Array("NSUbiquitousContainerName".utf8))
            objects.append([0x59] + Array("com.x.Foo".utf8))
            objects.append([0x51, UInt8(ascii: "1")])
            objects.append([0xDF, 0x12] + BinaryLayout.bigEndian(UInt64(n), size: 4)
                           + repeated(ref(8), n) + repeated(ref(9), n))
            objects.append([0x5F, 0x10, 16] + Array("iCloud.com.x.Foo".utf8))
            objects.append([0xD1] + ref(4) + ref(6))
            steps.append("\(n) containers sharing one key and settings")
        }
        b = BinaryLayout.build(objects: objects, top: 0, refSize: refSize)
    }
}

/// `chunk` `count` times over (by doubling: quick even in a debug build).
func repeated(_ chunk: [UInt8], _ count: Int) -> [UInt8] {
    guard count > 0 else { return [] }
    var out = chunk
    out.reserveCapacity(chunk.count * count)
    while out.count * 2 <= chunk.count * count { out += out }
    out += out.prefix(chunk.count * count - out.count)
    return out
}

// MARK: - Binary plist layout (tests only)

/// The trailer and offset table of a `bplist00` file, when they are in range.
struct BinaryLayout {
    let count: Int
    let offsetSize: Int
    let refSize: Int
    let numObjects: Int
    let topObject: Int
    let tableOffset: Int
    let offsets: [Int]

    init?(_ b: [UInt8]) {
        guard b.count >= 41, b.starts(with: Array("bplist".utf8)) else { return nil }
        let t = b.count - 32
        count = b.count
        offsetSize = Int(b[t + 6])
        refSize = Int(b[t + 7])
        guard (1...8).contains(offsetSize), (1...8).contains(refSize),
              let n = Self.readUInt(b, at: t + 8, size: 8), let top = Self.readUInt(b, at: t + 16, size: 8),
              let table = Self.readUInt(b, at: t + 24, size: 8),
              n > 0, n < 1 << 24, top < n, table < UInt64(t), UInt64(t) - table >= n * UInt64(offsetSize) else { return nil }
        numObjects = Int(n)
        topObject = Int(top)
        tableOffset = Int(table)
        var offsets: [Int] = []
        for i in 0..<numObjects {
            guard let o = Self.readUInt(b, at: tableOffset + i * offsetSize, size: offsetSize), o < UInt64(t) else { return nil }
            offsets.append(Int(o))
        }
        self.offsets = offsets
    }

    static func readUInt(_ b: [UInt8], at p: Int, size: Int) -> UInt64? {
        guard p >= 0, size <= 8, p + size <= b.count else { return nil }
        return b[p..<(p + size)].reduce(0) { $0 << 8 | UInt64($1) }
    }

    static func bigEndian(_ v: UInt64, size: Int) -> [UInt8] { BinaryPlistWriter.bigEndian(v, size: size) }

    /// Lays out objects (references already encoded with `refSize` bytes) with 4-byte offsets.
    static func build(objects: [[UInt8]], top: Int, refSize: Int) -> [UInt8] {
        var out = Array("bplist00".utf8)
        var offsets: [Int] = []
        for o in objects {
            offsets.append(out.count)
            out += o
        }
        let table = out.count
        for o in offsets { out += bigEndian(UInt64(o), size: 4) }
        out += [0, 0, 0, 0, 0, 0, 4, UInt8(refSize)] + bigEndian(UInt64(objects.count), size: 8) + bigEndian(UInt64(top), size: 8)
            + bigEndian(UInt64(table), size: 8)
        return out
    }
}

// MARK: - Hostile structures

/// Inputs built to reach a limit: each must be refused (or read) quickly, with one clear line.
enum Hostile {
    static func all() -> [(String, [UInt8])] {
        var out: [(String, [UInt8])] = []
        func xml(_ label: String, _ text: String) { out.append(("hostile XML: " + label, Array(text.utf8))) }

        let depth = 100_000
        xml("100,000 nested arrays", appXML(extra: "<key>Deep</key>" + String(repeating: "<array>", count: depth) + String(repeating: "</array>", count: depth)))
        xml("100,000 nested dictionaries", appXML(extra: "<key>Deep</key>" + String(repeating: "<dict><key>k</key>", count: depth) + "<true/>" + String(repeating: "</dict>", count: depth)))
        xml("100,000 unclosed arrays", appXML(extra: "<key>Deep</key>" + String(repeating: "<array>", count: depth)))
        xml("100,000 nested unknown elements", plistXML(String(repeating: "<x>", count: depth) + String(repeating: "</x>", count: depth)))
        xml("50,000 entries in the top dictionary", appXML(extra: (0..<50_000).map { "<key>k\($0)</key><true/>" }.joined()))
        xml("100,000 items in an array", appXML(extra: "<key>Wide</key><array>" + String(repeating: "<true/>", count: 100_000) + "</array>"))
        xml("a 5 MB string", appXML(extra: "<key>Big</key><string>" + String(repeating: "a", count: 5_000_000) + "</string>"))
        xml("300,000 entity references in one string", appXML(extra: "<key>Big</key><string>" + String(repeating: "&amp;", count: 300_000) + "</string>"))
        xml("200,000 CDATA sections in one string", appXML(extra: "<key>Big</key><string>" + String(repeating: "<![CDATA[x]]>", count: 200_000) + "</string>"))
        xml("billion laughs", "<?xml version=\"1.0\"?><!DOCTYPE plist [<!ENTITY a \"aaaaaaaaaa\">"
            + (1...9).map { "<!ENTITY \(Character(UnicodeScalar(UInt8(97 + $0)))) \"" + String(repeating: "&\(Character(UnicodeScalar(UInt8(96 + $0))));", count: 10) + "\">" }.joined()
            + "]><plist><dict><key>CFBundleName</key><string>&j;</string></dict></plist>")
        xml("external entity /dev/zero", "<?xml version=\"1.0\"?><!DOCTYPE plist [<!ENTITY z SYSTEM \"/dev/zero\">]><plist><dict><key>CFBundleName</key><string>&z;</string></dict></plist>")
        xml("external DTD /dev/zero", "<?xml version=\"1.0\"?><!DOCTYPE plist SYSTEM \"/dev/zero\"><plist><dict/></plist>")
        xml("parameter entity /dev/zero", "<?xml version=\"1.0\"?><!DOCTYPE plist [<!ENTITY % p SYSTEM \"/dev/zero\"> %p;]><plist><dict/></plist>")
        xml("a 1 MB integer", appXML(extra: "<key>N</key><integer>" + String(repeating: "9", count: 1_000_000) + "</integer>"))
        xml("a 1 MB real", appXML(extra: "<key>N</key><real>1." + String(repeating: "1", count: 1_000_000) + "</real>"))
        xml("a 1 MB bundle identifier", appXML(id: String(repeating: "a b", count: 300_000)))
        xml("a 1 MB version", appXML(version: String(repeating: "1.", count: 500_000) + "x"))
        xml("a 1 MB container key", appXML(containers: containerXML(String(repeating: "x\n", count: 500_000))))
        xml("a 1 MB unknown container setting", appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(extra: "<key>" + String(repeating: "x", count: 1_000_000) + "</key><true/>"))))
        xml("a $(…) chain through 20,000 keys",
            appXML(name: "$(K0)", extra: (0..<20_000).map { "<key>K\($0)</key><string>$(K\($0 + 1))</string>" }.joined() + "<key>K20000</key><string>end</string>"))
        xml("a $(…) cycle through 20,000 keys",
            appXML(name: "$(K0)", extra: (0..<20_000).map { "<key>K\($0)</key><string>$(K\(($0 + 1) % 20_000))</string>" }.joined()))
        xml("$(…) doubling through 64 keys",
            appXML(name: "$(K0)", extra: (0..<64).map { "<key>K\($0)</key><string>$(K\($0 + 1))$(K\($0 + 1))</string>" }.joined() + "<key>K64</key><string>ab</string>"))
        xml("CFBundleName from a 1 MB value",
            appXML(name: "$(BIG)", extra: "<key>BIG</key><string>" + String(repeating: "n", count: 1_000_000) + "</string>"))
        xml("10,000 containers named after a 2 MB CFBundleName",
            appXML(name: String(repeating: "n", count: 2_000_000),
                   containers: (0..<10_000).map { "<key>iCloud.com.x.Foo.C\($0)</key><dict/>" }.joined()))
        xml("5,000 containers named $(PRODUCT_NAME) of 1 MB",
            appXML(name: String(repeating: "n", count: 1_000_000),
                   containers: (0..<5_000).map { "<key>iCloud.com.x.Foo.C\($0)</key><dict><key>NSUbiquitousContainerName</key><string>$(PRODUCT_NAME)</string></dict>" }.joined()))
        xml("5,000 bad containers", appXML(containers: (0..<5_000).map { containerXML("iCloud.com.y.C\($0)") }.joined()))
        xml("a 1 MB $(…) reference", appXML(name: "$(" + String(repeating: "A", count: 1_000_000) + ")"))
        xml("a 1 MB unclosed $(", appXML(name: "$(" + String(repeating: "A", count: 1_000_000)))
        xml("200,000 modifiers", appXML(name: "x", containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$(PRODUCT_NAME" + String(repeating: ":lower", count: 200_000) + ")</string>"))))

        func binary(_ label: String, _ objects: [[UInt8]], refSize: Int = 4) {
            out.append(("hostile binary: " + label, BinaryLayout.build(objects: objects, top: 0, refSize: refSize)))
        }
        func ref(_ k: Int) -> [UInt8] { BinaryLayout.bigEndian(UInt64(k), size: 4) }
        binary("100,000 nested arrays", (0..<100_000).map { [0xA1] + ref($0 + 1) } + [[0x08]])
        binary("a cycle of 3", [[0xA1] + ref(1), [0xA1] + ref(2), [0xA1] + ref(0)])
        binary("a DAG doubling 64 times", (0..<64).map { [0xA2] + ref($0 + 1) + ref($0 + 1) } + [[0x51, 0x78]])
        binary("a DAG doubling 64 times through dictionaries", (0..<64).map { [0xD2] + ref(65) + ref(66) + ref($0 + 1) + ref($0 + 1) } + [[0x51, 0x78], [0x51, 0x61], [0x51, 0x62]])
        binary("1,000,000 references to a 4 MB string",
               [[0xAF, 0x12] + BinaryLayout.bigEndian(1_000_000, size: 4) + repeated(ref(1), 1_000_000),
                [0x5F, 0x12] + BinaryLayout.bigEndian(4_000_000, size: 4) + Array(repeating: UInt8(ascii: "a"), count: 4_000_000)])
        binary("1,000,000 references to 4 MB of data",
               [[0xAF, 0x12] + BinaryLayout.bigEndian(1_000_000, size: 4) + repeated(ref(1), 1_000_000),
                [0x4F, 0x12] + BinaryLayout.bigEndian(4_000_000, size: 4) + Array(repeating: 0, count: 4_000_000)])
        binary("1,000,000 references to a 2 MB UTF-16 string",
               [[0xAF, 0x12] + BinaryLayout.bigEndian(1_000_000, size: 4) + repeated(ref(1), 1_000_000),
                [0x6F, 0x12] + BinaryLayout.bigEndian(1_000_000, size: 4) + repeated([0x00, 0xE9], 1_000_000)])
        binary("a top dictionary of 1,000,000 entries with one 1 MB key",
               [[0xDF, 0x12] + BinaryLayout.bigEndian(1_000_000, size: 4) + repeated(ref(1), 1_000_000)
                    + repeated(ref(2), 1_000_000),
                [0x5F, 0x12] + BinaryLayout.bigEndian(1_000_000, size: 4) + Array(repeating: UInt8(ascii: "k"), count: 1_000_000),
                [0x09]])
        for (label, value) in [("NaN", Double.nan), ("infinity", Double.infinity), ("-1e300", -1e300), ("1e300", 1e300), ("greatest", Double.greatestFiniteMagnitude)] {
            binary("the date \(label)", [[0xD1] + ref(1) + ref(2), [0x51, 0x64], [0x33] + BinaryLayout.bigEndian(value.bitPattern, size: 8)])
        }
        binary("a 16-byte integer", [[0xD1] + ref(1) + ref(2), [0x51, 0x64], [0x14] + Array(repeating: 0xFF, count: 16)])
        binary("a length of 2^63", [[0x5F, 0x13] + BinaryLayout.bigEndian(1 << 63, size: 8)])
        binary("an array count of 2^62", [[0xAF, 0x13] + BinaryLayout.bigEndian(1 << 62, size: 8)])
        binary("a dictionary count of 2^61", [[0xDF, 0x13] + BinaryLayout.bigEndian(1 << 61, size: 8)])
        binary("a UTF-16 count of 2^62", [[0x6F, 0x13] + BinaryLayout.bigEndian(1 << 62, size: 8)])
        var trailer = BinaryLayout.build(objects: [[0x08]], top: 0, refSize: 8)
        for (field, value) in [(8, UInt64.max), (16, UInt64.max), (24, UInt64.max), (8, UInt64(Int64.max)), (24, 1 << 63)] {
            var b = trailer
            let t = b.count - 32
            b.replaceSubrange((t + field)..<(t + field + 8), with: BinaryLayout.bigEndian(value, size: 8))
            out.append(("hostile binary: trailer field \(field) = \(value)", b))
        }
        trailer[trailer.count - 26] = 8   // offsets 8 bytes wide, pointing past the end
        out.append(("hostile binary: 8-byte offsets", trailer))
        return out
    }
}
