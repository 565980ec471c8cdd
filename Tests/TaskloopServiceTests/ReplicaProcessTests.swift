import Foundation
import Testing
import TaskloopTestSupport

/// Replicas as users run them: the built binary, several processes on one PostgreSQL, one
/// killed with SIGKILL under load, and the database itself crashed and restarted underneath.
@Suite(.serialized, .inTheDefaultStageOnly) struct ReplicaProcessTests {
    typealias RunningBinary = BinaryTests.RunningBinary

    /// A replica of the binary on `url`, listening on a free port; its client.
    static func replica(_ name: String, _ url: String, leaseSeconds: Int = 2, extra: [String] = []) throws
        -> (RunningBinary, APIClient, Int) {
        // Its sessions carry its name (pg_stat_activity.application_name).
        let binary = try RunningBinary(arguments: ["--port", "0", "--database-url", url, "--replica-name", name,
                                                   "--replica-lease-seconds", "\(leaseSeconds)", "--log-level", "warning"] + extra,
                                       environment: ["PGAPPNAME": name])
        let line = try binary.waitForLine(containing: "listening on", timeout: 30)
        let port = try #require(BinaryTests.port(from: line))
        return (binary, try APIClient(port: port), port)
    }

    /// Nothing acknowledged is lost when a replica dies mid-stream, and what it ran is taken
    /// over by the others once its lease runs out, under the retry policy.
    @Test func aReplicaKilledUnderLoadLosesNothingAcknowledgedAndItsAttemptsAreTakenOver() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        var replicas = try ["r0", "r1", "r2"].map { try Self.replica($0, url) }
        let victim = replicas[0]
        #expect(try victim.1.call("PATCH", "/queues/long", json: #"{"max_concurrency":10}"#).status == 200)
        // Long sleeps submitted to the victim run on it: the turn that takes them starts them.
        var longIDs: [String] = []
        for _ in 0..<3 {
            let task = try victim.1.submit(#"{"kind":"sleep","queue":"long","params":{"duration_ms":600000},"retry":{"max_attempts":2,"backoff_ms":0}}"#)
            longIDs.append(task["id"] as! String)
        }
        for id in longIDs { _ = try victim.1.waitForState(id, "running") }

        // Submissions stream to every replica from three threads; the victim dies among them.
        let acknowledged = Locked<[String]>([])
        let stop = Locked(false)
        let threads = (0..<3).map { index in
            let port = replicas[index].2
            let thread = Thread {
                guard let client = try? APIClient(port: port) else { return }
                while !stop.value {
                    guard let answer = try? client.call("POST", "/tasks", json: #"{"kind":"noop"}"#, timeout: 5) else { return }
                    if answer.status == 201, let id = answer.json["id"] as? String { acknowledged.withLock { $0.append(id) } }
                }
            }
            thread.start()
            return thread
        }
        try pollUntil("a few hundred acknowledged submissions", timeout: 30) { acknowledged.value.count >= 300 }
        kill(victim.0.process.processIdentifier, SIGKILL)
        _ = try victim.0.waitForExit()
        let atKill = acknowledged.value.count
        try pollUntil("more acknowledged by the survivors", timeout: 30) { acknowledged.value.count >= atKill + 300 }
        stop.withLock { $0 = true }
        _ = threads
        replicas.removeFirst()

        // Every acknowledged task is there, on both survivors, and ran.
        let survivors = replicas.map(\.1)
        for (index, id) in acknowledged.value.enumerated() {
            let task = try survivors[index % 2].call("GET", "/tasks/\(id)?wait=10", timeout: 15)
            #expect(task.status == 200 && task.json["state"] as? String == "succeeded", "task \(id): \(task.status) \(task.text)")
        }
        // The victim's sleeps were interrupted when its lease ran out and run again elsewhere.
        for id in longIDs {
            var task: [String: Any] = [:]
            try pollUntil("task \(id)'s second attempt", timeout: 30, every: 20_000) {
                task = try survivors[0].task(id)
                return task["attempt"] as? Int == 2 && task["state"] as? String == "running"
            }
            #expect((task["error"] as? [String: Any])?["code"] as? String == "interrupted")
        }
        let queue = try survivors[1].call("GET", "/queues/long").json
        #expect((queue["counts"] as? [String: Any])?["running"] as? Int == 3)
        for replica in replicas { #expect(try replica.0.stop() == 0) }
    }

    /// A replica frozen (SIGSTOP) inside its turn holds the turn lock only until PostgreSQL ends
    /// its idle session (`--database-timeout-seconds`): another replica's change then commits,
    /// and the frozen one, woken, starts over and serves again.
    @Test func aReplicaFrozenInsideItsTurnHoldsTheOthersUpOnlyUntilItsTimeout() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let cluster = try PostgresCluster.shared()
        let frozen = try Self.replica("frozen", url, leaseSeconds: 600, extra: ["--database-timeout-seconds", "2"])
        let other = try Self.replica("other", url, leaseSeconds: 600, extra: ["--database-timeout-seconds", "2"])
        func sessions(_ condition: String) throws -> Int {
            Int(try cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'frozen' AND \(condition)",
                                database: url).trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
        }
        // A session of the test's holds the turn lock (SharedSchema.turnLock, whose halves
        // pg_locks shows), so that the frozen replica's next turn is sent and waits for it when
        // the replica is stopped. Calls below go on connections of their own: the replicas'
        // idle timeout may have closed the clients' meanwhile.
        let holder = Process()
        let commands = Pipe()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
        holder.arguments = [url, "-qAt"]
        holder.standardInput = commands
        holder.standardOutput = FileHandle.nullDevice
        try holder.run()
        var holding = true
        let letGo = {
            guard holding else { return }
            holding = false
            // psql ends at the end of its input, and its session with it.
            try? commands.fileHandleForWriting.close()
        }
        defer { letGo() }
        commands.fileHandleForWriting.write(Data("SELECT pg_advisory_lock(7361000000002);\n".utf8))
        try pollUntil("the test's session to hold the turn lock") {
            try cluster.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = 1713 "
                                + "AND objid = 3721021954", database: url).hasPrefix("1")
        }
        let refused = Locked<Int?>(nil)
        let port = frozen.2
        let submission = Thread {
            let answer = try? APIClient(port: port).call("POST", "/tasks", json: #"{"kind":"noop"}"#, timeout: 60)
            refused.withLock { $0 = answer?.status ?? 0 }
        }
        submission.start()
        try pollUntil("the frozen replica's turn to wait for the lock", timeout: 60) { try sessions("wait_event_type = 'Lock'") == 1 }
        kill(frozen.0.process.processIdentifier, SIGSTOP)
        letGo()
        try pollUntil("the frozen replica's session to hold the turn lock", timeout: 60) { try sessions("state = 'idle in transaction'") == 1 }

        let created = try APIClient(port: other.2).call("POST", "/tasks", json: #"{"kind":"noop"}"#, timeout: 15)
        #expect(created.status == 201, "\(created.status) \(created.text)")
        #expect(try sessions("state = 'idle in transaction'") == 0)

        kill(frozen.0.process.processIdentifier, SIGCONT)
        try pollUntil("the submission the frozen replica's turn held") { refused.value != nil }
        #expect(refused.value == 503)
        try pollUntil("the frozen replica to serve again", timeout: 30, every: 100_000) {
            try APIClient(port: port).call("POST", "/tasks", json: #"{"kind":"noop"}"#).status == 201
        }
        let id = try #require(created.json["id"] as? String)
        #expect(try APIClient(port: port).call("GET", "/tasks/\(id)?wait=10", timeout: 15).json["state"] as? String == "succeeded")
        #expect(try frozen.0.stop() == 0)
        #expect(try other.0.stop() == 0)
    }

    /// A long sleep with a second attempt, submitted to `client`, once it runs; its id.
    static func longSleep(on client: APIClient) throws -> String {
        let task = try client.submit(#"{"kind":"sleep","params":{"duration_ms":600000},"retry":{"max_attempts":2,"backoff_ms":0}}"#)
        let id = try #require(task["id"] as? String)
        _ = try client.waitForState(id, "running")
        return id
    }

    /// Whether task `id`'s first attempt was interrupted and its second runs.
    static func runsAgain(_ id: String, on client: APIClient) throws -> Bool {
        let task = try client.task(id)
        return task["attempt"] as? Int == 2 && task["state"] as? String == "running"
            && (task["error"] as? [String: Any])?["code"] as? String == "interrupted"
    }

    /// A process restarted under its name after a kill -9 takes the name back at once, and
    /// what the dead one ran is interrupted then, not once its lease would have run out.
    @Test func aReplicaRestartedAfterKill9UnderItsNameTakesOverWhatItRanAtOnce() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let first = try Self.replica("same", url, leaseSeconds: 600)
        let id = try Self.longSleep(on: first.1)
        kill(first.0.process.processIdentifier, SIGKILL)
        _ = try first.0.waitForExit()
        let restarted = try Self.replica("same", url, leaseSeconds: 600)
        try pollUntil("the dead process's attempt to run again", timeout: 20, every: 20_000) { try Self.runsAgain(id, on: restarted.1) }
        #expect(try restarted.1.call("POST", "/tasks", json: #"{"kind":"noop"}"#).status == 201)
        #expect(try restarted.0.stop() == 0)
    }

    /// Two live processes under one name: the newer takes the name over and what the older ran
    /// (the older stops it), and the older, fenced at its next turn or renewal, stops serving
    /// for good instead of taking the name back; it starts nothing more that would then be
    /// left running under the name.
    @Test func aSecondProcessUnderANameInUseTakesItOverAndTheFirstStopsServing() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let cluster = try PostgresCluster.shared()
        let older = try Self.replica("same", url)
        let id = try Self.longSleep(on: older.1)
        let newer = try Self.replica("same", url)
        try pollUntil("the older process's attempt to run again", timeout: 20, every: 20_000) { try Self.runsAgain(id, on: newer.1) }
        var refused: RawResponse?
        try pollUntil("503 from the older process", timeout: 10, every: 20_000) {
            refused = try older.1.call("POST", "/tasks", json: #"{"kind":"noop"}"#)
            return refused?.status == 503
        }
        #expect(refused?.json["code"] as? String == "database_unavailable")
        _ = try older.0.waitForLine(containing: "another process took over the replica name same")
        #expect(try older.1.call("GET", "/healthz").status == 503)
        // The newer renews its lease twice more (every half second) and keeps the name.
        let expiry = { try cluster.sql("SELECT expires_at FROM taskloop.replicas WHERE name = 'same'", database: url) }
        var renewals: [String] = [try expiry()]
        try pollUntil("two renewals by the newer process", timeout: 10, every: 50_000) {
            let now = try expiry()
            if now != renewals.last { renewals.append(now) }
            return renewals.count >= 3
        }
        let created = try newer.1.submit(#"{"kind":"noop"}"#)
        #expect(try newer.1.call("GET", "/tasks/\(created["id"] as! String)?wait=10", timeout: 15).json["state"] as? String == "succeeded")
        #expect(try older.1.call("POST", "/tasks", json: #"{"kind":"noop"}"#).status == 503)
        #expect(try Self.runsAgain(id, on: newer.1))
        #expect(try older.0.stop() == 0)
        // The older one's leaving did not take the newer's row.
        #expect(try cluster.sql("SELECT count(*) FROM taskloop.replicas WHERE name = 'same'", database: url).hasPrefix("1"))
        #expect(try newer.0.stop() == 0)
    }

    /// While the database is down every replica answers 503 (reads too: it cannot know what it
    /// missed; and its health check, so a load balancer looks elsewhere); once the database is
    /// back they serve again by themselves, state intact.
    @Test func aDatabaseRestartedUnderneathMakesReplicas503ThenTheyRecoverAlone() throws {
        let cluster = try PostgresCluster.start()
        let replicas = try ["a", "b"].map { try Self.replica($0, cluster.url) }
        let before = try replicas[0].1.submit(#"{"kind":"noop","name":"before"}"#)
        let beforeID = try #require(before["id"] as? String)
        try cluster.kill()
        for replica in replicas {
            try pollUntil("503 from a replica while the database is down", timeout: 15, every: 50_000) {
                let answer = try replica.1.call("POST", "/tasks", json: #"{"kind":"noop"}"#)
                if answer.status == 503 {
                    #expect(answer.json["code"] as? String == "database_unavailable")
                    #expect(answer.headers.contains { $0.0.lowercased() == "retry-after" && $0.1 == "1" })
                }
                return answer.status == 503
            }
            #expect(try replica.1.call("GET", "/tasks/\(beforeID)").status == 503)
            #expect(try replica.1.call("GET", "/healthz").status == 503, "a load balancer looks elsewhere")
            #expect(try replica.1.call("GET", "/metrics").text.contains("taskloop_replica_database_up 0"))
        }
        try cluster.restart()
        for replica in replicas {
            var created: [String: Any] = [:]
            try pollUntil("the replica to serve again", timeout: 30, every: 100_000) {
                let answer = try replica.1.call("POST", "/tasks", json: #"{"kind":"noop","name":"after"}"#)
                if answer.status == 201 { created = answer.json }
                return answer.status == 201
            }
            let id = try #require(created["id"] as? String)
            #expect(try replica.1.call("GET", "/tasks/\(id)?wait=5").json["state"] as? String == "succeeded")
            #expect(try replica.1.task(beforeID)["state"] as? String == "succeeded")
            #expect(try replica.1.call("GET", "/metrics").text.contains("taskloop_replica_database_up 1"))
        }
        for replica in replicas { #expect(try replica.0.stop() == 0) }
        try cluster.stop()
    }
}
