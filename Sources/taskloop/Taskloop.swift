import ArgumentParser
import Glibc
import TaskloopHTTP
import TaskloopService

@main
struct Taskloop: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "taskloop",
        abstract: "A task-orchestration service: submit tasks over HTTP, watch them run, cancel them.",
        discussion: "Every option can also be set with an environment variable TASKLOOP_<OPTION>, "
            + "e.g. TASKLOOP_PORT=9000; a flag on the command line wins.")

    @Option(help: "Address to listen on (IPv4, IPv6 or a host name). [env: TASKLOOP_HOST]")
    var host: String = Environment.string("HOST") ?? "127.0.0.1"

    @Option(help: "TCP port; 0 picks a free one. [env: TASKLOOP_PORT]")
    var port: Int = Environment.int("PORT") ?? 8080

    @Option(help: "Largest accepted request body in bytes. [env: TASKLOOP_MAX_BODY_BYTES]")
    var maxBodyBytes: Int = Environment.int("MAX_BODY_BYTES") ?? 1024 * 1024

    @Option(help: "Largest accepted request header section in bytes, at most 81920. [env: TASKLOOP_MAX_HEADER_BYTES]")
    var maxHeaderBytes: Int = Environment.int("MAX_HEADER_BYTES") ?? 16 * 1024

    @Option(help: "Seconds a client has to send a request's headers. [env: TASKLOOP_HEADER_TIMEOUT_SECONDS]")
    var headerTimeoutSeconds: Double = Environment.double("HEADER_TIMEOUT_SECONDS") ?? 10

    @Option(help: "Seconds an idle keep-alive connection stays open. [env: TASKLOOP_IDLE_TIMEOUT_SECONDS]")
    var idleTimeoutSeconds: Double = Environment.double("IDLE_TIMEOUT_SECONDS") ?? 60

    @Option(help: "Most open client connections. [env: TASKLOOP_MAX_CONNECTIONS]")
    var maxConnections: Int = Environment.int("MAX_CONNECTIONS") ?? 10_000

    @Option(help: "Seconds to finish in-flight work on SIGTERM/SIGINT. [env: TASKLOOP_SHUTDOWN_GRACE_SECONDS]")
    var shutdownGraceSeconds: Double = Environment.double("SHUTDOWN_GRACE_SECONDS") ?? 10

    func validate() throws {
        guard (0...65535).contains(port) else { throw ValidationError("--port must be 0...65535") }
        guard maxBodyBytes >= 0 else { throw ValidationError("--max-body-bytes must not be negative") }
        // http_parser stops at its compiled-in 80 KiB anyway; a larger setting would not apply.
        guard (256...80 * 1024).contains(maxHeaderBytes) else {
            throw ValidationError("--max-header-bytes must be 256...81920")
        }
        guard maxConnections >= 1 else { throw ValidationError("--max-connections must be at least 1") }
        for (name, value) in [("--header-timeout-seconds", headerTimeoutSeconds),
                              ("--idle-timeout-seconds", idleTimeoutSeconds),
                              ("--shutdown-grace-seconds", shutdownGraceSeconds)] where !(value >= 0) {
            throw ValidationError("\(name) must be a non-negative number")
        }
    }

    func run() throws {
        var configuration = ServiceConfiguration()
        configuration.http.host = host
        configuration.http.port = port
        configuration.http.parserLimits.maxBodyBytes = maxBodyBytes
        configuration.http.parserLimits.maxHeaderBytes = maxHeaderBytes
        configuration.http.headerTimeoutMilliseconds = UInt64(headerTimeoutSeconds * 1000)
        configuration.http.idleTimeoutMilliseconds = UInt64(idleTimeoutSeconds * 1000)
        configuration.http.maxConnections = maxConnections
        configuration.shutdownGraceMilliseconds = UInt64(shutdownGraceSeconds * 1000)

        let loop = try EventLoop()
        let application = TaskloopApplication(loop: loop, configuration: configuration)
        let address: SocketAddress
        do {
            address = try application.start()
        } catch {
            throw ValidationError("\(error)")
        }
        var watchers: [SignalWatcher] = []
        let stop = {
            guard !watchers.isEmpty else { return }
            print("stopping: finishing in-flight requests (grace \(shutdownGraceSeconds)s)")
            fflush(nil)
            for watcher in watchers { watcher.close() }
            watchers = []
            application.stop { loop.finish() }
        }
        watchers = try [SIGTERM, SIGINT].map { try SignalWatcher(loop: loop, signal: $0, stop) }
        print("taskloop listening on http://\(address)")
        fflush(nil)
        try loop.run()
        print("taskloop stopped")
    }
}

/// Reads `TASKLOOP_<NAME>` defaults for the flags.
enum Environment {
    static func string(_ name: String) -> String? {
        getenv("TASKLOOP_" + name).map { String(cString: $0) }
    }

    static func int(_ name: String) -> Int? { string(name).flatMap { Int($0) } }

    static func double(_ name: String) -> Double? { string(name).flatMap { Double($0) } }
}
