import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// Worker leases over real sockets: the calls, their fencing, long polls, and exactly-once
/// handing out under contention; leases across a `kill -9` of the server.
@Suite struct LeaseAPITests {
    static func workersQueue(_ client: APIClient, _ name: String, concurrency: Int = 100) throws {
        let answer = try client.call("PATCH", "/queues/\(name)", json: #"{"dispatch":"workers","max_concurrency":\#(concurrency)}"#)
        try #require(answer.status == 200, "\(answer.text)")
        #expect(answer.json["dispatch"] as? String == "workers")
    }

    static func lease(_ client: APIClient, _ queue: String, _ body: String = #"{"worker":"w1"}"#,
                      timeout: Double = 5) throws -> [[String: Any]] {
        let answer = try client.call("POST", "/queues/\(queue)/lease", json: body, timeout: timeout)
        try #require(answer.status == 200, "\(answer.text)")
        return try #require(answer.json["tasks"] as? [[String: Any]])
    }

    static func token(_ task: [String: Any]) throws -> String {
        try #require((task["lease"] as? [String: Any])?["token"] as? String)
    }

    static func id(_ task: [String: Any]) throws -> String { try #require(task["id"] as? String) }

    @Test func leasingFollowsOrderLimitPauseAndKinds() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try Self.workersQueue(client, "gpu", concurrency: 3)
        // Exec is accepted into a workers queue although this server does not allow it.
        let exec = try Self.id(try client.submit(#"{"kind":"exec","queue":"gpu","params":{"argv":["true"]},"priority":-1}"#))
        let first = try Self.id(try client.submit(#"{"kind":"noop","queue":"gpu"}"#))
        let high = try Self.id(try client.submit(#"{"kind":"noop","queue":"gpu","priority":4}"#))
        let sleep = try Self.id(try client.submit(#"{"kind":"sleep","queue":"gpu","params":{"duration_ms":10}}"#))
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"exec","params":{"argv":["true"]}}"#).status == 422)
        // Nothing runs by itself.
        #expect(try client.task(first)["state"] as? String == "queued")
        let two = try Self.lease(client, "gpu", #"{"worker":"w1","max_tasks":2}"#)
        #expect(try two.map(Self.id) == [high, first])
        #expect(two.allSatisfy { ($0["state"] as? String) == "running" && ($0["lease"] as? [String: Any])?["worker"] as? String == "w1" })
        #expect(try Self.lease(client, "gpu", #"{"worker":"w2","kinds":["exec"],"max_tasks":5}"#).map(Self.id) == [exec])
        #expect(try Self.lease(client, "gpu", #"{"worker":"w2","max_tasks":5}"#).isEmpty) // 3 running: the limit
        // GET shows the lease without its token.
        let shown = try #require(try client.task(high)["lease"] as? [String: Any])
        #expect(shown["worker"] as? String == "w1" && shown["token"] == nil && shown["expires_at"] is String)
        let queue = try client.call("GET", "/queues/gpu").json
        #expect(queue["dispatch"] as? String == "workers" && (queue["counts"] as? [String: Int])?["running"] == 3)
        #expect(try client.call("PATCH", "/queues/gpu", json: #"{"paused":true,"max_concurrency":10}"#).status == 200)
        #expect(try Self.lease(client, "gpu", #"{"worker":"w2","max_tasks":5}"#).isEmpty)
        #expect(try client.call("PATCH", "/queues/gpu", json: #"{"paused":false}"#).status == 200)
        #expect(try Self.lease(client, "gpu", #"{"worker":"w2","max_tasks":5}"#).map(Self.id) == [sleep])
    }

    @Test func badLeaseCallsAreRefusedAndChangeNothing() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try Self.workersQueue(client, "gpu")
        let task = try Self.id(try client.submit(#"{"kind":"noop","queue":"gpu"}"#))
        for (body, field) in [(#"{}"#, "worker"), (#"{"worker":""}"#, "worker"), (#"{"worker":"w","max_tasks":0}"#, "max_tasks"),
                              (#"{"worker":"w","max_tasks":101}"#, "max_tasks"), (#"{"worker":"w","lease_ms":999}"#, "lease_ms"),
                              (#"{"worker":"w","wait_s":61}"#, "wait_s"), (#"{"worker":"w","kinds":["nope"]}"#, "kinds[0]"),
                              (#"{"worker":"w","kinds":[]}"#, "kinds"), (#"{"worker":"w","extra":1}"#, "extra")] {
            let answer = try client.call("POST", "/queues/gpu/lease", json: body)
            #expect(answer.status == 422, "\(body)")
            #expect((answer.json["errors"] as? [[String: Any]])?.first?["field"] as? String == field, "\(body): \(answer.text)")
        }
        #expect(try client.call("POST", "/queues/gpu/lease", json: "{").status == 400)
        #expect(try client.call("POST", "/queues/nowhere/lease", json: #"{"worker":"w"}"#).status == 404)
        let server = try client.call("POST", "/queues/default/lease", json: #"{"worker":"w"}"#)
        #expect(server.status == 409 && server.json["code"] as? String == "queue_not_leasable")
        #expect(try client.task(task)["state"] as? String == "queued")
    }

    @Test func aWaitingLeaseIsAnsweredAsSoonAsATaskArrives() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try Self.workersQueue(client, "gpu")
        let waiting = try service.client()
        let answer = Locked<[[String: Any]]?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            answer.withLock { $0 = try? Self.lease(waiting, "gpu", #"{"worker":"w","wait_s":30}"#, timeout: 40) }
            done.signal()
        }.start()
        try pollUntil("the lease call to wait") {
            (try client.call("GET", "/queues/gpu").json["waiting_workers"] as? Int) == 1
        }
        let started = Date()
        let id = try Self.id(try client.submit(#"{"kind":"noop","queue":"gpu"}"#))
        #expect(done.wait(timeout: .now() + 5) == .success)
        #expect(Date().timeIntervalSince(started) < 1)
        #expect(try answer.value?.map(Self.id) == [id])
        // A wait that times out answers with nothing.
        let empty = Date()
        #expect(try Self.lease(client, "gpu", #"{"worker":"w","wait_s":0.3}"#).isEmpty)
        #expect(Date().timeIntervalSince(empty) >= 0.29)
        // Counted by the replica that owns the queue.
        let metrics = try service.allMetrics()
        #expect(metrics.contains(#"taskloop_leases_granted_total{queue="gpu"} 1"#))
        #expect(metrics.contains("taskloop_lease_latency_seconds_count 1"))
    }

    /// A client that ends its side while its lease call waits gets its answer (no tasks) at
    /// once, and the call leaves the line: a task submitted then is not leased to nobody.
    @Test func aWaitingCallWhoseClientEndsItsSideIsAnsweredEmpty() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try Self.workersQueue(client, "gpu")
        let raw = try RawClient(port: service.port)
        let body = #"{"worker":"w","wait_s":30}"#
        try raw.send("POST /queues/gpu/lease HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)")
        try pollUntil("the call to wait") { (try client.call("GET", "/queues/gpu").json["waiting_workers"] as? Int) == 1 }
        raw.shutdownWrite()
        let answer = try raw.readResponse(timeout: 2)
        #expect(answer.status == 200 && (answer.json["tasks"] as? [Any])?.isEmpty == true)
        #expect(try client.call("GET", "/queues/gpu").json["waiting_workers"] as? Int == 0)
        let task = try Self.id(try client.submit(#"{"kind":"noop","queue":"gpu"}"#))
        #expect(try client.task(task)["state"] as? String == "queued")
    }

    @Test func heartbeatsReleaseCancelAndStaleTokens() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try Self.workersQueue(client, "gpu")
        let task = try Self.id(try client.submit(#"{"kind":"noop","queue":"gpu","retry":{"max_attempts":3,"backoff_ms":0}}"#))
        let leased = try #require(try Self.lease(client, "gpu", #"{"worker":"w","lease_ms":60000}"#).first)
        let token = try Self.token(leased)
        let beat = try client.call("POST", "/tasks/\(task)/heartbeat",
                                   json: #"{"lease_token":"\#(token)","lease_ms":120000,"progress":{"fraction":0.25,"message":"a quarter"}}"#)
        #expect(beat.status == 200 && beat.json["cancel_requested"] as? Bool == false)
        #expect((beat.json["lease"] as? [String: Any])?["expires_at"] is String)
        #expect((try client.task(task)["progress"] as? [String: Any])?["fraction"] as? Double == 0.25)
        // Release: queued again, attempt not consumed; the old token is dead everywhere.
        let released = try client.call("POST", "/tasks/\(task)/release", json: #"{"lease_token":"\#(token)"}"#)
        #expect(released.status == 200 && released.json["state"] as? String == "queued" && released.json["attempt"] as? Int == 1)
        for (path, body) in [("heartbeat", #"{"lease_token":"\#(token)"}"#), ("release", #"{"lease_token":"\#(token)"}"#),
                             ("progress", #"{"lease_token":"\#(token)","fraction":0.5}"#),
                             ("complete", #"{"lease_token":"\#(token)"}"#),
                             ("fail", #"{"lease_token":"\#(token)","error":{"message":"x"}}"#)] {
            let answer = try client.call("POST", "/tasks/\(task)/\(path)", json: body)
            #expect(answer.status == 409 && answer.json["code"] as? String == "lease_lost", "\(path): \(answer.text)")
        }
        let again = try #require(try Self.lease(client, "gpu", #"{"worker":"w2"}"#).first)
        let second = try Self.token(again)
        #expect(second != token)
        // Reports without the token, or with the old one, change nothing.
        #expect(try client.call("POST", "/tasks/\(task)/complete", json: #"{"result":1}"#).json["code"] as? String == "lease_lost")
        #expect(try client.call("POST", "/tasks/\(task)/complete", json: #"{"lease_token":"\#(token)"}"#).status == 409)
        #expect(try client.task(task)["state"] as? String == "running")
        // Cancel reaches the worker through its heartbeat; its report ends the task cancelled.
        let cancel = try client.call("DELETE", "/tasks/\(task)")
        #expect(cancel.status == 202 && cancel.json["cancel_requested"] as? Bool == true)
        let told = try client.call("POST", "/tasks/\(task)/heartbeat", json: #"{"lease_token":"\#(second)"}"#)
        #expect(told.json["cancel_requested"] as? Bool == true)
        let stopped = try client.call("POST", "/tasks/\(task)/fail",
                                      json: #"{"lease_token":"\#(second)","error":{"code":"cancelled","message":"stopped"}}"#)
        #expect(stopped.status == 200 && stopped.json["state"] as? String == "cancelled" && stopped.json["lease"] is NSNull)
    }

    @Test func anExpiredLeaseRetriesAndThenPoisons() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try Self.workersQueue(client, "gpu")
        let task = try Self.id(try client.submit(#"{"kind":"noop","queue":"gpu","retry":{"max_attempts":2,"backoff_ms":0}}"#))
        let first = try Self.token(try #require(try Self.lease(client, "gpu", #"{"worker":"w","lease_ms":1000}"#).first))
        // The lease lapses; the second attempt is leasable again (a long poll waits for it).
        let second = try #require(try Self.lease(client, "gpu", #"{"worker":"w","lease_ms":1000,"wait_s":10}"#, timeout: 15).first)
        let secondToken = try Self.token(second)
        #expect(second["attempt"] as? Int == 2 && secondToken != first)
        #expect(try client.call("POST", "/tasks/\(task)/heartbeat", json: #"{"lease_token":"\#(first)"}"#).status == 409)
        let failed = try client.waitForState(task, "failed")
        #expect((failed["error"] as? [String: Any])?["code"] as? String == "lease_expired")
        #expect(try service.metric(#"taskloop_leases_expired_total{queue="gpu"}"#) == 2)
        #expect(try service.metric(#"taskloop_leases_poisoned_total{queue="gpu"}"#) == 1)
    }

    /// 1,000 tasks, 8 lessees on their own connections, leasing and completing as fast as they
    /// can: each task is leased once and completed once, and nothing is left over.
    @Test func exactlyOnceUnderContention() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        try Self.workersQueue(client, "bulk", concurrency: 64)
        let tasks = (0..<1_000).map { #"{"key":"t\#($0)","kind":"noop","queue":"bulk"}"# }
        let created = try client.call("POST", "/workflows", json: #"{"tasks":["# + tasks.joined(separator: ",") + "]}")
        try #require(created.status == 201)
        let workflow = try #require(created.json["id"] as? String)
        let leasedIDs = Locked<[String]>([])
        let completed = Locked<Int>(0)
        let failures = Locked<[String]>([])
        let group = DispatchGroup()
        for worker in 0..<8 {
            group.enter()
            Thread {
                defer { group.leave() }
                do {
                    let connection = try service.client()
                    while true {
                        let batch = try Self.lease(connection, "bulk", #"{"worker":"w\#(worker)","max_tasks":5}"#)
                        if batch.isEmpty { return }
                        for task in batch {
                            let id = try Self.id(task)
                            leasedIDs.withLock { $0.append(id) }
                            let done = try connection.call("POST", "/tasks/\(id)/complete",
                                                           json: #"{"lease_token":"\#(try Self.token(task))","result":\#(worker)}"#)
                            if done.status == 200 { completed.withLock { $0 += 1 } } else {
                                failures.withLock { $0.append("\(id): \(done.status)") }
                            }
                        }
                    }
                } catch {
                    failures.withLock { $0.append("worker \(worker): \(error)") }
                }
            }.start()
        }
        #expect(group.wait(timeout: .now() + 60) == .success)
        #expect(failures.value.isEmpty, "\(failures.value.prefix(5))")
        #expect(leasedIDs.value.count == 1_000 && Set(leasedIDs.value).count == 1_000)
        #expect(completed.value == 1_000)
        #expect(try client.waitForWorkflowToEnd(workflow, timeout: 10)["state"] as? String == "succeeded")
    }
}

/// Leases are state like any other: a worker's lease and token survive `kill -9` of the server.
@Suite(.serialized) struct LeaseRestartTests {
    @Test func aLeaseAndItsTokenSurviveKill9() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try DurabilityTests.start(directory)
        try LeaseAPITests.workersQueue(client, "gpu")
        let kept = try LeaseAPITests.id(try client.submit(#"{"kind":"exec","queue":"gpu","params":{"argv":["true"]}}"#))
        let lapsing = try LeaseAPITests.id(try client.submit(#"{"kind":"noop","queue":"gpu"}"#))
        let keptToken = try LeaseAPITests.token(try #require(try LeaseAPITests.lease(client, "gpu", #"{"worker":"w","lease_ms":600000}"#).first))
        _ = try LeaseAPITests.lease(client, "gpu", #"{"worker":"w","lease_ms":1000}"#)
        kill(binary.process.processIdentifier, SIGKILL)
        #expect(try binary.waitForExit() == SIGKILL)

        (binary, client) = try DurabilityTests.start(directory)
        #expect(try client.call("GET", "/queues/gpu").json["dispatch"] as? String == "workers")
        let task = try client.task(kept)
        #expect(task["state"] as? String == "running" && (task["lease"] as? [String: Any])?["worker"] as? String == "w")
        #expect(try client.call("POST", "/tasks/\(kept)/heartbeat", json: #"{"lease_token":"\#(keptToken)"}"#).status == 200)
        let done = try client.call("POST", "/tasks/\(kept)/complete", json: #"{"lease_token":"\#(keptToken)","result":"ok"}"#)
        #expect(done.status == 200 && done.json["state"] as? String == "succeeded")
        // The short lease ran out while the server was down (or right after): the attempt ended.
        let lapsed = try client.waitForState(lapsing, "failed")
        #expect((lapsed["error"] as? [String: Any])?["code"] as? String == "lease_expired")
        // SIGTERM keeps a leased task leased: its worker is still at it.
        let third = try LeaseAPITests.id(try client.submit(#"{"kind":"noop","queue":"gpu"}"#))
        let thirdToken = try LeaseAPITests.token(try #require(try LeaseAPITests.lease(client, "gpu", #"{"worker":"w","lease_ms":600000}"#).first))
        #expect(try binary.stop() == 0)
        (binary, client) = try DurabilityTests.start(directory)
        #expect(try client.task(third)["state"] as? String == "running")
        #expect(try client.call("POST", "/tasks/\(third)/complete", json: #"{"lease_token":"\#(thirdToken)"}"#).status == 200)
        #expect(try binary.stop() == 0)
    }
}
