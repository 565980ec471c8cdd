import Foundation
import Testing
import TaskloopTestSupport

/// Replicas as users run them: the built binary, processes sharing a replica's name, and the
/// database itself crashed and restarted underneath (an owner killed or frozen under load is
/// in `CellProcessTests`).
@Suite(.serialized, .inTheDefaultStageOnly) struct ReplicaProcessTests {
    typealias RunningBinary = BinaryTests.RunningBinary

    /// A replica of the binary on `url`, listening on a free port; its client.
    static func replica(_ name: String, _ url: String, leaseSeconds: Int = 2, extra: [String] = []) throws
        -> (RunningBinary, APIClient, Int) {
        // Its sessions carry its name (pg_stat_activity.application_name).
        let binary = try RunningBinary(arguments: ["--port", "0", "--database-url", url, "--replica-name", name,
                                                   "--replica-lease-seconds", "\(leaseSeconds)", "--cells", "16", "--log-level", "warning"] + extra,
                                       environment: ["PGAPPNAME": name])
        let line = try binary.waitForLine(containing: "listening on", timeout: 30)
        let port = try #require(BinaryTests.port(from: line))
        return (binary, try APIClient(port: port), port)
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

    /// A process restarted under its name after a kill -9 takes its cells back once the dead
    /// one's lease has run out (the name alone does not prove the old process is gone: it may
    /// be frozen, or on another machine), and the program the dead one left running is killed
    /// before the task runs again, so one task never runs twice at once.
    @Test func aReplicaRestartedAfterKill9UnderItsNameStopsWhatTheDeadOneLeftRunning() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-restart-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try Self.replica("same", url, extra: ["--allow-exec"])
        let body = ExecTests.json(["kind": "exec", "params": ["argv": ["sh", "-c", "echo $$ > \(directory)/$TASKLOOP_TASK_ATTEMPT; exec sleep 600"]],
                                   "retry": ["max_attempts": 2, "backoff_ms": 0]])
        let id = try #require(try first.1.submit(body)["id"] as? String)
        let leftBehind = try BinaryTests.pid(in: "\(directory)/1")
        kill(first.0.process.processIdentifier, SIGKILL)
        _ = try first.0.waitForExit()
        #expect(Self.isAlive(leftBehind), "the program outlives the replica killed with -9")
        let restarted = try Self.replica("same", url, extra: ["--allow-exec"])
        try pollUntil("the dead process's attempt to run again", timeout: 20, every: 20_000) { try Self.runsAgain(id, on: restarted.1) }
        #expect(!Self.isAlive(leftBehind), "the first attempt's program was killed before the second started")
        _ = try BinaryTests.pid(in: "\(directory)/2")
        #expect(try restarted.1.call("DELETE", "/tasks/\(id)").status == 202)
        #expect(try restarted.1.call("GET", "/tasks/\(id)?wait=10", timeout: 15).json["state"] as? String == "cancelled")
        #expect(try restarted.0.stop() == 0)
    }

    /// Whether process `pid` runs (exists and is not a zombie waiting to be reaped).
    static func isAlive(_ pid: Int32) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return false }
        return stat[stat.index(after: close)...].split(separator: " ").first != "Z"
    }

    /// Two live processes under one name: the newer takes the name over and, once the older's
    /// lease has run out, its cells and what it ran (the older stopped it: it found itself
    /// replaced at its next renewal), and the older stops serving for good instead of taking
    /// the name back; it starts nothing more that would then be left running under the name.
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
        #expect(refused?.json["code"] as? String == "replica_replaced")
        _ = try older.0.waitForLine(containing: "another process took over the replica name same")
        #expect(try older.1.call("GET", "/healthz").status == 503)
        // The newer renews its lease twice more and keeps the name.
        let expiry = { try cluster.sql("SELECT expires_at FROM taskloop.members WHERE name = 'same'", database: url) }
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
        #expect(try cluster.sql("SELECT count(*) FROM taskloop.members WHERE name = 'same'", database: url).hasPrefix("1"))
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
            // A cell whose commit failed loads again, and is `cell_moving` meanwhile; once the
            // replica's lease has lapsed unrenewed, it knows the database is gone.
            try pollUntil("503 database_unavailable from a replica while the database is down", timeout: 15, every: 50_000) {
                let answer = try replica.1.call("POST", "/tasks", json: #"{"kind":"noop"}"#)
                #expect([201, 503].contains(answer.status), "\(answer.status) \(answer.text)")
                if answer.status == 503 { #expect(answer.headers.contains { $0.0.lowercased() == "retry-after" && $0.1 == "1" }) }
                return answer.json["code"] as? String == "database_unavailable"
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
