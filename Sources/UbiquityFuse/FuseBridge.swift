// The FUSE bridge: libfuse3's low-level API adapted to UbiquityFileSystem. This is the only file
// that imports the libfuse shim. Each callback makes a `Request` (answered exactly once by
// construction), converts C arguments to plain values, calls the model with no lock held, and
// answers through the request. Failures are answered with the model's errno and logged with the
// operation, node and errno (routine misses, such as a lookup of a name that does not exist, are
// not logged).

import CFuse
import CFuseIO
import Foundation
import Synchronization
import UbiquityFileSystem
import UbiquityStore

final class Bridge: @unchecked Sendable {
    let fs: UbiquityFileSystem
    let log: @Sendable (String) -> Void
    /// How long the kernel may keep names and attributes without asking again.
    let cacheSeconds: Double
    /// The replay of another writer's change being made through the mount (`FuseSession.replay`).
    let replay = ReplayState()
    /// Tests' faults: `replayAnswer` delays the answers to replays, `lookupAnswer` those to
    /// lookups (after the attributes are read).
    let faults: FaultPlan?
    init(fs: UbiquityFileSystem, cacheSeconds: Double, faults: FaultPlan?, log: @escaping @Sendable (String) -> Void) {
        self.fs = fs
        self.cacheSeconds = cacheSeconds
        self.faults = faults
        self.log = log
    }

    /// The read-ahead to set once the kernel has taken the INIT answer (which lowers it to what
    /// it offered): the sysfs file and KiB. Set before the session serves.
    var readAhead: (file: String, kib: Int)?
    /// True until the first request after INIT has set the read-ahead.
    let readAheadPending = Atomic<Bool>(false)
    /// Reads of published content are answered from the blob files by splice (set at INIT).
    let splicesReads = Atomic<Bool>(false)

    /// The kernel queues every request but INIT until it has taken INIT's answer, so the first
    /// other request finds the read-ahead lowered already; and it normally comes before any
    /// open, which is when a file takes the mount's read-ahead (another worker may answer an
    /// open meanwhile: that file reads ahead 128 KiB).
    func firstRequestAfterInit() {
        guard readAheadPending.compareExchange(expected: true, desired: false, ordering: .acquiringAndReleasing).exchanged,
              let (file, kib) = readAhead else { return }
        let fd = open(file, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if geteuid() == 0 { log("read-ahead stays the kernel's: cannot open \(file): \(String(cString: strerror(errno)))") }
            return
        }
        defer { close(fd) }
        let text = "\(kib)\n"
        if write(fd, text, text.utf8.count) < 0 {
            log("read-ahead stays the kernel's: \(file): \(String(cString: strerror(errno)))")
        }
    }
}

private func name(_ p: UnsafePointer<CChar>?) -> [UInt8] {
    guard let p else { return [] }
    return Array(UnsafeRawBufferPointer(start: p, count: strlen(p)))
}

private func timespecOf(_ ns: Int64) -> timespec {
    var s = ns / 1_000_000_000
    var n = ns % 1_000_000_000
    if n < 0 { n += 1_000_000_000; s -= 1 }
    return timespec(tv_sec: Int(s), tv_nsec: Int(n))
}

private func nanoseconds(_ t: timespec) -> Int64 { Int64(t.tv_sec) * 1_000_000_000 + Int64(t.tv_nsec) }

private func statOf(_ a: Attributes) -> stat {
    var st = stat()
    st.st_ino = __ino_t(a.ino)
    st.st_mode = __mode_t(a.mode)
    st.st_nlink = __nlink_t(a.nlink)
    st.st_uid = a.uid
    st.st_gid = a.gid
    st.st_size = __off_t(a.size)
    st.st_blocks = __blkcnt_t(a.blocks)
    st.st_blksize = 4096
    st.st_atim = timespecOf(a.atime)
    st.st_mtim = timespecOf(a.mtime)
    st.st_ctim = timespecOf(a.ctime)
    st.st_rdev = __dev_t(a.rdev)
    return st
}

func entryOf(_ a: Attributes, _ cacheSeconds: Double) -> fuse_entry_param {
    var e = fuse_entry_param()
    e.ino = fuse_ino_t(a.ino)
    e.generation = 1
    e.attr = statOf(a)
    e.attr_timeout = a.changingElsewhere ? 0 : cacheSeconds
    e.entry_timeout = cacheSeconds
    return e
}

/// One kernel request, answered exactly once by construction: every reply consumes it, so a
/// second reply does not compile, and one dropped without a reply (a bug) is answered EIO by
/// `deinit` and logged. Failures are answered with the model's errno and logged with the
/// operation, node and errno, unless the model made the error routine (a lookup of a name that
/// does not exist, say).
struct Request: ~Copyable {
    let req: fuse_req_t?
    /// forget and forget_multi take no answer at all, not even an error.
    private let takesNoAnswer: Bool
    init(_ req: fuse_req_t?, takesNoAnswer: Bool = false) {
        self.req = req
        self.takesNoAnswer = takesNoAnswer
        if req != nil, bridge.readAheadPending.load(ordering: .relaxed) { bridge.firstRequestAfterInit() }
    }

    var bridge: Bridge {
        // The session's userdata is an Unmanaged<Bridge> retained by FuseSession for its life.
        Unmanaged<Bridge>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
    }
    var fs: UbiquityFileSystem { bridge.fs }
    var caller: Caller {
        let ctx = fuse_req_ctx(req)!.pointee
        return Caller(uid: ctx.uid, gid: ctx.gid, pid: ctx.pid)
    }

    /// Drops the file's set-ID bits as the kernel asked (a write or truncation by a caller
    /// without CAP_FSETID, a chown); the caller's supplementary groups are read only if they
    /// matter, and never under the model's locks (they come from /proc).
    func dropSetID(_ ino: UInt64) throws(FSError) {
        let req = self.req
        try fs.dropSetID(ino, caller: caller) { gid in
            var groups = [gid_t](repeating: 0, count: 64)
            var n = Int(fuse_req_getgroups(req, Int32(groups.count), &groups))
            if n > groups.count {
                groups = [gid_t](repeating: 0, count: n)
                n = Int(fuse_req_getgroups(req, Int32(groups.count), &groups))
            }
            return n > 0 && groups.prefix(min(n, groups.count)).contains(gid)
        }
    }

    /// The plan, if this request comes from a replay's system call (the kernel names the
    /// calling thread).
    var replayPlan: ReplayPlan? {
        let state = bridge.replay
        let thread = state.thread.load(ordering: .acquiring)
        guard thread != 0, fuse_req_ctx(req)!.pointee.pid == thread else { return nil }
        if let faults = bridge.faults { try? faults.check(.replayAnswer) }
        return state.current()
    }

    /// A replay's creating call (mknod, mkdir, symlink): answered with the entry the name
    /// already has. Anything the plan does not expect (its path led elsewhere: the namespace
    /// moved on meanwhile) is refused, never carried out.
    consuming func replayMake(_ plan: ReplayPlan, _ parent: UInt64, _ n: [UInt8]) {
        guard plan.op == .make(.init(parent, n)) else { error(EAGAIN); return }
        let fs = self.fs
        entry("replayed create", parent, named: n) { () throws(FSError) in try fs.lookup(parent: parent, name: n) }
    }

    /// A replay's unlink, rmdir or rename: done already, by the other writer, if the namespace
    /// still says so (a local program may have made the name again meanwhile).
    consuming func replayDone(_ plan: ReplayPlan, _ op: ReplayPlan.Op) {
        let fs = self.fs
        func absent(_ n: ReplayPlan.Name) -> Bool { (try? fs.lookup(parent: n.parent, name: n.name)) == nil }
        let holds: Bool
        switch (op, plan.op) {
        case (.remove(let n), .remove(let planned)) where n == planned:
            holds = absent(n)
        case (.move(let from, let to), .move(let pf, let pt)) where from == pf && to == pt:
            holds = absent(from) && (try? fs.lookup(parent: to.parent, name: to.name))?.ino == plan.moving
        default:
            holds = false
        }
        if holds, case .move(_, let to) = op, let moved = plan.moving { fs.kernelMoved(moved, parent: to.parent, name: to.name) }
        if holds { ok() } else { error(EAGAIN) }
    }

    /// A replay's lookup the plan answers: the name as it was before the change (what it named,
    /// kept for no time at all, since the namespace no longer has it; or "no such name").
    consuming func replayLookup(_ answer: Attributes?, _ state: ReplayState) {
        state.answered()
        guard var a = answer else { error(ENOENT); return }
        if !ReplayPlan.isStandIn(a.ino) {
            // Its own id, as the node is now (a local program may have written to it since),
            // and only while it may be given: the kernel forgets what it is given, and a forget
            // of a node that lost its last name since the plan was made would delete it.
            guard fs.mayGiveKernel(a.ino), let now = try? fs.getattr(a.ino) else { error(ENOENT); return }
            a = now
        }
        entry(a, cacheSeconds: 0)
    }

    deinit {
        bridge.log("internal error: a request was left without a reply")
        if takesNoAnswer { fuse_reply_none(req) } else { fuse_reply_err(req, EIO) }
    }

    consuming func ok() {
        fuse_reply_err(req, 0)
        discard self
    }

    consuming func error(_ code: Int32) {
        fuse_reply_err(req, code)
        discard self
    }

    consuming func fail(_ op: String, _ ino: UInt64, _ error: FSError) {
        if !error.routine {
            bridge.log("\(op) node \(ino): \(errnoName(error.errno)): \(error.message)")
        }
        self.error(error.errno)
    }

    /// An entry: the kernel now holds one more reference to the node (until `forget`), counted
    /// here, and taken back if the reply does not reach the kernel. `named`: the folder and
    /// name it was asked by. `cacheSeconds`: how long the kernel may keep it (the mount's
    /// setting when nil). `remembered`: counted already (see `UbiquityFileSystem.lookup`).
    consuming func entry(_ a: Attributes, named: (UInt64, [UInt8])? = nil, cacheSeconds: Double? = nil, remembered: Bool = false) {
        var e = entryOf(a, cacheSeconds ?? bridge.cacheSeconds)
        let fs = self.fs
        if !remembered { fs.remember(a.ino, parent: named?.0, name: named?.1) }
        if fuse_reply_entry(req, &e) != 0 { fs.forget(a.ino, count: 1) }
        discard self
    }

    /// No such name, for the kernel to remember for the cache time (a negative entry).
    consuming func absent() {
        var e = fuse_entry_param()
        e.entry_timeout = bridge.cacheSeconds
        fuse_reply_entry(req, &e)
        discard self
    }

    consuming func attr(_ a: Attributes, cacheSeconds: Double? = nil) {
        var st = statOf(a)
        fuse_reply_attr(req, &st, a.changingElsewhere ? 0 : cacheSeconds ?? bridge.cacheSeconds)
        discard self
    }

    /// An open handle; `undo` closes it if the reply does not reach the kernel.
    consuming func opened(_ fi: UnsafeMutablePointer<fuse_file_info>, undo: () -> Void) {
        if fuse_reply_open(req, fi) != 0 { undo() }
        discard self
    }

    consuming func created(_ a: Attributes, named: (UInt64, [UInt8]), _ fi: UnsafeMutablePointer<fuse_file_info>, undo: () -> Void) {
        var e = entryOf(a, bridge.cacheSeconds)
        let fs = self.fs
        fs.remember(a.ino, parent: named.0, name: named.1)
        if fuse_reply_create(req, &e, fi) != 0 {
            fs.forget(a.ino, count: 1)
            undo()
        }
        discard self
    }

    /// Bytes (read, readlink, getxattr, a readdir page). False if the kernel did not get them.
    @discardableResult
    consuming func bytes(_ p: UnsafeRawPointer?, _ count: Int) -> Bool {
        let rc = fuse_reply_buf(req, p?.assumingMemoryBound(to: CChar.self), count)
        discard self
        return rc == 0
    }

    consuming func written(_ count: Int) {
        fuse_reply_write(req, count)
        discard self
    }

    consuming func xattrSize(_ count: Int) {
        fuse_reply_xattr(req, count)
        discard self
    }

    consuming func statfs(_ v: inout statvfs) {
        fuse_reply_statfs(req, &v)
        discard self
    }

    consuming func lock(_ l: inout flock) {
        fuse_reply_lock(req, &l)
        discard self
    }

    /// forget and forget_multi take no answer; libfuse still frees the request.
    consuming func none() {
        fuse_reply_none(req)
        discard self
    }

    /// Answered later, from another thread.
    consuming func pending() -> PendingRequest { PendingRequest(self) }

    // The shapes most operations take: run the model, answer its result or its error.

    consuming func run(_ op: String, _ ino: UInt64, _ body: () throws(FSError) -> Void) {
        do throws(FSError) { try body() } catch { fail(op, ino, error); return }
        ok()
    }

    consuming func entry(_ op: String, _ ino: UInt64, named: [UInt8]? = nil, _ body: () throws(FSError) -> Attributes) {
        let a: Attributes
        do throws(FSError) { a = try body() } catch { fail(op, ino, error); return }
        entry(a, named: named.map { (ino, $0) })
    }

    consuming func attr(_ op: String, _ ino: UInt64, _ body: () throws(FSError) -> Attributes) {
        let a: Attributes
        do throws(FSError) { a = try body() } catch { fail(op, ino, error); return }
        attr(a)
    }

    /// An attribute value or list: its size when the caller asks with size 0, ERANGE when it
    /// does not fit.
    consuming func xattrValue(_ op: String, _ ino: UInt64, size: Int,
                              _ body: () throws(FSError) -> [UInt8]) {
        let v: [UInt8]
        do throws(FSError) { v = try body() } catch { fail(op, ino, error); return }
        if size == 0 { xattrSize(v.count) }
        else if size < v.count { error(ERANGE) }
        else {
            // `self` cannot be consumed inside the closure that lends the bytes: reply with the
            // raw request there, and end `self` as answered after.
            let p = req
            v.withUnsafeBytes { _ = fuse_reply_buf(p, $0.baseAddress?.assumingMemoryBound(to: CChar.self), v.count) }
            answered()
        }
    }
}

/// A request that waits (a lock) and is answered later from another thread: once, whoever
/// answers first; never answered, it is answered EIO when it goes.
final class PendingRequest: @unchecked Sendable {
    private let lock = NSLock()
    private var request: Request?   // guarded by lock
    private let req: fuse_req_t?

    init(_ request: consuming Request) {
        req = request.req
        self.request = consume request
    }

    /// Whether the caller was interrupted by a signal (only asked before the answer).
    var interrupted: Bool {
        lock.lock()
        defer { lock.unlock() }
        return request != nil && fuse_req_interrupted(req) != 0
    }

    func answer(_ code: Int32) {
        lock.lock()
        let r = request.take()
        lock.unlock()
        r?.error(code)
    }
}

private func fileHandle(_ fi: UnsafeMutablePointer<fuse_file_info>?) -> UInt64 { fi?.pointee.fh ?? 0 }

/// Whether a pipe can be grown to 1 MiB, enough for a 1000 KiB read's reply (libfuse splices
/// only through a pipe that holds the whole reply).
private func pipesCanHoldAReply() -> Bool { ubiquityfs_pipe_can_hold(1 << 20) != 0 }

/// Zeros for the holes of a spliced reply: a read-only anonymous mapping, which takes no memory
/// (and which nothing writes).
nonisolated(unsafe) private let zeroPage: UnsafeMutableRawPointer = {
    let p = mmap(nil, 1 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    guard let p, p != UnsafeMutableRawPointer(bitPattern: -1) else { fatalError("cannot map 1 MiB of zeros") }
    return p
}()

/// Answers a read with `pieces` of blob files and zeros (libfuse splices the files into the
/// reply). Returns whether the reply reached the kernel.
private func replyPieces(_ req: fuse_req_t?, _ pieces: [FilePiece]) -> Bool {
    let count = max(pieces.count, 1)
    let bufOffset = MemoryLayout<fuse_bufvec>.offset(of: \fuse_bufvec.buf)!
    let bytes = bufOffset + count * MemoryLayout<fuse_buf>.stride
    let raw = UnsafeMutableRawPointer.allocate(byteCount: max(bytes, MemoryLayout<fuse_bufvec>.size),
                                               alignment: MemoryLayout<fuse_bufvec>.alignment)
    defer { raw.deallocate() }
    raw.initializeMemory(as: UInt8.self, repeating: 0, count: max(bytes, MemoryLayout<fuse_bufvec>.size))
    let vec = raw.bindMemory(to: fuse_bufvec.self, capacity: 1)
    vec.pointee.count = pieces.count
    let bufs = (raw + bufOffset).bindMemory(to: fuse_buf.self, capacity: count)
    for (i, piece) in pieces.enumerated() {
        switch piece {
        case .file(let fd, let offset, let length):
            bufs[i].size = length
            bufs[i].flags = fuse_buf_flags(rawValue: FUSE_BUF_IS_FD.rawValue | FUSE_BUF_FD_SEEK.rawValue)
            bufs[i].fd = fd
            bufs[i].pos = off_t(offset)
        case .zeros(let length):
            bufs[i].size = length
            bufs[i].mem = zeroPage
        }
    }
    return fuse_reply_data(req, vec, fuse_buf_copy_flags(rawValue: 0)) == 0
}

/// Whether the kernel asked (through the shim's read hook) to drop the file's set-ID bits; the
/// mark is taken out of the open flags it rode in.
private func takeDropSetID(_ flags: inout Int32) -> Bool {
    let mark = Int32(bitPattern: UBIQUITYFS_FLAG_KILL_SUIDGID)
    guard flags & mark != 0 else { return false }
    flags &= ~mark
    return true
}

/// Buffers for read replies, kept from one read to the next: a fresh 1 MiB buffer per read
/// faulted in its pages each time (a tenth of the daemon's CPU in a sequential read). A few are
/// kept (reads in flight at once are about as many as the kernel's read-ahead asks for);
/// others are freed.
final class ReadBuffers: @unchecked Sendable {
    static let shared = ReadBuffers()
    static let size = 1 << 20
    private let lock = NSLock()
    private var spare: [UnsafeMutableRawBufferPointer] = []   // guarded by lock

    func take(_ size: Int) -> UnsafeMutableRawBufferPointer {
        if size <= Self.size, let b = lock.withLock({ spare.popLast() }) { return b }
        return .allocate(byteCount: max(size, Self.size), alignment: 4096)
    }

    func give(_ buffer: UnsafeMutableRawBufferPointer) {
        let kept = buffer.count == Self.size && lock.withLock {
            guard spare.count < 8 else { return false }
            spare.append(buffer)
            return true
        }
        if !kept { buffer.deallocate() }
    }
}

/// Builds the operation table. Each entry makes its `Request` first and answers it through it.
func makeOperations() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()

    ops.`init` = { userdata, conn in
        guard let conn else { return }
        // A read of published content is spliced from the blob files into the reply: the
        // kernel copies once, where a pread into a buffer and a write of it copy twice. libfuse
        // splices only through a pipe that holds the whole reply, and without CAP_SYS_RESOURCE a
        // pipe holds 1 MiB (pipe-max-size): requests are held to 1000 KiB, so that a reply and
        // libfuse's margin fit. Where even that pipe cannot be had, libfuse would copy through a
        // buffer it allocates per read, slower than the daemon's own: the daemon copies.
        if let userdata {
            let bridge = Unmanaged<Bridge>.fromOpaque(userdata).takeUnretainedValue()
            if conn.pointee.capable & UInt32(FUSE_CAP_SPLICE_WRITE) != 0, pipesCanHoldAReply() {
                conn.pointee.want |= UInt32(FUSE_CAP_SPLICE_WRITE)
                conn.pointee.max_write = 1_024_000
                bridge.splicesReads.store(true, ordering: .releasing)
            } else {
                bridge.log("reads are copied through the daemon: "
                           + (conn.pointee.capable & UInt32(FUSE_CAP_SPLICE_WRITE) == 0
                              ? "libfuse offers no splice" : "a pipe cannot hold a whole read (pipe-max-size)"))
            }
        }
        // Kernel-side write-back caching would let the kernel reorder and merge writes behind the
        // coordination layer's back; the working copy is the cache.
        conn.pointee.want &= ~UInt32(FUSE_CAP_WRITEBACK_CACHE)
        // Locks go to the store's lock table, so a lock through another mount of the store
        // conflicts too (the kernel alone knows only this mount's).
        for cap in [FUSE_CAP_ATOMIC_O_TRUNC, FUSE_CAP_POSIX_LOCKS, FUSE_CAP_FLOCK_LOCKS] {
            if conn.pointee.capable & UInt32(cap) != 0 { conn.pointee.want |= UInt32(cap) }
        }
    }

    ops.lookup = { req, parent, cname in
        let r = Request(req), fs = r.fs
        if let plan = r.replayPlan, let answer = plan.answers[.init(parent, name(cname))] {
            let state = r.bridge.replay
            r.replayLookup(answer, state)
            return
        }
        let n = name(cname)
        let a: Attributes
        do throws(FSError) { a = try fs.lookup(parent: parent, name: n, forKernel: true) } catch {
            // A missing name the kernel may remember (git, compilers and `ls -l` probe for
            // the same missing names again and again): an entry of inode 0.
            if error.errno == ENOENT, r.bridge.cacheSeconds > 0, fs.absenceMayBeCached(in: parent, name: n) {
                r.absent()
            } else {
                r.fail("lookup", parent, error)
            }
            return
        }
        if let faults = r.bridge.faults { try? faults.check(.lookupAnswer) }
        r.entry(a, named: (parent, n), remembered: true)
    }

    ops.forget = { req, ino, count in
        let r = Request(req, takesNoAnswer: true)
        r.fs.forget(ino, count: count)
        r.none()
    }

    ops.forget_multi = { req, count, forgets in
        let r = Request(req, takesNoAnswer: true), fs = r.fs
        for i in 0..<count {
            if let f = forgets?[i] { fs.forget(f.ino, count: f.nlookup) }
        }
        r.none()
    }

    ops.getattr = { req, ino, _ in
        let r = Request(req), fs = r.fs
        if let plan = r.replayPlan, let a = plan.attributes[ino] {
            if !ReplayPlan.isStandIn(ino), let now = try? fs.getattr(ino) { r.attr(now, cacheSeconds: 0) } else { r.attr(a, cacheSeconds: 0) }
            return
        }
        r.attr("getattr", ino) { () throws(FSError) in try fs.getattr(ino) }
    }

    ops.setattr = { req, ino, attr, toSet, fi in
        let r = Request(req), fs = r.fs, who = r.caller
        guard let attr else { r.error(EINVAL); return }
        let a = attr.pointee
        var c = AttributeChanges()
        if toSet & FUSE_SET_ATTR_MODE != 0 { c.mode = UInt32(a.st_mode) }

        if toSet & FUSE_SET_ATTR_UID != 0 { c.uid = a.st_uid }
        if toSet & FUSE_SET_ATTR_GID != 0 { c.gid = a.st_gid }
        if toSet & FUSE_SET_ATTR_SIZE != 0 { c.size = UInt64(a.st_size) }
        if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 { c.atime = .now }
        else if toSet & FUSE_SET_ATTR_ATIME != 0 { c.atime = .at(nanoseconds(a.st_atim)) }
        if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 { c.mtime = .now }
        else if toSet & FUSE_SET_ATTR_MTIME != 0 { c.mtime = .at(nanoseconds(a.st_mtim)) }
        let h: UInt64? = fi.map { $0.pointee.fh }
        if let plan = r.replayPlan {
            // A replay of new content: the kernel is told what the file is, nothing is set.
            guard plan.op == .touch(ino) else { r.error(EAGAIN); return }
            r.attr("replayed setattr", ino) { () throws(FSError) in try fs.getattr(ino) }
            return
        }
        // A truncation by a caller without CAP_FSETID, or a chown of a non-folder (the shim's
        // mark in the mode it does not set).
        if toSet & FUSE_SET_ATTR_MODE == 0 && UInt32(a.st_mode) & UBIQUITYFS_MODE_KILL_SUIDGID != 0 {
            do throws(FSError) { try r.dropSetID(ino) } catch { r.fail("setattr", ino, error); return }
        }
        r.attr("setattr", ino) { () throws(FSError) in try fs.setattr(ino, c, handle: h, caller: who) }
    }

    ops.readlink = { req, ino in
        let r = Request(req)
        let target: [UInt8]
        do throws(FSError) { target = try r.fs.readlink(ino) } catch { r.fail("readlink", ino, error); return }
        r.link(target)
    }

    ops.mknod = { req, parent, cname, mode, rdev in
        let r = Request(req), fs = r.fs, who = r.caller
        if let plan = r.replayPlan { r.replayMake(plan, parent, name(cname)); return }
        r.entry("mknod", parent, named: name(cname)) { () throws(FSError) in
            try fs.mknod(parent: parent, name: name(cname), mode: UInt32(mode), rdev: UInt64(rdev), caller: who)
        }
    }

    ops.mkdir = { req, parent, cname, mode in
        let r = Request(req), fs = r.fs, who = r.caller
        if let plan = r.replayPlan { r.replayMake(plan, parent, name(cname)); return }
        r.entry("mkdir", parent, named: name(cname)) { () throws(FSError) in
            try fs.mkdir(parent: parent, name: name(cname), mode: UInt32(mode), caller: who)
        }
    }

    ops.unlink = { req, parent, cname in
        let r = Request(req), fs = r.fs
        if let plan = r.replayPlan { r.replayDone(plan, .remove(.init(parent, name(cname)))); return }
        r.run("unlink", parent) { () throws(FSError) in try fs.unlink(parent: parent, name: name(cname)) }
    }

    ops.rmdir = { req, parent, cname in
        let r = Request(req), fs = r.fs
        if let plan = r.replayPlan { r.replayDone(plan, .remove(.init(parent, name(cname)))); return }
        r.run("rmdir", parent) { () throws(FSError) in try fs.rmdir(parent: parent, name: name(cname)) }
    }

    ops.symlink = { req, link, parent, cname in
        let r = Request(req), fs = r.fs, who = r.caller
        if let plan = r.replayPlan { r.replayMake(plan, parent, name(cname)); return }
        r.entry("symlink", parent, named: name(cname)) { () throws(FSError) in
            try fs.symlink(parent: parent, name: name(cname), target: name(link), caller: who)
        }
    }

    ops.rename = { req, parent, cname, newParent, newName, flags in
        let r = Request(req), fs = r.fs
        if let plan = r.replayPlan {
            r.replayDone(plan, .move(.init(parent, name(cname)), .init(newParent, name(newName))))
            return
        }
        r.run("rename", parent) { () throws(FSError) in
            try fs.rename(parent: parent, name: name(cname), newParent: newParent, newName: name(newName),
                          flags: RenameFlags(rawValue: UInt32(flags)))
        }
    }

    ops.link = { req, ino, newParent, newName in
        let r = Request(req), fs = r.fs
        if r.replayPlan != nil { r.error(EAGAIN); return }   // a replay never makes this call
        r.entry("link", ino) { () throws(FSError) in try fs.link(ino, newParent: newParent, newName: name(newName)) }
    }

    ops.open = { req, ino, fi in
        let r = Request(req), fs = r.fs
        if r.replayPlan != nil { r.error(EAGAIN); return }   // a replay never makes this call
        guard let fi else { r.error(EINVAL); return }
        // An O_TRUNC by a caller without CAP_FSETID: the bits go before the content, as on ext4
        // (after it, a failure would leave the file emptied by an open that failed).
        if takeDropSetID(&fi.pointee.flags) {
            do throws(FSError) { try r.dropSetID(ino) } catch { r.fail("open", ino, error); return }
        }
        do throws(FSError) { fi.pointee.fh = try fs.open(ino, flags: fi.pointee.flags) } catch { r.fail("open", ino, error); return }
        if fs.keepsKernelCache(ino, truncating: fi.pointee.flags & O_TRUNC != 0) { fi.pointee.keep_cache = 1 }
        r.opened(fi) { try? fs.release(handle: fi.pointee.fh) }
    }

    ops.create = { req, parent, cname, mode, fi in
        let r = Request(req), fs = r.fs
        if r.replayPlan != nil { r.error(EAGAIN); return }   // a replay never makes this call
        guard let fi else { r.error(EINVAL); return }
        let attrs: Attributes
        do throws(FSError) {
            let (a, handle) = try fs.create(parent: parent, name: name(cname), mode: UInt32(mode),
                                            flags: fi.pointee.flags, caller: r.caller)
            attrs = a
            fi.pointee.fh = handle
        } catch { r.fail("create", parent, error); return }
        r.created(attrs, named: (parent, name(cname)), fi) { try? fs.release(handle: fi.pointee.fh) }
    }

    ops.read = { req, ino, size, off, fi in
        let r = Request(req)
        if r.bridge.splicesReads.load(ordering: .acquiring) {
            let reply: FileReply?
            do throws(FSError) { reply = try r.fs.filePieces(handle: fileHandle(fi), offset: UInt64(off), count: size) }
            catch { r.fail("read", ino, error); return }
            if let reply {
                // No lock is held: blobs never change, and `reply` keeps their files open.
                withExtendedLifetime(reply) { _ = replyPieces(req, reply.pieces) }
                r.answered()
                return
            }
        }
        let buffer = ReadBuffers.shared.take(size)
        defer { ReadBuffers.shared.give(buffer) }
        let n: Int
        do throws(FSError) {
            n = try r.fs.read(handle: fileHandle(fi), offset: UInt64(off),
                              into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<size]))
        } catch { r.fail("read", ino, error); return }
        r.bytes(buffer.baseAddress, n)
    }

    ops.write = { req, ino, buf, size, off, fi in
        let r = Request(req)
        if r.replayPlan != nil { r.error(EAGAIN); return }   // a replay never makes this call
        let n: Int
        do throws(FSError) {
            if let fi, takeDropSetID(&fi.pointee.flags) { try r.dropSetID(ino) }
            n = try r.fs.write(handle: fileHandle(fi), offset: UInt64(off), bytes: UnsafeRawBufferPointer(start: buf, count: size))
        } catch { r.fail("write", ino, error); return }
        r.written(n)
    }

    ops.flush = { req, ino, fi in
        let r = Request(req), fs = r.fs
        // close(2) of any descriptor drops the closing process's POSIX locks on the file.
        if let fi { fs.releaseLocks(ino, owner: fi.pointee.lock_owner, style: .posix) }
        r.run("flush", ino) { () throws(FSError) in try fs.flush(handle: fileHandle(fi)) }
    }

    ops.release = { req, ino, fi in
        let r = Request(req), fs = r.fs
        // The last close of an open file description drops its flock lock.
        if let fi, fi.pointee.flock_release != 0 { fs.releaseLocks(ino, owner: fi.pointee.lock_owner, style: .flock) }
        r.run("release", ino) { () throws(FSError) in try fs.release(handle: fileHandle(fi)) }
    }

    ops.getlk = { req, ino, fi, lock in
        let r = Request(req)
        guard let fi, let lock, let mode = lockMode(lock.pointee.l_type) else { r.error(EINVAL); return }
        let range = LockRange(start: Int64(lock.pointee.l_start), length: Int64(lock.pointee.l_len))
        let held: HeldLock?
        do throws(FSError) { held = try r.fs.testLock(ino, owner: fi.pointee.lock_owner, mode: mode, range: range) }
        catch { r.fail("getlk", ino, error); return }
        var answer = flock()
        answer.l_whence = Int16(SEEK_SET)
        if let held {
            answer.l_type = Int16(held.mode == .write ? F_WRLCK : F_RDLCK)
            answer.l_start = __off_t(held.range.start)
            answer.l_len = __off_t(held.range.length)
            answer.l_pid = held.pid
        } else {
            answer = lock.pointee
            answer.l_type = Int16(F_UNLCK)
        }
        r.lock(&answer)
    }

    ops.setlk = { req, ino, fi, lock, sleep in
        let r = Request(req)
        guard let fi, let lock else { r.error(EINVAL); return }
        let l = lock.pointee
        let mode = lockMode(l.l_type)
        guard mode != nil || l.l_type == Int16(F_UNLCK) else { r.error(EINVAL); return }
        let range = LockRange(start: Int64(l.l_start), length: Int64(l.l_len))
        let pid = l.l_pid != 0 ? l.l_pid : r.caller.pid
        setLock(r, ino, owner: fi.pointee.lock_owner, style: .posix, mode: mode, range: range, pid: pid,
                handle: fi.pointee.fh, wait: sleep != 0)
    }

    ops.flock = { req, ino, fi, op in
        let r = Request(req)
        guard let fi else { r.error(EINVAL); return }
        let mode: LockMode?
        switch op & ~LOCK_NB {
        case LOCK_SH: mode = .read
        case LOCK_EX: mode = .write
        case LOCK_UN: mode = nil
        default: r.error(EINVAL); return
        }
        let pid = r.caller.pid
        setLock(r, ino, owner: fi.pointee.lock_owner, style: .flock, mode: mode, range: .wholeFile,
                pid: pid, handle: fi.pointee.fh, wait: op & LOCK_NB == 0)
    }

    ops.fsync = { req, ino, datasync, fi in
        let r = Request(req), fs = r.fs
        r.run("fsync", ino) { () throws(FSError) in try fs.fsync(handle: fileHandle(fi), dataOnly: datasync != 0) }
    }

    ops.opendir = { req, ino, fi in
        let r = Request(req), fs = r.fs
        guard let fi else { r.error(EINVAL); return }
        do throws(FSError) { fi.pointee.fh = try fs.opendir(ino) } catch { r.fail("opendir", ino, error); return }
        // The kernel keeps the listing (`git status` lists every folder of a checkout each time).
        if r.bridge.cacheSeconds > 0, fs.listingMayBeCached(ino) {
            fi.pointee.cache_readdir = 1
            fi.pointee.keep_cache = 1
        }
        r.opened(fi) { fs.releasedir(handle: fi.pointee.fh) }
    }

    ops.readdir = { req, ino, size, off, fi in
        readdir(Request(req), ino, size, off, fi, plus: false)
    }

    ops.readdirplus = { req, ino, size, off, fi in
        readdir(Request(req), ino, size, off, fi, plus: true)
    }

    ops.releasedir = { req, _, fi in
        let r = Request(req)
        r.fs.releasedir(handle: fileHandle(fi))
        r.ok()
    }

    ops.fsyncdir = { req, ino, _, _ in
        // Namespace changes are committed (not synced) before each reply; make them durable.
        let r = Request(req), fs = r.fs
        r.run("fsyncdir", ino) { () throws(FSError) in try fs.fsyncDirectory() }
    }

    ops.statfs = { req, _ in
        let r = Request(req)
        let s = r.fs.statfs()
        var v = statvfs()
        v.f_bsize = UInt(s.blockSize)
        v.f_frsize = UInt(s.blockSize)
        v.f_blocks = __fsblkcnt_t(s.totalBlocks)
        v.f_bfree = __fsblkcnt_t(s.freeBlocks)
        v.f_bavail = __fsblkcnt_t(s.availableBlocks)
        v.f_files = __fsfilcnt_t(s.totalFiles)
        v.f_ffree = __fsfilcnt_t(s.freeFiles)
        v.f_favail = __fsfilcnt_t(s.freeFiles)
        v.f_namemax = UInt(s.nameMax)
        r.statfs(&v)
    }

    ops.setxattr = { req, ino, cname, value, size, flags in
        let r = Request(req), fs = r.fs
        if r.replayPlan != nil { r.error(EAGAIN); return }   // a replay never makes this call
        let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
        r.run("setxattr", ino) { () throws(FSError) in
            try fs.setxattr(ino, name: name(cname), value: bytes, flags: flags)
        }
    }

    ops.getxattr = { req, ino, cname, size in
        let r = Request(req), fs = r.fs
        r.xattrValue("getxattr", ino, size: size) { () throws(FSError) in
            try fs.getxattr(ino, name: name(cname))
        }
    }

    ops.listxattr = { req, ino, size in
        let r = Request(req), fs = r.fs
        r.xattrValue("listxattr", ino, size: size) { () throws(FSError) in
            var out: [UInt8] = []
            for n in try fs.listxattr(ino) { out += n; out.append(0) }
            return out
        }
    }

    ops.removexattr = { req, ino, cname in
        let r = Request(req), fs = r.fs
        if r.replayPlan != nil { r.error(EAGAIN); return }   // a replay never makes this call
        r.run("removexattr", ino) { () throws(FSError) in try fs.removexattr(ino, name: name(cname)) }
    }

    ops.access = { req, ino, mask in
        let r = Request(req), fs = r.fs, who = r.caller
        r.run("access", ino) { () throws(FSError) in try fs.access(ino, mask: mask, caller: who) }
    }

    return ops
}

extension Request {
    /// The request was answered with the raw `req` (inside a closure that lends bytes, where
    /// `self` cannot be consumed): end it without the `deinit` answer.
    consuming func answered() { discard self }

    /// readlink's answer, a C string.
    consuming func link(_ target: [UInt8]) {
        var cstring = target
        cstring.append(0)
        let p = req
        cstring.withUnsafeBufferPointer { b in
            b.baseAddress!.withMemoryRebound(to: CChar.self, capacity: b.count) { _ = fuse_reply_readlink(p, $0) }
        }
        answered()
    }
}

private func lockMode(_ type: Int16) -> LockMode? {
    switch Int32(type) {
    case F_RDLCK: return .read
    case F_WRLCK: return .write
    default: return nil
    }
}

/// Take, change or drop a lock; one that must wait is answered later, from the model's lock
/// waiter, and ends with EINTR if the caller is interrupted meanwhile.
private func setLock(_ r: consuming Request, _ ino: fuse_ino_t, owner: UInt64, style: LockStyle, mode: LockMode?,
                     range: LockRange, pid: Int32, handle: UInt64, wait: Bool) {
    let fs = r.fs
    let op = style == .posix ? "setlk" : "flock"
    let taken: Bool
    do throws(FSError) { taken = try fs.setLock(ino, owner: owner, style: style, mode: mode, range: range, pid: pid, handle: handle) }
    catch { r.fail(op, ino, error); return }
    if taken { r.ok(); return }
    guard let mode, wait else { r.error(EAGAIN); return }
    let log = r.bridge.log
    let pending = r.pending()
    fs.waitForLock(ino, owner: owner, style: style, mode: mode, range: range, pid: pid, handle: handle,
                   interrupted: { pending.interrupted },
                   done: { code in
                       if code != 0 && code != EINTR { log("\(op) node \(ino): \(errnoName(code)) while waiting") }
                       pending.answer(code)
                   })
}

/// Fill one readdir(plus) reply from the handle's snapshot, starting at `off`.
private func readdir(_ r: consuming Request, _ ino: fuse_ino_t, _ size: Int, _ off: off_t,
                     _ fi: UnsafeMutablePointer<fuse_file_info>?, plus: Bool) {
    let b = r.bridge
    let req = r.req
    let entries: [DirectoryEntry]
    do throws(FSError) { entries = try b.fs.readdir(handle: fileHandle(fi), offset: Int(off)) } catch {
        r.fail("readdir", ino, error)
        return
    }
    let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(size, 1))
    defer { buffer.deallocate() }
    var used = 0
    // readdirplus entries with a node id count as lookups, from when their attributes are read
    // until the reply fails, if it does.
    var added: [(UInt64, [UInt8])] = []
    for entry in entries {
        var counted: UInt64?
        var cname = entry.name
        cname.append(0)
        let needed: Int = cname.withUnsafeBufferPointer { p in
            p.baseAddress!.withMemoryRebound(to: CChar.self, capacity: p.count) { namePtr in
                let isDot = entry.name == [0x2e] || entry.name == [0x2e, 0x2e]
                if plus {
                    // The size first (libfuse's answer for no buffer): no lookup for an entry
                    // that does not fit, which would count a node only to take it back.
                    let wanted = fuse_add_direntry_plus(req, nil, 0, namePtr, nil, 0)
                    if wanted > size - used { return wanted }
                    var e = fuse_entry_param()
                    // Counted as the attributes are read (see `UbiquityFileSystem.lookup`).
                    if !isDot, let a = try? b.fs.lookup(parent: ino, name: entry.name, forKernel: true) {
                        if a.ino == entry.ino {
                            e = entryOf(a, b.cacheSeconds)
                            counted = a.ino
                        } else {
                            b.fs.forget(a.ino, count: 1)
                        }
                    }
                    if counted == nil {
                        // "." and "..", or a name that changed since opendir's snapshot: list it
                        // without a node id, so the kernel caches no name → node binding for it.
                        e.attr.st_ino = __ino_t(entry.ino)
                        e.attr.st_mode = __mode_t(entry.kind.typeBits)
                    }
                    return fuse_add_direntry_plus(req, buffer + used, size - used, namePtr, &e, off_t(entry.nextOffset))
                } else {
                    var st = stat()
                    st.st_ino = __ino_t(entry.ino)
                    st.st_mode = __mode_t(entry.kind.typeBits)
                    return fuse_add_direntry(req, buffer + used, size - used, namePtr, &st, off_t(entry.nextOffset))
                }
            }
        }
        if needed > size - used { break }
        used += needed
        if let counted { added.append((counted, entry.name)) }
    }
    if !r.bytes(buffer, used) {
        for (child, _) in added { b.fs.forget(child, count: 1) }
    }
}

/// A mounted FUSE session serving one filesystem.
public final class FuseSession: @unchecked Sendable {
    private let session: OpaquePointer
    private let bridgeRef: Unmanaged<Bridge>
    public let mountpoint: String
    private var mounted = false
    private let readOnly: Bool
    private let replayer: Replayer
    /// The request loop runs (set before it starts, cleared when it ends).
    private let serving = Atomic<Bool>(true)
    /// Invalidations the kernel did not hear, sent again (set once, at the end of init).
    private var unheard: UnheardInvalidations!
    /// What `run` sets the mount's read-ahead to, in KiB (0: the kernel's default).
    public var readAheadKiB = FuseSession.defaultReadAheadKiB
    /// The mount's device, "0:N" (the caller reads it from /proc/self/mountinfo): where its
    /// read-ahead is set (`/sys/class/bdi/0:N`). Without it the kernel's stays.
    public var device: String?

    /// Threads per CPU serving requests over FUSE-over-io_uring when the kernel offers it (the
    /// fuse module's `enable_uring`); 0 keeps every request on /dev/fuse. One session per process.
    public var ioUringThreadsPerCPU = FuseSession.defaultIoUringThreadsPerCPU
    /// Enough that requests answered slowly (a cold chunk, an fsync) leave threads for the
    /// CPU's others; each thread has a buffer as large as the largest request (1000 KiB),
    /// touched only as requests fill it.
    public static let defaultIoUringThreadsPerCPU = 4

    /// The kernel gives a new FUSE mount 128 KiB of read-ahead, while the disk under a store
    /// usually reads ahead far more (8 MiB on this kind of virtual disk): a cold sequential read
    /// would wait on the daemon, and the daemon on the disk, every 128 KiB.
    public static let defaultReadAheadKiB = 4096

    /// How long the kernel keeps names and attributes by default. Changes through this mount
    /// reach the kernel's cache as the kernel makes them; other writers' changes are invalidated
    /// by the change feed within about 0.1 s; so the time bounds only how stale the cache can get
    /// while the store's change log cannot be read.
    public static let defaultCacheSeconds = 10.0

    /// Create the session and mount it. `options` are `-o` options (e.g. "allow_other", "ro").
    /// `source` is what `df`, `mount` and `findmnt` show as the mount's source (fsname); its
    /// type shows as `fuse.ubiquityfs`.
    public init(fs: UbiquityFileSystem, mountpoint: String, options: [String], source: String = "ubiquityfs",
                cacheSeconds: Double = FuseSession.defaultCacheSeconds, faults: FaultPlan? = nil,
                log: @escaping @Sendable (String) -> Void) throws {
        self.mountpoint = mountpoint
        readOnly = options.contains("ro")
        // libfuse splits options at commas and takes a backslash as an escape.
        let fsname = source.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: ",", with: "\\,")
        let all = ["default_permissions", "fsname=" + fsname, "subtype=ubiquityfs"] + options
        let words: [String] = ["ubiquityfs", "-o", all.joined(separator: ",")]
        var argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) }
        defer { argv.forEach { free($0) } }
        let bridge = Bridge(fs: fs, cacheSeconds: cacheSeconds, faults: faults, log: log)
        replayer = Replayer(mountpoint: mountpoint, state: bridge.replay, log: log)
        let ref = Unmanaged.passRetained(bridge)
        bridgeRef = ref
        var ops = makeOperations()
        let made: OpaquePointer? = argv.withUnsafeMutableBufferPointer { p in
            var args = fuse_args(argc: Int32(p.count), argv: p.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, ref.toOpaque())
        }
        guard let made else {
            bridgeRef.release()
            throw FSError(EINVAL, "libfuse refused the mount options: \(all.joined(separator: ","))")
        }
        session = made
        guard fuse_session_mount(session, mountpoint) == 0 else {
            fuse_session_destroy(session)
            bridgeRef.release()
            throw FSError(EIO, "cannot mount on \(mountpoint) (is it an existing empty folder, and is /dev/fuse usable?)")
        }
        mounted = true
        unheard = UnheardInvalidations(send: { [unowned self] changes in sendWhileServing(changes) },
                                       held: { changes in fs.heldByKernel(changes) })
    }

    /// Serve requests on worker threads until unmounted (`fusermount3 -u`) or a signal arrives.
    /// Returns the signal number, or 0.
    public func run() -> Int32 {
        // A daemon started from a shell's background job inherits SIGINT ignored; libfuse would
        // then leave it ignored.
        signal(SIGINT, SIG_DFL)
        signal(SIGTERM, SIG_DFL)
        signal(SIGHUP, SIG_DFL)
        fuse_set_signal_handlers(session)
        let config = fuse_loop_cfg_create()
        fuse_loop_cfg_set_max_threads(config, 16)
        fuse_loop_cfg_set_idle_threads(config, 4)
        // Root only; an anonymous device (major 0), never the disk under the mountpoint.
        if readAheadKiB > 0, let device, device.hasPrefix("0:") {
            let bridge = bridgeRef.takeUnretainedValue()
            bridge.readAhead = ("/sys/class/bdi/\(device)/read_ahead_kb", readAheadKiB)
            bridge.readAheadPending.store(true, ordering: .releasing)
        }
        // The kernel's kill flags reach the ops through the device hooks; without them the
        // kernel keeps dropping set-ID bits itself, and asks for security.capability per write.
        // The same hooks serve requests over io_uring when the kernel offers it.
        let logRing: ubiquityfs_log_fn = { message, context in
            guard let message, let context else { return }
            Unmanaged<Bridge>.fromOpaque(context).takeUnretainedValue().log(String(cString: message))
        }
        if ubiquityfs_custom_io(session, mountpoint, Int32(ioUringThreadsPerCPU), logRing, bridgeRef.toOpaque()) != 0 {
            bridgeRef.takeUnretainedValue().log("libfuse refused custom device I/O: set-ID bits stay the kernel's to drop")
        }
        let result = fuse_session_loop_mt(session, config)
        // The rings' threads serve this session: they end before it does.
        ubiquityfs_ring_stop()
        let served = ubiquityfs_ring_served()
        if served > 0 { bridgeRef.takeUnretainedValue().log("io_uring carried \(served) requests") }
        // Nothing answers a replay from now on; one still in flight ends when the session is
        // destroyed (the kernel fails it), and invalidations no longer wait for it.
        serving.store(false, ordering: .releasing)
        replayer.stop()
        fuse_loop_cfg_destroy(config)
        fuse_remove_signal_handlers(session)
        return result
    }

    /// Tell the kernel to drop what it cached of things another writer changed. Call from a
    /// thread of its own (never a FUSE worker) with no model lock held: the kernel may need the
    /// daemon to answer other requests (a FORGET, a lookup) before the notification returns.
    /// ENOENT (the kernel had nothing cached) is not an error, but for a node it may mean an
    /// answer on its way that predates the change: those are sent again (see
    /// `UnheardInvalidations`).
    public func invalidate(_ changes: [KernelInvalidation]) {
        guard mounted, let missed = sendWhileServing(changes) else { return }
        unheard.add(missed)
    }

    /// Sends `changes`, never beside a replay (see `Replayer.whileIdle`); returns the node
    /// invalidations the kernel answered ENOENT (a name's ENOENT only means nothing was
    /// cached), or nil once nothing serves.
    private func sendWhileServing(_ changes: [KernelInvalidation]) -> [KernelInvalidation]? {
        while serving.load(ordering: .acquiring) {
            var missed: [KernelInvalidation] = []
            if replayer.whileIdle(seconds: 1, { missed = send(changes) }) { return missed }
        }
        return nil
    }

    private func send(_ changes: [KernelInvalidation]) -> [KernelInvalidation] {
        var missed: [KernelInvalidation] = []
        for change in changes {
            let result: Int32
            switch change {
            case .entry(let parent, let name):
                result = name.withUnsafeBufferPointer { p in
                    p.baseAddress!.withMemoryRebound(to: CChar.self, capacity: p.count) {
                        fuse_lowlevel_notify_inval_entry(session, fuse_ino_t(parent), $0, p.count)
                    }
                }
            case .node(let ino):
                result = fuse_lowlevel_notify_inval_inode(session, fuse_ino_t(ino), 0, 0)
            }
            if result == -ENOENT, case .node = change { missed.append(change) }
        }
        return missed
    }

    /// Make other writers' changes again through the mount, for programs watching it (see
    /// Replay.swift), on the replay thread, after the invalidations sent before. A read-only
    /// mount refuses every such call before asking, so it has no replays.
    public func replay(_ events: [WatchEvent]) {
        guard mounted, !readOnly, !events.isEmpty else { return }
        replayer.enqueue(events)
    }

    /// Unmount (if still mounted) and free the session.
    public func close() {
        serving.store(false, ordering: .releasing)   // if `run` never ran
        unheard?.stop()
        replayer.stop()
        // Answer lock requests still waiting while their session exists.
        bridgeRef.takeUnretainedValue().fs.stopLockWaits()
        if mounted {
            fuse_session_unmount(session)
            mounted = false
        }
        fuse_session_destroy(session)
        bridgeRef.release()
    }
}
