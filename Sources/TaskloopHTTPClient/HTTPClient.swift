import CCurl
import CLibUV
import Glibc
import TaskloopLoop

/// HTTP(S) requests on the libuv loop through libcurl's multi interface: curl says which sockets
/// to watch and when to time out (`CURLMOPT_SOCKETFUNCTION`, `CURLMOPT_TIMERFUNCTION`), a
/// `uv_poll` per socket and one `uv_timer` watch them, and readiness goes back through
/// `curl_multi_socket_action`. Thousands of transfers share the loop thread; DNS runs on
/// curl's resolver threads, so nothing blocks the loop.
///
/// Threading: loop thread only, like every transfer and callback.
///
/// Reentrancy: libcurl forbids adding or removing easy handles from inside its callbacks.
/// Completions are delivered only after `curl_multi_socket_action` has returned, and a
/// transfer cancelled, or one started, while curl is calling us is removed, or added, right
/// after curl returns.
///
/// Lifecycle: `close()` cleans up the multi handle, closes the poll handles and the timer, then
/// reports the transfers still running as failed; the loop can finish after that.
public final class HTTPClient {
    public let policy: HostPolicy
    public let loop: EventLoop
    private var multi: UnsafeMutableRawPointer?
    private let timer: LoopTimer
    private var sockets: [curl_socket_t: SocketPoll] = [:]
    private var transfers: [ObjectIdentifier: HTTPTransfer] = [:]
    /// Depth of calls into curl that may call us back.
    private var insideCurl = 0
    private var removeAfterCurl: [HTTPTransfer] = []
    private var addAfterCurl: [HTTPTransfer] = []

    /// `maxHostConnections` caps the connections to one host (its further transfers wait in
    /// curl for a free one): it protects origins, keeps descriptors bounded, and lets a burst
    /// of requests to one host reuse keep-alive connections instead of opening one each.
    public init(loop: EventLoop, policy: HostPolicy = HostPolicy(), maxHostConnections: Int = 64) throws(HTTPClientError) {
        self.loop = loop
        self.policy = policy
        guard Curl.initialized, let multi = curl_multi_init() else {
            throw HTTPClientError(.clientFailed, "libcurl could not be initialised.")
        }
        do {
            timer = try LoopTimer(loop: loop)
        } catch {
            curl_multi_cleanup(multi)
            throw HTTPClientError(.clientFailed, "\(error)")
        }
        self.multi = multi
        let me = Unmanaged.passUnretained(self).toOpaque()
        // These cannot fail for a valid multi handle and known options.
        taskloop_multi_setopt_socket_callback(multi, curlSocketChanged)
        taskloop_multi_setopt_pointer(multi, CURLMOPT_SOCKETDATA, me)
        taskloop_multi_setopt_timer_callback(multi, curlTimerChanged)
        taskloop_multi_setopt_pointer(multi, CURLMOPT_TIMERDATA, me)
        // Idle connections kept for reuse across tasks.
        taskloop_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, max(256, maxHostConnections))
        taskloop_multi_setopt_long(multi, CURLMOPT_MAX_HOST_CONNECTIONS, maxHostConnections)
    }

    /// Transfers running now.
    public var activeTransfers: Int { transfers.count }

    /// Starts a request. `onProgress(received, expected)` is called as body bytes arrive (expected
    /// is nil when the length is unknown); `onComplete` exactly once, unless the transfer is
    /// cancelled first. Nothing is called back before this returns.
    public func start(
        _ request: HTTPClientRequest,
        onProgress: @escaping (_ received: Int64, _ expected: Int64?) -> Void,
        onComplete: @escaping (Result<HTTPClientResponse, HTTPClientError>) -> Void
    ) throws(HTTPClientError) -> HTTPTransfer {
        try launch(request) { () throws(HTTPClientError) in
            try HTTPTransfer(client: self, request: request, onProgress: onProgress, onComplete: onComplete)
        }
    }

    /// Starts a request whose body is handed to `stream` piece by piece as it arrives, none of
    /// it kept (an event stream). Give it no `timeoutMilliseconds` to let it stay open as long
    /// as the server sends; the connect timeout still applies. `onComplete` comes once the
    /// body has ended (the response's `body` empty) or the transfer failed, unless it is
    /// cancelled first. Nothing is called back before this returns.
    public func start(
        _ request: HTTPClientRequest, streamingTo stream: HTTPBodyStream,
        onComplete: @escaping (Result<HTTPClientResponse, HTTPClientError>) -> Void
    ) throws(HTTPClientError) -> HTTPTransfer {
        try launch(request) { () throws(HTTPClientError) in
            try HTTPTransfer(client: self, request: request, onProgress: { _, _ in }, bodyStream: stream, onComplete: onComplete)
        }
    }

    private func launch(_ request: HTTPClientRequest, _ makeTransfer: () throws(HTTPClientError) -> HTTPTransfer)
        throws(HTTPClientError) -> HTTPTransfer {
        guard policy.allows(request.url) else {
            throw HTTPClientError(.hostNotAllowed, "\(request.url.host) is not in the allowed hosts.")
        }
        let transfer = try makeTransfer()
        try add(transfer)
        return transfer
    }

    /// Ends every transfer (reported as failed), frees curl's state and the loop handles.
    /// Transfers are reported last, once the client is closed, so whatever their completion
    /// starts is refused instead of joining a multi handle that is going away.
    public func close() {
        guard let multi else { return }
        self.multi = nil
        let unfinished = Array(transfers.values)
        for transfer in unfinished { curl_multi_remove_handle(multi, transfer.easy) }
        transfers.removeAll()
        addAfterCurl.removeAll()
        // Cleanup may still tell us to forget sockets of cached connections.
        curl_multi_cleanup(multi)
        for socket in sockets.values { socket.close() }
        sockets.removeAll()
        timer.close()
        for transfer in unfinished {
            transfer.complete(.failure(HTTPClientError(.clientFailed, "The server is shutting down.")))
        }
    }

    // MARK: transfers

    func add(_ transfer: HTTPTransfer) throws(HTTPClientError) {
        guard let multi else { throw HTTPClientError(.clientFailed, "The HTTP client is shut down.") }
        if insideCurl > 0 {
            // Started from one of curl's callbacks (a streamed chunk's consumer, say).
            transfers[ObjectIdentifier(transfer)] = transfer
            addAfterCurl.append(transfer)
            return
        }
        let status = curl_multi_add_handle(multi, transfer.easy)
        guard status == CURLM_OK else {
            throw HTTPClientError(.clientFailed, "curl_multi_add_handle failed: \(String(cString: curl_multi_strerror(status))).")
        }
        transfers[ObjectIdentifier(transfer)] = transfer
    }

    /// Takes a transfer off the multi handle; an unfinished one has its connection closed.
    func detach(_ transfer: HTTPTransfer) {
        guard transfers.removeValue(forKey: ObjectIdentifier(transfer)) != nil, let multi else { return }
        if let waiting = addAfterCurl.firstIndex(where: { $0 === transfer }) {
            addAfterCurl.remove(at: waiting)
            return
        }
        curl_multi_remove_handle(multi, transfer.easy)
    }

    /// Cancellation: the transfer is gone when this returns, or right after curl returns if curl
    /// is calling us now.
    func cancel(_ transfer: HTTPTransfer) {
        if insideCurl > 0 {
            removeAfterCurl.append(transfer)
        } else {
            detach(transfer)
        }
    }

    // MARK: driving curl

    fileprivate func socketAction(_ socket: curl_socket_t, _ events: Int32) {
        guard let multi else { return }
        var running: Int32 = 0
        insideCurl += 1
        curl_multi_socket_action(multi, socket, events, &running)
        insideCurl -= 1
        finishRemovals()
        finishAdditions()
        deliverCompletions()
    }

    private func finishRemovals() {
        guard insideCurl == 0, !removeAfterCurl.isEmpty else { return }
        let pending = removeAfterCurl
        removeAfterCurl.removeAll()
        for transfer in pending { detach(transfer) }
    }

    private func finishAdditions() {
        guard insideCurl == 0, !addAfterCurl.isEmpty else { return }
        let pending = addAfterCurl
        addAfterCurl.removeAll()
        for transfer in pending {
            transfers.removeValue(forKey: ObjectIdentifier(transfer))
            do {
                try add(transfer)
            } catch {
                transfer.complete(.failure(error))
            }
        }
    }

    private func deliverCompletions() {
        guard let multi else { return }
        var left: Int32 = 0
        while let message = curl_multi_info_read(multi, &left) {
            guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
            let code = message.pointee.data.result
            guard let transfer = HTTPTransfer.owner(of: easy), transfers[ObjectIdentifier(transfer)] != nil else { continue }
            // The message dies with the handle's removal; everything needed was copied above.
            detach(transfer)
            transfer.finished(code)
        }
    }

    fileprivate func watch(_ socket: curl_socket_t, _ what: Int32) -> Int32 {
        if what == CURL_POLL_REMOVE {
            sockets.removeValue(forKey: socket)?.close()
            return 0
        }
        let watched: SocketPoll
        if let existing = sockets[socket] {
            watched = existing
        } else {
            do {
                watched = try SocketPoll(loop: loop, socket: socket) { [unowned self] status, readable, writable in
                    var flags: Int32 = 0
                    if status < 0 { flags |= CURL_CSELECT_ERR }
                    if readable { flags |= CURL_CSELECT_IN }
                    if writable { flags |= CURL_CSELECT_OUT }
                    socketAction(socket, flags)
                }
            } catch {
                // curl fails the transfers on this socket.
                return -1
            }
            sockets[socket] = watched
        }
        return watched.start(readable: what == CURL_POLL_IN || what == CURL_POLL_INOUT,
                             writable: what == CURL_POLL_OUT || what == CURL_POLL_INOUT) ? 0 : -1
    }

    fileprivate func timerChanged(_ milliseconds: Int) {
        guard multi != nil else { return }
        if milliseconds < 0 {
            timer.stop()
        } else {
            timer.start(after: UInt64(milliseconds)) { [unowned self] in
                socketAction(CURL_SOCKET_TIMEOUT, 0)
            }
        }
    }
}

private let curlSocketChanged: curl_socket_callback = { _, socket, what, client, _ in
    Unmanaged<HTTPClient>.fromOpaque(client!).takeUnretainedValue().watch(socket, what)
}

private let curlTimerChanged: curl_multi_timer_callback = { _, milliseconds, client in
    Unmanaged<HTTPClient>.fromOpaque(client!).takeUnretainedValue().timerChanged(milliseconds)
    return 0
}
