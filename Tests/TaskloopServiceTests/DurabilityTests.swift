import Foundation
import Testing
@testable import TaskloopService
import TaskloopStore
import TaskloopTestSupport

/// The built server with a data dir, killed and restarted the ways production does it.
@Suite(.serialized) struct DurabilityTests {
    typealias Binary = BinaryTests.RunningBinary

    static func start(_ directory: String, _ extra: [String] = []) throws -> (Binary, APIClient) {
        let binary = try Binary(arguments: ["--port", "0", "--durability", "full", "--data-dir", directory] + extra)
        let port = try #require(BinaryTests.port(from: try binary.waitForLine(containing: "listening on")))
        return (binary, try APIClient(port: port))
    }

    static func id(_ object: [String: Any]) throws -> String { try #require(object["id"] as? String) }

    /// Everything a 2xx acknowledged is there after `kill -9`; what was running ends its attempt
    /// as `interrupted` and follows its retry policy.
    @Test func kill9KeepsEverythingAcknowledged() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try Self.start(directory)
        let done = try Self.id(try client.submit(#"{"kind":"noop","name":"done","metadata":{"owner":"me"}}"#))
        let once = try Self.id(try client.submit(#"{"kind":"sleep","params":{"duration_ms":600000}}"#))
        let twice = try Self.id(try client.submit(
            #"{"kind":"sleep","params":{"duration_ms":600000},"retry":{"max_attempts":2,"backoff_ms":0}}"#))
        #expect(try client.call("PATCH", "/queues/held", json: #"{"paused":true,"max_concurrency":3}"#).status == 200)
        let held = try Self.id(try client.submit(#"{"kind":"noop","queue":"held","priority":5}"#))
        let workflow = try client.call("POST", "/workflows", json: #"{"name":"w","tasks":[{"key":"a","kind":"noop"},{"key":"b","kind":"noop","queue":"held","dependencies":["a"]}]}"#)
        #expect(workflow.status == 201)
        let cancelled = try Self.id(try client.submit(#"{"kind":"noop","queue":"held"}"#))
        #expect(try client.call("DELETE", "/tasks/\(cancelled)").status == 200)
        _ = try client.waitForState(once, "running")
        _ = try client.waitForState(twice, "running")
        kill(binary.process.processIdentifier, SIGKILL)
        #expect(try binary.waitForExit() == SIGKILL)

        (binary, client) = try Self.start(directory)
        #expect(try client.task(done)["state"] as? String == "succeeded")
        #expect((try client.task(done)["metadata"] as? [String: String]) == ["owner": "me"])
        let lost = try client.task(once)
        #expect(lost["state"] as? String == "failed" && (lost["error"] as? [String: Any])?["code"] as? String == "interrupted")
        let retried = try client.waitForState(twice, "running")
        #expect(retried["attempt"] as? Int == 2)
        #expect(try client.task(held)["state"] as? String == "queued")
        #expect(try client.task(cancelled)["state"] as? String == "cancelled")
        let queue = try client.call("GET", "/queues/held").json
        #expect(queue["paused"] as? Bool == true && queue["max_concurrency"] as? Int == 3)
        let workflowID = try #require(workflow.json["id"] as? String)
        #expect(try client.call("GET", "/workflows/\(workflowID)").json["state"] as? String == "running")
        #expect(try binary.stop() == 0)
    }

    /// SIGTERM keeps the state too: what was running runs again after the restart, with its
    /// attempt not consumed.
    @Test func aStopRequeuesRunningWork() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try Self.start(directory, ["--shutdown-grace-seconds", "1"])
        let running = try Self.id(try client.submit(#"{"kind":"sleep","params":{"duration_ms":600000}}"#))
        _ = try client.waitForState(running, "running")
        #expect(try binary.stop() == 0)
        (binary, client) = try Self.start(directory)
        let again = try client.waitForState(running, "running")
        #expect(again["attempt"] as? Int == 1)
        #expect(try binary.stop() == 0)
    }

    /// `taskloop backup` while the server runs, and a restore into an empty data dir.
    @Test func aBackupTakenWhileRunningRestores() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (server, client) = try Self.start(directory + "/data")
        var ids: [String] = []
        for index in 0..<20 { ids.append(try Self.id(try client.submit(#"{"kind":"noop","name":"n\#(index)"}"#))) }
        let backup = try Binary(arguments: ["backup", "--data-dir", directory + "/data", "--to", directory + "/copy.db"])
        _ = try backup.waitForLine(containing: "backed up")
        #expect(try backup.waitForExit() == 0)
        let again = try Binary(arguments: ["backup", "--data-dir", directory + "/data", "--to", directory + "/copy.db"])
        _ = try again.waitForLine(containing: "already exists")
        #expect(try again.waitForExit() != 0, "a backup never overwrites")
        #expect(try server.stop() == 0)
        try FileManager.default.createDirectory(atPath: directory + "/restored", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: directory + "/copy.db", toPath: directory + "/restored/taskloop.db")
        let (restored, restoredClient) = try Self.start(directory + "/restored")
        for id in ids { #expect(try restoredClient.task(id)["state"] as? String == "succeeded") }
        #expect(try restored.stop() == 0)
    }

    @Test func aSecondServerOnTheSameDataDirRefusesToStart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (first, _) = try Self.start(directory)
        let second = try Binary(arguments: ["--port", "0", "--durability", "full", "--data-dir", directory])
        _ = try second.waitForLine(containing: "in use by another server (pid \(first.process.processIdentifier)")
        #expect(try second.waitForExit() != 0)
        #expect(try first.stop() == 0)
    }

    /// An answer that shows a change leaves only once the change is committed: whatever a
    /// client was told is already in the database file when it reads the answer.
    @Test func answersFollowTheCommit() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let service = try ServiceHarness {
            $0.durability = .full
            $0.dataDirectory = directory
        }
        let client = try service.client()
        let reader = try SQLiteDatabase(path: directory + "/taskloop.db", mode: .readOnly)
        for index in 0..<50 {
            let id = try Self.id(try client.submit(#"{"kind":"sleep","params":{"duration_ms":600000},"name":"t\#(index)"}"#))
            let row = try reader.statement("SELECT state FROM tasks WHERE id = ?")
            row.bind(1, id)
            #expect(try row.step(), "task \(index) answered before its row was committed")
            row.reset()
        }
        // Queued behind the sleeps; cancelled, and the answer comes after the row says so.
        let last = try Self.id(try client.submit(#"{"kind":"noop"}"#))
        #expect(try client.call("DELETE", "/tasks/\(last)").status == 200)
        #expect(try reader.text("SELECT state FROM tasks WHERE id = '\(last)'") == "cancelled")
        try service.stop()
    }
}

@Suite struct StorageFailureTests {
    /// A disk that fills up: the change that could not be written is answered 503, later
    /// changes are refused while reads go on, and once there is room again the service
    /// recovers by itself; nothing acknowledged is lost.
    @Test func aFullDiskRefusesChangesKeepsReadsAndRecovers() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configure: (inout ServiceConfiguration) -> Void = {
            $0.durability = .normal
            $0.dataDirectory = directory
        }
        var service = try ServiceHarness(configure)
        var client = try service.client()
        let kept = try DurabilityTests.id(try client.submit(#"{"kind":"noop","name":"kept"}"#))
        service.onLoop { application in (application.durable?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: 0) }
        let big = String(repeating: "x", count: 200_000)
        let refused = try client.call("POST", "/tasks", json: #"{"kind":"noop","metadata":{"blob":"\#(big)"}}"#)
        #expect(refused.status == 503 && refused.json["code"] as? String == "storage_unavailable")
        #expect(refused.header("Retry-After") == "1")
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#).status == 503, "changes are refused")
        #expect(try client.call("GET", "/tasks/\(kept)").status == 200, "reads go on")
        #expect(try client.call("GET", "/healthz").status == 200)
        service.onLoop { application in (application.durable?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: nil) }
        var accepted: String?
        try pollUntil("the service to accept changes again", timeout: 10, every: 50_000) {
            let response = try client.call("POST", "/tasks", json: #"{"kind":"noop","name":"after"}"#)
            if response.status == 201 { accepted = response.json["id"] as? String }
            return response.status == 201
        }
        try service.stop()
        service = try ServiceHarness(configure)
        client = try service.client()
        #expect(try client.task(kept)["name"] as? String == "kept")
        #expect(try client.task(try #require(accepted))["name"] as? String == "after")
        try service.stop()
    }
}
