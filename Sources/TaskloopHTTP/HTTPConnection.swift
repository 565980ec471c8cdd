/// What carries a connection's bytes: the libuv TCP stream in production, a recorder in tests.
/// Loop thread only.
protocol HTTPTransport: AnyObject {
    /// Sends `bytes`; what cannot leave at once is copied, queued and counted in `queuedBytes`.
    func write(_ bytes: UnsafeRawBufferPointer)
    /// Sends the three parts in order, as `write` would their concatenation.
    func write(_ head: UnsafeRawBufferPointer, _ body: UnsafeRawBufferPointer, _ tail: UnsafeRawBufferPointer)
    var queuedBytes: Int { get }
    func setReading(_ reading: Bool)
    /// Closes once queued bytes are out. With `linger`, first half-closes and briefly drains
    /// the peer's input, so a client still sending (say, a refused body) reads the final answer
    /// instead of a reset.
    func close(linger: Bool)
    /// Closes now, dropping what is still queued (a reader that stopped reading).
    func closeNow()
}

extension HTTPTransport {
    func write(_ head: UnsafeRawBufferPointer, _ body: UnsafeRawBufferPointer, _ tail: UnsafeRawBufferPointer) {
        write(head)
        write(body)
        write(tail)
    }
}

/// What the server's admission check decides on a request head, before its body is read.
public enum HTTPAdmission {
    case admit
    /// Admitted; its answer, whatever it is, carries these fields too (CORS, say).
    case admitAnswering(with: HTTPHeaders)
    /// Answered with this and the connection closed: the body is never read, nor buffered, and
    /// no `100 Continue` invites it.
    case refuse(HTTPResponse)
}

/// Settings shared by every connection of one server. Loop thread only.
final class HTTPConnectionContext {
    let handler: (consuming HTTPRequest, HTTPResponder) -> Void
    /// Runs on each request head; it may annotate the request (say, with its route's parameters).
    let admission: ((inout HTTPRequest) -> HTTPAdmission)?
    let parserLimits: HTTPParserLimits
    let timeouts: HTTPConnectionStateMachine.Timeouts
    /// Stop parsing and reading while more than this many response bytes wait for the peer...
    let outputHighWater: Int
    /// ...and go on once fewer than this many wait.
    let outputLowWater: Int
    /// Unparsed input kept while a request is being answered; reading pauses beyond it.
    let maxPendingInput: Int
    let clock: () -> UInt64
    let dateCache = HTTPDateCache()

    init(
        handler: @escaping (consuming HTTPRequest, HTTPResponder) -> Void,
        admission: ((inout HTTPRequest) -> HTTPAdmission)? = nil, parserLimits: HTTPParserLimits,
        timeouts: HTTPConnectionStateMachine.Timeouts, outputHighWater: Int, maxPendingInput: Int,
        clock: @escaping () -> UInt64
    ) {
        self.handler = handler
        self.admission = admission
        self.parserLimits = parserLimits
        self.timeouts = timeouts
        self.outputHighWater = outputHighWater
        self.outputLowWater = outputHighWater / 2
        self.maxPendingInput = maxPendingInput
        self.clock = clock
    }
}

/// One HTTP/1.1 connection: parses requests, hands each to the handler, encodes the answers in
/// order, and applies keep-alive, limits, timeouts and backpressure. It never touches a socket:
/// bytes come in through `receive`, go out through its `HTTPTransport`.
///
/// Requests are answered strictly one at a time. Pipelined bytes that arrive meanwhile wait in
/// `pendingInput` (bounded: reading pauses past `maxPendingInput`) and are parsed when the
/// current response is finished.
///
/// Threading: loop thread only, including every `HTTPResponder` call.
final class HTTPConnection {
    private let context: HTTPConnectionContext
    private var transport: HTTPTransport?
    private let parser: HTTPRequestParser
    private(set) var machine: HTTPConnectionStateMachine
    private var output: [UInt8] = []
    private var pendingInput: [UInt8] = []
    /// Identifies the request being answered; stale responders compare against it.
    private var sequence: UInt64 = 0
    private var answeringHead = false
    private var answeringHTTP10 = false
    private var isParsing = false
    private var peerEnded = false
    private var reading = true
    private var closeObserver: (() -> Void)?
    /// Told when the client ends its side while its request waits for an answer.
    private var peerEndObserver: (() -> Void)?
    /// Set while the answer is a stream (`HTTPResponder.startStream`).
    private var streaming = false
    /// The stream's body is chunked (an HTTP/1.1 client), else it ends with the connection.
    private var streamChunked = false
    /// Fields the admission check added to the current request's answer.
    private var answerFields: HTTPHeaders?
    /// Told once a stream's queued output has gone down to the low-water mark.
    private var drainObserver: (() -> Void)?

    init(context: HTTPConnectionContext, transport: HTTPTransport) {
        self.context = context
        self.transport = transport
        parser = HTTPRequestParser(limits: context.parserLimits)
        machine = HTTPConnectionStateMachine(now: context.clock(), timeouts: context.timeouts)
        output.reserveCapacity(1024)
    }

    var queuedOutputBytes: Int { output.count + (transport?.queuedBytes ?? 0) }
    var isReading: Bool { reading }
    var pendingInputBytes: Int { pendingInput.count }
    private var isOverHighWater: Bool { queuedOutputBytes > context.outputHighWater }

    // MARK: events from the transport

    func receive(_ bytes: UnsafeRawBufferPointer) {
        guard transport != nil else { return }
        switch machine.state {
        case .closing, .closed: return
        default: break
        }
        if pendingInput.isEmpty && canParse {
            let consumed = parse(bytes)
            if consumed < bytes.count, machine.state != .closing {
                pendingInput.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[consumed...]))
            }
        } else {
            pendingInput.append(contentsOf: bytes)
            parsePending()
        }
        flush()
        updateReading()
    }

    func peerClosed() {
        peerEnded = true
        if let observer = peerEndObserver, machine.state == .responding {
            peerEndObserver = nil
            observer()
        }
        closeIfPeerIsDone()
    }

    /// Queued output went out; resume work that backpressure held back.
    func transportDrained() {
        guard transport != nil, queuedOutputBytes <= context.outputLowWater else { return }
        if streaming, let observer = drainObserver {
            drainObserver = nil
            observer()
        }
        continueAfterResponse()
    }

    func transportClosed() {
        streaming = false
        drainObserver = nil
        machine.transportClosed()
        transport = nil
        pendingInput = []
        let observer = closeObserver
        closeObserver = nil
        peerEndObserver = nil
        observer?()
    }

    func tick(now: UInt64) {
        switch machine.tick(now: now) {
        case .none:
            break
        case .close:
            transport?.close(linger: false)
        case .respondTimeoutAndClose:
            sendFinalError(HTTPProblem(.requestTimeout, detail: "The request was not received in time."))
        }
    }

    /// The server is stopping: close if idle (unless `closingIdle` is false: then after the
    /// next response, or at `closeIfIdle`), else close after the current response.
    func drain(closingIdle: Bool = true) {
        if machine.drain(closingIdle: closingIdle) { transport?.close(linger: false) }
    }

    func closeIfIdle() {
        if machine.closeIfIdle() { transport?.close(linger: false) }
    }

    // MARK: parsing

    private var canParse: Bool {
        machine.acceptsInput && !parser.isFinished && hasOutputRoom()
    }

    /// Whether another answer may be produced now. Answers to pipelined requests are batched in
    /// `output`; past the high-water mark they are handed to the transport first, and only what
    /// the peer has not taken yet counts.
    private func hasOutputRoom() -> Bool {
        guard isOverHighWater else { return true }
        flush()
        return !isOverHighWater
    }

    /// Parses requests from `bytes` until they run out or the connection must wait; returns
    /// how many bytes were consumed.
    private func parse(_ bytes: UnsafeRawBufferPointer) -> Int {
        isParsing = true
        defer { isParsing = false }
        var offset = 0
        while offset < bytes.count && canParse {
            machine.bytesArrived(now: context.clock())
            let (consumed, event) = parser.parse(UnsafeRawBufferPointer(rebasing: bytes[offset...]))
            offset += consumed
            switch event {
            case .needMoreData:
                return bytes.count
            case .head(let expectsContinue):
                machine.headReceived(now: context.clock())
                answerFields = nil
                if let admission = context.admission {
                    switch parser.withHead(admission) {
                    case .admit: break
                    case .admitAnswering(let fields): answerFields = fields
                    case .refuse(let response):
                        sendFinal(response, withBody: parser.withHead { $0.method != .HEAD })
                        return bytes.count
                    }
                }
                if expectsContinue {
                    output.append(contentsOf: HTTPResponseEncoder.continueResponse)
                    flush()
                }
            case .request(let keepAlive):
                let request = parser.takeRequest()
                machine.requestReceived(keepAlive: keepAlive)
                sequence &+= 1
                answeringHead = request.method == .HEAD
                answeringHTTP10 = request.version.minor == 0
                context.handler(request, HTTPResponder(connection: self, sequence: sequence))
            case .failure(let status, let detail):
                sendFinalError(HTTPProblem(status, detail: detail))
                return bytes.count
            }
        }
        return offset
    }

    private func parsePending() {
        guard !pendingInput.isEmpty, canParse, !isParsing else { return }
        var pending = pendingInput
        pendingInput = []
        let consumed = pending.withUnsafeBytes { parse($0) }
        guard machine.state != .closing, transport != nil else { return }
        pending.removeFirst(consumed)
        pending.append(contentsOf: pendingInput)
        pendingInput = pending
    }

    private func continueAfterResponse() {
        guard !isParsing else { return }
        parsePending()
        flush()
        closeIfPeerIsDone()
        updateReading()
    }

    /// After the peer's half-close: once everything it sent has been answered, close.
    private func closeIfPeerIsDone() {
        guard peerEnded, transport != nil, !isParsing, machine.acceptsInput else { return }
        if !isOverHighWater || pendingInput.isEmpty {
            machine.beginClosing()
            flush()
            transport?.close(linger: false)
        }
    }

    private func updateReading() {
        guard let transport else { return }
        let wanted: Bool
        switch machine.state {
        case .closing, .closed: wanted = false
        default: wanted = !peerEnded && !isOverHighWater && pendingInput.count < context.maxPendingInput
        }
        if wanted != reading {
            reading = wanted
            transport.setReading(wanted)
        }
    }

    private func flush() {
        guard !output.isEmpty, let transport else { return }
        output.withUnsafeBytes { transport.write($0) }
        output.removeAll(keepingCapacity: true)
    }

    // MARK: answering

    func isOpen(_ sequence: UInt64) -> Bool {
        sequence == self.sequence && transport != nil && machine.state == .responding
    }

    func respond(_ sequence: UInt64, _ response: HTTPResponse) {
        guard isOpen(sequence), !streaming else { return }
        let keepAlive = machine.responseKeepsAlive && !response.headers.containsToken("close", in: "Connection")
        HTTPResponseEncoder.appendHead(
            status: response.status, headers: withAnswerFields(response.headers), contentLength: response.body.count,
            keepAlive: keepAlive, http10Client: answeringHTTP10,
            dateLine: context.dateCache.currentHeaderLine(), to: &output)
        if !answeringHead && response.status.code >= 200 && response.status.code != 204 && response.status.code != 304 {
            output.append(contentsOf: response.body)
        }
        finishResponse(keepAlive: keepAlive)
    }

    // MARK: streaming answers

    func startStream(_ sequence: UInt64, status: HTTPStatus, headers: HTTPHeaders) -> Bool {
        guard isOpen(sequence), !streaming else { return false }
        if answeringHead {
            respond(sequence, HTTPResponse(status: status, headers: headers))
            return false
        }
        streaming = true
        streamChunked = !answeringHTTP10
        HTTPResponseEncoder.appendHead(
            status: status, headers: withAnswerFields(headers), contentLength: nil, keepAlive: streamChunked && machine.responseKeepsAlive,
            http10Client: answeringHTTP10, dateLine: context.dateCache.currentHeaderLine(), to: &output)
        flush()
        return true
    }

    func streamWrite(_ sequence: UInt64, _ bytes: UnsafeRawBufferPointer) -> Bool {
        guard isOpen(sequence), streaming else { return false }
        guard output.isEmpty, let transport, !bytes.isEmpty else {
            if streamChunked { HTTPResponseEncoder.appendChunk(bytes, to: &output) } else { output.append(contentsOf: bytes) }
            flush()
            return true
        }
        // Straight from the caller's bytes (an event stream's, shared by every stream with its
        // filter): the transport copies only what the socket does not take at once.
        guard streamChunked else {
            transport.write(bytes)
            return true
        }
        HTTPResponseEncoder.withChunkFraming(of: bytes.count) { head, tail in transport.write(head, bytes, tail) }
        return true
    }

    func finishStream(_ sequence: UInt64) {
        guard isOpen(sequence), streaming else { return }
        streaming = false
        if streamChunked { output.append(contentsOf: HTTPResponseEncoder.lastChunk) }
        finishResponse(keepAlive: streamChunked && machine.responseKeepsAlive)
    }

    func onClose(_ sequence: UInt64, _ observer: @escaping () -> Void) {
        guard isOpen(sequence) else { return observer() }
        closeObserver = observer
    }

    /// A client may half-close and still read its answer, so the request stays open; a long
    /// poll uses this to answer at once instead of holding work for a client that is likely gone.
    func onPeerEnded(_ sequence: UInt64, _ observer: @escaping () -> Void) {
        guard isOpen(sequence) else { return }
        if peerEnded { return observer() }
        peerEndObserver = observer
    }

    func abort(_ sequence: UInt64) {
        guard isOpen(sequence) else { return }
        streaming = false
        machine.beginClosing()
        output = []
        transport?.closeNow()
    }

    /// Calls `observer` once the stream's unsent bytes are down to the low-water mark (at once
    /// if they are), for a writer that produces its body at the pace the reader takes it.
    func onDrained(_ sequence: UInt64, _ observer: @escaping () -> Void) {
        guard isOpen(sequence), streaming else { return }
        if queuedOutputBytes <= context.outputLowWater { return observer() }
        drainObserver = observer
    }

    private func finishResponse(keepAlive: Bool) {
        drainObserver = nil
        closeObserver = nil
        peerEndObserver = nil
        switch machine.responseFinished(now: context.clock(), keepAlive: keepAlive) {
        case .readNextRequest:
            if isParsing { return }
            continueAfterResponse()
        case .close:
            flush()
            transport?.close(linger: true)
        }
    }

    private func withAnswerFields(_ headers: HTTPHeaders) -> HTTPHeaders {
        guard let answerFields else { return headers }
        var merged = headers
        for field in answerFields { merged.add(field.name, field.value) }
        return merged
    }

    private func sendFinalError(_ problem: HTTPProblem) {
        sendFinal(problem.response())
    }

    /// Answers and closes, reading nothing more of what the client sends.
    private func sendFinal(_ response: HTTPResponse, withBody: Bool = true) {
        machine.beginClosing()
        HTTPResponseEncoder.appendHead(
            status: response.status, headers: response.headers, contentLength: response.body.count,
            keepAlive: false, http10Client: false, dateLine: context.dateCache.currentHeaderLine(), to: &output)
        if withBody { output.append(contentsOf: response.body) }
        pendingInput = []
        flush()
        transport?.close(linger: true)
    }
}

/// How a handler answers its request: once, now or later, on the loop thread. A responder for
/// a request that was already answered, or whose connection is gone, ignores further calls.
public struct HTTPResponder {
    let connection: HTTPConnection
    let sequence: UInt64

    public func respond(_ response: HTTPResponse) {
        connection.respond(sequence, response)
    }

    /// False once the request is answered or its client has gone.
    public var isOpen: Bool { connection.isOpen(sequence) }

    /// Calls `observer` if the connection closes before the answer is complete (a client that
    /// gave up on a long poll), or at once if it already has.
    public func onClose(_ observer: @escaping () -> Void) {
        connection.onClose(sequence, observer)
    }

    /// Starts an answer whose body follows in pieces (`write`), until `finish`: chunked for an
    /// HTTP/1.1 client, ended by closing the connection for HTTP/1.0. Returns false when the
    /// request is already answered or gone, and for `HEAD` (answered with the head alone).
    public func startStream(status: HTTPStatus = .ok, headers: HTTPHeaders) -> Bool {
        connection.startStream(sequence, status: status, headers: headers)
    }

    /// Appends to a started stream; false once it has ended or the client has gone.
    @discardableResult
    public func write(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { connection.streamWrite(sequence, $0) }
    }

    /// Bytes written to the stream that the client has not taken yet: a stream whose reader
    /// falls behind grows this, and its writer decides when that is too much.
    public var unsentBytes: Int { connection.queuedOutputBytes }

    /// Calls `observer` once the client has taken the stream's bytes down to the connection's
    /// low-water mark, or at once if it has; never if the stream ends first.
    public func onDrained(_ observer: @escaping () -> Void) {
        connection.onDrained(sequence, observer)
    }

    /// Ends a started stream; the connection then serves the next request (chunked) or closes.
    public func finish() {
        connection.finishStream(sequence)
    }

    /// Closes the connection at once (a stream whose reader cannot keep up).
    public func abort() {
        connection.abort(sequence)
    }

    /// Calls `observer` if the client ends its side of the connection (EOF) while the request
    /// waits for its answer, or at once if it already has; the answer can still be sent.
    public func onPeerEnded(_ observer: @escaping () -> Void) {
        connection.onPeerEnded(sequence, observer)
    }
}
