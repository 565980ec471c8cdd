import Testing
import TaskloopClient

/// The event-stream parser on plain bytes: every way the standard lets a stream be written,
/// in every split into chunks.
@Suite struct ServerSentEventTests {
    static func parse(_ chunks: [String], maxEventBytes: Int = 1 << 20) throws -> (events: [ServerSentEvent], parser: ServerSentEventParser) {
        var parser = ServerSentEventParser(maxEventBytes: maxEventBytes)
        var events: [ServerSentEvent] = []
        for chunk in chunks { events += try parser.feed(Array(chunk.utf8)) }
        return (events, parser)
    }

    /// Every way of cutting `text` in two, and byte by byte: the events never depend on where
    /// the network split the stream.
    static func expectSameEventsForEverySplit(_ text: String, _ expected: [ServerSentEvent]) throws {
        let bytes = Array(text.utf8)
        for cut in 0...bytes.count {
            var parser = ServerSentEventParser()
            let events = try parser.feed(bytes[..<cut]) + parser.feed(bytes[cut...])
            #expect(events == expected, "cut at \(cut)")
        }
        var parser = ServerSentEventParser()
        var events: [ServerSentEvent] = []
        for byte in bytes { events += try parser.feed([byte]) }
        #expect(events == expected, "byte by byte")
    }

    @Test func theServersFramesAreReadWithIdTypeAndData() throws {
        let stream = "retry: 2000\n\nid: 41\nevent: task.state\ndata: {\"seq\":41}\n\n: keep-alive\n\nid: 42\nevent: task.progress\ndata: {\"seq\":42}\n\n"
        let (events, parser) = try Self.parse([stream])
        #expect(events == [
            ServerSentEvent(id: "41", type: "task.state", data: #"{"seq":41}"#),
            ServerSentEvent(id: "42", type: "task.progress", data: #"{"seq":42}"#),
        ])
        #expect(parser.retryMilliseconds == 2_000 && parser.lastEventID == "42")
        try Self.expectSameEventsForEverySplit(stream, events)
    }

    @Test func everyLineEndIsALineEndEvenSplitAcrossChunks() throws {
        let expected = [ServerSentEvent(id: "1", type: "a", data: "x"), ServerSentEvent(id: "2", type: "message", data: "y")]
        for end in ["\r\n", "\n", "\r"] {
            let stream = "id: 1\(end)event: a\(end)data: x\(end)\(end)id: 2\(end)data: y\(end)\(end)"
            try Self.expectSameEventsForEverySplit(stream, expected)
        }
        // A CR at the end of one chunk and LF at the start of the next end one line, not two
        // (two would dispatch the event early, with half its fields).
        #expect(try Self.parse(["data: a\r", "\ndata: b\r\n\r\n"]).events == [ServerSentEvent(id: nil, type: "message", data: "a\nb")])
    }

    @Test func dataLinesJoinWithLineFeedsAndFieldsFollowTheStandard() throws {
        let stream = """
            data: first
            data:second
            data:  two spaces
            data

            : a comment
            event
            data: typeless

            event: named
            id
            data: after an empty id

            unknown: ignored
            retry: soon
            data:

            """ + "\n"
        let (events, parser) = try Self.parse([stream])
        #expect(events == [
            ServerSentEvent(id: nil, type: "message", data: "first\nsecond\n two spaces\n"),
            ServerSentEvent(id: nil, type: "message", data: "typeless"),
            ServerSentEvent(id: "", type: "named", data: "after an empty id"),
            ServerSentEvent(id: "", type: "message", data: ""),
        ])
        #expect(parser.retryMilliseconds == nil)
    }

    @Test func anEventWithoutDataIsNotDispatchedButItsIdSticks() throws {
        let (events, parser) = try Self.parse(["id: 7\nevent: nothing\n\ndata: later\n\n"])
        #expect(events == [ServerSentEvent(id: "7", type: "message", data: "later")])
        #expect(parser.lastEventID == "7")
        // An id holding NUL is ignored.
        #expect(try Self.parse(["id: 8\nid: 9\u{0}\ndata: x\n\n"]).events.first?.id == "8")
    }

    @Test func aByteOrderMarkAtTheStartIsSkippedAndAHalfEventAtTheEndIsNot() throws {
        let (events, _) = try Self.parse(["\u{FEFF}data: a\n\n", "data: unfinished\n"])
        #expect(events == [ServerSentEvent(id: nil, type: "message", data: "a")])
        #expect(try Self.parse(["\u{FEFF}\u{FEFF}data: a\n\n"]).events.isEmpty, "only the first mark is the stream's")
    }

    @Test func restartingForgetsTheHalfEventButKeepsTheIdAndRetry() throws {
        var parser = ServerSentEventParser()
        _ = try parser.feed(Array("retry: 500\nid: 3\ndata: a\n\ndata: cut off by the dro".utf8))
        parser.restart()
        #expect(parser.lastEventID == "3" && parser.retryMilliseconds == 500)
        #expect(try parser.feed(Array("data: b\n\n".utf8)) == [ServerSentEvent(id: "3", type: "message", data: "b")])
    }

    @Test func linesAndEventsBeyondTheLimitStopTheParser() throws {
        #expect(throws: ServerSentEventTooLarge.self) { _ = try Self.parse([String(repeating: "x", count: 101)], maxEventBytes: 100) }
        #expect(throws: ServerSentEventTooLarge.self) {
            _ = try Self.parse([String(repeating: "data: 0123456789\n", count: 10)], maxEventBytes: 100)
        }
        #expect(try Self.parse([String(repeating: "data: 0123456789\n", count: 5) + "\n"], maxEventBytes: 100).events.count == 1)
    }

    @Test func problemsAreReadFromTheServersDocument() throws {
        let body = #"{"type":"about:blank","title":"Unprocessable Content","status":422,"detail":"The body has 1 invalid field(s).","code":"invalid","errors":[{"field":"kind","message":"is required."}]}"#
        let response = ServerResponse(status: 422, headers: [], body: Array(body.utf8))
        let problem = try #require(response.problem)
        #expect(problem.code == "invalid" && problem.summary == "The body has 1 invalid field(s).")
        #expect(problem.description == "422 Unprocessable Content: The body has 1 invalid field(s).\n  kind: is required.")
        let proxyPage = ServerResponse(status: 502, headers: [], body: Array("<html>bad gateway</html>".utf8))
        #expect(proxyPage.json == nil && proxyPage.problem?.description == "502" && proxyPage.problem?.summary == "status 502")
        #expect(ServerResponse(status: 200, headers: [], body: Array("{}".utf8)).problem == nil)
    }
}
