import DequeModule
import TaskloopJSON

/// One task as the engine knows it. Clients read it; only the engine changes it.
///
/// Threading: engine thread only.
public final class TaskRecord {
    public let id: TaskID
    /// Submission order, for FIFO among equal priorities.
    public let sequence: UInt64
    public let kind: String
    let executor: TaskExecutor
    public let params: JSONValue
    public let name: String?
    public let queue: TaskQueue
    public let priority: Int
    /// Dependency ids, workflow keys resolved.
    public let dependencies: [TaskID]
    public let onDependencyFailure: DependencyFailurePolicy
    public let timeoutMilliseconds: UInt64?
    /// An explicit retry raises `maxAttempts` to allow its new attempt.
    public internal(set) var retry: RetryPolicy
    public let metadata: JSONValue?
    /// The fields few tasks carry, boxed: the many without any pay one word for all
    /// (Benchmarks/engine: a retained noop task took 33 bytes more with the unique key and
    /// window inline, 7%; 17 with the box).
    let rare: RareTaskFields?
    public internal(set) var workflow: WorkflowRecord?
    /// Wall-clock milliseconds.
    public let createdAt: Int64
    /// Its times and inputs, boxed as `rare` is: most tasks have none.
    private var flow: FlowFields?

    public internal(set) var state: TaskState = .pending
    /// A running task whose cancellation is under way.
    public internal(set) var cancelRequested = false
    /// Counts from 1; the attempt running now or last run.
    public internal(set) var attempt = 1
    public internal(set) var startedAt: Int64?
    public internal(set) var finishedAt: Int64?
    public internal(set) var result: JSONValue?
    public internal(set) var error: TaskError?
    public internal(set) var progress = TaskProgress()
    /// Wall-clock milliseconds before which a task waiting out a retry's backoff does not run.
    public internal(set) var notBefore: Int64?
    /// While a worker holds the running attempt (a queue dispatched to workers).
    public internal(set) var lease: Lease?
    /// Dependencies that released this task and were then brought back by an explicit retry:
    /// they no longer hold it up. With the rest of the record it says which dependencies a
    /// task waits on, so a replica can rebuild the waits from records alone. With cells, also
    /// every dependency in another cell that released it (whose end a restart cannot see).
    public internal(set) var releasedBy: [TaskID] = []

    /// Dependencies that have not yet released this task.
    var blockingDependencies = 0
    /// Tasks waiting on this one; emptied once this task is terminal.
    var dependents: [TaskRecord] = []
    /// The attempt in progress; reports from any other run are ignored.
    var run: TaskRun?
    /// Timeout while running, backoff while waiting to retry.
    var attemptTimer: ScheduledAction?
    /// Ends a cancellation the executor does not confirm.
    var graceTimer: ScheduledAction?
    /// The engine's duplicate-dependency check marks records it has seen in one list.
    var duplicateStamp: UInt64 = 0
    /// Monotonic milliseconds at the terminal transition, for retention; before the clock's
    /// zero (negative) for a task restored from before a restart.
    var finishedAtMonotonic: Int64 = 0
    /// Moves on when an explicit retry brings the task back, so its old retention entry is known stale.
    var retentionEpoch: UInt32 = 0
    /// How many times a retry (its own or a dependency's) brought it back: the epoch of the
    /// messages about it (Engine+Cells). Kept with the record; beside `retentionEpoch`, the two
    /// share one word.
    public internal(set) var reopenings: UInt32 = 0

    init(id: TaskID, sequence: UInt64, spec: TaskSpec, executor: TaskExecutor, queue: TaskQueue, dependencies: [TaskID],
         createdAt: Int64) {
        self.id = id
        self.sequence = sequence
        kind = spec.kind
        self.executor = executor
        params = spec.params
        name = spec.name
        self.queue = queue
        priority = spec.priority
        self.dependencies = dependencies
        onDependencyFailure = spec.onDependencyFailure
        timeoutMilliseconds = spec.timeoutMilliseconds
        retry = spec.retry
        metadata = spec.metadata
        rare = spec.uniqueKey == nil && spec.concurrencyKey == nil && spec.schedule == nil ? nil
            : RareTaskFields(uniqueKey: spec.uniqueKey, uniqueForMilliseconds: spec.uniqueForMilliseconds,
                             concurrencyKey: spec.concurrencyKey, schedule: spec.schedule)
        self.createdAt = createdAt
        if spec.runAt != nil || spec.expiry != nil {
            flow = FlowFields(scheduledFor: spec.runAt?.instant(submittedAt: createdAt),
                              expiresAt: spec.expiry?.instant(submittedAt: createdAt))
        }
    }

    public var maxAttempts: Int { retry.maxAttempts }

    /// Wall-clock milliseconds of its `run_at` (or `delay_ms` after submission), if given: it
    /// waits `scheduled` until then.
    public var scheduledFor: Int64? { flow?.scheduledFor }

    /// Wall-clock milliseconds of its expiry, if given: not started by then, it is cancelled.
    /// A retry after it clears it.
    public internal(set) var expiresAt: Int64? {
        get { flow?.expiresAt }
        set { if flow != nil || newValue != nil { flowFields().expiresAt = newValue } }
    }

    /// What its output references point at, taken from each dependency as it released the
    /// task (Engine+Outputs).
    public internal(set) var inputs: [TaskInput] {
        get { flow?.inputs ?? [] }
        set { if flow != nil || !newValue.isEmpty { flowFields().inputs = newValue } }
    }

    /// `params` with their references resolved, from the start of an attempt until a retry
    /// brings the task back; nil when they hold none.
    public internal(set) var resolvedParams: JSONValue? {
        get { flow?.resolvedParams }
        set { if flow != nil || newValue != nil { flowFields().resolvedParams = newValue } }
    }

    private func flowFields() -> FlowFields {
        if let flow { return flow }
        let made = FlowFields(scheduledFor: nil, expiresAt: nil)
        flow = made
        return made
    }

    /// Whether the task carries any of the fields few do: a unique key, a concurrency key, a
    /// schedule's mark. Without them, each of those reads nil.
    public var hasRareFields: Bool { rare != nil }
    /// See `TaskSpec.uniqueKey`; the window is the submission's, kept to show it.
    public var uniqueKey: String? { rare?.uniqueKey }
    public var uniqueForMilliseconds: UInt64? { rare?.uniqueForMilliseconds }
    /// See `TaskSpec.concurrencyKey`.
    public var concurrencyKey: String? { rare?.concurrencyKey }
    /// The schedule run this task belongs to, if a schedule made it (Engine+Schedules).
    public var schedule: ScheduleSlot? { rare?.schedule }
}

/// A task's times and its inputs from its dependencies (`TaskRecord.flow`), which most tasks
/// have none of: inline, the four took ~100 bytes of every retained task (the service
/// benchmark's RSS with 100,000 retained went 130.8 to 140.4 MB with them).
///
/// Threading: engine thread only, as its record.
final class FlowFields {
    let scheduledFor: Int64?
    var expiresAt: Int64?
    var inputs: [TaskInput] = []
    var resolvedParams: JSONValue?

    init(scheduledFor: Int64?, expiresAt: Int64?) {
        self.scheduledFor = scheduledFor
        self.expiresAt = expiresAt
    }
}

/// What few tasks carry (`TaskRecord.rare`).
final class RareTaskFields {
    let uniqueKey: String?
    let uniqueForMilliseconds: UInt64?
    let concurrencyKey: String?
    let schedule: ScheduleSlot?

    init(uniqueKey: String?, uniqueForMilliseconds: UInt64?, concurrencyKey: String?, schedule: ScheduleSlot?) {
        self.uniqueKey = uniqueKey
        self.uniqueForMilliseconds = uniqueForMilliseconds
        self.concurrencyKey = concurrencyKey
        self.schedule = schedule
    }
}

/// A named lane with its own concurrency limit and pause switch.
///
/// Threading: engine thread only.
public final class TaskQueue {
    public let name: String
    public internal(set) var maxConcurrency: Int
    public internal(set) var paused = false
    /// Who starts its tasks: the server's executors, or workers that lease them.
    public internal(set) var dispatch = QueueDispatch.server
    /// Running tasks per `concurrency_key` at most; nil: no cap.
    public private(set) var keyConcurrency: Int?
    /// Tasks of this queue by state (evicted tasks no longer count).
    public private(set) var counts = StateCounts()

    /// Queued tasks, best first. Entries for tasks that left `queued` meanwhile are skipped
    /// when they surface (lazy deletion), so cancelling a queued task is O(1).
    var ready = ReadyHeap()
    /// Instead of `ready` while workers lease the queue's tasks.
    var readyForWorkers = ReadyByKind()
    /// Instead of both once the queue has held a task with a `concurrency_key` (fair share).
    var lanes: KeyLanes?
    var running: Int { counts[.running] }
    /// Set while the queue waits in the engine's dispatch list.
    var needsDispatch = false
    /// Lease calls held until a task can be leased, in arrival order (withdrawn ones are
    /// skipped when they surface).
    var lessees = Deque<LeaseRequest>()
    /// Lease calls waiting now.
    public internal(set) var waitingLessees = 0
    public internal(set) var leaseCounts = LeaseCounts()
    /// Tasks finished per interval over the last minutes.
    public internal(set) var finishHistory = FinishHistory()
    /// Set while the queue is rate-limited (Engine+RateLimits).
    var rateBucket: TokenBucket?
    public var rateLimit: RateLimit? { rateBucket?.limit }
    /// Starts and leases since the start that waited for a token (Engine+RateLimits).
    public internal(set) var delayedByRateLimit = 0

    init(name: String, maxConcurrency: Int) {
        self.name = name
        self.maxConcurrency = maxConcurrency
    }

    func count(_ state: TaskState, _ delta: Int) { counts[state] += delta }

    /// Files a task that became `queued` where its dispatch looks for it.
    func enqueue(_ record: TaskRecord) {
        if lanes != nil || record.rare?.concurrencyKey != nil { return makeLanes().insert(record) }
        if dispatch == .server { ready.insert(record) } else { readyForWorkers.insert(record) }
    }

    /// The best queued task a worker asking for `kinds` may lease (any kind when nil), removed.
    /// The next task the server's executors start: by lanes once the queue has them.
    func popForServer() -> TaskRecord? {
        if let lanes { return lanes.popNext(of: nil) }
        return ready.popBest()
    }

    func popForWorkers(of kinds: Set<String>?) -> TaskRecord? {
        if let lanes { return lanes.popNext(of: kinds) }
        return readyForWorkers.popBest(of: kinds)
    }

    /// Moves the queued tasks to where the new dispatch looks for them (lanes serve both).
    func switchDispatch(to new: QueueDispatch) {
        guard new != dispatch else { return }
        dispatch = new
        guard lanes == nil else { return }
        let moving = new == .workers ? ready.removeAll() : readyForWorkers.removeAll()
        for record in moving { enqueue(record) }
    }

    /// The queue's lanes, made on its first keyed task with the tasks queued so far in the
    /// lane without a key (they keep their order).
    func makeLanes() -> KeyLanes {
        if let lanes { return lanes }
        let made = KeyLanes(cap: keyConcurrency)
        for record in ready.removeAll() + readyForWorkers.removeAll() { made.insert(record) }
        lanes = made
        return made
    }

    /// Changes the cap per key; lanes it frees rejoin the rotation (the caller dispatches).
    func setKeyConcurrency(_ cap: Int?) {
        keyConcurrency = cap
        lanes?.setCap(cap)
    }

    /// After a restart: `record`, restored `running`, counts against its key.
    func restoreRunning(_ record: TaskRecord) {
        makeLanes().started(record)
    }
}

/// Counts indexed by state.
public struct StateCounts: Sendable, Equatable {
    public private(set) var scheduled = 0, pending = 0, queued = 0, running = 0, succeeded = 0, failed = 0, cancelled = 0

    public init() {}

    public subscript(state: TaskState) -> Int {
        get {
            switch state {
            case .scheduled: scheduled
            case .pending: pending
            case .queued: queued
            case .running: running
            case .succeeded: succeeded
            case .failed: failed
            case .cancelled: cancelled
            }
        }
        set {
            switch state {
            case .scheduled: scheduled = newValue
            case .pending: pending = newValue
            case .queued: queued = newValue
            case .running: running = newValue
            case .succeeded: succeeded = newValue
            case .failed: failed = newValue
            case .cancelled: cancelled = newValue
            }
        }
    }

    public var unfinished: Int { scheduled + pending + queued + running }
    public var total: Int { unfinished + succeeded + failed + cancelled }
}
