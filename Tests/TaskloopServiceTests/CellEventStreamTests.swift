import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

/// Event streams on cells: any replica streams every cell's events in one order, with opaque
/// ids a stream resumes from on any replica, each later event once.
extension CellServiceTests {
    typealias Stream = EventStreamTests.Stream

    /// A queue whose cell `service` owns.
    static func queue(ownedBy service: ServiceHarness, _ prefix: String) -> String {
        service.onLoop { application in
            let host = application.cellHost!
            return (0...).lazy.map { "\(prefix)\($0)" }.first { name in
                if case .here = host.placement(of: host.cell(ofQueue: name)) { return true }
                return false
            }!
        }
    }

    static func taskID(_ event: Stream.Event) -> String? { (event.data["task"] as? [String: Any])?["id"] as? String }

    /// The stream's view of one task: its events' types and states, in the stream's order.
    static func history(of id: String, in events: [Stream.Event]) -> [String] {
        EventStreamTests.states(events.filter { taskID($0) == id })
    }

    static func ended(_ ids: [String], in events: [Stream.Event]) -> Bool {
        let ended = Set(events.filter { EventStreamTests.states([$0]) == ["task.state:succeeded"] }.compactMap(taskID))
        return ids.allSatisfy(ended.contains)
    }

    /// One order: ids are unique, rising (fixed-width text), and the data's `seq` is the id.
    static func expectOneOrder(_ events: [Stream.Event], sourceLocation: SourceLocation = #_sourceLocation) {
        let ids = events.compactMap(\.wireID)
        #expect(ids.count == events.count && ids.allSatisfy { $0.count == 24 }, sourceLocation: sourceLocation)
        #expect(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 }, "\(ids)", sourceLocation: sourceLocation)
        #expect(events.allSatisfy { $0.data["seq"] as? String == $0.wireID }, sourceLocation: sourceLocation)
    }

    static let noopHistory = ["task.created:pending", "task.state:queued", "task.state:running", "task.state:succeeded"]

    @Test func aStreamOnAnyReplicaFollowsEveryCellAndResumesOnAnotherExactlyOnce() throws {
        let replicas = try Self.startCellReplicas("e0", "e1").replicas
        let (first, second) = (replicas[0], replicas[1])
        let client = try APIClient(ports: [first.port, second.port])
        let mine = Self.queue(ownedBy: first, "ea"), theirs = Self.queue(ownedBy: second, "eb")
        let stream = try Stream(port: first.port, "/events")
        let head = stream.head
        #expect(head.contains("200 OK") && head.contains("Content-Type: text/event-stream"), "\(head)")
        let onlyTheirs = try Stream(port: first.port, "/events?queue=\(theirs)&types=task.state")
        var ids: [String] = []
        for queue in [mine, theirs, mine, theirs] {
            ids.append(try #require(try client.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String))
        }
        let events = try stream.waitUntil { Self.ended(ids, in: $0) }
        for id in ids { #expect(Self.history(of: id, in: events) == Self.noopHistory, "\(id)") }
        Self.expectOneOrder(events)
        let filtered = try onlyTheirs.waitUntil { Self.ended([ids[1], ids[3]], in: $0) }
        #expect(filtered.allSatisfy { $0.type == "task.state" && ($0.data["task"] as? [String: Any])?["queue"] as? String == theirs })
        #expect(Self.history(of: ids[1], in: filtered) == Array(Self.noopHistory.dropFirst()))

        // Gone, then back on the other replica from the last event it had: what it missed, once.
        let last = try #require(events.last?.wireID)
        var later: [String] = []
        for queue in [theirs, mine, theirs] {
            later.append(try #require(try client.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String))
        }
        for id in later { _ = try client.waitForState(id, "succeeded") }
        let resumed = try Stream(port: second.port, "/events", headers: ["Last-Event-ID": last])
        let missed = try resumed.waitUntil { Self.ended(later, in: $0) }
        Self.expectOneOrder(missed)
        #expect(missed.allSatisfy { $0.wireID! > last })
        #expect(Set(missed.compactMap(Self.taskID)) == Set(later))
        for id in later { #expect(Self.history(of: id, in: missed) == Self.noopHistory, "\(id)") }
        // The same events in the same order from the first replica, by `since`.
        let again = try Stream(port: first.port, "/events?since=\(last)")
        let same = try again.waitUntil { $0.count >= missed.count }
        #expect(same.prefix(missed.count).map(\.wireID) == missed.map(\.wireID))

        let malformed = try client.call("GET", "/events", headers: ["Last-Event-ID": "12"])
        #expect(malformed.status == 400 && malformed.header("Content-Type")?.hasPrefix("application/problem+json") == true)
        #expect(try client.call("GET", "/events?since=zz").status == 400)
        #expect(try client.call("GET", "/events?until=1").status == 400)
        #expect(try client.call("GET", "/events?types=nope").status == 400)
        try second.stop()
        try first.stop()
    }

    /// While a third replica joins, takes cells, and leaves again: a stream on a replica that
    /// stays sees every task through; one on the joining replica ends as it leaves, and its
    /// reader resumes on another replica; both see exactly the same events.
    @Test func resumesStayExactlyOnceWhileCellsMove() throws {
        let (url, replicas) = try Self.startCellReplicas("m0", "m1")
        let (first, second) = (replicas[0], replicas[1])
        let client = try APIClient(ports: [first.port, second.port])
        let stream = try Stream(port: first.port, "/events")
        _ = stream.head
        var ids: [String] = []
        func submit(_ count: Int) throws {
            for _ in 0..<count {
                let queue = "m\(ids.count % 12)"
                ids.append(try #require(try client.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String))
            }
        }
        try submit(12)
        let start = try #require(try stream.waitUntil { Self.ended(ids, in: $0) }.last?.wireID)
        let third = try Self.cellReplica(url, name: "m2")
        let onThird = try Stream(port: third.port, "/events", headers: ["Last-Event-ID": start])
        _ = onThird.head
        try submit(24)
        try Self.waitForEveryCell([first, second, third])
        try submit(24)
        try third.stop()
        try submit(24)
        let everything = try stream.waitUntil(timeout: 30) { Self.ended(ids, in: $0) }
        Self.expectOneOrder(everything)
        for id in ids {
            let history = Self.history(of: id, in: everything)
            #expect(history.first == "task.created:pending" && history.last == "task.state:succeeded"
                    && history.filter { $0 == "task.state:succeeded" }.count == 1, "\(id): \(history)")
        }
        // What the third replica sent before it stopped, then the rest from another replica.
        let before = Stream.parse(try onThird.connection.readUntilClosed(timeout: 10)).events
        let resumeFrom = before.last?.wireID ?? start
        let rest = try Stream(port: second.port, "/events", headers: ["Last-Event-ID": resumeFrom])
        let after = try rest.waitUntil(timeout: 30) { $0.last?.wireID ?? "" >= everything.last!.wireID! }
        let expected = everything.filter { $0.wireID! > start }.map(\.wireID)
        #expect(!(before + after).contains { $0.type == "reset" }, "\((before + after).filter { $0.type == "reset" }.map(\.data))")
        #expect((before + after).filter { ($0.wireID ?? "") <= everything.last!.wireID! }.map(\.wireID) == expected)
        try second.stop()
        try first.stop()
    }

    /// `GET /tasks/{id}/events` for a task of another replica's cell ends with the task's end;
    /// lists' `Event-Seq` is a position to stream from; filters by task and workflow.
    @Test func aTaskStreamOfAnotherReplicasCellEndsWithTheTask() throws {
        let replicas = try Self.startCellReplicas("t0", "t1").replicas
        let (first, second) = (replicas[0], replicas[1])
        let client = try APIClient(ports: [first.port, second.port])
        let theirs = Self.queue(ownedBy: second, "tb")
        let listed = try client.call("GET", "/tasks?limit=1")
        let seq = try #require(listed.header("Event-Seq"))
        let id = try #require(try client.submit(#"{"kind":"sleep","params":{"duration_ms":500},"queue":"\#(theirs)"}"#)["id"] as? String)
        let ownStream = try Stream(port: first.port, "/tasks/\(id)/events")
        let whole = Stream.parse(try ownStream.connection.readUntilClosed(timeout: 10)).events
        #expect(whole.first?.type == "task.snapshot" && (whole.first?.data["seq"] as? String)?.count == 24, "\(whole)")
        #expect(EventStreamTests.states(whole).last == "task.state:succeeded", "\(EventStreamTests.states(whole))")
        #expect(whole.dropFirst().allSatisfy { Self.taskID($0) == id })
        // Ended already: the snapshot, and the end of the stream.
        let ended = Stream.parse(try Stream(port: first.port, "/tasks/\(id)/events").connection.readUntilClosed(timeout: 10)).events
        #expect(EventStreamTests.states(ended) == ["task.snapshot:succeeded"])
        #expect(try client.call("GET", "/tasks/01ZZZZZZZZZZZZZZZZZZZZZZZZ/events").status == 404)
        // From the list's position: the task from its creation.
        let fromList = try Stream(port: second.port, "/events?task=\(id)&since=\(seq)")
        #expect(EventStreamTests.states(try fromList.waitUntil { Self.ended([id], in: $0) }).first == "task.created:pending")

        let workflowStream = try Stream(port: first.port, "/events?types=workflow.state,task.state")
        _ = workflowStream.head
        let workflow = try client.call("POST", "/workflows", json: #"{"tasks":[{"key":"a","kind":"noop","queue":"\#(theirs)"}]}"#)
        let workflowID = try #require(workflow.json["id"] as? String)
        let read = try client.call("GET", "/workflows/\(workflowID)")
        #expect(read.header("Event-Seq")?.count == 24)
        let byWorkflow = try Stream(port: second.port, "/events?workflow=\(workflowID)&since=\(seq)")
        let workflowEvents = try byWorkflow.waitUntil { EventStreamTests.states($0).last == "workflow.state:succeeded" }
        #expect(workflowEvents.allSatisfy { $0.type.hasPrefix("task.") || $0.type == "workflow.state" })
        #expect(EventStreamTests.states(workflowEvents).filter { $0.hasPrefix("workflow.") }
                == ["workflow.state:running", "workflow.state:succeeded"])
        let typed = try workflowStream.waitUntil { EventStreamTests.states($0).last == "workflow.state:succeeded" }
        #expect(typed.allSatisfy { $0.type == "task.state" || $0.type == "workflow.state" })
        try second.stop()
        try first.stop()
    }

    /// A resume from before the oldest event the history keeps starts with `reset`, then goes
    /// on from the oldest kept, as a single server's does; `since=0` is before every event.
    @Test func aResumeFromBeforeTheHistoryStartsWithReset() throws {
        let cluster = try PostgresCluster.shared()
        let (url, replicas) = try Self.startCellReplicas("r0")
        let service = replicas[0]
        let client = try service.client()
        var ids: [String] = []
        for index in 0..<3 { ids.append(try #require(try client.submit(#"{"kind":"noop","queue":"r\#(index)"}"#)["id"] as? String)) }
        let beginning = String(repeating: "0", count: 24)
        let all = try Stream(port: service.port, "/events?since=\(beginning)").waitUntil { Self.ended(ids, in: $0) }
        #expect(all.first?.type != "reset" && all.count >= 12)
        // `0`, as on a single server: before every event (the dashboard's task history asks so).
        let fromZero = try Stream(port: service.port, "/events?since=0").waitUntil { $0.count >= all.count }
        #expect(fromZero.prefix(all.count).map(\.wireID) == all.map(\.wireID))
        // Dropped from the history as `--event-history-seconds` would drop them.
        try cluster.sql("DELETE FROM taskloop.cell_events WHERE (transaction, index) IN "
                        + "(SELECT transaction, index FROM taskloop.cell_events ORDER BY transaction, index LIMIT 3)", database: url)
        // From one of those: what came after it may be gone too.
        for since in [all[0].wireID!, all[2].wireID!] {
            let resumed = try Stream(port: service.port, "/events", headers: ["Last-Event-ID": since])
                .waitUntil { $0.count >= all.count - 2 }
            #expect(resumed.first?.type == "reset" && resumed.first?.data["oldest"] as? String == all[3].wireID)
            #expect(resumed.dropFirst().prefix(all.count - 3).map(\.wireID) == all.dropFirst(3).map(\.wireID))
        }
        let kept = try Stream(port: service.port, "/events?since=\(all[3].wireID!)").waitUntil { $0.count >= all.count - 4 }
        #expect(kept.prefix(all.count - 4).map(\.wireID) == all.dropFirst(4).map(\.wireID))
        try service.stop()
    }
}

extension CellServiceTests {
    /// A workflow ends when a member in another cell reports its end to the workflow's home:
    /// the home announces that as it announces its own members' changes.
    @Test func aWorkflowEndedByAMemberOfAnotherCellIsAnnounced() throws {
        let service = try Self.startCellReplicas("h0").replicas[0]
        let client = try service.client()
        let (home, member) = Self.queuesOfTwoCells(service)
        let workflows = try Stream(port: service.port, "/events?types=workflow.state")
        _ = workflows.head
        let submitted = try client.call("POST", "/workflows", json: """
            {"tasks":[{"key":"a","kind":"noop","queue":"\(home)"},
             {"key":"b","kind":"sleep","params":{"duration_ms":200},"queue":"\(member)","dependencies":["a"]}]}
            """)
        let id = try #require(submitted.json["id"] as? String)
        let events = try workflows.waitUntil { EventStreamTests.states($0).contains("workflow.state:succeeded") }
        #expect(EventStreamTests.states(events) == ["workflow.state:running", "workflow.state:succeeded"])
        #expect(events.allSatisfy { ($0.data["workflow"] as? [String: Any])?["id"] as? String == id })
        try service.stop()
    }

    /// `?workflow=` selects the events of every member, those of other cells too (whose cells
    /// hold no record of the workflow, only the home does).
    @Test func aWorkflowsStreamHasTheEventsOfItsMembersInEveryCell() throws {
        let service = try Self.startCellReplicas("w0").replicas[0]
        let client = try service.client()
        let (home, other) = Self.queuesOfTwoCells(service)
        let start = try #require(try client.call("GET", "/tasks?limit=1").header("Event-Seq"))
        let submitted = try client.call("POST", "/workflows", json: """
            {"tasks":[{"key":"a","kind":"noop","queue":"\(home)"},{"key":"b","kind":"noop","queue":"\(other)","dependencies":["a"]}]}
            """)
        let id = try #require(submitted.json["id"] as? String)
        let keys = try #require(submitted.json["keys"] as? [String: String])
        let members = try ["a", "b"].map { try #require(keys[$0]) }
        let events = try Stream(port: service.port, "/events?workflow=\(id)&since=\(start)")
            .waitUntil { EventStreamTests.states($0).contains("workflow.state:succeeded") }
        for member in members { #expect(Self.history(of: member, in: events) == Self.noopHistory, "\(member)") }
        try service.stop()
    }
}

extension CellServiceTests {
    /// The history is kept by time (`--event-history-seconds`): older events are dropped, and
    /// a resume from one of them starts with `reset`.
    @Test func theHistoryIsKeptByTime() throws {
        let cluster = try PostgresCluster.shared()
        let (url, replicas) = try Self.startCellReplicas("k0") { $0.eventHistoryMilliseconds = 3_000 }
        let service = replicas[0]
        let client = try service.client()
        let first = try #require(try client.submit(#"{"kind":"noop","queue":"k"}"#)["id"] as? String)
        let early = try Stream(port: service.port, "/events?since=\(String(repeating: "0", count: 24))")
            .waitUntil { Self.ended([first], in: $0) }
        try pollUntil("the history past its time to be dropped", timeout: 20) {
            try cluster.sql("SELECT count(*) FROM taskloop.cell_events", database: url).trimmingCharacters(in: .whitespacesAndNewlines) == "0"
        }
        let second = try #require(try client.submit(#"{"kind":"noop","queue":"k"}"#)["id"] as? String)
        let resumed = try Stream(port: service.port, "/events", headers: ["Last-Event-ID": try #require(early.first?.wireID)])
            .waitUntil { Self.ended([second], in: $0) }
        #expect(resumed.first?.type == "reset" && resumed.first?.data["oldest"] as? String == resumed.dropFirst().first?.wireID)
        #expect(Self.history(of: second, in: resumed) == Self.noopHistory)
        try service.stop()
    }
}

extension CellServiceTests {
    /// A replica's feed of the cluster's events reads only while a stream is open there: none
    /// before the first, none after the last has gone; a stream opened then has what was
    /// committed after it opened, and nothing committed while the feed rested.
    @Test func theFeedReadsOnlyWhileAStreamIsOpen() throws {
        let service = try Self.startCellReplicas("z0").replicas[0]
        let client = try service.client()
        func feed() -> (following: Bool, reads: Int) {
            service.onLoop { application in
                let streams = application.clusterStreams!
                return (streams.feedIsFollowing, streams.feedReadsSent)
            }
        }
        func submitAndWait() throws -> String {
            let id = try #require(try client.submit(#"{"kind":"noop","queue":"z"}"#)["id"] as? String)
            _ = try client.waitForState(id, "succeeded")
            return id
        }
        let before = try submitAndWait()
        #expect(!feed().following)
        #expect(feed().reads == 0, "no stream yet: no reads")

        let first = try Stream(port: service.port, "/events")
        #expect(first.head.contains("200 OK"))
        let during = try submitAndWait()
        let seen = try first.waitUntil { Self.ended([during], in: $0) }
        #expect(Self.history(of: during, in: seen) == Self.noopHistory)
        #expect(!seen.contains { Self.taskID($0) == before })
        #expect(feed().reads > 0)

        first.connection.shutdownWrite()
        try service.waitUntil("the feed to rest once its last stream has gone") { !$0.clusterStreams!.feedIsFollowing }
        let resting = feed().reads
        let whileResting = try submitAndWait()
        #expect(!feed().following)
        #expect(feed().reads == resting, "no reads while no stream is open")

        // Two streams at once: both wait for the one resume.
        let second = try Stream(port: service.port, "/events"), third = try Stream(port: service.port, "/events?types=task.state")
        #expect(second.head.contains("200 OK") && third.head.contains("200 OK"))
        let after = try submitAndWait()
        let resumed = try second.waitUntil { Self.ended([after], in: $0) }
        #expect(Self.history(of: after, in: resumed) == Self.noopHistory)
        #expect(!resumed.contains { Self.taskID($0) == whileResting || Self.taskID($0) == during })
        Self.expectOneOrder(resumed)
        let states = try third.waitUntil { Self.ended([after], in: $0) }
        #expect(states.map(\.wireID) == resumed.filter { $0.type == "task.state" }.map(\.wireID))
        try service.stop()
    }

    /// Committers announce their events only while some replica follows them, and a replica
    /// whose stream opens is followed at once: with the feeds' polls an hour apart, a stream on
    /// one replica gets the events of the other's cells by notifications alone.
    @Test func aStreamIsWokenByTheOtherReplicasCommits() throws {
        let (_, replicas) = try Self.startCellReplicas("n0", "n1") { $0.sharedDatabase!.eventPollMilliseconds = 3_600_000 }
        let queue = Self.queue(ownedBy: replicas[0], "na")
        try replicas[0].waitUntil("the renewals to find no follower") { !$0.cellHost!.keeper.eventsFollowed }
        let stream = try Stream(port: replicas[1].port, "/events")
        #expect(stream.head.contains("200 OK"))
        try replicas[0].waitUntil("n0 to learn that n1 follows") { $0.cellHost!.keeper.eventsFollowed }
        let id = try #require(try replicas[0].client().submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String)
        let seen = try stream.waitUntil { Self.ended([id], in: $0) }
        #expect(Self.history(of: id, in: seen) == Self.noopHistory)
        stream.connection.shutdownWrite()
        try replicas[0].waitUntil("n1's renewal to say it follows no more", timeout: 20) { !$0.cellHost!.keeper.eventsFollowed }
        for replica in replicas { try replica.stop() }
    }

    /// A stream that finds the feed at rest waits a moment for it to follow again: while the
    /// cluster's events cannot be read, it is 503 `database_unavailable` after that moment, and
    /// a stream once they can be read is served from where they then stand.
    @Test func aStreamIs503WhileTheRestingFeedCannotStartAgain() throws {
        let cluster = try PostgresCluster.shared()
        let (url, replicas) = try Self.startCellReplicas("w0")
        let service = replicas[0]
        let client = try service.client()
        let lock = try CellRowLock(locking: "LOCK TABLE taskloop.cell_events IN ACCESS EXCLUSIVE MODE", url: url)
        try pollUntil("the events to be locked") {
            try cluster.sql("""
                SELECT count(*) FROM pg_locks JOIN pg_class ON pg_class.oid = relation
                WHERE relname = 'cell_events' AND mode = 'AccessExclusiveLock' AND granted
                """, database: url).trimmingCharacters(in: .whitespacesAndNewlines) == "1"
        }
        let refused = try client.call("GET", "/events")
        #expect(refused.status == 503 && refused.header("Content-Type")?.hasPrefix("application/problem+json") == true)
        #expect(refused.json["code"] as? String == "database_unavailable")
        try lock.release()

        let stream = try Stream(port: service.port, "/events")
        #expect(stream.head.contains("200 OK"))
        let id = try #require(try client.submit(#"{"kind":"noop","queue":"w"}"#)["id"] as? String)
        let events = try stream.waitUntil { Self.ended([id], in: $0) }
        #expect(Self.history(of: id, in: events) == Self.noopHistory)
        try service.stop()
    }
}
