import Foundation
import Testing
import TaskloopCluster
import TaskloopLoop
import TaskloopLoopTestSupport
@testable import TaskloopService
import TaskloopTestSupport

/// The service on cells (`--database-url`): each cell's engine commits to PostgreSQL under
/// its epoch, and a replica that starts again on the same database serves what was committed.
@Suite(.serialized, .inTheDefaultStageOnly)
struct CellServiceTests {
    static let cellCount = 8

    @Test func tasksOfManyCellsAreServedAndSurviveARestart() throws {
        let (url, replicas) = try Self.startCellReplicas("c0")
        var service = replicas[0]
        let client = try service.client()
        // Queues spread over the cells; each task is served by its queue's cell.
        var ids: [String: String] = [:]
        for index in 0..<24 {
            let queue = "q\(index)"
            let task = try client.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)
            ids[queue] = task["id"] as? String
        }
        for (queue, id) in ids {
            let task = try client.waitForState(id, "succeeded")
            #expect(task["queue"] as? String == queue)
        }
        let waiting = try client.submit(#"{"kind":"sleep","params":{"duration_ms":600000},"queue":"long"}"#)
        let waitingID = try #require(waiting["id"] as? String)
        _ = try client.waitForState(waitingID, "running")
        let dependent = try client.submit(#"{"kind":"noop","queue":"long","dependencies":["\#(waitingID)"]}"#)
        let dependentID = try #require(dependent["id"] as? String)
        #expect(try client.call("GET", "/tasks/01ZZZZZZZZZZZZZZZZZZZZZZZZ").status == 404)
        try service.stop()

        service = try Self.startCellReplicas("c0", on: url).replicas[0]
        let again = try service.client()
        for (queue, id) in ids {
            let task = try again.task(id)
            #expect(task["state"] as? String == "succeeded" && task["queue"] as? String == queue)
        }
        // Stopped at the shutdown and queued again, its attempt not spent, it runs again here.
        let restarted = try again.waitForState(waitingID, "running")
        #expect(restarted["attempt"] as? Int == 1)
        #expect(try again.task(dependentID)["state"] as? String == "pending")
        let cancel = try again.call("DELETE", "/tasks/\(waitingID)")
        #expect(cancel.status == 200 || cancel.status == 202)
        _ = try again.waitForState(waitingID, "cancelled")
        _ = try again.waitForState(dependentID, "cancelled")
        try service.stop()
    }
}

extension CellServiceTests {
    /// Two queues of different cells.
    static func queuesOfTwoCells(_ service: ServiceHarness) -> (String, String) {
        service.onLoop { application in
            let host = application.cellHost!
            let first = "a0"
            let second = (1...).lazy.map { "b\($0)" }.first { host.cell(ofQueue: $0) != host.cell(ofQueue: first) }!
            return (first, second)
        }
    }

    @Test func dependenciesAcrossCellsReleaseAndCancelTheirDependents() throws {
        let service = try Self.startCellReplicas("c0").replicas[0]
        let client = try service.client()
        let (upstream, downstream) = Self.queuesOfTwoCells(service)
        let first = try client.submit(#"{"kind":"sleep","params":{"duration_ms":300},"queue":"\#(upstream)"}"#)
        let firstID = try #require(first["id"] as? String)
        let released = try client.submit(#"{"kind":"noop","queue":"\#(downstream)","dependencies":["\#(firstID)"]}"#)
        let releasedID = try #require(released["id"] as? String)
        #expect(released["state"] as? String == "pending")
        _ = try client.waitForState(firstID, "succeeded")
        _ = try client.waitForState(releasedID, "succeeded")

        let doomed = try client.submit(#"{"kind":"sleep","params":{"duration_ms":600000},"queue":"\#(upstream)"}"#)
        let doomedID = try #require(doomed["id"] as? String)
        let cascaded = try client.submit(#"{"kind":"noop","queue":"\#(downstream)","dependencies":["\#(doomedID)"]}"#)
        let cascadedID = try #require(cascaded["id"] as? String)
        _ = try client.call("DELETE", "/tasks/\(doomedID)")
        let cancelled = try client.waitForState(cascadedID, "cancelled")
        #expect((cancelled["error"] as? [String: Any])?["code"] as? String == "dependency_failed")
        // A retry of the dependency brings its dependent back, across the cells again.
        #expect(try client.call("POST", "/tasks/\(doomedID)/retry").status == 200)
        try pollUntil("the dependent to come back", timeout: 10) { try client.task(cascadedID)["state"] as? String == "pending" }

        // A dependency of another cell that no cell has is refused as a single server refuses
        // it, and nothing is created: an id of the upstream cell with another random part.
        let unknown = String(firstID.dropLast()) + (firstID.last == "0" ? "1" : "0")
        let before = try client.call("GET", "/tasks?queue=\(downstream)").json["tasks"] as? [Any]
        for body in [#"{"kind":"noop","queue":"\#(downstream)","dependencies":["\#(firstID)","\#(unknown)"]}"#,
                     #"{"tasks":[{"key":"a","kind":"noop","queue":"\#(downstream)","dependencies":["\#(unknown)"]}]}"#] {
            let refused = try client.call("POST", body.hasPrefix(#"{"tasks""#) ? "/workflows" : "/tasks", json: body)
            #expect(refused.status == 422 && refused.json["code"] as? String == "unknown_dependency", "\(refused.text)")
            #expect(refused.text.contains(body.hasPrefix(#"{"tasks""#) ? #""field":"tasks[0].dependencies[0]""# : #""field":"dependencies[1]""#),
                    "\(refused.text)")
        }
        #expect((try client.call("GET", "/tasks?queue=\(downstream)").json["tasks"] as? [Any])?.count == before?.count)
        try service.stop()
    }
}

extension CellServiceTests {
    /// Each replica serves its own cells and forwards the rest: a client may send anything to
    /// either, and a task's calls work through the replica that does not own it.
    @Test func anyReplicaAnswersForEveryCell() throws {
        let replicas = try Self.startCellReplicas("c0", "c1").replicas
        let (first, second) = (replicas[0], replicas[1])
        let client = try APIClient(ports: [first.port, second.port])
        var ids: [String] = []
        for index in 0..<16 {
            ids.append(try #require(try client.submit(#"{"kind":"noop","queue":"q\#(index)"}"#)["id"] as? String))
        }
        for id in ids {
            for _ in 0..<2 { _ = try client.waitForState(id, "succeeded") }
        }
        let forwarded = try #require(try first.metric("taskloop_requests_forwarded_total"))
        #expect(forwarded > 0)
        // A worker leases, heartbeats and completes through the replica that does not own it.
        let (queue, _) = Self.queuesOfTwoCells(first)
        let owner = first.onLoop { application in
            if case .here = application.cellHost!.placement(of: application.cellHost!.cell(ofQueue: queue)) { return 0 }
            return 1
        }
        let other = try APIClient(port: [first, second][1 - owner].port)
        #expect(try other.call("PATCH", "/queues/\(queue)", json: #"{"dispatch":"workers"}"#).status == 200)
        let external = try #require(try other.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String)
        let leased = try other.call("POST", "/queues/\(queue)/lease", json: #"{"worker":"w","wait_s":5}"#, timeout: 10)
        let tasks = try #require(leased.json["tasks"] as? [[String: Any]])
        #expect(tasks.first?["id"] as? String == external)
        let token = try #require((tasks.first?["lease"] as? [String: Any])?["token"] as? String)
        #expect(try other.call("POST", "/tasks/\(external)/complete", json: #"{"lease_token":"\#(token)","result":{"ok":1}}"#).status == 200)
        #expect(try client.task(external)["state"] as? String == "succeeded")
        try second.stop()
        try first.stop()
    }
}

extension CellServiceTests {
    /// Lists read every cell's records, on any replica, as a single server lists its tasks.
    @Test func listsOnAnyReplicaShowEveryCell() throws {
        let replicas = try Self.startCellReplicas("l0", "l1").replicas
        let (first, second) = (replicas[0], replicas[1])
        let client = try APIClient(ports: [first.port, second.port])
        var ids: [String] = []
        for index in 0..<12 {
            ids.append(try #require(try client.submit(#"{"kind":"noop","queue":"list\#(index)","name":"n\#(index)"}"#)["id"] as? String))
        }
        for id in ids { _ = try client.waitForState(id, "succeeded") }
        let workflow = try client.call("POST", "/workflows", json: #"{"name":"w","tasks":[{"key":"a","kind":"noop","queue":"list0"},{"key":"b","kind":"noop","queue":"list0","dependencies":["a"]}]}"#)
        #expect(workflow.status == 201)
        let workflowID = try #require(workflow.json["id"] as? String)
        _ = try client.waitForWorkflowToEnd(workflowID, timeout: 10)
        for port in [first.port, second.port] {
            let each = try APIClient(port: port)
            let page = try each.call("GET", "/tasks?limit=1000")
            #expect(page.status == 200 && page.header("Event-Seq")?.count == 24)
            let listed = (page.json["tasks"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
            #expect(Set(ids).isSubset(of: Set(listed)) && listed.count == ids.count + 2)
            #expect(listed == listed.sorted(by: >), "newest first")
            let named = try each.call("GET", "/tasks?name=n3").json["tasks"] as? [[String: Any]]
            #expect(named?.compactMap { $0["id"] as? String } == [ids[3]])
            let queues = (try each.call("GET", "/queues").json["queues"] as? [[String: Any]] ?? []).compactMap { $0["name"] as? String }
            #expect(Set((0..<12).map { "list\($0)" }).isSubset(of: Set(queues)))
            let queue = try each.call("GET", "/queues/list3")
            #expect(queue.status == 200 && (queue.json["counts"] as? [String: Any])?["succeeded"] as? Int == 1)
            #expect(try each.call("GET", "/queues/none-such").status == 404)
            let read = try each.call("GET", "/workflows/\(workflowID)")
            #expect(read.status == 200 && read.json["state"] as? String == "succeeded" && (read.json["tasks"] as? [Any])?.count == 2)
        }
        try second.stop()
        try first.stop()
    }
}
extension CellServiceTests {
    /// Three queues of three different cells.
    static func queuesOfThreeCells(_ service: ServiceHarness) -> [String] {
        service.onLoop { application in
            let host = application.cellHost!
            var queues: [String] = []
            var index = 0
            while queues.count < 3 {
                let name = "wq\(index)"
                if !queues.contains(where: { host.cell(ofQueue: $0) == host.cell(ofQueue: name) }) { queues.append(name) }
                index += 1
            }
            return queues
        }
    }

    /// A workflow whose tasks span three cells runs through, is read whole on any replica, and
    /// is cancelled and retried as one.
    @Test func aWorkflowAcrossThreeCells() throws {
        let replicas = try Self.startCellReplicas("w0", "w1").replicas
        let (first, second) = (replicas[0], replicas[1])
        let client = try APIClient(ports: [first.port, second.port])
        let queues = Self.queuesOfThreeCells(first)
        let body = """
            {"name":"spread","tasks":[{"key":"a","kind":"noop","queue":"\(queues[0])"},
             {"key":"b","kind":"noop","queue":"\(queues[1])","dependencies":["a"]},
             {"key":"c","kind":"noop","queue":"\(queues[2])","dependencies":["b"]}]}
            """
        let submitted = try client.call("POST", "/workflows", json: body, headers: ["Idempotency-Key": "spread-1"])
        #expect(submitted.status == 201, "\(submitted.text)")
        let id = try #require(submitted.json["id"] as? String)
        let keys = try #require(submitted.json["keys"] as? [String: String])
        #expect(keys.count == 3)
        // The answer lists every member, those its other cells have yet to make among them.
        let listed = submitted.json["tasks"] as? [[String: Any]] ?? []
        #expect(listed.compactMap { $0["id"] as? String } == ["a", "b", "c"].compactMap { keys[$0] }, "\(submitted.text)")
        #expect(listed.allSatisfy { $0["workflow"] as? String == id && $0["queue"] is String })
        #expect((listed.last?["dependencies"] as? [String]) == [keys["b"]!])
        for port in [first.port, second.port] {
            try pollUntil("the workflow to succeed", timeout: 10) {
                try APIClient(port: port).call("GET", "/workflows/\(id)").json["state"] as? String == "succeeded"
            }
            let read = try APIClient(port: port).call("GET", "/workflows/\(id)").json
            let states = (read["tasks"] as? [[String: Any]] ?? []).compactMap { $0["state"] as? String }
            #expect(states == ["succeeded", "succeeded", "succeeded"], "\(read)")
            // Sent again under its key, on either replica: the workflow as it is, every member.
            let replayed = try APIClient(port: port).call("POST", "/workflows", json: body, headers: ["Idempotency-Key": "spread-1"])
            #expect(replayed.status == 201 && replayed.headers.contains { $0.0 == "Idempotent-Replayed" }, "\(replayed.text)")
            #expect((replayed.json["tasks"] as? [[String: Any]] ?? []).compactMap { $0["state"] as? String } == states)
        }
        // Each member names its workflow, as its cell's owner answers it (the members of other
        // cells than the workflow's home hold no record of it).
        for (key, member) in keys {
            #expect(try client.task(member)["workflow"] as? String == id, "member \(key)")
        }
        // Cancelled as one: a long first task, its dependents across the cells.
        let long = try client.call("POST", "/workflows", json: """
            {"tasks":[{"key":"a","kind":"sleep","params":{"duration_ms":600000},"queue":"\(queues[0])"},
             {"key":"b","kind":"noop","queue":"\(queues[1])","dependencies":["a"]},
             {"key":"c","kind":"sleep","params":{"duration_ms":600000},"queue":"\(queues[2])"}]}
            """)
        let longID = try #require(long.json["id"] as? String)
        let longKeys = try #require(long.json["keys"] as? [String: String])
        try pollUntil("the third task to run", timeout: 10) {
            let task = try client.task(longKeys["c"]!)
            if task["state"] as? String == "cancelled" { Issue.record("\(task)") }
            return task["state"] as? String == "running"
        }
        #expect(try client.call("DELETE", "/workflows/\(longID)").status == 200)
        for key in ["a", "b", "c"] { _ = try client.waitForState(longKeys[key]!, "cancelled") }
        try pollUntil("the workflow to be cancelled", timeout: 10) {
            try client.call("GET", "/workflows/\(longID)").json["state"] as? String == "cancelled"
        }
        let retried = try client.call("POST", "/workflows/\(longID)/retry")
        #expect(retried.status == 200 && retried.json["retried"] as? Int == 3, "\(retried.text)")
        // Brought back in its own cell once the retry reaches it.
        try pollUntil("the third task to run again", timeout: 10) { try client.task(longKeys["c"]!)["state"] as? String == "running" }
        try second.stop()
        try first.stop()
    }
}

extension CellServiceTests {
    /// A replica of a newer protocol joins: this one hands its cells over, leaves, and answers
    /// its health check and requests 503 replica_superseded; what it committed is the newer
    /// one's now.
    @Test func aReplicaOfANewerProtocolSupersedesThisOne() throws {
        let (url, replicas) = try Self.startCellReplicas("old")
        let older = replicas[0]
        let client = try older.client()
        let id = try #require(try client.submit(#"{"kind":"noop"}"#)["id"] as? String)
        _ = try client.waitForState(id, "succeeded")

        let thread = LoopThread(try EventLoop(), name: "newer-keeper")
        let opened = Locked(0)
        let newer = thread.run {
            var settings = CellKeeper.Settings(url: url, identity: ReplicaIdentity(name: "new", incarnation: "new"),
                                               address: "127.0.0.1:1", ownership: CellOwnership.Settings(leaseMilliseconds: 2_000,
                                                                                                         marginMilliseconds: 300))
            settings.protocolVersion = ClusterSchema.protocolVersion + 1
            let keeper = try! CellKeeper(loop: thread.loop, settings: settings)
            keeper.onOpen = { _, _ in opened.withLock { $0 += 1 } }
            keeper.start { _ in }
            return LoopBound(keeper, loop: thread.loop)
        }
        try pollUntil("the newer replica to take every cell", timeout: 20) { opened.value == Self.cellCount }
        let health = try client.call("GET", "/healthz")
        #expect(health.status == 503 && health.json["code"] as? String == "replica_superseded", "\(health.text)")
        let refused = try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#)
        #expect(refused.status == 503 && refused.json["code"] as? String == "replica_superseded")
        #expect(try client.call("GET", "/tasks/\(id)").status == 503)
        #expect(older.onLoop { $0.cellHost?.openEngines.count } == 0)
        try older.stop()
        thread.run {
            newer.value.abandon()
            thread.loop.finish()
        }
        try thread.waitForExit(timeout: 10)
    }
}

extension CellServiceTests {
    /// A change whose cell closes before it is committed (here the replica's renewals and its
    /// commit wait on a row lock, so it gives its cells up) is answered at once as not made:
    /// not left waiting for a commit that cannot hold it, nor called committed by another.
    @Test func aChangeLostWithItsClosedCellIsAnsweredAsNotMade() throws {
        // A PostgreSQL of its own: the row lock taken here must hold back no other suite.
        let postgres = try PostgresCluster.start()
        defer { try? postgres.stop() }
        let (url, replicas) = try Self.startCellReplicas("z0", on: try postgres.makeDatabase()) {
            $0.sharedDatabase!.leaseMilliseconds = 2_000
        }
        let service = replicas[0]
        let layout = CellLayout(count: Self.cellCount)
        let other = try #require((0..<100).map { "other\($0)" }.first { layout.cell(ofQueue: $0) != layout.cell(ofQueue: "held") })
        func count(_ condition: String) -> String? {
            try? postgres.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND \(condition)",
                              database: url).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        // Another session holds the row of the cell of queue `held`.
        let lock = try CellRowLock(layout.cell(ofQueue: "held").index, url: url)
        try pollUntil("the row lock") { count("state = 'idle in transaction' AND query LIKE '%FOR UPDATE%'") == "1" }

        let answers = Locked<[String: Int]>([:])
        func submit(to queue: String) throws -> Thread {
            let client = try service.client()
            let thread = Thread {
                let status = (try? client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"\#(queue)"}"#, timeout: 60))?.status ?? 0
                answers.withLock { $0[queue] = status }
            }
            thread.start()
            return thread
        }
        // A change to that cell: its commit waits for the lock.
        _ = try submit(to: "held")
        try pollUntil("the commit to wait for the lock") { count("wait_event_type = 'Lock' AND query LIKE '%fence_commits%'") == "1" }
        // A change to another cell, for the next commit; the renewals wait for the lock too,
        // so the replica closes its cells before that commit is sent.
        _ = try submit(to: other)
        try pollUntil("the answer to the change its cell lost", timeout: 20) { answers.value[other] != nil }
        #expect(answers.value[other] == 503)
        #expect(answers.value["held"] == nil, "the commit that waits for the lock was not answered")

        try lock.release()
        try pollUntil("the answer to the change whose commit waited", timeout: 20) { answers.value["held"] != nil }
    }
}

extension CellServiceTests {
    /// A replica whose cells have gone as it stops holds no task: a request that still
    /// reaches it on a kept-alive connection (as one its peer forwarded before it learned) is
    /// told the cell moved on, 503, for its forwarder to ask the next owner, never answered
    /// from the empty engine left behind (a 404 for a task that exists).
    @Test func aStoppingReplicaWhoseCellsHaveGoneSendsRequestsOn() throws {
        let (_, replicas) = try Self.startCellReplicas("s0", "s1") { $0.sharedDatabase!.releasedCellsLingerMilliseconds = 30_000 }
        let queue = Self.queue(ownedBy: replicas[1], "sq")
        let id = try #require(try replicas[0].client().submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String)
        let kept = try APIClient(port: replicas[1].port)
        #expect(try kept.call("GET", "/tasks/\(id)").status == 200)
        let stopping = Thread { try? replicas[1].stop(timeout: 60) }
        stopping.start()
        // Its cells gone, it closes its listener; its kept-alive connections linger.
        let port = replicas[1].port
        try pollUntil("s1's cells to be gone", timeout: 30) { (try? RawClient(port: port)) == nil }
        let answer = try kept.call("GET", "/tasks/\(id)", headers: [ClusterForwarder.forwardedByField: "s0"])
        #expect(answer.status == 503, "\(answer.status) \(answer.text)")
        #expect(answer.text.contains("moving"), "\(answer.text)")
        #expect(try replicas[0].client().call("GET", "/tasks/\(id)").status == 200)
        try replicas[0].stop()
    }
}

extension CellServiceTests {
    /// A forwarded request's answer was made durable by the owner: the replica that forwarded it
    /// passes it on at once, even while a commit of its own waits (here on a row lock). It held
    /// such answers for its own commits, which cost every forwarded request a commit more.
    @Test func aForwardedAnswerDoesNotWaitForTheForwardersCommit() throws {
        // A PostgreSQL of its own: the row lock taken here must hold back no other suite.
        let postgres = try PostgresCluster.start()
        defer { try? postgres.stop() }
        let url = try postgres.makeDatabase()
        let first = try Self.cellReplica(url, name: "f0")
        let second = try Self.cellReplica(url, name: "f1")
        try Self.waitForEveryCell([first, second])
        let (held, forwarded) = first.onLoop { application in
            let host = application.cellHost!
            let queues = (0...).lazy.map { "fq\($0)" }
            func ownedHere(_ queue: String) -> Bool {
                if case .here = host.placement(of: host.cell(ofQueue: queue)) { return true }
                return false
            }
            return (queues.first(where: ownedHere)!, queues.first { !ownedHere($0) }!)
        }
        func count(_ condition: String) -> String? {
            try? postgres.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND \(condition)",
                              database: url).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        // Another session holds the row of the cell of queue `held`, one of the first replica's.
        let lock = try CellRowLock(first.onLoop { $0.cellHost!.cell(ofQueue: held).index }, url: url)
        try pollUntil("the row lock") { count("state = 'idle in transaction' AND query LIKE '%FOR UPDATE%'") == "1" }

        let heldStatus = Locked<Int?>(nil)
        let client = try APIClient(port: first.port)
        let thread = Thread {
            let status = (try? client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"\#(held)"}"#, timeout: 60))?.status ?? 0
            heldStatus.withLock { $0 = status }
        }
        thread.start()
        try pollUntil("the first replica's commit to wait for the lock") {
            count("wait_event_type = 'Lock' AND query LIKE '%fence_commits%'") == "1"
        }
        let answer = try APIClient(port: first.port).call("POST", "/tasks", json: #"{"kind":"noop","queue":"\#(forwarded)"}"#, timeout: 10)
        #expect(answer.status == 201, "\(answer.status) \(answer.text)")
        #expect(heldStatus.value == nil, "the first replica's commit was not waiting any more")

        try lock.release()
        try pollUntil("the answer to the change whose commit waited", timeout: 20) { heldStatus.value != nil }
        #expect(heldStatus.value == 201)
        try second.stop()
        try first.stop()
    }
}

