import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// Fair share over real sockets: `concurrency_key` on tasks, `key_concurrency` on queues. The
/// tasks are `external`, so they stay running until the test completes them.
@Suite struct ConcurrencyKeyAPITests {
    static func state(_ client: APIClient, _ id: String) throws -> String {
        try #require(try client.call("GET", "/tasks/\(id)").json["state"] as? String)
    }

    static func submit(_ client: APIClient, queue: String, key: String?) throws -> String {
        let keyField = key.map { #","concurrency_key":"\#($0)""# } ?? ""
        let task = try client.submit(#"{"kind":"external","queue":"\#(queue)"\#(keyField)}"#)
        #expect(task["concurrency_key"] as? String == key || (key == nil && task["concurrency_key"] is NSNull))
        return try #require(task["id"] as? String)
    }

    static func complete(_ client: APIClient, _ id: String) throws {
        let answer = try client.call("POST", "/tasks/\(id)/complete", json: "{}")
        #expect(answer.status == 200, "\(answer.text)")
    }

    @Test func aKeyRunsAtMostItsCapAndACompletionStartsItsNext() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let queue = try client.call("PATCH", "/queues/fair", json: #"{"max_concurrency":10,"key_concurrency":1}"#)
        #expect(queue.status == 200 && queue.json["key_concurrency"] as? Int == 1, "\(queue.text)")
        let a1 = try Self.submit(client, queue: "fair", key: "a")
        let a2 = try Self.submit(client, queue: "fair", key: "a")
        let b1 = try Self.submit(client, queue: "fair", key: "b")
        let b2 = try Self.submit(client, queue: "fair", key: "b")
        let free = try Self.submit(client, queue: "fair", key: nil)
        #expect(try [a1, a2, b1, b2, free].map { try Self.state(client, $0) } == ["running", "queued", "running", "queued", "running"])
        try Self.complete(client, a1)
        #expect(try Self.state(client, a2) == "running" && Self.state(client, b2) == "queued")
        // Lifting the cap starts what waited at once; the queue shows it.
        let lifted = try client.call("PATCH", "/queues/fair", json: #"{"key_concurrency":null}"#)
        #expect(lifted.status == 200 && lifted.json["key_concurrency"] is NSNull, "\(lifted.text)")
        #expect(try Self.state(client, b2) == "running")
        let listed = try client.call("GET", "/queues").json["queues"] as? [[String: Any]]
        #expect(listed?.first { $0["name"] as? String == "fair" }?["key_concurrency"] is NSNull)
        for id in [a2, b1, b2, free] { try Self.complete(client, id) }
    }

    /// One task at a time: the keys take turns, priority first within a key, as the tasks'
    /// `started_at` show.
    @Test func keysTakeTurnsInStartOrder() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        #expect(try client.call("PATCH", "/queues/turns", json: #"{"max_concurrency":1,"paused":true}"#).status == 200)
        var ids: [String: String] = [:]
        for (name, key, priority) in [("a1", "a", 0), ("a2", "a", 3), ("a3", "a", 0), ("b1", "b", 0), ("c1", "c", 0)] {
            let task = try client.submit(#"{"kind":"external","queue":"turns","name":"\#(name)","priority":\#(priority),"concurrency_key":"\#(key)"}"#)
            ids[name] = try #require(task["id"] as? String)
        }
        #expect(try client.call("PATCH", "/queues/turns", json: #"{"paused":false}"#).status == 200)
        var order: [String] = []
        for _ in 0..<ids.count {
            let running = try #require(try ids.first { try Self.state(client, $0.value) == "running" })
            order.append(running.key)
            try Self.complete(client, running.value)
        }
        #expect(order == ["a2", "b1", "c1", "a1", "a3"])
        let startedAt = try order.map { name in try #require(try client.call("GET", "/tasks/\(ids[name]!)").json["started_at"] as? String) }
        #expect(startedAt == startedAt.sorted())
    }

    @Test func badKeysAndCapsAre422NamingTheField() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let long = String(repeating: "k", count: 256)
        for (body, field) in [(#"{"kind":"noop","concurrency_key":""}"#, "concurrency_key"),
                              (#"{"kind":"noop","concurrency_key":"\#(long)"}"#, "concurrency_key"),
                              (#"{"kind":"noop","concurrency_key":7}"#, "concurrency_key"),
                              (#"{"tasks":[{"key":"a","kind":"noop","concurrency_key":""}]}"#, "tasks[0].concurrency_key")] {
            let answer = try client.call("POST", body.hasPrefix(#"{"tasks""#) ? "/workflows" : "/tasks", json: body)
            #expect(answer.status == 422, "\(answer.text)")
            #expect(answer.header("Content-Type") == "application/problem+json")
            #expect((answer.json["errors"] as? [[String: Any]])?.first?["field"] as? String == field, "\(answer.text)")
        }
        for body in [#"{"key_concurrency":0}"#, #"{"key_concurrency":10001}"#, #"{"key_concurrency":"2"}"#] {
            let answer = try client.call("PATCH", "/queues/capped", json: body)
            #expect(answer.status == 422, "\(answer.text)")
            #expect((answer.json["errors"] as? [[String: Any]])?.first?["field"] as? String == "key_concurrency")
        }
        let queues = try client.call("GET", "/queues").json["queues"] as? [[String: Any]]
        #expect(queues?.contains { $0["name"] as? String == "capped" } != true)
    }
}

/// The cap and the keys after a restart on the same data dir: a task still running (an
/// `external` one goes on) counts against its key, so a workflow task of that key waits.
@Suite(.serialized, .inTheDefaultStageOnly) struct ConcurrencyKeyDurabilityTests {
    @Test func theCapAndTheKeysSurviveARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func start() throws -> ServiceHarness { try ServiceHarness.keepingState(in: directory) }
        var service = try start()
        var client = try service.client()
        #expect(try client.call("PATCH", "/queues/kept", json: #"{"max_concurrency":5,"key_concurrency":1}"#).status == 200)
        let first = try ConcurrencyKeyAPITests.submit(client, queue: "kept", key: "k")
        let workflow = try client.call("POST", "/workflows", json: #"{"tasks":[{"key":"w","kind":"external","queue":"kept","concurrency_key":"k"}]}"#)
        #expect(workflow.status == 201, "\(workflow.text)")
        let member = try #require((workflow.json["keys"] as? [String: String])?["w"])
        #expect(try client.task(member)["concurrency_key"] as? String == "k")
        try service.stop()
        service = try start()
        defer { try? service.stop() }
        client = try service.client()
        #expect(try client.call("GET", "/queues/kept").json["key_concurrency"] as? Int == 1)
        #expect(try ConcurrencyKeyAPITests.state(client, first) == "running")
        #expect(try ConcurrencyKeyAPITests.state(client, member) == "queued")
        #expect(try client.task(member)["concurrency_key"] as? String == "k")
        try ConcurrencyKeyAPITests.complete(client, first)
        #expect(try ConcurrencyKeyAPITests.state(client, member) == "running")
    }
}
