import Foundation
import UbiquityStore

/// Who is asking: the process's user, group and umask (from the FUSE request context).
public struct Caller: Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    public init(uid: UInt32, gid: UInt32, pid: Int32 = 0) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
    }
    public static let root = Caller(uid: 0, gid: 0)
}

/// A node's attributes as `stat` reports them. `mode` includes the file-type bits.
public struct Attributes: Sendable, Equatable {
    public var ino: UInt64
    public var mode: UInt32
    public var nlink: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: UInt64
    public var blocks: UInt64
    public var atime: Int64
    public var mtime: Int64
    public var ctime: Int64
    public var rdev: UInt64
    /// Another writer changed the node a moment ago: the kernel is to keep these attributes for
    /// no time (see `RecentRemoteChanges`).
    public var changingElsewhere = false
    public var kind: NodeKind { NodeKind(mode: mode) }
}

public extension NodeKind {
    /// The S_IFMT bits of this kind.
    var typeBits: UInt32 {
        switch self {
        case .regular: return UInt32(S_IFREG)
        case .directory: return UInt32(S_IFDIR)
        case .symlink: return UInt32(S_IFLNK)
        case .fifo: return UInt32(S_IFIFO)
        case .socket: return UInt32(S_IFSOCK)
        case .characterDevice: return UInt32(S_IFCHR)
        case .blockDevice: return UInt32(S_IFBLK)
        }
    }
    init(mode: UInt32) {
        switch mode & UInt32(S_IFMT) {
        case UInt32(S_IFDIR): self = .directory
        case UInt32(S_IFLNK): self = .symlink
        case UInt32(S_IFIFO): self = .fifo
        case UInt32(S_IFSOCK): self = .socket
        case UInt32(S_IFCHR): self = .characterDevice
        case UInt32(S_IFBLK): self = .blockDevice
        default: self = .regular
        }
    }
}

/// What a `setattr` changes; nil fields stay as they are.
public struct AttributeChanges: Sendable, Equatable {
    public enum Time: Sendable, Equatable {
        case now
        case at(Int64)
    }
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: UInt64?
    public var atime: Time?
    public var mtime: Time?
    public init(mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: UInt64? = nil,
                atime: Time? = nil, mtime: Time? = nil) {
        self.mode = mode; self.uid = uid; self.gid = gid; self.size = size
        self.atime = atime; self.mtime = mtime
    }
}

public struct DirectoryEntry: Sendable, Equatable {
    public var name: [UInt8]
    public var ino: UInt64
    public var kind: NodeKind
    /// Offset of the entry after this one (what readdir passes back to continue).
    public var nextOffset: Int
}

public struct RenameFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let noReplace = RenameFlags(rawValue: 1)   // RENAME_NOREPLACE
    public static let exchange = RenameFlags(rawValue: 2)    // RENAME_EXCHANGE
}

public struct FileSystemStatistics: Sendable, Equatable {
    public var blockSize: UInt64
    public var totalBlocks: UInt64
    public var freeBlocks: UInt64
    public var availableBlocks: UInt64
    public var totalFiles: UInt64
    public var freeFiles: UInt64
    public var nameMax: UInt64
}

/// Which namespace a mount shows.
public enum View: Sendable, Equatable {
    /// Root lists public containers by name; each of those folders is the container's `Documents`
    /// (as Finder shows iCloud Drive); folder levels enforced; nothing outside Documents is reachable.
    case drive
    /// One app's containers whole, by container identifier; no level limit.
    case app(bundleIdentifier: String)
}

/// A registered container as the model is given it (the store's `ContainerRecord` adds the root
/// folder's inode, which the model assigns; `active` is decided afresh at every start).
public struct ContainerInfo: Sendable, Equatable {
    public var identifier: String
    public var bundleIdentifier: String
    public var name: String
    public var isPublic: Bool
    /// "None", "One" or "Any".
    public var folderLevels: String
    public var registeredVersion: String
    public var manifestPath: String
    /// Inactive containers (manifest gone, or lost a name clash) keep their documents but are not shown.
    public var active: Bool
    public init(identifier: String, bundleIdentifier: String, name: String, isPublic: Bool,
                folderLevels: String, registeredVersion: String, manifestPath: String, active: Bool) {
        self.identifier = identifier; self.bundleIdentifier = bundleIdentifier; self.name = name
        self.isPublic = isPublic; self.folderLevels = folderLevels
        self.registeredVersion = registeredVersion; self.manifestPath = manifestPath; self.active = active
    }
    /// Max folder depth inside Documents; nil = unlimited.
    public var maxDepth: Int? { levelsMaxDepth(folderLevels) }
}

public let nameMax = 255

func nowNanoseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// A tiny lock with the only two things this module needs; pthread-based so it never spins.
final class Lock: @unchecked Sendable {
    private let mutex = NSLock()
    @inline(__always) func withLock<T>(_ body: () throws -> T) rethrows -> T {
        mutex.lock()
        defer { mutex.unlock() }
        return try body()
    }
    func lock() { mutex.lock() }
    func unlock() { mutex.unlock() }
}

/// A readers-writer lock (pthread_rwlock: no spinning). Readers: lookups, getattr, readdir.
/// Writers: applying committed namespace changes to memory, never across store I/O (see
/// FileSystem.swift).
/// The lock lives in memory of its own (a pthread lock must not move, and `&` on a stored
/// property does not promise a stable address), prefers writers (glibc's default lets a stream
/// of readers starve a writer), and every pthread call is checked: a failure is a bug.
final class RWLock: @unchecked Sendable {
    private let rw: UnsafeMutablePointer<pthread_rwlock_t>
    init() {
        rw = .allocate(capacity: 1)
        rw.initialize(to: pthread_rwlock_t())
        var attr = pthread_rwlockattr_t()
        precondition(pthread_rwlockattr_init(&attr) == 0)
        precondition(pthread_rwlockattr_setkind_np(&attr, Int32(PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP)) == 0)
        precondition(pthread_rwlock_init(rw, &attr) == 0)
        pthread_rwlockattr_destroy(&attr)
    }
    deinit {
        precondition(pthread_rwlock_destroy(rw) == 0)
        rw.deinitialize(count: 1)
        rw.deallocate()
    }
    @inline(__always) func read<T>(_ body: () throws -> T) rethrows -> T {
        precondition(pthread_rwlock_rdlock(rw) == 0)
        defer { precondition(pthread_rwlock_unlock(rw) == 0) }
        return try body()
    }
    @inline(__always) func write<T>(_ body: () throws -> T) rethrows -> T {
        precondition(pthread_rwlock_wrlock(rw) == 0)
        defer { precondition(pthread_rwlock_unlock(rw) == 0) }
        return try body()
    }
    /// For a holder that is a value of its own (`Publication`), which unlocks when it goes.
    func lockWrite() { precondition(pthread_rwlock_wrlock(rw) == 0) }
    func unlock() { precondition(pthread_rwlock_unlock(rw) == 0) }
}

/// Folder depth allowed inside Documents for a NSUbiquitousContainerSupportedFolderLevels value.
func levelsMaxDepth(_ levels: String) -> Int? {
    switch levels {
    case "Any": return nil
    case "One": return 1
    default: return 0
    }
}

/// Something another writer changed that the kernel may have cached: a folder entry (the name
/// now leads elsewhere, or nowhere) or a node's attributes and content. The FUSE bridge turns
/// these into `fuse_lowlevel_notify_inval_entry` / `_inode`.
public enum KernelInvalidation: Sendable, Hashable {
    case entry(parent: UInt64, name: [UInt8])
    case node(UInt64)
}

/// setxattr flags (<sys/xattr.h>, not imported by Glibc's module).
public let xattrCreate: Int32 = 1
public let xattrReplace: Int32 = 2

/// Part of a read's reply: bytes of an open file, or zeros (a hole, or past a chunk's end).
public enum FilePiece: Sendable, Equatable {
    case file(fd: Int32, offset: Int, length: Int)
    case zeros(Int)
}

/// A read's reply as pieces of files, which stay open while it lives.
public struct FileReply: Sendable {
    public let pieces: [FilePiece]
    let files: [BlobFile]
}
