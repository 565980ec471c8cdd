import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

/// `POST /tasks/batch` and `POST /tasks/reports` over real sockets: each item answered as its
/// single route would answer it, in order, under one 207; whole-request problems change
/// nothing; one commit per batch; batches whose items span cells, through replicas.
@Suite struct BatchAPITests {
    static func results(_ response: RawResponse, sourceLocation: SourceLocation = #_sourceLocation) throws -> [[String: Any]] {
        try #require(response.status == 207, "\(response.text)", sourceLocation: sourceLocation)
        return try #require(response.json["results"] as? [[String: Any]], sourceLocation: sourceLocation)
    }

    static func fields(_ result: [String: Any]) -> [String] {
        ((result["problem"] as? [String: Any])?["errors"] as? [[String: Any]] ?? []).compactMap { $0["field"] as? String }
    }

    static func code(_ result: [String: Any]) -> String? { (result["problem"] as? [String: Any])?["code"] as? String }

    static func taskID(_ result: [String: Any]) -> String? { (result["task"] as? [String: Any])?["id"] as? String }

    static func count(_ client: APIClient, queue: String) throws -> Int {
        try #require(try client.call("GET", "/tasks?queue=\(queue)&limit=1000").json["tasks"] as? [Any]).count
    }

    @Test func eachItemIsAnsweredAsPostTasksWouldInOrder() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let existing = try #require(try client.submit(#"{"kind":"external","queue":"mixed"}"#)["id"] as? String)
        let body = #"""
            {"tasks":[
              {"kind":"noop","queue":"mixed","name":"first"},
              {"queue":"mixed"},
              "not an object",
              {"kind":"noop","queue":"mixed","dependencies":["01ZZZZZZZZZZZZZZZZZZZZZZZZ"]},
              {"kind":"exec","queue":"mixed","params":{"argv":["true"]}},
              {"kind":"noop","queue":"mixed","dependencies":["\#(existing)"],"priority":3},
              {"kind":"noop","queue":"mixed","bogus":1}
            ]}
            """#
        let results = try Self.results(try client.call("POST", "/tasks/batch", json: body))
        #expect(results.map { $0["status"] as? Int } == [201, 422, 422, 422, 422, 201, 422])
        #expect(Self.fields(results[1]) == ["tasks[1].kind"])
        #expect(Self.fields(results[2]) == ["tasks[2]"])
        #expect(Self.code(results[3]) == "unknown_dependency" && Self.fields(results[3]) == ["tasks[3].dependencies[0]"])
        #expect(Self.code(results[4]) == "exec_not_allowed" && Self.fields(results[4]) == ["tasks[4].kind"])
        #expect(Self.fields(results[6]) == ["tasks[6].bogus"])
        // A problem is the whole problem+json its single route answers.
        let problem = try #require(results[1]["problem"] as? [String: Any])
        #expect(problem["status"] as? Int == 422 && problem["detail"] is String && problem["type"] is String)
        // The created tasks are there as answered, and only they.
        let first = try #require(Self.taskID(results[0]))
        #expect(try client.task(first)["name"] as? String == "first")
        let dependent = try client.task(try #require(Self.taskID(results[5])))
        #expect(dependent["state"] as? String == "pending" && dependent["dependencies"] as? [String] == [existing])
        #expect(try Self.count(client, queue: "mixed") == 3)
    }

    @Test func wholeRequestProblemsChangeNothing() throws {
        let service = try ServiceHarness { $0.maxBatchItems = 3 }
        defer { try? service.stop() }
        let client = try service.client()
        for route in ["/tasks/batch", "/tasks/reports"] {
            let member = route == "/tasks/batch" ? "tasks" : "reports"
            let item = route == "/tasks/batch" ? #"{"kind":"noop","queue":"whole"}"# : #"{"id":"01ZZZZZZZZZZZZZZZZZZZZZZZZ","complete":{}}"#
            #expect(try client.call("POST", route, json: "{").status == 400)
            #expect(try client.call("POST", route, json: "{}", contentType: "text/plain").status == 415)
            for (body, field) in [("[]", "body"), ("{}", member), (#"{"\#(member)":{}}"#, member), (#"{"\#(member)":[]}"#, member),
                                  (#"{"\#(member)":[\#(item)],"other":1}"#, "other")] {
                let answer = try client.call("POST", route, json: body)
                #expect(answer.status == 422 && answer.header("Content-Type") == "application/problem+json", "\(body): \(answer.text)")
                #expect((answer.json["errors"] as? [[String: Any]])?.first?["field"] as? String == field, "\(body): \(answer.text)")
            }
            let many = #"{"\#(member)":[\#(Array(repeating: item, count: 4).joined(separator: ","))]}"#
            let tooMany = try client.call("POST", route, json: many)
            #expect(tooMany.status == 422 && tooMany.json["code"] as? String == "too_many_items", "\(tooMany.text)")
            #expect((tooMany.json["errors"] as? [[String: Any]])?.first?["field"] as? String == member)
        }
        #expect(try Self.count(client, queue: "whole") == 0)
        let three = #"{"tasks":[\#(Array(repeating: #"{"kind":"noop","queue":"whole"}"#, count: 3).joined(separator: ","))]}"#
        #expect(try Self.results(try client.call("POST", "/tasks/batch", json: three)).count == 3)
    }

    @Test func reportsCompleteFailAndProgressManyTasksFencedByTheirLeases() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try LeaseAPITests.workersQueue(client, "bw")
        for _ in 0..<5 { _ = try client.submit(#"{"kind":"noop","queue":"bw"}"#) }
        let leased = try LeaseAPITests.lease(client, "bw", #"{"worker":"w1","max_tasks":5}"#)
        try #require(leased.count == 5)
        let ids = try leased.map(LeaseAPITests.id)
        let tokens = try leased.map(LeaseAPITests.token)
        // Another queue's external task, reported without a token as its single route takes it;
        // and a finished task of a server queue.
        let external = try #require(try client.submit(#"{"kind":"external","queue":"bx"}"#)["id"] as? String)
        let finished = try #require(try client.submit(#"{"kind":"noop","queue":"bs"}"#)["id"] as? String)
        _ = try client.waitForState(finished, "succeeded")
        let singleAnswer = try client.call("POST", "/tasks/\(finished)/complete", json: "{}").status
        let body = #"""
            {"reports":[
              {"id":"\#(ids[0])","lease_token":"\#(tokens[0])","complete":{"result":{"rows":7}}},
              {"id":"\#(ids[1])","lease_token":"\#(tokens[1])","fail":{"error":{"code":"bad_input","message":"no rows"}}},
              {"id":"\#(ids[2])","lease_token":"\#(tokens[2])","progress":{"fraction":0.5,"message":"half"}},
              {"id":"\#(ids[3])","lease_token":"stale","complete":{}},
              {"id":"01ZZZZZZZZZZZZZZZZZZZZZZZZ","complete":{}},
              {"id":"\#(ids[2])","lease_token":"\#(tokens[2])","complete":{}},
              {"id":"\#(ids[4])","lease_token":"\#(tokens[4])"},
              {"id":"01ZZZZZZZZZZZZZZZZZZZZZZZY","complete":{},"fail":{"error":{"message":"x"}}},
              {"id":"\#(external)","complete":{"result":"done"}},
              {"id":"\#(finished)","complete":{}},
              {"complete":{}}
            ]}
            """#
        let results = try Self.results(try client.call("POST", "/tasks/reports", json: body))
        #expect(results.map { $0["status"] as? Int } == [200, 200, 200, 409, 404, 422, 422, 422, 200, singleAnswer, 422])
        #expect((results[0]["task"] as? [String: Any])?["state"] as? String == "succeeded")
        #expect(Self.code(results[3]) == "lease_lost")
        #expect(Self.code(results[5]) == "duplicate_id" && Self.fields(results[5]) == ["reports[5].id"])
        #expect(Self.fields(results[6]) == ["reports[6]"] && Self.fields(results[7]) == ["reports[7]"])
        #expect(Self.fields(results[10]) == ["reports[10].id"])
        // What each report did, as the tasks show it now.
        let succeeded = try client.task(ids[0])
        #expect(succeeded["state"] as? String == "succeeded" && (succeeded["result"] as? [String: Any])?["rows"] as? Int == 7)
        let failed = try client.task(ids[1])
        #expect(failed["state"] as? String == "failed" && (failed["error"] as? [String: Any])?["code"] as? String == "bad_input")
        let progressed = try client.task(ids[2])
        #expect(progressed["state"] as? String == "running" && (progressed["progress"] as? [String: Any])?["fraction"] as? Double == 0.5)
        // The stale token, the duplicate and the bad items changed nothing.
        #expect(try client.task(ids[3])["state"] as? String == "running")
        #expect(try client.task(ids[4])["state"] as? String == "running")
        #expect(try client.task(external)["state"] as? String == "succeeded")
        // The leases still hold: the right tokens finish the rest.
        let rest = try Self.results(try client.call("POST", "/tasks/reports", json: #"""
            {"reports":[{"id":"\#(ids[3])","lease_token":"\#(tokens[3])","complete":{}},
                        {"id":"\#(ids[4])","lease_token":"\#(tokens[4])","complete":{}},
                        {"id":"\#(ids[2])","lease_token":"\#(tokens[2])","complete":{}}]}
            """#))
        #expect(rest.map { $0["status"] as? Int } == [200, 200, 200])
        #expect(try service.metric(#"taskloop_batch_items_total{route="/tasks/reports",status="200"}"#) == 7)
    }

    @Test func anIdempotentRetryCreatesNothingAndAnswersTheSameResults() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let body = #"{"tasks":[{"kind":"external","queue":"idem"},{"queue":"idem"},{"kind":"external","queue":"idem"}]}"#
        let first = try client.call("POST", "/tasks/batch", json: body, headers: ["Idempotency-Key": "batch-1"])
        let firstResults = try Self.results(first)
        let again = try client.call("POST", "/tasks/batch", json: body, headers: ["Idempotency-Key": "batch-1"])
        let againResults = try Self.results(again)
        #expect(again.header("Idempotent-Replayed") == "true")
        #expect(againResults.map { $0["status"] as? Int } == [201, 422, 201])
        #expect(againResults.map(Self.taskID) == firstResults.map(Self.taskID))
        #expect(Self.fields(againResults[1]) == ["tasks[1].kind"])
        #expect(try Self.count(client, queue: "idem") == 2)
        // Another request under the key, whichever replica or cell it reaches (items that are
        // not tasks name no queue), is refused and creates nothing.
        for body in [#"{"tasks":[{"kind":"noop","queue":"idem"}]}"#, #"{"tasks":[null,null]}"#] {
            for _ in service.ports {
                let other = try client.call("POST", "/tasks/batch", json: body, headers: ["Idempotency-Key": "batch-1"])
                #expect(other.status == 422 && other.json["code"] as? String == "idempotency_key_reused", "\(other.text)")
            }
        }
        #expect(try Self.count(client, queue: "idem") == 2)
    }

    /// Every item's change is in one store batch, one transaction, whatever the batch's size;
    /// and the 207 leaves once it is committed.
    @Test(.inTheDefaultStageOnly) func aBatchIsOneCommitAndSurvivesARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var service = try ServiceHarness.keepingState(in: directory)
        var client = try service.client()
        #expect(try client.call("PATCH", "/queues/held", json: #"{"paused":true}"#).status == 200)
        let before = try service.waitForIdleStore()
        let items = (0..<1_000).map { #"{"kind":"noop","queue":"held","name":"t\#($0)"}"# }.joined(separator: ",")
        let results = try Self.results(try client.call("POST", "/tasks/batch", json: #"{"tasks":[\#(items)]}"#))
        #expect(results.allSatisfy { $0["status"] as? Int == 201 })
        #expect(try service.waitForIdleStore() == before + 1, "one batch of 1,000 is one store batch")
        let ids = Set(results.compactMap(Self.taskID))
        #expect(ids.count == 1_000)
        try service.stop()

        service = try ServiceHarness.keepingState(in: directory)
        client = try service.client()
        let listed = try #require(try client.call("GET", "/tasks?queue=held&limit=1000").json["tasks"] as? [[String: Any]])
        #expect(Set(listed.compactMap { $0["id"] as? String }) == ids)
        try service.stop()
    }

    /// Through three replicas, a batch whose items belong to several cells: each replica serves
    /// its cells' part or forwards it, and the answers come back merged in order.
    @Test(.enabled(if: ServiceHarness.replicaCount > 1, "cells need replicas (TASKLOOP_TEST_REPLICAS)"))
    func aBatchSpanningCellsIsSplitAndMergedInOrder() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let queues = service.onLoop { application in
            let host = application.cellHost!
            var byCell: [Cell: String] = [:]
            for index in 0..<200 where byCell.count < 4 {
                let queue = "s\(index)"
                if byCell[host.cell(ofQueue: queue)] == nil { byCell[host.cell(ofQueue: queue)] = queue }
            }
            return byCell.values.sorted()
        }
        try #require(queues.count >= 3)
        for queue in queues { try LeaseAPITests.workersQueue(client, queue) }
        var items: [String] = []
        for round in 0..<3 {
            for queue in queues { items.append(#"{"kind":"noop","queue":"\#(queue)","name":"\#(queue)-\#(round)"}"#) }
            items.append(#"{"queue":"\#(queues[round])"}"#)
        }
        // Every replica splits alike: each gets the batch in turn (the client rotates).
        for _ in 0..<3 {
            let results = try Self.results(try client.call("POST", "/tasks/batch", json: #"{"tasks":[\#(items.joined(separator: ","))]}"#))
            #expect(results.count == items.count)
            for (index, result) in results.enumerated() {
                if items[index].contains("\"kind\"") {
                    #expect(result["status"] as? Int == 201, "\(index): \(result)")
                    let task = try #require(result["task"] as? [String: Any])
                    #expect(items[index].contains(#""name":"\#(task["name"] as? String ?? "?")""#))
                } else {
                    #expect(result["status"] as? Int == 422 && Self.fields(result) == ["tasks[\(index)].kind"], "\(result)")
                }
            }
        }
        // Leased from every cell, finished by one call that spans them.
        var reports: [String] = []
        var ids: [String] = []
        for queue in queues {
            let leased = try LeaseAPITests.lease(client, queue, #"{"worker":"w","max_tasks":1}"#)
            for task in leased {
                ids.append(try LeaseAPITests.id(task))
                reports.append(#"{"id":"\#(try LeaseAPITests.id(task))","lease_token":"\#(try LeaseAPITests.token(task))","complete":{}}"#)
            }
        }
        reports.append(#"{"id":"\#(ids[0])","complete":{}}"#)
        let results = try Self.results(try client.call("POST", "/tasks/reports", json: #"{"reports":[\#(reports.joined(separator: ","))]}"#))
        #expect(results.dropLast().allSatisfy { $0["status"] as? Int == 200 }, "\(results)")
        #expect(results.last?["status"] as? Int == 422 && Self.code(results.last!) == "duplicate_id")
        for id in ids { #expect(try client.task(id)["state"] as? String == "succeeded") }
        // A batch refused whole is refused before it is split: no part goes on without the rest.
        let before = try queues.map { try Self.count(client, queue: $0) }
        let unknownMember = try client.call("POST", "/tasks/batch", json: #"{"tasks":[\#(items.joined(separator: ","))],"other":1}"#)
        #expect(unknownMember.status == 422 && (unknownMember.json["errors"] as? [[String: Any]])?.first?["field"] as? String == "other")
        #expect(try queues.map { try Self.count(client, queue: $0) } == before)
        // An Idempotency-Key is kept by one cell: a keyed batch across cells is refused whole.
        let keyed = try client.call("POST", "/tasks/batch", json: #"{"tasks":[\#(items.joined(separator: ","))]}"#,
                                    headers: ["Idempotency-Key": "spans"])
        #expect(keyed.status == 422 && keyed.json["code"] as? String == "idempotency_key_spans_cells", "\(keyed.text)")
    }
}

extension ServiceHarness {
    /// The number of store batches sent once the store has nothing in flight.
    func waitForIdleStore() throws -> Int {
        try waitUntil("the store to catch up") { $0.sqlite?.isCaughtUp ?? true }
        return onLoop { $0.sqlite?.sentBatches ?? 0 }
    }
}
