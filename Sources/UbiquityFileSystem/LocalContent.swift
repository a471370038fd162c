// Content kept on this machine, for stores whose chunks live elsewhere (a shared store): whether a
// file is downloaded, and iCloud's evictUbiquitousItem and startDownloadingUbiquitousItem as
// `ubiquityfs evict` and `ubiquityfs pin`. A file's size, times and names never depend on it:
// `ls -l` of an evicted file shows its true size, and reading it downloads it.

import Foundation
import UbiquityStore

extension UbiquityFileSystem {
    /// Whether every chunk of `ino`'s current content is on this machine (always, when the store
    /// keeps all content here).
    func isDownloaded(_ ino: InodeNumber) -> Bool {
        guard let local = store.localChunks else { return true }
        return ns.read { state.chunks[ino] ?? [] }.allSatisfy { local.isLocal($0.blob) }
    }

    /// The regular files at or under `ino`, with their chunks.
    private func filesUnder(_ ino: InodeNumber) throws(FSError) -> [(InodeNumber, [ChunkRef])] {
        let found: [(InodeNumber, [ChunkRef])]? = ns.read {
            guard let n = state.nodes[ino], n.kind == .regular || n.kind == .directory else { return nil }
            if n.kind == .regular { return [(ino, state.chunks[ino] ?? [])] }
            var out: [(InodeNumber, [ChunkRef])] = []
            var folders = [ino]
            while let folder = folders.popLast() {
                for child in (state.children[folder] ?? [:]).values {
                    guard let c = state.nodes[child] else { continue }
                    if c.kind == .directory { folders.append(child) }
                    if c.kind == .regular { out.append((child, state.chunks[child] ?? [])) }
                }
            }
            return out
        }
        guard let found else { throw FSError(EINVAL, "only files and folders have content to keep or evict") }
        return found
    }

    private func localChunks() throws(FSError) -> any LocalChunks {
        guard let local = store.localChunks else {
            throw FSError(EINVAL, "this store keeps all content on this machine: there is nothing to download or evict")
        }
        return local
    }

    /// Drops this machine's copy of the content at or under `ino` (files and folders); it is
    /// downloaded again when read. Content a file here has not published stays (it is in the
    /// file's working copy, not the cache). Returns how many files and bytes.
    public func evictContent(_ ino: InodeNumber) throws(FSError) -> (files: Int, bytes: UInt64) {
        let local = try localChunks()
        let files = try filesUnder(ino)
        var bytes: UInt64 = 0
        for (_, chunks) in files {
            let held = chunks.filter { !$0.isHole && local.isLocal($0.blob) }
            bytes += held.reduce(0) { $0 + UInt64($1.length) }
            local.evict(held.map(\.blob))
        }
        return (files.count, bytes)
    }

    /// Downloads the content at or under `ino` now and keeps it on this machine until evicted.
    public func keepContent(_ ino: InodeNumber) throws(FSError) -> (files: Int, bytes: UInt64) {
        let local = try localChunks()
        let files = try filesUnder(ino)
        var bytes: UInt64 = 0
        for (file, chunks) in files {
            do { try local.keep(chunks.filter { !$0.isHole }) } catch {
                throw FSError(error.errno, "\(displayPath(of: file) ?? "inode \(file)"): \(error.message)")
            }
            bytes += chunks.reduce(0) { $0 + UInt64($1.length) }
        }
        return (files.count, bytes)
    }
}
