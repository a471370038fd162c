// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "UbiquityFS",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "ubiquityfs", targets: ["ubiquityfs"]),
    ],
    targets: [
        // libfuse3's low-level API. Only UbiquityFuse imports it.
        .systemLibrary(name: "CFuse", pkgConfig: "fuse3",
                       providers: [.apt(["libfuse3-dev"])]),
        // The daemon's device I/O under libfuse: hooks for what libfuse 3.14 does not pass on,
        // and requests served over FUSE-over-io_uring. Only UbiquityFuse imports it.
        .target(name: "CFuseIO", linkerSettings: [.linkedLibrary("fuse3")]),
        // SQLite for the embedded store's metadata. Only UbiquityStore imports it.
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3",
                       providers: [.apt(["libsqlite3-dev"])]),
        // libpq, PostgreSQL's client library. Only UbiquitySharedStore imports it.
        .systemLibrary(name: "CPostgres", pkgConfig: "libpq",
                       providers: [.apt(["libpq-dev"])]),
        // libcurl, for S3-compatible object stores (it signs requests with AWS SigV4). Only
        // UbiquitySharedStore imports it.
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl",
                       providers: [.apt(["libcurl4-openssl-dev"])]),
        // App manifests (Info.plist): parsing, validation, the CFBundleVersion registration rule.
        .target(name: "UbiquityManifests"),
        // The backing-store protocol and its embedded (SQLite + chunk files), in-memory and
        // fault-injecting implementations.
        .target(name: "UbiquityStore", dependencies: ["CSQLite"]),
        // The shared store: metadata, change feed and locks on PostgreSQL, chunks in PostgreSQL
        // or an S3-compatible object store, this machine's working copies in a local folder.
        .target(name: "UbiquitySharedStore", dependencies: ["CPostgres", "CCurl", "UbiquityStore"]),
        // The filesystem model: namespace, views, document coordination. Knows nothing of FUSE.
        .target(name: "UbiquityFileSystem", dependencies: ["UbiquityStore"]),
        // The thin adapter from libfuse3's low-level API to the model.
        .target(name: "UbiquityFuse", dependencies: ["CFuse", "CFuseIO", "UbiquityFileSystem"]),
        // Subcommands, option parsing and the daemon's life cycle.
        .target(name: "UbiquityCLI", dependencies: ["UbiquityFuse", "UbiquityFileSystem",
                                                    "UbiquityStore", "UbiquitySharedStore", "UbiquityManifests"]),
        // The `ubiquityfs` executable: one entry file.
        .executableTarget(name: "ubiquityfs", dependencies: ["UbiquityCLI"]),

        .testTarget(name: "ManifestsTests", dependencies: ["UbiquityManifests"]),
        .testTarget(name: "StoreTests", dependencies: ["UbiquityStore", "UbiquitySharedStore"]),
        .testTarget(name: "FileSystemTests", dependencies: ["UbiquityFileSystem", "UbiquityStore"]),
        // Mount the built binary for real; needs /dev/fuse and root (as CI has).
        .testTarget(name: "MountTests", dependencies: []),
    ],
    swiftLanguageModes: [.v6]
)
