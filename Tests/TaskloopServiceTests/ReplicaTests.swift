import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// Several replicas on one PostgreSQL (a throwaway cluster), each a whole service on a loop of
/// its own: they behave as one service.
@Suite(.inTheDefaultStageOnly) struct ReplicaTests {
    /// `count` replicas sharing a database (a new one unless given).
    static func replicas(_ count: Int, on database: String? = nil,
                         configure: @escaping (inout ServiceConfiguration) -> Void = { _ in }) throws -> [ServiceHarness] {
        let url = try database ?? PostgresCluster.shared().makeDatabase()
        return try (0..<count).map { index in
            try ServiceHarness { configuration in
                configuration.sharedDatabase = SharedDatabaseSettings(url: url, replica: "r\(index)")
                configure(&configuration)
            }
        }
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
        let cancel = try clients[1].call("DELETE", "/tasks/\(longID)")
        #expect(cancel.status == 202 && cancel.json["cancel_requested"] as? Bool == true)
        // The replica running it hears of the cancellation and stops the sleep.
        let cancelled = try clients[2].call("GET", "/tasks/\(longID)?wait=10", timeout: 15)
        #expect(cancelled.json["state"] as? String == "cancelled")
        // Each replica counts its own turns and catch-ups; the one that took the submissions
        // committed turns, and its turns' times are in the histogram.
        let metrics = try clients[0].call("GET", "/metrics").text
        let turns = metrics.split(separator: "\n").first { $0.hasPrefix("taskloop_replica_turns_total ") }
        #expect((turns?.split(separator: " ").last.flatMap { Double($0) } ?? 0) >= 2, "\(turns ?? "no turns line")")
        #expect(metrics.contains("taskloop_replica_turn_seconds_count") && metrics.contains("taskloop_replica_database_up 1"))
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

    /// Work starts only after the commit that started it: a turn that starts an `exec` task and
    /// then fails at COMMIT (a deferred trigger raises there) has spawned no program; once the
    /// replica has started over from the database (where the task is still queued), the task
    /// runs once.
    @Test func aTurnThatFailsToCommitHasStartedNoProgram() throws {
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
            CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT OR UPDATE ON taskloop.tasks
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.refuse_commit();
            """, database: url)
        // The turn unpauses the queue and starts the task, then cannot commit.
        let refused = try clients[0].call("PATCH", "/queues/held", json: #"{"paused":false}"#)
        #expect(refused.status == 503, "\(refused.text)")
        #expect(refused.json["code"] as? String == "database_unavailable", "the database refused it, not a disk: \(refused.text)")
        try PostgresCluster.shared().sql("DROP TRIGGER refuse_commit ON taskloop.tasks", database: url)
        // Started over: the replica holds what the database holds.
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
        let client = try replicas[0].client()
        // Answered once its turn has committed: nothing is under way when the cut is armed.
        _ = try client.submit(#"{"kind":"noop","name":"before"}"#)
        proxy.cutNextCommit()
        let answer = try client.call("POST", "/tasks", json: #"{"kind":"noop","name":"cut"}"#, timeout: 30)
        #expect(proxy.cuts.value == 1, "the COMMIT's answer was cut")
        #expect(answer.status == 201, "\(answer.status) \(answer.text)")
        #expect(try PostgresCluster.shared().sql("SELECT count(*) FROM taskloop.tasks", database: url) == "2\n")
        // The replica started over from the database, where the task is, once.
        var listed: [[String: Any]] = []
        try pollUntil("the replica to serve again", timeout: 30, every: 20_000) {
            let page = try client.call("GET", "/tasks")
            listed = page.json["tasks"] as? [[String: Any]] ?? []
            return page.status == 200
        }
        #expect(listed.filter { $0["name"] as? String == "cut" }.map { $0["id"] as? String } == [answer.json["id"] as? String])
        for replica in replicas { try replica.stop() }
    }

    /// History is kept by time (`--event-history-seconds`): events older than it leave the
    /// database (and the horizon moves past their turns), newer ones stay, and a replica that
    /// starts afterwards resumes a stream from within the window, or says `reset` from before it.
    @Test func eventsOlderThanTheHistoryAreDroppedAndNewerOnesResumeOnAnotherReplica() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let cluster = try PostgresCluster.shared()
        let first = try Self.replicas(1, on: url)[0]
        let client = try first.client()
        for _ in 0..<2 { _ = try client.submit(#"{"kind":"noop","name":"old"}"#) }
        let lastOld = try #require(Int(try cluster.sql("SELECT max(seq) FROM taskloop.events", database: url)
            .trimmingCharacters(in: .whitespacesAndNewlines)))
        // Made an hour and a minute ago, as far as the history can tell.
        try cluster.sql("UPDATE taskloop.events SET time = time - 3660000", database: url)
        for _ in 0..<2 { _ = try client.submit(#"{"kind":"noop","name":"new"}"#) }
        // Each turn may drop what is past the window (at most one a second drops nothing new).
        try pollUntil("the old events to be dropped", timeout: 15, every: 100_000) {
            _ = try client.submit(#"{"kind":"noop","name":"tick"}"#)
            return try cluster.sql("SELECT count(*) FROM taskloop.events WHERE seq <= \(lastOld)", database: url) == "0\n"
        }
        #expect(try cluster.sql("SELECT min(seq) FROM taskloop.events", database: url) == "\(lastOld + 1)\n", "newer events stay")
        #expect(Int(try cluster.sql("SELECT horizon FROM taskloop.state", database: url)
            .trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 > 1, "the horizon moved past the dropped turns")

        let second = try ServiceHarness { $0.sharedDatabase = SharedDatabaseSettings(url: url, replica: "r1") }
        let within = try EventStreamTests.Stream(port: second.port, "/events?types=task.created", headers: ["Last-Event-ID": "\(lastOld)"])
        let created = try within.waitFor(3).prefix(3)
        #expect(created.map { ($0.data["task"] as? [String: Any])?["name"] as? String } == ["new", "new", "tick"])
        #expect(created.allSatisfy { ($0.id ?? 0) > UInt64(lastOld) })
        let before = try EventStreamTests.Stream(port: second.port, "/events", headers: ["Last-Event-ID": "1"])
        let replayed = try before.waitFor(2)
        #expect(replayed[0].type == "reset" && replayed[0].data["oldest"] as? Int == lastOld + 1)
        #expect(replayed[1].id == UInt64(lastOld + 1))
        try second.stop()
        try first.stop()
    }
}
