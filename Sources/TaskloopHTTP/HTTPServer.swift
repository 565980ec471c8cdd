import CLibUV
import Glibc
import TaskloopLoop

/// A listening HTTP/1.1 server on one EventLoop.
///
/// Lifecycle: `init` -> `start()` (bind, listen) -> serving -> `shutdown(gracePeriod:)` (stop
/// accepting, answer what is in flight, close idle connections, force-close the rest when the
/// grace period ends) -> completion, once every handle the server owns is closed.
///
/// Threading: loop thread only (see `EventLoop`).
public final class HTTPServer {
    public let loop: EventLoop
    public let configuration: HTTPServerConfiguration
    private let context: HTTPConnectionContext
    private var listener: UnsafeMutablePointer<uv_tcp_t>?
    private var listenerOpen = false
    private var connections: [TCPConnection] = []
    private var sweepTimer: LoopTimer?
    private var graceTimer: LoopTimer?
    private var lingerTimer: LoopTimer?
    private var shutdownCompletion: (() -> Void)?
    private var isDraining = false
    /// The bound address, known once `start()` returns.
    public private(set) var localAddress: SocketAddress?
    public private(set) var statistics = Statistics()

    /// Shared by every connection's reads; see `provideReadBuffer`.
    let readBuffer: uv_buf_t

    public struct Statistics: Sendable {
        public var connectionsAccepted = 0
        public var connectionsRefused = 0
    }

    /// `admission` sees each request head before its body is read and may refuse it there
    /// (see `HTTPAdmission`); `handler` gets each admitted, complete request.
    public init(
        loop: EventLoop, configuration: HTTPServerConfiguration,
        admission: ((inout HTTPRequest) -> HTTPAdmission)? = nil,
        handler: @escaping (consuming HTTPRequest, HTTPResponder) -> Void
    ) {
        self.loop = loop
        self.configuration = configuration
        context = HTTPConnectionContext(
            handler: handler, admission: admission, parserLimits: configuration.parserLimits,
            timeouts: .init(headerMilliseconds: configuration.headerTimeoutMilliseconds,
                            bodyMilliseconds: configuration.bodyTimeoutMilliseconds,
                            idleMilliseconds: configuration.idleTimeoutMilliseconds),
            outputHighWater: configuration.outputHighWaterBytes,
            maxPendingInput: configuration.maxPendingInputBytes,
            clock: { [loop] in loop.now })
        let size = 64 * 1024
        readBuffer = uv_buf_init(UnsafeMutablePointer<CChar>.allocate(capacity: size), UInt32(size))
    }

    deinit {
        readBuffer.base.deallocate()
    }

    public var openConnections: Int { connections.count }

    /// Binds and listens. Returns the bound address (with the real port when 0 was asked).
    @discardableResult
    public func start() throws(HTTPServerError) -> SocketAddress {
        precondition(listener == nil, "HTTPServer.start called twice")
        // libuv writes to sockets with write(2): to a peer that has reset the connection that
        // raises SIGPIPE, whose default action ends the whole process. A server must see it as
        // the error it is for that one connection. (Children started by ChildProcess get every
        // signal's default disposition back.)
        signal(SIGPIPE, SIG_IGN)
        let address: SocketAddress
        do { address = try SocketAddress.resolve(host: configuration.host, port: configuration.port) } catch {
            throw .resolve(host: error.host, reason: error.reason)
        }
        let handle: UnsafeMutablePointer<uv_tcp_t>
        do {
            handle = try UVHandle.make(uv_tcp_t.self, "uv_tcp_init") { uv_tcp_init(loop.uvLoop, $0) }
        } catch {
            throw .listen(error)
        }
        UVHandle.adopt(handle, owner: ListenerOwner(server: self))
        listener = handle
        listenerOpen = true
        do {
            _ = try address.withSockAddr { (pointer) throws(UVError) in try UVError.check(uv_tcp_bind(handle, pointer, 0), "uv_tcp_bind") }
            let stream = UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_stream_t.self)
            try UVError.check(uv_listen(stream, configuration.listenBacklog, acceptConnection), "uv_listen")
            let bound = try SocketAddress.local(of: handle)
            localAddress = bound
            try startSweeping()
            return bound
        } catch {
            UVHandle.close(handle)
            listener = nil
            throw .listen(error)
        }
    }

    private func startSweeping() throws(UVError) {
        let timer = try LoopTimer(loop: loop)
        let shortest = min(configuration.headerTimeoutMilliseconds, configuration.bodyTimeoutMilliseconds,
                           configuration.idleTimeoutMilliseconds, configuration.lingerMilliseconds)
        let interval = max(10, min(1_000, shortest / 4))
        timer.start(after: interval, every: interval) { [unowned self] in sweep() }
        sweepTimer = timer
    }

    /// Applies timeouts. One timer for all connections keeps per-request cost at a field write.
    private func sweep() {
        let now = loop.now
        for connection in connections { connection.tick(now: now) }
    }

    fileprivate func acceptPending() {
        guard let listener else { return }
        let connection: TCPConnection
        do {
            connection = try TCPConnection(server: self, loop: loop)
        } catch {
            return
        }
        do {
            try connection.accept(from: UnsafeMutableRawPointer(listener).assumingMemoryBound(to: uv_stream_t.self))
        } catch {
            connection.closeNow()
            return
        }
        guard !isDraining, connections.count < configuration.maxConnections else {
            statistics.connectionsRefused += 1
            connection.refuse(with: isDraining ? Self.stoppingResponse : Self.overloadedResponse)
            return
        }
        statistics.connectionsAccepted += 1
        connection.slot = connections.count
        connections.append(connection)
        connection.serve(with: context)
    }

    func connectionDidClose(_ connection: TCPConnection) {
        let slot = connection.slot
        guard slot >= 0, slot < connections.count, connections[slot] === connection else { return }
        let last = connections.removeLast()
        if last !== connection {
            connections[slot] = last
            last.slot = slot
        }
        connection.slot = -1
        finishShutdownIfDone()
    }

    /// Stops accepting, lets requests in flight finish (their answers say `Connection: close`),
    /// closes idle connections at once and the rest after `gracePeriodMilliseconds`, then calls
    /// `completion` when every handle of the server is closed.
    /// `idleLingerMilliseconds`: how long a kept-alive connection waiting for a request stays
    /// open (0: it closes at once). A peer may have sent its next request before it could learn
    /// that this server stops (a replica forwarding to one that leaves): closed at once, the
    /// connection would cut that request off unanswered, where open it gets an answer (and
    /// `Connection: close`). The lingering connections close at its end, or at the grace's.
    public func shutdown(gracePeriodMilliseconds: UInt64, idleLingerMilliseconds: UInt64 = 0, completion: @escaping () -> Void) {
        guard !isDraining else { return }
        isDraining = true
        shutdownCompletion = completion
        if let listener, listenerOpen { UVHandle.close(listener) } else { listenerOpen = false }
        let linger = min(idleLingerMilliseconds, gracePeriodMilliseconds)
        for connection in connections { connection.http?.drain(closingIdle: linger == 0) }
        if let timer = try? LoopTimer(loop: loop) {
            timer.start(after: gracePeriodMilliseconds) { [unowned self] in
                for connection in connections { connection.closeNow() }
            }
            graceTimer = timer
        } else {
            for connection in connections { connection.closeNow() }
        }
        if linger > 0, let timer = try? LoopTimer(loop: loop) {
            timer.start(after: linger) { [unowned self] in
                for connection in connections { connection.http?.closeIfIdle() }
            }
            lingerTimer = timer
        } else {
            for connection in connections { connection.http?.closeIfIdle() }
        }
        finishShutdownIfDone()
    }

    fileprivate func listenerDidClose() {
        listenerOpen = false
        listener = nil
        finishShutdownIfDone()
    }

    private func finishShutdownIfDone() {
        guard isDraining, !listenerOpen, connections.isEmpty, let completion = shutdownCompletion else { return }
        shutdownCompletion = nil
        sweepTimer?.close()
        graceTimer?.close()
        lingerTimer?.close()
        sweepTimer = nil
        graceTimer = nil
        lingerTimer = nil
        completion()
    }

    /// A snapshot of each open connection, for tests and diagnostics.
    public func connectionStates() -> [ConnectionState] {
        connections.map { ConnectionState(queuedOutputBytes: $0.http?.queuedOutputBytes ?? 0,
                                          isReading: $0.http?.isReading ?? false) }
    }

    public struct ConnectionState: Sendable {
        public var queuedOutputBytes: Int
        public var isReading: Bool
    }

    private static let overloadedResponse = finalResponse(
        HTTPProblem(.serviceUnavailable, detail: "Too many open connections; try again shortly.",
                    headers: ["Retry-After": "1"]))
    private static let stoppingResponse = finalResponse(
        HTTPProblem(.serviceUnavailable, detail: "The server is shutting down."))

    private static func finalResponse(_ problem: HTTPProblem) -> [UInt8] {
        let response = problem.response()
        var bytes: [UInt8] = []
        HTTPResponseEncoder.appendHead(
            status: response.status, headers: response.headers, contentLength: response.body.count,
            keepAlive: false, http10Client: false, dateLine: [], to: &bytes)
        return bytes + response.body
    }
}

public enum HTTPServerError: Error, CustomStringConvertible {
    case resolve(host: String, reason: String)
    case listen(UVError)

    public var description: String {
        switch self {
        case .resolve(let host, let reason): "cannot resolve host \(host): \(reason)"
        case .listen(let error): "cannot listen: \(error)"
        }
    }
}

/// Owner of the listening handle; a separate object so the handle's retain does not keep the
/// server alive and its close can be told apart from a connection's.
private final class ListenerOwner: UVHandleClosing {
    unowned let server: HTTPServer
    init(server: HTTPServer) { self.server = server }
    func handleDidClose() { server.listenerDidClose() }
}

private let acceptConnection: uv_connection_cb = { listener, status in
    guard status == 0 else { return }
    UVHandle.owner(listener, as: ListenerOwner.self).server.acceptPending()
}
