// The FUSE bridge: libfuse3's low-level API adapted to UbiquityFileSystem. This is the only file
// that imports the libfuse shim. Each callback converts C arguments to plain values, calls the
// model with no lock held, and replies exactly once. Failures are replied with the model's errno
// and logged with the operation, node and errno (routine misses, such as a lookup of a name that
// does not exist, are not logged).

import CFuse
import Foundation
import UbiquityFileSystem
import UbiquityStore

final class Bridge: @unchecked Sendable {
    let fs: UbiquityFileSystem
    let log: @Sendable (String) -> Void
    /// How long the kernel may keep names and attributes without asking again.
    let cacheSeconds: Double
    init(fs: UbiquityFileSystem, cacheSeconds: Double, log: @escaping @Sendable (String) -> Void) {
        self.fs = fs
        self.cacheSeconds = cacheSeconds
        self.log = log
    }
}

@inline(__always)
private func bridge(_ req: fuse_req_t?) -> Bridge {
    // The session's userdata is an Unmanaged<Bridge> retained by FuseSession for the session's life.
    Unmanaged<Bridge>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
}

private func caller(_ req: fuse_req_t?) -> Caller {
    let ctx = fuse_req_ctx(req)!.pointee
    return Caller(uid: ctx.uid, gid: ctx.gid, pid: ctx.pid)
}

private func name(_ p: UnsafePointer<CChar>?) -> [UInt8] {
    guard let p else { return [] }
    return Array(UnsafeRawBufferPointer(start: p, count: strlen(p)))
}

/// Reply with the error and log it, unless it is a routine miss. The model's operations throw
/// only `FSError`, so the errno is the model's.
private func fail(_ req: fuse_req_t?, _ op: String, _ ino: UInt64, _ error: FSError, quiet: Set<Int32> = []) {
    if !quiet.contains(error.errno) {
        bridge(req).log("\(op) node \(ino): \(errnoName(error.errno)): \(error.message)")
    }
    fuse_reply_err(req, error.errno)
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

private func entryOf(_ a: Attributes, _ cacheSeconds: Double) -> fuse_entry_param {
    var e = fuse_entry_param()
    e.ino = fuse_ino_t(a.ino)
    e.generation = 1
    e.attr = statOf(a)
    e.attr_timeout = cacheSeconds
    e.entry_timeout = cacheSeconds
    return e
}

/// Reply with an entry; the kernel now holds one more reference to the node (until `forget`).
private func replyEntry(_ req: fuse_req_t?, _ a: Attributes) {
    var e = entryOf(a, bridge(req).cacheSeconds)
    let fs = bridge(req).fs
    fs.remember(a.ino)
    if fuse_reply_entry(req, &e) != 0 { fs.forget(a.ino, count: 1) }
}

private func replyAttr(_ req: fuse_req_t?, _ a: Attributes) {
    var st = statOf(a)
    fuse_reply_attr(req, &st, bridge(req).cacheSeconds)
}

private func fileHandle(_ fi: UnsafeMutablePointer<fuse_file_info>?) -> UInt64 { fi?.pointee.fh ?? 0 }

/// Builds the operation table. Every entry replies exactly once on every path.
func makeOperations() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()

    ops.`init` = { _, conn in
        guard let conn else { return }
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
        do throws(FSError) { replyEntry(req, try bridge(req).fs.lookup(parent: parent, name: name(cname))) }
        catch { fail(req, "lookup", parent, error, quiet: [ENOENT, ENAMETOOLONG]) }
    }

    ops.forget = { req, ino, count in
        bridge(req).fs.forget(ino, count: count)
        fuse_reply_none(req)
    }

    ops.forget_multi = { req, count, forgets in
        let fs = bridge(req).fs
        for i in 0..<count {
            if let f = forgets?[i] { fs.forget(f.ino, count: f.nlookup) }
        }
        fuse_reply_none(req)
    }

    ops.getattr = { req, ino, _ in
        do throws(FSError) { replyAttr(req, try bridge(req).fs.getattr(ino)) }
        catch { fail(req, "getattr", ino, error, quiet: [ENOENT]) }
    }

    ops.setattr = { req, ino, attr, toSet, fi in
        guard let attr else { fuse_reply_err(req, EINVAL); return }
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
        do throws(FSError) {
            let h: UInt64? = fi.map { $0.pointee.fh }
            replyAttr(req, try bridge(req).fs.setattr(ino, c, handle: h, caller: caller(req)))
        } catch { fail(req, "setattr", ino, error) }
    }

    ops.readlink = { req, ino in
        do throws(FSError) {
            var target = try bridge(req).fs.readlink(ino)
            target.append(0)
            target.withUnsafeBufferPointer { p in
                p.baseAddress!.withMemoryRebound(to: CChar.self, capacity: p.count) { _ = fuse_reply_readlink(req, $0) }
            }
        } catch { fail(req, "readlink", ino, error) }
    }

    ops.mknod = { req, parent, cname, mode, rdev in
        do throws(FSError) { replyEntry(req, try bridge(req).fs.mknod(parent: parent, name: name(cname), mode: UInt32(mode), rdev: UInt64(rdev), caller: caller(req))) }
        catch { fail(req, "mknod", parent, error, quiet: [EEXIST]) }
    }

    ops.mkdir = { req, parent, cname, mode in
        do throws(FSError) { replyEntry(req, try bridge(req).fs.mkdir(parent: parent, name: name(cname), mode: UInt32(mode), caller: caller(req))) }
        catch { fail(req, "mkdir", parent, error, quiet: [EEXIST]) }
    }

    ops.unlink = { req, parent, cname in
        do throws(FSError) { try bridge(req).fs.unlink(parent: parent, name: name(cname)); fuse_reply_err(req, 0) }
        catch { fail(req, "unlink", parent, error, quiet: [ENOENT]) }
    }

    ops.rmdir = { req, parent, cname in
        do throws(FSError) { try bridge(req).fs.rmdir(parent: parent, name: name(cname)); fuse_reply_err(req, 0) }
        catch { fail(req, "rmdir", parent, error, quiet: [ENOENT, ENOTEMPTY]) }
    }

    ops.symlink = { req, link, parent, cname in
        do throws(FSError) { replyEntry(req, try bridge(req).fs.symlink(parent: parent, name: name(cname), target: name(link), caller: caller(req))) }
        catch { fail(req, "symlink", parent, error, quiet: [EEXIST]) }
    }

    ops.rename = { req, parent, cname, newParent, newName, flags in
        do throws(FSError) {
            try bridge(req).fs.rename(parent: parent, name: name(cname), newParent: newParent, newName: name(newName),
                                      flags: RenameFlags(rawValue: UInt32(flags)))
            fuse_reply_err(req, 0)
        } catch { fail(req, "rename", parent, error, quiet: [ENOENT, ENOTEMPTY, EEXIST]) }
    }

    ops.link = { req, ino, newParent, newName in
        do throws(FSError) { replyEntry(req, try bridge(req).fs.link(ino, newParent: newParent, newName: name(newName))) }
        catch { fail(req, "link", ino, error) }
    }

    ops.open = { req, ino, fi in
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        do throws(FSError) {
            fi.pointee.fh = try bridge(req).fs.open(ino, flags: fi.pointee.flags)
            if fuse_reply_open(req, fi) != 0 { try? bridge(req).fs.release(handle: fi.pointee.fh) }
        } catch { fail(req, "open", ino, error) }
    }

    ops.create = { req, parent, cname, mode, fi in
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        do throws(FSError) {
            let (attrs, handle) = try bridge(req).fs.create(parent: parent, name: name(cname), mode: UInt32(mode),
                                                            flags: fi.pointee.flags, caller: caller(req))
            fi.pointee.fh = handle
            var e = entryOf(attrs, bridge(req).cacheSeconds)
            bridge(req).fs.remember(attrs.ino)
            if fuse_reply_create(req, &e, fi) != 0 {
                bridge(req).fs.forget(attrs.ino, count: 1)
                try? bridge(req).fs.release(handle: handle)
            }
        } catch { fail(req, "create", parent, error, quiet: [EEXIST]) }
    }

    ops.read = { req, ino, size, off, fi in
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(size, 1), alignment: 4096)
        defer { buffer.deallocate() }
        do throws(FSError) {
            let n = try bridge(req).fs.read(handle: fileHandle(fi), offset: UInt64(off),
                                           into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<size]))
            fuse_reply_buf(req, buffer.baseAddress!.assumingMemoryBound(to: CChar.self), n)
        } catch { fail(req, "read", ino, error) }
    }

    ops.write = { req, ino, buf, size, off, fi in
        do throws(FSError) {
            let n = try bridge(req).fs.write(handle: fileHandle(fi), offset: UInt64(off),
                                            bytes: UnsafeRawBufferPointer(start: buf, count: size))
            fuse_reply_write(req, n)
        } catch { fail(req, "write", ino, error) }
    }

    ops.flush = { req, ino, fi in
        let fs = bridge(req).fs
        // close(2) of any descriptor drops the closing process's POSIX locks on the file.
        if let fi { fs.releaseLocks(ino, owner: fi.pointee.lock_owner, style: .posix) }
        do throws(FSError) { try fs.flush(handle: fileHandle(fi)); fuse_reply_err(req, 0) }
        catch { fail(req, "flush", ino, error) }
    }

    ops.release = { req, ino, fi in
        let fs = bridge(req).fs
        // The last close of an open file description drops its flock lock.
        if let fi, fi.pointee.flock_release != 0 { fs.releaseLocks(ino, owner: fi.pointee.lock_owner, style: .flock) }
        do throws(FSError) { try fs.release(handle: fileHandle(fi)); fuse_reply_err(req, 0) }
        catch { fail(req, "release", ino, error) }
    }

    ops.getlk = { req, ino, fi, lock in
        guard let fi, let lock, let mode = lockMode(lock.pointee.l_type) else { fuse_reply_err(req, EINVAL); return }
        do throws(FSError) {
            let range = LockRange(start: Int64(lock.pointee.l_start), length: Int64(lock.pointee.l_len))
            var answer = flock()
            answer.l_whence = Int16(SEEK_SET)
            if let held = try bridge(req).fs.testLock(ino, owner: fi.pointee.lock_owner, mode: mode, range: range) {
                answer.l_type = Int16(held.mode == .write ? F_WRLCK : F_RDLCK)
                answer.l_start = __off_t(held.range.start)
                answer.l_len = __off_t(held.range.length)
                answer.l_pid = held.pid
            } else {
                answer = lock.pointee
                answer.l_type = Int16(F_UNLCK)
            }
            fuse_reply_lock(req, &answer)
        } catch { fail(req, "getlk", ino, error) }
    }

    ops.setlk = { req, ino, fi, lock, sleep in
        guard let fi, let lock else { fuse_reply_err(req, EINVAL); return }
        let l = lock.pointee
        let mode = lockMode(l.l_type)
        guard mode != nil || l.l_type == Int16(F_UNLCK) else { fuse_reply_err(req, EINVAL); return }
        let range = LockRange(start: Int64(l.l_start), length: Int64(l.l_len))
        let pid = l.l_pid != 0 ? l.l_pid : caller(req).pid
        setLock(req, ino, owner: fi.pointee.lock_owner, style: .posix, mode: mode, range: range, pid: pid,
                handle: fi.pointee.fh, wait: sleep != 0)
    }

    ops.flock = { req, ino, fi, op in
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        let mode: LockMode?
        switch op & ~LOCK_NB {
        case LOCK_SH: mode = .read
        case LOCK_EX: mode = .write
        case LOCK_UN: mode = nil
        default: fuse_reply_err(req, EINVAL); return
        }
        setLock(req, ino, owner: fi.pointee.lock_owner, style: .flock, mode: mode, range: .wholeFile,
                pid: caller(req).pid, handle: fi.pointee.fh, wait: op & LOCK_NB == 0)
    }

    ops.fsync = { req, ino, datasync, fi in
        do throws(FSError) { try bridge(req).fs.fsync(handle: fileHandle(fi), dataOnly: datasync != 0); fuse_reply_err(req, 0) }
        catch { fail(req, "fsync", ino, error) }
    }

    ops.opendir = { req, ino, fi in
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        do throws(FSError) {
            fi.pointee.fh = try bridge(req).fs.opendir(ino)
            if fuse_reply_open(req, fi) != 0 { bridge(req).fs.releasedir(handle: fi.pointee.fh) }
        } catch { fail(req, "opendir", ino, error) }
    }

    ops.readdir = { req, ino, size, off, fi in
        readdir(req, ino, size, off, fi, plus: false)
    }

    ops.readdirplus = { req, ino, size, off, fi in
        readdir(req, ino, size, off, fi, plus: true)
    }

    ops.releasedir = { req, _, fi in
        bridge(req).fs.releasedir(handle: fileHandle(fi))
        fuse_reply_err(req, 0)
    }

    ops.fsyncdir = { req, ino, _, _ in
        // Namespace changes are committed (not synced) before each reply; make them durable.
        do throws(FSError) { try bridge(req).fs.fsyncDirectory(); fuse_reply_err(req, 0) }
        catch { fail(req, "fsyncdir", ino, error) }
    }

    ops.statfs = { req, _ in
        let s = bridge(req).fs.statfs()
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
        fuse_reply_statfs(req, &v)
    }

    ops.setxattr = { req, ino, cname, value, size, flags in
        do throws(FSError) {
            let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
            try bridge(req).fs.setxattr(ino, name: name(cname), value: bytes, flags: flags)
            fuse_reply_err(req, 0)
        } catch { fail(req, "setxattr", ino, error, quiet: [EOPNOTSUPP]) }
    }

    ops.getxattr = { req, ino, cname, size in
        do throws(FSError) {
            let v = try bridge(req).fs.getxattr(ino, name: name(cname))
            if size == 0 { fuse_reply_xattr(req, v.count) }
            else if size < v.count { fuse_reply_err(req, ERANGE) }
            else { v.withUnsafeBytes { _ = fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), v.count) } }
        } catch { fail(req, "getxattr", ino, error, quiet: [ENODATA, ENOENT]) }
    }

    ops.listxattr = { req, ino, size in
        do throws(FSError) {
            var out: [UInt8] = []
            for n in try bridge(req).fs.listxattr(ino) { out += n; out.append(0) }
            if size == 0 { fuse_reply_xattr(req, out.count) }
            else if size < out.count { fuse_reply_err(req, ERANGE) }
            else { out.withUnsafeBytes { _ = fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), out.count) } }
        } catch { fail(req, "listxattr", ino, error) }
    }

    ops.removexattr = { req, ino, cname in
        do throws(FSError) { try bridge(req).fs.removexattr(ino, name: name(cname)); fuse_reply_err(req, 0) }
        catch { fail(req, "removexattr", ino, error, quiet: [ENODATA]) }
    }

    ops.access = { req, ino, mask in
        do throws(FSError) { try bridge(req).fs.access(ino, mask: mask, caller: caller(req)); fuse_reply_err(req, 0) }
        catch { fail(req, "access", ino, error, quiet: [EACCES]) }
    }

    return ops
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
private func setLock(_ req: fuse_req_t?, _ ino: fuse_ino_t, owner: UInt64, style: LockStyle, mode: LockMode?,
                     range: LockRange, pid: Int32, handle: UInt64, wait: Bool) {
    let fs = bridge(req).fs
    do throws(FSError) {
        if try fs.setLock(ino, owner: owner, style: style, mode: mode, range: range, pid: pid, handle: handle) {
            fuse_reply_err(req, 0)
        } else if let mode, wait {
            // A fuse_req_t is a pointer libfuse keeps valid until the one reply.
            let request = UnsafeSendable(req)
            let log = bridge(req).log
            let op = style == .posix ? "setlk" : "flock"
            fs.waitForLock(ino, owner: owner, style: style, mode: mode, range: range, pid: pid, handle: handle,
                           interrupted: { fuse_req_interrupted(request.value) != 0 },
                           done: { code in
                               if code != 0 && code != EINTR { log("\(op) node \(ino): \(errnoName(code)) while waiting") }
                               fuse_reply_err(request.value, code)
                           })
        } else {
            fuse_reply_err(req, EAGAIN)
        }
    } catch { fail(req, style == .posix ? "setlk" : "flock", ino, error) }
}

/// A value handed to another thread that Swift cannot prove safe to send: a libfuse request,
/// which libfuse lets any thread answer.
private struct UnsafeSendable<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}

/// Fill one readdir(plus) reply from the handle's snapshot, starting at `off`.
private func readdir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ off: off_t,
                     _ fi: UnsafeMutablePointer<fuse_file_info>?, plus: Bool) {
    let b = bridge(req)
    let entries: [DirectoryEntry]
    do throws(FSError) { entries = try b.fs.readdir(handle: fileHandle(fi), offset: Int(off)) } catch {
        fail(req, "readdir", ino, error)
        return
    }
    let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(size, 1))
    defer { buffer.deallocate() }
    var used = 0
    // readdirplus entries with a node id count as lookups, once the reply is sent.
    var added: [UInt64] = []
    for entry in entries {
        var counted: UInt64?
        var cname = entry.name
        cname.append(0)
        let needed: Int = cname.withUnsafeBufferPointer { p in
            p.baseAddress!.withMemoryRebound(to: CChar.self, capacity: p.count) { namePtr in
                let isDot = entry.name == [0x2e] || entry.name == [0x2e, 0x2e]
                if plus {
                    var e = fuse_entry_param()
                    if !isDot, let a = try? b.fs.lookup(parent: ino, name: entry.name), a.ino == entry.ino {
                        e = entryOf(a, b.cacheSeconds)
                        counted = a.ino
                    } else {
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
        if let counted { added.append(counted) }
    }
    for ino in added { b.fs.remember(ino) }
    if fuse_reply_buf(req, buffer, used) != 0 {
        for ino in added { b.fs.forget(ino, count: 1) }
    }
}

/// A mounted FUSE session serving one filesystem.
public final class FuseSession: @unchecked Sendable {
    private let session: OpaquePointer
    private let bridgeRef: Unmanaged<Bridge>
    public let mountpoint: String
    private var mounted = false

    /// How long the kernel keeps names and attributes by default. Changes through this mount
    /// reach the kernel's cache as the kernel makes them; other writers' changes are invalidated
    /// by the change feed within about 0.1 s; so the time bounds only how stale the cache can get
    /// while the store's change log cannot be read.
    public static let defaultCacheSeconds = 10.0

    /// Create the session and mount it. `options` are `-o` options (e.g. "allow_other", "ro").
    public init(fs: UbiquityFileSystem, mountpoint: String, options: [String],
                cacheSeconds: Double = FuseSession.defaultCacheSeconds,
                log: @escaping @Sendable (String) -> Void) throws {
        self.mountpoint = mountpoint
        let all = ["default_permissions", "fsname=ubiquityfs", "subtype=ubiquityfs"] + options
        let words: [String] = ["ubiquityfs", "-o", all.joined(separator: ",")]
        var argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) }
        defer { argv.forEach { free($0) } }
        let ref = Unmanaged.passRetained(Bridge(fs: fs, cacheSeconds: cacheSeconds, log: log))
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
        let result = fuse_session_loop_mt(session, config)
        fuse_loop_cfg_destroy(config)
        fuse_remove_signal_handlers(session)
        return result
    }

    /// Tell the kernel to drop what it cached of things another writer changed. Call from a
    /// thread of its own (never a FUSE worker) with no model lock held: the kernel may need the
    /// daemon to answer other requests (a FORGET, a lookup) before the notification returns.
    /// ENOENT (the kernel had nothing cached) is not an error.
    public func invalidate(_ changes: [KernelInvalidation]) {
        guard mounted else { return }
        for change in changes {
            switch change {
            case .entry(let parent, let name):
                _ = name.withUnsafeBufferPointer { p in
                    p.baseAddress!.withMemoryRebound(to: CChar.self, capacity: p.count) {
                        fuse_lowlevel_notify_inval_entry(session, fuse_ino_t(parent), $0, p.count)
                    }
                }
            case .node(let ino):
                _ = fuse_lowlevel_notify_inval_inode(session, fuse_ino_t(ino), 0, 0)
            }
        }
    }

    /// Unmount (if still mounted) and free the session.
    public func close() {
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
