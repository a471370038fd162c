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
        // Pins at or under it go too (a pin of a folder above it stays, and brings back what
        // another machine changes there).
        let pins = local.pinnedFiles
        let unpinned = ns.read { pins.filter { $0 != ino && !isUnder($0, ino) } }
        if unpinned != pins {
            do { try local.setPinnedFiles(unpinned) } catch { throw FSError(error) }
        }
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
        do { try local.setPinnedFiles(local.pinnedFiles.union([ino])) } catch { throw FSError(error) }
        var bytes: UInt64 = 0
        for (file, chunks) in files {
            do { try local.keep(chunks.filter { !$0.isHole }) } catch {
                throw FSError(error.errno, "\(displayPath(of: file) ?? "inode \(file)"): \(error.message)")
            }
            bytes += chunks.reduce(0) { $0 + UInt64($1.length) }
        }
        return (files.count, bytes)
    }

    /// Whether `node` is `folder` or lies under it (by its first name, for a file). Caller holds ns.
    private func isUnder(_ node: InodeNumber, _ folder: InodeNumber) -> Bool {
        if node == folder { return true }
        var at: InodeNumber? = state.nodes[node]?.kind == .directory ? node : state.firstName(of: node)?.parent
        var steps = 0
        while let a = at, steps < 4096 {
            if a == folder { return true }
            at = state.parent[a]
            steps += 1
        }
        return false
    }

    /// Another writer's changes made `changed` files' content current: those pinned (or in a
    /// pinned folder) are downloaded and kept now, in the background, as `ubiquityfs pin`
    /// promised; the chunks of their content before are kept no longer. Caller holds nothing.
    func followPins(_ changed: [InodeNumber: [ChunkRef]]) {
        guard let local = store.localChunks, !changed.isEmpty else { return }
        let pins = local.pinnedFiles
        guard !pins.isEmpty else { return }
        let due: [(InodeNumber, [ChunkRef], [ChunkRef])] = ns.read {
            changed.compactMap { (ino, old) in
                guard pins.contains(where: { isUnder(ino, $0) }), let now = state.chunks[ino] else { return nil }
                return (ino, now, old)
            }
        }
        guard !due.isEmpty else { return }
        DispatchQueue.global(qos: .utility).async { [self] in
            for (ino, now, old) in due {
                let keeping = Set(now.map(\.blob))
                do {
                    try local.keep(now.filter { !$0.isHole })
                    local.release(old.map(\.blob).filter { !keeping.contains($0) })
                } catch {
                    log("keeping the new content of pinned \(displayPath(of: ino) ?? "inode \(ino)") failed: \(error); "
                        + "it is downloaded when read")
                }
            }
        }
    }
}
