import Foundation
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
final class ServiceHarness: @unchecked Sendable {
    static let defaultDurability: Durability = ProcessInfo.processInfo.environment["TASKLOOP_TEST_DURABILITY"]
        .flatMap(Durability.init(rawValue:)) ?? .full

    let loop: EventLoop
    let port: Int
    /// The data dir made for this harness (the configuration may point elsewhere).
    private let dataDirectory: String
    private let application: LoopBound<TaskloopApplication>
    private let thread: LoopThread
    private let stopped = Locked(false)

    init(logHandler: LogHandler? = nil, _ configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
        var configuration = ServiceConfiguration()
        dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-harness-\(UUID())").path
        configuration.durability = Self.defaultDurability
        configuration.dataDirectory = dataDirectory
        configuration.http.host = "127.0.0.1"
        configuration.http.port = 0
        configuration.shutdownGraceMilliseconds = 2_000
        configure(&configuration)
        let loop = try EventLoop()
        var logger = logHandler.map { handler in Logger(label: "test") { _ in handler } } ?? Logger(label: "test")
        if logHandler == nil { logger.logLevel = .critical }
        let application = TaskloopApplication(loop: loop, configuration: configuration, logger: logger)
        port = try application.start().port
        self.loop = loop
        self.application = LoopBound(application, loop: loop)
        thread = LoopThread(loop, name: "service-loop")
    }

    deinit {
        if !stopped.value { try? stop() }
    }

    func stop(timeout: Double = 10) throws {
        stopped.withLock { $0 = true }
        let application = self.application
        let loop = self.loop
        loop.execute { application.value.stop { loop.finish() } }
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        try thread.waitForExit(timeout: timeout, what: "service to stop")
    }

    func client() throws -> APIClient { try APIClient(port: port) }

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

/// A keep-alive JSON client over a raw socket; one thread at a time.
final class APIClient: @unchecked Sendable {
    private let connection: RawClient

    init(port: Int) throws {
        connection = try RawClient(port: port)
    }

    @discardableResult
    func call(_ method: String, _ path: String, json: String? = nil, contentType: String = "application/json",
              headers extra: [String: String] = [:], timeout: Double = 5) throws -> RawResponse {
        var request = "\(method) \(path) HTTP/1.1\r\nHost: test\r\n"
        for (name, value) in extra { request += "\(name): \(value)\r\n" }
        let body = Array((json ?? "").utf8)
        if json != nil { request += "Content-Type: \(contentType)\r\nContent-Length: \(body.count)\r\n" }
        request += "\r\n"
        try connection.send(Array(request.utf8) + body)
        return try connection.readResponse(timeout: timeout, head: method == "HEAD")
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
