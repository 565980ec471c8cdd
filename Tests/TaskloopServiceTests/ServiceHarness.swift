import Foundation
import Testing
import Logging
import TaskloopHTTP
import TaskloopLoop
@testable import TaskloopService
import TaskloopLoopTestSupport
import TaskloopTestSupport

/// The whole service on 127.0.0.1 and a free port, its loop on a thread of its own. `stop()`
/// runs the real shutdown story and checks the loop closed clean; a test that fails before
/// calling it still gets the service stopped when the harness goes away.
///
/// It keeps state as the binary does by default, `full`, in a data dir of its own (removed
/// when it stops); `TASKLOOP_TEST_DURABILITY=memory` (or `normal`) runs the same tests in
/// that mode, and a test may set its own.
///
/// `TASKLOOP_TEST_REPLICAS=3` runs the same tests through three replicas sharing a new
/// PostgreSQL database (a throwaway cluster): `client()` sends each call to the next replica
/// in turn, so every test of the contract crosses replicas. Tests that choose their own
/// durability or data dir are about the embedded store, and keep one server.
final class ServiceHarness: @unchecked Sendable {
    static let defaultDurability: Durability = ProcessInfo.processInfo.environment["TASKLOOP_TEST_DURABILITY"]
        .flatMap(Durability.init(rawValue:)) ?? .full
    static let replicaCount = ProcessInfo.processInfo.environment["TASKLOOP_TEST_REPLICAS"].flatMap { Int($0) } ?? 1

    let loop: EventLoop
    let port: Int
    /// The data dir made for this harness (the configuration may point elsewhere).
    private let dataDirectory: String
    private let application: LoopBound<TaskloopApplication>
    private let thread: LoopThread
    private let stopped = Locked(false)
    /// The other replicas (with `TASKLOOP_TEST_REPLICAS`), started with the same configuration.
    private(set) var peers: [ServiceHarness] = []

    /// Every replica's port, this one's first.
    var ports: [Int] { [port] + peers.map(\.port) }

    /// This replica and the others: on cells each serves its own cells, so what one holds
    /// (a waiting long poll, a queue's series) may be on any of them.
    var replicas: [ServiceHarness] { [self] + peers }

    /// Every replica's metrics, one after the other: a cluster's, as a scrape of each shows it.
    func allMetrics() throws -> String {
        try ports.map { try APIClient(port: $0).call("GET", "/metrics").text }.joined(separator: "\n")
    }

    init(logHandler: LogHandler? = nil, replicas: Int = ServiceHarness.replicaCount,
         _ configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
        var configuration = ServiceConfiguration()
        dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-harness-\(UUID())").path
        configuration.durability = Self.defaultDurability
        configuration.dataDirectory = dataDirectory
        configuration.http.host = "127.0.0.1"
        configuration.http.port = 0
        configuration.shutdownGraceMilliseconds = 2_000
        configure(&configuration)
        let replicated = replicas > 1 && configuration.sharedDatabase == nil && configuration.durability == Self.defaultDurability
            && configuration.dataDirectory == dataDirectory
        if replicated {
            var shared = SharedDatabaseSettings(url: try PostgresCluster.shared().makeDatabase(), replica: "r0")
            shared.cells = 16
            configuration.sharedDatabase = shared
        }
        let loop = try EventLoop()
        var logger = logHandler.map { handler in Logger(label: "test") { _ in handler } } ?? Logger(label: "test")
        if logHandler == nil { logger.logLevel = .critical }
        let application = TaskloopApplication(loop: loop, configuration: configuration, logger: logger)
        port = try application.start().port
        self.loop = loop
        self.application = LoopBound(application, loop: loop)
        thread = LoopThread(loop, name: "service-loop")
        if replicated, let shared = configuration.sharedDatabase {
            let base = configuration
            peers = try (1..<replicas).map { index in
                try ServiceHarness(logHandler: logHandler, replicas: 1) { peer in
                    peer = base
                    peer.http.port = 0
                    peer.sharedDatabase = shared
                    peer.sharedDatabase!.replica = "r\(index)"
                }
            }
            // Tests start once no cell moves: a request for a moving cell may wait or be refused.
            try CellServiceTests.waitForEveryCell([self] + peers)
        }
    }

    deinit {
        if !stopped.value { try? stop() }
    }

    /// A server keeping its state `full` in `directory`: one started again on the same
    /// directory finds what the one before left (a restart test's server). `configure` sets
    /// anything else.
    static func keepingState(in directory: String,
                             _ configure: (inout ServiceConfiguration) -> Void = { _ in }) throws -> ServiceHarness {
        try ServiceHarness {
            $0.durability = .full
            $0.dataDirectory = directory
            configure(&$0)
        }
    }

    func stop(timeout: Double = 10) throws {
        for peer in peers { try peer.stop(timeout: timeout) }
        stopped.withLock { $0 = true }
        let application = self.application
        let loop = self.loop
        loop.execute { application.value.stop { loop.finish() } }
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        try thread.waitForExit(timeout: timeout, what: "service to stop")
    }

    /// A metric's value summed over the replicas (each counts what it did), or only `replica`'s
    /// (the one at that port); nil when none has the series. `series` is the name with its
    /// labels, as the exposition writes it.
    func metric(_ series: String, replica: Int? = nil) throws -> Double? {
        var total: Double?
        for port in replica.map { [$0] } ?? ports {
            let text = try APIClient(port: port).call("GET", "/metrics").text
            for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
                total = (total ?? 0) + (Double(line.dropFirst(series.count + 1)) ?? 0)
            }
        }
        return total
    }

    /// A client of the service: with replicas, each call goes to the next one in turn.
    func client() throws -> APIClient { try APIClient(ports: ports) }

    /// Runs `body` on the loop thread with the application and returns its result.
    func onLoop<T: Sendable>(_ body: @escaping @Sendable (TaskloopApplication) -> T) -> T {
        let application = self.application
        return thread.run { body(application.value) }
    }

    /// Waits until `condition` holds on the loop, or throws at the deadline.
    func waitUntil(_ what: String, timeout: Double = 10, _ condition: @escaping @Sendable (TaskloopApplication) -> Bool) throws {
        let application = self.application
        try thread.waitUntil(what, timeout: timeout) { condition(application.value) }
    }
}

/// A keep-alive JSON client over a raw socket; one thread at a time. Given several replicas'
/// ports, it keeps a connection to each and sends each call to the next. An answer that closes
/// its connection (a refusal on the request's head, say) is followed by a new one.
final class APIClient: @unchecked Sendable {
    private let ports: [Int]
    /// Nil where the last answer closed its connection: the next call there opens a new one.
    private var connections: [RawClient?]
    private var next = 0

    convenience init(port: Int) throws {
        try self.init(ports: [port])
    }

    init(ports: [Int]) throws {
        self.ports = ports
        connections = try ports.map { try RawClient(port: $0) }
    }

    @discardableResult
    func call(_ method: String, _ path: String, json: String? = nil, contentType: String = "application/json",
              headers extra: [String: String] = [:], timeout: Double = 5) throws -> RawResponse {
        let index = next
        next = (next + 1) % connections.count
        return try call(method, path, json: json, contentType: contentType, headers: extra, timeout: timeout, at: index)
    }

    private func call(_ method: String, _ path: String, json: String?, contentType: String, headers extra: [String: String],
                      timeout: Double, at index: Int) throws -> RawResponse {
        var request = "\(method) \(path) HTTP/1.1\r\n"
        if extra.keys.contains(where: { $0.lowercased() == "host" }) == false { request += "Host: localhost:\(ports[index])\r\n" }
        for (name, value) in extra { request += "\(name): \(value)\r\n" }
        let body = Array((json ?? "").utf8)
        if json != nil { request += "Content-Type: \(contentType)\r\nContent-Length: \(body.count)\r\n" }
        request += "\r\n"
        let reused = connections[index] != nil
        let connection = try connections[index] ?? RawClient(port: ports[index])
        connections[index] = connection
        let response: RawResponse
        do {
            try connection.send(Array(request.utf8) + body)
            response = try connection.readResponse(timeout: timeout, head: method == "HEAD")
        } catch let error as ClientError where reused && error.endedUnanswered {
            // A kept-alive connection the server closed while it sat idle (its idle timeout)
            // took nothing in: the request goes again on a new one, as HTTP clients do.
            connections[index] = nil
            return try call(method, path, json: json, contentType: contentType, headers: extra, timeout: timeout, at: index)
        }
        if response.header("Connection")?.lowercased() == "close" { connections[index] = nil }
        return response
    }

    /// Submits and returns the task object.
    func submit(_ json: String) throws -> [String: Any] {
        let response = try call("POST", "/tasks", json: json)
        guard response.status == 201 else { throw ClientError.malformed("submit answered \(response.status): \(response.text)") }
        return response.json
    }

    func task(_ id: String) throws -> [String: Any] { try call("GET", "/tasks/\(id)").json }

    /// Waits for the task to reach `state`: terminal states through `?wait=`, others by polling
    /// the state with a deadline.
    func waitForState(_ id: String, _ state: String, timeout: Double = 10) throws -> [String: Any] {
        let terminal = ["succeeded", "failed", "cancelled"]
        var task: [String: Any] = [:]
        // No pause between polls: a terminal state is waited for by the server (`?wait=1`).
        try pollUntil("task \(id) to be \(state)", timeout: timeout, every: 0) {
            task = try call("GET", "/tasks/\(id)\(terminal.contains(state) ? "?wait=1" : "")", timeout: 3).json
            if let current = task["state"] as? String, current != state, terminal.contains(current) {
                throw ClientError.malformed("task \(id) ended \(current), expected \(state)")
            }
            return task["state"] as? String == state
        }
        return task
    }

    /// A cancellation that stops its task at once (an executor that confirms as it is asked):
    /// 200 `cancelled`; through replicas, the one asked may not be the one running it, and
    /// answers 202 `cancel_requested` until the other has stopped it.
    func expectCancelled(_ cancel: RawResponse, _ id: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        if ServiceHarness.replicaCount > 1 && cancel.status == 202 {
            #expect(cancel.json["cancel_requested"] as? Bool == true, sourceLocation: sourceLocation)
            _ = try waitForState(id, "cancelled")
        } else {
            #expect(cancel.status == 200 && cancel.json["state"] as? String == "cancelled", sourceLocation: sourceLocation)
        }
    }

    /// Waits until the workflow is no longer running and returns it.
    func waitForWorkflowToEnd(_ id: String, timeout: Double) throws -> [String: Any] {
        var workflow: [String: Any] = [:]
        try pollUntil("workflow \(id) to end", timeout: timeout, every: 10_000) {
            workflow = try call("GET", "/workflows/\(id)").json
            return workflow["state"] as? String != "running"
        }
        return workflow
    }
}

extension ServiceHarness {
    /// Whether this run is `make test`'s first stage, the one without `TASKLOOP_TEST_DURABILITY`
    /// or `TASKLOOP_TEST_REPLICAS`.
    static let isDefaultStage = ProcessInfo.processInfo.environment["TASKLOOP_TEST_DURABILITY"] == nil
        && ProcessInfo.processInfo.environment["TASKLOOP_TEST_REPLICAS"] == nil
}

extension Trait where Self == ConditionTrait {
    /// For tests that count on a single server's event numbers (1, 2, 3 ...) or its ring of
    /// events: on cells an event's id is its position in the cluster's history, kept by time,
    /// and `CellEventStreamTests` holds the streams there to the same rules.
    static var numbersEventsAsOneServer: Self {
        .disabled(if: ServiceHarness.replicaCount > 1,
                  "event ids are positions on cells (CellEventStreamTests)")
    }

    /// For suites that choose their own configuration (the binary with its own flags, their own
    /// durability or database): the later stages of `make test` would run them again unchanged.
    static var inTheDefaultStageOnly: Self {
        .enabled(if: ServiceHarness.isDefaultStage, "chooses its own configuration, so it runs in the default stage only")
    }
}
