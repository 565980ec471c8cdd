import Logging
import TaskloopClient
import TaskloopEngine
import TaskloopJSON

/// One task a worker holds the lease of, from the lease to the last word about it: it keeps
/// the lease alive with heartbeats, passes progress on (at most one report out, in the
/// worker's report batches or on its own route, the latest progress replacing unsent progress,
/// no faster than the progress interval), and delivers the outcome (or gives the task back)
/// until the server has taken it or says the lease is gone. The worker decides what to run and
/// when; this is the conversation with the server about one task.
///
/// Threading: loop thread only, like the worker that owns it.
final class LeasedTask {
    enum Phase {
        /// Leased; the local copy has not started (an `exec` task of a later attempt first has
        /// what earlier attempts left on this machine killed).
        case preparing
        /// The local copy runs.
        case running
        /// The local copy has ended (or never ran); its outcome or release is being delivered.
        case reporting
        /// The lease is gone: nothing more is said about the task; its local copy is stopping.
        case abandoned
    }

    /// The last word about a task.
    enum Outcome {
        case complete(result: JSONValue?)
        case fail(TaskError)
        /// Back to `queued` with the attempt not consumed (the worker is stopping).
        case release

        /// The member a batch item carries it in; a release has no batch form.
        var batchMember: String? {
            switch self {
            case .complete: "complete"
            case .fail: "fail"
            case .release: nil
            }
        }

        var path: String {
            switch self {
            case .complete: "complete"
            case .fail: "fail"
            case .release: "release"
            }
        }
    }

    /// The server's task id.
    let id: String
    let token: String
    let kind: String
    let attempt: Int
    let params: JSONValue
    let timeoutMilliseconds: UInt64?
    /// The id of the local copy in the worker's engine, once submitted.
    var localID: TaskID?
    var phase = Phase.preparing
    /// The server asked (in a heartbeat answer) for the task to be cancelled.
    var cancelRequested = false
    /// The worker is stopping: a local copy cancelled for that is released, not failed.
    var releaseWhenCancelled = false
    private(set) var outcome: Outcome?

    private unowned let worker: TaskloopWorker
    private var heartbeatTimer: ScheduledAction?
    private var heartbeatCall: ServerCall?
    private var heartbeatBackoff: Backoff
    /// The latest progress not yet sent: it replaces older unsent progress, and a batch that
    /// leaves (or is sent again) carries it in place of the report it had.
    private var unsentProgress: TaskProgress?
    /// The progress report out, waiting in the worker's report batches, in one sent, or on its
    /// own route: kept until answered, so that a batch sent again carries it again. Only one
    /// is out at once.
    private var progressOut: TaskProgress?
    private var progressCall: ServerCall?
    private var progressTimer: ScheduledAction?
    /// Monotonic milliseconds before which no progress report is sent.
    private var nextProgressAt: UInt64 = 0
    private var progressBackoff: Backoff
    private var reportCall: ServerCall?
    private var reportTimer: ScheduledAction?
    private var reportBackoff: Backoff
    /// A refusal is logged once per task, not per progress report.
    private var loggedRefusal = false
    /// Nothing more is said about the task: a batch that carries its report leaves it out, and
    /// an answer about it changes nothing.
    private(set) var silenced = false

    init(id: String, token: String, kind: String, attempt: Int, params: JSONValue, timeoutMilliseconds: UInt64?,
         worker: TaskloopWorker) {
        self.id = id
        self.token = token
        self.kind = kind
        self.attempt = attempt
        self.params = params
        self.timeoutMilliseconds = timeoutMilliseconds
        self.worker = worker
        let cap = worker.configuration.maxBackoffMilliseconds
        heartbeatBackoff = Backoff(maximumMilliseconds: min(cap, heartbeatInterval(worker.configuration)))
        progressBackoff = Backoff(maximumMilliseconds: cap)
        reportBackoff = Backoff(maximumMilliseconds: cap)
    }

    private var api: ServerAPI { worker.api }
    private var scheduler: EngineScheduler { worker.scheduler }
    private var logger: Logger { worker.logger }

    /// Keeps the lease: a heartbeat every third of it, so two may fail before it runs out.
    func startHeartbeats() {
        scheduleHeartbeat(after: heartbeatInterval(worker.configuration))
    }

    /// Stops every timer and call: nothing more is said about the task.
    func stopTalking() {
        silenced = true
        for timer in [heartbeatTimer, progressTimer, reportTimer] { timer?.cancel() }
        for call in [heartbeatCall, progressCall, reportCall] { call?.cancel() }
        heartbeatTimer = nil
        progressTimer = nil
        reportTimer = nil
        heartbeatCall = nil
        progressCall = nil
        reportCall = nil
        unsentProgress = nil
        progressOut = nil
    }

    // MARK: heartbeats

    private func scheduleHeartbeat(after delay: UInt64) {
        heartbeatTimer = scheduler.schedule(after: delay) { [weak self] in self?.beat() }
    }

    private func beat() {
        heartbeatTimer = nil
        heartbeatCall = api.post("/tasks/\(id)/heartbeat", ["lease_token": .string(token)]) { [weak self] answer in
            guard let self else { return }
            heartbeatCall = nil
            switch answer {
            case .success(let document):
                heartbeatBackoff.reset()
                scheduleHeartbeat(after: heartbeatInterval(worker.configuration))
                if document.objectValue?["cancel_requested"]?.boolValue == true { worker.serverCancelled(self) }
            case .conflict(let status, let code, let detail):
                lost(status, code, detail)
            case .refused(let status, let code, let detail):
                logRefusal("heartbeat", status, code, detail)
                scheduleHeartbeat(after: heartbeatInterval(worker.configuration))
            case .unauthorized, .unavailable:
                scheduleHeartbeat(after: heartbeatBackoff.nextDelay())
            }
        }
    }

    /// A 404 or 409 while the task runs: the lease is gone. Once the outcome is on its way such
    /// an answer may only mean that the outcome arrived first, and the outcome's own answer
    /// says what happened.
    private func lost(_ status: Int, _ code: String?, _ detail: String) {
        guard phase == .preparing || phase == .running else { return }
        worker.leaseLost(self, because: "\(status) \(code ?? ""): \(detail)")
    }

    private func logRefusal(_ call: String, _ status: Int, _ code: String?, _ detail: String) {
        guard !loggedRefusal else { return }
        loggedRefusal = true
        logger.warning("the server refused the \(call) of task \(id) (\(status) \(code ?? "")): \(detail)", metadata: ["task": "\(id)"])
    }

    // MARK: progress

    /// The local copy moved; the latest progress is sent when the interval allows.
    func progressed(_ progress: TaskProgress) {
        guard phase == .running else { return }
        unsentProgress = progress
        sendProgress()
    }

    /// Sends the unsent progress, unless a report is out or the interval (or a backoff) has not
    /// passed: in the worker's next batch of reports (unless `alone`, or the worker reports one
    /// by one), or on its own route.
    private func sendProgress(alone: Bool = false) {
        guard phase == .running, !silenced, progressOut == nil, progressTimer == nil, let progress = unsentProgress else { return }
        let now = scheduler.now
        guard nextProgressAt <= now else {
            progressTimer = scheduler.schedule(after: nextProgressAt - now) { [weak self] in
                self?.progressTimer = nil
                self?.sendProgress()
            }
            return
        }
        unsentProgress = nil
        progressOut = progress
        if !alone, worker.reports.batching {
            return worker.reports.enqueue(self, .progress)
        }
        var body = Self.progressFields(progress)
        body["lease_token"] = .string(token)
        progressCall = api.post("/tasks/\(id)/progress", .object(body)) { [weak self] answer in
            guard let self else { return }
            progressCall = nil
            progressAnswered(answer)
        }
    }

    /// Whether a batch about to leave should carry this task's progress: it is out, and the
    /// task still runs (a finished task's outcome supersedes it).
    var hasProgressToReport: Bool { progressOut != nil && phase == .running && !silenced }

    /// What the server said about the progress out, on its own route or as a batch's item.
    private func progressAnswered(_ answer: ServerAnswer) {
        guard let progress = progressOut else { return }
        progressOut = nil
        guard phase == .running, !silenced else { return }
        switch answer {
        case .success:
            progressBackoff.reset()
            nextProgressAt = scheduler.now + worker.configuration.progressIntervalMilliseconds
        case .conflict(let status, let code, let detail):
            return lost(status, code, detail)
        case .refused(let status, let code, let detail):
            logRefusal("progress", status, code, detail)
            nextProgressAt = scheduler.now + worker.configuration.progressIntervalMilliseconds
        case .unauthorized, .unavailable:
            if unsentProgress == nil { unsentProgress = progress }
            nextProgressAt = scheduler.now + progressBackoff.nextDelay()
        }
        sendProgress()
    }

    /// A progress report's fields, as `POST /tasks/{id}/progress` and a batch item's
    /// `progress` take them, the message cut to what the server accepts.
    static func progressFields(_ progress: TaskProgress) -> JSONObject {
        var fields: JSONObject = [:]
        if let fraction = progress.fraction { fields["fraction"] = .double(fraction) }
        if let message = progress.message { fields["message"] = .string(cut(message, to: 4_096)) }
        if let details = progress.details { fields["details"] = details }
        return fields
    }

    // MARK: the outcome

    /// Delivers the last word about the task, retrying while the server is away, until it is
    /// taken or the server says the lease is gone.
    func finish(_ outcome: Outcome) {
        guard self.outcome == nil else { return }
        phase = .reporting
        self.outcome = outcome
        progressTimer?.cancel()
        progressTimer = nil
        // Progress waiting in the report batches is left out of them; an answer to progress
        // already sent changes nothing.
        unsentProgress = nil
        progressOut = nil
        sendOutcome()
    }

    /// Sends the outcome: a completion or failure in the worker's next batch of reports (unless
    /// `alone`, or the worker reports one by one), a release on its own route, which batches do
    /// not carry.
    func sendOutcome(alone: Bool = false) {
        guard let outcome, !silenced else { return }
        reportTimer = nil
        if !alone, worker.reports.batching, outcome.batchMember != nil {
            return worker.reports.enqueue(self, .outcome)
        }
        var body: JSONObject = ["lease_token": .string(token)]
        switch outcome {
        case .complete(let result): body["result"] = result ?? .null
        case .fail(let error): body["error"] = Self.json(error)
        case .release: break
        }
        reportCall = api.post("/tasks/\(id)/\(outcome.path)", .object(body)) { [weak self] answer in
            guard let self else { return }
            reportCall = nil
            outcomeAnswered(answer)
        }
    }

    // MARK: reports in batches

    /// A report as an item of `POST /tasks/reports`, or nil when there is nothing to say any
    /// more (the task is silenced, or its progress is superseded by its outcome). The outcome:
    /// `{id, lease_token, complete: {result}}` or `{..., fail: {error}}` (a release has no
    /// item). Progress: `{id, lease_token, progress: {fraction, message, details}}`, the latest
    /// the task has when the batch leaves.
    func batchItem(_ report: ReportBatcher.Report) -> JSONValue? {
        guard !silenced else { return nil }
        let member: String
        var fields: JSONObject = [:]
        switch report {
        case .outcome:
            guard let outcome, let name = outcome.batchMember else { return nil }
            member = name
            switch outcome {
            case .complete(let result): fields["result"] = result ?? .null
            case .fail(let error): fields["error"] = Self.json(error)
            case .release: return nil
            }
        case .progress:
            guard hasProgressToReport else { return nil }
            if let newer = unsentProgress {
                progressOut = newer
                unsentProgress = nil
            }
            guard let progress = progressOut else { return nil }
            member = "progress"
            fields = Self.progressFields(progress)
        }
        return ["id": .string(id), "lease_token": .string(token), member: .object(fields)]
    }

    /// A batch item's answer, handled as its own route's answer is.
    func batchItemAnswered(_ report: ReportBatcher.Report, _ answer: ServerAnswer) {
        switch report {
        case .outcome: outcomeAnswered(answer)
        case .progress: progressAnswered(answer)
        }
    }

    /// A report of a batch that the server would not take as one, sent on its own route.
    func sendAlone(_ report: ReportBatcher.Report) {
        switch report {
        case .outcome:
            sendOutcome(alone: true)
        case .progress:
            guard let progress = progressOut else { return }
            progressOut = nil
            if unsentProgress == nil { unsentProgress = progress }
            sendProgress(alone: true)
        }
    }

    /// What the server said about the outcome, on its own route or as a batch's item: the same
    /// answer is handled the same way.
    func outcomeAnswered(_ answer: ServerAnswer) {
        guard let outcome, !silenced else { return }
        switch answer {
        case .success:
            if case .release = outcome { logger.info("task \(id) released", metadata: ["task": "\(id)"]) }
            worker.forget(self)
        case .conflict(let status, let code, let detail):
            // The server times an attempt too, from the grant, a moment before the copy
            // started here: its timer usually ends a task that times out first, which is
            // no news.
            var timedOut = false
            if case .fail(let error) = outcome { timedOut = error.code == "timeout" }
            logger.log(level: timedOut ? .info : .warning,
                       "the server did not take the \(outcome.path) of task \(id) (\(status) \(code ?? "")): \(detail)",
                       metadata: ["task": "\(id)"])
            worker.forget(self)
        case .refused(let status, let code, let detail):
            refused(outcome, status, code, detail)
        case .unauthorized, .unavailable:
            reportTimer = scheduler.schedule(after: reportBackoff.nextDelay()) { [weak self] in self?.sendOutcome() }
        }
    }

    /// A result the server will not take (larger than its body limit, say) must not leave the
    /// task running until its lease expires: the task fails instead, saying why. A refused
    /// failure or release cannot be put another way.
    private func refused(_ outcome: Outcome, _ status: Int, _ code: String?, _ detail: String) {
        logger.error("the server refused the \(outcome.path) of task \(id) (\(status) \(code ?? "")): \(detail)",
                     metadata: ["task": "\(id)"])
        guard case .complete = outcome else { return worker.forget(self) }
        self.outcome = .fail(TaskError(code: "report_refused",
                                       message: "The server refused the worker's report of the result (\(status)): \(detail)"))
        sendOutcome()
    }
}

extension LeasedTask {
    /// An error as `POST /tasks/{id}/fail` takes it: `{code, message, ...details}`, the code and
    /// message cut to what the server accepts (64 and 4096 characters), so that a long message
    /// cannot get the whole report refused.
    static func json(_ error: TaskError) -> JSONValue {
        var object: JSONObject = ["code": .string(cut(error.code, to: 64)), "message": .string(cut(error.message, to: 4_096))]
        for member in error.details where member.key != "code" && member.key != "message" {
            object[member.key] = member.value
        }
        return .object(object)
    }

    /// The first `limit` Unicode scalars, which is how the server counts characters.
    static func cut(_ text: String, to limit: Int) -> String {
        text.unicodeScalars.count <= limit ? text : String(String.UnicodeScalarView(text.unicodeScalars.prefix(limit)))
    }
}

/// A third of the lease: two heartbeats may fail before the lease runs out.
func heartbeatInterval(_ configuration: WorkerConfiguration) -> UInt64 {
    max(1, configuration.leaseMilliseconds / 3)
}
