import TaskloopHTTP

/// Settings of a running service; `taskloop`'s flags fill it.
public struct ServiceConfiguration: Sendable {
    public var http = HTTPServerConfiguration()
    public var shutdownGraceMilliseconds: UInt64 = 10_000

    public init() {}
}

/// The service on one event loop: the HTTP server and its routes.
///
/// Start and stop are one ordered story: `start()` binds and serves; `stop(completion:)`
/// stops accepting, answers what is in flight within the grace period and calls back once
/// every handle is closed, after which the loop can finish.
///
/// Threading: loop thread only.
public final class TaskloopApplication {
    public let loop: EventLoop
    public let configuration: ServiceConfiguration
    private var server: HTTPServer?

    public init(loop: EventLoop, configuration: ServiceConfiguration) {
        self.loop = loop
        self.configuration = configuration
    }

    public static func makeRouter() -> Router<HTTPHandler> {
        var router = Router<HTTPHandler>()
        router.add(.GET, "/healthz") { _, responder in
            responder.respond(.json(.ok, Array(#"{"status":"ok"}"#.utf8)))
        }
        return router
    }

    /// Binds and starts serving; returns the bound address.
    public func start() throws(HTTPServerError) -> SocketAddress {
        let router = Self.makeRouter()
        let server = HTTPServer(loop: loop, configuration: configuration.http) { request, responder in
            router.handle(request, responder)
        }
        let address = try server.start()
        self.server = server
        return address
    }

    public func stop(completion: @escaping () -> Void) {
        guard let server else { return completion() }
        server.shutdown(gracePeriodMilliseconds: configuration.shutdownGraceMilliseconds) { [weak self] in
            self?.server = nil
            completion()
        }
    }
}
