import Dispatch
import Glibc
import Logging
import TaskloopClient
import TaskloopEngine
import TaskloopExecutors
import TaskloopHTTPClient
import TaskloopJSON
import TaskloopLoop

/// The reference worker (`taskloop worker`): leases tasks of one queue from a server and runs
/// them here exactly as the server would, with the server's own executors in an engine of its
/// own.
///
/// Each leased task is submitted to the local engine as a copy (its kind, params and
/// `timeout_ms`, one attempt), so progress, timeouts, grace periods and cancellation are the
/// server's code paths; an engine observer turns the copy's progress and end into reports. A
/// `LeasedTask` carries the conversation about each task (heartbeats, progress, the outcome).
///
/// Leasing is one long poll at a time, asking for as many tasks as there are free slots, and
/// only while there are. When the server is away or refuses, calls back off (exponentially,
/// with jitter, capped) and say so once per change, never giving up.
///
/// Completions, failures and progress go to the server in batches (`ReportBatcher`, `POST
/// /tasks/reports`, a few milliseconds' linger); heartbeats and releases go on each task's own
/// routes, so nothing that keeps a lease alive waits for a batch.
///
/// Stopping (`stop`) within the shutdown grace G: the long poll is withdrawn, lingering reports
/// leave at once, running tasks have G to finish and report; at G what still runs is cancelled
/// and, once it has stopped (an `exec` tree reaped), released to the server, attempt not
/// consumed. Whatever cannot be said by G + 0.75 s is given up (its lease expires on the
/// server), so the process, whose watchdog fires at G + 0.95 s, ends in time.
///
/// Threading: one thread owns everything here: the loop thread. The engine, the executors,
/// the HTTP clients, every `LeasedTask` and every callback run on it, without locks; the one
/// piece of work elsewhere (the /proc scan for an `exec` task's leftovers) hops back with
/// `EventLoop.execute`.
public final class TaskloopWorker {
    public let loop: EventLoop
    let configuration: WorkerConfiguration
    let logger: Logger
    private(set) var scheduler: LoopScheduler!
    private(set) var api: ServerAPI!
    /// Completions, failures and progress on their way to the server, in batches.
    private(set) var reports: ReportBatcher!
    private var engine: Engine!
    private var serverClient: HTTPClient?
    private var taskClient: HTTPClient?
    private var execExecutor: ExecExecutor?
    private var orphanReaper: OrphanReaper?
    /// Tasks whose lease this worker holds, by the server's id.
    private var held: [String: LeasedTask] = [:]
    /// Tasks whose lease was lost while their local copy runs; they hold a slot until it stops.
    private var abandoned: [TaskID: LeasedTask] = [:]
    private var byLocalID: [TaskID: LeasedTask] = [:]
    /// The task whose copy `engine.submit` is creating: the engine starts a copy inside
    /// `submit`, before the call returns its id.
    private var submitting: LeasedTask?
    private var leaseCall: ServerCall?
    private var leaseRetry: ScheduledAction?
    private var leaseBackoff: Backoff
    /// What last went wrong with leasing itself (not reachability, which `ServerAPI` reports),
    /// so a lasting problem is one log line.
    private var leaseProblem: String?
    private var stopping = false
    var isStopping: Bool { stopping }
    /// Set once everything is closed: a late callback (a leftover scan's hop, a copy reaped
    /// after the give-up) finds nothing to do.
    private var finished = false
    private var stopCompletion: (() -> Void)?
    private var stopTimers: [ScheduledAction] = []

    /// What is left of the grace when the work is given up: the rest of the second the process
    /// may outlive the grace by goes to the loop's own close and the logs' flush.
    static let giveUpAfterGraceMilliseconds: UInt64 = 750
    /// The shortest time between two lease calls that came back empty at once.
    static let emptyLeaseSpacingMilliseconds: UInt64 = 1_000

    public init(loop: EventLoop, configuration: WorkerConfiguration, logger: Logger = Logger(label: "worker")) {
        self.loop = loop
        self.configuration = configuration
        self.logger = logger
        leaseBackoff = Backoff(maximumMilliseconds: configuration.maxBackoffMilliseconds)
    }

    /// Builds the engine and clients, then starts leasing. Loop thread only.
    public func start() throws {
        let scheduler = try LoopScheduler(loop: loop)
        var opened: [() -> Void] = [{ scheduler.close() }]
        func undo() { for close in opened.reversed() { close() } }
        do {
            // At most three calls per task are in flight (heartbeat, progress, outcome; batches
            // of reports are fewer) and one lease call: with that many connections none ever
            // waits for another. The server is the one the user named, wherever it is: the
            // tasks' address policy is not for it.
            let serverClient = try HTTPClient(loop: loop, policy: .unrestricted, maxHostConnections: 3 * configuration.concurrency + 1)
            opened.append { serverClient.close() }
            let taskClient = try HTTPClient(loop: loop, policy: configuration.httpPolicy,
                                            maxHostConnections: configuration.httpMaxHostConnections)
            opened.append { taskClient.close() }
            var executors: [String: TaskExecutor] = ["http": HTTPExecutor(client: taskClient, scheduler: scheduler)]
            if configuration.allowExec {
                try OrphanReaper.becomeChildSubreaper()
                let reaper = try OrphanReaper(loop: loop)
                orphanReaper = reaper
                let exec = ExecExecutor(loop: loop, scheduler: scheduler,
                                        isolation: try ProcessIsolation.choose(configuration.execIsolation))
                exec.cookieIdentity = { [unowned self] run in
                    let task = byLocalID[run.taskID] ?? submitting
                    return task.map { ($0.id, $0.attempt) } ?? (run.taskID.description, run.attempt)
                }
                execExecutor = exec
                executors["exec"] = exec
            }
            var engineConfiguration = EngineConfiguration()
            engineConfiguration.defaultConcurrency = configuration.concurrency
            // A copy's end is reported at once; nothing needs it afterwards.
            engineConfiguration.maxRetainedTasks = 0
            // The server resolved the params' references; a result that looks like one is data.
            engineConfiguration.resolvesOutputs = false
            engine = Engine(configuration: engineConfiguration, scheduler: scheduler, extraExecutors: executors)
            engine.addObserver { [unowned self] events in settled(events) }
            self.scheduler = scheduler
            self.serverClient = serverClient
            self.taskClient = taskClient
            api = ServerAPI(client: serverClient, scheduler: scheduler, configuration: configuration, logger: logger)
            reports = ReportBatcher(worker: self, configuration: configuration)
        } catch {
            orphanReaper?.close()
            orphanReaper = nil
            undo()
            throw error
        }
        logger.info("worker \(configuration.name) leasing from queue \(configuration.queue) at \(api.serverDescription)", metadata: [
            "concurrency": "\(configuration.concurrency)", "kinds": "\(configuration.leasedKinds.joined(separator: ","))",
            "exec": "\(configuration.allowExec)", "lease_ms": "\(configuration.leaseMilliseconds)",
        ])
        if let execExecutor { logger.info("\(execExecutor.isolation.summary)") }
        requestTasks()
    }

    // MARK: leasing

    /// Slots taken: tasks held, and copies still stopping after their lease was lost.
    private var busySlots: Int { held.count + abandoned.count }

    /// One lease call at a time, only with a free slot, never while stopping or backing off.
    private func requestTasks() {
        guard !stopping, leaseCall == nil, leaseRetry == nil, busySlots < configuration.concurrency else { return }
        let wait = configuration.leaseWaitSeconds
        let body: JSONValue = [
            "worker": .string(configuration.name),
            "kinds": .array(configuration.leasedKinds.map { .string($0) }),
            "max_tasks": .int(Int64(min(configuration.concurrency - busySlots, 100))),
            "lease_ms": .int(Int64(configuration.leaseMilliseconds)),
            "wait_s": .int(Int64(wait)),
        ]
        let asked = scheduler.now
        leaseCall = api.post("/queues/\(configuration.queue)/lease", body, holdMilliseconds: UInt64(wait) * 1_000) { [unowned self] answer in
            leaseCall = nil
            leaseAnswered(answer, heldFor: scheduler.now - asked)
        }
    }

    private func leaseAnswered(_ answer: ServerAnswer, heldFor elapsed: UInt64) {
        switch answer {
        case .success(let document):
            guard let tasks = document.objectValue?["tasks"]?.arrayValue else {
                return leaseFailed("the lease answer has no tasks list")
            }
            if leaseProblem != nil {
                leaseProblem = nil
                logger.info("leasing from queue \(configuration.queue) again")
            }
            leaseBackoff.reset()
            for task in tasks { take(task) }
            // A server that does not hold lease calls (its --max-lease-wait-seconds is 0) would
            // make this a busy loop: an empty answer comes at most once a second.
            if tasks.isEmpty && elapsed < Self.emptyLeaseSpacingMilliseconds {
                return leaseAgain(after: Self.emptyLeaseSpacingMilliseconds - elapsed)
            }
            requestTasks()
        case .conflict(404, let code, let detail):
            leaseFailed("the server has no queue \(configuration.queue) (\(code ?? "not_found"): \(detail))")
        case .conflict(let status, let code, let detail):
            leaseFailed("queue \(configuration.queue) is not dispatched to workers (\(status) \(code ?? ""): \(detail)); "
                        + "make it so with PATCH /queues/\(configuration.queue) {\"dispatch\":\"workers\"}")
        case .refused(let status, let code, let detail):
            leaseFailed("the server refused the lease call (\(status) \(code ?? "")): \(detail)")
        case .unauthorized, .unavailable:
            // ServerAPI has said so.
            retryLeasing()
        }
    }

    private func leaseFailed(_ problem: String) {
        if problem != leaseProblem {
            leaseProblem = problem
            logger.error("cannot lease: \(problem); retrying with backoff")
        }
        retryLeasing()
    }

    private func retryLeasing() {
        leaseAgain(after: leaseBackoff.nextDelay())
    }

    private func leaseAgain(after delay: UInt64) {
        leaseRetry = scheduler.schedule(after: delay) { [unowned self] in
            leaseRetry = nil
            requestTasks()
        }
    }

    /// One task of a lease answer: held, then run, or failed at once when this worker cannot
    /// run it.
    private func take(_ value: JSONValue) {
        guard let object = value.objectValue, let id = object["id"]?.stringValue, !id.isEmpty,
              id.utf8.allSatisfy({ Self.isUnreserved($0) }),
              let token = object["lease"]?.objectValue?["token"]?.stringValue, !token.isEmpty else {
            // Without an id and a token nothing can be said about it; its lease will expire.
            logger.error("the lease answer holds a task without a usable id or lease token; skipped")
            return
        }
        let kind = object["kind"]?.stringValue ?? ""
        let attempt = object["attempt"]?.intValue.map { Int(clamping: $0) } ?? 1
        let timeout = object["timeout_ms"]?.intValue.flatMap { $0 > 0 ? UInt64($0) : nil }
        let task = LeasedTask(id: id, token: token, kind: kind, attempt: attempt, params: object["params"] ?? .object([:]),
                              timeoutMilliseconds: timeout, worker: self)
        if let earlier = held[id] {
            // The server leased it again, so the earlier lease is gone, whatever its heartbeats
            // have not yet said.
            leaseLost(earlier, because: "the server leased the task again")
        }
        held[id] = task
        task.startHeartbeats()
        logger.info("task \(id) leased", metadata: ["task": "\(id)", "kind": "\(kind)", "attempt": "\(attempt)"])
        if stopping {
            return task.finish(.release)
        }
        guard WorkerConfiguration.runnableKinds.contains(kind) else {
            return end(task, .fail(TaskError(code: "unsupported_kind", message: "This worker does not run tasks of kind \(kind).")))
        }
        guard kind != "exec" || configuration.allowExec else {
            return end(task, .fail(TaskError(code: "exec_not_allowed",
                                             message: "This worker does not run exec tasks (start it with --allow-exec).")))
        }
        if kind == "exec" && attempt > 1 {
            killLeftovers(of: task)
        } else {
            startCopy(of: task)
        }
    }

    /// Task ids are URL-safe: anything else would not make a path.
    private static func isUnreserved(_ byte: UInt8) -> Bool {
        (byte >= 0x30 && byte <= 0x39) || (byte | 0x20 >= 0x61 && byte | 0x20 <= 0x7A) || byte == 0x2D || byte == 0x5F
            || byte == 0x2E || byte == 0x7E
    }

    /// An earlier attempt's programs may still run on this machine (a worker killed with -9
    /// leaves its detached trees behind): they are killed, by the task's cgroups and cookie,
    /// before the task runs again, so one task never runs twice at once. The scan reads /proc,
    /// so it runs off the loop.
    private func killLeftovers(of task: LeasedTask) {
        guard let isolation = execExecutor?.isolation else { return startCopy(of: task) }
        let id = task.id
        let worker = LoopBound(self, loop: loop)
        let leased = LoopBound(task, loop: loop)
        let loop = self.loop
        DispatchQueue.global().async {
            let killed = ExecExecutor.killLeftovers(ofTask: id, isolation: isolation)
            loop.execute {
                guard !worker.value.finished else { return }
                worker.value.execExecutor?.removeWhenEmpty(killed)
                worker.value.startCopy(of: leased.value)
            }
        }
    }

    /// Submits the local copy of a held task: it starts at once (a slot is free by the count).
    private func startCopy(of task: LeasedTask) {
        guard !finished, task.phase == .preparing, held[task.id] === task else { return }
        if stopping {
            return task.finish(.release)
        }
        if task.cancelRequested {
            return end(task, .fail(TaskError(code: "cancelled", message: "The task was cancelled before it started.")))
        }
        task.phase = .running
        let spec = TaskSpec(kind: task.kind, params: task.params, timeoutMilliseconds: task.timeoutMilliseconds,
                            retry: RetryPolicy(maxAttempts: 1))
        submitting = task
        defer { submitting = nil }
        do {
            try engine.submit(spec)
        } catch {
            let field = error.field.map { "\($0): " } ?? ""
            end(task, .fail(TaskError(code: error.code == .invalid ? "invalid_params" : error.code.rawValue,
                                      message: field + error.message)))
        }
    }

    // MARK: the local copies

    /// The engine's settled batches: a copy created, moved, or ended.
    private func settled(_ events: [EngineEvent]) {
        guard !finished else { return }
        for event in events {
            switch event {
            case .submitted(let record):
                if let submitting, submitting.localID == nil {
                    submitting.localID = record.id
                    byLocalID[record.id] = submitting
                }
            case .progressed(let record):
                byLocalID[record.id]?.progressed(record.progress)
            case .stateChanged(let record, _, let state) where state.isTerminal:
                copyEnded(record, as: state)
            default:
                break
            }
        }
    }

    private func copyEnded(_ record: TaskRecord, as state: TaskState) {
        guard let task = byLocalID.removeValue(forKey: record.id) else { return }
        if task.phase == .abandoned {
            abandoned.removeValue(forKey: record.id)
            logger.info("task \(task.id) stopped after its lease was lost", metadata: ["task": "\(task.id)"])
            requestTasks()
            return finishStoppingIfIdle()
        }
        switch state {
        case .succeeded:
            end(task, .complete(result: record.result))
        case .cancelled where task.releaseWhenCancelled && !task.cancelRequested:
            logger.info("task \(task.id) stopped for the shutdown; releasing it", metadata: ["task": "\(task.id)", "kind": "\(task.kind)"])
            task.finish(.release)
        case .cancelled:
            end(task, .fail(TaskError(code: "cancelled", message: "The task was cancelled; the worker stopped it.")))
        default:
            end(task, .fail(record.error ?? TaskError(code: "failed", message: "The task failed.")))
        }
    }

    /// Logs how a task ended here and sends that to the server.
    private func end(_ task: LeasedTask, _ outcome: LeasedTask.Outcome) {
        var metadata: Logger.Metadata = ["task": "\(task.id)", "kind": "\(task.kind)"]
        switch outcome {
        case .complete:
            logger.info("task \(task.id) succeeded", metadata: metadata)
        case .fail(let error):
            metadata["code"] = "\(error.code)"
            logger.info("task \(task.id) \(error.code == "cancelled" ? "cancelled" : "failed: \(error.code): \(error.message)")",
                        metadata: metadata)
        case .release:
            break
        }
        task.finish(outcome)
    }

    // MARK: what the server says about a task

    /// A heartbeat answer asked for cancellation: the copy is stopped as the server would stop
    /// it, and its end is reported as `cancelled`.
    func serverCancelled(_ task: LeasedTask) {
        guard !task.cancelRequested, held[task.id] === task else { return }
        task.cancelRequested = true
        logger.info("task \(task.id): the server asks to cancel it", metadata: ["task": "\(task.id)"])
        if task.phase == .running, let localID = task.localID { _ = try? engine.cancel(localID) }
    }

    /// The lease is gone (409 `lease_lost`, 404): the copy is stopped and nothing more is said.
    func leaseLost(_ task: LeasedTask, because reason: String) {
        guard held[task.id] === task else { return }
        logger.warning("lost the lease of task \(task.id) (\(reason)); stopping it without reporting", metadata: ["task": "\(task.id)"])
        held.removeValue(forKey: task.id)
        task.stopTalking()
        let wasRunning = task.phase == .running
        task.phase = .abandoned
        if wasRunning, let localID = task.localID {
            abandoned[localID] = task
            // The copy may end within this call; its end finds it abandoned.
            _ = try? engine.cancel(localID)
        }
        requestTasks()
        finishStoppingIfIdle()
    }

    /// The server has taken the outcome (or will take nothing more): the slot is free.
    func forget(_ task: LeasedTask) {
        guard held[task.id] === task else { return }
        held.removeValue(forKey: task.id)
        task.stopTalking()
        requestTasks()
        finishStoppingIfIdle()
    }

    // MARK: stopping

    /// Stops within the shutdown grace (see the type's comment); `completion` runs once, when
    /// everything the worker owns is closed.
    public func stop(completion: @escaping () -> Void) {
        guard !stopping else { return }
        stopping = true
        stopCompletion = completion
        leaseCall?.cancel()
        leaseCall = nil
        leaseRetry?.cancel()
        leaseRetry = nil
        // Reports lingering for company leave now.
        reports.flush()
        let grace = configuration.shutdownGraceMilliseconds
        logger.info("stopping: \(held.count) task(s) held; running ones have \(grace) ms to finish")
        execExecutor?.stopBy(scheduler.now + grace)
        execExecutor?.onIdle = { [unowned self] in finishStoppingIfIdle() }
        // Work that has not started is not started now.
        for task in held.values where task.phase == .preparing { task.finish(.release) }
        stopTimers.append(scheduler.schedule(after: grace) { [unowned self] in graceEnded() })
        stopTimers.append(scheduler.schedule(after: grace + Self.giveUpAfterGraceMilliseconds) { [unowned self] in giveUp() })
        finishStoppingIfIdle()
    }

    /// The end of the grace: what still runs is cancelled, to be released once it has stopped.
    private func graceEnded() {
        for task in Array(held.values) where task.phase == .running {
            task.releaseWhenCancelled = true
            if let localID = task.localID { _ = try? engine.cancel(localID) }
        }
        execExecutor?.killAll()
        stopTimers.append(scheduler.schedule(after: 500) { [unowned self] in execExecutor?.abandonOutput() })
    }

    /// Past the grace: what could not be said is not said; those leases expire on the server.
    private func giveUp() {
        for task in held.values.sorted(by: { $0.id < $1.id }) {
            let unsaid = task.outcome.map { "its \($0.path)" } ?? "its outcome"
            logger.warning("task \(task.id): the server was not told \(unsaid) within the grace; its lease will expire",
                           metadata: ["task": "\(task.id)"])
            task.stopTalking()
        }
        held.removeAll()
        abandoned.removeAll()
        finishStopping()
    }

    private func finishStoppingIfIdle() {
        guard stopping, held.isEmpty, abandoned.isEmpty, (execExecutor?.liveAttempts ?? 0) == 0 else { return }
        finishStopping()
    }

    private func finishStopping() {
        guard let completion = stopCompletion else { return }
        stopCompletion = nil
        finished = true
        for timer in stopTimers { timer.cancel() }
        stopTimers.removeAll()
        reports.close()
        serverClient?.close()
        serverClient = nil
        taskClient?.close()
        taskClient = nil
        finishProcessTrees(exec: execExecutor, orphanReaper: orphanReaper)
        orphanReaper = nil
        scheduler.close()
        logger.info("stopped")
        completion()
    }
}
