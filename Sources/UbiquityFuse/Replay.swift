// Replays of other writers' changes for programs watching the mount. The kernel raises inotify
// events only for operations made through it, so each change another writer made is made again
// through the mount point, from a thread of its own: a mknod for a new file, an unlink, a
// rename, a truncate to the same size for new content. The bridge knows that thread's requests
// by the thread id the kernel gives with each, and answers them from the plan below without
// changing anything: the change is already in the namespace. The kernel then raises the event
// exactly as for a local program, and its cache ends up holding what the namespace holds.
//
// The thread is not the change feed's: a replay needs a FUSE worker to answer it, and when the
// session stops serving (a signal) one in flight waits until the session is destroyed, which
// must not hold up the daemon's stop.

import CFuse
import Foundation
import Glibc
import Synchronization
import UbiquityFileSystem

/// <fcntl.h> shows O_PATH to GNU sources only (010000000 on x86-64 and arm64).
private let O_PATH: Int32 = 0o10000000

/// How the bridge answers the requests of one replayed system call.
struct ReplayPlan: Sendable {
    struct Name: Hashable, Sendable {
        let parent: UInt64
        let name: [UInt8]
        init(_ parent: UInt64, _ name: [UInt8]) {
            self.parent = parent
            self.name = name
        }
    }
    enum Op: Equatable, Sendable {
        case make(Name)
        case remove(Name)
        case move(Name, Name)
        case touch(UInt64)
        /// The check at start that the kernel names this thread as the bridge expects.
        case probe
    }
    /// The operation the system call ends in.
    var op: Op
    /// Lookups answered from the plan: what the name named before the change, or nil for
    /// "no such name".
    var answers: [Name: Attributes?] = [:]
    /// getattr answered from the plan (ids whose names the namespace no longer has).
    var attributes: [UInt64: Attributes] = [:]
    /// The node a move moves.
    var moving: UInt64?

    /// A stand-in id, which the namespace never hands out (see the model's `standIn`).
    static func isStandIn(_ ino: UInt64) -> Bool { ino >= 1 << 62 && ino < 1 << 63 }
}

/// The replay in progress: the thread making it (0: none) and its plan.
final class ReplayState: Sendable {
    let thread = Atomic<Int32>(0)
    private let plan = Mutex<ReplayPlan?>(nil)
    private let answeredFromPlan = Atomic<Bool>(false)

    func current() -> ReplayPlan? { plan.withLock { $0 } }

    /// The bridge answered a lookup from the plan.
    func answered() { answeredFromPlan.store(true, ordering: .relaxed) }

    func begin(_ p: ReplayPlan, thread id: Int32) {
        plan.withLock { $0 = p }
        answeredFromPlan.store(false, ordering: .relaxed)
        thread.store(id, ordering: .releasing)
    }

    /// Ends the replay; whether the bridge answered a lookup from its plan.
    @discardableResult
    func end() -> Bool {
        thread.store(0, ordering: .releasing)
        plan.withLock { $0 = nil }
        return answeredFromPlan.load(ordering: .relaxed)
    }
}

/// The replay thread and what waits for it.
final class Replayer: @unchecked Sendable {
    private let mountpoint: String
    private let state: ReplayState
    private let log: @Sendable (String) -> Void
    private let condition = NSCondition()
    private var queue: [WatchEvent] = []   // guarded by condition; from `head` on
    private var head = 0                   // guarded by condition
    private var stopping = false           // guarded by condition
    private var started = false            // guarded by condition
    private var busy = false               // guarded by condition: a replay is being made
    private var pauses = 0                 // guarded by condition: invalidations being sent (two threads send them)
    private var dropped = 0                // guarded by condition
    /// More than this waiting (a far bigger change elsewhere than anyone watches) and the
    /// oldest go: inotify itself keeps 16,384 events per watcher by default.
    static let queueLimit = 16_384

    init(mountpoint: String, state: ReplayState, log: @escaping @Sendable (String) -> Void) {
        self.mountpoint = mountpoint
        self.state = state
        self.log = log
    }

    func enqueue(_ events: [WatchEvent]) {
        condition.lock()
        defer { condition.unlock() }
        guard !stopping else { return }
        if head > 0 {
            queue.removeFirst(head)
            head = 0
        }
        queue += events
        if queue.count > Self.queueLimit {
            let over = queue.count - Self.queueLimit
            queue.removeFirst(over)
            if dropped == 0 { log("replays for watchers: more changes than a watcher could take; the oldest \(over) are dropped") }
            dropped += over
        }
        if !started {
            started = true
            let t = Thread { [self] in run() }
            t.name = "replay"
            t.start()
        }
        condition.signal()
    }

    /// No more replays. One in flight is not waited for: see the top of this file.
    func stop() {
        condition.lock()
        defer { condition.unlock() }
        stopping = true
        queue = []
        head = 0
        condition.broadcast()
    }

    /// Runs `body` (invalidations: the change feed's, and those sent again) with no replay in
    /// flight, if the one in flight ends within `seconds`; false if it did not. An invalidation
    /// of a folder takes the kernel's lock of that folder, which a replay in it holds until the
    /// daemon answers it: were the two to overlap when the session stops serving, the
    /// invalidation would wait in the kernel for good, and the daemon's stop with it.
    func whileIdle(seconds: Double, _ body: () -> Void) -> Bool {
        condition.lock()
        let deadline = Date().addingTimeInterval(seconds)
        while busy {
            guard condition.wait(until: deadline) || !busy else {
                condition.unlock()
                return false
            }
        }
        pauses += 1
        condition.unlock()
        body()
        condition.lock()
        pauses -= 1
        condition.broadcast()
        condition.unlock()
        return true
    }

    private func next() -> WatchEvent? {
        condition.lock()
        defer { condition.unlock() }
        busy = false
        condition.broadcast()
        while (head == queue.count || pauses > 0) && !stopping { condition.wait() }
        guard !stopping else { return nil }
        busy = true
        head += 1
        return queue[head - 1]
    }

    private func run() {
        let tid = ubiquityfs_gettid()
        condition.lock()
        busy = true   // the probe is a replay too
        condition.unlock()
        guard let root = probe(tid) else {
            condition.lock()
            busy = false
            condition.unlock()
            stop()
            return
        }
        while let event = next() { replay(event, thread: tid, root: root) }
    }

    /// Checks that the bridge knows this thread's requests (the kernel names them by their id in
    /// the daemon's own pid namespace) with a lookup of a name nobody has, answered from a plan;
    /// and notes the mount's device. Without both, no replays: unrecognized, a replay would be
    /// carried out as a change of this mount's own.
    private func probe(_ tid: Int32) -> dev_t? {
        var st = stat()
        guard lstat(mountpoint, &st) == 0, st.st_ino == 1 else {
            log("replays for watchers are off: \(mountpoint) is not this mount's root")
            return nil
        }
        let name = Array(".ubiquityfs-replay-probe-\(getpid())".utf8)
        state.begin(ReplayPlan(op: .probe, answers: [.init(1, name): Attributes?.none]), thread: tid)
        var probe = stat()
        _ = lstat(mountpoint + "/" + String(decoding: name, as: UTF8.self), &probe)
        guard state.end() else {
            log("replays for watchers are off: the kernel does not name this daemon's threads as it sees them")
            return nil
        }
        // What every replay needs: openat2 (Linux 5.6) and /proc's descriptor names.
        guard let fd = folder([], device: st.st_dev) else {
            log("replays for watchers are off: openat2 beneath the mount fails: \(String(cString: strerror(errno)))")
            return nil
        }
        defer { close(fd) }
        var viaProc = stat()
        guard stat("/proc/self/fd/\(fd)", &viaProc) == 0, viaProc.st_ino == 1 else {
            log("replays for watchers are off: /proc/self/fd does not name this daemon's descriptors")
            return nil
        }
        return st.st_dev
    }

    /// A folder of the mount by its path from the root, opened without following any symlink
    /// or leaving the mount: what a path names may have changed since the plan was made.
    private func folder(_ path: [UInt8], device: dev_t) -> Int32? {
        let rootFD = open(mountpoint, O_PATH | O_DIRECTORY | O_CLOEXEC)
        guard rootFD >= 0 else { return nil }
        defer { close(rootFD) }
        var st = stat()
        guard fstat(rootFD, &st) == 0, st.st_dev == device, st.st_ino == 1 else { return nil }
        let relative = path.isEmpty ? "." : String(decoding: path, as: UTF8.self)
        let fd = ubiquityfs_openat2(rootFD, relative, UInt64(O_PATH | O_DIRECTORY | O_CLOEXEC),
                                    UInt64(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS))
        return fd >= 0 ? fd : nil
    }

    private func replay(_ event: WatchEvent, thread tid: Int32, root device: dev_t) {
        func parentPath(_ v: ViewName) -> [UInt8] {
            Array(v.path.dropLast(v.name.count + (v.path.count > v.name.count ? 1 : 0)))
        }
        func withFolder(_ v: ViewName, _ body: (Int32, String) -> Void) {
            guard let fd = folder(parentPath(v), device: device) else { return }
            body(fd, String(decoding: v.name, as: UTF8.self))
            close(fd)
        }
        switch event {
        case .created(let v, let node):
            state.begin(ReplayPlan(op: .make(.init(v.parent, v.name)), answers: [.init(v.parent, v.name): Attributes?.none]), thread: tid)
            withFolder(v) { fd, name in
                switch node.kind {
                case .directory: _ = mkdirat(fd, name, 0o700)
                case .symlink: _ = symlinkat(".", fd, name)
                case .regular: _ = mknodat(fd, name, S_IFREG | 0o600, 0)
                case .fifo: _ = mknodat(fd, name, S_IFIFO | 0o600, 0)
                case .socket: _ = mknodat(fd, name, S_IFSOCK | 0o600, 0)
                // Device nodes need CAP_MKNOD; without it the kernel refuses before asking.
                case .characterDevice: _ = mknodat(fd, name, S_IFCHR | 0o600, dev_t(node.rdev))
                case .blockDevice: _ = mknodat(fd, name, S_IFBLK | 0o600, dev_t(node.rdev))
                }
            }
        case .removed(let v, let was):
            state.begin(ReplayPlan(op: .remove(.init(v.parent, v.name)), answers: [.init(v.parent, v.name): was],
                                   attributes: [was.ino: was]), thread: tid)
            withFolder(v) { fd, name in _ = unlinkat(fd, name, was.kind == .directory ? AT_REMOVEDIR : 0) }
        case .moved(let from, let to, let node, let replaced):
            var plan = ReplayPlan(op: .move(.init(from.parent, from.name), .init(to.parent, to.name)),
                                  answers: [.init(from.parent, from.name): node, .init(to.parent, to.name): replaced],
                                  attributes: [node.ino: node], moving: node.ino)
            if let replaced { plan.attributes[replaced.ino] = replaced }
            state.begin(plan, thread: tid)
            withFolder(from) { fromFD, fromName in
                withFolder(to) { toFD, toName in _ = renameat(fromFD, fromName, toFD, toName) }
            }
        case .changed(let v, let node, let content):
            // Symlinks have neither event; a folder's own changes are not replayed.
            guard node.kind != .symlink && node.kind != .directory else { return }
            state.begin(ReplayPlan(op: .touch(node.ino)), thread: tid)
            withFolder(v) { fd, name in
                // The file itself, never what a symlink put in its place since would lead to.
                let file = ubiquityfs_openat2(fd, name, UInt64(O_PATH | O_NOFOLLOW | O_CLOEXEC),
                                              UInt64(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV))
                guard file >= 0 else { return }
                defer { close(file) }
                var st = stat()
                guard fstat(file, &st) == 0, st.st_dev == device, UInt64(st.st_ino) == node.ino else { return }
                // Through the descriptor's /proc name, which leads to this very file. A truncate
                // to the size it has raises IN_MODIFY; a chmod to the mode it has IN_ATTRIB (for
                // a daemon that may not write the file, if it owns the file or runs as root).
                let byDescriptor = "/proc/self/fd/\(file)"
                if !content || node.kind != .regular || truncate(byDescriptor, off_t(node.size)) != 0 {
                    _ = chmod(byDescriptor, mode_t(node.mode & 0o7777))
                }
            }
        }
        state.end()
    }
}
