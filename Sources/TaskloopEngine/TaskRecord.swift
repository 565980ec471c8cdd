import DequeModule
import TaskloopJSON

/// One task as the engine knows it. Clients read it; only the engine changes it.
///
/// Threading: engine thread only.
public final class TaskRecord {
    // Stored fields are laid out by hand (Swift keeps declaration order): the small ones fill
    // the padding after the 17-byte JSON values, and what few tasks carry or keep only for a
    // while lives in boxes (`rare`, `errorBox`, `progressBox`, `side`) behind one word
    // each. Benchmarks/engine: a record of a retained noop took 536 bytes with every field
    // inline, 296 so.
    public let id: TaskID
    /// Submission order, for FIFO among equal priorities.
    public let sequence: UInt64
    @usableFromInline let taskKind: TaskKind
    public let params: JSONValue
    public internal(set) var state: TaskState = .pending
    /// A running task whose cancellation is under way.
    public internal(set) var cancelRequested = false
    public let onDependencyFailure: DependencyFailurePolicy
    /// `priority`, within `SubmissionValidator.priorities`.
    @usableFromInline let storedPriority: Int32
    public let name: String?
    public let queue: TaskQueue
    /// Dependency ids, workflow keys resolved.
    public let dependencies: [TaskID]
    /// Wall-clock milliseconds.
    public let createdAt: Int64
    public let metadata: JSONValue?
    /// `attempt`: at most `SubmissionValidator.maxAttempts` plus one per explicit retry.
    @usableFromInline var storedAttempt: Int32 = 1
    public internal(set) var result: JSONValue?
    /// Dependencies that have not yet released this task.
    private var storedBlockingDependencies: Int32 = 0
    /// `startedAt` and `finishedAt`, `TaskRecord.unset` for nil.
    @usableFromInline var storedStartedAt = TaskRecord.unset
    @usableFromInline var storedFinishedAt = TaskRecord.unset
    /// The fields few tasks carry, boxed: the many without any pay one word for all
    /// (Benchmarks/engine: a retained noop task took 33 bytes more with the unique key and
    /// window inline, 7%; 17 with the box).
    let rare: RareTaskFields?
    public internal(set) var workflow: WorkflowRecord?
    /// `error`: only failed and cancelled tasks have one (a cancellation shares one box).
    @usableFromInline var errorBox: TaskErrorBox?
    /// `progress`, once an attempt reported any (see `progress`).
    @usableFromInline var progressBox: TaskProgressBox?
    /// What a task keeps for a while or rarely: its times and inputs, timers, a backoff, a
    /// non-default retry policy, dependencies that released it.
    @usableFromInline var side: SideFields?
    /// While a worker holds the running attempt (a queue dispatched to workers).
    public internal(set) var lease: Lease?
    /// Tasks waiting on this one; emptied once this task is terminal.
    var dependents: [TaskRecord] = []
    /// The attempt in progress; reports from any other run are ignored.
    var run: TaskRun?
    /// The engine's duplicate-dependency check marks records it has seen in one list.
    var duplicateStamp: UInt64 = 0
    /// Monotonic milliseconds at the terminal transition, for retention; before the clock's
    /// zero (negative) for a task restored from before a restart.
    var finishedAtMonotonic: Int64 = 0
    /// Entries of the engine's `retained` for this task that an explicit retry made stale
    /// (each retry of the terminal task leaves one, older than any it gets later).
    var staleRetentionEntries: UInt32 = 0
    /// How many times a retry (its own or a dependency's) brought it back: the epoch of the
    /// messages about it (Engine+Cells). Kept with the record; beside `staleRetentionEntries`, the two
    /// share one word.
    public internal(set) var reopenings: UInt32 = 0

    /// The stored form of a nil time: no wall clock reads it.
    @usableFromInline static let unset = Int64.min

    init(id: TaskID, sequence: UInt64, spec: TaskSpec, kind: TaskKind, queue: TaskQueue, dependencies: [TaskID],
         createdAt: Int64) {
        self.id = id
        self.sequence = sequence
        taskKind = kind
        params = spec.params
        onDependencyFailure = spec.onDependencyFailure
        storedPriority = Int32(truncatingIfNeeded: spec.priority)
        name = spec.name
        self.queue = queue
        self.dependencies = dependencies
        self.createdAt = createdAt
        metadata = spec.metadata
        rare = spec.uniqueKey == nil && spec.concurrencyKey == nil && spec.schedule == nil
            && spec.timeoutMilliseconds == nil ? nil
            : RareTaskFields(uniqueKey: spec.uniqueKey, uniqueForMilliseconds: spec.uniqueForMilliseconds,
                             concurrencyKey: spec.concurrencyKey, schedule: spec.schedule,
                             timeoutMilliseconds: spec.timeoutMilliseconds)
        if spec.runAt != nil || spec.expiry != nil {
            let side = sideFields()
            side.scheduledFor = spec.runAt?.instant(submittedAt: createdAt)
            side.expiresAt = spec.expiry?.instant(submittedAt: createdAt)
        }
        if spec.retry != RetryPolicy() { sideFields().retry = spec.retry }
    }

    @inlinable public var kind: String { taskKind.name }
    var executor: TaskExecutor { taskKind.executor }
    @inlinable public var priority: Int { Int(storedPriority) }

    /// Counts from 1; the attempt running now or last run.
    public internal(set) var attempt: Int {
        @inlinable get { Int(storedAttempt) }
        set { storedAttempt = Int32(truncatingIfNeeded: newValue) }
    }

    var blockingDependencies: Int {
        get { Int(storedBlockingDependencies) }
        set { storedBlockingDependencies = Int32(truncatingIfNeeded: newValue) }
    }

    public internal(set) var startedAt: Int64? {
        @inlinable get { storedStartedAt == Self.unset ? nil : storedStartedAt }
        set { storedStartedAt = newValue ?? Self.unset }
    }

    public internal(set) var finishedAt: Int64? {
        @inlinable get { storedFinishedAt == Self.unset ? nil : storedFinishedAt }
        set { storedFinishedAt = newValue ?? Self.unset }
    }

    public var timeoutMilliseconds: UInt64? { rare?.timeoutMilliseconds }

    /// An explicit retry raises `maxAttempts` to allow its new attempt.
    public internal(set) var retry: RetryPolicy {
        @inlinable get { side?.retry ?? RetryPolicy() }
        set { if side != nil || newValue != RetryPolicy() { sideFields().retry = newValue } }
    }

    public internal(set) var error: TaskError? {
        @inlinable get { errorBox?.error }
        set {
            guard let newValue else { return errorBox = nil }
            errorBox = newValue == .cancelled ? TaskErrorBox.cancelled : TaskErrorBox(newValue)
        }
    }

    /// A task that succeeded without a box reports done as it finished, which is what success
    /// sets (`succeeded(at:)`): every succeeded noop would otherwise keep a box for it.
    public internal(set) var progress: TaskProgress {
        @inlinable get { progressBox?.progress ?? implicitProgress }
        set {
            if let progressBox { return progressBox.progress = newValue }
            if newValue != implicitProgress { progressBox = TaskProgressBox(newValue) }
        }
    }

    @usableFromInline var implicitProgress: TaskProgress {
        state == .succeeded ? TaskProgress(fraction: 1, updatedAt: finishedAt) : TaskProgress()
    }

    /// The progress of an attempt that succeeded at `now`, before it finishes: done, then.
    func progressSucceeded(at now: Int64) {
        guard let progressBox else { return }
        progressBox.progress.fraction = 1
        progressBox.progress.updatedAt = now
    }

    /// Wall-clock milliseconds before which a task waiting out a retry's backoff does not run.
    public internal(set) var notBefore: Int64? {
        get { side?.notBefore }
        set { if side != nil || newValue != nil { sideFields().notBefore = newValue } }
    }

    /// Dependencies that released this task and were then brought back by an explicit retry:
    /// they no longer hold it up. With the rest of the record it says which dependencies a
    /// task waits on, so a replica can rebuild the waits from records alone. With cells, also
    /// every dependency in another cell that released it (whose end a restart cannot see).
    public internal(set) var releasedBy: [TaskID] {
        get { side?.releasedBy ?? [] }
        set { if side != nil || !newValue.isEmpty { sideFields().releasedBy = newValue } }
    }

    /// Timeout while running, backoff while waiting to retry.
    var attemptTimer: ScheduledAction? {
        get { side?.attemptTimer }
        set { if side != nil || newValue != nil { sideFields().attemptTimer = newValue } }
    }

    /// Ends a cancellation the executor does not confirm.
    var graceTimer: ScheduledAction? {
        get { side?.graceTimer }
        set { if side != nil || newValue != nil { sideFields().graceTimer = newValue } }
    }

    private func sideFields() -> SideFields {
        if let side { return side }
        let made = SideFields()
        side = made
        return made
    }

    public var maxAttempts: Int { retry.maxAttempts }

    /// Wall-clock milliseconds of its `run_at` (or `delay_ms` after submission), if given: it
    /// waits `scheduled` until then.
    public var scheduledFor: Int64? { side?.scheduledFor }

    /// Wall-clock milliseconds of its expiry, if given: not started by then, it is cancelled.
    /// A retry after it clears it.
    public internal(set) var expiresAt: Int64? {
        get { side?.expiresAt }
        set { if side != nil || newValue != nil { sideFields().expiresAt = newValue } }
    }

    /// What its output references point at, taken from each dependency as it released the
    /// task (Engine+Outputs).
    public internal(set) var inputs: [TaskInput] {
        get { side?.inputs ?? [] }
        set { if side != nil || !newValue.isEmpty { sideFields().inputs = newValue } }
    }

    /// `params` with their references resolved, from the start of an attempt until a retry
    /// brings the task back; nil when they hold none.
    public internal(set) var resolvedParams: JSONValue? {
        get { side?.resolvedParams }
        set { if side != nil || newValue != nil { sideFields().resolvedParams = newValue } }
    }

    /// Whether the task may carry any of the fields few do: a unique key, a concurrency key, a
    /// schedule's mark (or a timeout, boxed with them). Without them, each of those reads nil.
    public var hasRareFields: Bool { rare != nil }
    /// See `TaskSpec.uniqueKey`; the window is the submission's, kept to show it.
    public var uniqueKey: String? { rare?.uniqueKey }
    public var uniqueForMilliseconds: UInt64? { rare?.uniqueForMilliseconds }
    /// See `TaskSpec.concurrencyKey`.
    public var concurrencyKey: String? { rare?.concurrencyKey }
    /// The schedule run this task belongs to, if a schedule made it (Engine+Schedules).
    public var schedule: ScheduleSlot? { rare?.schedule }
}

/// What few tasks carry (`TaskRecord.rare`).
final class RareTaskFields {
    let uniqueKey: String?
    let uniqueForMilliseconds: UInt64?
    let concurrencyKey: String?
    let schedule: ScheduleSlot?
    let timeoutMilliseconds: UInt64?

    init(uniqueKey: String?, uniqueForMilliseconds: UInt64?, concurrencyKey: String?, schedule: ScheduleSlot?,
         timeoutMilliseconds: UInt64?) {
        self.uniqueKey = uniqueKey
        self.uniqueForMilliseconds = uniqueForMilliseconds
        self.concurrencyKey = concurrencyKey
        self.schedule = schedule
        self.timeoutMilliseconds = timeoutMilliseconds
    }
}

/// A task's mutable fields that most tasks never set or hold only for a while
/// (`TaskRecord.side`); made on the first one set, kept after. Its times and inputs had a box
/// of their own before (inline, those four took ~100 bytes of every retained task).
///
/// Threading: engine thread only, as its record.
@usableFromInline
final class SideFields {
    /// Wall-clock milliseconds, set at submission.
    var scheduledFor: Int64?
    var expiresAt: Int64?
    var inputs: [TaskInput] = []
    var resolvedParams: JSONValue?
    /// Nil: the default policy.
    @usableFromInline var retry: RetryPolicy?
    var notBefore: Int64?
    var releasedBy: [TaskID] = []
    var attemptTimer: ScheduledAction?
    var graceTimer: ScheduledAction?
}

/// `TaskRecord.error`, boxed: a task without one pays a word, not the 40 bytes of a `TaskError?`.
@usableFromInline
final class TaskErrorBox: Sendable {
    @usableFromInline let error: TaskError

    init(_ error: TaskError) {
        self.error = error
    }

    /// Every plain cancellation shares it.
    static let cancelled = TaskErrorBox(.cancelled)
}

/// `TaskRecord.progress`, boxed, as its error is.
///
/// Threading: engine thread only, as its record.
@usableFromInline
final class TaskProgressBox {
    @usableFromInline var progress: TaskProgress

    init(_ progress: TaskProgress) {
        self.progress = progress
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
