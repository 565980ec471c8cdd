import Foundation
import Testing
import TaskloopTime
import TaskloopEngine
import TaskloopExecutors
import TaskloopHTTP
import TaskloopLoop
import TaskloopPostgres
import TaskloopStore
@testable import TaskloopService
import TaskloopLoopTestSupport
import TaskloopTestSupport

/// Lists read from the cells' records in the database answer exactly what the single server
/// answers from its engine: the same tasks in the same order, the same cursors, the same bytes.
@Suite(.inTheDefaultStageOnly) struct ClusterListsTests {
    /// A database with the cells' tables and a connection to it on a loop of its own.
    final class Cells: @unchecked Sendable {
        let thread = LoopThread(try! EventLoop(), name: "cluster-lists")
        let url: String
        private var connection: PGConnection!

        init() throws {
            url = try PostgresCluster.shared().makeDatabase()
            try PostgresCluster.shared().sql("CREATE SCHEMA taskloop", database: url)
            let connected = Locked<Result<Void, PGError>?>(nil)
            thread.run { [self] in
                connection = PGConnection(loop: thread.loop)
                connection.connect(url) { result in connected.withLock { $0 = result } }
            }
            try pollUntil("a connection") { connected.value != nil }
            try connected.value!.get()
            _ = try execute(CellSchema.setUp + CellSchema.keyConcurrencySetUp + CellSchema.rateLimitsSetUp + CellSchema.schedulesSetUp)
        }

        /// Runs `queries` as one batch; the row count of each result.
        @discardableResult
        func execute(_ queries: [PGQuery]) throws -> [Int] {
            let outcome = Locked<Result<[Int], PGError>?>(nil)
            thread.run { [self] in
                connection.execute(queries) { result in outcome.withLock { $0 = result.map { $0.map(\.rowCount) } } }
            }
            try pollUntil("the batch") { outcome.value != nil }
            return try outcome.value!.get()
        }

        /// Runs `read` on the loop with this connection's `execute`; its answer.
        func answer<Answer: Sendable>(_ read: @escaping @Sendable (@escaping ClusterLists.Execute,
                                                                   @escaping (Result<Answer, PGError>) -> Void) -> Void) throws -> Answer {
            let outcome = Locked<Result<Answer, PGError>?>(nil)
            thread.run { [self] in
                let connection = connection!
                read({ connection.execute($0, $1) }) { result in outcome.withLock { $0 = result } }
            }
            try pollUntil("the read") { outcome.value != nil }
            return try outcome.value!.get()
        }

        func finish() throws {
            thread.run { [self] in
                connection.close()
                thread.loop.finish()
            }
            try thread.waitForExit(timeout: 10)
        }
    }

    static let maxResponseBytes = 6_000

    /// A server with tasks in every state, of several kinds, queues, names, dependencies and a
    /// workflow; its tasks and queue settings written to the cells' tables, each queue's in a
    /// cell of its own choosing, in several commits as cells commit.
    static func serverAndCells() throws -> (ServiceHarness, Cells, workflows: [String]) {
        let service = try ServiceHarness(replicas: 1) { configuration in
            configuration.durability = .memory
            configuration.maxResponseBytes = maxResponseBytes
        }
        let client = try service.client()
        func post(_ path: String, _ json: String) throws -> [String: Any] {
            let response = try client.call("POST", path, json: json)
            #expect((200..<300).contains(response.status), "\(path) \(json): \(response.text)")
            return response.json
        }
        _ = try client.call("PATCH", "/queues/mail", json: #"{"paused":true}"#)
        _ = try client.call("PATCH", "/queues/video", json: #"{"dispatch":"workers","max_concurrency":3}"#)
        _ = try client.call("PATCH", "/queues/spare", json: #"{"max_concurrency":7}"#)
        _ = try client.call("PATCH", "/queues/paced", json: #"{"rate_limit":{"per_second":0.3,"burst":4}}"#)
        var mailIDs: [String] = []
        for number in 0..<12 {
            let name = ["Send Mail \(number)", "résumé Ünïcode \(number)", "report-\(number)"][number % 3]
            mailIDs.append(try post("/tasks", #"{"kind":"noop","queue":"mail","name":"\#(name)","priority":\#(number % 4),"metadata":{"n":\#(number)}}"#)["id"] as! String)
        }
        _ = try post("/tasks", #"{"kind":"http","queue":"mail","name":"hook","params":{"url":"https://example.com/hook","secret_headers":{"Authorization":"Bearer x"}}}"#)
        for number in 0..<6 {
            _ = try post("/tasks", #"{"kind":"noop","name":"after mail \#(number)","dependencies":["\#(mailIDs[number])"],"timeout_ms":5000}"#)
        }
        for number in 0..<8 { _ = try post("/tasks", #"{"kind":"noop","name":"done \#(number)"}"#) }
        _ = try post("/tasks", #"{"kind":"noop","queue":"later","name":"later","delay_ms":600000,"ttl_ms":900000}"#)
        var externals: [String] = []
        for number in 0..<6 {
            externals.append(try post("/tasks", #"{"kind":"external","queue":"batch","name":"External \#(number)","retry":{"max_attempts":1}}"#)["id"] as! String)
        }
        _ = try post("/tasks/\(externals[0])/complete", #"{"result":{"rows":42,"note":"ok"}}"#)
        _ = try post("/tasks/\(externals[1])/fail", #"{"error":{"code":"boom","message":"it broke","line":7}}"#)
        _ = try post("/tasks/\(externals[2])/progress", #"{"fraction":0.5,"message":"half"}"#)
        _ = try client.call("DELETE", "/tasks/\(mailIDs[11])")
        for number in 0..<5 { _ = try post("/tasks", #"{"kind":"noop","queue":"video","name":"clip \#(number)"}"#) }
        _ = try post("/queues/video/lease", #"{"worker":"w1","max_tasks":2}"#)
        let workflows = [
            try post("/workflows", """
                {"name":"flow","tasks":[{"key":"a","kind":"noop","queue":"mail","name":"flow a"},
                 {"key":"b","kind":"noop","queue":"mail","name":"flow b","dependencies":["a"]},
                 {"key":"c","kind":"external","queue":"batch","name":"flow c"}]}
                """)["id"] as! String,
            try post("/workflows", #"{"tasks":[{"key":"x","kind":"noop"},{"key":"y","kind":"noop","dependencies":["x"]}]}"#)["id"] as! String,
        ]

        let state = service.onLoop { application in
            let engine = application.engine!
            let tasks = engine.listTasks(before: nil, limit: .max) { _ in true }.tasks.map { engine.snapshot(of: $0) }
            let queues = engine.queues.values.filter { $0.paused || $0.maxConcurrency != engine.configuration.defaultConcurrency
                || $0.dispatch != .server || $0.rateLimit != nil }.map { engine.snapshot(of: $0) }
            let kept = workflows.map { engine.snapshot(of: engine.workflow(TaskID($0)!)!) }
            return (tasks, queues, kept)
        }
        #expect(Set(state.0.map(\.state)).count == TaskState.allCases.count, "every state: \(Set(state.0.map(\.state)))")
        let cells = try Cells()
        // Each queue in a cell of its own, committed in a few batches each, oldest last.
        let byQueue = Dictionary(grouping: state.0, by: \.queue)
        for (cell, queue) in byQueue.keys.sorted().enumerated() {
            let tasks = byQueue[queue]!
            for chunk in stride(from: tasks.count, to: 0, by: -4) {
                var batch = StoreBatch()
                batch.tasks = Array(tasks[max(0, chunk - 4)..<chunk])
                batch.queues = state.1.filter { $0.name == queue }
                // A workflow in the cell of its first task's queue.
                batch.workflows = state.2.filter { workflow in tasks.contains { $0.id == workflow.keys[0].id } }
                try cells.execute(CellSchema.writes(of: batch, cell: UInt16(cell + 1)))
            }
        }
        var settings = StoreBatch()
        settings.queues = state.1.filter { byQueue[$0.name] == nil }
        try cells.execute(CellSchema.writes(of: settings, cell: 40))
        return (service, cells, workflows)
    }

    /// The key property: every filter, every page size, every page followed by its cursor.
    @Test func pagesOfTasksFromTheCellsAreTheServersByteForByte() throws {
        let (service, cells, _) = try Self.serverAndCells()
        let client = try service.client()
        let some = try client.call("GET", "/tasks?queue=mail&limit=3").json["tasks"] as! [[String: Any]]
        let dependency = some.last!["id"] as! String
        let flow = (try client.call("GET", "/tasks?name=flow+b").json["tasks"] as! [[String: Any]])[0]["workflow"] as! String
        let filters = [
            "", "state=succeeded", "state=queued", "state=running", "state=pending", "state=failed", "state=cancelled",
            "queue=mail", "queue=video&state=running", "queue=none", "workflow=\(flow)", "workflow=\(flow.lowercased())",
            "workflow=nonsense", "kind=external", "kind=noop&queue=default", "name=MAIL", "name=r%C3%A9sum%C3%A9+%C3%BC",
            "name=", "name=zzz", "depends_on=\(dependency)", "depends_on=bad", "state=succeeded&name=done&kind=noop",
        ]
        var pages = 0
        for filter in filters {
            for limit in [1, 3, 7, 1_000] {
                var after: String?
                repeat {
                    let target = "/tasks?\(filter)&limit=\(limit)" + (after.map { "&after=\($0)" } ?? "")
                    let expected = try client.call("GET", target)
                    #expect(expected.status == 200, "\(target)")
                    let listing = try ClusterLists.taskListing(HTTPRequest(method: .GET, target: target))
                    let answer = try cells.answer { execute, done in
                        ClusterLists.tasks(listing, maxResponseBytes: Self.maxResponseBytes, execute: execute, done)
                    }
                    #expect(String(decoding: answer, as: UTF8.self) == expected.text, "\(target)")
                    after = expected.json["next"] as? String
                    pages += 1
                } while after != nil && pages < 2_000
            }
        }
        // The pages cut by size (limit 7 and 1000) and by count were both compared.
        let all = try client.call("GET", "/tasks?limit=1000")
        #expect(all.json["next"] is String, "the byte limit cut the page")
        #expect(pages > filters.count * 4)
        try cells.finish()
        try service.stop()
    }

    /// A request the server refuses is refused alike, and one naming what cannot exist lists nothing.
    @Test func badQueriesAreRefusedAsTheServerRefusesThem() throws {
        for target in ["/tasks?state=done", "/tasks?limit=0", "/tasks?limit=1001", "/tasks?after=nope", "/tasks?state=x&limit=x&after=x"] {
            do {
                _ = try ClusterLists.taskListing(HTTPRequest(method: .GET, target: target))
                Issue.record("\(target) was taken")
            } catch let problem as APIProblem {
                #expect(problem.status == .badRequest && problem.code == "invalid_query", "\(target)")
            }
        }
        #expect(try ClusterLists.taskListing(HTTPRequest(method: .GET, target: "/tasks?workflow=x")).filter == nil)
        #expect(try ClusterLists.taskListing(HTTPRequest(method: .GET, target: "/tasks?depends_on=x")).filter == nil)
    }

    /// A workflow from its cell's record and its tasks' (in their cells), as the server shows it.
    @Test func aWorkflowFromTheCellsIsTheServersByteForByte() throws {
        let (service, cells, workflows) = try Self.serverAndCells()
        let client = try service.client()
        for id in workflows + ["01M8DE0YGGP0VKG6TPFE8V4Q90"] {
            let expected = try client.call("GET", "/workflows/\(id)")
            let answer = try cells.answer { execute, done in ClusterLists.workflow(TaskID(id)!, execute: execute, done) }
            #expect(answer.map { String(decoding: $0, as: UTF8.self) } == (expected.status == 200 ? expected.text : nil), "\(id)")
        }
        let states = try workflows.map { try client.call("GET", "/workflows/\($0)").json["state"] as? String }
        #expect(states == ["running", "succeeded"])
        try cells.finish()
        try service.stop()
    }

    /// The queues across cells: settings from the cells that changed them, counts and
    /// throughput from their tasks, "default" always; as the server shows them.
    @Test func queuesFromTheCellsAreTheServersByteForByte() throws {
        let (service, cells, _) = try Self.serverAndCells()
        let client = try service.client()
        let defaultConcurrency = service.onLoop { $0.engine.configuration.defaultConcurrency }
        // The throughput is read at a moment: compared when both answers fell in one interval.
        func interval() -> Int64 { Int64(Date().timeIntervalSince1970 * 1_000) / Int64(FinishHistory.intervalMilliseconds) }
        func compare(_ path: String, _ read: @escaping @Sendable (Int64, @escaping ClusterLists.Execute,
                                                                  @escaping (Result<[UInt8]?, PGError>) -> Void) -> Void) throws {
            var compared = false
            while !compared {
                let before = interval()
                let expected = try client.call("GET", path)
                let now = Int64(Date().timeIntervalSince1970 * 1_000)
                let answer = try cells.answer { execute, done in read(now, execute, done) }
                guard interval() == before else { continue }
                compared = true
                #expect(answer.map { String(decoding: $0, as: UTF8.self) } == (expected.status == 200 ? expected.text : nil), "\(path)")
            }
        }
        // Idle "spare" and "paced" are kept by their settings alone, "default" by nothing.
        try compare("/queues") { now, execute, done in
            ClusterLists.queues(defaultConcurrency: defaultConcurrency, at: now, execute: execute) { done($0.map { $0 }) }
        }
        // A queue of a cell this replica owns is shown as its engine has it, the rest as the
        // records say.
        let live = try cells.answer { (execute, done: @escaping (Result<[String], PGError>) -> Void) in
            let scheduler = try! LoopScheduler(loop: cells.thread.loop)
            let engine = Engine(configuration: EngineConfiguration(), scheduler: scheduler, executors: [:])
            _ = try! engine.updateQueue("mail", maxConcurrency: 9)
            let now = scheduler.wallClock
            let expected = ["mail"].map { String(decoding: Representation.queue(engine.queues[$0]!, at: now), as: UTF8.self) }
            ClusterLists.queues(defaultConcurrency: defaultConcurrency, at: now, live: { engine.queues[$0] }, execute: execute) { all in
                scheduler.close()
                done(all.map { all in [String(decoding: all, as: UTF8.self)] + expected })
            }
        }
        #expect(live[0].contains(live[1]) && live[1].contains(#""max_concurrency":9"#), "\(live[0])")
        #expect(live[0].contains(#"{"name":"video","max_concurrency":3"#), "the others from the records")
        try cells.finish()
        try service.stop()
    }

    /// The schedules across cells, each with its runs' states read from the tasks' records (a
    /// workflow's from its members'), as the server shows them.
    @Test func schedulesFromTheCellsAreTheServersByteForByte() throws {
        let service = try ServiceHarness(replicas: 1) { $0.durability = .memory }
        defer { try? service.stop() }
        let client = try service.client()
        func post(_ path: String, _ json: String) throws -> [String: Any] {
            let response = try client.call("POST", path, json: json)
            #expect((200..<300).contains(response.status), "\(path) \(json): \(response.text)")
            return response.json
        }
        let held = try post("/schedules", #"{"name":"held","cron":"@yearly","paused":true,"task":{"kind":"external","queue":"mail"}}"#)
        let running = try post("/schedules/\(held["id"] as! String)/trigger", "{}")["id"] as! String
        let flow = try post("/schedules", """
            {"name":"flow","cron":"0 3 * * *","timezone":"Europe/Berlin","workflow":{"tasks":[{"key":"a","kind":"noop"},
             {"key":"b","kind":"external","dependencies":["a"]}]}}
            """)
        let workflow = try post("/schedules/\(flow["id"] as! String)/trigger", "{}")["id"] as! String
        // A NUL in its name, which PostgreSQL's jsonb refuses: the list must not read records through it.
        let done = try post("/schedules", #"{"name":"done\u0000","cron":"*/5 * * * *","jitter_ms":100,"task":{"kind":"noop","queue":"video"}}"#)
        let finished = try post("/schedules/\(done["id"] as! String)/trigger", "{}")["id"] as! String
        _ = try client.waitForState(finished, "succeeded")
        #expect(try client.task(running)["state"] as? String == "running")
        try pollUntil("the workflow's first task to finish") {
            try client.call("GET", "/workflows/\(workflow)").json["tasks"].map { "\($0)".contains("succeeded") } == true
        }

        let state = service.onLoop { application in
            let engine = application.engine!
            let tasks = engine.listTasks(before: nil, limit: .max) { _ in true }.tasks.map { engine.snapshot(of: $0) }
            return (tasks, engine.allSchedules.map { engine.snapshot(of: $0) }, engine.snapshot(of: engine.workflow(TaskID(workflow)!)!))
        }
        let cells = try Cells()
        // Each schedule in a cell of its own, its runs' tasks in yet others.
        for (cell, schedule) in state.1.enumerated() {
            var batch = StoreBatch()
            batch.schedules = [schedule]
            try cells.execute(CellSchema.writes(of: batch, cell: UInt16(cell)))
        }
        var tasks = StoreBatch()
        tasks.tasks = state.0
        tasks.workflows = [state.2]
        try cells.execute(CellSchema.writes(of: tasks, cell: 9))

        let expected = try client.call("GET", "/schedules")
        // A catalog of its own, which has not loaded Europe/Berlin: the list loads it off the loop.
        let zones = TimeZoneCatalog(), loop = cells.thread.loop
        let answer = try cells.answer { execute, done in ClusterLists.schedules(zones: zones, loop: loop, execute: execute, done) }
        #expect(zones.loaded(named: "Europe/Berlin") != nil)
        #expect(String(decoding: answer, as: UTF8.self) == expected.text)
        let states = (expected.json["schedules"] as? [[String: Any]])?.map { ($0["last_runs"] as? [[String: Any]])?.first?["state"] as? String }
        #expect(states == ["running", "running", "succeeded"], "\(expected.text)")
        try cells.finish()
    }
}
