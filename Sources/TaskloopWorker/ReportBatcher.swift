import Logging
import TaskloopClient
import TaskloopEngine
import TaskloopJSON

/// Carries the worker's reports to the server in batches, through `POST /tasks/reports`: a
/// finished task's completion or failure, and a running task's progress. A report waits at
/// most `--report-linger-ms` for others, or until `--max-report-batch` are waiting, and a
/// batch's answers are handed to each task as its single route's answer would be
/// (`LeasedTask.batchItemAnswered`), so a 409 item is a lost lease exactly as a 409 call is.
///
/// A batch names a task once (the server refuses a second item about it, 422 `duplicate_id`):
/// a task has at most one progress report out at once (waiting here counts), and its progress
/// is left out of a batch once the task has finished (the outcome supersedes it), so progress
/// and outcome never share one; an outcome whose task's progress is in a batch already out
/// goes in a later batch. Outcomes go first into a batch, and one call is always kept for
/// them: however much progress there is, it never makes an outcome wait past its linger for
/// a call.
///
/// At most `maxCallsInFlight` batches are out at once (sent, or waiting to be sent again):
/// enough that every slot's outcome and progress can be on their way together, and at least
/// two, so that a full batch does not wait for the last one's commit; no more, so that an
/// outage costs that many calls retrying, not one per task. Reports that find them all out
/// leave when one comes back: they have waited longer than the linger already.
///
/// A batch the server cannot take as a whole for want of an answer (connection, 408, 429, 5xx,
/// 401) is sent again with backoff, with the same tasks (a task's progress as the latest it has
/// then, and left out if the task has finished since); its tasks are in that batch and nowhere
/// else until it is answered, so no report is lost or sent twice. An item that is unavailable
/// (a 503 for one cell) comes back here through the task's own backoff. A server without the
/// route (404 or 405 for the whole call, an older server) is said once, and from then on each
/// task reports on its own routes. A batch too large for the server (413, 422
/// `too_many_items`) is sent in halves, and later batches are no larger than the half; any
/// other refusal of the whole call is logged and its reports are sent one by one, so each gets
/// the answer its own route gives.
///
/// Stopping: reports leave at once (no linger), and what is out when the worker gives up is
/// cancelled with it.
///
/// Threading: loop thread only, like the worker that owns it.
final class ReportBatcher {
    /// What an item says about its task.
    enum Report {
        /// The task's latest progress (`progress: {fraction, message, details}`).
        case progress
        /// Its completion or failure.
        case outcome
    }

    private struct Item {
        let task: LeasedTask
        let report: Report
    }

    /// The reports of one call, and its retries.
    private final class Batch {
        var items: [Item]
        var call: ServerCall?
        var retry: ScheduledAction?
        var backoff: Backoff

        init(items: [Item], maxBackoffMilliseconds: UInt64) {
            self.items = items
            backoff = Backoff(maximumMilliseconds: maxBackoffMilliseconds)
        }
    }

    private unowned let worker: TaskloopWorker
    private let lingerMilliseconds: UInt64
    /// Most reports in one call: `--max-report-batch`, halved when the server says it takes
    /// fewer.
    private var limit: Int
    private let maxCallsInFlight: Int
    private var waitingOutcomes: [LeasedTask] = []
    /// Tasks whose progress waits; one whose task has finished since is skipped.
    private var waitingProgress: [LeasedTask] = []
    private var lingerTimer: ScheduledAction?
    private var out: [Batch] = []
    /// Reports wait although their linger is over, because every call they may take is out.
    private var overdue = false
    /// The server has no `POST /tasks/reports`, or the worker was told to report one by one.
    private var unsupported: Bool

    init(worker: TaskloopWorker, configuration: WorkerConfiguration) {
        self.worker = worker
        lingerMilliseconds = configuration.reportLingerMilliseconds
        limit = max(1, configuration.maxReportBatch)
        unsupported = configuration.maxReportBatch <= 1
        // Each slot may have an outcome and a progress report out.
        maxCallsInFlight = max(2, (2 * configuration.concurrency + limit - 1) / limit)
    }

    /// Whether completions, failures and progress go in batches; otherwise each takes its own
    /// route.
    var batching: Bool { !unsupported }

    private var logger: Logger { worker.logger }

    /// A report of `task` for the next batch: its outcome, or its progress (the latest it has
    /// when the batch leaves).
    func enqueue(_ task: LeasedTask, _ report: Report) {
        switch report {
        case .outcome: waitingOutcomes.append(task)
        case .progress: waitingProgress.append(task)
        }
        if waitingOutcomes.count + waitingProgress.count >= limit || lingerMilliseconds == 0 || worker.isStopping {
            return flush()
        }
        // While progress alone is overdue, the call kept for outcomes may be free.
        if lingerTimer == nil && (!overdue || report == .outcome) {
            lingerTimer = worker.scheduler.schedule(after: lingerMilliseconds) { [unowned self] in
                lingerTimer = nil
                flush()
            }
        }
    }

    /// Sends what waits, as far as the calls in flight allow: outcomes first, progress with
    /// them or in calls of its own, all but one.
    func flush() {
        lingerTimer?.cancel()
        lingerTimer = nil
        while out.count < maxCallsInFlight {
            let outcomes = min(limit, waitingOutcomes.count)
            var items = waitingOutcomes.prefix(outcomes).map { Item(task: $0, report: .outcome) }
            waitingOutcomes.removeFirst(outcomes)
            if out.count < maxCallsInFlight - 1 || !items.isEmpty {
                var taken = 0
                while taken < waitingProgress.count && items.count < limit {
                    let task = waitingProgress[taken]
                    taken += 1
                    if task.hasProgressToReport { items.append(Item(task: task, report: .progress)) }
                }
                waitingProgress.removeFirst(taken)
            }
            guard !items.isEmpty else { break }
            let batch = Batch(items: items, maxBackoffMilliseconds: worker.configuration.maxBackoffMilliseconds)
            out.append(batch)
            send(batch)
        }
        overdue = !waitingOutcomes.isEmpty || !waitingProgress.isEmpty
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
        waitingOutcomes.removeAll()
        waitingProgress.removeAll()
        overdue = false
    }

    private func send(_ batch: Batch) {
        batch.retry = nil
        var reports: [JSONValue] = []
        reports.reserveCapacity(batch.items.count)
        batch.items.removeAll { item in
            guard let report = item.task.batchItem(item.report) else { return true }
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
            guard let results = document.objectValue?["results"]?.arrayValue, results.count == batch.items.count else {
                logger.warning("the server answered a batch of \(batch.items.count) reports without a result for each; sending it again")
                return retry(batch)
            }
            done(batch)
            for (item, result) in zip(batch.items, results) {
                let fields = result.objectValue
                let status = fields?["status"]?.intValue.map { Int(clamping: $0) } ?? 0
                item.task.batchItemAnswered(item.report, ServerAPI.answer(status: status, document: fields?["task"] ?? fields?["problem"]))
            }
        case .conflict(404, _, _), .refused(405, _, _):
            if !unsupported {
                unsupported = true
                logger.warning("the server has no POST /tasks/reports (an older server); reporting each task on its own routes")
            }
            let rest = waitingOutcomes.map { Item(task: $0, report: .outcome) }
                + waitingProgress.map { Item(task: $0, report: .progress) }
            waitingOutcomes.removeAll()
            waitingProgress.removeAll()
            overdue = false
            lingerTimer?.cancel()
            lingerTimer = nil
            done(batch)
            for item in batch.items + rest { item.task.sendAlone(item.report) }
        case .refused(413, _, _) where batch.items.count > 1, .refused(422, "too_many_items", _) where batch.items.count > 1:
            let half = batch.items.count / 2
            if half < limit {
                limit = half
                logger.warning("the server refused a batch of \(batch.items.count) reports as too large (\(answer)); sending at most \(half) at once")
            }
            done(batch)
            waitingOutcomes.insert(contentsOf: batch.items.filter { $0.report == .outcome }.map(\.task), at: 0)
            waitingProgress.insert(contentsOf: batch.items.filter { $0.report == .progress }.map(\.task), at: 0)
            flush()
        case .conflict(let status, let code, let detail), .refused(let status, let code, let detail):
            logger.error("the server refused a batch of \(batch.items.count) reports (\(status) \(code ?? "")): \(detail); sending them one by one")
            done(batch)
            for item in batch.items { item.task.sendAlone(item.report) }
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
