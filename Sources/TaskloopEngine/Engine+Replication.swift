import TaskloopJSON

/// Several replicas on one database (docs/SCALING.md): every replica holds the whole engine,
/// and the database holds one order of turns. A replica changes the shared state only while
/// it holds the turn, after absorbing every turn committed before; each turn's records go to
/// the database and from there into the other replicas' engines.
///
/// The engine's side of that:
/// - `gate`: asynchronous ways in (timers, executors' reports) wait for the turn;
/// - `absorb`: takes another replica's changes as records, rebuilding counts, queues, waits,
///   leases and timers around them, without running any rule (the rules ran where the change
///   was made, and their results are among the records);
/// - `interruptAttempts(of:)`: ends the attempts of a replica that is gone;
/// - `ChangeCollector`: a turn's own changes, as records.
///
/// Threading: as the engine, one thread.

/// When this replica may change the shared state.
public protocol EngineGate: AnyObject {
    /// True while this replica holds the turn (and has absorbed every turn before it).
    var isOpen: Bool { get }
    /// Runs `work` in the next turn, in the order deferred. Asks for a turn if none is coming.
    func `defer`(_ work: @escaping () -> Void)
}

/// What other replicas changed, as records: tasks, workflows and queues as they are now, and
/// what was forgotten.
public struct SharedChanges: Sendable {
    public var tasks: [TaskSnapshot] = []
    public var evictedTasks: [StoredTaskKey] = []
    public var workflows: [WorkflowSnapshot] = []
    public var evictedWorkflows: [TaskID] = []
    public var queues: [QueueSnapshot] = []
    public var forgottenQueues: [String] = []
    /// Messages to other cells, in the order sent (Engine+Cells).
    public var messages: [CellMessage] = []

    public init() {}

    public var isEmpty: Bool {
        tasks.isEmpty && evictedTasks.isEmpty && workflows.isEmpty && evictedWorkflows.isEmpty && queues.isEmpty
            && forgottenQueues.isEmpty && messages.isEmpty
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
    private var workflows: [WorkflowRecord] = []
    private var queues: [String: TaskQueue] = [:]
    private var evictedTasks: [StoredTaskKey] = []
    private var evictedWorkflows: [TaskID] = []
    private var forgottenQueues: [String] = []
    private var messages: [CellMessage] = []

    public init() {}

    public var isEmpty: Bool {
        tasks.isEmpty && workflows.isEmpty && queues.isEmpty && evictedTasks.isEmpty && forgottenQueues.isEmpty && messages.isEmpty
    }

    public mutating func add(_ events: [EngineEvent]) {
        for event in events {
            switch event {
            case .submitted(let record), .stateChanged(let record, _, _), .progressed(let record), .cancelRequested(let record),
                 .leaseRenewed(let record), .releasedByRetry(let record), .watched(let record):
                if tasks.last !== record { tasks.append(record) }
            case .workflowSubmitted(let workflow):
                workflows.append(workflow)
            case .queueChanged(let queue):
                queues[queue.name] = queue
                forgottenQueues.removeAll { $0 == queue.name }
            case .queueForgotten(let name):
                queues.removeValue(forKey: name)
                forgottenQueues.append(name)
            case .messageSent(let message):
                messages.append(message)
            case .workflowReported:
                // `take` has it from the engine, with the workflows the reports left spent.
                break
            case .evicted(let record, let workflowEmptied):
                // `take` skips it if it also changed in this turn.
                evictedRecords.append(record)
                evictedTasks.append(StoredTaskKey(id: record.id, sequence: record.sequence))
                if workflowEmptied, let workflow = record.workflow {
                    workflows.removeAll { $0 === workflow }
                    evictedWorkflows.append(workflow.id)
                }
            }
        }
    }

    /// The changes gathered, snapshotted now; the collector starts afresh.
    public mutating func take(from engine: Engine) -> SharedChanges {
        var changes = SharedChanges()
        changes.tasks.reserveCapacity(tasks.count)
        // Evicted in the same turn: only the deletion is written.
        var seen = Set<ObjectIdentifier>(minimumCapacity: tasks.count + evictedRecords.count)
        for record in evictedRecords { seen.insert(ObjectIdentifier(record)) }
        for record in tasks where seen.insert(ObjectIdentifier(record)).inserted {
            changes.tasks.append(engine.snapshot(of: record))
        }
        let reported = engine.takeReportedWorkflows()
        for workflow in reported.changed where !workflows.contains(where: { $0 === workflow }) { workflows.append(workflow) }
        if !reported.spent.isEmpty {
            workflows.removeAll { reported.spent.contains($0.id) }
            evictedWorkflows += reported.spent
        }
        changes.workflows = workflows.map { engine.snapshot(of: $0) }
        changes.queues = queues.values.map { engine.snapshot(of: $0) }
        changes.evictedTasks = evictedTasks
        changes.evictedWorkflows = evictedWorkflows
        changes.forgottenQueues = forgottenQueues
        changes.messages = messages
        self = ChangeCollector()
        return changes
    }
}

/// A timer whose action waits for the turn; cancelled while it waits, it does not run.
final class GatedAction: ScheduledAction {
    var timer: ScheduledAction?
    private(set) var isCancelled = false

    func cancel() {
        isCancelled = true
        timer?.cancel()
        timer = nil
    }
}

extension Engine {
    /// A timer of the engine: with a gate, its action runs in a turn (if not cancelled by then).
    func timer(after delay: UInt64, _ action: @escaping () -> Void) -> ScheduledAction {
        guard gate != nil else { return scheduler.schedule(after: delay, action) }
        let gated = GatedAction()
        gated.timer = scheduler.schedule(after: delay) { [link, gated] in
            guard let engine = link.engine else { return }
            let guarded = { if !gated.isCancelled { action() } }
            if let gate = engine.gate, !gate.isOpen { gate.defer(guarded) } else { guarded() }
        }
        return gated
    }

    /// True while `absorb` publishes: the events describe another replica's changes, which
    /// that replica has written, numbered and announced already.
    public var isAbsorbing: Bool { absorbing }

    /// Starts what `absorb` found startable (called at the start of a turn).
    public func dispatchWaiting() {
        guard !queuesToDispatch.isEmpty else { return }
        settling { dispatch() }
    }

    /// Whether a queue has work that a turn could start now.
    public var hasWorkToStart: Bool { !queuesToDispatch.isEmpty }

    /// Takes another replica's changes. Rules do not run: records are filed where their states
    /// say (counts, queues, waits, retention), timers are armed for what this replica may have
    /// to do (a backoff ending, a lease expiring), and attempts this process runs follow what
    /// happened to them elsewhere (asked to stop, or taken over). Observers hear the changes as
    /// one batch with `isAbsorbing` set.
    public func absorb(_ changes: SharedChanges) {
        precondition(callDepth == 0 && !absorbing, "absorb runs between calls")
        absorbing = true
        callDepth += 1
        defer {
            callDepth -= 1
            publish()
            absorbing = false
        }
        for saved in changes.queues { absorb(saved) }
        let wallClock = scheduler.wallClock
        var changed: [(record: TaskRecord, from: TaskState?, saved: TaskSnapshot, progressed: Bool)] = []
        var created = Set<ObjectIdentifier>()
        var relink: [TaskRecord] = []
        var ended: [TaskRecord] = []
        for saved in changes.tasks.sorted(by: { $0.sequence < $1.sequence }) {
            guard let record = tasks[saved.id] else {
                let record = newRecord(from: saved, wallClock: wallClock)
                changed.append((record, nil, saved, false))
                created.insert(ObjectIdentifier(record))
                if !record.state.isTerminal { relink.append(record) }
                continue
            }
            let from = record.state
            detach(record)
            let waitsChange = from.isTerminal != saved.state.isTerminal || record.releasedBy != saved.releasedBy
            if !from.isTerminal && waitsChange { unlink(record) }
            if !saved.state.isTerminal && waitsChange { relink.append(record) }
            if !from.isTerminal && saved.state.isTerminal { ended.append(record) }
            let wasProgress = record.progress, wasCancelRequested = record.cancelRequested
            copy(saved, into: record)
            attach(record, wallClock: wallClock)
            let progressed = saved.state == from && saved.progress != wasProgress
            changed.append((record, from, saved, progressed))
            if progressed { emit(.progressed(record)) }
            if saved.cancelRequested && !wasCancelRequested { emit(.cancelRequested(record)) }
        }
        // A dependency that ended releases those still on its list (the rest are relinked).
        for record in ended {
            for dependent in record.dependents where !dependent.state.isTerminal { dependent.blockingDependencies -= 1 }
            record.dependents = []
        }
        for record in relink {
            let isNew = created.contains(ObjectIdentifier(record))
            record.blockingDependencies = 0
            for id in record.dependencies where !record.releasedBy.contains(id) {
                guard let dependency = tasks[id], !dependency.state.isTerminal else { continue }
                record.blockingDependencies += 1
                if isNew || !dependency.dependents.contains(where: { $0 === record }) { dependency.dependents.append(record) }
            }
        }
        for saved in changes.workflows where workflows[saved.id] == nil {
            if let workflow = makeWorkflow(from: saved) { emit(.workflowSubmitted(workflow)) }
        }
        for (record, from, saved, progressed) in changed {
            follow(record, from: from, saved: saved, progressed: progressed, wallClock: wallClock)
            if let from {
                if from != record.state { emit(.stateChanged(record, from: from, to: record.state)) }
            } else {
                emit(.submitted(record))
                if record.state != .pending { emit(.stateChanged(record, from: .pending, to: record.state)) }
            }
        }
        for key in changes.evictedTasks {
            guard let record = tasks[key.id] else { continue }
            if !record.state.isTerminal {
                // Unfinished here, gone from the database: this replica made it in a turn that
                // never committed (it is starting over). Its work stops; it is filed as ended.
                detach(record)
                unlink(record)
                dropAttempt(of: record)
                record.state = .cancelled
                attach(record, wallClock: wallClock)
            }
            unretain(record)
            evict(record)
        }
        for id in changes.evictedWorkflows { workflows.removeValue(forKey: id) }
        for name in changes.forgottenQueues {
            if let queue = queues[name], isIdle(queue) { forget(queue) }
        }
        for queue in queues.values where canStartWork(queue) { needsDispatch(queue) }
    }

    /// Ends the attempts that replica `name` ran, as a restart ends those of the process that
    /// died: under the retry policy, as `interrupted` (a cancellation under way completes).
    /// Its work cannot be reached from here to be stopped. Returns how many ended.
    @discardableResult
    public func interruptAttempts(of name: String) -> Int {
        settling {
            var count = 0
            for case let record? in tasks.entries where record.state == .running && record.lease == nil && record.runner == name {
                interrupt(record, stoppingLocalWork: false)
                count += 1
            }
            dispatch()
            return count
        }
    }

    /// Every task's key and every workflow's id (for starting over from a database).
    public var allTaskKeys: [StoredTaskKey] { tasks.entries.compactMap { $0.map { StoredTaskKey(id: $0.id, sequence: $0.sequence) } } }
    public var allWorkflowIDs: [TaskID] { Array(workflows.keys) }

    /// The replicas named as running attempts (other than this one).
    public var otherRunners: Set<String> {
        var names = Set<String>()
        for case let record? in tasks.entries where record.state == .running { if let runner = record.runner { names.insert(runner) } }
        return names
    }

    // MARK: absorbing, piece by piece

    private func absorb(_ saved: QueueSnapshot) {
        let queue = queue(named: saved.name)
        queue.maxConcurrency = saved.maxConcurrency
        queue.paused = saved.paused
        if saved.dispatch != queue.dispatch {
            if saved.dispatch == .server { dismissLessees(queue) }
            queue.switchDispatch(to: saved.dispatch)
        }
        emit(.queueChanged(queue))
    }

    private func newRecord(from saved: TaskSnapshot, wallClock: Int64) -> TaskRecord {
        // Replicas run the same kinds; one that does not know a kind holds its tasks all the
        // same (another replica runs them), under an executor that refuses to start them.
        let record = makeRecord(from: saved, executor: executor(of: saved.kind) ?? UnknownKindExecutor())
        tasks.append(record)
        ids.continueAfter(saved.id)
        sequence = max(sequence, saved.sequence)
        attach(record, wallClock: wallClock)
        return record
    }

    func copy(_ saved: TaskSnapshot, into record: TaskRecord) {
        record.state = saved.state
        record.cancelRequested = saved.cancelRequested
        record.attempt = saved.attempt
        record.retry = saved.retry
        record.startedAt = saved.startedAt
        record.finishedAt = saved.finishedAt
        record.result = saved.result
        record.error = saved.error
        record.progress = saved.progress
        record.notBefore = saved.notBefore
        record.releasedBy = saved.releasedBy
        if !saved.watchers.isEmpty { watchersByTask[saved.id] = saved.watchers }
        record.reopenings = saved.reopenings
    }

    /// Takes a record's state out of the books (counts, retention, leases).
    private func detach(_ record: TaskRecord) {
        record.queue.count(record.state, -1)
        record.workflow?.counts[record.state] -= 1
        if record.state.isTerminal { unretain(record) } else { unfinishedCount -= 1 }
        if record.lease != nil { endLease(of: record) }
    }

    /// Puts a record's (new) state into the books.
    private func attach(_ record: TaskRecord, wallClock: Int64) {
        record.queue.count(record.state, 1)
        record.workflow?.counts[record.state] += 1
        if record.state.isTerminal {
            record.finishedAtMonotonic = Int64(scheduler.now) - max(0, wallClock - (record.finishedAt ?? wallClock))
            retained.append(RetainedEntry(record: record, epoch: record.retentionEpoch))
            scheduleRetentionSweep()
        } else {
            unfinishedCount += 1
        }
    }

    /// No longer waits on its dependencies (its waits are rebuilt from the record).
    private func unlink(_ record: TaskRecord) {
        for id in record.dependencies {
            tasks[id]?.dependents.removeAll { $0 === record }
        }
        record.blockingDependencies = 0
    }

    /// What this replica does about a record's new state: file it where dispatch looks, arm
    /// what may fall to it (a backoff ending, a lease expiring), and keep its own attempt in
    /// step: asked to stop, or dropped when the task moved on without it.
    private func follow(_ record: TaskRecord, from: TaskState?, saved: TaskSnapshot, progressed: Bool, wallClock: Int64) {
        if record.state == .running, saved.lease == nil, from == .running, record.runner == nil,
           let run = record.run, run.attempt == record.attempt {
            // Still this process's attempt; timeout and grace go on.
            if progressed { record.executor.reportedElsewhere(run) }
            if record.cancelRequested && record.graceTimer == nil {
                armCancelGrace(on: record, after: run.stopGraceMilliseconds ?? configuration.cancelGraceMilliseconds)
                run.requestStop()
            }
            return
        }
        dropAttempt(of: record)
        record.runner = nil
        switch record.state {
        case .pending:
            if let notBefore = record.notBefore {
                scheduleRetry(record, after: UInt64(max(0, notBefore - wallClock)))
            } else if record.blockingDependencies == 0 {
                // Released but not yet made ready where it changed: the next turn does it.
                scheduleRetry(record, after: 0)
            }
        case .queued:
            if from != .queued { record.queue.enqueue(record) }
        case .running:
            if let lease = saved.lease {
                resumeLease(of: record, Lease(token: lease.token, worker: lease.worker, grantedAt: lease.grantedAt,
                                              milliseconds: lease.milliseconds, expiresAt: lease.expiresAt))
            } else {
                // Another replica runs it; that replica times it out, and its end comes as a record.
                record.runner = saved.runner
                record.run = TaskRun(link: link, record: record)
            }
        case .succeeded, .failed, .cancelled:
            // New here and already ended (made and finished in one turn elsewhere) counts too.
            if from.map({ !$0.isTerminal }) ?? true { record.queue.finishHistory.record(at: record.finishedAt ?? wallClock) }
        }
    }

    private func canStartWork(_ queue: TaskQueue) -> Bool {
        guard !halted, !queue.paused, queue.running < queue.maxConcurrency, queue.counts[.queued] > 0 else { return false }
        return queue.dispatch == .server || queue.waitingLessees > 0
    }
}

/// Holds tasks of a kind this replica does not run: an attempt that starts here fails at once.
final class UnknownKindExecutor: TaskExecutor {
    func validate(_ params: JSONValue) throws(EngineError) {}

    func start(_ run: TaskRun) {
        run.fail(TaskError(code: "unknown_kind", message: "This replica does not run tasks of kind \(run.kind)."))
    }
}
