import Foundation
import TaskloopHTTP

/// A real server on 127.0.0.1 and a free port, its loop on a thread of its own, for tests.
/// `stop()` shuts it down gracefully and reports whether the loop closed clean.
public final class TestServer: Sendable {
    public let loop: EventLoop
    public let port: Int
    private let server: LoopBound<HTTPServer>
    private let thread: LoopThread

    public convenience init(
        configure: (inout HTTPServerConfiguration) -> Void = { _ in },
        handler: @escaping (HTTPRequest, HTTPResponder) -> Void
    ) throws {
        try self.init(configure: configure) { _ in handler }
    }

    /// `makeHandler` receives the server's loop, for handlers that set timers on it.
    public init(
        configure: (inout HTTPServerConfiguration) -> Void = { _ in },
        makeHandler: (EventLoop) -> (HTTPRequest, HTTPResponder) -> Void
    ) throws {
        let loop = try EventLoop()
        let handler = makeHandler(loop)
        var configuration = HTTPServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configure(&configuration)
        let server = HTTPServer(loop: loop, configuration: configuration, handler: handler)
        let address = try server.start()
        self.loop = loop
        self.port = address.port
        self.server = LoopBound(server, loop: loop)
        thread = LoopThread(loop, name: "test-loop")
    }

    public convenience init(
        configure: (inout HTTPServerConfiguration) -> Void = { _ in }, router: Router<HTTPHandler>
    ) throws {
        try self.init(configure: configure) { request, responder in router.handle(request, responder) }
    }

    /// Runs `body` with the server on its loop thread and returns its result.
    public func onLoop<T: Sendable>(_ body: @escaping @Sendable (HTTPServer) -> T) -> T {
        let server = self.server
        return thread.run { body(server.value) }
    }

    /// Waits until `condition` (evaluated on the loop) holds, or throws after `timeout` seconds.
    public func waitUntil(
        timeout: Double = 5, _ what: String = "condition",
        _ condition: @escaping @Sendable (HTTPServer) -> Bool
    ) throws {
        let server = self.server
        try thread.waitUntil(what, timeout: timeout) { condition(server.value) }
    }

    /// Graceful shutdown; returns once the loop thread has ended. Throws if it did not end in
    /// time or the loop did not close clean.
    public func stop(gracePeriodMilliseconds: UInt64 = 1_000, timeout: Double = 10) throws {
        let server = self.server
        let loop = self.loop
        loop.execute {
            server.value.shutdown(gracePeriodMilliseconds: gracePeriodMilliseconds) { loop.finish() }
        }
        try waitForExit(timeout: timeout)
    }

    /// Waits for the loop thread to end (after a shutdown someone else started).
    public func waitForExit(timeout: Double = 10) throws {
        try thread.waitForExit(timeout: timeout, what: "server loop to finish")
    }
}

public struct TestTimeout: Error, CustomStringConvertible {
    public let what: String
    public init(what: String) { self.what = what }
    public var description: String { "timed out waiting for \(what)" }
}

/// Evaluates `condition` every `interval` microseconds until it holds, or throws `TestTimeout`
/// after `timeout` seconds. The one way tests wait for something they cannot be told about.
public func pollUntil(_ what: @autoclosure () -> String, timeout: Double = 10, every interval: useconds_t = 2_000,
                      _ condition: () throws -> Bool) throws {
    let deadline = Date().addingTimeInterval(timeout)
    while try !condition() {
        guard Date() < deadline else { throw TestTimeout(what: what()) }
        usleep(interval)
    }
}

/// A value behind a mutex that closures and threads can share (a pthread mutex, which
/// ThreadSanitizer sees).
public final class Locked<Value>: @unchecked Sendable {
    private let storage: PThreadLocked<Value>
    public init(_ value: Value) { storage = PThreadLocked(value) }
    public func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        try storage.withLock(body)
    }
    public var value: Value { withLock { $0 } }
}
