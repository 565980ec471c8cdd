/// One commit's changes as records: tasks, workflows and queues as they are now, what was
/// forgotten, and the messages to other cells. A replica on cells writes them in its cell's commit.
public struct RecordChanges: Sendable {
    public var tasks: [TaskSnapshot] = []
    public var evictedTasks: [StoredTaskKey] = []
    public var workflows: [WorkflowSnapshot] = []
    public var evictedWorkflows: [TaskID] = []
    public var queues: [QueueSnapshot] = []
    public var forgottenQueues: [String] = []
    /// Messages to other cells, in the order sent (Engine+Cells).
    public var messages: [CellMessage] = []
    /// Unique keys of forgotten tasks, made and dropped (Engine+Unique).
    public var uniqueKeys: [UniqueKeyTombstone] = []
    public var droppedUniqueKeys: [UniqueKeyName] = []
    /// Schedules made or changed (firing included), and deleted (Engine+Schedules).
    public var schedules: [ScheduleSnapshot] = []
    public var deletedSchedules: [TaskID] = []

    public init() {}

    public var isEmpty: Bool {
        tasks.isEmpty && evictedTasks.isEmpty && workflows.isEmpty && evictedWorkflows.isEmpty && queues.isEmpty
            && forgottenQueues.isEmpty && messages.isEmpty && uniqueKeys.isEmpty && droppedUniqueKeys.isEmpty
            && schedules.isEmpty && deletedSchedules.isEmpty
    }
}

/// Which task a deletion names: by the id clients know, and by the engine's sequence number,
/// which is a store's row key.
public struct StoredTaskKey: Hashable, Sendable {
    public var id: TaskID
    public var sequence: UInt64

    public init(id: TaskID, sequence: UInt64) {
        self.id = id
        self.sequence = sequence
    }
}

/// Gathers the records settled batches name, and snapshots each once, when asked (at the end
/// of a loop turn, as they are then).
public struct ChangeCollector {
    /// In order of first change; a task changed by several events in a row is listed once,
    /// others are deduplicated in `take`.
    private var tasks: [TaskRecord] = []
    /// Held (not just their identities) until `take`, so no new record can reuse an address.
    private var evictedRecords: [TaskRecord] = []
    private var workflows = OrderedObjects<WorkflowRecord>()
    private var queues: [String: TaskQueue] = [:]
    private var evictedTasks: [StoredTaskKey] = []
    private var evictedWorkflows: [TaskID] = []
    private var forgottenQueues: [String] = []
    private var messages: [CellMessage] = []
    private var schedules = OrderedObjects<ScheduleRecord>()
    private var deletedSchedules: [TaskID] = []

    public init() {}

    public var isEmpty: Bool {
        tasks.isEmpty && workflows.isEmpty && queues.isEmpty && evictedTasks.isEmpty && forgottenQueues.isEmpty && messages.isEmpty
            && schedules.isEmpty && deletedSchedules.isEmpty
    }

    public mutating func add(_ events: [EngineEvent]) {
        for event in events {
            switch event {
            case .submitted(let record), .stateChanged(let record, _, _), .progressed(let record), .cancelRequested(let record),
                 .leaseRenewed(let record), .releasedByRetry(let record), .watched(let record):
                if tasks.last !== record { tasks.append(record) }
            case .workflowSubmitted(let workflow):
                workflows.insert(workflow)
            case .queueChanged(let queue):
                queues[queue.name] = queue
                forgottenQueues.removeAll { $0 == queue.name }
            case .queueForgotten(let name):
                queues.removeValue(forKey: name)
                forgottenQueues.append(name)
            case .messageSent(let message):
                messages.append(message)
            case .scheduleChanged(let schedule):
                schedules.insert(schedule)
            case .scheduleDeleted(let schedule):
                schedules.remove(schedule)
                deletedSchedules.append(schedule.id)
            case .workflowReported:
                // `take` has it from the engine, with the workflows the reports left spent.
                break
            case .evicted(let record, let workflowEmptied):
                // `take` skips it if it also changed before the commit.
                evictedRecords.append(record)
                evictedTasks.append(StoredTaskKey(id: record.id, sequence: record.sequence))
                if workflowEmptied, let workflow = record.workflow {
                    workflows.remove(workflow)
                    evictedWorkflows.append(workflow.id)
                }
            }
        }
    }

    /// The changes gathered, snapshotted now; the collector starts afresh.
    public mutating func take(from engine: Engine) -> RecordChanges {
        var changes = RecordChanges()
        changes.tasks.reserveCapacity(tasks.count)
        // Evicted before the commit: only the deletion is written.
        var seen = Set<ObjectIdentifier>(minimumCapacity: tasks.count + evictedRecords.count)
        for record in evictedRecords { seen.insert(ObjectIdentifier(record)) }
        for record in tasks where seen.insert(ObjectIdentifier(record)).inserted {
            changes.tasks.append(engine.snapshot(of: record))
        }
        let reported = engine.takeReportedWorkflows()
        for workflow in reported.changed { workflows.insert(workflow) }
        if !reported.spent.isEmpty {
            let spent = Set(reported.spent)
            workflows.removeAll { spent.contains($0.id) }
            evictedWorkflows += reported.spent
        }
        changes.workflows = workflows.elements.map { engine.snapshot(of: $0) }
        changes.queues = queues.values.map { engine.snapshot(of: $0) }
        changes.evictedTasks = evictedTasks
        changes.evictedWorkflows = evictedWorkflows
        changes.forgottenQueues = forgottenQueues
        changes.messages = messages
        (changes.uniqueKeys, changes.droppedUniqueKeys) = engine.takeUniqueKeyChanges()
        changes.schedules = schedules.elements.map { engine.snapshot(of: $0) }
        changes.deletedSchedules = deletedSchedules
        self = ChangeCollector()
        return changes
    }
}

