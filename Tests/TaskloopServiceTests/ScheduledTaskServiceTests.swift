import Foundation
import Testing
import TaskloopTestSupport
import TaskloopTime
@testable import TaskloopService

/// `run_at`/`delay_ms` and `expires_at`/`ttl_ms` over real sockets: the `scheduled` state and
/// its time in every answer, the refusals, expiry, and a restart that finds the time passed.
@Suite struct ScheduledTaskServiceTests {
    static func milliseconds(_ timestamp: Any?) throws -> Int64 {
        let text = try #require(timestamp as? String)
        return try #require(RFC3339.milliseconds(text))
    }

    @Test func aDelayedTaskIsScheduledUntilItsTimeThenRuns() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let task = try client.submit(#"{"kind":"noop","delay_ms":700,"queue":"later"}"#)
        let id = try #require(task["id"] as? String)
        #expect(task["state"] as? String == "scheduled")
        let createdAt = try Self.milliseconds(task["created_at"])
        let scheduledFor = try Self.milliseconds(task["scheduled_for"])
        #expect(scheduledFor == createdAt + 700)
        #expect(task["expires_at"] is NSNull)
        let queue = try client.call("GET", "/queues/later").json
        #expect((queue["counts"] as? [String: Any])?["scheduled"] as? Int == 1)
        let listed = try client.call("GET", "/tasks?state=scheduled").json["tasks"] as? [[String: Any]] ?? []
        #expect(listed.contains { $0["id"] as? String == id })
        let done = try client.waitForState(id, "succeeded")
        #expect(try Self.milliseconds(done["started_at"]) >= scheduledFor)
        try service.stop()
    }

    @Test func aRunAtWithAnOffsetIsTheSameInstant() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let instant = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 + 3_600).rounded(.down))
        let local = ISO8601DateFormatter()
        local.timeZone = TimeZone(secondsFromGMT: 2 * 3_600)
        let text = local.string(from: instant)
        #expect(text.hasSuffix("+02:00"))
        let task = try client.submit(#"{"kind":"noop","run_at":"\#(text)"}"#)
        #expect(task["state"] as? String == "scheduled")
        #expect(try Self.milliseconds(task["scheduled_for"]) == Int64(instant.timeIntervalSince1970) * 1_000)
        #expect((task["scheduled_for"] as? String)?.hasSuffix(".000Z") == true)
        try service.stop()
    }

    @Test func contradictoryOrMalformedTimesAre422AndCreateNothing() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let cases: [(body: String, field: String)] = [
            (#"{"kind":"noop","queue":"t","run_at":"2030-01-01T00:00:00Z","delay_ms":5}"#, "delay_ms"),
            (#"{"kind":"noop","queue":"t","expires_at":"2030-01-01T00:00:00Z","ttl_ms":5}"#, "ttl_ms"),
            (#"{"kind":"noop","queue":"t","run_at":"tomorrow"}"#, "run_at"),
            (#"{"kind":"noop","queue":"t","run_at":"2030-02-30T00:00:00Z"}"#, "run_at"),
            (#"{"kind":"noop","queue":"t","delay_ms":-1}"#, "delay_ms"),
            (#"{"kind":"noop","queue":"t","delay_ms":5000,"ttl_ms":4000}"#, "ttl_ms"),
            (#"{"kind":"noop","queue":"t","expires_at":"2001-01-01T00:00:00Z"}"#, "expires_at"),
            (#"{"kind":"noop","queue":"t","run_at":"9999-01-01T00:00:00Z"}"#, "run_at"),
        ]
        for (body, field) in cases {
            let answer = try client.call("POST", "/tasks", json: body)
            #expect(answer.status == 422, "\(body)")
            #expect(answer.header("Content-Type") == "application/problem+json")
            let fields = (answer.json["errors"] as? [[String: Any]] ?? []).compactMap { $0["field"] as? String }
            #expect(fields == [field], "\(body): \(answer.text)")
        }
        let workflow = try client.call("POST", "/workflows", json: #"""
            {"tasks":[{"key":"a","kind":"noop","queue":"t"},{"key":"b","kind":"noop","queue":"t","delay_ms":10,"ttl_ms":5}]}
            """#)
        #expect(workflow.status == 422)
        #expect((workflow.json["errors"] as? [[String: Any]])?.first?["field"] as? String == "tasks[1].ttl_ms")
        #expect(try client.call("GET", "/tasks?queue=t").json["tasks"] as? [Any] == nil
            || (try client.call("GET", "/tasks?queue=t").json["tasks"] as? [Any])?.isEmpty == true)
        try service.stop()
    }

    @Test func aTaskThatWaitsPastItsTTLIsCancelledAsExpired() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        #expect(try client.call("PATCH", "/queues/narrow", json: #"{"max_concurrency":1}"#).status == 200)
        let blocker = try #require(try client.submit(#"{"kind":"sleep","queue":"narrow","params":{"duration_ms":60000}}"#)["id"] as? String)
        _ = try client.waitForState(blocker, "running")
        let waiting = try #require(try client.submit(#"{"kind":"noop","queue":"narrow","ttl_ms":300}"#)["id"] as? String)
        let dependent = try #require(try client.submit(#"{"kind":"noop","dependencies":["\#(waiting)"]}"#)["id"] as? String)
        let expired = try client.waitForState(waiting, "cancelled")
        let error = try #require(expired["error"] as? [String: Any])
        #expect(error["code"] as? String == "expired")
        #expect(expired["started_at"] is NSNull)
        #expect(try Self.milliseconds(expired["finished_at"]) >= (try Self.milliseconds(expired["expires_at"])))
        let cancelled = try client.waitForState(dependent, "cancelled")
        #expect((cancelled["error"] as? [String: Any])?["code"] as? String == "dependency_failed")
        try client.expectCancelled(client.call("DELETE", "/tasks/\(blocker)"), blocker)
        try service.stop()
    }

    @Test func cancellingAScheduledTaskIsImmediate() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try #require(try client.submit(#"{"kind":"noop","delay_ms":600000}"#)["id"] as? String)
        let answer = try client.call("DELETE", "/tasks/\(id)")
        #expect(answer.status == 200 && answer.json["state"] as? String == "cancelled")
        #expect(try client.task(id)["started_at"] is NSNull)
        try service.stop()
    }

    /// A restart finds one task's time passed while the server was down (it runs at once), and
    /// another's still to come (it waits on, at the same time).
    @Test(.inTheDefaultStageOnly) func aRestartKeepsTheTimesAndRunsWhatFellDueWhileDown() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func start() throws -> ServiceHarness { try ServiceHarness.keepingState(in: directory) }
        let first = try start()
        var client = try first.client()
        let soon = try client.submit(#"{"kind":"noop","delay_ms":400}"#)
        let later = try client.submit(#"{"kind":"noop","delay_ms":600000,"ttl_ms":900000}"#)
        try first.stop()
        let soonFor = try Self.milliseconds(soon["scheduled_for"])
        try pollUntil("the first task's time to pass while the server is down") {
            Int64(Date().timeIntervalSince1970 * 1_000) > soonFor
        }
        let second = try start()
        client = try second.client()
        let ran = try client.waitForState(try #require(soon["id"] as? String), "succeeded")
        #expect(try Self.milliseconds(ran["started_at"]) > soonFor)
        let waiting = try client.task(try #require(later["id"] as? String))
        #expect(waiting["state"] as? String == "scheduled")
        #expect(waiting["scheduled_for"] as? String == later["scheduled_for"] as? String)
        #expect(waiting["expires_at"] as? String == later["expires_at"] as? String)
        try second.stop()
    }
}
