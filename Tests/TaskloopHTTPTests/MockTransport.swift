import Foundation
@testable import TaskloopHTTP

/// A transport with no socket: records what the connection writes and lets a test play the
/// peer (how much the "network" accepts, when queued bytes drain, when the close completes).
final class MockTransport: HTTPTransport {
    var sent: [UInt8] = []
    var queued: [UInt8] = []
    /// Bytes the "network" takes at once; the rest queues until `drain()`.
    var acceptsImmediately = Int.max
    var reading = true
    var closeRequest: Bool?
    var writesAfterClose = 0
    weak var connection: HTTPConnection?

    var queuedBytes: Int { queued.count }

    func write(_ bytes: UnsafeRawBufferPointer) {
        if closeRequest != nil { writesAfterClose += 1 }
        if queued.isEmpty {
            let now = min(bytes.count, acceptsImmediately)
            sent.append(contentsOf: bytes[..<now])
            queued.append(contentsOf: bytes[now...])
        } else {
            queued.append(contentsOf: bytes)
        }
    }

    func setReading(_ reading: Bool) { self.reading = reading }

    func close(linger: Bool) {
        if closeRequest == nil { closeRequest = linger }
    }

    var closedNow = false

    func closeNow() {
        closedNow = true
        if closeRequest == nil { closeRequest = false }
    }

    /// The peer read everything queued.
    func drain() {
        sent.append(contentsOf: queued)
        queued = []
        connection?.transportDrained()
    }

    /// libuv's close callback, later.
    func finishClose() { connection?.transportClosed() }

    var sentText: String { String(decoding: sent, as: UTF8.self) }

    /// Splits what was sent into responses by their status lines.
    var statusLines: [String] {
        // "\r\n" is a single Character, so dropLast() removes the line end.
        sentText.matches(of: /HTTP\/1\.1 \d{3} [^\r]*\r\n/).map { String($0.output.dropLast()) }
    }
}

/// A connection wired to a mock transport, a mock clock and a handler chosen by the test.
final class ConnectionHarness {
    var now: UInt64 = 0
    let transport = MockTransport()
    var connection: HTTPConnection!
    var handler: (HTTPRequest, HTTPResponder) -> Void = { request, responder in
        responder.respond(HTTPResponse(status: .ok, body: Array("path=\(request.path)".utf8)))
    }

    /// Decides on each request head, when set.
    var admission: ((inout HTTPRequest) -> HTTPAdmission)?

    init(limits: HTTPParserLimits = HTTPParserLimits(), highWater: Int = 256 * 1024,
         maxPendingInput: Int = 64 * 1024, headerTimeout: UInt64 = 1_000, bodyTimeout: UInt64 = 3_000,
         idleTimeout: UInt64 = 5_000) {
        let context = HTTPConnectionContext(
            handler: { [unowned self] in handler($0, $1) },
            admission: { [unowned self] request in admission?(&request) ?? .admit }, parserLimits: limits,
            timeouts: .init(headerMilliseconds: headerTimeout, bodyMilliseconds: bodyTimeout, idleMilliseconds: idleTimeout),
            outputHighWater: highWater, maxPendingInput: maxPendingInput, clock: { [unowned self] in now })
        connection = HTTPConnection(context: context, transport: transport)
        transport.connection = connection
    }

    func receive(_ text: String) { receive(Array(text.utf8)) }

    func receive(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { connection.receive($0) }
    }
}
