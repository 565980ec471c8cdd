import TaskloopEngine
import TaskloopPostgres

/// Reading every cell's records at once, for what any replica answers from the database rather
/// than from an engine: pages of `GET /tasks`, the queues, a workflow. Each read is one batch;
/// a read of several statements is one snapshot, so its parts agree.
public enum CellReads {
    /// What a page of tasks must match, as `GET /tasks` takes it (each filter given must match).
    public struct TaskFilter: Sendable, Equatable {
        public var state: TaskState?
        public var queue: String?
        public var workflow: TaskID?
        public var kind: String?
        /// Matches a name containing it, ignoring case (folded as the engine folds it).
        public var nameContains: String?
        public var dependsOn: TaskID?

        public init(state: TaskState? = nil, queue: String? = nil, workflow: TaskID? = nil, kind: String? = nil,
                    nameContains: String? = nil, dependsOn: TaskID? = nil) {
            self.state = state
            self.queue = queue
            self.workflow = workflow
            self.kind = kind
            self.nameContains = nameContains
            self.dependsOn = dependsOn
        }
    }

    /// The conditions a filter may set, in the order of their parameters.
    private static let conditions: [@Sendable (Int) -> String] = [
        { "state = $\($0)" }, { "queue = $\($0)" }, { "workflow = $\($0)" }, { "kind = $\($0)" },
        { "strpos(name_folded, $\($0)) > 0" }, { "dependencies @> ARRAY[$\($0)]::text[]" }, { "id < $\($0)" },
    ]

    /// One statement for each combination of conditions, prepared on first use.
    private static let pageStatements: [PGStatement] = (0..<(1 << conditions.count)).map { mask in
        var clauses: [String] = []
        for (bit, condition) in conditions.enumerated() where mask & (1 << bit) != 0 {
            clauses.append(condition(clauses.count + 1))
        }
        let filter = clauses.isEmpty ? "" : " WHERE " + clauses.joined(separator: " AND ")
        return PGStatement("cell_tasks_page_\(mask)", """
            SELECT sequence, record FROM taskloop.cell_tasks\(filter) ORDER BY id DESC LIMIT $\(clauses.count + 1)
            """)
    }

    /// The tasks matching `filter`, newest first, below the cursor `before` (exclusive): one
    /// more than `limit`, which tells `page` whether another page follows.
    public static func tasks(_ filter: TaskFilter, before: TaskID?, limit: Int) -> PGQuery {
        let given: [PGValue?] = [
            filter.state.map { .text($0.rawValue) }, filter.queue.map { .text($0) }, filter.workflow.map { .text($0.description) },
            filter.kind.map { .text($0) }, filter.nameContains.map { .text($0.lowercased()) },
            filter.dependsOn.map { .text($0.description) }, before.map { .text($0.description) },
        ]
        var mask = 0
        var parameters: [PGValue] = []
        for (bit, value) in given.enumerated() {
            guard let value else { continue }
            mask |= 1 << bit
            parameters.append(value)
        }
        return PGQuery(pageStatements[mask], parameters + [.int(limit + 1)], binaryResults: true)
    }

    /// The page `tasks` read: at most `limit` tasks, and the cursor of the next page, nil on the
    /// last, as `Engine.listTasks` gives them.
    public static func page(_ result: PGResult, limit: Int) throws -> (tasks: [TaskSnapshot], next: TaskID?) {
        var tasks = try PostgresRows.tasks(result)
        guard tasks.count > limit else { return (tasks, nil) }
        tasks.removeLast(tasks.count - limit)
        return (tasks, tasks.last?.id)
    }

    /// Which of `ids` some cell keeps (`existing` reads them).
    public static func existing(_ ids: [TaskID]) -> PGQuery {
        PGQuery("SELECT id FROM taskloop.cell_tasks WHERE id = ANY($1::text[])",
                [.text("{" + ids.map(\.description).joined(separator: ",") + "}")])
    }

    public static func existing(_ result: PGResult) -> Set<TaskID> {
        Set((0..<result.rowCount).compactMap { result.text($0, 0).flatMap(TaskID.init) })
    }

    /// Every cell's schedules, oldest first, and the states of their runs, in one snapshot;
    /// `schedules(_:)` reads them. A run's state is its task's, or its workflow's as its
    /// members' states make it (`WorkflowRecord.state(of:)`).
    public static let schedules = [
        PGQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
        PGQuery("SELECT record FROM taskloop.cell_schedules ORDER BY id", binaryResults: true),
        // The runs are in the records: their tasks and workflows are looked up by the ids in
        // them (the tasks' key and workflow index), never by a scan of the tasks. The ids are
        // matched in the record's JSON text rather than read through jsonb, which refuses a
        // record holding `\u0000` (a name or param may): one such record failed every read of
        // the list. A string value cannot hold the pattern (its quotes are escaped), and an id a
        // template's params happen to hold only adds a lookup.
        PGQuery("""
            SELECT id, state FROM taskloop.cell_tasks WHERE id IN (SELECT (regexp_matches(convert_from(record, 'UTF8'),
                '"task_id":"([0-9A-Z]{26})"', 'g'))[1] FROM taskloop.cell_schedules)
            """),
        PGQuery("""
            SELECT workflow, state, count(*) FROM taskloop.cell_tasks WHERE workflow IN (SELECT (regexp_matches(
                convert_from(record, 'UTF8'), '"workflow_id":"([0-9A-Z]{26})"', 'g'))[1] FROM taskloop.cell_schedules)
            GROUP BY workflow, state
            """),
        PGQuery("COMMIT"),
    ]

    /// What `schedules` read: the schedules, and the state of each run's task or workflow
    /// still kept.
    public static func schedules(_ results: [PGResult]) throws -> (schedules: [ScheduleSnapshot], states: [TaskID: TaskState]) {
        let schedules = try CellSchema.schedules(results[1])
        var states: [TaskID: TaskState] = [:]
        for row in 0..<results[2].rowCount {
            if let id = results[2].text(row, 0).flatMap(TaskID.init), let state = results[2].text(row, 1).flatMap(TaskState.init) {
                states[id] = state
            }
        }
        var counts: [TaskID: StateCounts] = [:]
        for row in 0..<results[3].rowCount {
            if let id = results[3].text(row, 0).flatMap(TaskID.init), let state = results[3].text(row, 1).flatMap(TaskState.init) {
                counts[id, default: StateCounts()][state] += results[3].int(row, 2).map(Int.init) ?? 0
            }
        }
        for (id, memberCounts) in counts { states[id] = WorkflowRecord.state(of: memberCounts) }
        return (schedules, states)
    }

    /// A workflow and its tasks still kept, in order, in one snapshot; `workflow` reads them.
    public static func workflow(_ id: TaskID) -> [PGQuery] {
        let idValue = [PGValue.text(id.description)]
        return [
            PGQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
            PGQuery("SELECT id, record FROM taskloop.cell_workflows WHERE id = $1", idValue, binaryResults: true),
            PGQuery("SELECT sequence, record FROM taskloop.cell_tasks WHERE workflow = $1 ORDER BY id", idValue, binaryResults: true),
            PGQuery("COMMIT"),
        ]
    }

    /// The workflow `workflow(_:)` read, nil where no cell has it.
    public static func workflow(_ results: [PGResult]) throws -> (workflow: WorkflowSnapshot, tasks: [TaskSnapshot])? {
        guard let workflow = try PostgresRows.workflows(results[1]).first else { return nil }
        return (workflow, try PostgresRows.tasks(results[2]))
    }

    /// One task as its cell last committed it; `task(_ result:)` reads it.
    public static func task(_ id: TaskID) -> PGQuery {
        PGQuery("SELECT sequence, record FROM taskloop.cell_tasks WHERE id = $1", [.text(id.description)], binaryResults: true)
    }

    /// The task `task(_:)` read, nil where no cell has it.
    public static func task(_ result: PGResult) throws -> TaskSnapshot? {
        try PostgresRows.tasks(result).first
    }

    /// The queues every cell keeps: the settings of those that differ from a new queue's, the
    /// count of tasks per queue and state, and the tasks finished since `finishedSince` (wall
    /// ms) per queue and interval of `interval` ms.
    public static func queues(finishedSince: Int64, interval: Int64) -> [PGQuery] {
        [
            PGQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
            PGQuery("SELECT \(CellSchema.queueColumns) FROM taskloop.cell_queues", binaryResults: true),
            PGQuery("SELECT queue, state, count(*) FROM taskloop.cell_tasks GROUP BY queue, state", binaryResults: true),
            PGQuery("SELECT queue, finished_at / $2, count(*) FROM taskloop.cell_tasks WHERE finished_at >= $1 GROUP BY 1, 2",
                    [.int(finishedSince), .int(interval)], binaryResults: true),
            PGQuery("COMMIT"),
        ]
    }

    /// A queue as `queues` read it.
    public struct QueueRow: Sendable, Equatable {
        /// Nil where the queue has a new queue's settings.
        public var settings: QueueSnapshot?
        public var counts: [TaskState: Int] = [:]
        /// Tasks finished per interval (wall ms / interval).
        public var finished: [Int64: Int] = [:]

        public init() {}
    }

    /// The queues `queues` read, by name: each with settings or a task.
    public static func queueRows(_ results: [PGResult]) -> [String: QueueRow] {
        var rows: [String: QueueRow] = [:]
        for settings in PostgresRows.queues(results[1]) { rows[settings.name, default: QueueRow()].settings = settings }
        let counts = results[2]
        for row in 0..<counts.rowCount {
            guard let queue = counts.text(row, 0), let state = counts.text(row, 1).flatMap(TaskState.init(rawValue:)),
                  let count = counts.int(row, 2) else { continue }
            rows[queue, default: QueueRow()].counts[state] = Int(count)
        }
        let finished = results[3]
        for row in 0..<finished.rowCount {
            guard let queue = finished.text(row, 0), let interval = finished.int(row, 1), let count = finished.int(row, 2) else { continue }
            rows[queue, default: QueueRow()].finished[interval] = Int(count)
        }
        return rows
    }
}
