// Opening the embedded store: one folder holding
//   lock               shared flock held by every daemon of this version for the store's lifetime
//   metadata.sqlite3   SQLiteMetadataStore (+ -wal, -shm)
//   journal/…          each daemon's journal of grouped commits (CommitJournal)
//   blobs/XX/…         LocalBlobStore
//   work/…             LocalWorkArea
//   locks/…            LocalLockTable
//   reserve            SpaceReserve: space held back so that a full disk still takes deletes

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A shared `flock` on the store's `lock` file, held while the store is open. Daemons of this
/// version share a store (each is one writer of its change log); a daemon of the single-writer
/// version took this lock exclusively, so the two never run on one store at once. Released when
/// the last object holding it (the three parts of the store each hold it) is gone.
final class StoreLock: Sendable {
    let fd: Int32
    let path: String

    init(directory: String) throws(StoreError) {
        let path = directory + "/lock"
        let fd = retryEINTR { open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
        if fd < 0 { throw systemError("open", path, errno) }
        if retryEINTR({ flock(fd, LOCK_SH | LOCK_NB) }) != 0 {
            let code = errno
            defer { close(fd) }
            if code == EWOULDBLOCK || code == EAGAIN {
                var buffer = [UInt8](repeating: 0, count: 32)
                let n = buffer.withUnsafeMutableBytes { (try? preadFully(fd, $0, at: 0, path: path)) ?? 0 }
                let pid = String(decoding: buffer[..<n], as: UTF8.self)
                    .trimmingCharacters(in: .whitespacesAndNewlines)
                throw StoreError(errno: EBUSY, "store \(directory) is in use by an older ubiquityfs that "
                                 + "cannot share it (pid \(pid.isEmpty ? "?" : pid)); stop that one first")
            }
            throw systemError("flock", path, code)
        }
        self.fd = fd
        self.path = path
    }

    deinit { close(fd) }
}

/// Opens (creating if missing) the embedded store in `directory`: SQLite metadata, local blob
/// files and work area. Several daemons may have one store open at once; each has a work area
/// of its own. A daemon of the single-writer version keeps others out (EBUSY), and is kept out.
///
/// The store is its owner's alone: file names and contents of private containers are in it. So
/// the folder is made `0700` (an existing folder that others could read or enter is tightened,
/// and `log` says so) and every file in it `0600`.
public func openEmbeddedStore(directory: String, log: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) -> BackingStore {
    let directory = directory.count > 1 && directory.hasSuffix("/") ? String(directory.dropLast()) : directory
    var st = stat()
    let existed = stat(directory, &st) == 0
    try makeDirectories(directory, mode: 0o700)
    try tightenPermissions(of: directory, log: log)
    try refuseSymlinks(in: directory)
    let lock = try StoreLock(directory: directory)
    let reserve = SpaceReserve(directory: directory, log: log)
    let metadata = try SQLiteMetadataStore(path: directory + "/metadata.sqlite3", storeLock: lock, reserve: reserve,
                                           journalFolder: directory + "/journal", log: log)
    let blobs = try LocalBlobStore(directory: directory, fdCacheCapacity: 256, storeLock: lock, reserve: reserve)
    let work = try LocalWorkArea(directory: directory, storeLock: lock, reserve: reserve)
    let locks = try LocalLockTable(directory: directory, storeLock: lock)
    reserve.start()
    if !existed {
        // Make the new folder's entries (blobs/, work/, the database) durable.
        try fsyncDirectory(directory)
        let parent = (directory as NSString).deletingLastPathComponent
        try? fsyncDirectory(parent.isEmpty ? "." : parent)
    }
    return BackingStore(metadata: metadata, blobs: blobs, work: work, locks: locks)
}

/// Refuse a store folder with a symbolic link in its top two levels, where its folders and
/// top files are. Store files are opened with O_NOFOLLOW, which guards only a path's last
/// component: a folder such as `blobs/3f` replaced by a link would send writes wherever it
/// points. The store never makes a link, so one there is foreign (the folder itself may be one).
package func refuseSymlinks(in directory: String) throws(StoreError) {
    func entries(_ folder: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).map { folder + "/" + $0 }
    }
    var st = stat()
    for top in entries(directory) {
        guard lstat(top, &st) == 0 else { continue }
        var paths = [top]
        if (st.st_mode & S_IFMT) == S_IFDIR { paths += entries(top) }
        for path in paths where lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFLNK {
            throw StoreError(errno: ELOOP, "the store folder \(directory) holds a symbolic link, \(path): the store never "
                             + "follows one (its files stay in its own folder); move what it points to in its place, or remove it")
        }
    }
}

/// Files of the store's top folder that may predate the rule that the store is private (an older
/// version made some `0644`). The folders below it are always made `0700`.
private let storeTopFiles = ["lock", "daemon.pid", "ubiquityfs.log", "metadata.sqlite3",
                             "metadata.sqlite3-wal", "metadata.sqlite3-shm"]

/// Make the store folder `0700` and its known files `0600`, or fail saying how to fix it.
package func tightenPermissions(of directory: String, log: (String) -> Void) throws(StoreError) {
    var st = stat()
    guard stat(directory, &st) == 0 else { throw systemError("stat", directory, errno) }
    if st.st_mode & 0o077 != 0 {
        if chmod(directory, 0o700) != 0 {
            let code = errno
            throw StoreError(errno: code, "the store folder \(directory) can be read or entered by other users (mode "
                             + "\(String(st.st_mode & 0o777, radix: 8))) and could not be made private: "
                             + "\(String(cString: strerror(code))); run chmod 700 \(directory) as its owner")
        }
        log("made the store folder \(directory) private (mode \(String(st.st_mode & 0o777, radix: 8)) -> 700): "
            + "it holds the names and content of private containers")
    }
    for name in storeTopFiles {
        let path = directory + "/" + name
        guard lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, st.st_mode & 0o077 != 0 else { continue }
        if chmod(path, 0o600) != 0 { throw systemError("chmod", path, errno) }
    }
}
