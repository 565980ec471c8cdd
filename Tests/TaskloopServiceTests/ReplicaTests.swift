import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// Several replicas on one PostgreSQL (a throwaway cluster), each a whole service on a loop of
/// its own: they behave as one service.
@Suite(.inTheDefaultStageOnly) struct ReplicaTests {
    /// `count` replicas sharing a database (a new one unless given), once their cells have
    /// spread over them.
    static func replicas(_ count: Int, on database: String? = nil,
                         configure: (inout ServiceConfiguration) -> Void = { _ in }) throws -> [ServiceHarness] {
        try CellServiceTests.startCellReplicas(named: (0..<count).map { "r\($0)" }, on: database, configure: configure).replicas
    }

    @Test func aTaskSubmittedOnOneReplicaIsSeenWaitedForAndCancelledOnTheOthers() throws {
        let replicas = try Self.replicas(3)
        let clients = try replicas.map { try $0.client() }
        let task = try clients[0].submit(#"{"kind":"sleep","params":{"duration_ms":300}}"#)
        let id = try #require(task["id"] as? String)
        // Seen at once elsewhere: a read catches up with what was committed before it.
        let seen = try clients[1].call("GET", "/tasks/\(id)")
        #expect(seen.status == 200 && ["queued", "running"].contains(seen.json["state"] as? String))
        // Waited for on a third: its wait wakes when the replica running it commits the end.
        let waited = try clients[2].call("GET", "/tasks/\(id)?wait=10", timeout: 15)
        #expect(waited.json["state"] as? String == "succeeded")

        let long = try clients[0].submit(#"{"kind":"sleep","params":{"duration_ms":60000}}"#)
        let longID = try #require(long["id"] as? String)
        _ = try clients[0].waitForState(longID, "running")
        // The owner of its cell stops the sleep at once, whichever replica the call reached.
        let cancel = try clients[1].call("DELETE", "/tasks/\(longID)")
        #expect(cancel.status == 200 && cancel.json["state"] as? String == "cancelled", "\(cancel.status) \(cancel.text)")
        let cancelled = try clients[2].call("GET", "/tasks/\(longID)?wait=10", timeout: 15)
        #expect(cancelled.json["state"] as? String == "cancelled")
        // Each replica counts the commits of its own cells, and says it reaches the database.
        let commits = try replicas.compactMap { try $0.metric("taskloop_cell_commits_total") }.reduce(0, +)
        #expect(commits >= 2, "\(commits) commits")
        for client in clients { #expect(try client.call("GET", "/metrics").text.contains("taskloop_replica_database_up 1")) }
        for replica in replicas { try replica.stop() }
    }

    @Test func aQueuesLimitHoldsAcrossReplicasAndEveryTaskRunsOnce() throws {
        let replicas = try Self.replicas(3)
        let clients = try replicas.map { try $0.client() }
        #expect(try clients[0].call("PATCH", "/queues/limited", json: #"{"max_concurrency":2}"#).status == 200)
        var ids: [String] = []
        for index in 0..<12 {
            let task = try clients[index % 3].submit(#"{"kind":"sleep","queue":"limited","params":{"duration_ms":50}}"#)
            ids.append(task["id"] as! String)
        }
        var most = 0
        try pollUntil("every task to finish", timeout: 30, every: 5_000) {
            let queue = try clients[ids.count % 3].call("GET", "/queues/limited").json
            let counts = queue["counts"] as? [String: Any] ?? [:]
            most = max(most, counts["running"] as? Int ?? 0)
            return counts["succeeded"] as? Int == 12
        }
        #expect(most <= 2)
        // Each ran once: one attempt, and the replicas together started twelve attempts.
        for id in ids {
            let task = try clients[1].task(id)
            #expect(task["attempt"] as? Int == 1 && task["state"] as? String == "succeeded")
        }
        for replica in replicas { try replica.stop() }
    }

    /// Workers lease from all three replicas at once, six lessees on their own connections:
    /// every task is granted once, to one lessee, and completed once.
    @Test func leasesUnderContentionGrantEachTaskOnce() throws {
        let replicas = try Self.replicas(3)
        let setup = try replicas[0].client()
        try LeaseAPITests.workersQueue(setup, "contended", concurrency: 16)
        let body = "{\"tasks\":[" + (0..<300).map { #"{"key":"t\#($0)","kind":"noop","queue":"contended"}"# }
            .joined(separator: ",") + "]}"
        #expect(try setup.call("POST", "/workflows", json: body).status == 201)
        let grants = Locked<[String]>([])
        let failures = Locked<[String]>([])
        let finished = Locked(0)
        for index in 0..<6 {
            let port = replicas[index % 3].port
            let thread = Thread {
                do {
                    let client = try APIClient(port: port)
                    while true {
                        let leased = try LeaseAPITests.lease(client, "contended", #"{"worker":"w\#(index)","max_tasks":4,"wait_s":1}"#,
                                                                timeout: 10)
                        if leased.isEmpty { break }
                        for task in leased {
                            let id = try LeaseAPITests.id(task)
                            grants.withLock { $0.append(id) }
                            let done = try client.call("POST", "/tasks/\(id)/complete",
                                                       json: #"{"lease_token":"\#(try LeaseAPITests.token(task))"}"#)
                            if done.status != 200 { failures.withLock { $0.append("\(id): \(done.status) \(done.text)") } }
                        }
                    }
                } catch {
                    failures.withLock { $0.append("lessee \(index): \(error)") }
                }
                finished.withLock { $0 += 1 }
            }
            thread.start()
        }
        // A lessee stops once a second passes with nothing left to lease.
        try pollUntil("300 grants", timeout: 60, every: 10_000) { grants.value.count >= 300 }
        #expect(failures.value.isEmpty, "\(failures.value.prefix(5))")
        #expect(grants.value.count == 300 && Set(grants.value).count == 300, "each task granted once")
        try pollUntil("every task to succeed", timeout: 20, every: 10_000) {
            (try setup.call("GET", "/queues/contended").json["counts"] as? [String: Any])?["succeeded"] as? Int == 300
        }
        // The lessees' last calls end before the replicas stop: a call cut short by the stop
        // would fail inside a thread after the test had looked.
        try pollUntil("the lessees to finish", timeout: 20, every: 10_000) { finished.value == 6 }
        #expect(failures.value.isEmpty, "\(failures.value.prefix(5))")
        for replica in replicas { try replica.stop() }
    }

    /// Work starts only after the commit that started it: a change that starts an `exec` task
    /// and then fails at COMMIT (a deferred trigger raises there) has spawned no program; once
    /// the cell has loaded again from the database (where the task is still queued), the task
    /// runs once.
    @Test func aCommitThatFailsHasStartedNoProgram() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let replicas = try Self.replicas(2, on: url) { $0.allowExec = true }
        let clients = try replicas.map { try $0.client() }
        let marker = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-started-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: marker) }
        #expect(try clients[0].call("PATCH", "/queues/held", json: #"{"paused":true}"#).status == 200)
        let body = ExecTests.json(["kind": "exec", "queue": "held", "params": ["argv": ["sh", "-c", "echo started >> '\(marker)'"]]])
        let id = try #require(try clients[0].submit(body)["id"] as? String)

        try PostgresCluster.shared().sql("""
            CREATE FUNCTION public.refuse_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'the test refuses this commit'; END $$;
            CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT OR UPDATE ON taskloop.cell_tasks
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.refuse_commit();
            """, database: url)
        // The change unpauses the queue and starts the task, then cannot commit.
        let refused = try clients[0].call("PATCH", "/queues/held", json: #"{"paused":false}"#)
        #expect(refused.status == 503, "\(refused.text)")
        #expect(refused.json["code"] as? String == "database_unavailable", "the database refused it, not a disk: \(refused.text)")
        try PostgresCluster.shared().sql("DROP TRIGGER refuse_commit ON taskloop.cell_tasks", database: url)
        // Loaded again: the cell holds what the database holds.
        try pollUntil("the replica to serve again", timeout: 30, every: 20_000) {
            let task = try clients[0].call("GET", "/tasks/\(id)")
            return task.status == 200 && task.json["state"] as? String == "queued"
        }
        #expect(!FileManager.default.fileExists(atPath: marker), "a program ran for a start that never committed")

        #expect(try clients[1].call("PATCH", "/queues/held", json: #"{"paused":false}"#).status == 200)
        _ = try clients[0].waitForState(id, "succeeded")
        #expect(try String(contentsOfFile: marker, encoding: .utf8) == "started\n", "the task ran once")
        for replica in replicas { try replica.stop() }
    }

    /// A commit whose answer is lost (the connection drops once the database has committed) is
    /// resolved before anyone is answered: the submission answers 201, not 503 (after which a
    /// client would submit again), and the task exists once.
    @Test func aCommitWhoseAnswerIsLostIsResolvedBeforeTheClientIsAnswered() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let proxy = try PostgresProxy(forwardingTo: url)
        defer { proxy.stop() }
        let replicas = try Self.replicas(1, on: proxy.url(through: url))
        let port = replicas[0].port
        // Answered once its commit is known: nothing is under way when the answers are held.
        _ = try APIClient(port: port).submit(#"{"kind":"noop","name":"before"}"#)
        func kept() throws -> String {
            try PostgresCluster.shared().sql("SELECT count(*) FROM taskloop.cell_tasks", database: url)
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
        proxy.freeze(toServer: false, toClient: true)
        let answer = Locked<RawResponse?>(nil)
        let submitter = Thread {
            let response = try? APIClient(port: port).call("POST", "/tasks", json: #"{"kind":"noop","name":"cut"}"#, timeout: 30)
            answer.withLock { $0 = response }
        }
        submitter.start()
        // The commit lands (the noop's end may land with it); its answer never comes back.
        try pollUntil("the commit to land") { try kept() == "2" }
        #expect(answer.value == nil, "nobody is answered before the outcome is known")
        proxy.cutConnections()
        proxy.freeze(toServer: false, toClient: false)
        try pollUntil("the answer", timeout: 30) { answer.value != nil }
        let response = try #require(answer.value)
        #expect(response.status == 201, "\(response.status) \(response.text)")
        #expect(try kept() == "2")
        // The cell is served again from what the database holds: the task, once.
        var listed: [[String: Any]] = []
        try pollUntil("the replica to serve again", timeout: 30, every: 20_000) {
            let page = try APIClient(port: port).call("GET", "/tasks")
            listed = page.json["tasks"] as? [[String: Any]] ?? []
            return page.status == 200
        }
        #expect(listed.filter { $0["name"] as? String == "cut" }.map { $0["id"] as? String } == [response.json["id"] as? String])
        for replica in replicas { try replica.stop() }
    }
}
