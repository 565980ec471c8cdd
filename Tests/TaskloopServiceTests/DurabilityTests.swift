import Foundation
import Testing
@testable import TaskloopService
import TaskloopStore
import TaskloopTestSupport

/// The built server with a data dir, killed and restarted the ways production does it.
@Suite(.serialized, .inTheDefaultStageOnly) struct DurabilityTests {
    typealias Binary = BinaryTests.RunningBinary

    /// A durable server; running work gets one second of grace when it stops, unless `extra`
    /// says otherwise (a later flag wins).
    static func start(_ directory: String, _ extra: [String] = []) throws -> (Binary, APIClient) {
        let binary = try Binary(arguments: ["--port", "0", "--durability", "full", "--data-dir", directory,
                                            "--shutdown-grace-seconds", "1"] + extra)
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

    /// A program that outlived a killed server (it runs detached, and went to init) is killed
    /// by the next server before its task runs again: never two copies of one task at once.
    @Test func anInterruptedProgramIsKilledBeforeItsTaskRunsAgain() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try Self.start(directory + "/data", ["--allow-exec"])
        let file = directory + "/pid"
        let body = ExecTests.json(["kind": "exec", "retry": ["max_attempts": 2, "backoff_ms": 0],
                                   "params": ["argv": ["sh", "-c", "echo $$ >> \(file); exec sleep 1000"]]])
        let task = try Self.id(try client.submit(body))
        let survivor = try BinaryTests.pid(in: file)
        (binary, client) = try Self.killAndRestart(binary, directory + "/data", leaving: survivor, task: task)
        try pollUntil("the second attempt's program to start") {
            (try? String(contentsOfFile: file, encoding: .utf8))?.split(separator: "\n").count == 2
        }
        #expect(ExecTests.isGone(survivor), "the first attempt's program was killed before the second started")
        #expect(try binary.stop() == 0)
    }

    /// Kills `binary` with SIGKILL while its program `survivor` runs on, starts the next server
    /// on the same data dir, and waits for the task to run again as attempt 2 (its program
    /// starts once the first attempt's leftovers are killed, which the server does off its loop).
    static func killAndRestart(_ binary: BinaryTests.RunningBinary, _ dataDirectory: String, leaving survivor: Int32,
                               task: String) throws -> (BinaryTests.RunningBinary, APIClient) {
        let pid = binary.process.processIdentifier
        kill(pid, SIGKILL)
        try pollUntil("the server to die") { ExecTests.isGone(pid) }
        #expect(!ExecTests.isGone(survivor), "the program outlives the server")
        let (next, client) = try start(dataDirectory, ["--allow-exec"])
        let again = try client.waitForState(task, "running")
        #expect(again["attempt"] as? Int == 2)
        return (next, client)
    }

    /// The same with a program that left no mark but its cgroup: double-forked into a session
    /// of its own with an empty environment, it outlives the killed server, and the next one
    /// kills it (by the cgroup of the attempt) before the task runs again.
    @Test(.enabled(if: ExecTests.cgroups != nil))
    func anInterruptedProgramThatClearedItsEnvironmentIsKilledBeforeItsTaskRunsAgain() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try Self.start(directory + "/data", ["--allow-exec"])
        let hidden = "echo $$ > \(directory)/e.tmp; mv \(directory)/e.tmp \(directory)/e; exec sleep 1000"
        let script = "[ $TASKLOOP_TASK_ATTEMPT = 2 ] && exec sleep 1000; (env -i setsid sh -c '\(hidden)' &); exec sleep 1000"
        let body = ExecTests.json(["kind": "exec", "retry": ["max_attempts": 2, "backoff_ms": 0],
                                   "params": ["argv": ["sh", "-c", script]]])
        let task = try Self.id(try client.submit(body))
        let escapee = try BinaryTests.pid(in: "\(directory)/e")
        let environment = (try? String(contentsOfFile: "/proc/\(escapee)/environ", encoding: .utf8)) ?? ""
        #expect(!environment.contains("TASKLOOP_TASK_ID"), "the cookie cannot find it")
        (binary, client) = try Self.killAndRestart(binary, directory + "/data", leaving: escapee, task: task)
        try pollUntil("the second attempt's cgroup") { ExecTests.cgroupsLeft(of: task).contains("\(task):2") }
        #expect(ExecTests.cgroupsLeft(of: task) == ["\(task):2"], "the first attempt's cgroup is gone")
        #expect(ExecTests.isGone(escapee), "the escapee was killed before the second attempt started")
        #expect(try binary.stop() == 0)
        try ExecTests.waitUntilNoCgroupIsLeft(of: task)
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

    /// The permission bits of `path` itself (a link's own, not its target's).
    static func mode(_ path: String) throws -> Int {
        var status = stat()
        guard lstat(path, &status) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        return Int(status.st_mode & 0o777)
    }

    /// `taskloop backup` while the server runs, and a restore into an empty data dir. The copy is
    /// 0600 under the usual umask; an existing file or a link is refused and left as it was.
    @Test func aBackupTakenWhileRunningRestores() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (server, client) = try Self.start(directory + "/data")
        var ids: [String] = []
        for index in 0..<20 { ids.append(try Self.id(try client.submit(#"{"kind":"noop","name":"n\#(index)"}"#))) }
        let backup = try Binary(arguments: ["backup", "--data-dir", directory + "/data", "--to", directory + "/copy.db"],
                                umask: "022")
        _ = try backup.waitForLine(containing: "backed up")
        #expect(try backup.waitForExit() == 0)
        #expect(try Self.mode(directory + "/copy.db") == 0o600)
        let before = try Data(contentsOf: URL(fileURLWithPath: directory + "/copy.db"))
        let again = try Binary(arguments: ["backup", "--data-dir", directory + "/data", "--to", directory + "/copy.db"])
        _ = try again.waitForLine(containing: "already exists")
        #expect(try again.waitForExit() != 0, "a backup never overwrites")
        #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/copy.db")) == before)
        // A link to a file that does not exist yet, and one to an empty file (which SQLite
        // alone would fill): neither is written through.
        try FileManager.default.createSymbolicLink(atPath: directory + "/dangling.db", withDestinationPath: directory + "/target.db")
        try Data().write(to: URL(fileURLWithPath: directory + "/empty.db"))
        try FileManager.default.createSymbolicLink(atPath: directory + "/link.db", withDestinationPath: directory + "/empty.db")
        for link in ["dangling.db", "link.db"] {
            let refused = try Binary(arguments: ["backup", "--data-dir", directory + "/data", "--to", directory + "/" + link])
            _ = try refused.waitForLine(containing: "already exists")
            #expect(try refused.waitForExit() != 0, "\(link)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory + "/target.db"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/empty.db")).isEmpty)
        #expect(try server.stop() == 0)
        try FileManager.default.createDirectory(atPath: directory + "/restored", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: directory + "/copy.db", toPath: directory + "/restored/taskloop.db")
        let (restored, restoredClient) = try Self.start(directory + "/restored")
        for id in ids { #expect(try restoredClient.task(id)["state"] as? String == "succeeded") }
        #expect(try restored.stop() == 0)
    }

    /// Within the grace, running work finishes rather than being stopped, and nothing new
    /// starts: the queued task waits for the restart.
    @Test func aStopLetsRunningWorkFinishWithinTheGrace() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try Self.start(directory, ["--shutdown-grace-seconds", "10", "--default-concurrency", "1"])
        let running = try Self.id(try client.submit(#"{"kind":"sleep","params":{"duration_ms":300,"steps":1}}"#))
        let waiting = try Self.id(try client.submit(#"{"kind":"noop"}"#))
        _ = try client.waitForState(running, "running")
        let started = Date()
        #expect(try binary.stop() == 0)
        #expect(Date().timeIntervalSince(started) < 5, "the stop ends once the work is done, not at the grace")
        (binary, client) = try Self.start(directory)
        let finished = try client.task(running)
        #expect(finished["state"] as? String == "succeeded" && finished["attempt"] as? Int == 1)
        _ = try client.waitForState(waiting, "succeeded")
        #expect(try binary.stop() == 0)
    }

    /// A program that ignores SIGTERM does not hold a durable server past its grace: at the end
    /// of the grace it is stopped (killed at once, the grace being spent), and its task waits for
    /// the restart.
    @Test func aStubbornProgramIsStoppedAtTheGraceAndRequeued() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, client) = try Self.start(directory + "/data", ["--allow-exec"])
        let file = directory + "/pid"
        let body = ExecTests.json(["kind": "exec", "params": [
            "argv": ["sh", "-c", "trap '' TERM; echo $$ > \(file); while true; do sleep 1; done"], "grace_ms": 60_000]])
        let task = try Self.id(try client.submit(body))
        let program = try BinaryTests.pid(in: file)
        let started = Date()
        kill(binary.process.processIdentifier, SIGTERM)
        _ = try binary.waitForLine(containing: "taskloop stopped", timeout: 10)
        #expect(Date().timeIntervalSince(started) < 2, "the grace is one second, and a second more at most")
        #expect(try binary.waitForExit() == 0)
        #expect(ExecTests.isGone(program))
        try FileManager.default.removeItem(atPath: file)
        (binary, client) = try Self.start(directory + "/data", ["--allow-exec"])
        let again = try client.waitForState(task, "running")
        #expect(again["attempt"] as? Int == 1, "stopped by the shutdown, not failed: the attempt is not consumed")
        #expect(try binary.stop() == 0)
    }

    /// Under umask 022 the server would make its files readable by all; they are its own.
    @Test func theDataDirAndItsFilesArePrivateWhateverTheUmask() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let data = directory + "/data"
        let binary = try Binary(arguments: ["--port", "0", "--durability", "full", "--data-dir", data], umask: "022")
        let client = try APIClient(port: try #require(BinaryTests.port(from: try binary.waitForLine(containing: "listening on"))))
        _ = try client.waitForState(try Self.id(try client.submit(#"{"kind":"noop"}"#)), "succeeded")
        #expect(try Self.mode(data) == 0o700)
        for file in ["taskloop.db", "taskloop.db-wal", "taskloop.db-shm", "lock"] {
            #expect(try Self.mode(data + "/" + file) == 0o600, "\(file)")
        }
        #expect(try binary.stop() == 0)
    }

    /// Files an older server left readable by others are made private at the next start, and
    /// the server says so.
    @Test func looserFilesAreMadePrivateAndLogged() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (binary, _) = try Self.start(directory)
        #expect(try binary.stop() == 0)
        chmod(directory + "/taskloop.db", 0o644)
        (binary, _) = try Self.start(directory)
        _ = try binary.waitForLine(containing: "made 0600")
        #expect(binary.printed.contains(directory + "/taskloop.db"))
        #expect(try Self.mode(directory + "/taskloop.db") == 0o600)
        #expect(try binary.stop() == 0)
    }

    /// Whoever may write to the data dir could swap the database: such a dir is refused, with
    /// the fix in the message, and nothing is created in it.
    @Test func aDataDirOthersMayWriteToIsRefused() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        chmod(directory, 0o777)
        let binary = try Binary(arguments: ["--port", "0", "--durability", "full", "--data-dir", directory])
        _ = try binary.waitForLine(containing: "chmod 700 \(directory)")
        #expect(try binary.waitForExit() != 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty)
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
            let stored = try SQLiteTaskStore.load(reader).tasks
            #expect(stored.contains { $0.id.description == id }, "task \(index) answered before its row was committed")
        }
        // Queued behind the sleeps; cancelled, and the answer comes after the row says so.
        let last = try Self.id(try client.submit(#"{"kind":"noop"}"#))
        #expect(try client.call("DELETE", "/tasks/\(last)").status == 200)
        #expect(try SQLiteTaskStore.load(reader).tasks.first { $0.id.description == last }?.state == .cancelled)
        try service.stop()
    }
}

@Suite(.inTheDefaultStageOnly) struct StorageFailureTests {
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
        service.onLoop { application in (application.sqlite?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: 0) }
        let big = String(repeating: "x", count: 200_000)
        let refused = try client.call("POST", "/tasks", json: #"{"kind":"noop","metadata":{"blob":"\#(big)"}}"#)
        #expect(refused.status == 503 && refused.json["code"] as? String == "storage_unavailable")
        #expect(refused.header("Retry-After") == "1")
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#).status == 503, "changes are refused")
        #expect(try client.call("GET", "/tasks/\(kept)").status == 200, "reads go on")
        #expect(try client.call("GET", "/healthz").status == 200)
        service.onLoop { application in (application.sqlite?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: nil) }
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

    /// Work starts only after the commit that started it: while a full disk refuses the batch
    /// that started an `exec` task, its program does not run; once the batch is written again,
    /// it runs, once.
    @Test func aProgramStartsOnlyOnceItsBatchIsWritten() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let service = try ServiceHarness {
            $0.durability = .normal
            $0.dataDirectory = directory
            $0.allowExec = true
        }
        let client = try service.client()
        let marker = directory + "/started"
        service.onLoop { application in (application.sqlite?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: 0) }
        let body = ExecTests.json(["kind": "exec", "name": "held", "metadata": ["blob": String(repeating: "x", count: 200_000)],
                                   "params": ["argv": ["sh", "-c", "echo started >> '\(marker)'"]]])
        #expect(try client.call("POST", "/tasks", json: body).status == 503)
        #expect(service.onLoop { $0.engine.heldStartCount } == 1, "the start waits for its batch")
        #expect(!FileManager.default.fileExists(atPath: marker))
        service.onLoop { application in (application.sqlite?.store as? SQLiteTaskStore)?.limitGrowth(toExtraPages: nil) }
        try pollUntil("the program to run once its batch is written", timeout: 10, every: 50_000) {
            let tasks = try client.call("GET", "/tasks").json["tasks"] as? [[String: Any]] ?? []
            return tasks.first { $0["name"] as? String == "held" }?["state"] as? String == "succeeded"
        }
        #expect(try String(contentsOfFile: marker, encoding: .utf8) == "started\n")
        try service.stop()
    }
}

/// The crash loop: clients submit tasks and workflows and cancel as fast as they can while the
/// server is killed with SIGKILL at random moments and restarted on the same data dir. Every
/// change a 2xx acknowledged is there afterwards, nothing is left stuck, and no task ran
/// before its dependencies.
@Suite(.serialized, .inTheDefaultStageOnly) struct CrashLoopTests {
    struct Acknowledged {
        var tasks: Set<String> = []
        var cancelled: Set<String> = []
        var workflows: Set<String> = []
    }

    @Test func acknowledgedChangesSurviveRandomKills() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var random = SplitMix64(seed: UInt64(ProcessInfo.processInfo.environment["TASKLOOP_CRASH_SEED"].flatMap(UInt64.init) ?? 7))
        let cycles = 8
        let acknowledged = Locked(Acknowledged())
        for cycle in 0..<cycles {
            let (server, _) = try DurabilityTests.start(directory)
            let port = try #require(BinaryTests.port(from: try server.waitForLine(containing: "listening on")))
            let stop = Locked(false)
            let done = DispatchGroup()
            for worker in 0..<4 {
                done.enter()
                let seed = random.next()
                Thread {
                    defer { done.leave() }
                    var random = SplitMix64(seed: seed)
                    guard let client = try? APIClient(port: port) else { return }
                    var mine: [String] = []
                    while !stop.value {
                        do {
                            switch random.below(10) {
                            case 0..<5:
                                let after = mine.suffix(2).map { "\"\($0)\"" }.joined(separator: ",")
                                let kind = random.below(2) == 0 ? #""noop""# : #""sleep","params":{"duration_ms":20,"steps":1}"#
                                let response = try client.call("POST", "/tasks", json: #"{"kind":\#(kind),"dependencies":[\#(after)],"on_dependency_failure":"run","name":"c\#(cycle)w\#(worker)"}"#)
                                if response.status == 201, let id = response.json["id"] as? String {
                                    mine.append(id)
                                    acknowledged.withLock { $0.tasks.insert(id) }
                                }
                            case 5..<8:
                                let response = try client.call("POST", "/workflows", json: #"{"tasks":[{"key":"a","kind":"noop"},{"key":"b","kind":"sleep","params":{"duration_ms":10,"steps":1},"dependencies":["a"]},{"key":"c","kind":"noop","dependencies":["a","b"]}]}"#)
                                if response.status == 201, let id = response.json["id"] as? String,
                                   let keys = response.json["keys"] as? [String: String] {
                                    acknowledged.withLock {
                                        $0.workflows.insert(id)
                                        $0.tasks.formUnion(keys.values)
                                    }
                                }
                            default:
                                guard let victim = mine.randomElement(using: &random) else { continue }
                                let response = try client.call("DELETE", "/tasks/\(victim)")
                                if response.status == 200 { acknowledged.withLock { _ = $0.cancelled.insert(victim) } }
                            }
                        } catch {
                            return  // the server is gone
                        }
                    }
                }.start()
            }
            // Let the clients work for a random while, then kill without warning.
            let deadline = Date().addingTimeInterval(0.05 + Double(random.below(300)) / 1_000)
            try pollUntil("the next kill", timeout: 5, every: 5_000) { Date() >= deadline }
            kill(server.process.processIdentifier, SIGKILL)
            stop.withLock { $0 = true }
            #expect(done.wait(timeout: .now() + 30) == .success)
            #expect(try server.waitForExit() == SIGKILL)
        }

        // The last restart: everything acknowledged is there, and it all comes to an end.
        let (server, client) = try DurabilityTests.start(directory)
        let promised = acknowledged.value
        var states: [String: [String: Any]] = [:]
        var interrupted = 0
        for id in promised.tasks {
            let task = try client.waitForTerminal(id)
            states[id] = task
            if (task["error"] as? [String: Any])?["code"] as? String == "interrupted" { interrupted += 1 }
        }
        for id in promised.cancelled { #expect(states[id]?["state"] as? String == "cancelled", "cancel of \(id) was acknowledged") }
        for id in promised.workflows { #expect(try client.call("GET", "/workflows/\(id)").status == 200) }
        // Dependencies first: a task that started did so after each dependency had finished.
        for (id, task) in states {
            guard let started = task["started_at"] as? String else { continue }
            for dependency in task["dependencies"] as? [String] ?? [] {
                let dependencyTask = try states[dependency] ?? client.task(dependency)
                guard let finished = dependencyTask["finished_at"] as? String else {
                    Issue.record("\(id) started before its dependency \(dependency) finished")
                    continue
                }
                #expect(finished <= started, "\(id) started at \(started), before \(dependency) finished at \(finished)")
            }
        }
        print("crash loop: \(cycles) kills, \(promised.tasks.count) acknowledged tasks (\(promised.workflows.count) workflows, "
              + "\(promised.cancelled.count) acknowledged cancels), all present and terminal; \(interrupted) attempts interrupted")
        #expect(promised.tasks.count > 100, "the clients got work done between the kills")
        #expect(try server.stop() == 0)
    }
}

extension APIClient {
    /// Waits for the task to be terminal, whatever the state, and returns it.
    func waitForTerminal(_ id: String, timeout: Double = 30) throws -> [String: Any] {
        var task: [String: Any] = [:]
        try pollUntil("task \(id) to end", timeout: timeout, every: 0) {
            task = try call("GET", "/tasks/\(id)?wait=1", timeout: 3).json
            return ["succeeded", "failed", "cancelled"].contains(task["state"] as? String ?? "")
        }
        return task
    }
}
