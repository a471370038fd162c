import Foundation
import UbiquityStore

/// The one error type of the filesystem model: the errno the caller gets, why, in words, and
/// whether it is worth a line in the log. Every failure of an operation is one of these; the
/// FUSE bridge replies with `errno` and logs the operation, the node and the message unless the
/// error is `routine`.
public struct FSError: Error, CustomStringConvertible, Sendable, Equatable {
    public var errno: Int32
    public var message: String
    /// An everyday answer, not a failure (a name that does not exist, one that already does, a
    /// folder not empty): decided where the error is made, so the log keeps only failures.
    public var routine: Bool
    /// Errors made with these are routine unless made otherwise: programs probe with them all
    /// day (`stat` of a missing name, `mkdir -p`, `rmdir` of a full folder, a missing xattr).
    static let routineErrnos: Set<Int32> = [ENOENT, EEXIST, ENOTEMPTY, ENAMETOOLONG, ENODATA]
    public init(_ errno: Int32, _ message: String) {
        self.errno = errno
        self.message = message
        self.routine = Self.routineErrnos.contains(errno)
    }
    /// The same error, marked routine (or not).
    public func routine(_ routine: Bool = true) -> FSError {
        var e = self
        e.routine = routine
        return e
    }
    /// The errno a caller gets for a store failure: the one place store errors become errnos.
    /// Never routine: the store failed.
    public init(_ error: StoreError) {
        self.routine = false
        self.message = error.message
        switch error.kind {
        case .conflict:
            // Reaches a caller only when staging again kept conflicting (see `mutate`): no local
            // race explains that, so not EEXIST or ENOENT. EAGAIN would invite blind retries.
            errno = EIO
        case .unavailable:
            // A shared store out of reach. EIO, as NFS soft mounts answer; ENOTCONN or
            // EHOSTUNREACH would read as the mount itself being gone.
            errno = EIO
        case .corrupt: errno = EIO
        case .trimmed: errno = EIO   // the model reloads instead; reaching a caller is a bug
        case .noSpace: errno = error.errno == EDQUOT ? EDQUOT : ENOSPC
        case .notFound, .io:
            // The system's own answer (ENOENT, EFBIG, EINVAL, …), except EBADF and EFAULT: from
            // the daemon's own descriptors and buffers they are its bug, which a program would
            // read as its own; it gets EIO, and the message says what failed.
            errno = error.errno == EBADF || error.errno == EFAULT ? EIO : error.errno
        }
    }
    /// Any error as an FSError: store errors keep their errno; anything else is EIO.
    public init(_ error: any Error) {
        if let e = error as? FSError { self = e }
        else if let e = error as? StoreError { self.init(e) }
        else { self.init(EIO, "\(error)") }
    }
    public var description: String { "\(message) (\(errnoName(errno)))" }

    static func noEntry(_ what: String = "no such file or folder") -> FSError { FSError(ENOENT, what) }
    static func notDir(_ what: String = "not a folder") -> FSError { FSError(ENOTDIR, what) }
    static func readOnly(_ what: String) -> FSError { FSError(EACCES, what) }
}

/// Symbolic name of an errno, for logs ("ENOENT").
public func errnoName(_ e: Int32) -> String {
    switch e {
    case EPERM: return "EPERM"
    case ENOENT: return "ENOENT"
    case EIO: return "EIO"
    case EBADF: return "EBADF"
    case EACCES: return "EACCES"
    case EBUSY: return "EBUSY"
    case EEXIST: return "EEXIST"
    case EXDEV: return "EXDEV"
    case ENOTDIR: return "ENOTDIR"
    case EISDIR: return "EISDIR"
    case EINVAL: return "EINVAL"
    case EFBIG: return "EFBIG"
    case ENOSPC: return "ENOSPC"
    case EROFS: return "EROFS"
    case EMLINK: return "EMLINK"
    case ERANGE: return "ERANGE"
    case ENAMETOOLONG: return "ENAMETOOLONG"
    case ENOSYS: return "ENOSYS"
    case ENOTEMPTY: return "ENOTEMPTY"
    case ENODATA: return "ENODATA"
    case EOPNOTSUPP: return "EOPNOTSUPP"
    case E2BIG: return "E2BIG"
    case ENXIO: return "ENXIO"
    case ESTALE: return "ESTALE"
    default: return "errno \(e)"
    }
}

/// The model's operations throw only `FSError`: whatever their steps throw (a store error, a
/// system call's) becomes one here, with its errno, at the operation's edge.
@inline(__always)
func typed<T>(_ body: () throws -> T) throws(FSError) -> T {
    do { return try body() } catch { throw FSError(error) }
}
