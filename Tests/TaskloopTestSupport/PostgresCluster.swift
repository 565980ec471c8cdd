import Foundation

/// A real PostgreSQL for the tests: a throwaway cluster (`scripts/postgres-cluster.sh`) in a
/// temporary directory, on a free port, stopped once the test process has ended (however it
/// ended).
///
/// `shared` is one cluster for the whole test process, in which each test makes a database of
/// its own (`makeDatabase`); `make test` may hand one in as `TASKLOOP_TEST_DATABASE_URL`.
/// A test that stops or crashes the server starts a dedicated cluster (`start()`).
public final class PostgresCluster: @unchecked Sendable {
    public let directory: URL
    public let port: Int
    /// The cluster's `postgres` database.
    public let url: String
    private let owned: Bool

    private static let script = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("scripts/postgres-cluster.sh").path

    private static let sharedCluster = Locked<PostgresCluster?>(nil)

    private init(directory: URL, port: Int, url: String, owned: Bool) {
        self.directory = directory
        self.port = port
        self.url = url
        self.owned = owned
    }

    /// The process's cluster, started on first use.
    public static func shared() throws -> PostgresCluster {
        try sharedCluster.withLock { cluster in
            if let cluster { return cluster }
            let made: PostgresCluster
            if let given = ProcessInfo.processInfo.environment["TASKLOOP_TEST_DATABASE_URL"], !given.isEmpty {
                made = PostgresCluster(directory: URL(fileURLWithPath: "/nonexistent"), port: 0, url: given, owned: false)
            } else {
                made = try start()
            }
            cluster = made
            return made
        }
    }

    /// A cluster of its own, stopped at exit (or by `stop`).
    public static func start() throws -> PostgresCluster {
        // Made by the script, readable by the server's user, removed once this process has ended.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-pg-\(UUID().uuidString)")
        let port = try OriginServer.freePort()
        let output = try run([script, "start", directory.path, String(port)])
        try run([script, "stop-after", String(getpid()), directory.path])
        return PostgresCluster(directory: directory, port: port,
                               url: output.trimmingCharacters(in: .whitespacesAndNewlines), owned: true)
    }

    /// A new, empty database in this cluster; its URL.
    public func makeDatabase() throws -> String {
        let name = "test_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(20)
        try sql("CREATE DATABASE \(name)")
        guard let slash = url.range(of: "/", options: .backwards) else { return url }
        return url[..<slash.lowerBound] + "/" + name
    }

    /// Runs `statement` with psql against the `postgres` database.
    @discardableResult
    public func sql(_ statement: String, database: String? = nil) throws -> String {
        try Self.run(["/usr/bin/psql", database ?? url, "-v", "ON_ERROR_STOP=1", "-qAtc", statement], shell: false)
    }

    /// Shuts the server down as a crash would (immediate mode).
    public func kill() throws {
        precondition(owned, "only a cluster of its own is stopped by a test")
        try Self.run([Self.script, "kill", directory.path])
    }

    public func stop() throws {
        precondition(owned, "only a cluster of its own is stopped by a test")
        try Self.run([Self.script, "stop", directory.path])
    }

    /// Starts again what `kill` or `stop` stopped, on the same port.
    public func restart() throws {
        precondition(owned, "only a cluster of its own is started by a test")
        try Self.run([Self.script, "restart", directory.path])
    }

    /// Runs a program to its end; its standard output. Spawned and waited for directly: the
    /// script leaves a server behind, and Foundation's Process, waiting for the end of its
    /// pipes and for its exit through a run loop, could hang on that.
    @discardableResult
    private static func run(_ arguments: [String], shell: Bool = true) throws -> String {
        let outputs = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-pg-run-\(UUID().uuidString)")
        defer {
            try? FileManager.default.removeItem(atPath: outputs.path + ".out")
            try? FileManager.default.removeItem(atPath: outputs.path + ".err")
        }
        let command = (shell ? ["/bin/bash"] : []) + arguments
        let quoted = command.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
        let line = "\(quoted) </dev/null >'\(outputs.path).out' 2>'\(outputs.path).err'"
        var pid: pid_t = 0
        let argv: [UnsafeMutablePointer<CChar>?] = [String](["/bin/sh", "-c", line]).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let spawned = posix_spawn(&pid, "/bin/sh", nil, nil, argv, environ)
        guard spawned == 0 else { throw PostgresClusterError(command: line, output: "posix_spawn: \(spawned)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let output = (try? String(contentsOfFile: outputs.path + ".out", encoding: .utf8)) ?? ""
        guard status == 0 else {
            let problem = (try? String(contentsOfFile: outputs.path + ".err", encoding: .utf8)) ?? ""
            throw PostgresClusterError(command: arguments.joined(separator: " "), output: problem)
        }
        return output
    }
}

public struct PostgresClusterError: Error, CustomStringConvertible {
    public let command: String
    public let output: String
    public var description: String { "\(command) failed: \(output)" }
}
