// Seeded reference-model test (after mountpoint-s3's tests/reftests): random operation sequences
// run against the filesystem model and against a trivial in-memory model (path → folder or file
// bytes), compared step by step: each result (bytes or errno), the tree (names, kinds, sizes, link
// counts) after every step, and every file's content every few steps and after each reopen or
// crash. A mismatch names the seed and the step and prints the last operations.
//
// Operations: create, write at random offsets (past EOF, across the 1 MiB chunk boundary),
// truncate, read, mkdir, rename (plain, RENAME_NOREPLACE, RENAME_EXCHANGE), unlink, rmdir, link,
// handles held open across steps (write/read/truncate/fsync/close through them), idle publish,
// reopening the filesystem (clean), and a crash (the filesystem object is dropped with handles
// open: held files fall back to what was last published, or, if fsync'ed since, keep what they
// hold); `rm -rf`, and Recently Deleted's
// restore, empty one item and empty all. Unlink of a last name and rmdir go to the model's
// Recently Deleted, whose listing (where each item was) and files' content are compared too.
//
// With a second writer (another daemon on the same store), about a third of the path operations
// go through it instead, and a change-feed thread applies each writer's batches to the other
// while operations run, as the daemons' change feeds do. (Operations through the second writer
// keep off files the first holds open with changes of its own: what becomes of those is the
// conflict handling's, which a single-file reference cannot express.)

import Foundation
import XCTest
import UbiquityFileSystem
import UbiquityStore

/// SplitMix64: small, fast, deterministic.
struct SplitMix64 {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
    /// Uniform in 0..<n.
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(max(n, 1))) }
    mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    mutating func pick<T>(_ items: [T]) -> T { items[below(items.count)] }
    mutating func bytes(_ n: Int) -> [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(n + 8)
        while out.count < n { withUnsafeBytes(of: next()) { out.append(contentsOf: $0) } }
        return Array(out.prefix(n))
    }
}

/// The reference: paths relative to Documents ("" is Documents), folders and files by id.
struct ReferenceModel {
    /// Folders have ids too: what a folder brings back from Recently Deleted depends on which
    /// folder it is (Documents is folder 0).
    enum Node: Equatable {
        case dir(Int), file(Int)
        var isDir: Bool { if case .dir = self { return true } else { return false } }
    }
    var nodes: [String: Node] = [:]
    var files: [Int: [UInt8]] = [:]
    /// What each file's content was at its last publish (what a crash falls back to).
    var published: [Int: [UInt8]] = [:]
    /// Files an fsync made durable since their last publish: a crash keeps what they hold then.
    var synced: Set<Int> = []
    /// Files written or truncated since their last publish (an fsync of any other syncs nothing).
    var changed: Set<Int> = []
    var nextID = 1
    let maxDepth: Int?

    init(maxDepth: Int?) { self.maxDepth = maxDepth }

    static func parts(_ p: String) -> [String] { p.split(separator: "/").map(String.init) }
    static func parent(_ p: String) -> String { parts(p).dropLast().joined(separator: "/") }
    static func depth(_ p: String) -> Int { parts(p).count }
    static func join(_ a: String, _ b: String) -> String { a.isEmpty ? b : a + "/" + b }
    static func isWithin(_ p: String, _ root: String) -> Bool { p == root || p.hasPrefix(root + "/") }

    func node(_ p: String) -> Node? { p.isEmpty ? .dir(0) : nodes[p] }
    var sortedPaths: [String] { nodes.keys.sorted() }
    var folders: [String] { [""] + sortedPaths.filter { nodes[$0].isDir } }

    /// errno of walking (lookup by lookup) to the parent of `p`; nil if the walk succeeds (the
    /// parent may still be a file).
    func walkError(_ p: String) -> Int32? {
        var cur = ""
        for c in Self.parts(p).dropLast() {
            guard node(cur).isDir else { return ENOTDIR }
            cur = Self.join(cur, c)
            guard node(cur) != nil else { return ENOENT }
        }
        return nil
    }

    /// errno of resolving `p` itself.
    func resolveError(_ p: String) -> Int32? {
        if let e = walkError(p) { return e }
        if !node(Self.parent(p)).isDir { return ENOTDIR }
        return node(p) == nil ? ENOENT : nil
    }

    func children(_ dir: String) -> [String] {
        nodes.keys.filter { Self.parent($0) == dir && !$0.isEmpty }.map { Self.parts($0).last! }.sorted()
    }
    func subtree(_ p: String) -> [String] { nodes.keys.filter { Self.isWithin($0, p) } }
    func height(_ dir: String) -> Int {
        subtree(dir).filter { nodes[$0].isDir }.map { Self.depth($0) - Self.depth(dir) }.max() ?? 0
    }
    func names(of id: Int) -> Int { nodes.values.filter { $0 == .file(id) }.count }

    mutating func newFile() -> Int {
        defer { nextID += 1 }
        files[nextID] = []
        published[nextID] = []
        return nextID
    }

    /// Drop a file that has no name, no open handle and is not in Recently Deleted.
    mutating func collect(_ id: Int, held: Int) {
        if names(of: id) == 0 && held == 0 && !trash.contains(where: { $0.node == .file(id) }) {
            files[id] = nil
            published[id] = nil
            synced.remove(id)
            changed.remove(id)
        }
    }

    // MARK: Recently Deleted

    /// An item of Recently Deleted: what it is, the folder it was deleted from and its name there.
    struct TrashEntry: Equatable { var node: Node; var parent: Int; var name: String }
    /// Recently Deleted, oldest first.
    var trash: [TrashEntry] = []
    var nextFolder = 1
    mutating func newFolder() -> Int { defer { nextFolder += 1 }; return nextFolder }

    func folderID(_ p: String) -> Int? { if case .dir(let id)? = node(p) { return id } else { return nil } }
    func path(ofFolder id: Int) -> String? { id == 0 ? "" : nodes.first { $0.value == .dir(id) }?.key }
    func trashIndex(ofFolder id: Int) -> Int? { trash.firstIndex { $0.node == .dir(id) } }

    /// `p` (a file's last name, or an empty folder) goes to Recently Deleted.
    mutating func moveToTrash(_ p: String) {
        trash.append(TrashEntry(node: nodes[p]!, parent: folderID(Self.parent(p))!, name: Self.parts(p).last!))
        nodes[p] = nil
    }

    /// Where `e` was, as `ubiquityfs trash list` shows it: below where its folder is now (in
    /// Recently Deleted too), `?` once that folder is gone.
    func originalPath(_ e: TrashEntry, container: String) -> String {
        if let up = trashIndex(ofFolder: e.parent) { return originalPath(trash[up], container: container) + "/" + e.name }
        guard let folder = path(ofFolder: e.parent) else { return "?/" + e.name }
        return (folder.isEmpty ? container : container + "/" + folder) + "/" + e.name
    }

    /// Put `trash[i]` back into its folder (Documents if that is gone), after the folder alone
    /// if it is in Recently Deleted too, as `name 2` if the name is taken; a folder brings back
    /// what was deleted from it, newest first (unless `withChildren` is false).
    mutating func restore(_ i: Int, withChildren: Bool = true) {
        let e = trash[i]
        if let up = trashIndex(ofFolder: e.parent) { restore(up, withChildren: false) }
        let target = path(ofFolder: e.parent) ?? ""
        let name = Self.freeName(e.name) { nodes[Self.join(target, $0)] != nil }
        trash.removeAll { $0 == e }
        nodes[Self.join(target, name)] = e.node
        if withChildren, case .dir(let id) = e.node {
            while let child = trash.lastIndex(where: { $0.parent == id }) { restore(child) }
        }
    }

    /// `name`, or `name 2`, `name 3`, … before any extension (iCloud's rule) while taken.
    static func freeName(_ name: String, taken: (String) -> Bool) -> String {
        guard taken(name) else { return name }
        var stem = name, ext = ""
        if let dot = name.lastIndex(of: "."), dot != name.startIndex { stem = String(name[..<dot]); ext = String(name[dot...]) }
        var n = 2
        while taken("\(stem) \(n)\(ext)") { n += 1 }
        return "\(stem) \(n)\(ext)"
    }

    mutating func move(_ from: String, to: String) {
        let moved = subtree(from).map { ($0, nodes[$0]!) }
        for (k, _) in moved { nodes[k] = nil }
        for (k, v) in moved { nodes[to + k.dropFirst(from.count)] = v }
    }

    static func write(_ bytes: [UInt8], at offset: Int, into file: inout [UInt8]) {
        if file.count < offset + bytes.count { file += [UInt8](repeating: 0, count: offset + bytes.count - file.count) }
        file.replaceSubrange(offset..<(offset + bytes.count), with: bytes)
    }
    static func resize(_ file: inout [UInt8], to size: Int) {
        if size < file.count { file.removeSubrange(size...) } else { file += [UInt8](repeating: 0, count: size - file.count) }
    }
}

extension Optional where Wrapped == ReferenceModel.Node {
    var isDir: Bool { self?.isDir ?? false }
}

enum Outcome: Equatable, CustomStringConvertible {
    case ok
    case fail(Int32)
    case data([UInt8])

    var description: String {
        switch self {
        case .ok: return "ok"
        case .fail(let e): return errnoName(e)
        case .data(let d):
            var h: UInt64 = 0xcbf2_9ce4_8422_2325
            for x in d { h = (h ^ UInt64(x)) &* 0x100_0000_01b3 }
            return "\(d.count) bytes (fnv \(String(h, radix: 16)))"
        }
    }
}

enum Operation: CustomStringConvertible {
    case create(String)
    case write(String, Int, [UInt8])
    case truncate(String, Int)
    case read(String, Int, Int)
    case mkdir(String)
    case rename(String, String, RenameFlags)
    case unlink(String)
    case rmdir(String)
    case link(String, String)
    case hold(String)
    case writeHeld(Int, Int, [UInt8])
    case readHeld(Int, Int, Int)
    case truncateHeld(Int, Int)
    case fsyncHeld(Int)
    case closeHeld(Int)
    case publishIdle
    case reopen
    case crash
    /// The k-th item of Recently Deleted, newest first (modulo its count).
    case trashRestore(Int)
    case trashEmpty(Int)
    case trashEmptyAll
    /// `rm -rf`: a folder's files unlinked and its folders removed, depth first, by name.
    case removeTree(String)

    var description: String {
        switch self {
        case .create(let p): return "create \(p)"
        case .write(let p, let o, let d): return "write \(p) at \(o), \(d.count) bytes"
        case .truncate(let p, let s): return "truncate \(p) to \(s)"
        case .read(let p, let o, let n): return "read \(p) at \(o), \(n) bytes"
        case .mkdir(let p): return "mkdir \(p)"
        case .rename(let a, let b, let f):
            return "rename \(a) → \(b)" + (f.contains(.noReplace) ? " NOREPLACE" : "") + (f.contains(.exchange) ? " EXCHANGE" : "")
        case .unlink(let p): return "unlink \(p)"
        case .rmdir(let p): return "rmdir \(p)"
        case .link(let a, let b): return "link \(a) → \(b)"
        case .hold(let p): return "open and hold \(p)"
        case .writeHeld(let i, let o, let d): return "write held #\(i) at \(o), \(d.count) bytes"
        case .readHeld(let i, let o, let n): return "read held #\(i) at \(o), \(n) bytes"
        case .truncateHeld(let i, let s): return "ftruncate held #\(i) to \(s)"
        case .fsyncHeld(let i): return "fsync held #\(i)"
        case .closeHeld(let i): return "close held #\(i)"
        case .publishIdle: return "publishIdle"
        case .reopen: return "reopen (clean)"
        case .crash: return "crash (drop the filesystem with handles open) and reopen"
        case .trashRestore(let k): return "trash restore item \(k) (newest first)"
        case .trashEmpty(let k): return "trash empty item \(k) (newest first)"
        case .trashEmptyAll: return "trash empty"
        case .removeTree(let p): return "rm -rf \(p)"
        }
    }
}

/// One seeded run against one container's Documents in the drive view.
final class ReferenceRun {
    let seed: UInt64
    let container: ContainerInfo
    let steps: Int
    var rng: SplitMix64
    var model: ReferenceModel
    /// Opens the backing store (again, after a reopen or crash: the memory store hands back the
    /// same objects, the embedded store reopens its folder).
    let openStore: () throws -> BackingStore
    var store: BackingStore!
    var fs: UbiquityFileSystem!
    var docs: UInt64 = 0
    /// The second writer, if the run has one, and how to open its store (its own work area on
    /// the same store).
    let openSecond: (() throws -> BackingStore)?
    var other: UbiquityFileSystem?
    var otherDocs: UInt64 = 0
    let feed = ChangeFeedThread()
    /// Handles held open across steps: fs handle and inode, model file id.
    var held: [(handle: UInt64, ino: UInt64, id: Int)] = []
    var history: [String] = []
    /// How often each outcome came up (printed at the end, to show the run exercised errors too).
    var tally: [String: Int] = [:]
    static let names = ["a", "b", "c", "d", "e"]

    init(seed: UInt64, container: ContainerInfo, steps: Int, openStore: (() throws -> BackingStore)? = nil,
         secondWriter: Bool = false) {
        let memory = makeMemoryStore()
        self.openStore = openStore ?? { memory }
        if secondWriter {
            openSecond = openStore ?? {
                BackingStore(metadata: memory.metadata, blobs: memory.blobs, work: MemoryWorkArea(), locks: memory.locks)
            }
        } else {
            openSecond = nil
        }
        self.seed = seed
        self.container = container
        self.steps = steps
        rng = SplitMix64(seed: seed)
        model = ReferenceModel(maxDepth: container.maxDepth)
    }

    private func open() throws {
        // The feed thread lets go of the old filesystem before it goes (a crash drops it).
        try feed.pausing {
            fs = nil
            store = nil   // the embedded store's lock is free once nothing holds it
            store = try openStore()
            fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
            fs.idlePublishNanoseconds = 0
            docs = try fs.ino(container.name)
            if let openSecond, other == nil {
                let second = try UbiquityFileSystem(store: try openSecond(), containers: Sample.all, view: .drive, device: "other")
                other = second
                otherDocs = try second.ino(container.name)
            }
            feed.writers = [fs] + (other.map { [$0] } ?? [])
        }
    }

    /// The writer an operation goes through, and its Documents folder.
    private func writer(_ viaOther: Bool) -> (UbiquityFileSystem, UInt64) {
        viaOther ? (other!, otherDocs) : (fs, docs)
    }

    /// Whether `op` may go through the second writer: a path operation that leaves alone the
    /// files the first holds open (see the file's comment).
    private func eligibleForOther(_ op: Operation) -> Bool {
        let heldIDs = Set(held.map(\.id))
        func isHeld(_ p: String) -> Bool {
            if case .file(let id)? = model.node(p) { return heldIDs.contains(id) }
            return false
        }
        switch op {
        case .create(let p), .write(let p, _, _), .truncate(let p, _), .read(let p, _, _), .unlink(let p):
            return !isHeld(p)
        case .removeTree(let p): return !model.subtree(p).contains { isHeld($0) }
        case .rename(_, let dst, let flags): return flags.contains(.exchange) || !isHeld(dst)
        case .mkdir, .rmdir, .link: return true
        // (Emptying through the other would delete for good a file held open here.)
        case .trashRestore, .trashEmpty, .trashEmptyAll: return held.isEmpty
        default: return false
        }
    }

    /// nil when the whole run matched; otherwise what went wrong, with seed, step and history.
    func run() -> String? {
        do { try open() } catch { return "seed \(seed): cannot open: \(error)" }
        if other != nil { feed.start() }
        defer {
            feed.stop()
            other = nil
        }
        for step in 1...steps {
            let op = generate()
            // Drawn only in runs with a second writer, so single-writer seeds keep their sequences.
            let viaOther = other != nil && eligibleForOther(op) && rng.chance(35)
            history.append("\(step): \(op)" + (viaOther ? " (through the second writer)" : ""))
            let expected = applyToModel(op)
            var got: Outcome
            do {
                let (w, wDocs) = writer(viaOther)
                // What the change feed would have applied by now (a lookup walks this writer's view).
                do { try w.catchUp() } catch { return report(step, op, "catching up failed: \(error)") }
                got = applyToFS(op, on: w, docs: wDocs)
                // A writer's last commits reach the store for others when its group of commits
                // does (within ~2 ms, or at its next read of the change log, as here).
                if viaOther { do { try w.catchUp() } catch { return report(step, op, "catching up failed: \(error)") } }
            }
            switch op {
            case .reopen: got = restart(crash: false)
            case .crash: got = restart(crash: true)
            default: break
            }
            if viaOther { tally["through the second writer", default: 0] += 1 }
            switch op {
            case .trashRestore where expected == .ok: tally["trash restores", default: 0] += 1
            case .removeTree where expected == .ok: tally["rm -rf", default: 0] += 1
            default: break
            }
            tally[expected.description.hasSuffix(")") ? "data" : expected.description, default: 0] += 1
            if expected != got {
                return report(step, op, "expected \(expected), got \(got)")
            }
            let full: Bool
            switch op {
            case .reopen, .crash: full = true
            default: full = step % 15 == 0 || step == steps
            }
            do { try fs.catchUp() } catch { return report(step, op, "catching up failed: \(error)") }
            if let problem = compareTrees(contents: full, on: fs, docs: docs) { return report(step, op, problem) }
            // The second writer sees the same, once nothing is held open here with changes it
            // cannot see yet.
            if let other, full, held.isEmpty {
                do { try other.catchUp() } catch { return report(step, op, "catching up failed: \(error)") }
                if let problem = compareTrees(contents: true, on: other, docs: otherDocs) {
                    return report(step, op, "through the second writer: " + problem)
                }
            }
        }
        for h in held { try? fs.release(handle: h.handle) }
        fs = nil
        store = nil
        print("reference run seed 0x\(String(seed, radix: 16)) in \(container.name): \(steps) steps, outcomes "
              + tally.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        return nil
    }

    private func report(_ step: Int, _ op: Operation, _ problem: String) -> String {
        "seed \(seed) (0x\(String(seed, radix: 16))), step \(step), \(container.name) (levels \(container.folderLevels)): "
            + "\(op): \(problem)\nlast operations:\n  " + history.suffix(15).joined(separator: "\n  ")
    }

    // MARK: generating

    private func existingPath() -> String? {
        let paths = model.sortedPaths
        return paths.isEmpty ? nil : rng.pick(paths)
    }

    /// A path to operate on: mostly an existing one, sometimes a random (maybe missing) one.
    private func anyPath() -> String {
        if rng.chance(75), let p = existingPath() { return p }
        return randomPath()
    }

    /// A path for a data operation: mostly an existing file.
    private func filePath() -> String {
        let files = model.sortedPaths.filter { !model.nodes[$0].isDir }
        if rng.chance(75), !files.isEmpty { return rng.pick(files) }
        return anyPath()
    }

    /// A path that may not exist yet: mostly a new name in an existing folder.
    private func newPath() -> String {
        if rng.chance(70) { return ReferenceModel.join(rng.pick(model.folders), rng.pick(Self.names)) }
        return randomPath()
    }

    private func randomPath() -> String {
        (0..<(1 + rng.below(3))).map { _ in rng.pick(Self.names) }.joined(separator: "/")
    }

    private func offset(size: Int) -> Int {
        switch rng.below(100) {
        case 0..<45: return rng.below(4096)
        case 45..<70: return rng.below(size + 1)
        case 70..<88: return size + rng.below(9000)            // past EOF: a hole before the data
        default: return chunkSize - 3000 + rng.below(6000)     // across the first chunk boundary
        }
    }

    private func length() -> Int { rng.chance(90) ? 1 + rng.below(3000) : 1 + rng.below(70_000) }

    private func size(of path: String) -> Int {
        if case .file(let id)? = model.node(path) { return model.files[id]?.count ?? 0 }
        return 0
    }

    private func generate() -> Operation {
        let r = rng.below(1070)
        switch r {
        case 0..<110: return .create(newPath())
        case 110..<270:
            let p = filePath()
            return .write(p, offset(size: size(of: p)), rng.bytes(length()))
        case 270..<340:
            let p = filePath()
            let s = size(of: p)
            let choices = [rng.below(8192), max(0, s - rng.below(4000)), s + rng.below(4000), chunkSize - 2000 + rng.below(4000)]
            return .truncate(p, rng.pick(choices))
        case 340..<440:
            let p = filePath()
            return .read(p, rng.chance(80) ? rng.below(size(of: p) + 10) : offset(size: size(of: p)), rng.below(6000))
        case 440..<540: return .mkdir(newPath())
        case 540..<650:
            let flags: RenameFlags = rng.chance(80) ? [] : rng.chance(50) ? .noReplace : .exchange
            return .rename(anyPath(), rng.chance(50) ? anyPath() : newPath(), flags)
        case 650..<710: return .unlink(anyPath())
        case 710..<770: return .rmdir(anyPath())
        case 770..<830: return .link(filePath(), newPath())
        case 830..<860 where held.count < 4: return .hold(filePath())
        case 860..<975 where !held.isEmpty:
            let i = rng.below(held.count)
            let s = model.files[held[i].id]?.count ?? 0
            switch rng.below(10) {
            case 0..<4: return .writeHeld(i, offset(size: s), rng.bytes(length()))
            case 4..<6: return .readHeld(i, rng.below(s + 10), rng.below(6000))
            case 6: return .truncateHeld(i, rng.chance(50) ? rng.below(s + 1) : s + rng.below(5000))
            case 7: return .fsyncHeld(i)
            default: return .closeHeld(i)
            }
        case 975..<983: return .publishIdle
        case 983..<993: return .reopen
        case 993..<1000: return .crash
        case 1000..<1030: return .trashRestore(rng.below(8))
        case 1030..<1042: return .trashEmpty(rng.below(8))
        case 1042..<1044: return .trashEmptyAll
        case 1044..<1070: return .removeTree(rng.chance(80) ? rng.pick(model.folders.filter { !$0.isEmpty } + [anyPath()]) : anyPath())
        default: return .create(newPath())
        }
    }

    // MARK: the model

    private func heldCount(_ id: Int) -> Int { held.filter { $0.id == id }.count }

    /// A path operation on a file ended with no handle left open: the file was published.
    private func publishedIfClosed(_ id: Int) {
        if heldCount(id) == 0 { published(id) }
    }

    /// `id` was published: a crash falls back to what it holds now.
    private func published(_ id: Int) {
        model.published[id] = model.files[id]
        model.synced.remove(id)
        model.changed.remove(id)
    }

    /// A truncate of a file an fsync made durable publishes it first.
    private func truncating(_ id: Int) {
        if model.synced.contains(id) { published(id) }
    }

    private func applyToModel(_ op: Operation) -> Outcome {
        typealias M = ReferenceModel
        switch op {
        case .create(let p):
            if let e = model.walkError(p) { return .fail(e) }
            guard model.node(M.parent(p)).isDir else { return .fail(ENOTDIR) }
            guard model.node(p) == nil else { return .fail(EEXIST) }
            model.nodes[p] = .file(model.newFile())
            return .ok

        case .write(let p, let offset, let bytes):
            if let e = model.resolveError(p) { return .fail(e) }
            guard case .file(let id)? = model.node(p) else { return .fail(EISDIR) }
            M.write(bytes, at: offset, into: &model.files[id]!)
            if !bytes.isEmpty { model.changed.insert(id) }
            publishedIfClosed(id)
            return .ok

        case .truncate(let p, let size):
            if let e = model.resolveError(p) { return .fail(e) }
            guard case .file(let id)? = model.node(p) else { return .fail(EISDIR) }
            truncating(id)
            M.resize(&model.files[id]!, to: size)
            model.changed.insert(id)
            publishedIfClosed(id)
            return .ok

        case .read(let p, let offset, let count):
            if let e = model.resolveError(p) { return .fail(e) }
            guard case .file(let id)? = model.node(p) else { return .fail(EISDIR) }
            return .data(slice(model.files[id]!, offset, count))

        case .mkdir(let p):
            if let e = model.walkError(p) { return .fail(e) }
            guard model.node(M.parent(p)).isDir else { return .fail(ENOTDIR) }
            guard model.node(p) == nil else { return .fail(EEXIST) }
            if let limit = model.maxDepth, M.depth(p) > limit { return .fail(EPERM) }
            model.nodes[p] = .dir(model.newFolder())
            return .ok

        case .unlink(let p):
            if let e = model.walkError(p) { return .fail(e) }
            guard model.node(M.parent(p)).isDir else { return .fail(ENOTDIR) }
            guard let n = model.node(p) else { return .fail(ENOENT) }
            guard case .file(let id) = n else { return .fail(EISDIR) }
            // The last name of a document goes to Recently Deleted; another name just goes.
            if model.names(of: id) == 1 { model.moveToTrash(p) } else { model.nodes[p] = nil }
            return .ok

        case .rmdir(let p):
            if let e = model.walkError(p) { return .fail(e) }
            guard model.node(M.parent(p)).isDir else { return .fail(ENOTDIR) }
            guard let n = model.node(p) else { return .fail(ENOENT) }
            guard n.isDir else { return .fail(ENOTDIR) }
            guard model.children(p).isEmpty else { return .fail(ENOTEMPTY) }
            model.moveToTrash(p)
            return .ok

        case .link(let src, let dst):
            if let e = model.resolveError(src) { return .fail(e) }
            if let e = model.walkError(dst) { return .fail(e) }
            guard case .file(let id)? = model.node(src) else { return .fail(EPERM) }
            guard model.node(M.parent(dst)).isDir else { return .fail(ENOTDIR) }
            guard model.node(dst) == nil else { return .fail(EEXIST) }
            model.nodes[dst] = .file(id)
            return .ok

        case .rename(let src, let dst, let flags):
            return renameInModel(src, dst, flags)

        case .hold(let p):
            if let e = model.resolveError(p) { return .fail(e) }
            guard case .file = model.node(p) else { return .fail(EISDIR) }
            return .ok

        case .writeHeld(let i, let offset, let bytes):
            M.write(bytes, at: offset, into: &model.files[held[i].id]!)
            if !bytes.isEmpty { model.changed.insert(held[i].id) }
            return .ok
        case .readHeld(let i, let offset, let count):
            return .data(slice(model.files[held[i].id]!, offset, count))
        case .truncateHeld(let i, let size):
            truncating(held[i].id)
            M.resize(&model.files[held[i].id]!, to: size)
            model.changed.insert(held[i].id)
            return .ok
        case .fsyncHeld(let i):
            if model.changed.contains(held[i].id) { model.synced.insert(held[i].id) }
            return .ok
        case .closeHeld:
            return .ok   // bookkeeping in applyToFS, which owns `held`
        case .publishIdle:
            for h in held { published(h.id) }
            return .ok
        case .reopen:
            for h in held { published(h.id) }
            return .ok
        case .crash:
            // What an fsync made durable is the file's content after the crash, with what came after.
            for id in model.synced { published(id) }
            for id in Array(model.files.keys) { model.files[id] = model.published[id] }
            return .ok
        case .trashRestore(let k):
            guard !model.trash.isEmpty else { return .fail(ENOENT) }
            model.restore(model.trash.count - 1 - k % model.trash.count)
            return .ok
        case .trashEmpty(let k):
            guard !model.trash.isEmpty else { return .fail(ENOENT) }
            purge(model.trash.count - 1 - k % model.trash.count)
            return .ok
        case .trashEmptyAll:
            while !model.trash.isEmpty { purge(0) }
            return .ok
        case .removeTree(let p):
            if let e = model.resolveError(p) { return .fail(e) }
            removeTreeInModel(p)
            return .ok
        }
    }

    private func removeTreeInModel(_ p: String) {
        switch model.node(p)! {
        case .dir:
            for c in model.children(p) { removeTreeInModel(ReferenceModel.join(p, c)) }
            model.moveToTrash(p)
        case .file(let id):
            if model.names(of: id) == 1 { model.moveToTrash(p) } else { model.nodes[p] = nil }
        }
    }

    /// Recently Deleted item `i` goes for good. (A folder there is empty: rmdir takes only empty
    /// ones. What was deleted from it stays, and would go back to Documents.)
    private func purge(_ i: Int) {
        let e = model.trash.remove(at: i)
        if case .file(let id) = e.node { model.collect(id, held: heldCount(id)) }
    }

    private func renameInModel(_ src: String, _ dst: String, _ flags: RenameFlags) -> Outcome {
        typealias M = ReferenceModel
        if let e = model.walkError(src) { return .fail(e) }
        if let e = model.walkError(dst) { return .fail(e) }
        guard model.node(M.parent(src)).isDir, model.node(M.parent(dst)).isDir else { return .fail(ENOTDIR) }
        guard let s = model.node(src) else { return .fail(ENOENT) }
        let d = model.node(dst)
        if src == dst || (d != nil && d == s && !s.isDir) { return .ok }   // one inode: nothing to do
        if flags.contains(.noReplace), d != nil { return .fail(EEXIST) }
        if flags.contains(.exchange), d == nil { return .fail(ENOENT) }
        if s.isDir, M.isWithin(M.parent(dst), src) { return .fail(EINVAL) }
        if flags.contains(.exchange), d.isDir, M.isWithin(M.parent(src), dst) { return .fail(EINVAL) }
        if let limit = model.maxDepth {
            if s.isDir, M.depth(M.parent(dst)) + 1 + model.height(src) > limit { return .fail(EPERM) }
            if flags.contains(.exchange), d.isDir, M.depth(M.parent(src)) + 1 + model.height(dst) > limit {
                return .fail(EPERM)
            }
        }
        if flags.contains(.exchange) {
            let a = model.subtree(src).map { ($0, model.nodes[$0]!) }
            let bb = model.subtree(dst).map { ($0, model.nodes[$0]!) }
            for (k, _) in a + bb { model.nodes[k] = nil }
            for (k, v) in a { model.nodes[dst + k.dropFirst(src.count)] = v }
            for (k, v) in bb { model.nodes[src + k.dropFirst(dst.count)] = v }
            return .ok
        }
        if let d {
            if s.isDir {
                guard d.isDir else { return .fail(ENOTDIR) }
                guard model.children(dst).isEmpty else { return .fail(ENOTEMPTY) }
                model.nodes[dst] = nil
            } else {
                guard case .file(let replaced) = d else { return .fail(EISDIR) }
                model.nodes[dst] = nil
                model.collect(replaced, held: heldCount(replaced))
            }
        }
        model.move(src, to: dst)
        return .ok
    }

    private func slice(_ bytes: [UInt8], _ offset: Int, _ count: Int) -> [UInt8] {
        guard offset < bytes.count else { return [] }
        return Array(bytes[offset..<min(bytes.count, offset + count)])
    }

    // MARK: the filesystem

    private func walkParent(_ p: String, _ fs: UbiquityFileSystem, _ docs: UInt64) throws -> (UInt64, [UInt8]) {
        var cur = docs
        let parts = ReferenceModel.parts(p)
        for c in parts.dropLast() { cur = try fs.lookup(parent: cur, name: b(c)).ino }
        return (cur, b(parts.last!))
    }

    private func readAll(_ fs: UbiquityFileSystem, _ h: UInt64, _ offset: Int, _ count: Int) throws -> [UInt8] {
        var out = [UInt8](repeating: 0xee, count: count)
        let n = try out.withUnsafeMutableBytes { try fs.read(handle: h, offset: UInt64(offset), into: $0) }
        return Array(out[0..<n])
    }

    private func writeAll(_ fs: UbiquityFileSystem, _ h: UInt64, _ bytes: [UInt8], _ offset: Int) throws {
        let n = try bytes.withUnsafeBytes { try fs.write(handle: h, offset: UInt64(offset), bytes: $0) }
        if n != bytes.count { throw FSError(EIO, "short write \(n) of \(bytes.count)") }
    }

    /// A clean reopen of the first writer (every held handle released, everything published), or
    /// a crash (kill -9: no release, no publish). Holds no reference to the old writer but `fs`,
    /// which `open` drops, so its store lock is free for the new one's recovery.
    private func restart(crash: Bool) -> Outcome {
        do {
            let closing = held
            held = []
            for h in closing {
                model.collect(h.id, held: 0)
                if !crash { try fs.release(handle: h.handle) }
            }
            if !crash {
                let failures = fs.publishAll()
                if !failures.isEmpty { throw failures[0] }
            }
            try open()
            return .ok
        } catch {
            return .fail(errnoOf(error) ?? -1)
        }
    }

    /// Apply `op` through writer `fs` (whose Documents folder is `docs`); handles held across
    /// steps are always the first writer's.
    private func applyToFS(_ op: Operation, on fs: UbiquityFileSystem, docs: UInt64) -> Outcome {
        func walkParent(_ p: String) throws -> (UInt64, [UInt8]) { try self.walkParent(p, fs, docs) }
        func resolve(_ p: String) throws -> Attributes {
            let (parent, name) = try walkParent(p)
            return try fs.lookup(parent: parent, name: name)
        }
        func readAll(_ h: UInt64, _ offset: Int, _ count: Int) throws -> [UInt8] { try self.readAll(fs, h, offset, count) }
        func writeAll(_ h: UInt64, _ bytes: [UInt8], _ offset: Int) throws { try self.writeAll(fs, h, bytes, offset) }
        do {
            switch op {
            case .create(let p):
                let (parent, name) = try walkParent(p)
                let (_, h) = try fs.create(parent: parent, name: name, mode: 0o644, flags: O_RDWR | O_CREAT | O_EXCL, caller: owner)
                try fs.release(handle: h)
                return .ok
            case .write(let p, let offset, let bytes):
                let h = try fs.open(try resolve(p).ino, flags: O_RDWR)
                defer { try? fs.release(handle: h) }
                try writeAll(h, bytes, offset)
                return .ok
            case .truncate(let p, let size):
                _ = try fs.setattr(try resolve(p).ino, AttributeChanges(size: UInt64(size)), handle: nil, caller: owner)
                return .ok
            case .read(let p, let offset, let count):
                let h = try fs.open(try resolve(p).ino, flags: O_RDONLY)
                defer { try? fs.release(handle: h) }
                return .data(try readAll(h, offset, count))
            case .mkdir(let p):
                let (parent, name) = try walkParent(p)
                _ = try fs.mkdir(parent: parent, name: name, mode: 0o755, caller: owner)
                return .ok
            case .rename(let src, let dst, let flags):
                let (sp, sn) = try walkParent(src)
                let (dp, dn) = try walkParent(dst)
                try fs.rename(parent: sp, name: sn, newParent: dp, newName: dn, flags: flags)
                return .ok
            case .unlink(let p):
                let (parent, name) = try walkParent(p)
                try fs.unlink(parent: parent, name: name)
                return .ok
            case .rmdir(let p):
                let (parent, name) = try walkParent(p)
                try fs.rmdir(parent: parent, name: name)
                return .ok
            case .link(let src, let dst):
                let ino = try resolve(src).ino
                let (parent, name) = try walkParent(dst)
                _ = try fs.link(ino, newParent: parent, newName: name)
                return .ok
            case .hold(let p):
                let ino = try resolve(p).ino
                let h = try fs.open(ino, flags: O_RDWR)
                guard case .file(let id)? = model.node(p) else { throw FSError(EIO, "model has no file at \(p)") }
                held.append((h, ino, id))
                return .ok
            case .writeHeld(let i, let offset, let bytes):
                try writeAll(held[i].handle, bytes, offset)
                return .ok
            case .readHeld(let i, let offset, let count):
                return .data(try readAll(held[i].handle, offset, count))
            case .truncateHeld(let i, let size):
                _ = try fs.setattr(held[i].ino, AttributeChanges(size: UInt64(size)), handle: held[i].handle, caller: owner)
                return .ok
            case .fsyncHeld(let i):
                try fs.fsync(handle: held[i].handle, dataOnly: false)
                return .ok
            case .closeHeld(let i):
                let h = held.remove(at: i)
                if heldCount(h.id) == 0 { published(h.id) }
                model.collect(h.id, held: heldCount(h.id))
                try fs.release(handle: h.handle)
                return .ok
            case .publishIdle:
                fs.publishIdle()
                return .ok
            case .reopen, .crash:
                return .ok   // after this returns, by `restart`: the writer passed in must be let go first
            case .trashRestore(let k):
                let items = fs.trashItems(container: container.name)
                guard !items.isEmpty else { return .fail(ENOENT) }
                _ = try fs.restoreFromTrash(items[k % items.count].ino)
                return .ok
            case .trashEmpty(let k):
                let items = fs.trashItems(container: container.name)
                guard !items.isEmpty else { return .fail(ENOENT) }
                try fs.emptyTrash(items[k % items.count].ino)
                return .ok
            case .trashEmptyAll:
                try fs.emptyTrash(container: container.name)
                return .ok
            case .removeTree(let p):
                func remove(_ parent: UInt64, _ name: [UInt8]) throws {
                    let a = try fs.lookup(parent: parent, name: name)
                    guard a.kind == .directory else { return try fs.unlink(parent: parent, name: name) }
                    for child in try fs.names(a.ino).sorted() { try remove(a.ino, b(child)) }
                    try fs.rmdir(parent: parent, name: name)
                }
                let (parent, name) = try walkParent(p)
                try remove(parent, name)
                return .ok
            }
        } catch {
            return .fail(errnoOf(error) ?? -1)
        }
    }

    // MARK: comparing

    /// Compare the whole tree under Documents: names, kinds, file sizes, link counts, hard-link
    /// identity; with `contents`, every file's bytes too. nil when equal.
    private func compareTrees(contents: Bool, on fs: UbiquityFileSystem, docs: UInt64) -> String? {
        var seen: [String: Attributes] = [:]
        func walk(_ ino: UInt64, _ prefix: String) throws {
            for name in try fs.names(ino) {
                let a = try fs.lookup(parent: ino, name: b(name))
                let path = ReferenceModel.join(prefix, name)
                seen[path] = a
                if a.kind == .directory { try walk(a.ino, path) }
            }
        }
        do { try walk(docs, "") } catch { return "listing the tree failed: \(error)" }
        let fsPaths = seen.keys.sorted()
        let modelPaths = model.sortedPaths
        if fsPaths != modelPaths {
            let extra = Set(fsPaths).subtracting(modelPaths).sorted()
            let missing = Set(modelPaths).subtracting(fsPaths).sorted()
            return "tree differs: only in the filesystem \(extra), only in the model \(missing)"
        }
        var inoOfFile: [Int: UInt64] = [:]
        do {
            let docsAttrs = try fs.getattr(docs)
            if docsAttrs.nlink != UInt32(2 + model.children("").filter { model.nodes[$0].isDir }.count) {
                return "Documents nlink \(docsAttrs.nlink)"
            }
        } catch { return "getattr Documents: \(error)" }
        for path in modelPaths {
            let a = seen[path]!
            switch model.nodes[path]! {
            case .dir:
                guard a.kind == .directory else { return "\(path): model has a folder, filesystem a \(a.kind)" }
                let subdirs = model.children(path).filter { model.nodes[ReferenceModel.join(path, $0)].isDir }.count
                if a.nlink != UInt32(2 + subdirs) { return "\(path): folder nlink \(a.nlink), expected \(2 + subdirs)" }
            case .file(let id):
                guard a.kind == .regular else { return "\(path): model has a file, filesystem a \(a.kind)" }
                let bytes = model.files[id]!
                if a.size != UInt64(bytes.count) { return "\(path): size \(a.size), expected \(bytes.count)" }
                if a.nlink != UInt32(model.names(of: id)) { return "\(path): nlink \(a.nlink), expected \(model.names(of: id))" }
                if let other = inoOfFile[id], other != a.ino { return "\(path): hard links have different inodes" }
                inoOfFile[id] = a.ino
                if contents {
                    do {
                        let got = try fs.contents(a.ino)
                        if got != bytes {
                            let first = zip(got, bytes).enumerated().first { $0.element.0 != $0.element.1 }?.offset
                                ?? min(got.count, bytes.count)
                            return "\(path): content differs at offset \(first) (\(got.count) vs \(bytes.count) bytes)"
                        }
                    } catch { return "\(path): reading failed: \(error)" }
                }
            }
        }
        if Set(inoOfFile.values).count != inoOfFile.count { return "two model files share one inode" }
        return compareTrash(contents: contents, on: fs)
    }

    /// Compare Recently Deleted, newest first: where each item was, its kind; with `contents`,
    /// each file's bytes.
    private func compareTrash(contents: Bool, on fs: UbiquityFileSystem) -> String? {
        let items = fs.trashItems(container: container.name)
        let entries = Array(model.trash.reversed())
        let got = items.map { "\($0.originalPath) \($0.kind == .directory ? "folder" : "file")" }
        let expected = entries.map { "\(model.originalPath($0, container: container.name)) \($0.node.isDir ? "folder" : "file")" }
        if got != expected { return "Recently Deleted differs: filesystem \(got), model \(expected)" }
        guard contents else { return nil }
        for (item, entry) in zip(items, entries) {
            guard case .file(let id) = entry.node else { continue }
            do {
                let bytes = try fs.contents(item.ino)
                if bytes != model.files[id]! { return "\(item.originalPath) in Recently Deleted: content differs (\(bytes.count) vs \(model.files[id]!.count) bytes)" }
            } catch { return "\(item.originalPath) in Recently Deleted: reading failed: \(error)" }
        }
        return nil
    }
}

final class ReferenceModelTests: XCTestCase {
    /// Fixed seeds: a failure names its seed, and rerunning reproduces it step for step.
    /// UBIQUITYFS_REFERENCE_SEEDS=N runs N seeds instead of 20, to search wider.
    static let seeds: [UInt64] = {
        let count = ProcessInfo.processInfo.environment["UBIQUITYFS_REFERENCE_SEEDS"].flatMap { Int($0) } ?? 20
        return (1...max(1, count)).map { 0x00c0_ffee_0000_0000 | UInt64($0) &* 0x9e37_79b9 }
    }()

    func testRandomOperationsMatchTheModelInAnyLevelsContainer() {
        for seed in Self.seeds {
            if let problem = ReferenceRun(seed: seed, container: Sample.sugoi, steps: 300).run() {
                XCTFail(problem)
            }
        }
    }

    /// The same over the embedded store (SQLite metadata, blob and working-copy files), reopened
    /// from its folder on every reopen and crash.
    func testRandomOperationsMatchTheModelOverTheEmbeddedStore() throws {
        for seed: UInt64 in [0xe_0b01, 0xe_0b02] {
            let directory = FileManager.default.temporaryDirectory
                .appendingPathComponent("fstests-reference-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let run = ReferenceRun(seed: seed, container: Sample.sugoi, steps: 300,
                                   openStore: { try openEmbeddedStore(directory: directory) })
            if let problem = run.run() { XCTFail(problem) }
        }
    }

    /// Two writers on one store (two daemons): a third of the path operations go through the
    /// second, while a change-feed thread applies each one's batches to the other.
    func testRandomOperationsMatchTheModelWithASecondWriter() {
        for seed in Self.seeds.prefix(10) {
            if let problem = ReferenceRun(seed: seed ^ 0x2_0000, container: Sample.sugoi, steps: 300,
                                          secondWriter: true).run() {
                XCTFail(problem)
            }
        }
    }

    /// The same with two daemons on one embedded store folder, each with its own work area.
    func testRandomOperationsMatchTheModelWithASecondWriterOverTheEmbeddedStore() throws {
        for seed: UInt64 in [0xe_2b01, 0xe_2b02] {
            let directory = FileManager.default.temporaryDirectory
                .appendingPathComponent("fstests-reference-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let run = ReferenceRun(seed: seed, container: Sample.sugoi, steps: 300,
                                   openStore: { try openEmbeddedStore(directory: directory) }, secondWriter: true)
            if let problem = run.run() { XCTFail(problem) }
        }
    }

    /// Levels One: mkdir below level 1 and renames that put a folder tree past it are EPERM in
    /// the model too.
    func testRandomOperationsMatchTheModelInLevelOneContainer() {
        for seed: UInt64 in [0x0e_0001, 0x0e_0002, 0x0e_0003, 0x0e_0004] {
            if let problem = ReferenceRun(seed: seed, container: Sample.notes, steps: 300).run() {
                XCTFail(problem)
            }
        }
    }
}

/// The daemons' change feeds in a test: applies each writer's store changes to the others (by
/// `catchUp`) in a loop on a thread of its own, while operations run on the test's thread.
final class ChangeFeedThread: @unchecked Sendable {
    private let condition = NSCondition()
    private var current: [UbiquityFileSystem] = []   // guarded by condition
    private var running = false                      // guarded by condition
    private var busy = false                         // guarded by condition
    private var paused = 0                           // guarded by condition
    private var thread: Thread?

    var writers: [UbiquityFileSystem] {
        get { condition.lock(); defer { condition.unlock() }; return current }
        set { condition.lock(); current = newValue; condition.unlock() }
    }

    /// Run `body` while the thread holds no writer (it waits meanwhile).
    func pausing(_ body: () throws -> Void) throws {
        condition.lock()
        paused += 1
        while busy { condition.wait() }
        current = []
        condition.unlock()
        defer {
            condition.lock()
            paused -= 1
            condition.broadcast()
            condition.unlock()
        }
        try body()
    }

    func start() {
        condition.lock()
        running = true
        condition.unlock()
        let t = Thread { [self] in
            while true {
                condition.lock()
                while running && paused > 0 { condition.wait() }
                guard running else { condition.unlock(); break }
                busy = true
                do {
                    // Let go of the writers before saying so: `pausing` drops one to crash it,
                    // and its store lock must be free for the next one's recovery.
                    let ws = current
                    condition.unlock()
                    for w in ws { _ = try? w.catchUp() }
                }
                condition.lock()
                busy = false
                condition.broadcast()
                condition.unlock()
                usleep(200)
            }
            condition.lock()
            thread = nil
            condition.broadcast()
            condition.unlock()
        }
        thread = t
        t.start()
    }

    func stop() {
        condition.lock()
        running = false
        condition.broadcast()
        while thread != nil { condition.wait() }
        current = []
        condition.unlock()
    }
}
