// Small helpers over POSIX calls shared by the embedded store: EINTR retries, errno → StoreError,
// full-length pread/pwrite, and the Linux calls the Glibc module does not import (syncfs,
// renameat2 are GNU extensions hidden behind _GNU_SOURCE), looked up once with dlsym.

import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Runs `body` again while it fails with EINTR (returns -1 and errno == EINTR).
@inline(__always)
package func retryEINTR<T: BinaryInteger>(_ body: () -> T) -> T {
    while true {
        let result = body()
        if result == -1 && errno == EINTR { continue }
        return result
    }
}

/// A StoreError for a failed system call: "what path: strerror".
package func systemError(_ what: String, _ path: String, _ code: Int32) -> StoreError {
    StoreError(errno: code, "\(what) \(path): \(String(cString: strerror(code)))")
}

/// Reads until `buffer` is full or end of file. Returns the count read.
package func preadFully(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, at offset: Int,
                path: @autoclosure () -> String) throws(StoreError) -> Int {
    guard offset >= 0 else { throw StoreError(errno: EINVAL, "read \(path()): negative offset \(offset)") }
    guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
    var done = 0
    while done < buffer.count {
        let n = retryEINTR { pread(fd, base + done, buffer.count - done, off_t(offset + done)) }
        if n < 0 { throw systemError("read", path(), errno) }
        if n == 0 { break }
        done += n
    }
    return done
}

/// Writes all of `bytes` at `offset` (retrying short writes).
package func pwriteFully(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int,
                 path: @autoclosure () -> String) throws(StoreError) {
    guard offset >= 0 else { throw StoreError(errno: EINVAL, "write \(path()): negative offset \(offset)") }
    guard let base = bytes.baseAddress, bytes.count > 0 else { return }
    var done = 0
    while done < bytes.count {
        let n = retryEINTR { pwrite(fd, base + done, bytes.count - done, off_t(offset + done)) }
        if n < 0 { throw systemError("write", path(), errno) }
        done += n
    }
}

/// `pwriteFully` of an array (Array.withUnsafeBytes is untyped-rethrows, hence the detour).
func pwriteFully(_ fd: Int32, _ bytes: [UInt8], at offset: Int,
                 path: @autoclosure () -> String) throws(StoreError) {
    let failure: StoreError? = bytes.withUnsafeBytes { raw in
        do throws(StoreError) {
            try pwriteFully(fd, raw, at: offset, path: path())
            return nil
        } catch {
            return error
        }
    }
    if let failure { throw failure }
}

/// `count` bytes read at `offset`, zeros past the end of the file (the detour as above).
func preadFully(_ fd: Int32, count: Int, at offset: Int, path: @autoclosure () -> String) throws(StoreError) -> [UInt8] {
    var bytes = [UInt8](repeating: 0, count: count)
    let failure: StoreError? = bytes.withUnsafeMutableBytes { raw in
        do throws(StoreError) {
            _ = try preadFully(fd, raw, at: offset, path: path())
            return nil
        } catch {
            return error
        }
    }
    if let failure { throw failure }
    return bytes
}

func fsyncChecked(_ fd: Int32, path: @autoclosure () -> String) throws(StoreError) {
    if retryEINTR({ fsync(fd) }) != 0 { throw systemError("fsync", path(), errno) }
}

func fdatasyncChecked(_ fd: Int32, path: @autoclosure () -> String) throws(StoreError) {
    #if os(Linux)
    if retryEINTR({ fdatasync(fd) }) != 0 { throw systemError("fdatasync", path(), errno) }
    #else
    if retryEINTR({ fsync(fd) }) != 0 { throw systemError("fsync", path(), errno) }
    #endif
}

/// Opens `path` and fsyncs it (a directory, to make the names in it durable).
package func fsyncDirectory(_ path: String) throws(StoreError) {
    let fd = retryEINTR { open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
    if fd < 0 { throw systemError("open", path, errno) }
    defer { close(fd) }
    try fsyncChecked(fd, path: path)
}

/// mkdir that accepts an existing directory. Returns true when it created it.
@discardableResult
func makeDirectory(_ path: String, mode: mode_t = 0o700) throws(StoreError) -> Bool {
    if retryEINTR({ mkdir(path, mode) }) == 0 { return true }
    let code = errno
    if code == EEXIST {
        var st = stat()
        if stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR { return false }
        throw systemError("mkdir", path, ENOTDIR)
    }
    throw systemError("mkdir", path, code)
}

/// mkdir -p: creates `path` and any missing parents (all with `mode`).
package func makeDirectories(_ path: String, mode: mode_t = 0o700) throws(StoreError) {
    var st = stat()
    if stat(path, &st) == 0 {
        if (st.st_mode & S_IFMT) == S_IFDIR { return }
        throw systemError("mkdir", path, ENOTDIR)
    }
    let parent = (path as NSString).deletingLastPathComponent
    if !parent.isEmpty && parent != path && parent != "/" {
        try makeDirectories(parent, mode: mode)
    }
    try makeDirectory(path, mode: mode)
}

// MARK: - Linux calls not imported by Glibc

#if os(Linux)
private typealias SyncfsFunction = @convention(c) (Int32) -> Int32
private typealias Renameat2Function = @convention(c) (Int32, UnsafePointer<CChar>?, Int32,
                                                      UnsafePointer<CChar>?, UInt32) -> Int32

private let syncfsFunction: SyncfsFunction? = {
    guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, "syncfs") else { return nil }
    return unsafeBitCast(symbol, to: SyncfsFunction.self)
}()

private let renameat2Function: Renameat2Function? = {
    guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, "renameat2") else { return nil }
    return unsafeBitCast(symbol, to: Renameat2Function.self)
}()
#endif

/// syncfs(2) on the filesystem holding `fd`; falls back to sync(2) where syncfs is missing.
func syncFilesystem(_ fd: Int32, path: String) throws(StoreError) {
    #if os(Linux)
    if let syncfs = syncfsFunction {
        if retryEINTR({ syncfs(fd) }) != 0 { throw systemError("syncfs", path, errno) }
        return
    }
    #endif
    sync()
}

/// rename(2) that fails with EEXIST instead of replacing an existing `to`.
func renameNoReplace(_ from: String, _ to: String) throws(StoreError) {
    #if os(Linux)
    if let renameat2 = renameat2Function {
        let rc = retryEINTR { renameat2(AT_FDCWD, from, AT_FDCWD, to, 1 /* RENAME_NOREPLACE */) }
        if rc == 0 { return }
        let code = errno
        if code != EINVAL && code != ENOSYS { throw systemError("rename to", to, code) }
        // The filesystem does not support RENAME_NOREPLACE: fall through to link + unlink.
    }
    #endif
    if retryEINTR({ link(from, to) }) != 0 { throw systemError("link to", to, errno) }
    _ = retryEINTR { unlink(from) }
}

/// A lock for the `@unchecked Sendable` classes of this module, with a typed-throws `withLock`.
package final class StoreMutex: @unchecked Sendable {
    // NSLock is itself thread-safe; this wrapper only adds typed throws.
    private let lock = NSLock()
    package init() {}
    @inline(__always)
    package func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }
}

/// Nanoseconds of the monotonic clock (for intervals; not a time of day).
package func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}
