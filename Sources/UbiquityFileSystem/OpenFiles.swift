// Open files: handles, the open documents they share (one working copy per file, whatever the
// number of handles), reads and writes through them, and what each close means (the last
// writer's flush marks the copy finished and publishes it; the last release publishes what is
// left, and drops the document).

import Foundation
import UbiquityStore

extension UbiquityFileSystem {
    // MARK: - files

    /// Open (or share) the document of `ino`; counts as one open until `release`.
    public func open(_ ino: UInt64, flags: Int32) throws(FSError) -> UInt64 {
        try typed {
            if let t = trashNode(ino) { return try trashOpen(t, flags: flags) }
            if Self.mayWrite(flags) || flags & O_TRUNC != 0, ns.read({ state.nodes[ino] == nil }), docsLock.withLock({ ghosts[ino] != nil }) {
                // A file another writer deleted is read-only here: the kernel looks the name up
                // again and opens what it names now.
                throw FSError(ESTALE, "node \(ino) was deleted by another writer").routine()
            }
            let doc = try acquireDocument(ino)
            let h = docsLock.withLock { () -> UInt64 in
                defer { nextHandle += 1 }
                return nextHandle
            }
            if flags & O_TRUNC != 0 {
                // Through the new handle, so the working copy is not finished until it closes.
                do { try changing(doc) { try doc.truncate(to: 0, handle: h, atOpen: true) } } catch {
                    doc.released(handle: h)
                    try? releaseDocument(doc)
                    throw FSError(error)
                }
            }
            docsLock.withLock { handles[h] = .file(doc, flags: flags) }
            return h
        }
    }

    static func mayWrite(_ flags: Int32) -> Bool { flags & O_ACCMODE != O_RDONLY }

    /// Runs `change` (a write or truncate of `doc`). If the working copy holds what another
    /// handle's close left and that is not yet published (the publish at close is at most once
    /// a second, the release comes later), it is published first: the next writer's O_TRUNC
    /// must not take a saved document with it if the daemon dies before the next publish.
    func changing(_ doc: Document, _ change: () throws -> Void) throws {
        while true {
            do { return try change() } catch is Document.ClosedContentFirst {
                let nameless = isNameless(doc.ino)
                if nameless || !doc.hasUnpublishedChanges {
                    doc.dropClosedContent(nameless: nameless)   // never to be published, or published already
                } else {
                    try publish(doc, durable: false)
                }
            }
        }
    }

    /// Whether the kernel may keep the pages it cached of `ino` at this open (FUSE's
    /// keep_cache) instead of dropping them, as it does at every open by default. Yes only if
    /// the file's current version is the one it was at the kernel's last open: its pages then
    /// hold that version and what was written through this mount since, which the kernel saw.
    /// Content that changes any other way (another writer, a restore, a conflict, recovery)
    /// comes with a new version. The answer is recorded for the next open; call after each
    /// successful open of a file, with `truncating` for O_TRUNC. (A create records nothing: the
    /// first open after it drops pages the kernel cannot have yet anyway.)
    public func keepsKernelCache(_ ino: UInt64, truncating: Bool = false) -> Bool {
        ns.read {
            let version = state.nodes[ino].map { $0.currentVersion ?? 0 }
            return docsLock.withLock {
                guard let version, kernelRefs.holds(ino) else {
                    // Not a file of the store (a ghost, a trash node), or not held by the kernel.
                    kernelContent[ino] = nil
                    return false
                }
                defer { kernelContent[ino] = version }
                return !truncating && kernelContent[ino] == version
            }
        }
    }

    func isFileHandle(_ handle: UInt64) -> Bool {
        docsLock.withLock { if case .file? = handles[handle] { return true } else { return false } }
    }

    func acquireDocument(_ ino: UInt64) throws -> Document {
        try ns.read {
            guard case .node(let n) = try target(ino) else { throw FSError(EISDIR, "is a folder") }
            switch n.kind {
            case .regular: break
            case .directory: throw FSError(EISDIR, "is a folder")
            default: throw FSError(ENXIO, "not a regular file")
            }
            return docsLock.withLock {
                let doc = docs[n.ino] ?? Document(node: n, chunks: state.chunks[n.ino] ?? ghosts[n.ino]?.chunks ?? [], store: store)
                docs[n.ino] = doc
                doc.opens += 1
                return doc
            }
        }
    }

    func document(for ino: UInt64, handle: UInt64?) throws -> Document {
        if let handle, case .file(let doc, _) = docsLock.withLock({ handles[handle] }) { return doc }
        return try acquireDocument(ino)
    }

    func closeTemporary(_ doc: Document, handle: UInt64?) {
        if let handle, case .file = docsLock.withLock({ handles[handle] }) { return }
        do { try releaseDocument(doc) } catch { log("publish of inode \(doc.ino) failed: \(error)") }
    }

    func fileDocument(_ handle: UInt64) throws -> (Document, Int32) {
        guard case .file(let doc, let flags) = docsLock.withLock({ handles[handle] }) else {
            throw FSError(EBADF, "not a file handle")
        }
        return (doc, flags)
    }

    /// The trash node of a handle of the desktop trash's `info/`.
    func trashHandleNode(_ handle: UInt64) -> (TrashNode, Int32)? {
        docsLock.withLock { if case .trash(let t, let flags)? = handles[handle] { return (t, flags) } else { return nil } }
    }

    public func read(handle: UInt64, offset: UInt64, into buffer: UnsafeMutableRawBufferPointer) throws(FSError) -> Int {
        try typed {
            if let (t, _) = trashHandleNode(handle) {
                let bytes = try trashBytes(t)
                guard offset < UInt64(bytes.count) else { return 0 }
                let n = min(buffer.count, bytes.count - Int(offset))
                bytes.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + Int(offset), byteCount: n) }
                return n
            }
            let doc = try fileDocument(handle).0
            do { return try doc.read(at: offset, into: buffer) } catch {
                // The program sees only EIO: the log says which file and why.
                log("read of \(displayPath(of: doc.ino) ?? "inode \(doc.ino)") failed: \(error)")
                throw FSError(error)
            }
        }
    }

    /// A read as pieces of blob files and zeros, for a reply the kernel splices from the files
    /// (no copy through the daemon), where every byte is the file's published content in blob
    /// files on this machine; nil where `read(handle:offset:into:)` must copy it (a working copy
    /// holds some, the content lives elsewhere, a computed file, a blob that cannot be read as
    /// a whole file). The reply keeps the files open while it lives.
    public func filePieces(handle: UInt64, offset: UInt64, count: Int) throws(FSError) -> FileReply? {
        guard store.localChunks == nil, let files = store.blobs as? any BlobFiles else { return nil }
        return try typed {
            if trashHandleNode(handle) != nil { return nil }
            let doc = try fileDocument(handle).0
            guard let reply = doc.filePieces(at: offset, count: count, files: files) else { return nil }
            files.readAhead(doc.blobsToReadAhead(offset: offset, count: count))
            return FileReply(pieces: reply.pieces, files: reply.files)
        }
    }

    public func write(handle: UInt64, offset: UInt64, bytes: UnsafeRawBufferPointer) throws(FSError) -> Int {
        try typed {
            if let (t, flags) = trashHandleNode(handle) {
                guard Self.mayWrite(flags) else { throw FSError(EBADF, "not open for writing") }
                return try trashWrite(t, offset: offset, bytes: bytes)
            }
            let (doc, flags) = try fileDocument(handle)
            if (flags & O_ACCMODE) == O_RDONLY { throw FSError(EBADF, "file not open for writing") }
            if offset > UInt64(Int64.max) - UInt64(bytes.count) { throw FSError(EFBIG, "too large") }
            do { try changing(doc) { try doc.write(bytes, at: offset, handle: handle) } } catch { throw FSError(error) }
            return bytes.count
        }
    }

    /// Called on each close(2) of a descriptor, before close returns (the release comes later).
    /// All handles share one working copy, so there is nothing to hand over; but once no handle
    /// has changes it has not closed, the working copy is a finished document: it is marked so
    /// (recovery after a crash makes it current, see `Document.flushed`) and published.
    public func flush(handle: UInt64) throws(FSError) {
        try typed {
            if trashHandleNode(handle) != nil { return }
            let (doc, flags) = try fileDocument(handle)
            guard Self.mayWrite(flags) || flags & O_TRUNC != 0 else { return }
            let closed: Bool
            do { closed = try doc.flushed(handle: handle) } catch {
                // Not fatal: the content is in the working copy, which recovery keeps as a version.
                log("marking inode \(doc.ino) closed failed: \(error)")
                return
            }
            // Every writer has closed it: publish now, before close() returns, not at the
            // release the kernel sends later. So what a program wrote is the file's version, on
            // every mount and to `ubiquityfs versions`, once its close returns; and a failure
            // reaches the program's close() instead of only the log. (At most once a second per
            // file: see `claimClosePublish`.)
            if closed && publishesOnClose && !isNameless(doc.ino) && doc.claimClosePublish() {
                do { try publish(doc, durable: false) } catch {
                    log("publish of inode \(doc.ino) at close failed, its working copy is kept: \(error)")
                    throw FSError(error)
                }
            }
        }
    }

    /// fsync: the data survives a crash as the file's content. Where chunks are all on this
    /// machine, the working copy is made durable where it is (the store's barrier first, for the
    /// names and base content it relies on, then its changed pages and its map), and published later as
    /// any other (close, idle time): no version per fsync, no chunk rewritten for a 4 KiB write.
    /// Where they live elsewhere (a shared store), it is published durably, so what an fsync
    /// promised is on the servers.
    public func fsync(handle: UInt64, dataOnly: Bool) throws(FSError) {
        try typed {
            if trashHandleNode(handle) != nil { return }
            let (doc, _) = try fileDocument(handle)
            do {
                if doc.hasUnpublishedChanges {
                    if store.fsyncPublishes {
                        try publish(doc, durable: true)
                    } else {
                        try syncWorkingCopy(doc)
                    }
                } else {
                    try store.durability.sync()
                }
            } catch { throw FSError(error) }
        }
    }

    /// The barrier first: a copy marked synced vouches for its base too. A publish through
    /// another handle between the two (and a write on its version) moves the base past what the
    /// barrier covered: again, and after three such races a durable publish instead.
    private func syncWorkingCopy(_ doc: Document) throws {
        for _ in 0..<3 {
            let base = doc.currentBaseVersion
            try store.durability.sync()
            switch try doc.syncWorkingCopy(vouched: base) {
            case .synced: return
            case .publish: try publish(doc, durable: true); return
            case .baseMoved: continue
            }
        }
        try publish(doc, durable: true)
    }

    public func release(handle: UInt64) throws(FSError) {
        try typed {
            if trashHandleNode(handle) != nil { docsLock.withLock { _ = handles.removeValue(forKey: handle) }; return }
            guard case .file(let doc, let flags) = docsLock.withLock({ handles.removeValue(forKey: handle) }) else {
                throw FSError(EBADF, "not a file handle")
            }
            if Self.mayWrite(flags) || flags & O_TRUNC != 0 { doc.released(handle: handle) }
            releaseLocks(ofHandle: handle)
            try releaseDocument(doc)
        }
    }

    /// One open of `doc` ended. On the last one, publish it (or, if the file was deleted, drop it).
    func releaseDocument(_ doc: Document) throws {
        let last = docsLock.withLock { () -> Bool in
            doc.opens -= 1
            return doc.opens == 0
        }
        guard last else { return }
        if isNameless(doc.ino) {
            // Nothing to publish for a file without a name; its working copy lives on while the
            // kernel still refers to it (a reopen through /proc sees the same bytes).
            try deleteIfUnreferenced(doc.ino)
            return
        }
        do { try publish(doc, durable: false) } catch {
            log("publish of inode \(doc.ino) failed, its working copy is kept: \(error)")
            throw FSError(error)
        }
        dropIfIdle(doc)
    }

    func isNameless(_ ino: InodeNumber) -> Bool {
        ns.read { (state.nodes[ino]?.nlink ?? 0) == 0 }
    }

    /// Forget a document nobody has open once it holds nothing unpublished.
    func dropIfIdle(_ doc: Document) {
        docsLock.withLock {
            if doc.opens == 0 && !doc.hasUnpublishedChanges && docs[doc.ino] === doc { docs[doc.ino] = nil }
        }
    }

    /// fsync on a folder: make every namespace change so far durable.
    public func fsyncDirectory() throws(FSError) {
        try typed {
            do { try store.durability.syncMetadata() } catch { throw FSError(error) }
        }
    }
}
