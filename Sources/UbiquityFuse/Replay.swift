// Replays of other writers' changes for programs watching the mount. The kernel raises inotify
// events only for operations made through it, so the change feed makes each change again
// through the mount point, from its own thread: a mknod for a new file, an unlink, a rename,
// a truncate to the same size for new content. The bridge knows that thread's requests by the
// thread id the kernel gives with each, and answers them from the plan below without changing
// anything: the change is already in the namespace. The kernel then raises the event exactly
// as for a local program, and its cache ends up holding what the namespace holds.

import Foundation
import Glibc
import Synchronization
import UbiquityFileSystem

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
    }
    /// The operation the system call ends in.
    var op: Op
    /// Lookups answered from the plan: an entry, or nil for "no such name".
    var answers: [Name: Attributes?] = [:]
    /// getattr answered from the plan (ids whose names the namespace no longer has).
    var attributes: [UInt64: Attributes] = [:]
}

/// The replay in progress: the thread making it (0: none) and its plan.
final class ReplayState: Sendable {
    let thread = Atomic<Int32>(0)
    private let plan = Mutex<ReplayPlan?>(nil)

    func current() -> ReplayPlan? { plan.withLock { $0 } }

    func begin(_ p: ReplayPlan, thread id: Int32) {
        plan.withLock { $0 = p }
        thread.store(id, ordering: .releasing)
    }

    func end() {
        thread.store(0, ordering: .releasing)
        plan.withLock { $0 = nil }
    }
}

/// Make each of `events` through the mount at `mountpoint` (see the top of this file). Errors
/// are expected and ignored: the namespace may have moved on since (the bridge then refuses the
/// call), the mount may be going away, or the caller may lack the right to make the call.
func replay(_ events: [WatchEvent], at mountpoint: String, state: ReplayState) {
    guard let thread = currentThreadID() else { return }
    let root = Array(mountpoint.utf8) + [0x2f]
    func path(_ v: ViewName) -> [CChar] { (root + v.path + [0]).map { CChar(bitPattern: $0) } }
    for event in events {
        switch event {
        case .created(let v, let node):
            state.begin(ReplayPlan(op: .make(.init(v.parent, v.name)), answers: [.init(v.parent, v.name): Attributes?.none]), thread: thread)
            let p = path(v)
            switch node.kind {
            case .directory: _ = mkdir(p, 0o700)
            case .symlink: _ = symlink(".", p)
            case .regular: _ = mknod(p, S_IFREG | 0o600, 0)
            case .fifo: _ = mknod(p, S_IFIFO | 0o600, 0)
            case .socket: _ = mknod(p, S_IFSOCK | 0o600, 0)
            // Device nodes need CAP_MKNOD; without it the kernel refuses before asking.
            case .characterDevice: _ = mknod(p, S_IFCHR | 0o600, dev_t(node.rdev))
            case .blockDevice: _ = mknod(p, S_IFBLK | 0o600, dev_t(node.rdev))
            }
        case .removed(let v, let was):
            state.begin(ReplayPlan(op: .remove(.init(v.parent, v.name)), answers: [.init(v.parent, v.name): was],
                                   attributes: [was.ino: was]), thread: thread)
            _ = was.kind == .directory ? rmdir(path(v)) : unlink(path(v))
        case .moved(let from, let to, let node, let replaced):
            var plan = ReplayPlan(op: .move(.init(from.parent, from.name), .init(to.parent, to.name)),
                                  answers: [.init(from.parent, from.name): node, .init(to.parent, to.name): replaced],
                                  attributes: [node.ino: node])
            if let replaced { plan.attributes[replaced.ino] = replaced }
            state.begin(plan, thread: thread)
            _ = rename(path(from), path(to))
        case .changed(let v, let node, let content):
            state.begin(ReplayPlan(op: .touch(node.ino)), thread: thread)
            let p = path(v)
            // A truncate to the size it has raises IN_MODIFY, a chmod to the mode it has
            // IN_ATTRIB (also when the caller may not write the file). Symlinks have neither.
            guard node.kind != .symlink else { break }
            if !content || node.kind != .regular || truncate(p, off_t(node.size)) != 0 {
                _ = chmod(p, mode_t(node.mode & 0o7777))
            }
        }
        state.end()
    }
}

/// This thread's kernel id, as FUSE requests name their caller. (Glibc's `gettid` is not
/// visible to Swift; /proc names the thread as "PID/task/TID".)
private func currentThreadID() -> Int32? {
    var buffer = [CChar](repeating: 0, count: 64)
    let n = readlink("/proc/thread-self", &buffer, buffer.count - 1)
    guard n > 0 else { return nil }
    let text = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return text.split(separator: "/").last.flatMap { Int32($0) }
}
