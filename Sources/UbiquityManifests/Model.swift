// Public model of app manifests, their diagnostics and the container registry.

/// `NSUbiquitousContainerSupportedFolderLevels`: how many folder levels the drive view allows inside a
/// container's `Documents` folder.
public enum FolderLevels: String, Sendable, Equatable, CaseIterable {
    case none = "None", one = "One", any = "Any"

    /// Max folder depth inside Documents: 0 for None, 1 for One, nil (unlimited) for Any.
    public var maxDepth: Int? {
        switch self {
        case .none: return 0
        case .one: return 1
        case .any: return nil
        }
    }
}

/// The settings of one container that iCloud registers (and re-reads only when CFBundleVersion grows).
public struct ContainerSettings: Sendable, Equatable {
    /// `NSUbiquitousContainerIsDocumentScopePublic`: only public containers appear in the drive view.
    public var isPublic: Bool
    /// `NSUbiquitousContainerName` (default `CFBundleName`), `$(...)` expanded: the drive-view folder name.
    public var name: String
    /// `NSUbiquitousContainerSupportedFolderLevels` (default None).
    public var folderLevels: FolderLevels

    public init(isPublic: Bool, name: String, folderLevels: FolderLevels) {
        self.isPublic = isPublic
        self.name = name
        self.folderLevels = folderLevels
    }

    /// Names compare by bytes (no Unicode normalization), as folder names do on Linux.
    public static func == (a: ContainerSettings, b: ContainerSettings) -> Bool {
        a.isPublic == b.isPublic && a.folderLevels == b.folderLevels && a.name.utf8.elementsEqual(b.name.utf8)
    }
}

/// One entry of a manifest's `NSUbiquitousContainers`.
public struct ContainerDeclaration: Sendable, Equatable {
    /// The container identifier with `$(...)` references expanded, e.g. `iCloud.com.example.TestDrive`.
    public var identifier: String
    public var settings: ContainerSettings
    /// True when `NSUbiquitousContainerSupportedFolderLevels` was missing and None was assumed.
    public var levelsDefaulted: Bool

    public init(identifier: String, settings: ContainerSettings, levelsDefaulted: Bool) {
        self.identifier = identifier
        self.settings = settings
        self.levelsDefaulted = levelsDefaulted
    }
}

/// A manifest that loaded without errors.
public struct AppManifest: Sendable, Equatable {
    /// The file, as the manifests folder joined with its name (`apps/Foo.plist`, `apps/Foo/Info.plist`).
    public var path: String
    public var bundleIdentifier: String
    /// `CFBundleName`, expanded; the empty string when the manifest has none.
    public var bundleName: String
    /// `CFBundleVersion`, expanded; digits and dots only.
    public var bundleVersion: String
    /// In declaration order as written in the file; never empty; containers[0] is the app's default container.
    public var containers: [ContainerDeclaration]

    public init(path: String, bundleIdentifier: String, bundleName: String, bundleVersion: String,
                containers: [ContainerDeclaration]) {
        self.path = path
        self.bundleIdentifier = bundleIdentifier
        self.bundleName = bundleName
        self.bundleVersion = bundleVersion
        self.containers = containers
    }
}

/// One line of feedback about a manifest: which file, which key, what is wrong, what to do.
public struct Diagnostic: Sendable, Equatable, CustomStringConvertible {
    public enum Severity: String, Sendable {
        case error, warning
    }

    public var severity: Severity
    public var file: String
    /// The key path, dot-separated from the top level, e.g.
    /// `NSUbiquitousContainers.iCloud.com.example.Foo.NSUbiquitousContainerName`; nil for the whole file.
    public var key: String?
    public var message: String
    public var fix: String

    public init(severity: Severity, file: String, key: String?, message: String, fix: String) {
        self.severity = severity
        self.file = file
        self.key = key
        self.message = message
        self.fix = fix
    }

    /// One line: "FILE: error: KEY: what is wrong; what to do" (no key part when key is nil).
    public var description: String {
        // Key paths hold the manifest's own keys, which may hold line breaks or be megabytes long.
        var line = "\(oneLine(file, limit: .max).text): \(severity.rawValue): "
        if let key { line += "\(oneLine(key).text): " }
        line += message
        if !fix.isEmpty { line += "; \(fix)" }
        return line
    }
}

/// The result of reading a manifests folder.
public struct ManifestLoad: Sendable {
    /// The manifests without errors, sorted by path.
    public var manifests: [AppManifest]
    /// Errors and warnings, grouped by file in path order.
    public var diagnostics: [Diagnostic]

    public init(manifests: [AppManifest], diagnostics: [Diagnostic]) {
        self.manifests = manifests
        self.diagnostics = diagnostics
    }
}

/// A registered container: the settings iCloud took for it, and from which manifest version.
public struct Registration: Sendable, Equatable {
    /// Identity: the container identifier. Renaming a container keeps it (and its documents).
    public var identifier: String
    public var bundleIdentifier: String
    public var settings: ContainerSettings
    /// The CFBundleVersion at which `settings` were last read.
    public var registeredVersion: String
    public var manifestPath: String
    /// false when no loaded manifest declares it any more, or it lost a name clash: kept (its documents are never dropped) but not mounted.
    public var active: Bool

    public init(identifier: String, bundleIdentifier: String, settings: ContainerSettings,
                registeredVersion: String, manifestPath: String, active: Bool) {
        self.identifier = identifier
        self.bundleIdentifier = bundleIdentifier
        self.settings = settings
        self.registeredVersion = registeredVersion
        self.manifestPath = manifestPath
        self.active = active
    }
}

/// The registry after applying the loaded manifests.
public struct RegistrationResult: Sendable {
    /// Previous ones kept, new appended; stable order.
    public var registrations: [Registration]
    public var diagnostics: [Diagnostic]

    public init(registrations: [Registration], diagnostics: [Diagnostic]) {
        self.registrations = registrations
        self.diagnostics = diagnostics
    }
}
