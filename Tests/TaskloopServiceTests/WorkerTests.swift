import Foundation
import Testing
import TaskloopEngine
@testable import TaskloopService
import TaskloopTestSupport
@testable import TaskloopWorker

/// `taskloop worker` as users run it: the built binary against a real server over real
/// sockets, its `exec` programs real processes checked by pid. One at a time: workers, their
/// programs and the server share two cores.
@Suite(.serialized) struct WorkerTests {
    typealias Worker = BinaryTests.RunningBinary

    /// A server whose queue `queue` is dispatched to workers.
    static func server(queue: String = "work", _ configure: (inout ServiceConfiguration) -> Void = { _ in }) throws
        -> (ServiceHarness, APIClient) {
        let service = try ServiceHarness(configure)
        let client = try service.client()
        try LeaseAPITests.workersQueue(client, queue, concurrency: 10)
        return (service, client)
    }

    /// Starts a worker on `port` and waits until it says it leases.
    static func worker(port: Int, queue: String = "work", _ arguments: [String] = [],
                       environment: [String: String] = [:]) throws -> Worker {
        let worker = try Worker(arguments: ["worker", "--server", "http://127.0.0.1:\(port)", "--queue", queue]
                                    + arguments, environment: environment)
        _ = try worker.waitForLine(containing: "leasing from")
        return worker
    }

    static func submit(_ client: APIClient, _ body: [String: Any]) throws -> String {
        try #require(try client.submit(ExecTests.json(body.merging(["queue": "work"]) { old, _ in old }))["id"] as? String)
    }

    static func temporaryDirectory() throws -> String { try BinaryTests.temporaryDirectory() }

    /// `sh -c` that writes its pid to `pidFile`, then waits for `gate` to exist; a program
    /// that runs until the test lets it go.
    static func gatedScript(pidFile: String, gate: String, before: String = "") -> String {
        "\(before) echo $$ > \(pidFile).tmp; mv \(pidFile).tmp \(pidFile); while [ ! -e \(gate) ]; do sleep 0.02; done"
    }

    // MARK: running tasks

    @Test func runsExecAndHTTPTasksWithProgressAndResults() throws {
        let (service, client) = try Self.server()
        let origin = try OriginServer()
        defer { origin.stop() }
        let worker = try Self.worker(port: service.port, ["--allow-exec", "--name", "worker-a"])
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }

        let script = Self.gatedScript(pidFile: "\(directory)/pid", gate: "\(directory)/gate",
                                      before: "echo PROGRESS 40% working;")
            + "; echo id=$TASKLOOP_TASK_ID attempt=$TASKLOOP_TASK_ATTEMPT; echo oops >&2"
        let exec = try Self.submit(client, ["kind": "exec", "params": ["argv": ["sh", "-c", script]]])
        var running: [String: Any] = [:]
        try pollUntil("the exec task's progress") {
            running = try client.task(exec)
            return (running["progress"] as? [String: Any])?["message"] as? String == "working"
        }
        #expect(running["state"] as? String == "running")
        #expect((running["progress"] as? [String: Any])?["fraction"] as? Double == 0.4)
        #expect((running["lease"] as? [String: Any])?["worker"] as? String == "worker-a")
        FileManager.default.createFile(atPath: "\(directory)/gate", contents: nil)
        let done = try client.waitForState(exec, "succeeded")
        let result = try #require(done["result"] as? [String: Any])
        #expect(result["exit_code"] as? Int == 0)
        // The program carries the server's task id and attempt, not the worker's local copy's.
        #expect((result["stdout"] as? String)?.contains("id=\(exec) attempt=1") == true, "\(result)")
        #expect(result["stderr"] as? String == "oops\n")

        let fetch = try Self.submit(client, ["kind": "http", "params": ["url": origin.url("/gated/3000/3")]])
        try pollUntil("the transfer's progress") {
            let fraction = ((try client.task(fetch))["progress"] as? [String: Any])?["fraction"] as? Double
            return fraction.map { $0 > 0 && $0 < 1 } ?? false
        }
        #expect(try client.task(fetch)["state"] as? String == "running")
        origin.release(2)
        let fetched = try #require(try client.waitForState(fetch, "succeeded")["result"] as? [String: Any])
        #expect(fetched["status"] as? Int == 200 && fetched["bytes"] as? Int == 3_000)

        let failing = try Self.submit(client, ["kind": "exec", "params": ["argv": ["sh", "-c", "echo broken >&2; exit 3"]]])
        let error = try #require(try client.waitForState(failing, "failed")["error"] as? [String: Any])
        #expect(error["code"] as? String == "exit_status" && error["exit_code"] as? Int == 3 && error["stderr"] as? String == "broken\n")
        let missing = try Self.submit(client, ["kind": "http", "params": ["url": origin.url("/status/503")]])
        #expect((try client.waitForState(missing, "failed")["error"] as? [String: Any])?["code"] as? String == "http_status")
        #expect(try worker.stop() == 0)
        _ = try worker.waitForLine(containing: "task \(exec) succeeded")
        try service.stop()
    }

    @Test func runsNoopAndSleepTasksAndTheirTimeouts() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port, ["--concurrency", "4"])
        let noop = try Self.submit(client, ["kind": "noop"])
        let sleep = try Self.submit(client, ["kind": "sleep", "params": ["duration_ms": 300, "steps": 3]])
        let failing = try Self.submit(client, ["kind": "sleep", "params": ["duration_ms": 10, "outcome": "fail"]])
        let late = try Self.submit(client, ["kind": "sleep", "timeout_ms": 100, "params": ["duration_ms": 60_000]])
        #expect(try client.waitForState(noop, "succeeded")["progress"].flatMap { ($0 as? [String: Any])?["fraction"] as? Double } == 1)
        let slept = try client.waitForState(sleep, "succeeded")
        #expect((slept["progress"] as? [String: Any])?["fraction"] as? Double == 1)
        #expect((try client.waitForState(failing, "failed")["error"] as? [String: Any])?["code"] as? String == "sleep_failed")
        #expect((try client.waitForState(late, "failed")["error"] as? [String: Any])?["code"] as? String == "timeout")
        _ = try worker.waitForLine(containing: "task \(late) failed: timeout")
        #expect(try worker.stop() == 0)
        // Both ends time the attempt; whichever ends it first, that is not worth a warning.
        #expect(!worker.printed.contains("warning worker: the server did not take the fail of task \(late)"), "\(worker.printed)")
        try service.stop()
    }

    /// However fast a program reports, the worker sends a task's progress at most five times a
    /// second, one report at a time (each an item of a report batch), and the latest progress
    /// is the one that arrives.
    @Test func progressIsCoalescedAndTheLatestWins() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port, ["--allow-exec"])
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // Fifty lines a second for most of a second: faster than the reports may go, slower than
        // one report's round trip, so only the interval keeps the count down.
        let flood = "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo \"PROGRESS $((i*2))% line $i\"; sleep 0.02; done;"
        let itemsBefore = try Self.reportItems(service)
        let started = Date()
        let task = try Self.submit(client, ["kind": "exec", "params": ["argv": [
            "sh", "-c", Self.gatedScript(pidFile: "\(directory)/pid", gate: "\(directory)/gate", before: flood)]]])
        try pollUntil("the last progress line to arrive") {
            ((try client.task(task))["progress"] as? [String: Any])?["message"] as? String == "line 40"
        }
        let elapsed = Date().timeIntervalSince(started)
        // The task has not ended: every item so far is its progress.
        let reports = try Self.reportItems(service) - itemsBefore
        #expect(try Self.counted(port: service.port, "taskloop_http_requests_total", #"route="/tasks/{id}/progress""#) == 0)
        #expect(reports >= 1 && reports <= 2 + (elapsed * 5).rounded(.up), "\(reports) progress reports in \(elapsed) s")
        FileManager.default.createFile(atPath: "\(directory)/gate", contents: nil)
        _ = try client.waitForState(task, "succeeded")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    @Test func execWithoutAllowExecFailsTheTaskWithoutRunningIt() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port)
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let task = try Self.submit(client, ["kind": "exec", "params": ["argv": ["touch", "\(directory)/ran"]]])
        let error = try #require(try client.waitForState(task, "failed")["error"] as? [String: Any])
        #expect(error["code"] as? String == "exec_not_allowed")
        #expect(!FileManager.default.fileExists(atPath: "\(directory)/ran"))
        // The worker goes on with what it may run.
        #expect(try client.waitForState(try Self.submit(client, ["kind": "noop"]), "succeeded")["state"] as? String == "succeeded")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// With `--kinds`, a worker leaves other kinds to other workers: an exec task submitted while
    /// a non-exec worker waits for work goes to the exec worker that comes later.
    @Test func kindsLeaveOtherTasksToOtherWorkers() throws {
        let (service, client) = try Self.server()
        let plain = try Self.worker(port: service.port, ["--kinds", "noop,sleep", "--name", "plain"])
        try pollUntil("the plain worker's lease call to wait") {
            (try client.call("GET", "/queues/work").json["waiting_workers"] as? Int) == 1
        }
        let exec = try Self.submit(client, ["kind": "exec", "params": ["argv": ["true"]]])
        let noop = try Self.submit(client, ["kind": "noop"])
        _ = try client.waitForState(noop, "succeeded")
        let runner = try Self.worker(port: service.port, ["--allow-exec", "--kinds", "exec", "--name", "runner"])
        _ = try client.waitForState(exec, "succeeded")
        _ = try runner.waitForLine(containing: "task \(exec) succeeded")
        #expect(!plain.printed.contains(exec))
        #expect(try plain.stop() == 0 && runner.stop() == 0)
        try service.stop()
    }

    // MARK: cancellation and lost leases

    /// DELETE on a leased task reaches the worker in its next heartbeat answer; the worker
    /// stops the program as the server would (SIGTERM to its tree) and reports `cancelled`.
    @Test func cancellingOnTheServerKillsTheWorkersProgram() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port, ["--allow-exec", "--lease-seconds", "1.5"])
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let task = try Self.submit(client, ["kind": "exec", "params": ["argv": [
            "sh", "-c", Self.gatedScript(pidFile: "\(directory)/pid", gate: "\(directory)/never")]]])
        let pid = try BinaryTests.pid(in: "\(directory)/pid")
        // Heartbeats renew the lease: its end moves on while the program runs.
        let granted = try #require((try client.task(task)["lease"] as? [String: Any])?["expires_at"] as? String)
        try pollUntil("a heartbeat to renew the lease") {
            ((try client.task(task))["lease"] as? [String: Any])?["expires_at"] as? String ?? granted > granted
        }
        let cancel = try client.call("DELETE", "/tasks/\(task)")
        #expect(cancel.status == 202 && cancel.json["cancel_requested"] as? Bool == true)
        let cancelled = try client.waitForState(task, "cancelled", timeout: 5)
        #expect((cancelled["error"] as? [String: Any])?["code"] as? String == "cancelled")
        try ExecTests.waitUntilGone(pid, timeout: 5)
        _ = try worker.waitForLine(containing: "task \(task) cancelled")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// A worker that cannot heartbeat (stopped here with SIGSTOP) loses its lease; when it
    /// runs again, its next call hears `lease_lost`, it kills the program and says nothing
    /// more: the server's `lease_expired` stands.
    @Test func aLostLeaseStopsTheProgramAndNothingIsReported() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port, ["--allow-exec", "--lease-seconds", "1"])
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let task = try Self.submit(client, ["kind": "exec", "params": ["argv": [
            "sh", "-c", Self.gatedScript(pidFile: "\(directory)/pid", gate: "\(directory)/gate")]]])
        let pid = try BinaryTests.pid(in: "\(directory)/pid")
        kill(worker.process.processIdentifier, SIGSTOP)
        let failed = try client.waitForState(task, "failed", timeout: 5)
        #expect((failed["error"] as? [String: Any])?["code"] as? String == "lease_expired")
        kill(worker.process.processIdentifier, SIGCONT)
        _ = try worker.waitForLine(containing: "lost the lease of task \(task)")
        try ExecTests.waitUntilGone(pid, timeout: 5)
        _ = try worker.waitForLine(containing: "task \(task) stopped after its lease was lost")
        let after = try client.task(task)
        #expect(after["state"] as? String == "failed" && (after["error"] as? [String: Any])?["code"] as? String == "lease_expired")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// kill -9 mid-task: the lease expires, the retry policy queues attempt 2, a second worker
    /// leases it, kills what the first left running on this machine (by the task's cookie)
    /// before running it, and finishes it.
    ///
    /// The first worker has one slot, so no lease call of it waits on the server when it dies
    /// (for what happens to one that does, see the next test).
    @Test func aKilledWorkersTaskComesBackAndASecondWorkerFinishesIt() throws {
        let (service, client) = try Self.server()
        let first = try Self.worker(port: service.port, ["--allow-exec", "--lease-seconds", "1", "--name", "first",
                                                         "--concurrency", "1"])
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let script = "echo $$ > \(directory)/pid.tmp.$TASKLOOP_TASK_ATTEMPT; mv \(directory)/pid.tmp.$TASKLOOP_TASK_ATTEMPT "
            + "\(directory)/pid.$TASKLOOP_TASK_ATTEMPT; [ $TASKLOOP_TASK_ATTEMPT = 2 ] || sleep 300"
        let task = try Self.submit(client, ["kind": "exec", "retry": ["max_attempts": 2, "backoff_ms": 0],
                                            "params": ["argv": ["sh", "-c", script]]])
        let orphan = try BinaryTests.pid(in: "\(directory)/pid.1")
        let second = try Self.killAndRunAgain(first, leaving: orphan, task: task, service: service, client: client)
        try ExecTests.waitUntilGone(orphan, timeout: 5)
        #expect(try second.stop() == 0)
        try service.stop()
    }

    /// The same with a program that left no mark but its cgroup (an empty environment, a
    /// session of its own): the second worker kills it by the first attempt's cgroup before
    /// it runs the task.
    @Test(.enabled(if: ExecTests.cgroups != nil))
    func aKilledWorkersHiddenProgramIsKilledBeforeTheTaskRunsAgain() throws {
        let (service, client) = try Self.server()
        let first = try Self.worker(port: service.port, ["--allow-exec", "--lease-seconds", "1", "--name", "first",
                                                         "--concurrency", "1"])
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let hidden = "echo $$ > \(directory)/e.tmp; mv \(directory)/e.tmp \(directory)/e; exec sleep 300"
        let script = "[ $TASKLOOP_TASK_ATTEMPT = 2 ] && exit 0; (env -i setsid sh -c '\(hidden)' &); exec sleep 300"
        let task = try Self.submit(client, ["kind": "exec", "retry": ["max_attempts": 2, "backoff_ms": 0],
                                            "params": ["argv": ["sh", "-c", script]]])
        let escapee = try BinaryTests.pid(in: "\(directory)/e")
        let second = try Self.killAndRunAgain(first, leaving: escapee, task: task, service: service, client: client)
        #expect(ExecTests.isGone(escapee), "killed before the task ran again")
        try ExecTests.waitUntilNoCgroupIsLeft(of: task)
        #expect(try second.stop() == 0)
        try service.stop()
    }

    /// A worker that goes away while its lease call waits on the server (stopped, here; killed
    /// alike) must not be handed tasks: each would sit leased to nobody until its lease
    /// expired, an attempt lost. The server answers a waiting call whose client ended its side
    /// of the connection at once, with nothing, and takes it out of the line.
    @Test func aGoneWorkersWaitingLeaseCallGetsNoTask() throws {
        let (service, client) = try Self.server()
        let gone = try Self.worker(port: service.port, ["--lease-seconds", "1", "--name", "gone"])
        try pollUntil("the worker's lease call to wait") {
            (try client.call("GET", "/queues/work").json["waiting_workers"] as? Int) == 1
        }
        #expect(try gone.stop() == 0)
        try pollUntil("the gone worker's lease call to leave the line") {
            (try client.call("GET", "/queues/work").json["waiting_workers"] as? Int) == 0
        }
        let task = try Self.submit(client, ["kind": "noop"])
        let second = try Self.worker(port: service.port, ["--name", "second"])
        let done = try client.waitForState(task, "succeeded", timeout: 5)
        #expect(done["attempt"] as? Int == 1)
        #expect(try second.stop() == 0)
        try service.stop()
    }

    // MARK: stopping

    /// SIGTERM: no more leasing; a short task finishes and is reported within the grace; a
    /// program that ignores SIGTERM is killed at the grace's end and its task released
    /// (`queued` again, attempt not consumed); exit 0 within the grace and a second.
    @Test func drainsOnSIGTERM() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port, ["--allow-exec", "--concurrency", "2", "--shutdown-grace-seconds", "2"])
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let short = try Self.submit(client, ["kind": "exec", "params": ["argv": [
            "sh", "-c", Self.gatedScript(pidFile: "\(directory)/short", gate: "\(directory)/gate")]]])
        let stubborn = try Self.submit(client, ["kind": "exec", "params": ["grace_ms": 60_000, "argv": [
            "sh", "-c", Self.gatedScript(pidFile: "\(directory)/long", gate: "\(directory)/never", before: "trap '' TERM;")]]])
        _ = try BinaryTests.pid(in: "\(directory)/short")
        let stubbornPid = try BinaryTests.pid(in: "\(directory)/long")
        let started = Date()
        kill(worker.process.processIdentifier, SIGTERM)
        _ = try worker.waitForLine(containing: "stopping: ")
        // Tasks submitted now stay queued: the worker no longer leases.
        let later = try Self.submit(client, ["kind": "noop"])
        FileManager.default.createFile(atPath: "\(directory)/gate", contents: nil)
        #expect(try client.waitForState(short, "succeeded")["state"] as? String == "succeeded")
        #expect(try worker.waitForExit(timeout: 10) == 0)
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 1.9 && elapsed < 3.5, "stopped after \(elapsed) s")
        let released = try client.task(stubborn)
        #expect(released["state"] as? String == "queued" && released["attempt"] as? Int == 1, "\(released)")
        #expect(released["lease"] == nil || released["lease"] is NSNull)
        #expect(ExecTests.isGone(stubbornPid))
        #expect(try client.task(later)["state"] as? String == "queued")
        _ = try worker.waitForLine(containing: "task \(stubborn) released")
        try service.stop()
    }

    /// A server that stops answering during the drain (stopped here with SIGSTOP) cannot keep
    /// the worker past its grace: the release it cannot deliver is given up, said in the log,
    /// and the worker exits 0 within the grace and a second; the lease expires on the server.
    @Test func stopsWithinTheGraceWhenTheServerDoesNotAnswer() throws {
        let server = try BinaryTests.RunningBinary(arguments: ["--port", "0", "--durability", "memory", "--log-level", "warning"])
        let port = try #require(BinaryTests.port(from: try server.waitForLine(containing: "listening on")))
        let client = try APIClient(port: port)
        try LeaseAPITests.workersQueue(client, "work", concurrency: 10)
        let worker = try Self.worker(port: port, ["--shutdown-grace-seconds", "1", "--request-timeout-seconds", "30"])
        let task = try Self.submit(client, ["kind": "sleep", "params": ["duration_ms": 60_000]])
        _ = try client.waitForState(task, "running")
        kill(server.process.processIdentifier, SIGSTOP)
        defer { kill(server.process.processIdentifier, SIGCONT) }
        let started = Date()
        kill(worker.process.processIdentifier, SIGTERM)
        #expect(try worker.waitForExit(timeout: 5) == 0)
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 0.9 && elapsed < 2.0, "stopped after \(elapsed) s")
        _ = try worker.waitForLine(containing: "task \(task): the server was not told its release within the grace")
        kill(server.process.processIdentifier, SIGCONT)
        #expect(try server.stop() == 0)
    }

    // MARK: reports in batches

    /// The series of `family` with `label` that the server at `port` counted, summed: calls
    /// are counted on the replica the worker talks to, as one that forwards a call counts it
    /// too.
    static func counted(port: Int, _ family: String, _ label: String) throws -> Double {
        try APIClient(port: port).call("GET", "/metrics").text.split(separator: "\n").filter {
            $0.hasPrefix(family + "{") && $0.contains(label)
        }.compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0, +)
    }

    /// Report items the servers took (status 200), summed over the replicas: each counts the
    /// items of the batch parts it served.
    static func reportItems(_ service: ServiceHarness, status: Int = 200) throws -> Double {
        try service.metric(#"taskloop_batch_items_total{route="/tasks/reports",status="\#(status)"}"#) ?? 0
    }

    /// Waits until each task has been seen running with progress short of the end.
    static func waitForProgressWhileRunning(_ client: APIClient, _ ids: [String]) throws {
        var unseen = ids
        try pollUntil("every task's progress while it runs") {
            unseen = try unseen.filter {
                let task = try client.task($0)
                let fraction = (task["progress"] as? [String: Any])?["fraction"] as? Double
                return !(task["state"] as? String == "running" && fraction.map { $0 > 0 && $0 < 1 } == true)
            }
            return unseen.isEmpty
        }
    }

    /// Submits `count` noops in one batch and returns their ids.
    static func submitNoops(_ client: APIClient, _ count: Int) throws -> [String] {
        try submitMany(client, #"{"kind":"noop","queue":"work"}"#, count)
    }

    /// Submits `count` copies of `item` (JSON) in one batch and returns their ids.
    static func submitMany(_ client: APIClient, _ item: String, _ count: Int) throws -> [String] {
        let items = Array(repeating: item, count: count).joined(separator: ",")
        let answer = try client.call("POST", "/tasks/batch", json: #"{"tasks":[\#(items)]}"#)
        #expect(answer.status == 207)
        let results = try #require(answer.json["results"] as? [[String: Any]])
        return results.compactMap { ($0["task"] as? [String: Any])?["id"] as? String }
    }

    static func waitUntilSucceeded(_ client: APIClient, _ ids: [String], timeout: Double = 30) throws {
        var pending = ids
        try pollUntil("\(ids.count) tasks to succeed", timeout: timeout, every: 20_000) {
            pending = try pending.filter { try client.task($0)["state"] as? String != "succeeded" }
            return pending.isEmpty
        }
    }

    /// Many tasks finished by one worker reach the server in a few `POST /tasks/reports`, each
    /// report an item; `--max-report-batch 1` is the single routes, a call per task; a linger
    /// of 0 still batches what finished together.
    @Test func finishedTasksAreReportedInFewBatches() throws {
        let (service, client) = try Self.server()
        try LeaseAPITests.workersQueue(client, "work", concurrency: 50)
        // Leases bring up to 50 tasks at once, which end within a few turns: with a linger a
        // call carries many; without one, those that finish while two calls are out.
        for (arguments, mostCalls) in [(["--report-linger-ms", "20"], 40.0), (["--report-linger-ms", "0"], 150.0),
                                       (["--max-report-batch", "1"], 0.0)] {
            func count() throws -> (calls: Double, singles: Double, items: Double) {
                (try Self.counted(port: service.port, "taskloop_http_requests_total", #"route="/tasks/reports""#),
                 try Self.counted(port: service.port, "taskloop_http_requests_total", #"route="/tasks/{id}/complete""#),
                 // Items are counted where their cell's part of the batch is served.
                 try service.metric(#"taskloop_batch_items_total{route="/tasks/reports",status="200"}"#) ?? 0)
            }
            let before = try count()
            let worker = try Self.worker(port: service.port, ["--concurrency", "50"] + arguments)
            let ids = try Self.submitNoops(client, 200)
            try Self.waitUntilSucceeded(client, ids)
            let after = try count()
            let (calls, singles, reported) = (after.calls - before.calls, after.singles - before.singles, after.items - before.items)
            if mostCalls > 0 {
                #expect(singles == 0 && reported == 200, "\(arguments): \(singles) single reports, \(reported) batch items")
                #expect(calls >= 1 && calls <= mostCalls, "\(arguments): 200 reports in \(calls) calls")
                print("worker \(arguments): 200 reports in \(Int(calls)) calls")
            } else {
                #expect(calls == 0 && singles == 200, "\(arguments): \(calls) batches, \(singles) single reports")
            }
            #expect(try worker.stop() == 0)
        }
        try service.stop()
    }

    /// The server ends the attempt (its timeout) while the worker's report lingers: the item's
    /// 409 is a lost lease as the single route's is, logged, and the task stays as the server
    /// ended it.
    @Test func aLeaseLostWhileItsReportWaitsIsTheItemsConflict() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port, ["--report-linger-ms", "1500"])
        let task = try Self.submit(client, ["kind": "sleep", "timeout_ms": 400, "retry": ["max_attempts": 1],
                                            "params": ["duration_ms": 50]])
        _ = try worker.waitForLine(containing: "task \(task) succeeded")
        let failed = try client.waitForState(task, "failed", timeout: 5)
        #expect((failed["error"] as? [String: Any])?["code"] as? String == "timeout")
        _ = try worker.waitForLine(containing: "the server did not take the complete of task \(task) (409")
        #expect(try client.task(task)["state"] as? String == "failed")
        // The slot is free again.
        let next = try Self.submit(client, ["kind": "noop"])
        _ = try client.waitForState(next, "succeeded", timeout: 5)
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// Reports that wait while the server does not answer (stopped with SIGSTOP) are sent
    /// again, whole, until it does: every task ends once, as the worker ran it.
    @Test func reportsOutliveAServerThatStopsAnswering() throws {
        let server = try BinaryTests.RunningBinary(arguments: ["--port", "0", "--durability", "memory", "--log-level", "warning"])
        let port = try #require(BinaryTests.port(from: try server.waitForLine(containing: "listening on")))
        let client = try APIClient(port: port)
        try LeaseAPITests.workersQueue(client, "work", concurrency: 10)
        let worker = try Self.worker(port: port, ["--concurrency", "20", "--report-linger-ms", "100",
                                                  "--request-timeout-seconds", "1", "--max-backoff-seconds", "0.5"])
        var ids: [String] = []
        for _ in 0..<10 { ids.append(try Self.submit(client, ["kind": "sleep", "params": ["duration_ms": 500]])) }
        try pollUntil("the tasks to run") { try ids.allSatisfy { try client.task($0)["state"] as? String == "running" } }
        kill(server.process.processIdentifier, SIGSTOP)
        defer { kill(server.process.processIdentifier, SIGCONT) }
        for id in ids { _ = try worker.waitForLine(containing: "task \(id) succeeded") }
        _ = try worker.waitForLine(containing: "is unavailable")
        kill(server.process.processIdentifier, SIGCONT)
        try Self.waitUntilSucceeded(client, ids)
        for id in ids {
            let task = try client.task(id)
            #expect(task["attempt"] as? Int == 1, "\(task)")
            #expect(worker.printed.components(separatedBy: "task \(id) succeeded").count == 2)
        }
        #expect(try worker.stop() == 0)
        #expect(try server.stop() == 0)
    }

    /// Stopping sends what lingers at once: a report waiting out a ten-second linger reaches
    /// the server long before that.
    @Test func stoppingFlushesLingeringReports() throws {
        let (service, client) = try Self.server()
        let worker = try Self.worker(port: service.port, ["--report-linger-ms", "10000"])
        let task = try Self.submit(client, ["kind": "noop"])
        _ = try worker.waitForLine(containing: "task \(task) succeeded")
        #expect(try client.task(task)["state"] as? String == "running", "the report lingers")
        let started = Date()
        kill(worker.process.processIdentifier, SIGTERM)
        #expect(try worker.waitForExit(timeout: 5) == 0)
        #expect(Date().timeIntervalSince(started) < 3)
        #expect(try client.task(task)["state"] as? String == "succeeded")
        try service.stop()
    }

    /// Many running tasks' progress reaches the server in batches: fewer calls than reports,
    /// none on the single progress route, every task's progress shown while it runs. With
    /// `--max-report-batch 1` each report is a call of its own, on the single routes.
    @Test func progressOfManyTasksTravelsInBatches() throws {
        let (service, client) = try Self.server()
        try LeaseAPITests.workersQueue(client, "work", concurrency: 20)
        for arguments in [[], ["--max-report-batch", "1"]] {
            func count() throws -> (calls: Double, singles: Double, items: Double) {
                (try Self.counted(port: service.port, "taskloop_http_requests_total", #"route="/tasks/reports""#),
                 try Self.counted(port: service.port, "taskloop_http_requests_total", #"route="/tasks/{id}/progress""#),
                 try Self.reportItems(service))
            }
            let before = try count()
            let worker = try Self.worker(port: service.port, ["--concurrency", "20"] + arguments)
            // A step every 100 ms for 3 s: each task has more progress than the interval lets out.
            let ids = try Self.submitMany(client, #"{"kind":"sleep","queue":"work","params":{"duration_ms":3000,"steps":30}}"#, 20)
            #expect(ids.count == 20)
            try Self.waitForProgressWhileRunning(client, ids)
            try Self.waitUntilSucceeded(client, ids)
            let after = try count()
            let (calls, singles, reported) = (after.calls - before.calls, after.singles - before.singles, after.items - before.items)
            if arguments.isEmpty {
                // At least one progress report and the completion of each task.
                #expect(singles == 0 && reported >= 40, "\(singles) single progress reports, \(reported) batch items")
                #expect(calls >= 1 && calls * 2 <= reported, "\(reported) reports in \(calls) calls")
                print("worker: \(Int(reported)) reports of 20 tasks in \(Int(calls)) calls")
            } else {
                #expect(calls == 0 && reported == 0 && singles >= 20, "\(arguments): \(calls) batches, \(singles) single progress reports")
            }
            #expect(try worker.stop() == 0)
        }
        try service.stop()
    }

    /// A task that finishes while its progress waits out the linger is reported once: the
    /// outcome supersedes the progress, which is dropped, so no batch names the task twice
    /// (the server would refuse the second item, 422 `duplicate_id`).
    @Test func aTaskFinishingRightAfterItsProgressIsReportedOnce() throws {
        let (service, client) = try Self.server()
        try LeaseAPITests.workersQueue(client, "work", concurrency: 50)
        let worker = try Self.worker(port: service.port, ["--concurrency", "50", "--report-linger-ms", "500"])
        let refusedBefore = try Self.reportItems(service, status: 422)
        let takenBefore = try Self.reportItems(service)
        // Progress at 10 ms, the end at 20 ms: both within the linger.
        let ids = try Self.submitMany(client, #"{"kind":"sleep","queue":"work","params":{"duration_ms":20,"steps":2}}"#, 50)
        try Self.waitUntilSucceeded(client, ids)
        for id in ids {
            let task = try client.task(id)
            #expect(task["attempt"] as? Int == 1, "\(task)")
        }
        #expect(try Self.reportItems(service, status: 422) == refusedBefore)
        let taken = try Self.reportItems(service) - takenBefore
        // Each completion, and progress only of a task whose linger ended before the task did.
        #expect(taken >= 50 && taken < 100, "\(taken) items taken")
        #expect(!worker.printed.contains("duplicate_id") && !worker.printed.contains("refused"), "\(worker.printed)")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// A server from before `POST /tasks/reports` (Fixtures/older_server.py in front of this
    /// one, answering 404 for that route): the worker says so once and reports each task on its
    /// own route from then on; every task ends.
    @Test func anOlderServerWithoutTheBatchRouteIsToldOneTaskAtATime() throws {
        let (service, client) = try Self.server()
        let older = try OlderServer(forwardingTo: service.port)
        defer { older.stop() }
        let worker = try Self.worker(port: older.port, ["--concurrency", "10"])
        try Self.waitUntilSucceeded(client, try Self.submitNoops(client, 30))
        _ = try worker.waitForLine(containing: "has no POST /tasks/reports")
        // The batches out when the first 404 came (two at most) were the last.
        let refusals = older.refusals
        #expect(refusals >= 1 && refusals <= 2, "\(refusals) batches refused")
        try Self.waitUntilSucceeded(client, try Self.submitNoops(client, 30))
        #expect(older.refusals == refusals)
        #expect(worker.printed.components(separatedBy: "has no POST /tasks/reports").count == 2, "said once")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// The same server gets running tasks' progress one call per report, on the single route,
    /// once its first refusal is in (the progress it refused included).
    @Test func anOlderServerGetsProgressOneTaskAtATime() throws {
        let (service, client) = try Self.server()
        let older = try OlderServer(forwardingTo: service.port)
        defer { older.stop() }
        let worker = try Self.worker(port: older.port, ["--concurrency", "10"])
        func singles() throws -> Double {
            try Self.counted(port: service.port, "taskloop_http_requests_total", #"route="/tasks/{id}/progress""#)
        }
        let before = try singles()
        var ids: [String] = []
        for _ in 0..<10 { ids.append(try Self.submit(client, ["kind": "sleep", "params": ["duration_ms": 2000, "steps": 20]])) }
        try Self.waitForProgressWhileRunning(client, ids)
        try Self.waitUntilSucceeded(client, ids)
        _ = try worker.waitForLine(containing: "has no POST /tasks/reports")
        let refusals = older.refusals
        #expect(refusals >= 1 && refusals <= 2, "\(refusals) batches refused")
        #expect(try singles() - before >= 10)
        #expect(worker.printed.components(separatedBy: "has no POST /tasks/reports").count == 2, "said once")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    // MARK: an absent or unwelcoming server

    /// A worker started before its server backs off, says so once, and runs tasks as soon as
    /// the server is there.
    @Test func backsOffUntilTheServerStartsThenRunsTasks() throws {
        let port = try OriginServer.freePort()
        let worker = try Self.worker(port: port, ["--max-backoff-seconds", "0.3"])
        _ = try worker.waitForLine(containing: "is unavailable")
        let service = try ServiceHarness { $0.http.port = port }
        let client = try service.client()
        try LeaseAPITests.workersQueue(client, "work", concurrency: 10)
        let task = try Self.submit(client, ["kind": "noop"])
        _ = try client.waitForState(task, "succeeded")
        _ = try worker.waitForLine(containing: "is available again")
        #expect(worker.printed.components(separatedBy: "is unavailable").count == 2, "one line for the whole outage")
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// A server that does not hold lease calls (`--max-lease-wait-seconds 0`) answers each at
    /// once with no task: the worker then asks once a second, not in a busy loop, and still
    /// gets the task that comes.
    @Test func emptyLeaseAnswersThatComeAtOnceAreSpacedASecondApart() throws {
        let (service, client) = try Self.server { $0.maxLeaseWaitMilliseconds = 0 }
        func leaseCalls() throws -> Double {
            try client.call("GET", "/metrics").text.split(separator: "\n").filter {
                $0.hasPrefix("taskloop_http_requests_total") && $0.contains(#"route="/queues/{name}/lease""#)
            }.compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0, +)
        }
        let worker = try Self.worker(port: service.port)
        let first = try leaseCalls()
        let started = Date()
        try pollUntil("two more lease calls") { try leaseCalls() >= first + 2 }
        #expect(Date().timeIntervalSince(started) >= 0.9, "two empty answers in \(Date().timeIntervalSince(started)) s")
        #expect(try client.waitForState(try Self.submit(client, ["kind": "noop"]), "succeeded")["attempt"] as? Int == 1)
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    /// A wrong token is an error line, once, and the worker keeps trying (the server's token
    /// may be put right) until it is stopped.
    @Test func aRefusedTokenIsLoggedOnceAndRetried() throws {
        // The queue need not exist: the token is checked first.
        let service = try ServiceHarness { $0.authToken = "right-token-0123456789" }
        let worker = try Self.worker(port: service.port, ["--max-backoff-seconds", "0.2"], environment: ["TASKLOOP_AUTH_TOKEN": "wrong-token-0123456789"])
        _ = try worker.waitForLine(containing: "refused the bearer token (401)")
        // Retries go on: the server counts more refused lease calls.
        let metricsClient = try service.client()
        func refusals() throws -> Double {
            let text = try metricsClient.call("GET", "/metrics", headers: ["Authorization": "Bearer right-token-0123456789"]).text
            return text.split(separator: "\n").filter {
                $0.hasPrefix("taskloop_http_requests_total") && $0.contains(#"route="/queues/{name}/lease""#) && $0.contains(#"status="401""#)
            }.compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0, +)
        }
        let seen = try refusals()
        try pollUntil("another refused lease call") { try refusals() > seen }
        #expect(worker.printed.components(separatedBy: "refused the bearer token").count == 2)
        #expect(try worker.stop() == 0)
        try service.stop()
    }

    // MARK: pieces

    /// Kills `first` with SIGKILL while its program `survivor` runs on, waits for the task's
    /// attempt 2 to be queued, and starts a second worker that runs it to success.
    static func killAndRunAgain(_ first: Worker, leaving survivor: Int32, task: String, service: ServiceHarness,
                                client: APIClient) throws -> Worker {
        let firstPid = first.process.processIdentifier
        kill(firstPid, SIGKILL)
        // As in DurabilityTests: a dead process, however long its reaping takes.
        try pollUntil("the first worker to die") { ExecTests.isGone(firstPid) }
        #expect(!ExecTests.isGone(survivor), "the dead worker's program runs on")
        try pollUntil("attempt 2 to be queued") {
            let current = try client.task(task)
            return current["attempt"] as? Int == 2 && current["state"] as? String == "queued"
        }
        let second = try worker(port: service.port, ["--allow-exec", "--name", "second"])
        let done = try client.waitForState(task, "succeeded")
        #expect(done["attempt"] as? Int == 2)
        return second
    }

    @Test func failuresAreCutToWhatTheServerTakes() {
        let long = String(repeating: "é", count: 5_000)
        let json = LeasedTask.json(TaskError(code: String(repeating: "c", count: 100), message: long,
                                             details: ["exit_code": 3, "code": "ignored"]))
        let object = json.objectValue
        #expect(object?["code"]?.stringValue?.unicodeScalars.count == 64)
        #expect(object?["message"]?.stringValue?.unicodeScalars.count == 4_096)
        #expect(object?["exit_code"] == 3)
        #expect(LeasedTask.cut("short", to: 64) == "short")
    }
}

/// Fixtures/older_server.py: a server without `POST /tasks/reports` in front of a real one.
final class OlderServer: @unchecked Sendable {
    private let process = Process()
    private let input = Pipe()
    private let lines = Locked<[String]>([])
    let port: Int

    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Fixtures/older_server.py").path

    init(forwardingTo target: Int) throws {
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        // It exits when its stdin closes, so it never outlives a test process that dies.
        process.arguments = ["--default-signal", "python3", Self.script, String(target)]
        process.standardOutput = output
        process.standardInput = input
        try process.run()
        let lines = self.lines
        lines.collectLines(from: output.fileHandleForReading)
        var listening: Int?
        try pollUntil("the older server to listen") {
            listening = lines.value.first { $0.hasPrefix("listening on ") }.flatMap { Int($0.dropFirst(13)) }
            return listening != nil
        }
        port = listening!
    }

    /// Calls to `POST /tasks/reports` it answered 404.
    var refusals: Int { lines.value.filter { $0 == "refused /tasks/reports" }.count }

    /// Stopped by a signal, not by closing its stdin alone: a child another test started at
    /// the same moment can inherit the pipe's write end, and then stdin never ends.
    func stop() {
        try? input.fileHandleForWriting.close()
        guard process.exitStatus == nil else { return }
        kill(process.processIdentifier, SIGKILL)
        _ = try? process.waitForExit("the older server to exit", timeout: 10)
    }
}
