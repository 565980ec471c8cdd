import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

/// `unique_key` and `unique_for_ms` over real sockets: a duplicate is 409 `duplicate_task`
/// naming the task that holds the key, and creates nothing; the keys survive a restart and a
/// cell's move to another replica.
@Suite struct UniqueTaskAPITests {
    /// How many tasks `queue` lists (one page is enough for these tests).
    static func count(_ client: APIClient, queue: String) throws -> Int {
        let tasks = try client.call("GET", "/tasks?queue=\(queue)&limit=100").json["tasks"] as? [Any]
        return try #require(tasks).count
    }

    /// Checks that `response` is the 409 of a duplicate of `existing`, naming `field`.
    static func expectDuplicate(_ response: RawResponse, of existing: String, field: String = "unique_key",
                                sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(response.status == 409, "\(response.text)", sourceLocation: sourceLocation)
        #expect(response.header("Content-Type") == "application/problem+json", sourceLocation: sourceLocation)
        #expect(response.json["code"] as? String == "duplicate_task", sourceLocation: sourceLocation)
        #expect(response.json["existing_id"] as? String == existing, sourceLocation: sourceLocation)
        let errors = response.json["errors"] as? [[String: Any]]
        #expect(errors?.first?["field"] as? String == field, sourceLocation: sourceLocation)
    }

    @Test func aDuplicateIs409NamingTheHolderAndCreatesNothing() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let first = try client.submit(#"{"kind":"external","queue":"uq","unique_key":"invoice-7"}"#)
        let firstID = try #require(first["id"] as? String)
        #expect(first["unique_key"] as? String == "invoice-7" && first["unique_for_ms"] is NSNull)
        let before = try Self.count(client, queue: "uq")
        let again = try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"uq","unique_key":"invoice-7"}"#)
        Self.expectDuplicate(again, of: firstID)
        #expect(try Self.count(client, queue: "uq") == before)
        // Another queue's key of the same name is another key.
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"uq2","unique_key":"invoice-7"}"#).status == 201)

        // Finished, it holds the key only for a submission whose window reaches its end.
        #expect(try client.call("POST", "/tasks/\(firstID)/complete", json: "{}").status == 200)
        let windowed = try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"uq","unique_key":"invoice-7","unique_for_ms":600000}"#)
        Self.expectDuplicate(windowed, of: firstID)
        #expect(try Self.count(client, queue: "uq") == before)
        // Without a window of its own, a submission is refused by an unfinished task only.
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"uq","unique_key":"invoice-7"}"#).status == 201)
        let shown = try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"uq","unique_key":"invoice-8","unique_for_ms":1}"#)
        #expect(shown.status == 201 && shown.json["unique_for_ms"] as? Int == 1)
    }

    @Test func aWorkflowWithAHeldOrRepeatedKeyIsRefusedWhole() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let holder = try #require(try client.submit(#"{"kind":"external","queue":"wq","unique_key":"k"}"#)["id"] as? String)
        let before = try Self.count(client, queue: "wq")
        let held = try client.call("POST", "/workflows", json: #"""
            {"tasks":[{"key":"a","kind":"noop","queue":"wq"},{"key":"b","kind":"noop","queue":"wq","unique_key":"k","dependencies":["a"]}]}
            """#)
        Self.expectDuplicate(held, of: holder, field: "tasks[1].unique_key")
        let repeated = try client.call("POST", "/workflows", json: #"""
            {"tasks":[{"key":"a","kind":"noop","queue":"wq","unique_key":"twice"},{"key":"b","kind":"noop","queue":"wq","unique_key":"twice"}]}
            """#)
        #expect(repeated.status == 409 && repeated.json["code"] as? String == "duplicate_task")
        #expect((repeated.json["errors"] as? [[String: Any]])?.first?["field"] as? String == "tasks[1].unique_key")
        #expect(try Self.count(client, queue: "wq") == before)
    }

    /// A replay answers what the first request created (201, `Idempotent-Replayed`), though the
    /// task it created holds the key; the same body without the header is a duplicate.
    @Test func aReplayedIdempotencyKeyAnswersTheOriginalNot409() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let body = #"{"kind":"external","queue":"iq","unique_key":"order-9"}"#
        let first = try client.call("POST", "/tasks", json: body, headers: ["Idempotency-Key": "submit-order-9"])
        #expect(first.status == 201)
        let id = try #require(first.json["id"] as? String)
        let replayed = try client.call("POST", "/tasks", json: body, headers: ["Idempotency-Key": "submit-order-9"])
        #expect(replayed.status == 201 && replayed.header("Idempotent-Replayed") == "true" && replayed.json["id"] as? String == id)
        Self.expectDuplicate(try client.call("POST", "/tasks", json: body), of: id)
        #expect(try Self.count(client, queue: "iq") == 1)
    }

    /// A retry would make a second unfinished task of the key: refused while the task that
    /// replaced it is unfinished.
    @Test func aRetryOfATaskAnotherReplacedIsRefused() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        // Paused, the queue holds its tasks `queued`, where a cancel ends them at once.
        #expect(try client.call("PATCH", "/queues/rq", json: #"{"paused":true}"#).status == 200)
        let first = try #require(try client.submit(#"{"kind":"noop","queue":"rq","unique_key":"k"}"#)["id"] as? String)
        try client.expectCancelled(try client.call("DELETE", "/tasks/\(first)"), first)
        let replacement = try #require(try client.submit(#"{"kind":"noop","queue":"rq","unique_key":"k"}"#)["id"] as? String)
        let refused = try client.call("POST", "/tasks/\(first)/retry")
        #expect(refused.status == 409 && refused.json["code"] as? String == "duplicate_task")
        #expect(refused.json["existing_id"] as? String == replacement)
        #expect(try client.task(first)["state"] as? String == "cancelled")
    }

    @Test func badKeysAndWindowsAre422() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let long = String(repeating: "k", count: 256)
        for (body, field) in [
            (#"{"kind":"noop","unique_key":""}"#, "unique_key"),
            (#"{"kind":"noop","unique_key":"\#(long)"}"#, "unique_key"),
            (#"{"kind":"noop","unique_key":7}"#, "unique_key"),
            (#"{"kind":"noop","unique_for_ms":1000}"#, "unique_for_ms"),
            (#"{"kind":"noop","unique_key":"k","unique_for_ms":0}"#, "unique_for_ms"),
            (#"{"kind":"noop","unique_key":"k","unique_for_ms":86400001}"#, "unique_for_ms"),
        ] {
            let response = try client.call("POST", "/tasks", json: body)
            #expect(response.status == 422, "\(body)")
            #expect((response.json["errors"] as? [[String: Any]])?.first?["field"] as? String == field, "\(body)")
        }
        #expect(try Self.count(client, queue: "default") == 0)
    }
}

/// The keys after a restart on the same data dir (SQLite) and after a cell moves to another
/// replica: the unfinished holder's from its record, a forgotten one's from its tombstone. And
/// a key held in a cell a workflow's home cannot see.
@Suite(.serialized, .inTheDefaultStageOnly) struct UniqueTaskDurabilityTests {
    /// A task that finished and that retention forgot at once, and an unfinished one, each
    /// holding a key of `queue`.
    static func holders(_ client: APIClient, queue: String) throws -> (forgotten: String, unfinished: String) {
        let forgotten = try #require(try client.submit(#"{"kind":"noop","queue":"\#(queue)","unique_key":"gone"}"#)["id"] as? String)
        try pollUntil("the finished task to be forgotten", timeout: 10) {
            try client.call("GET", "/tasks/\(forgotten)").status == 404
        }
        let unfinished = try #require(try client.submit(#"{"kind":"external","queue":"\#(queue)","unique_key":"held"}"#)["id"] as? String)
        return (forgotten, unfinished)
    }

    static func expectHeld(_ client: APIClient, queue: String, _ holders: (forgotten: String, unfinished: String)) throws {
        for (key, holder) in [("gone", holders.forgotten), ("held", holders.unfinished)] {
            let again = try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"\#(queue)","unique_key":"\#(key)","unique_for_ms":600000}"#)
            UniqueTaskAPITests.expectDuplicate(again, of: holder)
        }
        #expect(try UniqueTaskAPITests.count(client, queue: queue) == 1)
    }

    @Test func keysSurviveARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func start() throws -> ServiceHarness { try ServiceHarness.keepingState(in: directory) { $0.engine.retentionMilliseconds = 1 } }
        var service = try start()
        let holders = try Self.holders(try service.client(), queue: "dq")
        try service.stop()
        service = try start()
        defer { try? service.stop() }
        try Self.expectHeld(try service.client(), queue: "dq", holders)
    }

    /// The workflow's home cell cannot see another cell's keys: the workflow is answered 201,
    /// and its member whose key is held in its own cell ends cancelled as a duplicate there.
    @Test func aWorkflowMemberWhoseKeyIsHeldInAnotherCellIsCancelledAsADuplicate() throws {
        let service = try CellServiceTests.startCellReplicas("w0").replicas[0]
        defer { try? service.stop() }
        let client = try service.client()
        let (home, other) = CellServiceTests.queuesOfTwoCells(service)
        let holder = try #require(try client.submit(#"{"kind":"external","queue":"\#(other)","unique_key":"k"}"#)["id"] as? String)
        let created = try client.call("POST", "/workflows", json: #"""
            {"tasks":[{"key":"a","kind":"noop","queue":"\#(home)"},{"key":"b","kind":"noop","queue":"\#(other)","unique_key":"k"}]}
            """#)
        #expect(created.status == 201)
        let member = try #require((created.json["keys"] as? [String: String])?["b"])
        let cancelled = try client.waitForState(member, "cancelled")
        let error = cancelled["error"] as? [String: Any]
        #expect(error?["code"] as? String == "duplicate_task" && error?["existing_id"] as? String == holder)
        #expect(try client.task(holder)["state"] as? String == "running")
    }

    @Test func keysSurviveTheirCellMovingToAnotherReplica() throws {
        let (_, replicas) = try CellServiceTests.startCellReplicas("u0", "u1") { $0.engine.retentionMilliseconds = 1 }
        let queue = "mq"
        let (owner, survivor) = try CellServiceTests.ownerOfQueue(queue, among: replicas)
        defer { try? survivor.stop() }
        let holders = try Self.holders(try owner.client(), queue: queue)
        try owner.stop()
        try CellServiceTests.waitForEveryCell([survivor])
        try Self.expectHeld(try survivor.client(), queue: queue, holders)
    }
}
