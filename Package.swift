// swift-tools-version:6.0
import PackageDescription

/// Release builds of the hot-path modules skip dynamic exclusivity checks. Measured with
/// callgrind (instructions per request, release build, the same server and load): without the
/// flag GET /tasks/{id} takes 28.5k instead of 25.1k (+14%) and POST /tasks 47.2k instead of
/// 37.0k (+28%), about a hundred checks per submission. Debug builds, which run the tests (and
/// ThreadSanitizer), keep the checks, so a violation still traps there. Unsafe flags keep other
/// packages from depending on this one; Taskloop is an application, so that costs nothing.
let hotPathSettings: [SwiftSetting] = [
    .unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release)),
]

let package = Package(
    name: "Taskloop",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "taskloop", targets: ["taskloop"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
    ],
    targets: [
        .systemLibrary(
            name: "CLibUV",
            pkgConfig: "libuv",
            providers: [.apt(["libuv1-dev"])]
        ),
        .systemLibrary(
            name: "CHTTPParser",
            providers: [.apt(["libhttp-parser-dev"])]
        ),
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .systemLibrary(
            name: "CLibPQ",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        // Byte-level helpers the wire formats share: UTF-8 with an ASCII fast path, decimals.
        .target(name: "TaskloopBytes", swiftSettings: hotPathSettings),
        .target(name: "TaskloopJSON", dependencies: ["TaskloopBytes"], swiftSettings: hotPathSettings),
        // Schedules' time arithmetic, pure: cron expressions, zones read from the system's tzdata,
        // and the slots a schedule fires at across DST changes.
        .target(name: "TaskloopTime"),
        .target(
            name: "TaskloopLoop",
            dependencies: ["CLibUV"],
            swiftSettings: hotPathSettings
        ),
        .target(
            name: "TaskloopHTTP",
            dependencies: ["CLibUV", "CHTTPParser", "TaskloopLoop", "TaskloopBytes"],
            swiftSettings: hotPathSettings
        ),
        .target(
            name: "TaskloopHTTPClient",
            dependencies: ["CLibUV", "CCurl", "TaskloopLoop", .product(name: "Crypto", package: "swift-crypto")]
        ),
        // A client of a Taskloop server: its API's calls and answers, its event streams, backoff.
        // The reference worker and the command-line client share it.
        .target(
            name: "TaskloopClient",
            dependencies: ["TaskloopHTTPClient", "TaskloopJSON", "TaskloopLoop"]
        ),
        // The command-line client's commands (`taskloop submit`, `get`, `ls`, `cancel`, `retry`,
        // `watch`): their runs on a loop, the watch's model, and its displays as pure functions.
        .target(
            name: "TaskloopCLI",
            dependencies: ["TaskloopClient", "TaskloopHTTPClient", "TaskloopJSON", "TaskloopLoop", "TaskloopTime"]
        ),
        // PostgreSQL on the loop: libpq's asynchronous API in pipeline mode, its socket watched
        // by libuv.
        .target(name: "TaskloopPostgres", dependencies: ["CLibPQ", "TaskloopLoop"]),
        // The database: SQLite on a writer thread of its own, the data dir and its lock, the
        // schema and its migrations; PostgreSQL shared by replicas, on the loop.
        .target(name: "TaskloopStore", dependencies: ["CSQLite", "TaskloopEngine", "TaskloopJSON", "TaskloopLoop", "TaskloopPostgres"]),
        // A cluster of replicas on PostgreSQL: cells, which replica owns each (rendezvous
        // hashing, leases with epochs), and the rules of owning them, as values; requests for
        // another replica's cells forwarded to it.
        .target(
            name: "TaskloopCluster",
            dependencies: [
                "TaskloopEngine", "TaskloopHTTP", "TaskloopHTTPClient", "TaskloopLoop", "TaskloopPostgres", "TaskloopStore",
                "TaskloopTime",
            ]
        ),
        .target(
            name: "TaskloopEngine",
            dependencies: [
                "TaskloopBytes",
                "TaskloopJSON",
                "TaskloopTime",
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "DequeModule", package: "swift-collections"),
            ],
            swiftSettings: hotPathSettings
        ),
        // The executors that do real work (`exec`, `http`) and the engine's clock on the loop, for
        // the server and the worker alike.
        .target(
            name: "TaskloopExecutors",
            dependencies: ["TaskloopBytes", "TaskloopEngine", "TaskloopHTTPClient", "TaskloopJSON", "TaskloopLoop"],
            swiftSettings: hotPathSettings
        ),
        // The reference worker (`taskloop worker`): leases a queue's tasks from a server and runs
        // them with the server's own executors in an engine of its own.
        .target(
            name: "TaskloopWorker",
            dependencies: [
                "TaskloopClient", "TaskloopEngine", "TaskloopExecutors", "TaskloopHTTPClient", "TaskloopJSON", "TaskloopLoop",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "TaskloopService",
            dependencies: [
                "TaskloopBytes", "TaskloopCluster", "TaskloopLoop", "TaskloopHTTP", "TaskloopHTTPClient", "TaskloopEngine",
                "TaskloopExecutors", "TaskloopJSON", "TaskloopStore", "TaskloopTime",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            // The spec the server serves at /openapi.yaml is the file itself (a link to the
            // repository's openapi.yaml), and the dashboard's files; all compiled into the binary.
            resources: [
                .embedInCode("Resources/openapi.yaml"),
                .embedInCode("Resources/ui/index.html"),
                .embedInCode("Resources/ui/style.css"),
                .embedInCode("Resources/ui/icon.svg"),
                .embedInCode("Resources/ui/app.js"),
                .embedInCode("Resources/ui/api.js"),
                .embedInCode("Resources/ui/dom.js"),
                .embedInCode("Resources/ui/queues.js"),
                .embedInCode("Resources/ui/tasks.js"),
                .embedInCode("Resources/ui/task.js"),
                .embedInCode("Resources/ui/workflow.js"),
                .embedInCode("Resources/ui/graph.js"),
                .embedInCode("Resources/ui/schedules.js"),
            ],
            swiftSettings: hotPathSettings
        ),
        .executableTarget(
            name: "taskloop",
            dependencies: [
                "TaskloopService",
                "TaskloopExecutors",
                "TaskloopWorker",
                "TaskloopCLI",
                "TaskloopLoop",
                "TaskloopHTTP",
                "TaskloopHTTPClient",
                "TaskloopStore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "http-bench-server",
            dependencies: ["TaskloopLoop", "TaskloopHTTP", "TaskloopJSON"],
            path: "Benchmarks/http/Server"
        ),
        .executableTarget(
            name: "engine-bench",
            dependencies: ["TaskloopEngine", "TaskloopJSON"],
            path: "Benchmarks/engine",
            exclude: ["run.sh"]
        ),
        // Helpers every test target may use: waiting with a deadline, a raw-socket client, a
        // scripted origin server, a seeded generator. Foundation only, so the engine's tests
        // link no libuv.
        .target(
            name: "TaskloopTestSupport",
            path: "Tests/TaskloopTestSupport"
        ),
        .target(
            name: "TaskloopLoopTestSupport",
            dependencies: ["TaskloopLoop", "TaskloopTestSupport"],
            path: "Tests/TaskloopLoopTestSupport"
        ),
        .testTarget(
            name: "TaskloopServiceTests",
            dependencies: [
                "TaskloopService", "TaskloopWorker", "TaskloopLoop", "TaskloopHTTP", "TaskloopHTTPClient", "TaskloopEngine", "TaskloopJSON",
                "TaskloopTestSupport", "TaskloopLoopTestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            // Run by the tests as programs of their own (python3).
            exclude: ["Fixtures"]
        ),
        .testTarget(
            name: "TaskloopClusterTests",
            dependencies: ["TaskloopCluster", "TaskloopEngine", "TaskloopHTTP", "TaskloopJSON", "TaskloopLoop", "TaskloopPostgres",
                           "TaskloopStore", "TaskloopTestSupport", "TaskloopLoopTestSupport"]
        ),
        .testTarget(
            name: "TaskloopEngineTests",
            dependencies: ["TaskloopEngine", "TaskloopJSON", "TaskloopTestSupport", "TaskloopTime"]
        ),
        .testTarget(
            name: "TaskloopTimeTests",
            dependencies: ["TaskloopTime"]
        ),
        .testTarget(
            name: "TaskloopJSONTests",
            dependencies: ["TaskloopJSON"]
        ),
        .testTarget(
            name: "TaskloopHTTPClientTests",
            dependencies: ["TaskloopHTTPClient", "TaskloopLoop", "TaskloopTestSupport", "TaskloopLoopTestSupport"]
        ),
        .testTarget(
            name: "TaskloopClientTests",
            dependencies: ["TaskloopClient", "TaskloopJSON", "TaskloopTestSupport"]
        ),
        .testTarget(
            name: "TaskloopCLITests",
            dependencies: ["TaskloopCLI", "TaskloopClient", "TaskloopJSON", "TaskloopTime"]
        ),
        .testTarget(
            name: "TaskloopHTTPTests",
            dependencies: ["TaskloopHTTP", "TaskloopLoop", "TaskloopTestSupport", "TaskloopLoopTestSupport"]
        ),
        .testTarget(
            name: "TaskloopStoreTests",
            dependencies: ["TaskloopStore", "TaskloopEngine", "TaskloopJSON", "TaskloopLoop", "TaskloopPostgres", "TaskloopTestSupport",
                           "TaskloopLoopTestSupport"]
        ),
        .testTarget(
            name: "TaskloopPostgresTests",
            dependencies: ["TaskloopPostgres", "TaskloopLoop", "TaskloopTestSupport", "TaskloopLoopTestSupport"]
        ),
        .testTarget(
            name: "TaskloopLoopTests",
            dependencies: ["TaskloopLoop", "TaskloopTestSupport", "TaskloopLoopTestSupport"]
        ),
    ]
)
