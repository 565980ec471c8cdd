import Logging
import TaskloopClient
import TaskloopEngine
import TaskloopJSON

/// Carries the worker's completions and failures to the server in batches, through
/// `POST /tasks/reports`: a finished task's report waits at most `--report-linger-ms` for
/// others, or until `--max-report-batch` are waiting, and a batch's answers are handed to each
/// task as its single route's answer would be (`LeasedTask.outcomeAnswered`), so a 409 item
/// is a lost lease exactly as a 409 call is.
///
/// At most `maxCallsInFlight` batches are out at once (sent, or waiting to be sent again):
/// enough that every slot's report can be on its way together, and at least two, so that a
/// full batch does not wait for the last one's commit; no more, so that an outage costs that
/// many calls retrying, not one per task. Reports that find them all out leave when one comes
/// back: they have waited longer than the linger already.
///
/// A batch the server cannot take as a whole for want of an answer (connection, 408, 429, 5xx,
/// 401) is sent again, as it is, with backoff; its tasks are in that batch and nowhere else
/// until it is answered, so no report is lost or sent twice. An item that is unavailable (a
/// 503 for one cell) comes back here through the task's own backoff. A server without the
/// route (404 or 405 for the whole call, an older server) is said once, and from then on each
/// task reports on its own route. A batch too large for the server (413, 422
/// `too_many_items`) is sent in halves, and later batches are no larger than the half; any
/// other refusal of the whole call is logged and its reports are sent one by one, so each gets
/// the answer its own route gives.
///
/// Stopping: reports leave at once (no linger), and what is out when the worker gives up is
/// cancelled with it.
///
/// Threading: loop thread only, like the worker that owns it.
final class ReportBatcher {
    /// The reports of one call, and its retries.
    private final class Batch {
        var tasks: [LeasedTask]
        var call: ServerCall?
        var retry: ScheduledAction?
        var backoff: Backoff

        init(tasks: [LeasedTask], maxBackoffMilliseconds: UInt64) {
            self.tasks = tasks
            backoff = Backoff(maximumMilliseconds: maxBackoffMilliseconds)
        }
    }

    private unowned let worker: TaskloopWorker
    private let lingerMilliseconds: UInt64
    /// Most reports in one call: `--max-report-batch`, halved when the server says it takes
    /// fewer.
    private var limit: Int
    private let maxCallsInFlight: Int
    private var waiting: [LeasedTask] = []
    private var lingerTimer: ScheduledAction?
    private var out: [Batch] = []
    /// Reports wait although their linger is over, because every call is out.
    private var overdue = false
    /// The server has no `POST /tasks/reports`, or the worker was told to report one by one.
    private var unsupported: Bool

    init(worker: TaskloopWorker, configuration: WorkerConfiguration) {
        self.worker = worker
        lingerMilliseconds = configuration.reportLingerMilliseconds
        limit = max(1, configuration.maxReportBatch)
        unsupported = configuration.maxReportBatch <= 1
        maxCallsInFlight = max(2, (configuration.concurrency + limit - 1) / limit)
    }

    /// Whether completions and failures go in batches; otherwise each takes its own route.
    var batching: Bool { !unsupported }

    private var logger: Logger { worker.logger }

    /// A finished task whose report goes in the next batch.
    func enqueue(_ task: LeasedTask) {
        waiting.append(task)
        if waiting.count >= limit || lingerMilliseconds == 0 || worker.isStopping {
            return flush()
        }
        if lingerTimer == nil && !overdue {
            lingerTimer = worker.scheduler.schedule(after: lingerMilliseconds) { [unowned self] in
                lingerTimer = nil
                flush()
            }
        }
    }

    /// Sends what waits, as far as the calls in flight allow.
    func flush() {
        lingerTimer?.cancel()
        lingerTimer = nil
        while !waiting.isEmpty && out.count < maxCallsInFlight {
            let count = min(limit, waiting.count)
            let batch = Batch(tasks: Array(waiting.prefix(count)),
                              maxBackoffMilliseconds: worker.configuration.maxBackoffMilliseconds)
            waiting.removeFirst(count)
            out.append(batch)
            send(batch)
        }
        overdue = !waiting.isEmpty
    }

    /// Cancels every call and timer: nothing more is said (the worker gave up or stopped).
    func close() {
        lingerTimer?.cancel()
        lingerTimer = nil
        for batch in out {
            batch.call?.cancel()
            batch.retry?.cancel()
        }
        out.removeAll()
        waiting.removeAll()
        overdue = false
    }

    private func send(_ batch: Batch) {
        batch.retry = nil
        var reports: [JSONValue] = []
        reports.reserveCapacity(batch.tasks.count)
        batch.tasks.removeAll { task in
            guard !task.silenced, let report = task.batchReport else { return true }
            reports.append(report)
            return false
        }
        guard !reports.isEmpty else { return done(batch) }
        batch.call = worker.api.post("/tasks/reports", ["reports": .array(reports)]) { [unowned self] answer in
            batch.call = nil
            answered(batch, answer)
        }
    }

    private func answered(_ batch: Batch, _ answer: ServerAnswer) {
        switch answer {
        case .success(let document):
            guard let results = document.objectValue?["results"]?.arrayValue, results.count == batch.tasks.count else {
                logger.warning("the server answered a batch of \(batch.tasks.count) reports without a result for each; sending it again")
                return retry(batch)
            }
            done(batch)
            for (task, result) in zip(batch.tasks, results) {
                let item = result.objectValue
                let status = item?["status"]?.intValue.map { Int(clamping: $0) } ?? 0
                task.outcomeAnswered(ServerAPI.answer(status: status, document: item?["task"] ?? item?["problem"]))
            }
        case .conflict(404, _, _), .refused(405, _, _):
            if !unsupported {
                unsupported = true
                logger.warning("the server has no POST /tasks/reports (an older server); reporting each task on its own route")
            }
            done(batch)
            let rest = waiting
            waiting.removeAll()
            overdue = false
            lingerTimer?.cancel()
            lingerTimer = nil
            for task in batch.tasks + rest { task.sendOutcome(alone: true) }
        case .refused(413, _, _) where batch.tasks.count > 1, .refused(422, "too_many_items", _) where batch.tasks.count > 1:
            let half = batch.tasks.count / 2
            if half < limit {
                limit = half
                logger.warning("the server refused a batch of \(batch.tasks.count) reports as too large (\(answer)); sending at most \(half) at once")
            }
            done(batch)
            waiting.insert(contentsOf: batch.tasks, at: 0)
            flush()
        case .conflict(let status, let code, let detail), .refused(let status, let code, let detail):
            logger.error("the server refused a batch of \(batch.tasks.count) reports (\(status) \(code ?? "")): \(detail); sending them one by one")
            done(batch)
            for task in batch.tasks { task.sendOutcome(alone: true) }
        case .unauthorized, .unavailable:
            // ServerAPI has said so.
            retry(batch)
        }
    }

    private func retry(_ batch: Batch) {
        batch.retry = worker.scheduler.schedule(after: batch.backoff.nextDelay()) { [unowned self] in send(batch) }
    }

    /// The batch is answered: its place is free for what waits.
    private func done(_ batch: Batch) {
        out.removeAll { $0 === batch }
        if overdue { flush() }
    }
}
