// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Taskloop",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "taskloop", targets: ["taskloop"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
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
        .target(name: "TaskloopJSON"),
        .target(
            name: "TaskloopHTTP",
            dependencies: ["CLibUV", "CHTTPParser", "TaskloopJSON"]
        ),
        .target(
            name: "TaskloopService",
            dependencies: ["TaskloopHTTP"]
        ),
        .executableTarget(
            name: "taskloop",
            dependencies: [
                "TaskloopService",
                "TaskloopHTTP",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "http-bench-server",
            dependencies: ["TaskloopHTTP", "TaskloopJSON"],
            path: "Benchmarks/http/Server"
        ),
        .target(
            name: "TaskloopTestSupport",
            dependencies: ["TaskloopHTTP"],
            path: "Tests/TaskloopTestSupport"
        ),
        .testTarget(
            name: "TaskloopJSONTests",
            dependencies: ["TaskloopJSON"]
        ),
        .testTarget(
            name: "TaskloopHTTPTests",
            dependencies: ["TaskloopHTTP", "TaskloopTestSupport"]
        ),
    ]
)
