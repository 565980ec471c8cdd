import Testing
@testable import TaskloopHTTP

/// Streamed answers (`HTTPResponder.startStream`) without sockets: framing for HTTP/1.1 and
/// HTTP/1.0, keep-alive after the end, HEAD, backpressure, and what a gone client leaves.
@Suite struct StreamTests {
    @Test func anHTTP11StreamIsChunkedAndTheConnectionServesTheNextRequest() {
        let harness = ConnectionHarness()
        var stream: HTTPResponder?
        harness.handler = { request, responder in
            if request.path == "/events" {
                #expect(responder.startStream(headers: ["Content-Type": "text/event-stream"]))
                stream = responder
            } else {
                responder.respond(HTTPResponse(body: Array("after".utf8)))
            }
        }
        harness.receive("GET /events HTTP/1.1\r\nHost: t\r\n\r\nGET /next HTTP/1.1\r\nHost: t\r\n\r\n")
        let head = harness.transport.sentText
        #expect(head.hasPrefix("HTTP/1.1 200 OK\r\n") && head.contains("Transfer-Encoding: chunked\r\n"))
        #expect(!head.contains("Content-Length") && head.hasSuffix("\r\n\r\n"))
        #expect(stream!.write(Array("data: one\n\n".utf8)))
        #expect(stream!.write(Array(repeating: UInt8(ascii: "x"), count: 300)))
        #expect(!harness.transport.sentText.contains("after"), "the next request waits for the stream's end")
        stream!.finish()
        let body = String(harness.transport.sentText.dropFirst(head.count))
        #expect(body.hasPrefix("b\r\ndata: one\n\n\r\n12c\r\n" + String(repeating: "x", count: 300) + "\r\n0\r\n\r\n"))
        #expect(body.hasSuffix("after"))
        #expect(!stream!.write(Array("late".utf8)))
        #expect(harness.transport.closeRequest == nil)
    }

    @Test func anHTTP10StreamEndsByClosing() {
        let harness = ConnectionHarness()
        harness.handler = { _, responder in
            #expect(responder.startStream(headers: [:]))
            responder.write(Array("raw".utf8))
            responder.finish()
        }
        harness.receive("GET /events HTTP/1.0\r\n\r\n")
        let text = harness.transport.sentText
        #expect(!text.contains("chunked") && text.contains("Connection: close") && text.hasSuffix("\r\n\r\nraw"))
        #expect(harness.transport.closeRequest != nil)
    }

    @Test func headGetsTheHeadAlone() {
        let harness = ConnectionHarness()
        harness.handler = { _, responder in
            #expect(!responder.startStream(headers: ["Content-Type": "text/event-stream"]))
            #expect(!responder.write(Array("x".utf8)))
        }
        harness.receive("HEAD /events HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(harness.transport.statusLines == ["HTTP/1.1 200 OK"])
        #expect(harness.transport.sentText.hasSuffix("\r\n\r\n"))
    }

    @Test func unsentBytesGrowWhileTheReaderLagsAndAbortCloses() {
        let harness = ConnectionHarness()
        harness.transport.acceptsImmediately = 100
        var stream: HTTPResponder?
        harness.handler = { _, responder in
            _ = responder.startStream(headers: [:])
            stream = responder
        }
        harness.receive("GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
        for _ in 0..<10 { stream!.write(Array(repeating: 0x61, count: 1_000)) }
        #expect(stream!.unsentBytes > 9_000)
        var closed = false
        stream!.onClose { closed = true }
        stream!.abort()
        #expect(harness.transport.closedNow)
        #expect(!stream!.write(Array("more".utf8)))
        harness.connection.transportClosed()
        #expect(closed)
    }

    /// One array written to several streams (as event streams with one filter share a turn's
    /// rendering): each gets it whole and framed, however little its socket takes at once, and
    /// the array stays as it was.
    @Test func bytesSharedByStreamsReachEachWholeThroughPartialWrites() {
        let shared = Array((0..<5_000).map { UInt8(ascii: "a") + UInt8($0 % 26) })
        let original = shared
        for (version, accepted) in [("1.1", 0), ("1.1", 7), ("1.1", 2_000), ("1.0", 3), ("1.0", Int.max)] {
            let harness = ConnectionHarness()
            var stream: HTTPResponder?
            harness.handler = { _, responder in
                _ = responder.startStream(headers: [:])
                stream = responder
            }
            harness.receive("GET /events HTTP/\(version)\r\nHost: t\r\n\r\n")
            let head = harness.transport.sent.count
            harness.transport.acceptsImmediately = accepted
            #expect(stream!.write(shared))
            #expect(stream!.write(shared))
            harness.transport.drain()
            let body = Array(harness.transport.sent[head...])
            let framed = version == "1.1" ? Array("1388\r\n".utf8) + shared + Array("\r\n".utf8) : shared
            #expect(body == framed + framed, "HTTP/\(version), \(accepted) taken at once")
        }
        #expect(shared == original)
    }
}
