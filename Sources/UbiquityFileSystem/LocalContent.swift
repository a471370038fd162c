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
        let under = ns.read { Set(filesAndFolders(under: ino)) }
        do { try local.updatePinnedFiles { $0.subtract(under) } } catch { throw FSError(error) }
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
        do { try local.updatePinnedFiles { _ = $0.insert(ino) } } catch { throw FSError(error) }
        var bytes: UInt64 = 0
        for (file, chunks) in files {
            do { try local.keep(chunks.filter { !$0.isHole }) } catch {
                throw FSError(error.errno, "\(displayPath(of: file) ?? "inode \(file)"): \(error.message)")
            }
            bytes += chunks.reduce(0) { $0 + UInt64($1.length) }
        }
        return (files.count, bytes)
    }

    /// `ino` and every node under it (a folder's whole tree, by every name). Caller holds ns.
    private func filesAndFolders(under ino: InodeNumber) -> [InodeNumber] {
        guard state.nodes[ino] != nil else { return [] }
        var out = [ino]
        var folders = state.nodes.kind(of: ino) == .directory ? [ino] : []
        while let folder = folders.popLast() {
            for child in (state.children[folder] ?? [:]).values {
                out.append(child)
                if state.nodes.kind(of: child) == .directory { folders.append(child) }
            }
        }
        return out
    }

    /// Another writer's changes made `changed` files' content current (with their chunks
    /// before): those pinned, or in a pinned folder, are downloaded and kept now, in the
    /// background, as `ubiquityfs pin` promised, and the chunks no pinned file uses any more
    /// are kept no longer. One task at a time, in the order changes came, each reading the pins
    /// as they are then (an evict meanwhile ends them). Caller holds nothing it must keep.
    func followPins(_ changed: [InodeNumber: [ChunkRef]]) {
        guard let local = store.localChunks, !changed.isEmpty, !local.pinnedFiles.isEmpty else { return }
        pinWork.async { [self] in
            let pins = local.pinnedFiles
            let (keep, old, gone) = ns.read { () -> ([ChunkRef], Set<BlobID>, Set<InodeNumber>) in
                let gone = pins.filter { state.nodes[$0] == nil }
                var files: Set<InodeNumber> = []
                for pin in pins where !gone.contains(pin) {
                    for n in filesAndFolders(under: pin) where state.nodes.kind(of: n) == .regular { files.insert(n) }
                }
                var keep: [ChunkRef] = []
                var old: Set<BlobID> = []
                for (ino, before) in changed where files.contains(ino) {
                    keep += (state.chunks[ino] ?? []).filter { !$0.isHole }
                    old.formUnion(before.lazy.filter { !$0.isHole }.map(\.blob))
                }
                // Chunks another pinned file still uses stay pinned.
                if !old.isEmpty { for f in files { old.subtract((state.chunks[f] ?? []).map(\.blob)) } }
                return (keep, old, gone)
            }
            if !gone.isEmpty { try? local.updatePinnedFiles { $0.subtract(gone) } }
            guard !keep.isEmpty || !old.isEmpty else { return }
            do {
                try local.keep(keep)
                local.release(Array(old))
            } catch {
                log("keeping the new content of pinned files failed: \(error); it is downloaded when read")
            }
        }
    }
}
