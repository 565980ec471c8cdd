import Dispatch
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON
import TaskloopLoop
import TaskloopPostgres
import TaskloopStore
import TaskloopTime

/// What any replica of a cluster answers from the cells' records in the database instead of
/// from an engine (contract v3, "Replicas that add capacity"): `GET /tasks` across every cell,
/// `GET /workflows/{id}`, `GET /queues` and `GET /schedules` (a single queue or schedule, all
/// in one cell, is its owner's to answer). The JSON is the single server's, byte for byte:
/// `Representation` writes it from the records the cells' owners committed, and a page is cut
/// as `Engine.listTasks` and `TaskloopAPI.listTasks` cut theirs.
///
/// What the records do not hold: how many workers wait on a queue's lease calls (0 here, unless
/// `live` gives the queue), and finishes of tasks retried or evicted since (the throughput is
/// counted from the kept tasks' `finished_at`; an engine counts every finish it saw since it
/// started).
///
/// Threading: the loop thread of the connection `execute` sends on.
enum ClusterLists {
    /// Sends a batch and answers with its results, as `PGConnection.execute` does.
    typealias Execute = (_ queries: [PGQuery], _ completion: @escaping (Result<[PGResult], PGError>) -> Void) -> Void

    /// A `GET /tasks` request as read.
    struct TaskListing: Equatable {
        /// Nil when the request names what no task can match (a malformed workflow or
        /// dependency id): the page is empty.
        var filter: CellReads.TaskFilter?
        /// The cursor: tasks older than it.
        var after: TaskID?
        var limit: Int
    }

    /// Reads `GET /tasks`'s query as `TaskloopAPI.listTasks` does, with its 400s.
    static func taskListing(_ request: HTTPRequest) throws(APIProblem) -> TaskListing {
        var errors: [APIProblem.FieldError] = []
        var filter = CellReads.TaskFilter()
        var matchesNothing = false
        if let text = request.query("state") {
            filter.state = TaskState(rawValue: text)
            if filter.state == nil {
                errors.append(.init(field: "state", message: "must be one of \(TaskState.allCases.map(\.rawValue).joined(separator: ", ")).")) }
        }
        filter.queue = request.query("queue")
        if let text = request.query("workflow") {
            filter.workflow = TaskID(text)
            if filter.workflow == nil { matchesNothing = true }
        }
        filter.kind = request.query("kind")
        filter.nameContains = request.query("name").flatMap { $0.isEmpty ? nil : $0.lowercased() }
        if let text = request.query("depends_on") {
            filter.dependsOn = TaskID(text)
            if filter.dependsOn == nil { matchesNothing = true }
        }
        let limit = TaskloopApplication.pageLimit(request, errors: &errors)
        var after: TaskID?
        if let text = request.query("after"), !text.isEmpty {
            after = TaskID(text)
            if after == nil { errors.append(.init(field: "after", message: "is not a cursor this server gave out.")) }
        }
        guard errors.isEmpty else { throw APIProblem.invalidQuery(errors) }
        return TaskListing(filter: matchesNothing ? nil : filter, after: after, limit: limit)
    }

    /// `GET /tasks`'s answer: `{tasks, next}`, newest first across every cell.
    static func tasks(_ listing: TaskListing, maxResponseBytes: Int, execute: Execute,
                      _ completion: @escaping (Result<[UInt8], PGError>) -> Void) {
        guard let filter = listing.filter else { return completion(.success(render([], next: nil, maxResponseBytes: maxResponseBytes))) }
        execute([CellReads.tasks(filter, before: listing.after, limit: listing.limit)]) { result in
            completion(result.flatMap { results in
                do {
                    let page = try CellReads.page(results[0], limit: listing.limit)
                    return .success(render(page.tasks, next: page.next, maxResponseBytes: maxResponseBytes))
                } catch {
                    return .failure(PGError(message: "\(error)"))
                }
            })
        }
    }

    private static func render(_ tasks: [TaskSnapshot], next: TaskID?, maxResponseBytes: Int) -> [UInt8] {
        var json = JSONWriter(capacity: 512 * (tasks.count + 1))
        json.beginObject()
        json.key(static: "tasks")
        json.beginArray()
        var next = next
        for (index, task) in tasks.enumerated() {
            Representation.write(task, into: &json)
            // As the engine's pages: a page of large tasks stops early, and `next` goes on from
            // the last one written.
            if json.byteCount > maxResponseBytes && index + 1 < tasks.count {
                next = task.id
                break
            }
        }
        json.endArray()
        json.field("next", next?.description)
        json.endObject()
        return json.bytes
    }

    /// `GET /workflows/{id}`'s answer, nil where no cell has the workflow (a 404).
    static func workflow(_ id: TaskID, execute: Execute, _ completion: @escaping (Result<[UInt8]?, PGError>) -> Void) {
        execute(CellReads.workflow(id)) { result in
            completion(result.flatMap { results in
                do {
                    return .success(try CellReads.workflow(results).map { Representation.workflow($0.workflow, tasks: $0.tasks) })
                } catch {
                    return .failure(PGError(message: "\(error)"))
                }
            })
        }
    }

    /// `GET /schedules`'s answer: every cell's schedules as their last commits left them,
    /// oldest first, each run's state as the tasks' records show it (one forgotten since shows
    /// the state it ended with, as its engine would). Their `next_runs` need their zones: ones
    /// this replica has not loaded are read off the loop (tzdata files) before the answer is
    /// written, on `loop`; one that cannot be read shows none.
    static func schedules(zones: TimeZoneCatalog, loop: EventLoop, execute: Execute,
                          _ completion: @escaping (Result<[UInt8], PGError>) -> Void) {
        execute(CellReads.schedules) { result in
            let read: (schedules: [ScheduleSnapshot], states: [TaskID: TaskState])
            do { read = try CellReads.schedules(result.get()) } catch {
                return completion(.failure(error as? PGError ?? PGError(message: "\(error)")))
            }
            let answer = { completion(.success(writeSchedules(read.schedules, states: read.states, zones: zones))) }
            guard !zones.hasLoaded(zonesOf: read.schedules) else { return answer() }
            let names = Set(read.schedules.map(\.spec.timezone))
            let bound = LoopBound(answer, loop: loop)
            DispatchQueue.global().async {
                for name in names { _ = try? zones.load(named: name) }
                _ = bound.loop.execute { bound.value() }
            }
        }
    }

    private static func writeSchedules(_ schedules: [ScheduleSnapshot], states: [TaskID: TaskState],
                                       zones: TimeZoneCatalog) -> [UInt8] {
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        json.key(static: "schedules")
        json.beginArray()
        for schedule in schedules {
            Representation.write(schedule, zones: zones, state: { run in
                switch run.target {
                case .none: "skipped"
                case .task(let id), .workflow(let id): (states[id] ?? run.endedAs ?? .cancelled).rawValue
                }
            }, into: &json)
        }
        json.endArray()
        json.endObject()
        return json.bytes
    }

    /// `GET /queues`'s answer: every cell's queues by name, "default" always among them.
    /// `live`: the queue as this replica's engine has it, for the cells it owns (shown whole,
    /// its waiting workers included); `wallClock`: the time the throughput is read at.
    static func queues(defaultConcurrency: Int, at wallClock: Int64, live: @escaping (String) -> TaskQueue? = { _ in nil },
                       execute: Execute, _ completion: @escaping (Result<[UInt8], PGError>) -> Void) {
        readQueues(at: wallClock, execute: execute) { result in
            completion(result.map { rows in
                var json = JSONWriter(capacity: 1_024)
                json.beginObject()
                json.key(static: "queues")
                json.beginArray()
                for name in Set(rows.keys).union(["default"]).sorted() {
                    write(name, rows[name] ?? CellReads.QueueRow(), defaultConcurrency: defaultConcurrency, at: wallClock, live: live,
                          into: &json)
                }
                json.endArray()
                json.endObject()
                return json.bytes
            })
        }
    }

    private static func readQueues(at wallClock: Int64, execute: Execute,
                                   _ completion: @escaping (Result<[String: CellReads.QueueRow], PGError>) -> Void) {
        let interval = Int64(FinishHistory.intervalMilliseconds)
        let oldest = (wallClock / interval - Int64(FinishHistory.intervalCount - 1)) * interval
        execute(CellReads.queues(finishedSince: oldest, interval: interval)) { result in
            completion(result.map { CellReads.queueRows($0) })
        }
    }

    private static func write(_ name: String, _ row: CellReads.QueueRow, defaultConcurrency: Int, at wallClock: Int64,
                              live: (String) -> TaskQueue?, into json: inout JSONWriter) {
        if let queue = live(name) { return Representation.write(queue, at: wallClock, into: &json) }
        let settings = row.settings ?? QueueSnapshot(name: name, maxConcurrency: defaultConcurrency, paused: false)
        // The intervals `FinishHistory.counts(at:)` shows, oldest first; later finishes (a
        // clock ahead of this one) are not shown yet.
        let current = wallClock / Int64(FinishHistory.intervalMilliseconds)
        let finished = (0..<Int64(FinishHistory.intervalCount)).map { index in
            row.finished[current - Int64(FinishHistory.intervalCount - 1) + index] ?? 0
        }
        Representation.writeQueue(name, maxConcurrency: settings.maxConcurrency, paused: settings.paused, dispatch: settings.dispatch,
                                  keyConcurrency: settings.keyConcurrency, rateLimit: settings.rateLimit,
                                  waitingWorkers: 0, count: { row.counts[$0] ?? 0 }, finished: finished, into: &json)
    }
}
