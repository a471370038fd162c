// The container registry and iCloud's CFBundleVersion rule.

/// iCloud's rule: a container's settings are taken when it is first seen, and re-read only when the manifest's CFBundleVersion is greater than the registered version. A settings change without a version increase keeps the registered settings and gives a warning naming the manifest, the key and the version ("…: warning: NSUbiquitousContainerName: changed from \"A\" to \"B\" but CFBundleVersion is still 3; raise CFBundleVersion above 3 (or pass --apply-manifest-changes)"). With applyChanges, the edit is applied anyway (registeredVersion becomes the manifest's). Identity is the container identifier, so renaming keeps the container (and its documents).
/// Two *active public* containers whose names collide (exact byte compare) → error diagnostic naming both files; the one registered earlier (or, both new, the one whose manifest path sorts first) keeps the name, the other becomes active = false.
///
/// Details: `active` is recomputed on every call (true when a manifest declares the container and it
/// keeps its name), so a returning manifest or a resolved clash reactivates a registration. A manifest
/// with a *lower* CFBundleVersion than registered keeps the registered settings and version (a warning
/// when its settings differ). `bundleIdentifier` and `manifestPath` always follow the manifest that
/// declares the container now. If two manifests declare one container, the first keeps it and the
/// other's declaration is ignored with an error.
public func register(previous: [Registration], manifests: [AppManifest], applyChanges: Bool) -> RegistrationResult {
    var registrations = previous
    var diagnostics: [Diagnostic] = []
    var index: [String: Int] = [:]
    for (i, r) in registrations.enumerated() where index[r.identifier] == nil { index[r.identifier] = i }
    let previousCount = registrations.count
    var declared: Set<Int> = []
    var declaredBy: [String: String] = [:]

    for manifest in manifests {
        for container in manifest.containers {
            let keyPath = "\(Keys.containers).\(container.identifier)"
            if let other = declaredBy[container.identifier] {
                diagnostics.append(Diagnostic(
                    severity: .error, file: manifest.path, key: keyPath,
                    message: "\(oneLine(container.identifier).text) is also declared by \(other), which keeps it; this declaration is ignored",
                    fix: "declare each container in one manifest only"))
                continue
            }
            declaredBy[container.identifier] = manifest.path

            guard let i = index[container.identifier] else {
                index[container.identifier] = registrations.count
                declared.insert(registrations.count)
                registrations.append(Registration(
                    identifier: container.identifier, bundleIdentifier: manifest.bundleIdentifier,
                    settings: container.settings, registeredVersion: manifest.bundleVersion,
                    manifestPath: manifest.path, active: true))
                continue
            }
            declared.insert(i)
            var r = registrations[i]
            r.bundleIdentifier = manifest.bundleIdentifier
            r.manifestPath = manifest.path
            // A registered version that is not a valid version (a damaged registry) counts as older.
            let order = compareBundleVersions(manifest.bundleVersion, r.registeredVersion) ?? 1
            if order > 0 || (r.settings != container.settings && applyChanges) {
                r.settings = container.settings
                r.registeredVersion = manifest.bundleVersion
            } else if r.settings != container.settings {
                // Versions and identifiers may be megabytes long: messages show them cut.
                let (current, registered) = (oneLine(manifest.bundleVersion).text, oneLine(r.registeredVersion).text)
                let version = order == 0
                    ? "CFBundleVersion is still \(current)"
                    : "CFBundleVersion \(current) is lower than the registered \(registered)"
                let fix = "raise CFBundleVersion above \(registered) (or pass --apply-manifest-changes)"
                for (key, old, new) in changes(from: r.settings, to: container.settings) {
                    diagnostics.append(Diagnostic(
                        severity: .warning, file: manifest.path, key: "\(keyPath).\(key)",
                        message: "changed from \(old) to \(new) but \(version)", fix: fix))
                }
            }
            registrations[i] = r
        }
    }

    for i in registrations.indices { registrations[i].active = declared.contains(i) }

    // Name clashes among active public containers: the earliest registered keeps the name.
    struct Rank: Comparable {
        var isNew: Bool, path: String, index: Int
        static func < (a: Rank, b: Rank) -> Bool {
            if a.isNew != b.isNew { return !a.isNew }
            if a.isNew, a.path != b.path { return precedesByBytes(a.path, b.path) }
            return a.index < b.index
        }
    }
    var byName: [[UInt8]: [Int]] = [:]
    var nameOrder: [[UInt8]] = []
    for (i, r) in registrations.enumerated() where r.active && r.settings.isPublic {
        let key = Array(r.settings.name.utf8)
        if byName[key] == nil { nameOrder.append(key) }
        byName[key, default: []].append(i)
    }
    for key in nameOrder {
        guard let group = byName[key], group.count > 1 else { continue }
        let ranked = group.sorted {
            Rank(isNew: $0 >= previousCount, path: registrations[$0].manifestPath, index: $0)
                < Rank(isNew: $1 >= previousCount, path: registrations[$1].manifestPath, index: $1)
        }
        let winner = registrations[ranked[0]]
        for loser in ranked.dropFirst() {
            registrations[loser].active = false
            let r = registrations[loser]
            diagnostics.append(Diagnostic(
                severity: .error, file: r.manifestPath, key: "\(Keys.containers).\(r.identifier).\(Keys.name)",
                message: "\(quoted(r.settings.name)) is already the name of \(oneLine(winner.identifier).text) from \(winner.manifestPath), which keeps it; \(oneLine(r.identifier).text) is not mounted",
                fix: "give one of them another NSUbiquitousContainerName and raise that manifest's CFBundleVersion (here above \(oneLine(r.registeredVersion).text))"))
        }
    }
    return RegistrationResult(registrations: registrations, diagnostics: diagnostics)
}

/// The settings that differ, as (key, old, new) with values written for a message.
private func changes(from old: ContainerSettings, to new: ContainerSettings) -> [(String, String, String)] {
    var result: [(String, String, String)] = []
    if old.isPublic != new.isPublic { result.append((Keys.isPublic, String(old.isPublic), String(new.isPublic))) }
    if !old.name.utf8.elementsEqual(new.name.utf8) { result.append((Keys.name, quoted(old.name), quoted(new.name))) }
    if old.folderLevels != new.folderLevels {
        result.append((Keys.levels, quoted(old.folderLevels.rawValue), quoted(new.folderLevels.rawValue)))
    }
    return result
}
