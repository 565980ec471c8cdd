import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// Outputs flowing to dependents through the real server: `{"$from", "pointer"}` in params
/// replaced at start by part of a dependency's result, in GET, lease answers, after a restart and
/// across cells.
@Suite struct OutputFlowTests {
    /// The first step's result: an `external` task's, reported by hand.
    static let result = #"{"result":{"wait_ms":10,"steps":[3,5]}}"#

    static func complete(_ client: APIClient, _ id: String) throws {
        let answer = try client.call("POST", "/tasks/\(id)/complete", json: result)
        try #require(answer.status == 200, "\(answer.text)")
    }

    static func id(_ object: [String: Any]) throws -> String { try #require(object["id"] as? String) }

    static func params(_ task: [String: Any]) -> NSDictionary? { (task["params"] as? [String: Any]).map { $0 as NSDictionary } }

    static var resolved: NSDictionary { ["duration_ms": 10, "steps": 5] }

    @Test func aWorkflowsSecondStepTakesTheFirstStepsOutput() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let submitted = try client.call("POST", "/workflows", json: #"""
            {"tasks": [{"key": "first", "kind": "external"},
                       {"key": "second", "kind": "sleep", "dependencies": ["first"],
                        "params": {"duration_ms": {"$from": "first", "pointer": "/wait_ms"}, "steps": {"$from": "first", "pointer": "/steps/1"}}},
                       {"key": "missing", "kind": "sleep", "dependencies": ["first"],
                        "params": {"duration_ms": {"$from": "first", "pointer": "/absent"}}}]}
            """#)
        try #require(submitted.status == 201, "\(submitted.text)")
        let keys = try #require(submitted.json["keys"] as? [String: String])
        let (first, second, missing) = (keys["first"]!, keys["second"]!, keys["missing"]!)
        // Before it starts a task shows its params as submitted.
        let waiting = try client.task(second)
        #expect(waiting["state"] as? String == "pending")
        #expect((Self.params(waiting)?["duration_ms"] as? [String: Any])?["$from"] as? String == "first")

        try Self.complete(client, first)
        let done = try client.waitForState(second, "succeeded")
        #expect(Self.params(done) == Self.resolved)
        let failed = try client.waitForState(missing, "failed")
        let error = try #require(failed["error"] as? [String: Any])
        #expect(error["code"] as? String == "input_missing" && error["path"] as? String == "params/duration_ms")
        #expect(failed["attempt"] as? Int == 1 && failed["started_at"] is NSNull)
    }

    @Test func aReferenceNamingNoDependencyIsRefusedWithItsField() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let first = try Self.id(try client.submit(#"{"kind":"external"}"#))
        for (body, field) in [
            (#"{"kind":"noop","params":{"a":{"b":{"$from":"\#(first)"}}}}"#, "params.a.b"),
            (#"{"kind":"noop","dependencies":["\#(first)"],"params":{"a":[{"$from":"\#(first)","pointer":"x"}]}}"#, "params.a[0]"),
        ] {
            let answer = try client.call("POST", "/tasks", json: body)
            #expect(answer.status == 422 && answer.text.contains(field), "\(answer.text)")
        }
        let workflow = try client.call("POST", "/workflows", json: #"""
            {"tasks": [{"key": "a", "kind": "noop"}, {"key": "b", "kind": "noop", "params": {"x": {"$from": "a"}}}]}
            """#)
        #expect(workflow.status == 422 && workflow.text.contains("tasks[1].params.x"), "\(workflow.text)")
        let list = try client.call("GET", "/tasks").json["tasks"] as? [[String: Any]]
        #expect(list?.count == 1)
    }

    @Test func aLeaseAnswerCarriesTheResolvedParams() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try LeaseAPITests.workersQueue(client, "gpu")
        let first = try Self.id(try client.submit(#"{"kind":"external"}"#))
        let leased = try Self.id(try client.submit(#"""
            {"kind":"sleep","queue":"gpu","dependencies":["\#(first)"],
             "params":{"duration_ms":{"$from":"\#(first)","pointer":"/wait_ms"},"steps":{"$from":"\#(first)","pointer":"/steps/1"}}}
            """#))
        try Self.complete(client, first)
        _ = try client.waitForState(leased, "queued")
        let tasks = try LeaseAPITests.lease(client, "gpu")
        #expect(tasks.count == 1 && tasks.first?["id"] as? String == leased)
        #expect(tasks.first.flatMap(Self.params) == Self.resolved)
        #expect(Self.params(try client.task(leased)) == Self.resolved)
    }
}

/// The binary on SQLite: resolved params and the inputs a waiting task took survive a restart.
@Suite(.inTheDefaultStageOnly) struct OutputFlowRestartTests {
    @Test func aRestartKeepsResolvedParamsAndTakenInputs() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try DurabilityTests.start(directory, ["--retention-seconds", "1"])
        let first = try OutputFlowTests.id(try client.submit(#"{"kind":"external"}"#))
        let blocker = try OutputFlowTests.id(try client.submit(#"{"kind":"external"}"#))
        let reference = #"{"duration_ms":{"$from":"\#(first)","pointer":"/wait_ms"},"steps":{"$from":"\#(first)","pointer":"/steps/1"}}"#
        // A leased task keeps its lease across a restart: it is still running, resolved, after it.
        try LeaseAPITests.workersQueue(client, "held")
        let running = try OutputFlowTests.id(try client.submit(#"""
            {"kind":"sleep","queue":"held","dependencies":["\#(first)"],"params":\#(reference)}
            """#))
        // Waits for the blocker too: the first step is forgotten before it starts.
        let waiting = try OutputFlowTests.id(try client.submit(#"""
            {"kind":"sleep","dependencies":["\#(first)","\#(blocker)"],"params":\#(reference)}
            """#))
        try OutputFlowTests.complete(client, first)
        _ = try client.waitForState(running, "queued")
        let leased = try LeaseAPITests.lease(client, "held")
        #expect(leased.first.flatMap(OutputFlowTests.params) == OutputFlowTests.resolved)
        // Forgotten before the restart: what the waiting task took is all there is of it.
        try pollUntil("the first step to be forgotten", timeout: 10) { try client.call("GET", "/tasks/\(first)").status == 404 }
        #expect(try binary.stop() == 0)

        (binary, client) = try DurabilityTests.start(directory, ["--retention-seconds", "1"])
        let restarted = try client.task(running)
        #expect(restarted["state"] as? String == "running" && OutputFlowTests.params(restarted) == OutputFlowTests.resolved)
        let answer = try client.call("POST", "/tasks/\(blocker)/complete", json: "{}")
        #expect(answer.status == 200)
        #expect(OutputFlowTests.params(try client.waitForState(waiting, "succeeded")) == OutputFlowTests.resolved)
        #expect(try binary.stop() == 0)
    }
}

/// Replicas on PostgreSQL, the dependency and its dependent in different cells: the result
/// travels with the dependency's end, and the cells' next owners show the same.
extension CellServiceTests {
    @Test func outputsFlowToADependentInAnotherCellAndSurviveACellMove() throws {
        let (url, replicas) = try Self.startCellReplicas("c0", "c1", "c2")
        let client = try APIClient(ports: replicas.map(\.port))
        let (upstream, downstream) = Self.queuesOfTwoCells(replicas[0])
        let reference = #"{"duration_ms":{"$from":"first","pointer":"/wait_ms"},"steps":{"$from":"first","pointer":"/steps/1"}}"#
        let submitted = try client.call("POST", "/workflows", json: #"""
            {"tasks": [{"key": "first", "kind": "external", "queue": "\#(upstream)"},
                       {"key": "second", "kind": "sleep", "queue": "\#(downstream)", "dependencies": ["first"], "params": \#(reference)}]}
            """#)
        try #require(submitted.status == 201, "\(submitted.text)")
        let keys = try #require(submitted.json["keys"] as? [String: String])
        let (first, second) = (keys["first"]!, keys["second"]!)
        let byID = reference.replacingOccurrences(of: #""first""#, with: #""\#(first)""#)
        let single = try OutputFlowTests.id(try client.submit(#"""
            {"kind":"sleep","queue":"\#(downstream)","dependencies":["\#(first)"],"params":\#(byID)}
            """#))
        try OutputFlowTests.complete(client, first)
        for id in [second, single] {
            #expect(OutputFlowTests.params(try client.waitForState(id, "succeeded")) == OutputFlowTests.resolved)
        }
        for replica in replicas { try replica.stop() }

        // Every cell opened again by another set of replicas, from the records alone.
        let moved = try Self.startCellReplicas("c3", "c4", on: url).replicas
        defer { for replica in moved { try? replica.stop() } }
        let again = try APIClient(ports: moved.map(\.port))
        for id in [second, single] {
            let task = try again.task(id)
            #expect(task["state"] as? String == "succeeded" && OutputFlowTests.params(task) == OutputFlowTests.resolved)
        }
    }
}

extension WorkerTests {
    /// The reference worker runs what its lease answer carries, resolved by the server; a value
    /// taken from a result that looks like a reference is data it sends as it is.
    @Test func aWorkerRunsATaskWithItsInputsResolved() throws {
        let (service, client) = try Self.server()
        let origin = try OriginServer()
        defer { origin.stop() }
        let worker = try Self.worker(port: service.port)
        let first = try OutputFlowTests.id(try client.submit(#"{"kind":"external"}"#))
        let completed = try client.call("POST", "/tasks/\(first)/complete", json: #"{"result":{"payload":{"$from":"elsewhere"}}}"#)
        try #require(completed.status == 200, "\(completed.text)")
        let post = try Self.submit(client, ["kind": "http", "dependencies": [first],
                                            "params": ["method": "POST", "url": origin.url("/echo"),
                                                       "body": ["$from": first, "pointer": "/payload"]]])
        let done = try client.waitForState(post, "succeeded", timeout: 20)
        #expect((done["params"] as? [String: Any])?["body"] as? [String: String] == ["$from": "elsewhere"])
        let sent = origin.requests.value.last { $0.path == "/echo" }?.body
        #expect(sent.map { String(decoding: $0, as: UTF8.self) } == #"{"$from":"elsewhere"}"#)
        #expect(try worker.stop() == 0)
        try service.stop()
    }
}
