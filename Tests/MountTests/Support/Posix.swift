// Thin POSIX helpers for the mount tests: calls whose exact errno matters, made from the test process
// through Glibc. A few functions that Swift's Glibc module does not import (`renameat2` and the xattr
// calls, which need _GNU_SOURCE or <sys/xattr.h>) are looked up with dlsym.

import Foundation
import Glibc

let renameNoReplace: UInt32 = 1 // RENAME_NOREPLACE
let renameExchange: UInt32 = 2  // RENAME_EXCHANGE
let xattrCreate: Int32 = 1      // XATTR_CREATE
let utimeOmit = (1 << 30) - 2   // UTIME_OMIT

enum Posix {
    /// An errno as "EPERM (Operation not permitted)" for messages.
    static func describe(_ code: Int32) -> String {
        let names: [Int32: String] = [
            EPERM: "EPERM", ENOENT: "ENOENT", EIO: "EIO", EBADF: "EBADF", EACCES: "EACCES",
            EEXIST: "EEXIST", EXDEV: "EXDEV", ENOTDIR: "ENOTDIR", EISDIR: "EISDIR", EINVAL: "EINVAL",
            ENOSPC: "ENOSPC", EROFS: "EROFS", ENAMETOOLONG: "ENAMETOOLONG", ENOSYS: "ENOSYS",
            ENOTEMPTY: "ENOTEMPTY", ENODATA: "ENODATA", ENOTSUP: "ENOTSUP", ENOTCONN: "ENOTCONN",
            EBUSY: "EBUSY", ELOOP: "ELOOP",
        ]
        if code == 0 { return "success" }
        return "\(names[code] ?? "errno \(code)") (\(String(cString: strerror(code))))"
    }

    // MARK: Files

    static func open(_ path: String, _ flags: Int32, _ mode: mode_t = 0o644) -> Int32 {
        Glibc.open(path, flags | O_CLOEXEC, mode)
    }

    /// Writes all of `bytes`; returns the byte count or -1.
    @discardableResult
    static func write(_ fd: Int32, _ bytes: [UInt8]) -> Int {
        bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
    }

    @discardableResult
    static func write(_ fd: Int32, _ text: String) -> Int { write(fd, Array(text.utf8)) }

    @discardableResult
    static func pwrite(_ fd: Int32, _ bytes: [UInt8], at offset: Int) -> Int {
        bytes.withUnsafeBytes { Glibc.pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
    }

    /// Reads up to `count` bytes at `offset`; nil on error.
    static func pread(_ fd: Int32, count: Int, at offset: Int) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: count)
        let n = buffer.withUnsafeMutableBytes { Glibc.pread(fd, $0.baseAddress, count, off_t(offset)) }
        guard n >= 0 else { return nil }
        return Array(buffer[0..<n])
    }

    static func preadText(_ fd: Int32, count: Int = 65536, at offset: Int = 0) -> String? {
        pread(fd, count: count, at: offset).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The whole content of a file read with read(2), or nil on error.
    static func readFile(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var result: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 { return nil }
            if n == 0 { return result }
            result += buffer[0..<n]
        }
    }

    static func readText(_ path: String) -> String? {
        readFile(path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Creates or truncates `path` and writes `bytes`; returns 0 or the errno of the failing call.
    @discardableResult
    static func writeFile(_ path: String, _ bytes: [UInt8], mode: mode_t = 0o644) -> Int32 {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode)
        guard fd >= 0 else { return errno }
        if write(fd, bytes) != bytes.count {
            let e = errno
            close(fd)
            return e == 0 ? EIO : e
        }
        return close(fd) == 0 ? 0 : errno
    }

    @discardableResult
    static func writeFile(_ path: String, _ text: String, mode: mode_t = 0o644) -> Int32 {
        writeFile(path, Array(text.utf8), mode: mode)
    }

    static func stat(_ path: String) -> Glibc.stat? {
        var st = Glibc.stat()
        return systemStat(path, &st) == 0 ? st : nil
    }

    static func lstat(_ path: String) -> Glibc.stat? {
        var st = Glibc.stat()
        return Glibc.lstat(path, &st) == 0 ? st : nil
    }

    static func fstat(_ fd: Int32) -> Glibc.stat? {
        var st = Glibc.stat()
        return Glibc.fstat(fd, &st) == 0 ? st : nil
    }

    static func exists(_ path: String) -> Bool { lstat(path) != nil }
    static func isDirectory(_ path: String) -> Bool { lstat(path).map { $0.st_mode & S_IFMT == S_IFDIR } ?? false }

    static func fileType(_ st: Glibc.stat) -> mode_t { st.st_mode & mode_t(S_IFMT) }

    static func readlink(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: 4097)
        let n = Glibc.readlink(path, &buffer, 4096)
        guard n >= 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    // MARK: Calls Swift's Glibc module does not import

    private static func symbol<T>(_ name: String, as type: T.Type) -> T {
        guard let handle = dlopen(nil, RTLD_NOW), let sym = dlsym(handle, name) else {
            fatalError("libc has no \(name)")
        }
        return unsafeBitCast(sym, to: type)
    }

    static func renameat2(_ from: String, _ to: String, flags: UInt32) -> Int32 {
        typealias Fn = @convention(c) (Int32, UnsafePointer<CChar>, Int32, UnsafePointer<CChar>, UInt32) -> Int32
        return symbol("renameat2", as: Fn.self)(AT_FDCWD, from, AT_FDCWD, to, flags)
    }

    static func setxattr(_ path: String, _ name: String, _ value: String, flags: Int32 = 0) -> Int32 {
        typealias Fn = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeRawPointer?, Int, Int32) -> Int32
        let bytes = Array(value.utf8)
        return bytes.withUnsafeBytes {
            symbol("setxattr", as: Fn.self)(path, name, $0.baseAddress, bytes.count, flags)
        }
    }

    /// The value of an extended attribute, or the errno.
    static func getxattr(_ path: String, _ name: String) -> Result<String, Errno> {
        typealias Fn = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeMutableRawPointer?, Int) -> Int
        var buffer = [UInt8](repeating: 0, count: 65536)
        let n = buffer.withUnsafeMutableBytes {
            symbol("getxattr", as: Fn.self)(path, name, $0.baseAddress, $0.count)
        }
        guard n >= 0 else { return .failure(Errno(errno)) }
        return .success(String(decoding: buffer[0..<n], as: UTF8.self))
    }

    /// The names of the extended attributes of `path`, or the errno.
    static func listxattr(_ path: String) -> Result<[String], Errno> {
        typealias Fn = @convention(c) (UnsafePointer<CChar>, UnsafeMutablePointer<CChar>?, Int) -> Int
        var buffer = [CChar](repeating: 0, count: 65536)
        let n = buffer.withUnsafeMutableBufferPointer {
            symbol("listxattr", as: Fn.self)(path, $0.baseAddress, $0.count)
        }
        guard n >= 0 else { return .failure(Errno(errno)) }
        let names = buffer[0..<n].split(separator: 0).map {
            String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        return .success(names)
    }

    static func removexattr(_ path: String, _ name: String) -> Int32 {
        typealias Fn = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>) -> Int32
        return symbol("removexattr", as: Fn.self)(path, name)
    }
}

/// stat(2); outside `Posix`, where the name is not shadowed by the struct and `Posix.stat`.
private func systemStat(_ path: String, _ st: inout stat) -> Int32 { stat(path, &st) }

/// A NUL-terminated C buffer (as filled by mkstemp/mkdtemp) as a String.
func stringFromCBuffer(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// An errno value as an Error.
struct Errno: Error, Equatable, CustomStringConvertible {
    let code: Int32
    init(_ code: Int32) { self.code = code }
    var description: String { Posix.describe(code) }
}
