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

    /// Past `--max-idempotency-keys`, a new key is refused (429, nothing created) until old ones
    /// expire; keys already remembered still replay, and requests without a key go on.
    @Test func newKeysPastTheLimitWaitForOldOnesToExpire() throws {
        let service = try ServiceHarness { $0.maxIdempotencyKeys = 2 }
        let client = try service.client()
        let first = try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "k1"])
        #expect(try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "k2"]).status == 201)
        for (path, body) in [("/tasks", Self.body), ("/workflows", #"{"tasks":[{"key":"a","kind":"noop"}]}"#)] {
            let refused = try client.call("POST", path, json: body, headers: ["Idempotency-Key": "k3"])
            #expect(refused.status == 429 && refused.header("Content-Type") == "application/problem+json", "\(refused.text)")
            #expect(refused.json["code"] as? String == "too_many_idempotency_keys")
            let wait = try #require(refused.header("Retry-After").flatMap { Int($0) })
            #expect((1...86_400).contains(wait), "until the oldest key expires: \(wait)")
        }
        #expect((try client.call("GET", "/tasks").json["tasks"] as? [Any])?.count == 2, "nothing was created")
        let replay = try client.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "k1"])
        #expect(replay.status == 201 && replay.header("Idempotent-Replayed") == "true")
        #expect(replay.json["id"] as? String == first.json["id"] as? String)
        #expect(try client.call("POST", "/tasks", json: Self.body).status == 201)
        try service.stop()

        let short = try ServiceHarness {
            $0.maxIdempotencyKeys = 1
            $0.idempotencyTTLMilliseconds = 300
        }
        let shortClient = try short.client()
        #expect(try shortClient.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "old"]).status == 201)
        try pollUntil("the old key to expire and make room", timeout: 10, every: 20_000) {
            try shortClient.call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "new"]).status == 201
        }
        try short.stop()
    }

    /// The key is written with what it created: a restart still replays.
    @Test func keysSurviveARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var service = try ServiceHarness.keepingState(in: directory)
        let first = try service.client().call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "durable"])
        try service.stop()
        service = try ServiceHarness.keepingState(in: directory)
        let again = try service.client().call("POST", "/tasks", json: Self.body, headers: ["Idempotency-Key": "durable"])
        #expect(again.header("Idempotent-Replayed") == "true" && again.json["id"] as? String == first.json["id"] as? String)
        try service.stop()
    }
}
