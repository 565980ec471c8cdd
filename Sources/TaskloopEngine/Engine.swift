import DequeModule
import TaskloopBytes
import TaskloopJSON
import TaskloopTime

public struct EngineConfiguration: Sendable {
    /// `max_concurrency` of queues created on first use.
    public var defaultConcurrency = 2
    /// Submissions that would make more tasks unfinished than this are refused.
    public var maxUnfinishedTasks = 100_000
    /// Terminal tasks are forgotten this long after they finish...
    public var retentionMilliseconds: UInt64 = 3_600_000
    /// ...or sooner, oldest first, beyond this many.
    public var maxRetainedTasks = 100_000
    /// A running task whose executor does not confirm a cancellation within this (or within
    /// its attempt's own `TaskRun.stopGraceMilliseconds`) is finished as cancelled anyway; its
    /// late reports are ignored.
    public var cancelGraceMilliseconds: UInt64 = 10_000
    /// Most queues known at once. Any name creates a queue, so without a bound a client could
    /// grow memory and metric series without end; a queue that holds no task and has default
    /// settings is forgotten when it comes to that (or when its last task is evicted).
    public var maxQueues = 1_000
    /// Work starts only after the commit that started it: an attempt whose start has effects
    /// (`TaskExecutor.startHasEffects`) is made (`running`, its timers armed), but its executor
    /// is called once the journal says the change is durable (`Engine+HeldStarts`). Without it
    /// a commit that fails leaves a program running for a task the store holds as `queued`.
    public var startsAfterCommit = false
    /// With cells (docs/SCALING.md): the one cell this engine holds. Nil for a server on its own.
    public var cells: CellPlacement?
    /// The longest the engine sleeps while a wall-clock deadline (`run_at`, an expiry) waits:
    /// a wall clock set forward is noticed within this.
    public var wallClockCheckMilliseconds: UInt64 = 1_000
    /// How far ahead `run_at`, `delay_ms`, `expires_at` and `ttl_ms` may reach.
    public var maxScheduleAheadMilliseconds: UInt64 = 366 * 86_400_000
    /// Params' output references are checked at submission and resolved at start
    /// (Engine+Outputs). Off for a worker's engine: what it runs was resolved by the server.
    public var resolvesOutputs = true
    /// The most bytes a task's params may take once resolved: as a request body may, so that
    /// a client or worker can read the task back.
    public var maxResolvedParamsBytes = 1 << 20
    /// The longest `unique_for_ms` a submission may ask for, and so how long a finished task
    /// with a unique key is remembered after retention forgets it (Engine+Unique).
    public var maxUniqueForMilliseconds: UInt64 = 86_400_000
    /// Most such tombstones kept; past it the oldest go before their time.
    public var maxForgottenUniqueKeys = 100_000
    /// Most schedules held at once (Engine+Schedules).
    public var maxSchedules = 10_000
    /// Where the engine finds a schedule's zone, already loaded: it never reads tzdata itself
    /// (a file read would block its thread). Whoever hands it a schedule loads the zone first,
    /// off the loop (Engine+Schedules).
    public var zones: TimeZoneCatalog = .system

    public init() {}
}

/// The cell an engine holds, and where every queue is: the engine holds the tasks of its own
/// queues only, and reaches dependencies in other cells through `CellMessage`s.
public struct CellPlacement: Sendable {
    public var cell: UInt16
    public var cellOfQueue: @Sendable (String) -> UInt16

    public init(cell: UInt16, cellOfQueue: @escaping @Sendable (String) -> UInt16) {
        self.cell = cell
        self.cellOfQueue = cellOfQueue
    }
}

/// What happened, for observers (long polls, metrics, logs, event streams, the store). Events
/// reach observers in settled batches (see `Engine.addObserver`); a record may have moved on
/// since the event, so a state change names both of its states.
public enum EngineEvent {
    /// A task was created (in `pending`; where it went from there follows as state changes).
    case submitted(TaskRecord)
    case stateChanged(TaskRecord, from: TaskState, to: TaskState)
    case progressed(TaskRecord)
    case cancelRequested(TaskRecord)
    /// A workflow was created; its tasks are submitted in the same batch.
    case workflowSubmitted(WorkflowRecord)
    /// A queue's settings changed.
    case queueChanged(TaskQueue)
    /// A queue with default settings and no tasks was forgotten.
    case queueForgotten(String)
    /// Retention forgot a terminal task; `workflowEmptied` when it was its workflow's last.
    case evicted(TaskRecord, workflowEmptied: Bool)
    /// A worker's heartbeat moved its lease's expiry.
    case leaseRenewed(TaskRecord)
    /// A task no longer waits on a dependency that had released it and was retried, or that
    /// ended in another cell (`TaskRecord.releasedBy`), or took its inputs from a dependency's
    /// end (`TaskRecord.inputs`); its state did not change.
    case releasedByRetry(TaskRecord)
    /// A message for another cell, to be committed with the rest of its batch (Engine+Cells).
    /// Indirect: a message is many words, and inline it made every event as large, which
    /// each copy of an event (several per submission) paid for.
    indirect case messageSent(CellMessage)
    /// A task gained a watcher: a cell with tasks depending on it (`Engine.watchers(of:)`).
    case watched(TaskRecord)
    /// A member in another cell reported an end, a retry or progress to its workflow's home
    /// (Engine+CellWorkflows): the workflow changed, and no task of this cell did. `spent`:
    /// the report left it nothing to keep, and the engine forgot it.
    case workflowReported(WorkflowRecord, spent: Bool)
    /// A schedule was made or changed: its settings, or by firing (`lastSlot`, its runs).
    case scheduleChanged(ScheduleRecord)
    /// A schedule was deleted.
    case scheduleDeleted(ScheduleRecord)
}

/// A reference to the engine that `deinit` clears, for timers and attempts that may outlive it.
/// Not `weak`: one weak reference gives the engine a side table, and every retain of it then
/// takes the slow path (measured: ~5% of the engine benchmark).
final class EngineLink {
    unowned(unsafe) var engine: Engine?
}

public enum CancelOutcome: Equatable, Sendable {
    /// The task is now `cancelled`.
    case cancelled
    /// The task is running; its work has been asked to stop (`cancel_requested`).
    case cancelRequested
}

/// The operation queue: tasks, their dependency graph, named queues with priorities and
/// concurrency limits, cancellation, progress, timeouts, retries and retention.
///
/// Threading: one thread owns the engine and everything it hands out (records, runs, queues):
/// the thread that drives its `EngineScheduler`. No locks. Every state change goes through
/// `transition`, which keeps the counts and records an event.
///
/// Every way in (a public call, a timer, an executor's report) runs inside `settling`: its
/// events are held until it has finished and then published as one batch, so an observer never
/// sees (or re-enters) an engine in the middle of a change, and a durable store gets one
/// settled batch per call.
///
/// This file holds the state, observers, dispatch and the one path of state changes; the rest
/// is by concern: `Engine+Submission`, `+Workflows`, `+Reports`, `+Cancellation`, `+Queues`,
/// `+Retention`, `+Queries`, `+Invariants`, `+Unique`, and the field rules in `SubmissionValidator`.
public final class Engine {
    public let configuration: EngineConfiguration
    public let scheduler: EngineScheduler
    var executors: [String: TaskExecutor]
    var tasks = TaskTable()
    public internal(set) var queues: [String: TaskQueue] = [:]
    var workflows: [TaskID: WorkflowRecord] = [:]
    var ids = TaskIDGenerator()
    var sequence: UInt64 = 0
    public internal(set) var unfinishedCount = 0
    /// Terminal tasks in the order they finished, for retention.
    var retained = Deque<TaskRecord>()
    /// Entries of `retained` whose task a retry brought back.
    var staleRetained = 0
    var retentionTimer: ScheduledAction?
    /// Wall-clock deadlines (Engine+WallTime) and the one timer that wakes the engine for them.
    var wallTimers = WallClockTimers()
    var wallTimer: ScheduledAction?
    var wallTimerFiresAt: UInt64 = 0
    var queuesToDispatch: [TaskQueue] = []
    var dispatching = false
    /// Set by `suspendForShutdown`: nothing starts any more.
    var halted = false
    var observers: [([EngineEvent]) -> Void] = []
    /// Events of the call in progress, published when the outermost call has finished.
    var unpublished: [EngineEvent] = []
    var spareBatch: [EngineEvent] = []
    var callDepth = 0
    var publishing = false
    /// Submissions come in runs of one kind and one queue: one-entry caches spare hashing the
    /// names (a small string compares in one step).
    var lastKind: TaskKind?
    /// `executors` as the records point at them.
    let taskKinds: [String: TaskKind]
    var lastQueue: TaskQueue?
    /// Finds repeated dependencies without hashing: each dependency list gets a fresh stamp,
    /// and a record already carrying it was listed before.
    var duplicateStamp: UInt64 = 0
    /// Leases made in the call in progress, answered once its events are published (a store
    /// then holds them, so an answer can wait for them to be durable).
    var grants: [(request: LeaseRequest, tasks: [TaskRecord])] = []
    /// Tasks under lease now, in every queue.
    public internal(set) var leasedCount = 0
    var leaseTokens = RandomBytes()
    /// Attempts made but not yet started, in order (`startsAfterCommit`), and how many were
    /// ever held and taken off the front: a journal's mark counts them.
    var heldStarts = Deque<TaskRun>()
    var startsHeld: UInt64 = 0
    var startsTaken: UInt64 = 0
    /// The cell this engine holds, or nil (`EngineConfiguration.cells`).
    public let cell: UInt16?
    /// Stand-ins for the dependencies in other cells that tasks here name (Engine+Cells).
    var remoteDependencies: [TaskID: RemoteDependency] = [:]
    /// The cells whose tasks depend on each task that has any (Engine+Cells). Beside the records,
    /// not in them: a server on its own pays nothing for it.
    var watchersByTask: [TaskID: [UInt16]] = [:]
    /// Members of workflows whose home is another cell, by workflow, in creation order
    /// (Engine+CellWorkflows); and the workflow of each, by member.
    var hostedMembers: [TaskID: [TaskRecord]] = [:]
    var workflowOfMember: [TaskID: TaskID] = [:]
    /// Workflows that members' reports changed, and those they left with nothing to keep,
    /// since a store last took them (`takeReportedWorkflows`).
    var reportedWorkflows: [WorkflowRecord] = []
    var spentWorkflows: [TaskID] = []
    /// The remote dependencies of the list being checked, for its duplicate check.
    var claimedRemote: (stamp: UInt64, ids: [TaskID]) = (0, [])
    /// Which task holds each unique key of each queue (Engine+Unique).
    var uniqueKeys = UniqueKeyIndex()
    /// Schedules by id (Engine+Schedules), and what their runs came to.
    var schedules: [TaskID: ScheduleRecord] = [:]
    public internal(set) var scheduleTotals = ScheduleTotals()

    /// How scheduled actions and attempts reach the engine once it may be gone.
    let link = EngineLink()

    public init(configuration: EngineConfiguration, scheduler: EngineScheduler, executors: [String: TaskExecutor]) {
        self.configuration = configuration
        self.scheduler = scheduler
        self.executors = executors
        taskKinds = executors.reduce(into: [:]) { kinds, entry in kinds[entry.key] = TaskKind(name: entry.key, executor: entry.value) }
        cell = configuration.cells?.cell
        if let cells = configuration.cells { ids = TaskIDGenerator(cell: cells.cell) }
        if configuration.cells.map({ $0.cellOfQueue("default") == $0.cell }) ?? true { _ = queue(named: "default") }
        link.engine = self
    }

    deinit {
        link.engine = nil
    }

    /// The kinds every engine runs, whatever executors it is given besides.
    public static let builtInKinds = ["external", "noop", "sleep"]

    /// The engine with the built-in kinds (`noop`, `sleep`, `external`) plus `extra`.
    public convenience init(
        configuration: EngineConfiguration, scheduler: EngineScheduler, extraExecutors: [String: TaskExecutor] = [:]
    ) {
        var executors: [String: TaskExecutor] = [
            "noop": NoopExecutor(), "sleep": SleepExecutor(scheduler: scheduler),
            "external": ExternalExecutor(scheduler: scheduler),
        ]
        executors.merge(extraExecutors) { $1 }
        self.init(configuration: configuration, scheduler: scheduler, executors: executors)
    }

    public var kinds: [String] { executors.keys.sorted() }

    // MARK: observers and settled batches

    /// Calls `observer` with the events of each settled call, in the order they happened. The
    /// engine's state is whole when it runs; it may call the engine again, and what that call
    /// changes follows as a batch of its own.
    public func addObserver(_ observer: @escaping (_ settled: [EngineEvent]) -> Void) {
        observers.append(observer)
    }

    func emit(_ event: EngineEvent) {
        unpublished.append(event)
    }

    /// Runs one way into the engine; once the outermost one has finished, its events go out.
    @inline(__always)
    func settling<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        callDepth += 1
        defer {
            callDepth -= 1
            if callDepth == 0 && !unpublished.isEmpty {
                publish()
                if !grants.isEmpty { deliverGrants() }
            }
        }
        return try body()
    }

    /// Runs `body` as one settled call: what the engine calls made in it change goes to the
    /// observers as one batch once it returns, not one batch per call. A batch request's items
    /// are many calls of one request; observed one by one, each paid the observers' whole
    /// round (the event log's numbering and publishing, the journal) for a task or two.
    public func settlingTogether<Result>(_ body: () -> Result) -> Result {
        settling(body)
    }

    func publish() {
        // A call made by an observer publishes through the loop already running here, after the
        // rest of the batch in hand, so observers see events in the order they happened.
        guard !publishing else { return }
        publishing = true
        defer { publishing = false }
        while !unpublished.isEmpty {
            var batch = spareBatch
            swap(&batch, &unpublished)
            for observer in observers { observer(batch) }
            batch.removeAll(keepingCapacity: true)
            spareBatch = batch
        }
    }

    // MARK: scheduling

    func makeReady(_ record: TaskRecord) {
        transition(record, to: .queued)
        record.queue.enqueue(record)
        needsDispatch(record.queue)
    }

    func needsDispatch(_ queue: TaskQueue) {
        guard !queue.needsDispatch else { return }
        queue.needsDispatch = true
        queuesToDispatch.append(queue)
    }

    /// Starts queued tasks while their queues have room. Executors may finish synchronously;
    /// that only adds queues to the list, so even a 10,000-task chain of `noop`s runs in this
    /// loop without recursion.
    func dispatch() {
        guard !dispatching, !halted else { return }
        dispatching = true
        defer { dispatching = false }
        while let queue = queuesToDispatch.popLast() {
            queue.needsDispatch = false
            guard queue.dispatch == .server else {
                serveLessees(queue)
                continue
            }
            if let bucket = queue.rateBucket {
                startRateLimited(queue, bucket)
                continue
            }
            if let lanes = queue.lanes {
                while !queue.paused && queue.running < queue.maxConcurrency, let record = lanes.popNext(of: nil) {
                    start(record)
                }
                continue
            }
            while !queue.paused && queue.running < queue.maxConcurrency, let record = queue.ready.popBest() {
                start(record)
            }
        }
    }

    /// Starts an attempt of `record`; false when it expired or lacked its inputs instead.
    @discardableResult
    func start(_ record: TaskRecord) -> Bool {
        guard !expiresInsteadOfStarting(record), resolveInputs(of: record) else { return false }
        transition(record, to: .running)
        if record.startedAt == nil { record.startedAt = scheduler.wallClock }
        let hadFraction = record.progress.fraction != nil
        record.progress = TaskProgress()
        // A new attempt starts from nothing: the workflow's home must not count the old fraction.
        if hadFraction && cell != nil { reportToHome(record) }
        let run = TaskRun(link: link, record: record)
        record.run = run
        if let timeout = record.timeoutMilliseconds { armTimeout(timeout, for: run, on: record, after: timeout) }
        if let lease = record.lease {
            // The worker runs it; the engine keeps the lease's clock.
            run.stopGraceMilliseconds = lease.milliseconds
            armExpiry(of: lease, on: record)
        } else if configuration.startsAfterCommit && record.executor.startHasEffects {
            hold(run)
        } else {
            record.executor.start(run)
        }
        return true
    }

    /// Ends attempt `run` with `timeout` after `delay`.
    func armTimeout(_ timeout: UInt64, for run: TaskRun, on record: TaskRecord, after delay: UInt64) {
        record.attemptTimer = scheduler.schedule(after: delay) { [link, weak run] in
            guard let engine = link.engine, let run, run.isCurrent else { return }
            engine.settling {
                // Fail first, then stop: an executor may confirm the stop from inside the
                // request, and that confirmation would otherwise settle the task as cancelled.
                engine.attemptFailed(run, error: .timeout(after: timeout))
                run.requestStop()
            }
        }
    }

    /// Ends what the current attempt holds: its timers, and its work (asked to stop; a later
    /// report from it is ignored).
    func dropAttempt(of record: TaskRecord) {
        record.attemptTimer?.cancel()
        record.attemptTimer = nil
        record.graceTimer?.cancel()
        record.graceTimer = nil
        if let run = record.run {
            record.run = nil
            run.requestStop()
        }
    }

    // MARK: the one place states change

    func transition(_ record: TaskRecord, to state: TaskState) {
        let from = record.state
        guard from != state else { return }
        precondition(!from.isTerminal, "terminal state \(from) of \(record.id) cannot change")
        record.queue.count(from, -1)
        record.queue.count(state, 1)
        if let workflow = record.workflow {
            workflow.counts[from] -= 1
            workflow.counts[state] += 1
        }
        record.state = state
        if let lanes = record.queue.lanes { countRunningOfKey(record, from: from, to: state, in: lanes) }
        emit(.stateChanged(record, from: from, to: state))
    }

    /// Fair share: a keyed task's start or end of running counts for its key; an end may put
    /// its lane back in turn.
    func countRunningOfKey(_ record: TaskRecord, from: TaskState, to state: TaskState, in lanes: KeyLanes) {
        if state == .running {
            lanes.started(record)
        } else if from == .running && lanes.stopped(record) {
            needsDispatch(record.queue)
        }
    }

    /// Makes a task terminal and releases its dependents (cascading cancellations through a
    /// work list, not recursion; the list stays unallocated unless something cascades).
    func finish(_ record: TaskRecord, as state: TaskState, result: JSONValue? = nil, error: TaskError? = nil) {
        var cascade: [(dependent: TaskRecord, error: TaskError)] = []
        settle(record, as: state, result: result, error: error, cascade: &cascade)
        cancel(cascade: &cascade)
    }

    func cancel(cascade: inout [(dependent: TaskRecord, error: TaskError)]) {
        while let (dependent, error) = cascade.popLast() {
            settle(dependent, as: .cancelled, result: nil, error: error, cascade: &cascade)
        }
    }

    func settle(_ record: TaskRecord, as state: TaskState, result: JSONValue?, error: TaskError?,
                        cascade: inout [(dependent: TaskRecord, error: TaskError)]) {
        guard !record.state.isTerminal else { return }
        let wasRunning = record.state == .running
        dropAttempt(of: record)
        record.notBefore = nil
        if record.lease != nil { endLease(of: record) }
        record.result = result
        if let error { record.error = error } else if state == .succeeded { record.error = nil }
        record.finishedAt = scheduler.wallClock
        record.finishedAtMonotonic = Int64(scheduler.now)
        record.queue.finishHistory.record(at: record.finishedAt!)
        transition(record, to: state)
        unfinishedCount -= 1
        if wasRunning { needsDispatch(record.queue) }
        let dependents = record.dependents
        record.dependents = []
        release(dependents, endOf: record.id, as: state, result: record.result, cascade: &cascade)
        if cell != nil {
            tellWatchers(of: record, .ended)
            reportToHome(record)
        }
        if let run = record.rare?.schedule { scheduleRunEnded(record, run: run) }
        retain(record)
    }

    /// A dependency ended, here or in another cell (Engine+Cells): each waiting dependent is
    /// cancelled (`dependency_failed`, by the cascade) or no longer waits for it, taking what
    /// its params need of `result` (Engine+Outputs).
    @inline(__always)
    func release(_ dependents: [TaskRecord], endOf dependency: TaskID, as state: TaskState, result: JSONValue?,
                 cascade: inout [(dependent: TaskRecord, error: TaskError)]) {
        for dependent in dependents where !dependent.state.isTerminal {
            if state != .succeeded && dependent.onDependencyFailure == .cancel {
                cascade.append((dependent, .dependencyFailed(dependency, state: state)))
            } else {
                takeInputs(of: dependent, from: dependency, result: result)
                dependent.blockingDependencies -= 1
                if dependent.blockingDependencies == 0 && dependent.state == .pending && dependent.attemptTimer == nil {
                    makeReady(dependent)
                }
            }
        }
    }
}
