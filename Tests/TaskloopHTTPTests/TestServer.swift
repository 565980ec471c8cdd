import Foundation
import TaskloopHTTP
import TaskloopLoop
import TaskloopLoopTestSupport
import TaskloopTestSupport

/// A real server on 127.0.0.1 and a free port, its loop on a thread of its own, for tests.
/// `stop()` shuts it down gracefully and reports whether the loop closed clean.
final class TestServer: Sendable {
    let loop: EventLoop
    let port: Int
    private let server: LoopBound<HTTPServer>
    private let thread: LoopThread

    convenience init(
        configure: (inout HTTPServerConfiguration) -> Void = { _ in },
        handler: @escaping (HTTPRequest, HTTPResponder) -> Void
    ) throws {
        try self.init(configure: configure) { _ in handler }
    }

    /// `makeHandler` receives the server's loop, for handlers that set timers on it.
    init(
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

    convenience init(
        configure: (inout HTTPServerConfiguration) -> Void = { _ in }, router: Router<HTTPHandler>
    ) throws {
        try self.init(configure: configure) { request, responder in router.handle(request, responder) }
    }

    /// Runs `body` with the server on its loop thread and returns its result.
    func onLoop<T: Sendable>(_ body: @escaping @Sendable (HTTPServer) -> T) -> T {
        let server = self.server
        return thread.run { body(server.value) }
    }

    /// Waits until `condition` (evaluated on the loop) holds, or throws after `timeout` seconds.
    func waitUntil(
        timeout: Double = 5, _ what: String = "condition",
        _ condition: @escaping @Sendable (HTTPServer) -> Bool
    ) throws {
        let server = self.server
        try thread.waitUntil(what, timeout: timeout) { condition(server.value) }
    }

    /// Graceful shutdown; returns once the loop thread has ended. Throws if it did not end in
    /// time or the loop did not close clean.
    func stop(gracePeriodMilliseconds: UInt64 = 1_000, idleLingerMilliseconds: UInt64 = 0, timeout: Double = 10) throws {
        let server = self.server
        let loop = self.loop
        loop.execute {
            server.value.shutdown(gracePeriodMilliseconds: gracePeriodMilliseconds, idleLingerMilliseconds: idleLingerMilliseconds) {
                loop.finish()
            }
        }
        try waitForExit(timeout: timeout)
    }

    /// Waits for the loop thread to end (after a shutdown someone else started).
    func waitForExit(timeout: Double = 10) throws {
        try thread.waitForExit(timeout: timeout, what: "server loop to finish")
    }
}
