import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// `POST /tasks/{id}/retry` and `POST /workflows/{id}/retry` over real sockets.
@Suite struct RetryAPITests {
    @Test func retryingAFailedTaskRunsItAgainAndBringsBackItsDependents() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        // A fetch from a port nobody listens on fails every attempt, at once.
        let created = try client.call("POST", "/workflows", json: #"""
            {"tasks":[{"key":"fetch","kind":"http","params":{"url":"http://127.0.0.1:1/nothing"}},
                      {"key":"after","kind":"noop","dependencies":["fetch"]}]}
            """#)
        try #require(created.status == 201)
        let keys = try #require(created.json["keys"] as? [String: String])
        let fetch = try #require(keys["fetch"]), after = try #require(keys["after"])
        let workflow = try #require(created.json["id"] as? String)
        #expect(try client.waitForState(fetch, "failed")["attempt"] as? Int == 1)
        let cancelled = try client.waitForState(after, "cancelled")
        #expect((cancelled["error"] as? [String: Any])?["code"] as? String == "dependency_failed")

        let retried = try client.call("POST", "/tasks/\(fetch)/retry")
        #expect(retried.status == 200 && retried.json["attempt"] as? Int == 2 && retried.json["max_attempts"] as? Int == 2)
        #expect(["queued", "running", "failed"].contains(retried.json["state"] as? String ?? ""))
        #expect(try client.waitForState(fetch, "failed")["attempt"] as? Int == 2)
        #expect(try client.waitForState(after, "cancelled")["attempt"] as? Int == 1)
        #expect(try client.call("POST", "/workflows/\(workflow)/retry").json["retried"] as? Int == 2)
        #expect(try client.waitForState(fetch, "failed")["attempt"] as? Int == 3)

        let done = try #require(try client.submit(#"{"kind":"noop"}"#)["id"] as? String)
        _ = try client.waitForState(done, "succeeded")
        let refused = try client.call("POST", "/tasks/\(done)/retry")
        #expect(refused.status == 409 && refused.json["code"] as? String == "not_retryable")
        #expect(try client.call("POST", "/tasks/01M00000000000000000000000/retry").status == 404)
        #expect(try client.call("POST", "/workflows/01M00000000000000000000000/retry").status == 404)
    }
}
