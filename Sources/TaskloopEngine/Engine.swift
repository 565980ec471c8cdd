import DequeModule
import TaskloopJSON

public struct EngineConfiguration: Sendable {
    /// `max_concurrency` of queues created on first use.
    public var defaultConcurrency = 2
    /// Submissions that would make more tasks unfinished than this are refused.
    public var maxUnfinishedTasks = 100_000
    /// Terminal tasks are forgotten this long after they finish...
    public var retentionMilliseconds: UInt64 = 3_600_000
    /// ...or sooner, oldest first, beyond this many.
    public var maxRetainedTasks = 100_000
    /// A running task whose executor does not confirm a cancellation within this is finished
    /// as cancelled anyway; its late reports are ignored.
    public var cancelGraceMilliseconds: UInt64 = 10_000
    /// Most queues known at once. Any name creates a queue, so without a bound a client could
    /// grow memory and metric series without end; a queue that holds no task and has default
    /// settings is forgotten when it comes to that (or when its last task is evicted).
    public var maxQueues = 1_000

    public init() {}
}

/// What happened, for observers (long polls, metrics, logs, event streams, the store). Events
/// reach observers in settled batches (see `Engine.addObserver`); a record may have moved on
/// since the event, so a state change names both of its states.
public enum EngineEvent {
    case stateChanged(TaskRecord, from: TaskState, to: TaskState)
    case progressed(TaskRecord)
    case cancelRequested(TaskRecord)
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
public final class Engine {
    public let configuration: EngineConfiguration
    public let scheduler: EngineScheduler
    private var executors: [String: TaskExecutor]
    private(set) var tasks = TaskTable()
    public private(set) var queues: [String: TaskQueue] = [:]
    private var workflows: [TaskID: WorkflowRecord] = [:]
    private var ids = TaskIDGenerator()
    private var sequence: UInt64 = 0
    public private(set) var unfinishedCount = 0
    /// Terminal tasks in the order they finished, for retention.
    private var retained = Deque<TaskRecord>()
    private var retentionTimer: ScheduledAction?
    private var queuesToDispatch: [TaskQueue] = []
    private var dispatching = false
    private var observers: [([EngineEvent]) -> Void] = []
    /// Events of the call in progress, published when the outermost call has finished.
    private var unpublished: [EngineEvent] = []
    private var spareBatch: [EngineEvent] = []
    private(set) var callDepth = 0
    private var publishing = false
    /// Submissions come in runs of one kind and one queue: one-entry caches spare hashing the
    /// names (a small string compares in one step).
    private var lastKind: (kind: String, executor: TaskExecutor)?
    private var lastQueue: TaskQueue?
    /// Finds repeated dependencies without hashing: each dependency list gets a fresh stamp,
    /// and a record already carrying it was listed before.
    private var duplicateStamp: UInt64 = 0

    /// How scheduled actions and attempts reach the engine once it may be gone.
    let link = EngineLink()

    public init(configuration: EngineConfiguration, scheduler: EngineScheduler, executors: [String: TaskExecutor]) {
        self.configuration = configuration
        self.scheduler = scheduler
        self.executors = executors
        _ = queue(named: "default")
        link.engine = self
    }

    deinit {
        link.engine = nil
    }

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

    // MARK: reading

    public func task(_ id: TaskID) -> TaskRecord? { tasks[id] }

    public func workflow(_ id: TaskID) -> WorkflowRecord? { workflows[id] }

    public var taskCount: Int { tasks.count }

    /// Tasks newest first, starting below the cursor `before` (exclusive), up to `limit` that
    /// match; `next` is the cursor for the following page, nil on the last. A cursor is an id,
    /// so pages stay correct while tasks are added (they sort above it) or evicted.
    public func listTasks(before: TaskID?, limit: Int, in workflow: WorkflowRecord? = nil,
                          where matches: (TaskRecord) -> Bool) -> (tasks: [TaskRecord], next: TaskID?) {
        var page: [TaskRecord] = []
        page.reserveCapacity(min(limit, 256))
        func take(_ record: TaskRecord) -> Bool {
            guard matches(record) else { return true }
            guard page.count < limit else { return false }
            page.append(record)
            return true
        }
        var exhausted = true
        if let workflow {
            for record in workflow.tasks.reversed() where before.map({ record.id < $0 }) ?? true {
                if !take(record) {
                    exhausted = false
                    break
                }
            }
        } else {
            var index = before.map { tasks.endIndex(below: $0) } ?? tasks.entries.count
            while index > 0 {
                index -= 1
                guard let record = tasks.entries[index] else { continue }
                if !take(record) {
                    exhausted = false
                    break
                }
            }
        }
        return (page, exhausted ? nil : page.last?.id)
    }

    /// The queue, created with the default limit if it does not exist yet.
    public func queue(named name: String) -> TaskQueue {
        if let lastQueue, lastQueue.name == name { return lastQueue }
        if let queue = queues[name] {
            lastQueue = queue
            return queue
        }
        let queue = TaskQueue(name: name, maxConcurrency: configuration.defaultConcurrency)
        queues[name] = queue
        lastQueue = queue
        return queue
    }

    private func executor(of kind: String) -> TaskExecutor? {
        if let lastKind, lastKind.kind == kind { return lastKind.executor }
        guard let executor = executors[kind] else { return nil }
        lastKind = (kind, executor)
        return executor
    }

    // MARK: observers and settled batches

    /// Calls `observer` with the events of each settled call, in the order they happened. The
    /// engine's state is whole when it runs; it may call the engine again, and what that call
    /// changes follows as a batch of its own.
    public func addObserver(_ observer: @escaping (_ settled: [EngineEvent]) -> Void) {
        observers.append(observer)
    }

    private func emit(_ event: EngineEvent) {
        unpublished.append(event)
    }

    /// Runs one way into the engine; once the outermost one has finished, its events go out.
    @inline(__always)
    func settling<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        callDepth += 1
        defer {
            callDepth -= 1
            if callDepth == 0 && !unpublished.isEmpty { publish() }
        }
        return try body()
    }

    private func publish() {
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

    // MARK: submitting

    /// Submits one task. Throws (changing nothing) if the spec or a dependency is invalid or
    /// the unfinished-task limit would be exceeded.
    @discardableResult
    public func submit(_ spec: TaskSpec) throws(EngineError) -> TaskRecord {
        try settling { () throws(EngineError) in try submitSettling(spec) }
    }

    private func submitSettling(_ spec: TaskSpec) throws(EngineError) -> TaskRecord {
        let executor = try check(spec, at: "")
        var dependencies: [TaskID] = []
        if !spec.dependencies.isEmpty {
            dependencies.reserveCapacity(spec.dependencies.count)
            duplicateStamp += 1
            for (position, reference) in spec.dependencies.enumerated() {
                guard case .task(let id) = reference else {
                    throw EngineError(.unknownDependency, "Keys name sibling tasks only inside a workflow.",
                                      field: "dependencies[\(position)]")
                }
                try claimDependency(id) { "dependencies[\(position)]" }
                dependencies.append(id)
            }
        }
        try admit(1)
        let now = scheduler.wallClock
        let record = makeRecord(spec, executor: executor, dependencies: dependencies, createdAt: now)
        let wasDispatching = dispatching
        dispatching = true
        register(record)
        for id in dependencies { link(record, to: tasks[id]!) }
        if record.state == .pending && record.blockingDependencies == 0 { makeReady(record) }
        dispatching = wasDispatching
        dispatch()
        return record
    }

    /// The existing task `id` as a dependency of the list being checked (stamped with
    /// `duplicateStamp`): throws if it does not exist or the list named it already.
    @discardableResult
    private func claimDependency(_ id: TaskID, field: () -> String) throws(EngineError) -> TaskRecord {
        guard let dependency = tasks[id] else {
            throw EngineError(.unknownDependency, "No task \(id).", field: field())
        }
        guard dependency.duplicateStamp != duplicateStamp else {
            throw EngineError(.duplicateDependency, "Task \(id) is listed twice.", field: field())
        }
        dependency.duplicateStamp = duplicateStamp
        return dependency
    }

    /// Refuses a submission that would exceed the unfinished-task limit.
    private func admit(_ count: Int) throws(EngineError) {
        guard unfinishedCount + count <= configuration.maxUnfinishedTasks else {
            throw EngineError(.tooManyUnfinishedTasks,
                              "The server already holds \(unfinishedCount) unfinished tasks (limit \(configuration.maxUnfinishedTasks)).")
        }
    }

    private func makeRecord(_ spec: TaskSpec, executor: TaskExecutor, dependencies: [TaskID], createdAt: Int64,
                            id: TaskID? = nil) -> TaskRecord {
        sequence += 1
        return TaskRecord(id: id ?? ids.next(wallClockMilliseconds: createdAt), sequence: sequence, spec: spec,
                          executor: executor, queue: queue(named: spec.queue), dependencies: dependencies,
                          createdAt: createdAt)
    }

    private func register(_ record: TaskRecord) {
        tasks.append(record)
        unfinishedCount += 1
        record.queue.count(.pending, 1)
    }

    /// Checks a spec's own fields (not its dependencies) and finds its executor. `at` prefixes
    /// field paths (`tasks[3].`).
    private func check(_ spec: TaskSpec, at: @autoclosure () -> String) throws(EngineError) -> TaskExecutor {
        guard let executor = executor(of: spec.kind) else {
            throw EngineError(.unknownKind, "Unknown kind \(spec.kind); known kinds: \(kinds.joined(separator: ", ")).",
                              field: "\(at())kind")
        }
        do {
            try executor.validate(spec.params)
        } catch {
            let field = error.field.map { $0.isEmpty ? "\(at())params" : "\(at())params.\($0)" }
            throw EngineError(error.code, error.message, field: field)
        }
        guard TaskSpec.priorities.contains(spec.priority) else {
            throw EngineError(.invalid, "priority must be from -8 to 8.", field: "\(at())priority")
        }
        guard lastQueue?.name == spec.queue || queues[spec.queue] != nil || Self.isValidQueueName(spec.queue) else {
            throw EngineError(.invalid, "queue must be 1 to 64 letters, digits, '-', '_' or '.'.", field: "\(at())queue")
        }
        if lastQueue?.name != spec.queue && queues[spec.queue] == nil { try makeRoomForQueues(1, field: "\(at())queue") }
        if let timeout = spec.timeoutMilliseconds, !(1...86_400_000 * 7).contains(timeout) {
            throw EngineError(.invalid, "timeout_ms must be from 1 to 604800000.", field: "\(at())timeout_ms")
        }
        guard (1...100).contains(spec.retry.maxAttempts) else {
            throw EngineError(.invalid, "retry.max_attempts must be from 1 to 100.", field: "\(at())retry.max_attempts")
        }
        guard spec.retry.backoffFactor.isFinite, (1...10).contains(spec.retry.backoffFactor) else {
            throw EngineError(.invalid, "retry.backoff_factor must be from 1 to 10.", field: "\(at())retry.backoff_factor")
        }
        return executor
    }

    private enum ResolvedDependency {
        case existing(TaskRecord)
        case sibling(Int)
    }

    /// A workflow member that passed its checks.
    private struct CheckedMember {
        let executor: TaskExecutor
        let dependencies: [ResolvedDependency]
    }

    /// Validates a workflow's tasks (keys, fields, dependencies, cycles) without changing anything.
    private func check(_ batch: [(key: String, spec: TaskSpec)]) throws(EngineError) -> [CheckedMember] {
        var positions: [String: Int] = [:]
        for (index, member) in batch.enumerated() {
            guard !member.key.isEmpty else { throw EngineError(.invalid, "key must not be empty.", field: "tasks[\(index)].key") }
            guard positions.updateValue(index, forKey: member.key) == nil else {
                throw EngineError(.invalid, "Key \(member.key) is used twice.", field: "tasks[\(index)].key")
            }
        }
        var checked: [CheckedMember] = []
        checked.reserveCapacity(batch.count)
        for (index, member) in batch.enumerated() {
            let executor = try check(member.spec, at: "tasks[\(index)].")
            var dependencies: [ResolvedDependency] = []
            dependencies.reserveCapacity(member.spec.dependencies.count)
            duplicateStamp += 1
            var seenSiblings = Set<Int>()
            for (position, reference) in member.spec.dependencies.enumerated() {
                func field() -> String { "tasks[\(index)].dependencies[\(position)]" }
                switch reference {
                case .task(let id):
                    dependencies.append(.existing(try claimDependency(id, field: field)))
                case .sibling(let key):
                    guard let sibling = positions[key] else {
                        throw EngineError(.unknownDependency, "No task with key \(key) in this workflow.", field: field())
                    }
                    guard sibling != index else {
                        throw EngineError(.selfDependency, "A task cannot depend on itself.", field: field())
                    }
                    guard seenSiblings.insert(sibling).inserted else {
                        throw EngineError(.duplicateDependency, "Key \(key) is listed twice.", field: field())
                    }
                    dependencies.append(.sibling(sibling))
                }
            }
            checked.append(CheckedMember(executor: executor, dependencies: dependencies))
        }
        let newQueues = Set(batch.lazy.map(\.spec.queue).filter { self.queues[$0] == nil })
        if newQueues.count > 1 { try makeRoomForQueues(newQueues.count, field: "tasks") }
        if let cycle = Self.findCycle(checked.map(\.dependencies)) {
            let keys = cycle.map { batch[$0].key }
            throw EngineError(.cycle, "The tasks depend on each other in a circle: \(keys.joined(separator: " -> ")).",
                              field: "tasks", keys: keys)
        }
        return checked
    }

    /// Makes sure `count` more queues fit under `maxQueues`, forgetting idle ones if need be.
    private func makeRoomForQueues(_ count: Int, field: String) throws(EngineError) {
        guard queues.count + count > configuration.maxQueues else { return }
        for queue in Array(queues.values) where isIdle(queue) { forget(queue) }
        guard queues.count + count <= configuration.maxQueues else {
            throw EngineError(.tooManyQueues, "The server already holds \(queues.count) queues (limit \(configuration.maxQueues)).",
                              field: field)
        }
    }

    /// A queue that holds no task and has default settings: forgetting it changes nothing.
    private func isIdle(_ queue: TaskQueue) -> Bool {
        queue.counts.total == 0 && !queue.paused && queue.maxConcurrency == configuration.defaultConcurrency
            && queue.name != "default"
    }

    private func forget(_ queue: TaskQueue) {
        queues.removeValue(forKey: queue.name)
        if lastQueue === queue { lastQueue = nil }
    }

    static func isValidQueueName(_ name: String) -> Bool {
        (1...64).contains(name.utf8.count) && name.utf8.allSatisfy {
            ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || $0 == 0x2D || $0 == 0x5F || $0 == 0x2E
        }
    }

    /// A cycle among siblings, as positions in dependency order, or nil. Iterative DFS.
    private static func findCycle(_ graph: [[ResolvedDependency]]) -> [Int]? {
        var color = [UInt8](repeating: 0, count: graph.count)  // 0 new, 1 on stack, 2 done
        for root in graph.indices where color[root] == 0 {
            var stack: [(node: Int, next: Int)] = [(root, 0)]
            color[root] = 1
            while let top = stack.last {
                let siblings = graph[top.node]
                if top.next == siblings.count {
                    color[top.node] = 2
                    stack.removeLast()
                    continue
                }
                stack[stack.count - 1].next += 1
                guard case .sibling(let child) = siblings[top.next] else { continue }
                if color[child] == 1 {
                    let start = stack.firstIndex { $0.node == child }!
                    return stack[start...].map(\.node)
                }
                if color[child] == 0 {
                    color[child] = 1
                    stack.append((child, 0))
                }
            }
        }
        return nil
    }

    /// Makes `record` wait for `dependency`, or applies a dependency that already finished.
    private func link(_ record: TaskRecord, to dependency: TaskRecord) {
        if dependency.state.isTerminal {
            if dependency.state != .succeeded, record.onDependencyFailure == .cancel, !record.state.isTerminal {
                finish(record, as: .cancelled, error: .dependencyFailed(dependency.id, state: dependency.state))
            }
            return
        }
        record.blockingDependencies += 1
        dependency.dependents.append(record)
    }

    // MARK: scheduling

    private func makeReady(_ record: TaskRecord) {
        transition(record, to: .queued)
        record.queue.ready.insert(record)
        needsDispatch(record.queue)
    }

    private func needsDispatch(_ queue: TaskQueue) {
        guard !queue.needsDispatch else { return }
        queue.needsDispatch = true
        queuesToDispatch.append(queue)
    }

    /// Starts queued tasks while their queues have room. Executors may finish synchronously;
    /// that only adds queues to the list, so even a 10,000-task chain of `noop`s runs in this
    /// loop without recursion.
    private func dispatch() {
        guard !dispatching else { return }
        dispatching = true
        defer { dispatching = false }
        while let queue = queuesToDispatch.popLast() {
            queue.needsDispatch = false
            while !queue.paused && queue.running < queue.maxConcurrency, let record = queue.ready.popBest() {
                start(record)
            }
        }
    }

    private func start(_ record: TaskRecord) {
        transition(record, to: .running)
        if record.startedAt == nil { record.startedAt = scheduler.wallClock }
        record.progress = TaskProgress()
        let run = TaskRun(link: link, record: record)
        record.run = run
        if let timeout = record.timeoutMilliseconds {
            record.attemptTimer = scheduler.schedule(after: timeout) { [link, weak run] in
                guard let engine = link.engine, let run, run.isCurrent else { return }
                engine.settling {
                    // Fail first, then stop: an executor may confirm the stop from inside the
                    // request, and that confirmation would otherwise settle the task as cancelled.
                    engine.attemptFailed(run, error: .timeout(after: timeout))
                    run.requestStop()
                }
            }
        }
        record.executor.start(run)
    }

    // MARK: reports from executors

    func attemptProgressed(_ run: TaskRun, fraction: Double?, message: String?, details: JSONValue?) -> Bool {
        settling { progressSettling(run, fraction: fraction, message: message, details: details) }
    }

    private func progressSettling(_ run: TaskRun, fraction: Double?, message: String?, details: JSONValue?) -> Bool {
        let record = run.record
        guard run.isCurrent, record.state == .running else { return false }
        if let fraction, fraction.isFinite {
            let clamped = min(1, max(0, fraction))
            record.progress.fraction = max(record.progress.fraction ?? 0, clamped)
        }
        if let message { record.progress.message = message }
        if let details { record.progress.details = details }
        record.progress.updatedAt = scheduler.wallClock
        emit(.progressed(record))
        return true
    }

    func attemptSucceeded(_ run: TaskRun, result: JSONValue?) {
        guard run.isCurrent, run.record.state == .running else { return }
        settling {
            run.record.progress.fraction = 1
            run.record.progress.updatedAt = scheduler.wallClock
            finish(run.record, as: .succeeded, result: result)
            dispatch()
        }
    }

    func attemptFailed(_ run: TaskRun, error: TaskError) {
        let record = run.record
        guard run.isCurrent, record.state == .running else { return }
        settling {
            if record.cancelRequested {
                finish(record, as: .cancelled, error: .cancelled)
            } else if record.attempt < record.retry.maxAttempts {
                retry(record, after: error)
            } else {
                finish(record, as: .failed, error: error)
            }
            dispatch()
        }
    }

    func attemptCancelled(_ run: TaskRun) {
        guard run.isCurrent, run.record.state == .running else { return }
        settling {
            finish(run.record, as: .cancelled, error: .cancelled)
            dispatch()
        }
    }

    /// Back to `pending` for the backoff, then `queued` again with the next attempt number.
    private func retry(_ record: TaskRecord, after error: TaskError) {
        record.run = nil
        record.attemptTimer?.cancel()
        record.error = error
        transition(record, to: .pending)
        needsDispatch(record.queue)
        let delay = record.retry.backoff(after: record.attempt)
        record.attempt += 1
        record.attemptTimer = scheduler.schedule(after: delay) { [link, weak record] in
            guard let engine = link.engine, let record, record.state == .pending else { return }
            engine.settling {
                record.attemptTimer = nil
                engine.makeReady(record)
                engine.dispatch()
            }
        }
    }

    // MARK: cancelling

    /// Cancels a task: at once if it has not started; a running task is asked to stop and
    /// becomes `cancelled` when its executor confirms, or when the grace period ends.
    @discardableResult
    public func cancel(_ id: TaskID) throws(EngineError) -> CancelOutcome {
        guard let record = tasks[id] else { throw EngineError(.notFound, "No task \(id).") }
        guard !record.state.isTerminal else {
            throw EngineError(.alreadyTerminal, "Task \(id) already \(record.state.rawValue).")
        }
        return settling {
            let outcome = requestCancel(record)
            dispatch()
            return outcome
        }
    }

    private func requestCancel(_ record: TaskRecord) -> CancelOutcome {
        switch record.state {
        case .pending, .queued:
            finish(record, as: .cancelled, error: .cancelled)
            return .cancelled
        case .running:
            if !record.cancelRequested {
                record.cancelRequested = true
                emit(.cancelRequested(record))
                record.graceTimer = scheduler.schedule(after: configuration.cancelGraceMilliseconds) { [link, weak record] in
                    guard let engine = link.engine, let record, record.state == .running else { return }
                    engine.settling {
                        engine.finish(record, as: .cancelled, error: TaskError(
                            code: "cancelled", message: "The task was cancelled; its work did not confirm within the grace period."))
                        engine.dispatch()
                    }
                }
                record.run?.requestStop()
            }
            return record.state == .cancelled ? .cancelled : .cancelRequested
        case .succeeded, .failed, .cancelled:
            return .cancelled
        }
    }

    /// Cancels every unfinished task of a queue, dependents first; returns how many.
    @discardableResult
    public func cancelAll(inQueue name: String) -> Int {
        guard let queue = queues[name] else { return 0 }
        let counts = queue.counts
        guard counts[.pending] + counts[.queued] + counts[.running] > 0 else { return 0 }
        return settling {
            var count = 0
            // Newest first: a dependent is cancelled as such, not as a cascade of its dependency.
            for case let record? in tasks.entries.reversed() where record.queue === queue && !record.state.isTerminal {
                _ = requestCancel(record)
                count += 1
            }
            dispatch()
            return count
        }
    }

    /// Cancels `records` (in creation order) newest first, as `cancelAll(inQueue:)` does.
    func cancelAll(_ records: [TaskRecord]) -> Int {
        settling {
            var count = 0
            for record in records.reversed() where !record.state.isTerminal {
                _ = requestCancel(record)
                count += 1
            }
            dispatch()
            return count
        }
    }

    // MARK: queues

    /// Changes a queue's limit or pause switch (creating it if needed), with immediate effect.
    @discardableResult
    public func updateQueue(_ name: String, maxConcurrency: Int? = nil, paused: Bool? = nil) throws(EngineError) -> TaskQueue {
        guard Self.isValidQueueName(name) else {
            throw EngineError(.invalid, "queue must be 1 to 64 letters, digits, '-', '_' or '.'.", field: "name")
        }
        if let maxConcurrency, !(1...10_000).contains(maxConcurrency) {
            throw EngineError(.invalid, "max_concurrency must be from 1 to 10000.", field: "max_concurrency")
        }
        if queues[name] == nil { try makeRoomForQueues(1, field: "name") }
        return settling {
            let queue = queue(named: name)
            if let maxConcurrency { queue.maxConcurrency = maxConcurrency }
            if let paused { queue.paused = paused }
            needsDispatch(queue)
            dispatch()
            return queue
        }
    }

    // MARK: external workers

    /// A worker's report on an `external` task. Throws `notRunning` when the task is not a
    /// running external task, or when its cancellation was requested (the worker learns of it
    /// this way, and the task is then cancelled).
    public func report(_ report: ExternalReport, for id: TaskID) throws(EngineError) {
        guard let record = tasks[id] else { throw EngineError(.notFound, "No task \(id).") }
        guard let executor = executors[record.kind] as? ExternalExecutor else {
            throw EngineError(.notRunning, "Task \(id) is of kind \(record.kind), not external.")
        }
        guard record.state == .running, let run = record.run else {
            throw EngineError(.notRunning, "Task \(id) is \(record.state.rawValue), not running.")
        }
        if record.cancelRequested {
            settling {
                finish(record, as: .cancelled, error: .cancelled)
                dispatch()
            }
            throw EngineError(.notRunning, "Task \(id) was cancelled; stop working on it.")
        }
        settling { executor.report(report, for: run) }
    }

    // MARK: the one place states change

    private func transition(_ record: TaskRecord, to state: TaskState) {
        let from = record.state
        guard from != state else { return }
        precondition(!from.isTerminal, "terminal state \(from) of \(record.id) cannot change")
        record.queue.count(from, -1)
        record.queue.count(state, 1)
        record.state = state
        emit(.stateChanged(record, from: from, to: state))
    }

    /// Makes a task terminal and releases its dependents (cascading cancellations through a
    /// work list, not recursion; the list stays unallocated unless something cascades).
    private func finish(_ record: TaskRecord, as state: TaskState, result: JSONValue? = nil, error: TaskError? = nil) {
        var cascade: [(dependent: TaskRecord, error: TaskError)] = []
        settle(record, as: state, result: result, error: error, cascade: &cascade)
        while let (dependent, error) = cascade.popLast() {
            settle(dependent, as: .cancelled, result: nil, error: error, cascade: &cascade)
        }
    }

    private func settle(_ record: TaskRecord, as state: TaskState, result: JSONValue?, error: TaskError?,
                        cascade: inout [(dependent: TaskRecord, error: TaskError)]) {
        guard !record.state.isTerminal else { return }
        let wasRunning = record.state == .running
        record.attemptTimer?.cancel()
        record.graceTimer?.cancel()
        record.attemptTimer = nil
        record.graceTimer = nil
        if let run = record.run {
            record.run = nil
            run.requestStop()
        }
        record.result = result
        if let error { record.error = error } else if state == .succeeded { record.error = nil }
        record.finishedAt = scheduler.wallClock
        record.finishedAtMonotonic = scheduler.now
        transition(record, to: state)
        unfinishedCount -= 1
        if wasRunning { needsDispatch(record.queue) }
        let dependents = record.dependents
        record.dependents = []
        for dependent in dependents where !dependent.state.isTerminal {
            if state != .succeeded && dependent.onDependencyFailure == .cancel {
                cascade.append((dependent, .dependencyFailed(record.id, state: state)))
            } else {
                dependent.blockingDependencies -= 1
                if dependent.blockingDependencies == 0 && dependent.state == .pending && dependent.attemptTimer == nil {
                    makeReady(dependent)
                }
            }
        }
        retain(record)
    }

    // MARK: retention

    private func retain(_ record: TaskRecord) {
        retained.append(record)
        while retained.count > configuration.maxRetainedTasks, let oldest = retained.popFirst() {
            evict(oldest)
        }
        scheduleRetentionSweep()
    }

    private func scheduleRetentionSweep() {
        guard retentionTimer == nil, let oldest = retained.first else { return }
        let due = oldest.finishedAtMonotonic + configuration.retentionMilliseconds
        retentionTimer = scheduler.schedule(after: due > scheduler.now ? due - scheduler.now : 0) { [link] in
            guard let engine = link.engine else { return }
            engine.settling { engine.sweepRetained() }
        }
    }

    private func sweepRetained() {
        retentionTimer = nil
        let now = scheduler.now
        while let oldest = retained.first, oldest.finishedAtMonotonic + configuration.retentionMilliseconds <= now {
            retained.removeFirst()
            evict(oldest)
        }
        scheduleRetentionSweep()
    }

    private func evict(_ record: TaskRecord) {
        tasks.remove(record.id)
        record.queue.count(record.state, -1)
        if isIdle(record.queue) { forget(record.queue) }
        if let workflow = record.workflow {
            workflow.evicted(record)
            if workflow.tasks.isEmpty { workflows.removeValue(forKey: workflow.id) }
        }
    }

    // MARK: workflows

    /// Submits tasks that may depend on each other by key, atomically: all or none.
    public func submitWorkflow(name: String?, tasks batch: [(key: String, spec: TaskSpec)]) throws(EngineError) -> WorkflowRecord {
        try settling { () throws(EngineError) in try submitWorkflowSettling(name: name, tasks: batch) }
    }

    private func submitWorkflowSettling(name: String?, tasks batch: [(key: String, spec: TaskSpec)]) throws(EngineError) -> WorkflowRecord {
        guard !batch.isEmpty else { throw EngineError(.invalid, "A workflow needs at least one task.", field: "tasks") }
        let checked = try check(batch)
        try admit(batch.count)
        let now = scheduler.wallClock
        let workflow = WorkflowRecord(id: ids.next(wallClockMilliseconds: now), name: name, createdAt: now)
        // Every member's id first: a task may depend on a sibling listed after it.
        let memberIDs = batch.map { _ in ids.next(wallClockMilliseconds: now) }
        var records: [TaskRecord] = []
        records.reserveCapacity(batch.count)
        for (position, (member, checked)) in zip(batch, checked).enumerated() {
            let dependencyIDs = checked.dependencies.map { reference -> TaskID in
                switch reference {
                case .existing(let record): record.id
                case .sibling(let sibling): memberIDs[sibling]
                }
            }
            let record = makeRecord(member.spec, executor: checked.executor, dependencies: dependencyIDs, createdAt: now,
                                    id: memberIDs[position])
            record.workflow = workflow
            records.append(record)
        }
        workflow.attach(zip(batch.map(\.key), records).map { ($0, $1) })
        workflows[workflow.id] = workflow
        // Nothing may start until the whole batch is linked.
        let wasDispatching = dispatching
        dispatching = true
        for (record, checked) in zip(records, checked) {
            register(record)
            for reference in checked.dependencies {
                switch reference {
                case .existing(let dependency): link(record, to: dependency)
                case .sibling(let position): link(record, to: records[position])
                }
            }
        }
        for record in records where record.state == .pending && record.blockingDependencies == 0 {
            makeReady(record)
        }
        dispatching = wasDispatching
        dispatch()
        return workflow
    }

    /// Cancels every unfinished task of a workflow; returns how many.
    @discardableResult
    public func cancelWorkflow(_ id: TaskID) throws(EngineError) -> Int {
        guard let workflow = workflows[id] else { throw EngineError(.notFound, "No workflow \(id).") }
        return cancelAll(workflow.tasks)
    }
}
