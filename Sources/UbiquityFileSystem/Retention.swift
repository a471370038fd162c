// Which old versions go: every version for a day, then the newest of each hour for a week, the
// newest of each day for 30 days, at most `maxPerFile` per file, and at most `maxBytesPerContainer`
// of old versions per container (the oldest go first). The current version and unresolved
// conflicts always stay; a version recovered after a crash is never thinned, only expired.
// Also how long Recently Deleted keeps items. A pure value, so the rules are tested over
// simulated days; the model applies it when a file's count grows (`prune`) and to every file at
// each collection (`pruneAll`). It is the store's setting, in its `meta` table, so every daemon
// and command on the store prunes alike.

import Foundation
import UbiquityStore

public struct RetentionPolicy: Sendable, Equatable {
    public static let hour: Int64 = 3_600 * 1_000_000_000
    public static let day: Int64 = 24 * hour

    /// Every version younger than this stays.
    public var allFor: Int64 = day
    /// Then the newest version of each hour, until this age.
    public var hourlyFor: Int64 = 7 * day
    /// Then the newest of each day, until this age; older ones go.
    public var dailyFor: Int64 = 30 * day
    /// Versions kept per file at most (the newest), whatever their age.
    public var maxPerFile = 1_000
    /// Bytes of old (not current) versions kept per container, counted by their sizes.
    public var maxBytesPerContainer: UInt64 = 4 << 30
    /// How long Recently Deleted keeps an item.
    public var deletedFor: Int64 = 30 * day

    public init() {}

    /// The `parse` form of every setting, exact (seconds and bytes).
    public var spec: String {
        "all=\(allFor / 1_000_000_000)s,hourly=\(hourlyFor / 1_000_000_000)s,daily=\(dailyFor / 1_000_000_000)s,"
            + "space=\(maxBytesPerContainer),max=\(maxPerFile),deleted=\(deletedFor / 1_000_000_000)s"
    }

    /// The versions of one file (`versions`, any order) that go at time `now`. `keep`: versions
    /// that stay whatever their age (the current one, unresolved conflicts).
    public func doomed(_ versions: [VersionRecord], keep: Set<VersionID>, now: Int64) -> Set<VersionID> {
        var doomed: Set<VersionID> = []
        var buckets: Set<Int64> = []
        var kept = 0
        for v in versions.sorted(by: { ($0.created, $0.id) > ($1.created, $1.id) }) {
            if keep.contains(v.id) { kept += 1; continue }
            let age = now - v.created
            var goes: Bool
            if age < allFor {
                goes = false
            } else if age >= dailyFor {
                goes = true
            } else if v.origin == .recovered {
                goes = false
            } else {
                // Hour buckets are positive, day buckets negative: one set for both.
                let bucket = age < hourlyFor ? v.created / Self.hour + 1 : -(v.created / Self.day) - 1
                goes = !buckets.insert(bucket).inserted
            }
            if !goes && kept >= maxPerFile { goes = true }
            if goes { doomed.insert(v.id) } else { kept += 1 }
        }
        return doomed
    }

    /// Parse `all=1d,hourly=7d,daily=30d,space=4G,max=1000,deleted=30d` (any subset; units s,
    /// m, h, d for times and K, M, G, T for bytes) over `base`.
    public static func parse(_ text: String, over base: RetentionPolicy = RetentionPolicy()) -> RetentionPolicy? {
        var p = base
        for item in text.split(separator: ",") {
            let kv = item.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard kv.count == 2 else { return nil }
            switch kv[0] {
            case "all": guard let t = duration(kv[1]) else { return nil }; p.allFor = t
            case "hourly": guard let t = duration(kv[1]) else { return nil }; p.hourlyFor = t
            case "daily": guard let t = duration(kv[1]) else { return nil }; p.dailyFor = t
            case "space": guard let b = bytes(kv[1]) else { return nil }; p.maxBytesPerContainer = b
            case "max": guard let n = Int(kv[1]), n >= 2 else { return nil }; p.maxPerFile = n
            case "deleted": guard let t = duration(kv[1]) else { return nil }; p.deletedFor = t
            default: return nil
            }
        }
        guard p.allFor <= p.hourlyFor, p.hourlyFor <= p.dailyFor else { return nil }
        return p
    }

    private static func duration(_ s: String) -> Int64? {
        let units: [Character: Int64] = ["s": 1_000_000_000, "m": 60_000_000_000, "h": hour, "d": day]
        // At most 100 years: anything longer is a typo, and would overflow.
        guard let u = s.last.flatMap({ units[$0] }), let n = Double(s.dropLast()), n >= 0,
              n * Double(u) <= 36_500 * Double(day) else { return nil }
        return Int64(n * Double(u))
    }

    /// A byte count: a number, or one with K, M, G or T (powers of 1024).
    public static func bytes(_ s: String) -> UInt64? {
        let units: [Character: Double] = ["K": 1_024, "M": 1_048_576, "G": 1_073_741_824, "T": 1_099_511_627_776]
        if let n = UInt64(s) { return n }
        guard let u = s.last.flatMap({ units[$0] }), let n = Double(s.dropLast()), n >= 0, n * u < 0x1p62 else { return nil }
        return UInt64(n * u)
    }
}
