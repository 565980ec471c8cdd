import Foundation
import Synchronization
import Testing
@testable import TaskloopService
import TaskloopTestSupport
import TaskloopTime

/// Schedules over real sockets: create, list, read, change, trigger and delete; runs that fire
/// on the wall clock with `schedule: {id, slot}` on their tasks; bad bodies named field by
/// field; `schedule.updated` events; the metrics; and, through a restart, a slot that passed
/// while the server was down running by `catchup`.
@Suite
struct ScheduleAPITests {
    static func milliseconds(_ timestamp: Any?) throws -> Int64 {
        try ScheduledTaskServiceTests.milliseconds(timestamp)
    }

    @Test func aScheduleIsMadeReadListedChangedAndDeleted() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let created = try client.call("POST", "/schedules", json: #"""
            {"name":"hourly report","cron":"0 * * * *","timezone":"Europe/Berlin","task":{"kind":"noop","queue":"reports"},
             "overlap":"allow","catchup":"latest","max_catchup":3,"jitter_ms":1000}
            """#)
        #expect(created.status == 201, "\(created.text)")
        let id = try #require(created.json["id"] as? String)
        #expect(created.header("Location") == "/schedules/\(id)")
        #expect(created.json["name"] as? String == "hourly report" && created.json["timezone"] as? String == "Europe/Berlin")
        #expect(created.json["overlap"] as? String == "allow" && created.json["catchup"] as? String == "latest")
        #expect(created.json["max_catchup"] as? Int == 3 && created.json["jitter_ms"] as? Int == 1000)
        #expect(created.json["paused"] as? Bool == false && created.json["start_at"] is NSNull)
        #expect((created.json["task"] as? [String: Any])?["queue"] as? String == "reports")
        let nextRuns = try #require(created.json["next_runs"] as? [String])
        #expect(nextRuns.count == 5)
        let slots = try nextRuns.map { try Self.milliseconds($0) }
        #expect(slots == slots.sorted() && zip(slots, slots.dropFirst()).allSatisfy { $1 - $0 == 3_600_000 })
        #expect((created.json["last_runs"] as? [Any])?.isEmpty == true)

        let read = try client.call("GET", "/schedules/\(id)")
        #expect(read.status == 200 && read.json["cron"] as? String == "0 * * * *")
        let listed = try client.call("GET", "/schedules").json["schedules"] as? [[String: Any]]
        #expect(listed?.map { $0["id"] as? String } == [id])

        let paused = try client.call("PATCH", "/schedules/\(id)", json: #"{"paused":true,"cron":"*/30 * * * *"}"#)
        #expect(paused.status == 200 && paused.json["paused"] as? Bool == true && paused.json["cron"] as? String == "*/30 * * * *")
        #expect((paused.json["next_runs"] as? [Any])?.isEmpty == true)
        #expect(paused.json["name"] as? String == "hourly report")

        let deleted = try client.call("DELETE", "/schedules/\(id)")
        #expect(deleted.status == 200 && deleted.json["id"] as? String == id)
        #expect(try client.call("GET", "/schedules/\(id)").status == 404)
        #expect(try client.call("DELETE", "/schedules/\(id)").status == 404)
        #expect(try client.call("POST", "/schedules/\(id)/trigger").status == 404)
        #expect(try client.call("GET", "/schedules/nonsense").status == 404)
    }

    /// A schedule firing every second: its runs' tasks carry `schedule: {id, slot}` and its
    /// `last_runs` show them with their states; the metrics count them.
    @Test func slotsFireOnTheWallClockAndTheirTasksSayWhichRun() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let created = try client.call("POST", "/schedules", json: #"""
            {"name":"every second","cron":"* * * * * *","task":{"kind":"noop","queue":"ticks"}}
            """#)
        #expect(created.status == 201, "\(created.text)")
        let id = try #require(created.json["id"] as? String)
        var runs: [[String: Any]] = []
        try pollUntil("two runs") {
            runs = try client.call("GET", "/schedules/\(id)").json["last_runs"] as? [[String: Any]] ?? []
            return runs.count >= 2 && runs.allSatisfy { $0["state"] as? String == "succeeded" }
        }
        let first = runs[0]
        let taskID = try #require(first["task_id"] as? String)
        let task = try client.task(taskID)
        let mark = try #require(task["schedule"] as? [String: Any])
        #expect(mark["id"] as? String == id && mark["slot"] as? String == first["slot"] as? String)
        #expect(try Self.milliseconds(first["slot"]) % 1_000 == 0)
        #expect(try Self.milliseconds(first["at"]) >= Self.milliseconds(first["slot"]))
        // A task nobody scheduled says so.
        let plain = try client.submit(#"{"kind":"noop"}"#)
        #expect(plain["schedule"] is NSNull)
        // With replicas each counts the runs of the cells it serves: summed, they count them all.
        let metrics = try service.allMetrics()
        let fired = metrics.split(separator: "\n").filter { $0.hasPrefix("taskloop_schedule_runs_fired_total ") }
        #expect(fired.compactMap { Double($0.split(separator: " ")[1]) }.reduce(0, +) >= 2, "\(fired)")
        #expect(metrics.contains("taskloop_schedule_runs_missed_total 0"))
        #expect(metrics.contains("taskloop_schedule_runs_skipped_total"))
    }

    /// Trigger makes one run now, paused or not: 201 with the task and its Location; with
    /// `overlap: skip` and that run unfinished, a second trigger is 409 naming it.
    @Test func triggerRunsNowAndObeysOverlap() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let created = try client.call("POST", "/schedules", json: #"""
            {"name":"manual","cron":"@yearly","paused":true,"task":{"kind":"external","queue":"manual"}}
            """#)
        let id = try #require(created.json["id"] as? String)
        let run = try client.call("POST", "/schedules/\(id)/trigger")
        #expect(run.status == 201, "\(run.text)")
        let taskID = try #require(run.json["id"] as? String)
        #expect(run.header("Location") == "/tasks/\(taskID)")
        #expect((run.json["schedule"] as? [String: Any])?["id"] as? String == id)
        let again = try client.call("POST", "/schedules/\(id)/trigger")
        #expect(again.status == 409 && again.json["code"] as? String == "previous_run_unfinished")
        #expect(again.json["existing_id"] as? String == taskID)
        #expect(again.header("Content-Type") == "application/problem+json")
        let runs = try client.call("GET", "/schedules/\(id)").json["last_runs"] as? [[String: Any]]
        #expect(runs?.count == 1 && runs?.first?["state"] as? String == "running")

        let workflow = try client.call("POST", "/schedules", json: #"""
            {"name":"pipeline","cron":"@daily","workflow":{"name":"etl","tasks":[{"key":"a","kind":"noop"},{"key":"b","kind":"noop","dependencies":["a"]}]}}
            """#)
        #expect(workflow.status == 201, "\(workflow.text)")
        let workflowRun = try client.call("POST", "/schedules/\(try #require(workflow.json["id"] as? String))/trigger")
        #expect(workflowRun.status == 201)
        let workflowID = try #require(workflowRun.json["id"] as? String)
        #expect(workflowRun.header("Location") == "/workflows/\(workflowID)")
    }

    /// A zone's tzdata file is read off the loop: the service loads it before the engine sees
    /// the request, on another thread, once; a zone with no file is 422 naming `timezone`.
    @Test func zonesAreLoadedOffTheLoop() throws {
        let loaders = Mutex<[pthread_t]>([])
        let catalog = TimeZoneCatalog { name throws(TimeZoneError) in
            loaders.withLock { $0.append(pthread_self()) }
            return try TimeZoneRules.load(named: name)
        }
        let service = try ServiceHarness { $0.engine.zones = catalog }
        defer { try? service.stop() }
        let client = try service.client()
        let task = #""task":{"kind":"noop"}"#
        let created = try client.call("POST", "/schedules", json: #"{"name":"tokyo","cron":"0 3 * * *","timezone":"Asia/Tokyo",\#(task)}"#)
        #expect(created.status == 201, "\(created.text)")
        let id = try #require(created.json["id"] as? String)
        let changed = try client.call("PATCH", "/schedules/\(id)", json: #"{"timezone":"America/Lima"}"#)
        #expect(changed.status == 200 && changed.json["timezone"] as? String == "America/Lima", "\(changed.text)")
        let unknown = try client.call("POST", "/schedules", json: #"{"name":"x","cron":"* * * * *","timezone":"Mars/Base",\#(task)}"#)
        #expect(unknown.status == 422 && (unknown.json["errors"] as? [[String: Any]])?.first?["field"] as? String == "timezone")
        #expect(try client.call("GET", "/schedules/\(id)").json["timezone"] as? String == "America/Lima")
        let loops = service.replicas.map { $0.onLoop { _ in pthread_self() } }
        let threads = loaders.withLock { $0 }
        #expect(threads.count == 3, "Asia/Tokyo, America/Lima and Mars/Base, each read once")
        #expect(threads.allSatisfy { loader in !loops.contains { pthread_equal($0, loader) != 0 } })
    }

    @Test func badBodiesAre422NamingTheFieldAndMakeNothing() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        func field(_ body: String) throws -> String? {
            let answer = try client.call("POST", "/schedules", json: body)
            #expect(answer.status == 422, "\(body): \(answer.text)")
            #expect(answer.header("Content-Type") == "application/problem+json")
            return (answer.json["errors"] as? [[String: Any]])?.first?["field"] as? String
        }
        let task = #""task":{"kind":"noop"}"#
        #expect(try field(#"{"name":"x","cron":"61 * * * *",\#(task)}"#) == "cron")
        #expect(try field(#"{"name":"x","cron":"* * * * *","timezone":"Mars/Base",\#(task)}"#) == "timezone")
        #expect(try field(#"{"name":"x","cron":"* * * * *",\#(task),"color":"red"}"#) == "color")
        #expect(try field(#"{"name":"x","cron":"* * * * *"}"#) == "task")
        #expect(try field(#"{"name":"x","cron":"* * * * *",\#(task),"workflow":{"tasks":[{"key":"a","kind":"noop"}]}}"#) == "workflow")
        #expect(try field(#"{"name":"x","cron":"* * * * *","task":{"kind":"nope"}}"#) == "task.kind")
        #expect(try field(#"{"name":"x","cron":"* * * * *","task":{"kind":"noop","priority":"high"}}"#) == "task.priority")
        #expect(try field(#"{"name":"x","cron":"* * * * *","workflow":{"tasks":[{"key":"a","kind":"nope"}]}}"#) == "workflow.tasks[0].kind")
        #expect(try field(#"{"name":"x","cron":"* * * * *",\#(task),"overlap":"sometimes"}"#) == "overlap")
        #expect(try field(#"{"name":"x","cron":"* * * * *",\#(task),"max_catchup":0}"#) == "max_catchup")
        #expect(try field(#"{"name":"x","cron":"* * * * *",\#(task),"jitter_ms":3600001}"#) == "jitter_ms")
        #expect(try field(#"{"cron":"* * * * *",\#(task)}"#) == "name")
        let cron = try client.call("POST", "/schedules", json: #"{"name":"x","cron":"* * * * * * *",\#(task)}"#)
        #expect((cron.json["errors"] as? [[String: Any]])?.first?["message"] as? String != nil)
        #expect((try client.call("GET", "/schedules").json["schedules"] as? [Any])?.isEmpty == true)
        let made = try #require(try client.call("POST", "/schedules", json: #"{"name":"x","cron":"@hourly",\#(task)}"#).json["id"] as? String)
        let patch = try client.call("PATCH", "/schedules/\(made)", json: #"{"cron":"99 * * * *"}"#)
        #expect(patch.status == 422 && (patch.json["errors"] as? [[String: Any]])?.first?["field"] as? String == "cron")
        #expect(try client.call("GET", "/schedules/\(made)").json["cron"] as? String == "@hourly")
    }

    /// Each change is a `schedule.updated` event: made, fired, deleted (with `deleted: true`);
    /// with replicas, from the cell's commits, on a stream of any replica.
    @Test func changesAreScheduleUpdatedEvents() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let stream = try EventStreamTests.Stream(port: service.port, "/events?types=schedule.updated")
        let id = try #require(try client.call("POST", "/schedules", json: #"""
            {"name":"events","cron":"* * * * * *","task":{"kind":"noop"}}
            """#).json["id"] as? String)
        let fired = try stream.waitUntil { events in
            events.contains { (($0.data["schedule"] as? [String: Any])?["last_runs"] as? [Any])?.isEmpty == false }
        }
        #expect(fired.allSatisfy { $0.type == "schedule.updated" })
        #expect((fired[0].data["schedule"] as? [String: Any])?["id"] as? String == id)
        #expect(try client.call("DELETE", "/schedules/\(id)").status == 200)
        let all = try stream.waitUntil { events in events.contains { $0.data["schedule"].flatMap { ($0 as? [String: Any])?["deleted"] as? Bool } == true } }
        let last = try #require(all.last)
        #expect((last.data["schedule"] as? [String: Any])?["id"] as? String == id)
    }

    /// A workflow run says which schedule and slot made it, as its tasks do: in the trigger's
    /// answer, `GET /workflows/{id}` and its `workflow.state` events; a workflow a client
    /// submitted shows null.
    @Test func aWorkflowRunSaysWhichRunOfWhichScheduleMadeIt() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let created = try client.call("POST", "/schedules", json: #"""
            {"name":"pipeline","cron":"@yearly","paused":true,"workflow":{"name":"etl","tasks":[{"key":"a","kind":"noop","queue":"etl"},
             {"key":"b","kind":"noop","queue":"etl","dependencies":["a"]}]}}
            """#)
        #expect(created.status == 201, "\(created.text)")
        let id = try #require(created.json["id"] as? String)
        let stream = try EventStreamTests.Stream(port: service.port, "/events?types=workflow.state")
        #expect(stream.head.contains("200 OK"))
        let run = try client.call("POST", "/schedules/\(id)/trigger")
        #expect(run.status == 201, "\(run.text)")
        let workflowID = try #require(run.json["id"] as? String)
        let mark = try #require(run.json["schedule"] as? [String: Any], "\(run.text)")
        let slot = try #require(mark["slot"] as? String)
        #expect(mark["id"] as? String == id)
        let lastRun = try #require((try client.call("GET", "/schedules/\(id)").json["last_runs"] as? [[String: Any]])?.first)
        #expect(lastRun["workflow_id"] as? String == workflowID && lastRun["slot"] as? String == slot)

        let events = try stream.waitUntil { events in
            events.contains { ($0.data["workflow"] as? [String: Any])?["state"] as? String == "succeeded" }
        }
        let shown = events.compactMap { $0.data["workflow"] as? [String: Any] }.filter { $0["id"] as? String == workflowID }
        #expect(shown.count == 2, "\(events.map(\.data))")
        #expect(shown.allSatisfy { ($0["schedule"] as? [String: Any])?["id"] as? String == id
                                   && ($0["schedule"] as? [String: Any])?["slot"] as? String == slot })
        let read = try client.call("GET", "/workflows/\(workflowID)")
        #expect(read.status == 200 && read.json["state"] as? String == "succeeded")
        let readMark = try #require(read.json["schedule"] as? [String: Any], "\(read.text)")
        #expect(readMark["id"] as? String == id && readMark["slot"] as? String == slot)
        let tasks = try #require(read.json["tasks"] as? [[String: Any]])
        #expect(tasks.count == 2 && tasks.allSatisfy { ($0["schedule"] as? [String: Any])?["slot"] as? String == slot })

        let plain = try client.call("POST", "/workflows", json: #"{"tasks":[{"key":"a","kind":"noop"}]}"#)
        #expect(plain.status == 201 && plain.json["schedule"] is NSNull, "\(plain.text)")
        let plainID = try #require(plain.json["id"] as? String)
        #expect(try client.call("GET", "/workflows/\(plainID)").json["schedule"] is NSNull)
    }

    /// The schedule a workflow run came from is kept with the workflow: after a restart the
    /// workflow (still running, so kept) shows the same schedule and slot.
    @Test(.inTheDefaultStageOnly) func aWorkflowRunKeepsItsScheduleAcrossARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func start() throws -> ServiceHarness {
            try ServiceHarness {
                $0.durability = .full
                $0.dataDirectory = directory
            }
        }
        let first = try start()
        var client = try first.client()
        let created = try client.call("POST", "/schedules", json: #"""
            {"name":"kept","cron":"@yearly","paused":true,"workflow":{"tasks":[{"key":"a","kind":"noop"},
             {"key":"b","kind":"external","dependencies":["a"]}]}}
            """#)
        let id = try #require(created.json["id"] as? String)
        let run = try client.call("POST", "/schedules/\(id)/trigger")
        #expect(run.status == 201, "\(run.text)")
        let workflowID = try #require(run.json["id"] as? String)
        let slot = try #require((run.json["schedule"] as? [String: Any])?["slot"] as? String)
        try first.stop()
        let second = try start()
        defer { try? second.stop() }
        client = try second.client()
        let read = try client.call("GET", "/workflows/\(workflowID)")
        #expect(read.status == 200 && read.json["state"] as? String == "running", "\(read.text)")
        let mark = try #require(read.json["schedule"] as? [String: Any], "\(read.text)")
        #expect(mark["id"] as? String == id && mark["slot"] as? String == slot)
    }

    /// `GET /events?schedule=ID` has that schedule's `schedule.updated` events and the events
    /// of the tasks and workflow its run made, and nothing of another schedule's run or of a
    /// task a client submitted (made before, so their events would have come first); a bad id
    /// is 400 naming `schedule`.
    @Test func theScheduleFilterKeepsItsOwnEventsAndItsRunsEvents() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        func create(_ body: String) throws -> String {
            let created = try client.call("POST", "/schedules", json: body)
            #expect(created.status == 201, "\(created.text)")
            return try #require(created.json["id"] as? String)
        }
        let id = try create(#"""
            {"name":"followed","cron":"@yearly","paused":true,"workflow":{"tasks":[{"key":"a","kind":"noop"},
             {"key":"b","kind":"noop","dependencies":["a"]}]}}
            """#)
        let other = try create(#"{"name":"other","cron":"@yearly","paused":true,"task":{"kind":"noop"}}"#)
        let stream = try EventStreamTests.Stream(port: service.port, "/events?schedule=\(id)")
        #expect(stream.head.contains("200 OK"))
        let otherRun = try client.call("POST", "/schedules/\(other)/trigger")
        _ = try client.waitForState(try #require(otherRun.json["id"] as? String), "succeeded")
        _ = try client.waitForState(try #require(try client.submit(#"{"kind":"noop"}"#)["id"] as? String), "succeeded")
        let run = try client.call("POST", "/schedules/\(id)/trigger")
        #expect(run.status == 201, "\(run.text)")
        let workflowID = try #require(run.json["id"] as? String)
        let events = try stream.waitUntil { events in
            events.contains { ($0.data["workflow"] as? [String: Any])?["state"] as? String == "succeeded" }
                && events.last?.type == "schedule.updated"
        }
        func scheduleOf(_ event: EventStreamTests.Stream.Event) -> String? {
            if let schedule = event.data["schedule"] as? [String: Any] { return schedule["id"] as? String }
            let object = (event.data["task"] ?? event.data["workflow"]) as? [String: Any]
            return (object?["schedule"] as? [String: Any])?["id"] as? String
        }
        #expect(events.allSatisfy { scheduleOf($0) == id }, "\(events.map { "\($0.type) \(scheduleOf($0) ?? "none")" })")
        #expect(["schedule.updated", "workflow.state", "task.created", "task.state"].allSatisfy { type in events.contains { $0.type == type } })
        #expect(events.filter { $0.type == "task.created" }.count == 2)
        #expect(events.contains { ($0.data["workflow"] as? [String: Any])?["id"] as? String == workflowID })

        let bad = try client.call("GET", "/events?schedule=nope")
        #expect(bad.status == 400 && bad.header("Content-Type") == "application/problem+json")
        #expect((bad.json["errors"] as? [[String: Any]])?.first?["field"] as? String == "schedule", "\(bad.text)")
    }

    /// Down across at least two slots: started again, the server runs the newest of them once
    /// (`catchup: latest`, made after the start though due before it) and counts the rest as
    /// missed; no slot ever runs twice, across another restart too.
    @Test(.inTheDefaultStageOnly) func slotsPassedWhileDownRunAfterTheRestartByCatchup() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func start() throws -> ServiceHarness { try ServiceHarness.keepingState(in: directory) }
        func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1_000) }
        let first = try start()
        var client = try first.client()
        let created = try client.call("POST", "/schedules", json: #"""
            {"name":"catch up","cron":"*/2 * * * * *","catchup":"latest","task":{"kind":"noop"}}
            """#)
        let id = try #require(created.json["id"] as? String)
        try first.stop()
        let stoppedAt = now()
        try pollUntil("two slots to pass while the server is down", timeout: 10) { now() > stoppedAt + 4_500 }
        let restartedAt = now()
        let second = try start()
        client = try second.client()
        let runs = try #require(try client.call("GET", "/schedules/\(id)").json["last_runs"] as? [[String: Any]])
        // The first run the second server made is the catch-up, made at its start: of the slots
        // that passed while it was down (after the stop, up to that start), only one ran.
        let times = try runs.map { (slot: try Self.milliseconds($0["slot"]), at: try Self.milliseconds($0["at"])) }
        let caughtUpAt = try #require(times.filter { $0.at >= restartedAt }.map(\.at).min(), "no run after the restart: \(runs)")
        #expect(times.count { $0.slot > stoppedAt && $0.slot <= caughtUpAt } == 1, "one catch-up run: \(runs)")
        let metrics = try second.allMetrics()
        let missed = metrics.split(separator: "\n").first { $0.hasPrefix("taskloop_schedule_runs_missed_total ") }
        #expect(missed.flatMap { Double($0.split(separator: " ")[1]) }.map { $0 >= 1 } == true, "\(missed ?? "none")")
        try second.stop()
        let third = try start()
        client = try third.client()
        let after = try #require(try client.call("GET", "/schedules/\(id)").json["last_runs"] as? [[String: Any]])
        let slots = after.compactMap { $0["slot"] as? String }
        #expect(Set(slots).count == slots.count, "a slot ran twice: \(slots)")
        try third.stop()
    }
}

/// Schedules in cells, on replicas of their own: a schedule's cell moving to another replica
/// (its next owner goes on after the last slot the first committed, so across the move every
/// slot runs exactly once; `catchup: all` runs the slots that passed while the cell moved),
/// and a workflow run whose tasks are in two cells.
@Suite(.serialized, .inTheDefaultStageOnly) struct ScheduleCellTests {
    @Test func theNextOwnerGoesOnAfterTheLastSlotAndRepeatsNone() throws {
        let (_, replicas) = try CellServiceTests.startCellReplicas("s0", "s1")
        let queue = "ticks"
        let (owner, survivor) = try CellServiceTests.ownerOfQueue(queue, among: replicas)
        defer { try? survivor.stop() }
        let created = try owner.client().call("POST", "/schedules", json: #"""
            {"name":"moves","cron":"* * * * * *","catchup":"all","max_catchup":1000,"task":{"kind":"noop","queue":"\#(queue)"}}
            """#)
        #expect(created.status == 201, "\(created.text)")
        let id = try #require(created.json["id"] as? String)
        // From the survivor: the list is read from the cells' records, whoever owns them.
        try pollUntil("two committed runs", timeout: 10) {
            let listed = try survivor.client().call("GET", "/schedules").json["schedules"] as? [[String: Any]]
            return (listed?.first { $0["id"] as? String == id }?["last_runs"] as? [Any])?.count ?? 0 >= 2
        }
        try owner.stop()
        let stoppedAt = Int64(Date().timeIntervalSince1970 * 1_000)
        try CellServiceTests.waitForEveryCell([survivor])
        let client = try survivor.client()
        var slots: [Int64] = []
        try pollUntil("runs after the move", timeout: 15) {
            let tasks = try client.call("GET", "/tasks?queue=\(queue)&limit=1000").json["tasks"] as? [[String: Any]] ?? []
            slots = try tasks.map { try ScheduleAPITests.milliseconds(($0["schedule"] as? [String: Any])?["slot"]) }.sorted()
            return slots.count { $0 > stoppedAt + 1_000 } >= 2
        }
        #expect(Set(slots).count == slots.count, "a slot ran twice: \(slots)")
        // None skipped either: each second from the first slot to the last made one run.
        #expect(zip(slots, slots.dropFirst()).allSatisfy { $1 - $0 == 1_000 }, "slots: \(slots)")
        let runs = try #require(try client.call("GET", "/schedules/\(id)").json["last_runs"] as? [[String: Any]])
        let runSlots = try runs.map { try ScheduleAPITests.milliseconds($0["slot"]) }
        #expect(runSlots == runSlots.sorted() && Set(runSlots).count == runSlots.count, "last_runs: \(runSlots)")
    }

    /// A cell's next owner reads the tzdata of its schedules' zones off its loop before the
    /// cell's engine restores them. Each replica has a catalog of its own here, so the one
    /// taking the cell over has not loaded the zone before.
    @Test func theNextOwnerLoadsTheZonesOffTheLoop() throws {
        let loaders = Mutex<[Int: [pthread_t]]>([:])
        var made = 0
        let (_, replicas) = try CellServiceTests.startCellReplicas("z0", "z1") { configuration in
            let index = made
            made += 1
            configuration.engine.zones = TimeZoneCatalog { name throws(TimeZoneError) in
                loaders.withLock { $0[index, default: []].append(pthread_self()) }
                return try TimeZoneRules.load(named: name)
            }
        }
        let queue = "zoned"
        let (owner, survivor) = try CellServiceTests.ownerOfQueue(queue, among: replicas)
        defer { try? survivor.stop() }
        let survivorIndex = try #require(replicas.firstIndex { $0 === survivor })
        let created = try owner.client().call("POST", "/schedules", json: #"""
            {"name":"tokyo","cron":"0 3 * * *","timezone":"Asia/Tokyo","task":{"kind":"noop","queue":"\#(queue)"}}
            """#)
        #expect(created.status == 201, "\(created.text)")
        let id = try #require(created.json["id"] as? String)
        #expect(loaders.withLock { $0[survivorIndex] } == nil)
        try owner.stop()
        try CellServiceTests.waitForEveryCell([survivor])
        let moved = try survivor.client().call("GET", "/schedules/\(id)")
        #expect(moved.status == 200 && moved.json["timezone"] as? String == "Asia/Tokyo", "\(moved.text)")
        let loop = survivor.onLoop { _ in pthread_self() }
        let threads = loaders.withLock { $0[survivorIndex] ?? [] }
        #expect(threads.count == 1)
        #expect(threads.allSatisfy { pthread_equal($0, loop) == 0 })
    }

    /// A workflow template whose tasks are in two cells: each run's members of the other cell
    /// are made there, and the run's state (on the schedule and in the list read from the
    /// cells' records) follows the whole workflow.
    @Test func aWorkflowRunSpansCells() throws {
        let service = try CellServiceTests.startCellReplicas("w0").replicas[0]
        defer { try? service.stop() }
        let client = try service.client()
        let (home, other) = CellServiceTests.queuesOfTwoCells(service)
        let created = try client.call("POST", "/schedules", json: #"""
            {"name":"spans","cron":"@yearly","paused":true,"workflow":{"tasks":[{"key":"a","kind":"noop","queue":"\#(home)"},
             {"key":"b","kind":"external","queue":"\#(other)","dependencies":["a"]}]}}
            """#)
        #expect(created.status == 201, "\(created.text)")
        let id = try #require(created.json["id"] as? String)
        let run = try client.call("POST", "/schedules/\(id)/trigger")
        #expect(run.status == 201, "\(run.text)")
        let member = try #require((run.json["keys"] as? [String: String])?["b"])
        let slot = try #require((run.json["schedule"] as? [String: Any])?["slot"] as? String)
        let stream = try EventStreamTests.Stream(port: service.port, "/events?schedule=\(id)&types=task.state")
        #expect(stream.head.contains("200 OK"))
        let running = try client.waitForState(member, "running")
        // The member made in the other cell carries the run's mark as the home's members do.
        #expect((running["schedule"] as? [String: Any])?["id"] as? String == id, "\(running)")
        #expect((running["schedule"] as? [String: Any])?["slot"] as? String == slot)
        let workflowID = try #require(run.json["id"] as? String)
        #expect((try client.call("GET", "/workflows/\(workflowID)").json["schedule"] as? [String: Any])?["id"] as? String == id)
        func states() throws -> [String?] {
            let one = (try client.call("GET", "/schedules/\(id)").json["last_runs"] as? [[String: Any]])?.first?["state"] as? String
            let listed = (try client.call("GET", "/schedules").json["schedules"] as? [[String: Any]])?.first { $0["id"] as? String == id }
            return [one, (listed?["last_runs"] as? [[String: Any]])?.first?["state"] as? String]
        }
        #expect(try states() == ["running", "running"])
        #expect(try client.call("POST", "/tasks/\(member)/complete", json: #"{"result":{}}"#).status == 200)
        try pollUntil("the run to succeed everywhere") { try states() == ["succeeded", "succeeded"] }
        // The member of the other cell is followed by the schedule's filter too.
        _ = try stream.waitUntil { events in
            events.contains { ($0.data["task"] as? [String: Any]).map { $0["id"] as? String == member && $0["state"] as? String == "succeeded" } == true }
        }
    }
}
