/// The life of one HTTP/1.1 connection as a value: events in (`mutating` methods), decisions
/// out. It owns the timing rules (header, body and idle timeouts) and keep-alive;
/// it holds no sockets and reads no clock, so it is tested with plain numbers.
///
/// ```
///   idle(fresh) --byte--> readingHead --head--> readingBody --request--> responding
///      ^                                                                   |
///      +------------------- response finished, keep-alive ----------------+
///   any state --error / timeout / no keep-alive / drain--> closing --transport gone--> closed
/// ```
struct HTTPConnectionStateMachine: Equatable {
    struct Timeouts: Equatable {
        /// From a request's first byte (or from accept, for a connection that has sent nothing)
        /// until its head is complete.
        var headerMilliseconds: UInt64
        /// From a request's head until its whole body has arrived, however it trickles in.
        var bodyMilliseconds: UInt64
        /// Between keep-alive requests.
        var idleMilliseconds: UInt64
    }

    enum State: Equatable {
        /// Waiting for a request's first byte; `fresh` until the connection's first request.
        case idle(since: UInt64, fresh: Bool)
        case readingHead(since: UInt64)
        case readingBody(since: UInt64)
        /// The handler owns the request.
        case responding
        /// The last response is written or being written; no more requests are read.
        case closing
        case closed
    }

    enum TimeoutAction: Equatable {
        case none
        /// Close without a word: nothing is pending for the client.
        case close
        /// Answer 408 and close: the client is part-way through a request.
        case respondTimeoutAndClose
    }

    enum AfterResponse: Equatable {
        case readNextRequest
        case close
    }

    private(set) var state: State
    let timeouts: Timeouts
    /// Whether the current request allows the connection to be reused.
    private var requestKeepAlive = true
    private(set) var isDraining = false

    init(now: UInt64, timeouts: Timeouts) {
        state = .idle(since: now, fresh: true)
        self.timeouts = timeouts
    }

    /// Whether the connection should take in and parse request bytes now.
    var acceptsInput: Bool {
        switch state {
        case .idle, .readingHead, .readingBody: true
        case .responding, .closing, .closed: false
        }
    }

    /// Whether the response being written lets the connection stay open.
    var responseKeepsAlive: Bool { requestKeepAlive && !isDraining }

    mutating func bytesArrived(now: UInt64) {
        switch state {
        case .idle: state = .readingHead(since: now)
        case .readingHead, .readingBody, .responding, .closing, .closed: break
        }
    }

    mutating func headReceived(now: UInt64) {
        if case .readingHead = state { state = .readingBody(since: now) }
    }

    mutating func requestReceived(keepAlive: Bool) {
        guard acceptsInput else { return }
        requestKeepAlive = keepAlive
        state = .responding
    }

    /// `keepAlive` is the answer's own verdict (a handler may insist on `Connection: close`).
    mutating func responseFinished(now: UInt64, keepAlive: Bool) -> AfterResponse {
        guard case .responding = state else { return .close }
        if keepAlive && responseKeepsAlive {
            state = .idle(since: now, fresh: false)
            return .readNextRequest
        }
        state = .closing
        return .close
    }

    /// Nothing more is read: a request failed (its error answer is the last thing sent), or the
    /// peer has finished and everything it asked for is answered.
    mutating func beginClosing() {
        if state != .closed { state = .closing }
    }

    mutating func tick(now: UInt64) -> TimeoutAction {
        switch state {
        case .idle(let since, let fresh):
            let limit = fresh ? timeouts.headerMilliseconds : timeouts.idleMilliseconds
            guard now &- since >= limit else { return .none }
            state = .closing
            return .close
        case .readingHead(let since):
            guard now &- since >= timeouts.headerMilliseconds else { return .none }
            state = .closing
            return .respondTimeoutAndClose
        case .readingBody(let since):
            guard now &- since >= timeouts.bodyMilliseconds else { return .none }
            state = .closing
            return .respondTimeoutAndClose
        case .responding, .closing, .closed:
            return .none
        }
    }

    /// The server is stopping. Returns true when the connection should close now; otherwise
    /// the request in progress (or, not `closingIdle`, the next one) is answered with
    /// `Connection: close` and the connection closes.
    mutating func drain(closingIdle: Bool = true) -> Bool {
        isDraining = true
        return closingIdle && closeIfIdle()
    }

    /// Whether the connection waits for a request (and is now closing).
    mutating func closeIfIdle() -> Bool {
        if case .idle = state {
            state = .closing
            return true
        }
        return false
    }

    mutating func transportClosed() {
        state = .closed
    }
}
