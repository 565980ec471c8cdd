import Crypto
import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// `secret_headers` (`http`) and `secret_env` (`exec`), contract v3 "Secrets in params": the
/// work gets the values, before and after a restart; answers, events, webhook deliveries and
/// log lines show `"***"` for each; a worker's lease answer is the one place the values travel.
@Suite(.serialized) struct SecretParamsTests {
    /// A value no answer could hold by chance.
    static let secret = "s3cr3t-4711-\(UUID().uuidString)"

    static func sha256(_ text: String) -> String {
        SHA256.hash(data: Array(text.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    /// An http task to the origin, one header plain and one secret.
    static func fetch(_ origin: OriginServer, queue: String = "default") -> [String: Any] {
        ["kind": "http", "queue": queue, "params": [
            "url": origin.url("/text/5"), "headers": ["X-Plain": "visible"], "secret_headers": ["X-Api-Key": secret],
        ]]
    }

    /// An exec task that prints the digest of its secret variable (so the test sees the program
    /// got the value without the value showing anywhere).
    static func digest(queue: String = "default") -> [String: Any] {
        ["kind": "exec", "queue": queue, "params": [
            "argv": ["sh", "-c", #"printf %s "$API_TOKEN" | sha256sum"#], "env": ["PLAIN": "visible"],
            "secret_env": ["API_TOKEN": secret],
        ]]
    }

    /// `text` shows the secrets masked, and never their value.
    static func expectMasked(_ text: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(!text.contains(secret), "\(what) shows the secret: \(text)", sourceLocation: sourceLocation)
        #expect(text.contains(#""X-Api-Key":"***""#) || text.contains(#""API_TOKEN":"***""#),
                "\(what) shows no masked secret: \(text)", sourceLocation: sourceLocation)
    }

    static func origins(_ origin: OriginServer) -> [String] {
        origin.requests.value.filter { $0.path == "/text/5" }.map { $0.headers["x-api-key"] ?? "" }
    }

    /// The built server with a durable store and debug logs: both kinds get their secrets, and
    /// nothing the server says (answers, the event stream, webhook deliveries, its log) holds
    /// them; after a restart, a task submitted before it still gets them.
    @Test func theWorkGetsTheSecretsAndNothingShowsThem() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let receiver = try WebhookReceiver()
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let arguments = ["--port", "0", "--durability", "full", "--data-dir", directory, "--allow-exec", "--log-level", "debug",
                         "--shutdown-grace-seconds", "1"]
        var binary = try BinaryTests.RunningBinary(arguments: arguments)
        var port = try #require(BinaryTests.port(from: try binary.waitForLine(containing: "listening on")))
        var client = try APIClient(port: port)
        #expect(try client.call("POST", "/webhooks", json: #"{"url":"\#(receiver.url("/hook"))","events":["task.state"]}"#).status == 201)
        let stream = try EventStreamTests.Stream(port: port, "/events")
        #expect(stream.head.contains("200"))

        let submitted = try client.call("POST", "/tasks", json: ExecTests.json(Self.fetch(origin)))
        #expect(submitted.status == 201)
        Self.expectMasked(submitted.text, "the submit answer")
        #expect(submitted.text.contains(#""X-Plain":"visible""#), "plain headers stay visible")
        let http = try #require(submitted.json["id"] as? String)
        _ = try client.waitForState(http, "succeeded")
        #expect(Self.origins(origin) == [Self.secret], "the origin got the real header")

        let exec = try #require(try client.submit(ExecTests.json(Self.digest()))["id"] as? String)
        let ran = try client.waitForState(exec, "succeeded")
        #expect(((ran["result"] as? [String: Any])?["stdout"] as? String)?.hasPrefix(Self.sha256(Self.secret)) == true,
                "the program got the real variable: \(ran)")

        for id in [http, exec] {
            Self.expectMasked(try client.call("GET", "/tasks/\(id)").text, "GET /tasks/\(id)")
            Self.expectMasked(try client.call("GET", "/tasks/\(id)/events").text, "GET /tasks/\(id)/events")
        }
        let list = try client.call("GET", "/tasks").text
        Self.expectMasked(list, "the list")
        #expect(list.contains(#""X-Api-Key":"***""#) && list.contains(#""API_TOKEN":"***""#) && list.contains(#""PLAIN":"visible""#))
        // Both tasks' events, to the end of each.
        let events = String(decoding: try stream.connection.readUntil {
            String(decoding: $0, as: UTF8.self).components(separatedBy: #""state":"succeeded""#).count >= 3
        }, as: UTF8.self)
        Self.expectMasked(events, "the event stream")
        try pollUntil("both tasks' last deliveries") {
            receiver.deliveries.filter { $0.deliveredTask?["state"] as? String == "succeeded" }.count == 2
        }
        let deliveries = receiver.deliveries
        Self.expectMasked(String(decoding: try JSONSerialization.data(withJSONObject: deliveries), as: UTF8.self), "webhooks")

        // Held until after a restart: the stored tasks still carry the real values.
        #expect(try client.call("PATCH", "/queues/held", json: #"{"paused":true}"#).status == 200)
        let workflow = try client.call("POST", "/workflows", json: ExecTests.json(["tasks": [
            Self.fetch(origin, queue: "held").merging(["key": "fetch"]) { $1 }, Self.digest(queue: "held").merging(["key": "digest"]) { $1 },
        ]]))
        #expect(workflow.status == 201, "\(workflow.text)")
        Self.expectMasked(workflow.text, "the workflow answer")
        let keys = try #require(workflow.json["keys"] as? [String: String])
        let workflowID = try #require(workflow.json["id"] as? String)
        #expect(try binary.stop() == 0)
        var log = binary.printed

        binary = try BinaryTests.RunningBinary(arguments: arguments)
        port = try #require(BinaryTests.port(from: try binary.waitForLine(containing: "listening on")))
        client = try APIClient(port: port)
        Self.expectMasked(try client.call("GET", "/workflows/\(workflowID)").text, "GET /workflows/{id}")
        #expect(try client.call("PATCH", "/queues/held", json: #"{"paused":false}"#).status == 200)
        _ = try client.waitForState(try #require(keys["fetch"]), "succeeded")
        #expect(Self.origins(origin) == [Self.secret, Self.secret], "the origin got the real header after the restart")
        let digested = try client.waitForState(try #require(keys["digest"]), "succeeded")
        #expect(((digested["result"] as? [String: Any])?["stdout"] as? String)?.hasPrefix(Self.sha256(Self.secret)) == true)
        Self.expectMasked(try client.call("GET", "/tasks?queue=held").text, "the list after the restart")
        #expect(try binary.stop() == 0)
        log += binary.printed
        #expect(log.contains("POST /tasks 201") && log.contains("-> succeeded"), "the debug log: \(log)")
        #expect(!log.contains(Self.secret), "the log shows the secret")
    }

    /// A worker leases the task with the real values (it runs the task with them); every other
    /// answer about it, the lease's holder's GET included, shows them masked.
    @Test func onlyTheLeaseAnswerCarriesTheValues() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try LeaseAPITests.workersQueue(client, "remote")
        let http = try LeaseAPITests.id(try client.submit(ExecTests.json(Self.fetch(origin, queue: "remote"))))
        let exec = try LeaseAPITests.id(try client.submit(ExecTests.json(Self.digest(queue: "remote"))))
        let leased = try LeaseAPITests.lease(client, "remote", #"{"worker":"w1","max_tasks":2}"#)
        let params = Dictionary(uniqueKeysWithValues: try leased.map { (try LeaseAPITests.id($0), $0["params"] as? [String: Any] ?? [:]) })
        #expect((params[http]?["secret_headers"] as? [String: String]) == ["X-Api-Key": Self.secret])
        #expect((params[exec]?["secret_env"] as? [String: String]) == ["API_TOKEN": Self.secret])
        for id in [http, exec] {
            Self.expectMasked(try client.call("GET", "/tasks/\(id)").text, "GET of a leased task")
        }
    }

    /// The reference worker runs a leased task with the real values.
    @Test func aWorkerRunsTheTaskWithTheValues() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let (service, client) = try WorkerTests.server()
        defer { try? service.stop() }
        let worker = try WorkerTests.worker(port: service.port, ["--allow-exec", "--log-level", "debug"])
        let http = try LeaseAPITests.id(try client.submit(ExecTests.json(Self.fetch(origin, queue: "work"))))
        let exec = try LeaseAPITests.id(try client.submit(ExecTests.json(Self.digest(queue: "work"))))
        _ = try client.waitForState(http, "succeeded")
        #expect(Self.origins(origin) == [Self.secret])
        let ran = try client.waitForState(exec, "succeeded")
        #expect(((ran["result"] as? [String: Any])?["stdout"] as? String)?.hasPrefix(Self.sha256(Self.secret)) == true, "\(ran)")
        #expect(try worker.stop() == 0)
        #expect(!worker.printed.contains(Self.secret), "the worker's log shows the secret")
    }

    /// Secrets follow the rules of `headers` and `env`, and a name goes in one of the two only;
    /// a refusal names the field, never the value.
    @Test func badSecretsAreRefusedByName() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        defer { try? service.stop() }
        let client = try service.client()
        let url = "http://127.0.0.1:9/"
        let cases: [([String: Any], String)] = [
            (["kind": "http", "params": ["url": url, "secret_headers": ["X-Key": "\(Self.secret)\r\nInjected: 1"]]],
             "params.secret_headers.X-Key"),
            (["kind": "http", "params": ["url": url, "secret_headers": ["Bad Name": Self.secret]]], "params.secret_headers.Bad Name"),
            (["kind": "http", "params": ["url": url, "secret_headers": ["Content-Length": "3"]]],
             "params.secret_headers.Content-Length"),
            (["kind": "http", "params": ["url": url, "secret_headers": ["X-Key": 1]]], "params.secret_headers.X-Key"),
            (["kind": "http", "params": ["url": url, "secret_headers": [Self.secret]]], "params.secret_headers"),
            (["kind": "http", "params": ["url": url, "headers": ["X-Key": "a"], "secret_headers": ["x-key": Self.secret]]],
             "params.secret_headers.x-key"),
            (["kind": "exec", "params": ["argv": ["true"], "secret_env": ["A=B": Self.secret]]], "params.secret_env.A=B"),
            (["kind": "exec", "params": ["argv": ["true"], "secret_env": ["TASKLOOP_TASK_ID": Self.secret]]],
             "params.secret_env.TASKLOOP_TASK_ID"),
            (["kind": "exec", "params": ["argv": ["true"], "secret_env": ["K": ["nested": Self.secret]]]], "params.secret_env.K"),
            (["kind": "exec", "params": ["argv": ["true"], "secret_env": Self.secret]], "params.secret_env"),
            (["kind": "exec", "params": ["argv": ["true"], "env": ["K": "a"], "secret_env": ["K": Self.secret]]],
             "params.secret_env.K"),
        ]
        for (body, field) in cases {
            let answer = try client.call("POST", "/tasks", json: ExecTests.json(body))
            #expect(answer.status == 422 && answer.header("Content-Type") == "application/problem+json", "\(field): \(answer.text)")
            let fields = (answer.json["errors"] as? [[String: Any]])?.compactMap { $0["field"] as? String }
            #expect(fields == [field], "\(answer.text)")
            #expect(!answer.text.contains(Self.secret), "\(field): the refusal shows the value")
        }
        #expect((try client.call("GET", "/tasks").json["tasks"] as? [Any])?.isEmpty == true, "nothing was created")
        // The same name with another case is another variable.
        let both = try client.submit(ExecTests.json(["kind": "exec", "params": [
            "argv": ["sh", "-c", #"test "$k" = a && test "$K" = b"#], "env": ["k": "a"], "secret_env": ["K": "b"]]]))
        _ = try client.waitForState(try #require(both["id"] as? String), "succeeded")
    }
}
