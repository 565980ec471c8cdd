import Foundation
import Testing
@testable import TaskloopHTTP

/// HTTPConnection without sockets: the parse/answer/keep-alive/backpressure logic.
@Suite struct ConnectionTests {
    @Test func pipelinedRequestsAreAnsweredInOrderEvenWhenTheFirstIsSlow() {
        let harness = ConnectionHarness()
        var parked: HTTPResponder?
        var seen: [String] = []
        harness.handler = { request, responder in
            seen.append(request.path)
            if request.path == "/slow" {
                parked = responder
            } else {
                responder.respond(HTTPResponse(body: Array(request.path.utf8)))
            }
        }
        harness.receive("GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(seen == ["/slow"])
        #expect(harness.transport.sent.isEmpty)
        parked?.respond(HTTPResponse(body: Array("slow".utf8)))
        #expect(seen == ["/slow", "/b", "/c"])
        let text = harness.transport.sentText
        let slow = text.range(of: "slow")!, b = text.range(of: "\r\n\r\n/b")!, c = text.range(of: "\r\n\r\n/c")!
        #expect(slow.lowerBound < b.lowerBound && b.lowerBound < c.lowerBound)
        #expect(harness.transport.statusLines.count == 3)
    }

    @Test func everySplitOfTheInputGivesTheSameAnswers() {
        let input = Array("POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: t\r\n\r\n".utf8)
        var reference: String?
        for split in 1..<input.count {
            let harness = ConnectionHarness()
            var bodies: [String] = []
            harness.handler = { request, responder in
                bodies.append(String(decoding: request.body, as: UTF8.self))
                responder.respond(HTTPResponse(body: Array(request.path.utf8)))
            }
            harness.receive(Array(input[..<split]))
            harness.receive(Array(input[split...]))
            #expect(bodies == ["hello", ""], "split at \(split)")
            let answer = harness.transport.sentText.replacingDates()
            if let reference { #expect(answer == reference, "split at \(split)") } else { reference = answer }
        }
    }

    /// A value split across reads is one value; the same bytes with a line fold between are
    /// refused, wherever the reads split them.
    @Test func splitValuesAreJoinedButFoldedOnesRefusedAtEverySplit() {
        let whole = Array("GET /v HTTP/1.1\r\nHost: t\r\nX-A: abcd  \r\nX-B: ef\r\n\r\n".utf8)
        let folded = Array("GET /v HTTP/1.1\r\nHost: t\r\nX-A: ab\r\n cd\r\nX-B: ef\r\n\r\n".utf8)
        for split in 1..<folded.count {
            let harness = ConnectionHarness()
            var values: [String?] = []
            harness.handler = { request, responder in
                values = [request.headers["X-A"], request.headers["X-B"]]
                responder.respond(HTTPResponse())
            }
            if split < whole.count {
                harness.receive(Array(whole[..<split]))
                harness.receive(Array(whole[split...]))
                #expect(values == ["abcd", "ef"], "split at \(split)")
            }
            let refusing = ConnectionHarness()
            refusing.receive(Array(folded[..<split]))
            refusing.receive(Array(folded[split...]))
            #expect(refusing.transport.statusLines == ["HTTP/1.1 400 Bad Request"], "folded, split at \(split)")
        }
    }

    /// A method http_parser does not know is read by the parser itself, however it is split.
    @Test func unknownMethodsAreParsedAtEverySplit() {
        let input = Array("QUERY /q HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}POSTAL /p HTTP/1.1\r\nHost: t\r\n\r\n".utf8)
        for split in 1..<input.count {
            let harness = ConnectionHarness()
            var seen: [String] = []
            harness.handler = { request, responder in
                seen.append("\(request.method) \(request.path) \(String(decoding: request.body, as: UTF8.self))")
                responder.respond(HTTPResponse())
            }
            harness.receive(Array(input[..<split]))
            harness.receive(Array(input[split...]))
            #expect(seen == ["QUERY /q {}", "POSTAL /p "], "split at \(split)")
        }
    }

    @Test func byteByByteFeedingWorks() {
        let harness = ConnectionHarness()
        for byte in "GET /one HTTP/1.1\r\nHost: t\r\nX-A: 1\r\nX-A: 2\r\n\r\n".utf8 { harness.receive([byte]) }
        #expect(harness.transport.statusLines == ["HTTP/1.1 200 OK"])
        #expect(harness.transport.sentText.hasSuffix("path=/one"))
    }

    @Test func continueIsSentBeforeTheBodyIsRead() {
        let harness = ConnectionHarness()
        var handled = false
        harness.handler = { _, responder in
            handled = true
            responder.respond(HTTPResponse(status: .created))
        }
        harness.receive("POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        #expect(harness.transport.sentText == "HTTP/1.1 100 Continue\r\n\r\n")
        #expect(!handled)
        harness.receive("data")
        #expect(handled)
        #expect(harness.transport.statusLines == ["HTTP/1.1 100 Continue", "HTTP/1.1 201 Created"])
    }

    @Test func oversizedBodyIsRefusedWithoutContinue() {
        let harness = ConnectionHarness(limits: HTTPParserLimits(maxBodyBytes: 10))
        harness.receive("POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n")
        #expect(harness.transport.statusLines == ["HTTP/1.1 413 Content Too Large"])
        #expect(harness.transport.closeRequest == true)
        #expect(harness.transport.sentText.contains("Connection: close"))
    }

    @Test func unknownExpectationIs417() {
        let harness = ConnectionHarness()
        harness.receive("POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nExpect: magic\r\n\r\n")
        #expect(harness.transport.statusLines == ["HTTP/1.1 417 Expectation Failed"])
    }

    @Test func headAnswersCarryLengthButNoBody() {
        let harness = ConnectionHarness()
        harness.receive("HEAD /abc HTTP/1.1\r\nHost: t\r\n\r\n")
        let text = harness.transport.sentText
        #expect(text.contains("Content-Length: 9\r\n"))
        #expect(text.hasSuffix("\r\n\r\n"))
    }

    @Test func answersToStaleRespondersAreIgnored() {
        let harness = ConnectionHarness()
        var responders: [HTTPResponder] = []
        harness.handler = { _, responder in
            responders.append(responder)
            responder.respond(HTTPResponse())
        }
        harness.receive("GET /1 HTTP/1.1\r\nHost: t\r\n\r\n")
        responders[0].respond(HTTPResponse(status: .notFound))
        harness.receive("GET /2 HTTP/1.1\r\nHost: t\r\n\r\n")
        responders[0].respond(HTTPResponse(status: .notFound))
        #expect(harness.transport.statusLines == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"])
    }

    @Test func slowReaderStopsParsingAndReadingUntilDrained() {
        let body = [UInt8](repeating: 0x61, count: 40_000)
        let harness = ConnectionHarness(highWater: 100_000)
        var handled = 0
        harness.handler = { _, responder in
            handled += 1
            responder.respond(HTTPResponse(body: body))
        }
        harness.transport.acceptsImmediately = 0
        harness.receive(String(repeating: "GET /big HTTP/1.1\r\nHost: t\r\n\r\n", count: 10))
        #expect(handled == 3)                     // 3 x 40 KB passes the 100 KB high-water mark
        #expect(!harness.transport.reading)
        #expect(harness.connection.queuedOutputBytes < 100_000 + 41_000)
        harness.transport.acceptsImmediately = .max
        harness.transport.drain()
        #expect(handled == 10)
        #expect(harness.transport.reading)
        #expect(harness.transport.statusLines.count == 10)
    }

    @Test func pendingInputIsBoundedWhileAnswering() {
        let harness = ConnectionHarness(maxPendingInput: 1_000)
        harness.handler = { _, _ in }  // never answers
        harness.receive("GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(harness.transport.reading)
        harness.receive(String(repeating: "GET /next HTTP/1.1\r\nHost: t\r\n\r\n", count: 60))
        #expect(!harness.transport.reading)
    }

    @Test func malformedRequestGets400AndClose() {
        let harness = ConnectionHarness()
        harness.receive("GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n")
        #expect(harness.transport.statusLines == ["HTTP/1.1 400 Bad Request"])
        #expect(harness.transport.sentText.contains("application/problem+json"))
        #expect(harness.transport.closeRequest == true)
        harness.receive("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(harness.transport.statusLines.count == 1)
    }

    @Test func limitsMapToTheirStatuses() {
        let limits = HTTPParserLimits(maxURLBytes: 20, maxHeaderBytes: 100, maxBodyBytes: 10)
        let cases: [(String, String)] = [
            ("GET /\(String(repeating: "a", count: 30)) HTTP/1.1\r\nHost: t\r\n\r\n", "414 URI Too Long"),
            ("GET / HTTP/1.1\r\nHost: t\r\nX: \(String(repeating: "b", count: 200))\r\n\r\n", "431 Request Header Fields Too Large"),
            ("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n", "413 Content Too Large"),
            ("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\nabcdef\r\n", "413 Content Too Large"),
            ("GET / HTTP/2.0\r\n\r\n", "505 HTTP Version Not Supported"),
            ("GET /%zz HTTP/1.1\r\nHost: t\r\n\r\n", "400 Bad Request"),
            ("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", "400 Bad Request"),
        ]
        for (input, status) in cases {
            let harness = ConnectionHarness(limits: limits)
            harness.receive(input)
            #expect(harness.transport.statusLines == ["HTTP/1.1 \(status)"], "\(input.prefix(40))")
            #expect(harness.transport.closeRequest == true)
        }
    }

    @Test func http10ClosesUnlessKeepAliveIsAsked() {
        let plain = ConnectionHarness()
        plain.receive("GET / HTTP/1.0\r\n\r\n")
        #expect(plain.transport.sentText.contains("Connection: close"))
        #expect(plain.transport.closeRequest != nil)

        let kept = ConnectionHarness()
        kept.receive("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        #expect(kept.transport.sentText.contains("Connection: keep-alive"))
        #expect(kept.transport.closeRequest == nil)
    }

    @Test func connectionCloseIsHonoured() {
        let harness = ConnectionHarness()
        harness.receive("GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(harness.transport.statusLines == ["HTTP/1.1 200 OK"])
        #expect(harness.transport.sentText.contains("Connection: close"))
        #expect(harness.transport.closeRequest == true)
    }

    @Test func halfClosedPeerStillGetsItsPipelinedAnswers() {
        let harness = ConnectionHarness()
        var parked: HTTPResponder?
        harness.handler = { request, responder in
            if parked == nil { parked = responder } else { responder.respond(HTTPResponse()) }
        }
        harness.receive("GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n")
        harness.connection.peerClosed()
        #expect(harness.transport.closeRequest == nil)
        parked?.respond(HTTPResponse())
        #expect(harness.transport.statusLines.count == 2)
        #expect(harness.transport.closeRequest == false)
    }

    @Test func headerTimeoutAnswers408ButSilentConnectionsJustClose() {
        let slow = ConnectionHarness(headerTimeout: 1_000)
        slow.receive("GET / HTTP/1.1\r\nHost:")
        slow.now = 999
        slow.connection.tick(now: slow.now)
        #expect(slow.transport.sent.isEmpty)
        slow.now = 1_000
        slow.connection.tick(now: slow.now)
        #expect(slow.transport.statusLines == ["HTTP/1.1 408 Request Timeout"])
        #expect(slow.transport.closeRequest == true)

        let silent = ConnectionHarness(headerTimeout: 1_000)
        silent.connection.tick(now: 1_000)
        #expect(silent.transport.sent.isEmpty)
        #expect(silent.transport.closeRequest == false)
    }

    @Test func closeObserverFiresWhenTheClientGoesAway() {
        let harness = ConnectionHarness()
        var parked: HTTPResponder?
        var observed = 0
        harness.handler = { _, responder in
            parked = responder
            responder.onClose { observed += 1 }
        }
        harness.receive("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(parked?.isOpen == true)
        harness.transport.finishClose()
        #expect(observed == 1)
        #expect(parked?.isOpen == false)
        parked?.respond(HTTPResponse())
        #expect(harness.transport.sent.isEmpty)
    }
}

extension String {
    /// Blanks `Date:` values so answers from different seconds compare equal.
    func replacingDates() -> String {
        components(separatedBy: "\r\n").map { $0.hasPrefix("Date: ") ? "Date: -" : $0 }.joined(separator: "\r\n")
    }
}
