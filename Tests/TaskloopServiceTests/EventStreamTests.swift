import Foundation
import Testing
@testable import TaskloopService
import TaskloopStore
import TaskloopTestSupport

/// `GET /events` and `GET /tasks/{id}/events` over real sockets: order, filters, resume with
/// `Last-Event-ID` and `reset`, coalesced progress, a reader that falls behind, and numbers that
/// go on after a restart. Ids are compared as ids (`precedes`), so the tests hold on cells too,
/// where they are positions; those about a single server's numbers or its ring are its alone.
@Suite struct EventStreamTests {
    /// An event stream read over HTTP/1.0, whose body is the stream itself (no chunk framing).
    final class Stream {
        let connection: RawClient

        /// `narrow`: its connection holds little in flight (`RawClient(narrow:)`).
        init(port: Int, _ target: String, headers: [String: String] = [:], narrow: Bool = false) throws {
            connection = try RawClient(port: port, narrow: narrow)
            var request = "GET \(target) HTTP/1.0\r\n"
            for (name, value) in headers { request += "\(name): \(value)\r\n" }
            try connection.send(request + "\r\n")
        }

        struct Event: Equatable {
            var id: UInt64?
            /// The id as sent: opaque on cells.
            var wireID: String?
            var type: String
            var data: [String: Any]
            static func == (lhs: Event, rhs: Event) -> Bool { lhs.id == rhs.id && lhs.type == rhs.type }
        }

        /// The head and every complete event received so far.
        static func parse(_ bytes: [UInt8]) -> (head: String, events: [Event], comments: Int) {
            let text = String(decoding: bytes, as: UTF8.self)
            guard let split = text.range(of: "\r\n\r\n") else { return ("", [], 0) }
            var events: [Event] = []
            var comments = 0
            let blocks = text[split.upperBound...].components(separatedBy: "\n\n")
            for block in blocks.dropLast() {
                var event = Event(id: nil, type: "message", data: [:])
                var hasData = false
                for line in block.split(separator: "\n") {
                    if line.hasPrefix(":") { comments += 1 }
                    if line.hasPrefix("id: ") {
                        event.id = UInt64(line.dropFirst(4))
                        event.wireID = String(line.dropFirst(4))
                    }
                    if line.hasPrefix("event: ") { event.type = String(line.dropFirst(7)) }
                    if line.hasPrefix("data: ") {
                        hasData = true
                        event.data = (try? JSONSerialization.jsonObject(with: Data(line.dropFirst(6).utf8))) as? [String: Any] ?? [:]
                    }
                }
                if hasData { events.append(event) }
            }
            return (String(text[..<split.lowerBound]), events, comments)
        }

        func waitFor(_ count: Int, timeout: Double = 5) throws -> [Event] {
            // Counting complete `data:` lines is enough to know when to stop; parsing is for the end.
            _ = try waitForCount(count, timeout: timeout)
            return Self.parse(try connection.readUntil(timeout: timeout) { _ in true }).events
        }

        /// Reads until the events received so far satisfy `done`; returns them.
        func waitUntil(timeout: Double = 10, _ done: ([Event]) -> Bool) throws -> [Event] {
            Self.parse(try connection.readUntil(timeout: timeout) { done(Self.parse($0).events) }).events
        }

        /// Complete `data:` lines counted so far, and where the count goes on from.
        private var counted = 0
        private var countedUpTo = 0

        /// Waits until `count` events have arrived; how many have. Each byte is looked at once
        /// (a stream of many megabytes counted from its start at every read took minutes).
        func waitForCount(_ count: Int, timeout: Double = 5) throws -> Int {
            _ = try connection.readUntil(timeout: timeout) { bytes in
                if countedUpTo > bytes.count { (counted, countedUpTo) = (0, 0) } // the buffer was emptied
                let (lines, next) = Self.completeDataLines(bytes, from: countedUpTo)
                counted += lines
                countedUpTo = next
                return counted >= count
            }
            return counted
        }

        /// The complete `data:` lines from `start` on, and where a later count goes on from (the
        /// start of a line not yet complete).
        static func completeDataLines(_ bytes: [UInt8], from start: Int) -> (count: Int, next: Int) {
            var count = 0
            var index = start
            let pattern = Array("\ndata: ".utf8)
            while index + pattern.count <= bytes.count {
                guard bytes[index] == 0x0A, bytes[index + 1] == pattern[1], bytes[index..<index + pattern.count].elementsEqual(pattern)
                else {
                    index += 1
                    continue
                }
                // Complete once its line ends; the scan goes on from there.
                guard let end = bytes[(index + pattern.count)...].firstIndex(of: 0x0A) else { break }
                count += 1
                index = end
            }
            return (count, index)
        }

        var head: String { Self.parse((try? connection.readUntil(timeout: 5) { Self.parse($0).head != "" }) ?? []).head }
    }

    /// Whether event id `first` comes before `second`: a single server's ids are numbers, those
    /// of cells fixed-width positions that sort as text.
    static func precedes(_ first: String, _ second: String) -> Bool {
        (first.count, first) < (second.count, second)
    }

    /// Every event has an id, each after the one before.
    static func rising(_ events: [Stream.Event]) -> Bool {
        let ids = events.compactMap(\.wireID)
        return ids.count == events.count && zip(ids, ids.dropFirst()).allSatisfy { precedes($0, $1) }
    }

    /// The data's `seq`, as text: a number on a single server, a position on cells.
    static func seq(_ event: Stream.Event) -> String? {
        (event.data["seq"] as? Int).map(String.init) ?? event.data["seq"] as? String
    }

    /// Where a stream that starts now starts: the `Event-Seq` of a list.
    static func eventSeq(_ client: APIClient) throws -> String {
        try #require(try client.call("GET", "/tasks?limit=1").header("Event-Seq"))
    }

    static func states(_ events: [Stream.Event]) -> [String] {
        events.map { event in
            let state = ((event.data["task"] as? [String: Any])?["state"] ?? (event.data["workflow"] as? [String: Any])?["state"]) as? String
            return "\(event.type)\(state.map { ":" + $0 } ?? "")"
        }
    }

    @Test func everyChangeIsNumberedInOrderAndFiltersApply() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let all = try Stream(port: service.port, "/events")
        #expect(all.head.contains("200 OK") && all.head.contains("Content-Type: text/event-stream"))
        let onlyWorkflows = try Stream(port: service.port, "/events?types=workflow.state")
        let before = try Self.eventSeq(client)
        let task = try #require(try client.submit(#"{"kind":"noop","queue":"q"}"#)["id"] as? String)
        // Ended first: on cells the task's last changes would otherwise commit beside the workflow's.
        _ = try client.waitForState(task, "succeeded")
        let workflow = try client.call("POST", "/workflows", json: #"{"tasks":[{"key":"a","kind":"noop"}]}"#)
        #expect(workflow.status == 201)
        let events = try all.waitFor(10)
        #expect(Self.states(events) == [
            "task.created:pending", "task.state:queued", "task.state:running", "task.state:succeeded",
            "workflow.state:running", "task.created:pending", "task.state:queued", "task.state:running", "task.state:succeeded",
            "workflow.state:succeeded",
        ])
        #expect(Self.rising(events) && Self.precedes(before, events[0].wireID ?? ""), "\(events.map(\.wireID))")
        #expect(events.allSatisfy { Self.seq($0) == $0.wireID } && events[0].data["time"] is String)
        #expect((events[0].data["task"] as? [String: Any])?["id"] as? String == task)
        let workflowEvents = try onlyWorkflows.waitFor(2)
        #expect(Self.states(workflowEvents) == ["workflow.state:running", "workflow.state:succeeded"])
        #expect(try client.call("GET", "/events?types=nope").status == 400)
        #expect(try client.call("GET", "/events?since=x").status == 400)
    }

    /// A single server's ring of `--event-buffer-size` events and its numbers (cells keep their
    /// history by time: `CellEventStreamTests`).
    @Test(.numbersEventsAsOneServer) func aResumeReplaysWhatWasMissedAndResetsWhenItIsGone() throws {
        let service = try ServiceHarness { $0.eventBufferSize = 8 }
        defer { try? service.stop() }
        let client = try service.client()
        for _ in 0..<3 { _ = try client.submit(#"{"kind":"noop"}"#) } // events 1...12; 5...12 kept
        let resumed = try Stream(port: service.port, "/events", headers: ["Last-Event-ID": "9"])
        #expect(try resumed.waitFor(3).map(\.id) == [10, 11, 12])
        let tooOld = try Stream(port: service.port, "/events?since=2")
        let events = try tooOld.waitFor(9)
        #expect(events[0].type == "reset" && events[0].data["oldest"] as? Int == 5)
        #expect(events.dropFirst().map(\.id) == (5...12).map { Optional(UInt64($0)) })
        // Live events follow the replay without a gap.
        _ = try client.submit(#"{"kind":"noop"}"#)
        #expect(try resumed.waitFor(7).map(\.id) == (10...16).map { Optional(UInt64($0)) })
    }

    @Test func aReplayShowsEachChangeAsItWasNotAsTheTaskIsNow() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let start = try Self.eventSeq(client)
        // Nobody listens while it runs: each event's JSON is first rendered for the replay.
        let id = try client.submit(#"{"kind":"sleep","params":{"duration_ms":900,"steps":3}}"#)["id"] as! String
        _ = try client.waitForState(id, "succeeded")
        let replay = try Stream(port: service.port, "/events?task=\(id)&since=\(start)")
        var events: [Stream.Event] = []
        try pollUntil("the replay up to the end", timeout: 5, every: 0) {
            events = try replay.waitFor(events.count + 1)
            return events.last?.data["task"].flatMap { ($0 as? [String: Any])?["state"] as? String } == "succeeded"
        }
        let tasks = events.compactMap { $0.data["task"] as? [String: Any] }
        let states = tasks.map { $0["state"] as? String ?? "" }
        #expect(Array(states.prefix(3)) == ["pending", "queued", "running"] && states.last == "succeeded", "\(states)")
        // Progress events (coalesced to 5/s, so one or two of the two steps): each as it was.
        let steps = tasks.dropFirst(3).dropLast()
        #expect(!steps.isEmpty && steps.allSatisfy { $0["state"] as? String == "running" }, "\(states)")
        let fractions = steps.compactMap { ($0["progress"] as? [String: Any])?["fraction"] as? Double }
        #expect(fractions.count == steps.count && fractions.allSatisfy { $0 < 1 } && fractions == fractions.sorted(), "\(fractions)")
        #expect(tasks.dropLast().allSatisfy { $0["finished_at"] is NSNull }, "no event before the end shows the end")
        #expect(tasks.last?["finished_at"] is String)
    }

    /// A noop is queued, started and finished within one call, and its events are numbered
    /// after it: each still shows the task as that state had it, not finished before it ran.
    @Test func eachStateOfATaskMadeInOneCallShowsOnlyWhatItHad() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let stream = try Stream(port: service.port, "/events?types=task.state")
        _ = stream.head
        let id = try #require(try client.submit(#"{"kind":"noop"}"#)["id"] as? String)
        let events = try stream.waitUntil { events in events.contains { Self.task($0)?["state"] as? String == "succeeded" } }
        let tasks = events.compactMap(Self.task).filter { $0["id"] as? String == id }
        #expect(tasks.map { $0["state"] as? String } == ["queued", "running", "succeeded"])
        let (queued, running, succeeded) = (tasks[0], tasks[1], tasks[2])
        for (task, started, finished) in [(queued, false, false), (running, true, false), (succeeded, true, true)] {
            let state = task["state"] as? String ?? "?"
            #expect((task["started_at"] is String) == started && (task["finished_at"] is String) == finished, "\(state): \(task)")
            #expect(task["result"] is NSNull && task["result_truncated"] as? Bool == false, "\(state)")
        }
        let fractions = tasks.map { ($0["progress"] as? [String: Any])?["fraction"] }
        #expect(fractions[0] is NSNull && fractions[1] is NSNull && fractions[2] as? Double == 1, "\(fractions)")
        #expect(tasks.allSatisfy { $0["attempt"] as? Int == 1 && $0["error"] is NSNull })
    }

    /// `?progress_body=brief`: the same events in the same order as a stream without it, each
    /// `task.progress` carrying only the task's `id, queue, workflow, state, attempt, progress`
    /// (as the whole task shows them), every other event whole; live, shared by a group of
    /// streams, and replayed alike. Any other value is refused.
    @Test func briefProgressBodiesCarryOnlyWhatAProgressBarFollows() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let start = try Self.eventSeq(client)
        let full = try Stream(port: service.port, "/events?types=task.state,task.progress")
        let brief = try Stream(port: service.port, "/events?types=task.state,task.progress&progress_body=brief")
        let briefToo = try Stream(port: service.port, "/events?progress_body=brief&types=task.state,task.progress")
        let briefAll = try Stream(port: service.port, "/events?progress_body=brief")
        for stream in [full, brief, briefToo, briefAll] { _ = stream.head }
        let workflow = try client.call("POST", "/workflows", json: #"""
            {"tasks":[{"key":"a","kind":"sleep","params":{"duration_ms":900,"steps":3}}]}
            """#)
        let workflowID = try #require(workflow.json["id"] as? String)
        let id = try #require((workflow.json["keys"] as? [String: Any])?["a"] as? String)
        // A task's own stream: its snapshot whole, its progress brief, then its end.
        let own = try Stream(port: service.port, "/tasks/\(id)/events?progress_body=brief")
        func untilTheEnd(_ stream: Stream) throws -> [Stream.Event] {
            try stream.waitUntil { events in events.contains { $0.type == "task.state" && Self.task($0)?["state"] as? String == "succeeded" } }
                .filter { $0.type == "task.state" || $0.type == "task.progress" }
        }
        let whole = try untilTheEnd(full)
        let progress = whole.filter { $0.type == "task.progress" }
        #expect(!progress.isEmpty && progress.allSatisfy { Self.task($0)?["params"] != nil && Self.task($0)?["kind"] as? String == "sleep" })
        let replayed = try Stream(port: service.port, "/events?since=\(start)&progress_body=brief&types=task.state,task.progress")
        for (name, stream) in [("brief", brief), ("the same filter", briefToo), ("every type", briefAll), ("replayed", replayed)] {
            let events = try untilTheEnd(stream)
            #expect(events.map(\.wireID) == whole.map(\.wireID) && events.map(\.type) == whole.map(\.type), "\(name)")
            for (shown, as_) in zip(events, whole) {
                let task = try #require(Self.task(shown)), wholeTask = try #require(Self.task(as_))
                #expect(shown.data["seq"].map { "\($0)" } == as_.data["seq"].map { "\($0)" } && shown.data["time"] as? String == as_.data["time"] as? String)
                if shown.type == "task.progress" {
                    #expect(Set(task.keys) == ["id", "queue", "workflow", "state", "attempt", "progress"], "\(name): \(task.keys)")
                    for key in task.keys {
                        #expect(try Self.canonical(task[key]!) == Self.canonical(wholeTask[key] ?? NSNull()), "\(name): \(key)")
                    }
                    #expect(task["id"] as? String == id && task["workflow"] as? String == workflowID && task["state"] as? String == "running")
                } else {
                    #expect(try Self.canonical(task) == Self.canonical(wholeTask), "\(name): a \(shown.type) is whole")
                }
            }
        }
        let ownEvents = Stream.parse(try own.connection.readUntilClosed(timeout: 10)).events
        #expect(ownEvents.first?.type == "task.snapshot" && Self.task(ownEvents[0])?["params"] != nil)
        #expect(Self.states(ownEvents).last == "task.state:succeeded", "\(Self.states(ownEvents))")
        let ownProgress = ownEvents.filter { $0.type == "task.progress" }.compactMap(Self.task)
        #expect(!ownProgress.isEmpty && ownProgress.allSatisfy { Set($0.keys) == ["id", "queue", "workflow", "state", "attempt", "progress"] })
        for value in ["short", "", "BRIEF"] {
            for target in ["/events?progress_body=\(value)", "/tasks/\(id)/events?progress_body=\(value)"] {
                let refused = try client.call("GET", target)
                #expect(refused.status == 400 && refused.text.contains("progress_body"), "\(target): \(refused.status) \(refused.text)")
            }
        }
    }

    static func task(_ event: Stream.Event) -> [String: Any]? {
        event.data["task"] as? [String: Any]
    }

    /// A JSON value as text with its keys sorted: two values compare equal as JSON.
    static func canonical(_ value: Any) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .fragmentsAllowed]), as: UTF8.self)
    }

    @Test func aReplayShowsEachQueueChangeAsItWas() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let start = try Self.eventSeq(client)
        for body in [#"{"paused":true}"#, #"{"max_concurrency":3}"#, #"{"paused":false}"#,
                     #"{"rate_limit":{"per_second":2.5,"burst":3}}"#, #"{"rate_limit":null}"#] {
            #expect(try client.call("PATCH", "/queues/lane", json: body).status == 200)
        }
        let replay = try Stream(port: service.port, "/events?types=queue.updated&since=\(start)")
        let queues = try replay.waitFor(5).compactMap { $0.data["queue"] as? [String: Any] }
        #expect(queues.map { $0["paused"] as? Bool } == [true, true, false, false, false])
        #expect(queues.map { $0["max_concurrency"] as? Int }.dropFirst() == [3, 3, 3, 3])
        let limits = queues.map { $0["rate_limit"] as? [String: Any] }
        #expect(limits.map { $0?["per_second"] as? Double } == [nil, nil, nil, 2.5, nil])
        #expect(limits.map { $0?["burst"] as? Int } == [nil, nil, nil, 3, nil])
        #expect(queues.allSatisfy { $0.keys.contains("rate_limit") })
    }

    @Test func aTaskStreamStartsWithTheTaskAndEndsAfterItsEnd() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let id = try #require(try client.submit(#"{"kind":"sleep","params":{"duration_ms":1000,"steps":20}}"#)["id"] as? String)
        _ = try client.submit(#"{"kind":"noop"}"#) // not this task's
        let stream = try Stream(port: service.port, "/tasks/\(id)/events")
        let bytes = try stream.connection.readUntilClosed(timeout: 5)
        let events = Stream.parse(bytes).events
        #expect(events.first?.type == "task.snapshot")
        #expect(events.allSatisfy { ($0.data["task"] as? [String: Any])?["id"] as? String == id })
        #expect(Self.states(events).last == "task.state:succeeded")
        // Twenty progress reports in a second, coalesced to at most five a second.
        let progress = events.filter { $0.type == "task.progress" }.count
        #expect(progress >= 2 && progress <= 7, "\(progress) progress events")
        // A finished task: the snapshot, and the end.
        let done = Stream.parse(try Stream(port: service.port, "/tasks/\(id)/events").connection.readUntilClosed(timeout: 2)).events
        #expect(done.map(\.type) == ["task.snapshot"])
        #expect(try client.call("GET", "/tasks/01M00000000000000000000000/events").status == 404)
    }

    /// A reader that leaves ends its stream at once, whether it closes its connection (FIN, as a
    /// browser does when a page aborts its fetch) or resets it: nothing is published meanwhile,
    /// so no write can be what notices, and the 15 s keep-alive is far beyond the deadline.
    @Test func aStreamEndsTheMomentItsReaderLeaves() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        // The streams are this replica's, and so is its gauge.
        func openStreams() throws -> Int {
            try service.metric("taskloop_event_streams", replica: service.port).map { Int($0) } ?? -1
        }
        let start = try Self.eventSeq(client)
        _ = try client.submit(#"{"kind":"noop"}"#)
        var closing: [RawClient] = []
        var resetting: [RawClient] = []
        for index in 0..<8 {
            let reader = try RawClient(port: service.port)
            // HTTP/1.1 (chunked, kept alive) as browsers ask, and HTTP/1.0 (ended by closing).
            try reader.send("GET /events?since=\(start) HTTP/1.\(index % 4 < 2 ? 1 : 0)\r\nHost: localhost\r\n\r\n")
            _ = try reader.readUntil { Stream.completeDataLines($0, from: 0).count >= 4 }
            if index % 2 == 0 { closing.append(reader) } else { resetting.append(reader) }
        }
        // Read once the task's four events are out (on cells they take several commits).
        let seqBefore = try Self.eventSeq(client)
        try pollUntil("eight streams") { try openStreams() == 8 }
        closing = []
        try pollUntil("the closed streams to end", timeout: 5) { try openStreams() == 4 }
        for reader in resetting { reader.resetOnClose() }
        resetting = []
        try pollUntil("the reset streams to end", timeout: 5) { try openStreams() == 0 }
        #expect(try Self.eventSeq(client) == seqBefore, "no event was published meanwhile")
    }

    /// `until` bounds a replay: the matching events up to that one, then the stream ends; the
    /// head's Event-Seq says where the live part of a stream starts.
    @Test func untilEndsTheStreamAfterThatEvent() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let start = try Self.eventSeq(client)
        let first = try #require(try client.submit(#"{"kind":"noop","queue":"a"}"#)["id"] as? String)
        let second = try #require(try client.submit(#"{"kind":"noop","queue":"b"}"#)["id"] as? String)
        let all = try Stream(port: service.port, "/events?since=\(start)").waitUntil { events in
            [first, second].allSatisfy { id in
                Self.states(events.filter { ($0.data["task"] as? [String: Any])?["id"] as? String == id }).count == 4
            }
        }
        // Up to the second task's second event: the first task's events before it.
        let secondsEvents = all.filter { ($0.data["task"] as? [String: Any])?["id"] as? String == second }
        let until = try #require(secondsEvents[1].wireID)
        let firstsEvents = all.filter { ($0.data["task"] as? [String: Any])?["id"] as? String == first }
        let ended = try Stream(port: service.port, "/events?queue=a&since=\(start)&until=\(until)")
        let bounded = Stream.parse(try ended.connection.readUntilClosed(timeout: 5))
        #expect(bounded.events.map(\.wireID) == firstsEvents.filter { Self.precedes($0.wireID!, until) }.map(\.wireID))
        #expect(!bounded.events.isEmpty)
        let last = try #require(all.last?.wireID)
        let head = try #require(bounded.head.split(separator: "\r\n").first { $0.hasPrefix("Event-Seq: ") })
        let live = String(head.dropFirst("Event-Seq: ".count))
        // On one server the last event's number; on cells a position a stream from which misses
        // nothing, which stays behind the events of transactions still running anywhere.
        if ServiceHarness.replicaCount > 1 {
            #expect(!Self.precedes(live, start), "\(live) from \(start)")
        } else {
            #expect(live == last)
        }
        // Nothing of it left, and nothing matched past it: ended all the same.
        let firstsLast = try #require(firstsEvents.last?.wireID)
        let empty = Stream.parse(try Stream(port: service.port, "/events?task=\(first)&since=\(firstsLast)&until=\(last)")
            .connection.readUntilClosed(timeout: 5))
        #expect(empty.events.isEmpty && empty.head.contains("200 OK"))
        #expect(try client.call("GET", "/events?until=x").status == 400)
    }

    /// An `until` not reached yet ends the stream when that event is published: a single
    /// server's next ids are known in advance, positions on cells are not.
    @Test(.numbersEventsAsOneServer) func anUntilAheadEndsTheStreamWhenItIsPublished() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        _ = try client.submit(#"{"kind":"noop","queue":"a"}"#)
        _ = try client.submit(#"{"kind":"noop","queue":"b"}"#) // events 5...8
        let ahead = try Stream(port: service.port, "/events?since=8&until=10")
        _ = ahead.head
        _ = try client.submit(#"{"kind":"noop"}"#)
        #expect(Stream.parse(try ahead.connection.readUntilClosed(timeout: 5)).events.map(\.id) == [9, 10])
    }

    /// A reader that stops reading is disconnected once its unsent bytes pass the limit; the
    /// server and the other readers go on.
    @Test func aReaderThatFallsBehindIsDisconnected() throws {
        let service = try ServiceHarness { $0.eventClientBufferBytes = 1 << 20 }
        defer { try? service.stop() }
        let client = try service.client()
        // The streams are this replica's, and so is its gauge.
        let here = try APIClient(port: service.port)
        let stalled = try RawClient(port: service.port)
        stalled.setReceiveBuffer(4_096)
        try stalled.send("GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        let reading = try Stream(port: service.port, "/events")
        _ = reading.head
        try pollUntil("both streams to be open") { try here.call("GET", "/metrics").text.contains("taskloop_event_streams 2") }
        // Workflows of 202 events of about 1.5 KB each (the metadata), until the kernel's buffers
        // are full and the stalled stream's queue passes 1 MiB; the reader that reads keeps up.
        let tasks = (0..<50).map { #"{"key":"k\#($0)","kind":"noop","metadata":{"pad":"\#(String(repeating: "x", count: 1_000))"}}"# }
        let body = #"{"tasks":["# + tasks.joined(separator: ",") + "]}"
        var sent = 0
        try pollUntil("the stalled reader to be dropped", timeout: 60) {
            let created = try client.call("POST", "/workflows", json: body)
            #expect(created.status == 201)
            sent += 1
            _ = try reading.waitForCount(sent * 202, timeout: 10) // 4 per task, 2 for the workflow
            return try here.call("GET", "/metrics").text.contains("taskloop_event_streams 1")
        }
        // The reader that reads goes on, every event whole: the bytes it shares with the
        // stalled stream (one filter) were never touched by that stream's partial writes.
        _ = try client.submit(#"{"kind":"noop"}"#)
        let events = try reading.waitFor(sent * 202 + 4)
        #expect(events.count == sent * 202 + 4)
        #expect(Self.rising(events) && events.allSatisfy { Self.seq($0) == $0.wireID })
    }

    /// Streams are written at most once per --event-write-interval-ms: what is published
    /// within the interval after a write goes out once it has passed, all of it, in order. A
    /// single server's streams (cells' follow the database's feed).
    @Test(.numbersEventsAsOneServer) func streamsAreWrittenAtMostOncePerInterval() throws {
        let service = try ServiceHarness { $0.eventWriteIntervalMilliseconds = 400 }
        defer { try? service.stop() }
        let client = try service.client()
        let stream = try Stream(port: service.port, "/events?types=task.state")
        _ = stream.head
        _ = try client.submit(#"{"kind":"noop"}"#)
        _ = try stream.waitForCount(1)
        let firstWrite = Date()
        _ = try client.submit(#"{"kind":"noop"}"#)
        _ = try stream.waitForCount(4)
        // The second task's events waited for the interval after the write of the first's.
        #expect(Date().timeIntervalSince(firstWrite) >= 0.25)
        let events = try stream.waitFor(6)
        #expect(events.count == 6 && Self.rising(events), "\(events.map(\.wireID))")
        #expect(try stream.connection.staysSilent(for: 0.5))
    }

    /// An HTTP/1.1 stream's events, out of its chunks (those complete so far).
    static func chunkedEvents(_ bytes: [UInt8]) -> [Stream.Event] {
        let crlf: [UInt8] = [13, 10]
        func find(_ needle: [UInt8], from start: Int) -> Int? {
            guard bytes.count >= needle.count else { return nil }
            return (start...(bytes.count - needle.count)).first { Array(bytes[$0..<($0 + needle.count)]) == needle }
        }
        guard let headEnd = find(crlf + crlf, from: 0) else { return [] }
        var at = headEnd + 4
        var body: [UInt8] = []
        while at < bytes.count, let lineEnd = find(crlf, from: at),
              let size = Int(String(decoding: bytes[at..<lineEnd], as: UTF8.self), radix: 16), size > 0,
              bytes.count >= lineEnd + 2 + size + 2 {
            body += bytes[(lineEnd + 2)..<(lineEnd + 2 + size)]
            at = lineEnd + 2 + size + 2
        }
        return Stream.parse(Array("HTTP/1.1 200 OK\r\n\r\n".utf8) + body).events
    }

    /// Streams with one filter share each turn's rendering; each, chunked (HTTP/1.1) or not,
    /// still gets every matching event once, in order, the same as the others, while streams
    /// with another filter get theirs.
    @Test func manyStreamsWithOneFilterEachGetEveryEventOnce() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let here = try APIClient(port: service.port)
        let plain = try (0..<12).map { _ in try Stream(port: service.port, "/events?types=task.state") }
        let chunked = try (0..<4).map { _ in
            let connection = try RawClient(port: service.port)
            try connection.send("GET /events?types=task.state HTTP/1.1\r\nHost: localhost\r\n\r\n")
            return connection
        }
        let everything = try (0..<4).map { _ in try Stream(port: service.port, "/events") }
        try pollUntil("every stream to be open") { try here.call("GET", "/metrics").text.contains("taskloop_event_streams 20") }
        for _ in 0..<20 { _ = try client.submit(#"{"kind":"noop"}"#) }
        let task = try #require(try client.submit(#"{"kind":"noop"}"#)["id"] as? String)
        _ = try client.waitForState(task, "succeeded")
        // 21 tasks: queued, running, succeeded each; and task.created too for the unfiltered.
        let expected = try plain[0].waitFor(63)
        #expect(expected.count == 63 && Self.rising(expected) && expected.allSatisfy { $0.type == "task.state" })
        #expect(Set(expected.compactMap(\.wireID)).count == 63)
        for stream in plain.dropFirst() {
            #expect(try stream.waitFor(63).map(\.wireID) == expected.map(\.wireID))
        }
        for connection in chunked {
            let events = Self.chunkedEvents(try connection.readUntil(timeout: 10) { Self.chunkedEvents($0).count >= 63 })
            #expect(events.map(\.wireID) == expected.map(\.wireID))
            #expect(events.allSatisfy { Self.seq($0) == $0.wireID })
        }
        for stream in everything {
            let events = try stream.waitFor(84)
            #expect(events.count == 84 && Self.rising(events))
            #expect(events.filter { $0.type == "task.state" }.map(\.wireID) == expected.map(\.wireID))
        }
        // Nothing more, nothing twice.
        #expect(try plain[0].connection.staysSilent(for: 0.3))
        #expect(try plain.last!.waitFor(63).count == 63)
    }
}

/// Streams with one filter share each turn's rendering (`SharedFrames`) and are written from
/// those same bytes; nothing that happens to one of them changes what the others get.
@Suite struct SharedEventStreamTests {
    typealias Stream = EventStreamTests.Stream

    /// A stream opened between turns or within one: what it asked for, where its live part
    /// starts (its head's Event-Seq), and how it leaves.
    struct Joiner {
        let connection: RawClient
        /// HTTP/1.1: its events come in chunks.
        let chunked: Bool
        let types: Set<String>?
        let queue: String?
        let resets: Bool
        let leavesAt: Int
        var start = ""

        /// Its query: the types, and a queue when it has one.
        static func query(_ types: Set<String>?, _ queue: String?) -> String {
            var query = types.map { "types=" + $0.sorted().joined(separator: ",") } ?? ""
            if let queue { query += (query.isEmpty ? "" : "&") + "queue=\(queue)" }
            return query
        }

        func wants(_ event: Stream.Event) -> Bool {
            if let types, !types.contains(event.type) { return false }
            if let queue, (event.data["task"] as? [String: Any])?["queue"] as? String != queue { return false }
            return true
        }

        func events(_ bytes: [UInt8]) -> [Stream.Event] {
            chunked ? EventStreamTests.chunkedEvents(bytes) : Stream.parse(bytes).events
        }

        mutating func readHead() throws {
            let head = Stream.parse(try connection.readUntil { Stream.parse($0).head != "" }).head
            let field = try #require(head.split(separator: "\r\n").first { $0.hasPrefix("Event-Seq: ") })
            start = String(field.dropFirst("Event-Seq: ".count))
        }
    }

    /// Over many turns, six readers of task.state (HTTP/1.0 and chunked) each get every event
    /// once and in order while, with the same filter, one reads slowly (chunked: the server
    /// writes each chunk to it in pieces and queues the rest), one stops reading until it is
    /// disconnected for passing --event-client-buffer-bytes and then resumes once with
    /// Last-Event-ID, and streams of this filter and of others join and leave: between turns,
    /// while a turn's tasks run, and within the turn that publishes a submission's events (asked
    /// for behind it on its connection, so it starts right after its answer, whose events go
    /// out first). Each joiner gets exactly the matching events after its Event-Seq; only the
    /// stalled stream is ever disconnected.
    @Test func everyStreamOfAFilterGetsEveryEventOnceWhateverTheOthersDo() throws {
        let service = try ServiceHarness { $0.eventClientBufferBytes = 1 << 17 }
        defer { try? service.stop() }
        let client = try service.client()
        // The streams are this replica's, and so are its metrics.
        func disconnected() throws -> Int {
            try service.metric("taskloop_event_streams_disconnected_total", replica: service.port).map { Int($0) } ?? -1
        }
        let filter = "/events?types=task.state"
        let readers = try (0..<5).map { _ in try Stream(port: service.port, filter) }
        let chunked = try RawClient(port: service.port)
        try chunked.send("GET \(filter) HTTP/1.1\r\nHost: localhost\r\n\r\n")
        let slow = try RawClient(port: service.port, narrow: true)
        try slow.send("GET \(filter) HTTP/1.1\r\nHost: localhost\r\n\r\n")
        let stalled = try Stream(port: service.port, filter, narrow: true)
        let everything = try Stream(port: service.port, "/events")
        try pollUntil("every stream to be open") { try service.metric("taskloop_event_streams", replica: service.port) == 9 }

        // Each turn's workflow: 8 tasks, 34 events of about 1 KB, 24 of them task.state. The
        // server's kernel takes about 50 KB of a narrow stream's: the stalled one's own queue
        // passes 128 KiB within ten turns.
        let pad = String(repeating: "p", count: 500)
        let kinds: [Set<String>?] = [["task.state"], ["task.created"], ["workflow.state"], ["task.state", "task.created"], nil]
        var joiners: [Joiner] = []
        var resumed: Stream?
        var stalledEvents: [Stream.Event] = []
        var cutAt: Int?
        var all: [Stream.Event] = []
        var step = 0
        while cutAt.map({ step < $0 + 4 }) ?? true {
            #expect(step < 30, "the stalled stream was never disconnected")
            guard step < 30 else { return }
            let queue = "q\(step % 3)"
            var joining: [Joiner] = []
            func join(_ offset: Int, chunked: Bool = false) throws -> Joiner {
                let types = kinds[(3 * step + offset) % kinds.count]
                let joiner = Joiner(connection: try RawClient(port: service.port), chunked: chunked, types: types,
                                    queue: offset == 1 && step % 2 == 0 ? queue : nil, resets: (step + offset) % 2 == 0,
                                    leavesAt: step + 2)
                joining.append(joiner)
                return joiner
            }
            func request(_ joiner: Joiner) -> String {
                "GET /events?\(Joiner.query(joiner.types, joiner.queue)) HTTP/1.\(joiner.chunked ? 1 : 0)\r\nHost: localhost\r\n\r\n"
            }
            let before = try join(0)
            try before.connection.send(request(before))
            // The submission, and a stream behind it on its connection.
            let tasks = (0..<8).map { #"{"key":"k\#($0)","kind":"noop","queue":"\#(queue)","metadata":{"pad":"\#(pad)"}}"# }
            let body = Array((#"{"tasks":["# + tasks.joined(separator: ",") + "]}").utf8)
            let behind = try join(2, chunked: true)
            try behind.connection.send(Array("POST /workflows HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: \(body.count)\r\n\r\n".utf8)
                + body + Array(request(behind).utf8))
            let created = try behind.connection.readResponse()
            #expect(created.status == 201)
            let workflow = try #require(created.json["id"] as? String)
            let after = try join(1)
            try after.connection.send(request(after))
            for joiner in joiners where joiner.leavesAt == step && joiner.resets { joiner.connection.resetOnClose() }
            joiners.removeAll { $0.leavesAt == step }
            for var joiner in joining {
                try joiner.readHead()
                joiners.append(joiner)
            }
            // The workflow's end is its turn's last event: nothing more is published until the next.
            all = try everything.waitFor(34 * (step + 1), timeout: 10)
            let end = all.last?.data["workflow"] as? [String: Any]
            #expect(all.count == 34 * (step + 1) && end?["id"] as? String == workflow && end?["state"] as? String == "succeeded")
            let expected = all.filter { $0.type == "task.state" }.compactMap(\.wireID)
            for reader in readers { _ = try reader.waitForCount(expected.count, timeout: 10) }
            _ = try resumed?.waitForCount(expected.count - stalledEvents.count, timeout: 10)
            _ = try chunked.readUntil(timeout: 10) { EventStreamTests.chunkedEvents($0).count >= expected.count }
            // The slow reader takes everything every third turn: in between, about 70 KB pile
            // up, more than its kernel takes, so the server writes to it in pieces and queues
            // the rest, never near the limit.
            if step % 3 == 2 { _ = try slow.readUntil(timeout: 10) { EventStreamTests.chunkedEvents($0).count >= expected.count } }
            for joiner in joiners {
                let wanted = all.filter { joiner.wants($0) && EventStreamTests.precedes(joiner.start, $0.wireID ?? "") }.compactMap(\.wireID)
                let got = joiner.events(try joiner.connection.readUntil(timeout: 10) { joiner.events($0).count >= wanted.count })
                #expect(got.compactMap(\.wireID) == wanted,
                        "a stream of \(Joiner.query(joiner.types, joiner.queue)) from \(joiner.start)\(joiner.chunked ? ", chunked" : "")")
            }
            if cutAt == nil, try disconnected() == 1 {
                cutAt = step
                // What it received whole, then from the last of those on.
                stalledEvents = Stream.parse(try stalled.connection.readUntilClosed(timeout: 10)).events
                #expect(!stalledEvents.isEmpty)
                let last = try #require(stalledEvents.last?.wireID)
                resumed = try Stream(port: service.port, filter, headers: ["Last-Event-ID": last])
            }
            step += 1
        }
        let expected = all.filter { $0.type == "task.state" }.compactMap(\.wireID)
        #expect(Set(expected).count == expected.count && expected.count == 24 * step, "\(expected.count) task.state events")
        for reader in readers {
            #expect(try reader.waitFor(expected.count).compactMap(\.wireID) == expected)
        }
        #expect(EventStreamTests.chunkedEvents(try chunked.readUntil { _ in true }).compactMap(\.wireID) == expected)
        let slowEvents = EventStreamTests.chunkedEvents(try slow.readUntil(timeout: 10) { EventStreamTests.chunkedEvents($0).count >= expected.count })
        #expect(slowEvents.compactMap(\.wireID) == expected)
        // Cut off once, resumed once: nothing missing, nothing twice.
        let rest = try #require(resumed).waitFor(expected.count - stalledEvents.count, timeout: 10)
        #expect((stalledEvents + rest).compactMap(\.wireID) == expected)
        #expect(try disconnected() == 1, "only the stalled stream fell behind")
        #expect(try readers[0].connection.staysSilent(for: 0.2))
    }
}

/// Events wait for their change to be durable: while the disk refuses a batch, its events are
/// not sent; once the rewrite commits, they are, in order.
@Suite struct EventDurabilityTests {
    @Test func eventsOfAChangeTheDiskRefusedWaitForItsCommit() throws {
        let service = try ServiceHarness { $0.durability = .normal }
        defer { try? service.stop() }
        let client = try service.client()
        let stream = try EventStreamTests.Stream(port: service.port, "/events?types=task.created")
        _ = try client.submit(#"{"kind":"noop","name":"before"}"#)
        #expect(try stream.waitFor(1).count == 1)
        service.onLoop { application in (application.sqlite?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: 0) }
        let big = String(repeating: "x", count: 200_000)
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop","name":"big","metadata":{"blob":"\#(big)"}}"#).status == 503)
        #expect(try stream.connection.staysSilent(for: 0.5), "no event for a change that is not on disk")
        service.onLoop { application in (application.sqlite?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: nil) }
        let events = try stream.waitFor(2, timeout: 10)
        #expect((events[1].data["task"] as? [String: Any])?["name"] as? String == "big")
        #expect(events.map(\.id) == [events[0].id, events[0].id.map { $0 + 4 }], "numbered when it happened, in order")
    }
}

/// Event numbers survive restarts: a stream resumed from before one gets `reset`, never an old
/// number again.
@Suite(.serialized) struct EventRestartTests {
    @Test func numbersGoOnAfterARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func start() throws -> (BinaryTests.RunningBinary, APIClient, Int) {
            let binary = try BinaryTests.RunningBinary(arguments: ["--port", "0", "--durability", "full", "--data-dir", directory])
            let port = try #require(BinaryTests.port(from: try binary.waitForLine(containing: "listening on")))
            return (binary, try APIClient(port: port), port)
        }
        var (binary, client, port) = try start()
        _ = try client.submit(#"{"kind":"noop"}"#)
        let before = try #require(try client.call("GET", "/tasks").header("Event-Seq").flatMap { UInt64($0) })
        #expect(before == 4)
        kill(binary.process.processIdentifier, SIGKILL)
        _ = try binary.waitForExit()
        (binary, client, port) = try start()
        let stream = try EventStreamTests.Stream(port: port, "/events", headers: ["Last-Event-ID": "2"])
        _ = try client.submit(#"{"kind":"noop"}"#)
        let events = try stream.waitFor(5)
        #expect(events[0].type == "reset")
        #expect(events[1].id == 5)
        #expect(try binary.stop() == 0)
    }
}
