import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// `Idempotency-Key` on submissions: one creation per key, replays answer as the first did.
@Suite struct IdempotencyTests {
    static let body = #"{"kind":"sleep","params":{"duration_ms":600000},"name":"once"}"#

    @Test func aRepeatCreatesNothingAndAnswersAsTheFirstDid() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let first = try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "order-17"])
        #expect(first.status == 201 && first.header("Idempotent-Replayed") == nil)
        let id = try #require(first.json["id"] as? String)
        _ = try client.waitForState(id, "running")
        let again = try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "order-17"])
        #expect(again.status == 201 && again.header("Idempotent-Replayed") == "true")
        #expect(again.json["id"] as? String == id && again.json["state"] as? String == "running", "the resource as it is now")
        #expect(again.header("Location") == "/tasks/\(id)")
        #expect(try client.call("GET", "/tasks").json["tasks"].map { ($0 as? [Any])?.count } == 1)
        let other = try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#, headers: ["Idempotency-Key": "order-17"])
        #expect(other.status == 422 && other.json["code"] as? String == "idempotency_key_reused")
        for bad in ["", String(repeating: "k", count: 256), "with space", "é"] {
            let refused = try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": bad])
            #expect(refused.status == 400 && refused.json["code"] as? String == "invalid_idempotency_key", "\(bad.debugDescription)")
        }
        let workflow = #"{"tasks":[{"key":"a","kind":"noop"}]}"#
        let created = try client.call("POST", "/workflows", json: workflow, headers: ["Idempotency-Key": "wf-1"])
        let replayed = try client.call("POST", "/workflows", json: workflow, headers: ["Idempotency-Key": "wf-1"])
        #expect(created.status == 201 && replayed.status == 201 && replayed.header("Idempotent-Replayed") == "true")
        #expect(replayed.json["id"] as? String == created.json["id"] as? String)
        try service.stop()
    }

    /// Twenty clients at once with one key: one task.
    @Test func concurrentRequestsWithOneKeyCreateOneTask() throws {
        let service = try ServiceHarness()
        let ids = Locked<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 20) { _ in
            guard let client = try? service.client(),
                  let response = try? client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "same"]),
                  response.status == 201, let id = response.json["id"] as? String else { return }
            ids.withLock { $0.append(id) }
        }
        #expect(ids.value.count == 20 && Set(ids.value).count == 1)
        try service.stop()
    }

    @Test func keysExpireAfterTheirLifetime() throws {
        let service = try ServiceHarness { $0.idempotencyTTLMilliseconds = 200 }
        let client = try service.client()
        let first = try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "short"])
        try pollUntil("the key to expire", timeout: 10, every: 20_000) {
            let response = try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "short"])
            return response.status == 201 && response.json["id"] as? String != first.json["id"] as? String
        }
        try service.stop()
    }

    /// The key is written with what it created: a restart still replays.
    @Test func keysSurviveARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configure: (inout ServiceConfiguration) -> Void = {
            $0.durability = .full
            $0.dataDirectory = directory
        }
        var service = try ServiceHarness(configure)
        let first = try service.client().call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "durable"])
        try service.stop()
        service = try ServiceHarness(configure)
        let again = try service.client().call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "durable"])
        #expect(again.header("Idempotent-Replayed") == "true" && again.json["id"] as? String == first.json["id"] as? String)
        try service.stop()
    }
}
