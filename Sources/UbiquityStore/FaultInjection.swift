// Fault injection: wrappers around any store that fail chosen calls with a chosen errno,
// following a shared `FaultPlan`. A failed call is failed *before* it reaches the wrapped store,
// so a failed commit applies nothing, a failed blob write stores nothing, and so on.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The store calls a `FaultPlan` can fail (and one of the bridge's, for tests of a hung mount).
public enum FaultOperation: String, Sendable, CaseIterable {
    // MetadataStore
    case load, commit, changes, trim, reserve, versions, version
    // BlobStore (`blobVerify`: a fault makes `verify` return false)
    case blobWrite, blobRead, blobDelete, syncAll, syncWritten, blobVerify
    // WorkArea and WorkFile
    case workCreate, workLeftovers, workRead, workWrite, workTruncate, workMarkDirty, workMarkPages, workMarkSynced, workSetBase,
         workSetFinished, workSync
    // LockTable (`release` cannot fail)
    case lockSet, lockTest
    // Not the store's: the FUSE bridge's answer to a replay of another writer's change made
    // through the mount, and to a lookup once its attributes are read (delay or hold only; an
    // errno is ignored)
    case replayAnswer, lookupAnswer
}

/// Which calls of an operation fail. Calls are counted from when the rule was set.
public enum FaultTrigger: Sendable, Equatable {
    /// Every call.
    case always
    /// Only the Nth call (1 = the next one).
    case nthCall(Int)
    /// The Nth call and every one after it.
    case fromNthCall(Int)
    /// The next N calls.
    case nextCalls(Int)
}

/// What to fail, shared by the wrappers of one store (and safe to change while they run).
public final class FaultPlan: @unchecked Sendable {
    private struct Rule {
        var errno: Int32
        var trigger: FaultTrigger
        var seen = 0
    }
    // `mutex` guards `rules`, `calls` and `failures`.
    private let mutex = StoreMutex()
    private var rules: [FaultOperation: Rule] = [:]
    private var calls: [FaultOperation: Int] = [:]
    private var failures: [FaultOperation: Int] = [:]

    public init() {}

    /// Fail calls of `operation` (as chosen by `trigger`) with `errno`. Replaces any earlier rule
    /// for `operation`.
    public func fail(_ operation: FaultOperation, errno: Int32, _ trigger: FaultTrigger = .always) {
        mutex.withLock { rules[operation] = Rule(errno: errno, trigger: trigger) }
    }

    /// Stop failing `operation`.
    public func clear(_ operation: FaultOperation) {
        mutex.withLock { rules[operation] = nil }
    }

    /// Stop failing anything (the counters stay).
    public func clearAll() {
        mutex.withLock { rules = [:] }
    }

    /// Calls of `operation` seen so far (failed or not).
    public func callCount(_ operation: FaultOperation) -> Int {
        mutex.withLock { calls[operation, default: 0] }
    }

    /// Calls of `operation` failed so far.
    public func failureCount(_ operation: FaultOperation) -> Int {
        mutex.withLock { failures[operation, default: 0] }
    }

    /// Make calls of `operation` wait, before they are counted, until `resume(operation)`: for tests of
    /// what goes on while a store call is in progress.
    public func hold(_ operation: FaultOperation) {
        gate.lock()
        held.insert(operation)
        gate.unlock()
    }

    public func resume(_ operation: FaultOperation) {
        gate.lock()
        held.remove(operation)
        gate.broadcast()
        gate.unlock()
    }

    /// Calls of `operation` waiting in `hold` now.
    public func waiting(_ operation: FaultOperation) -> Int {
        gate.lock()
        defer { gate.unlock() }
        return waiters[operation, default: 0]
    }

    private let gate = NSCondition()
    private var held: Set<FaultOperation> = []           // guarded by gate
    private var waiters: [FaultOperation: Int] = [:]     // guarded by gate

    private func waitIfHeld(_ operation: FaultOperation) {
        gate.lock()
        if held.contains(operation) {
            waiters[operation, default: 0] += 1
            while held.contains(operation) { gate.wait() }
            waiters[operation, default: 0] -= 1
        }
        gate.unlock()
    }

    /// Make every call of `operation` take `milliseconds` longer (0: no delay): a slow disk or
    /// server.
    public func delay(_ operation: FaultOperation, milliseconds: Int) {
        mutex.withLock { delays[operation] = milliseconds > 0 ? milliseconds : nil }
    }

    private var delays: [FaultOperation: Int] = [:]   // guarded by mutex

    private func wait(_ operation: FaultOperation) {
        waitIfHeld(operation)
        if let ms = mutex.withLock({ delays[operation] }) { usleep(useconds_t(min(ms, 600_000)) * 1000) }   // at most 10 min
    }

    /// Replace every rule and delay with those of `script`, one per line:
    /// `OPERATION ERRNO [always | next N | nth N | from N]` or `OPERATION delay MILLISECONDS`
    /// (`#` starts a comment). Returns a line for each line it could not read.
    public func load(script: String) -> [String] {
        var problems: [String] = []
        var newRules: [FaultOperation: Rule] = [:]
        var newDelays: [FaultOperation: Int] = [:]
        let errnos: [String: Int32] = ["EIO": EIO, "ENOSPC": ENOSPC, "EDQUOT": EDQUOT, "EACCES": EACCES, "EROFS": EROFS,
                                       "EHOSTUNREACH": EHOSTUNREACH, "ETIMEDOUT": ETIMEDOUT, "ENOENT": ENOENT]
        for (number, raw) in script.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let words = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first?
                .split(separator: " ", omittingEmptySubsequences: true).map(String.init) ?? []
            if words.isEmpty { continue }
            guard let operation = FaultOperation(rawValue: words[0]), words.count >= 2 else {
                problems.append("line \(number + 1): '\(raw)': an operation (\(FaultOperation.allCases.map(\.rawValue).joined(separator: ", "))) and what to do")
                continue
            }
            if words[1] == "delay", words.count == 3, let ms = Int(words[2]), ms >= 0 {
                newDelays[operation] = ms
                continue
            }
            guard let code = errnos[words[1]] else {
                problems.append("line \(number + 1): '\(raw)': no errno \(words[1]) (\(errnos.keys.sorted().joined(separator: ", ")))")
                continue
            }
            let trigger: FaultTrigger?
            switch (words.count, words.count > 2 ? words[2] : "always") {
            case (2, _), (3, "always"): trigger = .always
            default:
                switch (words[2], words.count == 4 ? Int(words[3]) : nil) {
                case ("next", let n?): trigger = .nextCalls(n)
                case ("nth", let n?): trigger = .nthCall(n)
                case ("from", let n?): trigger = .fromNthCall(n)
                default: trigger = nil
                }
            }
            guard let trigger else {
                problems.append("line \(number + 1): '\(raw)': when is always, next N, nth N or from N")
                continue
            }
            newRules[operation] = Rule(errno: code, trigger: trigger)
        }
        mutex.withLock {
            rules = newRules
            delays = newDelays
        }
        return problems
    }

    /// Count a call of `operation`; throw if the plan says it fails. For wrappers.
    public func check(_ operation: FaultOperation) throws(StoreError) {
        wait(operation)
        if let (code, call) = decide(operation) {
            throw StoreError(errno: code, "injected fault: \(operation.rawValue) call #\(call)")
        }
    }

    /// Count a call of `operation`; the errno to fail it with, or nil.
    public func next(_ operation: FaultOperation) -> Int32? {
        wait(operation)
        return decide(operation)?.errno
    }

    private func decide(_ operation: FaultOperation) -> (errno: Int32, call: Int)? {
        mutex.withLock { () -> (errno: Int32, call: Int)? in
            calls[operation, default: 0] += 1
            guard var rule = rules[operation] else { return nil }
            rule.seen += 1
            rules[operation] = rule
            let fails: Bool
            switch rule.trigger {
            case .always: fails = true
            case .nthCall(let n): fails = rule.seen == n
            case .fromNthCall(let n): fails = rule.seen >= n
            case .nextCalls(let n): fails = rule.seen <= n
            }
            guard fails else { return nil }
            failures[operation, default: 0] += 1
            return (rule.errno, calls[operation, default: 0])
        }
    }
}

/// Wraps `store` so that its calls fail as `plan` says. Its durability is the local-disk one over
/// the wrapped parts (replacing the store's own), so that its commits and syncs meet the faults.
public func faultInjecting(_ store: BackingStore, plan: FaultPlan) -> BackingStore {
    BackingStore(metadata: FaultInjectingMetadataStore(store.metadata, plan: plan),
                 blobs: store.blobs is ChunkAdopting ? FaultInjectingAdoptingBlobStore(store.blobs, plan: plan)
                     : FaultInjectingBlobStore(store.blobs, plan: plan),
                 work: FaultInjectingWorkArea(store.work, plan: plan),
                 locks: FaultInjectingLockTable(store.locks, plan: plan))
}

public final class FaultInjectingMetadataStore: MetadataStore, Sendable {
    public let wrapped: any MetadataStore
    public let plan: FaultPlan

    public init(_ wrapped: any MetadataStore, plan: FaultPlan) {
        self.wrapped = wrapped
        self.plan = plan
    }

    public func load() throws(StoreError) -> StoreSnapshot {
        try plan.check(.load)
        return try wrapped.load()
    }

    public func commit(_ batch: Batch, durable: Bool) throws(StoreError) -> ChangeSeq {
        try plan.check(.commit)
        return try wrapped.commit(batch, durable: durable)
    }

    public func trimChanges(keepingLast count: Int) throws(StoreError) {
        try plan.check(.trim)
        try wrapped.trimChanges(keepingLast: count)
    }

    public func changes(since seq: ChangeSeq) throws(StoreError) -> [ChangeRecord] {
        try plan.check(.changes)
        return try wrapped.changes(since: seq)
    }

    public func changes(since seq: ChangeSeq, notBy writer: String) throws(StoreError) -> [ChangeRecord] {
        try plan.check(.changes)
        return try wrapped.changes(since: seq, notBy: writer)
    }

    public func reserveInodes(_ count: Int) throws(StoreError) -> ClosedRange<InodeNumber> {
        try plan.check(.reserve)
        return try wrapped.reserveInodes(count)
    }

    public func reserveVersions(_ count: Int) throws(StoreError) -> ClosedRange<VersionID> {
        try plan.check(.reserve)
        return try wrapped.reserveVersions(count)
    }

    public func versions(of ino: InodeNumber) throws(StoreError) -> [VersionRecord] {
        try plan.check(.versions)
        return try wrapped.versions(of: ino)
    }

    public func versionCount(of ino: InodeNumber) throws(StoreError) -> Int {
        try plan.check(.versions)
        return try wrapped.versionCount(of: ino)
    }

    public func allVersions() throws(StoreError) -> [VersionRecord] {
        try plan.check(.versions)
        return try wrapped.allVersions()
    }

    public func versions(withOrigin origin: VersionOrigin) throws(StoreError) -> [VersionRecord] {
        try plan.check(.versions)
        return try wrapped.versions(withOrigin: origin)
    }

    public func version(_ id: VersionID) throws(StoreError) -> VersionRecord? {
        try plan.check(.version)
        return try wrapped.version(id)
    }

    public func capacity() -> StoreCapacity { wrapped.capacity() }

    public func referencedBlobs() throws(StoreError) -> Set<BlobID> {
        try plan.check(.load)
        return try wrapped.referencedBlobs()
    }

    public func waitForChanges(_ seconds: Double) { wrapped.waitForChanges(seconds) }
    public func reachability() -> StoreReachability? { wrapped.reachability() }
}

public class FaultInjectingBlobStore: BlobStore, @unchecked Sendable {
    public let wrapped: any BlobStore
    public let plan: FaultPlan

    public init(_ wrapped: any BlobStore, plan: FaultPlan) {
        self.wrapped = wrapped
        self.plan = plan
    }

    public func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef {
        try plan.check(.blobWrite)
        return try wrapped.write(bytes, durable: durable)
    }

    public func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        try plan.check(.blobRead)
        return try wrapped.read(blob, at: offset, into: buffer)
    }

    public func syncAll() throws(StoreError) {
        try plan.check(.syncAll)
        try wrapped.syncAll()
    }

    public func syncWritten() throws(StoreError) {
        try plan.check(.syncWritten)
        try wrapped.syncWritten()
    }

    public func delete(_ blob: BlobID) throws(StoreError) {
        try plan.check(.blobDelete)
        try wrapped.delete(blob)
    }

    public func verify(_ ref: ChunkRef) -> Bool {
        if plan.next(.blobVerify) != nil { return false }
        return wrapped.verify(ref)
    }

    public func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID] {
        try wrapped.allBlobs(writtenBefore: cutoff)
    }
}

/// The wrapper of a store that adopts chunk files: an adoption is a blob write.
public final class FaultInjectingAdoptingBlobStore: FaultInjectingBlobStore, ChunkAdopting, @unchecked Sendable {
    public func adopt(_ file: String, length: Int, checksum: UInt64, durable: Bool) throws(StoreError) -> ChunkRef {
        try plan.check(.blobWrite)
        return try (wrapped as! ChunkAdopting).adopt(file, length: length, checksum: checksum, durable: durable)
    }
}

public final class FaultInjectingWorkArea: WorkArea, Sendable {
    public let wrapped: any WorkArea
    public let plan: FaultPlan

    public init(_ wrapped: any WorkArea, plan: FaultPlan) {
        self.wrapped = wrapped
        self.plan = plan
    }

    public func create(ino: InodeNumber) throws(StoreError) -> any WorkFile {
        try plan.check(.workCreate)
        return FaultInjectingWorkFile(try wrapped.create(ino: ino), plan: plan)
    }

    public func recoveryFinished() { wrapped.recoveryFinished() }
    public func otherWritersAlive() -> Bool { wrapped.otherWritersAlive() }
    public var bootID: String { wrapped.bootID }

    public func leftovers() throws(StoreError) -> [RecoveredWork] {
        try plan.check(.workLeftovers)
        return try wrapped.leftovers().map { work in
            var wrappedWork = work
            wrappedWork.file = FaultInjectingWorkFile(work.file, plan: plan)
            return wrappedWork
        }
    }
}

public final class FaultInjectingLockTable: LockTable, Sendable {
    public let wrapped: any LockTable
    public let plan: FaultPlan

    public init(_ wrapped: any LockTable, plan: FaultPlan) {
        self.wrapped = wrapped
        self.plan = plan
    }

    public func set(_ node: InodeNumber, owner: LockOwner, mode: LockMode?, range: LockRange, pid: Int32) throws(StoreError) -> Bool {
        try plan.check(.lockSet)
        return try wrapped.set(node, owner: owner, mode: mode, range: range, pid: pid)
    }

    public func test(_ node: InodeNumber, owner: LockOwner, mode: LockMode, range: LockRange) throws(StoreError) -> HeldLock? {
        try plan.check(.lockTest)
        return try wrapped.test(node, owner: owner, mode: mode, range: range)
    }

    public func release(_ node: InodeNumber, owner: LockOwner) { wrapped.release(node, owner: owner) }
    public func forget(_ node: InodeNumber) { wrapped.forget(node) }
}

public final class FaultInjectingWorkFile: WorkFile, Sendable {
    public let wrapped: any WorkFile
    public let plan: FaultPlan

    public init(_ wrapped: any WorkFile, plan: FaultPlan) {
        self.wrapped = wrapped
        self.plan = plan
    }

    public var ino: InodeNumber { wrapped.ino }

    public func pread(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) -> Int {
        try plan.check(.workRead)
        return try wrapped.pread(into: buffer, at: offset)
    }

    public func pwrite(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError) {
        try plan.check(.workWrite)
        try wrapped.pwrite(bytes, at: offset)
    }

    public func truncate(to size: Int) throws(StoreError) {
        try plan.check(.workTruncate)
        try wrapped.truncate(to: size)
    }

    public func markDirty(_ index: Int) throws(StoreError) {
        try plan.check(.workMarkDirty)
        try wrapped.markDirty(index)
    }

    public var keepsPages: Bool { wrapped.keepsPages }

    public func markSynced() throws(StoreError) -> Bool {
        try plan.check(.workMarkSynced)
        return try wrapped.markSynced()
    }

    public func markPages(_ index: Int, _ pages: PageSet) throws(StoreError) {
        try plan.check(.workMarkPages)
        try wrapped.markPages(index, pages)
    }

    public func setBase(_ base: VersionID?, size: UInt64) throws(StoreError) {
        try plan.check(.workSetBase)
        try wrapped.setBase(base, size: size)
    }

    public func setFinished(mtime: Int64?) throws(StoreError) {
        try plan.check(.workSetFinished)
        try wrapped.setFinished(mtime: mtime)
    }

    public func sync() throws(StoreError) {
        try plan.check(.workSync)
        try wrapped.sync()
    }

    public func chunkFile(_ index: Int, length: Int) throws(StoreError) -> String? {
        try plan.check(.workRead)
        return try wrapped.chunkFile(index, length: length)
    }

    public func remove() { wrapped.remove() }
}
