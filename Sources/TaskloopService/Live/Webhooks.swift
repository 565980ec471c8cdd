import Crypto
import DequeModule
import Logging
import TaskloopBytes
import TaskloopEngine
import TaskloopHTTPClient
import TaskloopJSON
import TaskloopStore

/// Webhooks (contract: "Webhooks"): each event the stream numbers becomes a delivery to every
/// enabled webhook it matches, signed as Standard Webhooks 1.0 says and POSTed through the
/// `http` tasks' client (so the same address policy holds).
///
/// Durable like the change it announces: a delivery is written in the same batch as its change
/// (a transactional outbox), so a change that commits cannot lose its deliveries, and one is
/// first attempted only after that commit. Every attempt's outcome is written too, so after a
/// restart pending deliveries resume where their schedule was (at least once: an attempt the
/// crash cut short is made again).
///
/// A receiver that is slow or down holds only its own webhook's slots: at most `maxInFlight`
/// attempts per webhook, each cut at the attempt timeout; the rest wait in order, retries on
/// their schedule. A webhook whose backlog reaches `maxPending` records further events as
/// failed deliveries (`backlog_full`) rather than holding memory without bound. A 410 disables
/// the webhook and gives up its pending deliveries.
///
/// Threading: loop thread only.
final class Webhooks {
    final class Hook {
        fileprivate(set) var record: WebhookRecord
        fileprivate let filter: EventFilter
        fileprivate let url: HTTPURL
        fileprivate let key: SymmetricKey
        /// Unfinished deliveries by id.
        fileprivate(set) var pending: [String: Delivery] = [:]
        /// Ready for an attempt, in event order.
        fileprivate var due = Deque<Delivery>()
        fileprivate var inFlight = 0
        /// Finished deliveries, oldest first.
        fileprivate(set) var finished = Deque<DeliveryRecord>()
        /// Their entries in the log, all told.
        private var finishedEntries = 0

        fileprivate init(record: WebhookRecord, url: HTTPURL, key: [UInt8]) {
            self.record = record
            self.url = url
            self.key = SymmetricKey(data: key)
            filter = EventFilter(workflow: record.workflow.flatMap(TaskID.init), queue: record.queue,
                                 kinds: Set(record.events.compactMap(EventKind.init(rawValue:))))
        }

        fileprivate func addFinished(_ record: DeliveryRecord) {
            finished.append(record)
            finishedEntries += record.logEntries
        }

        fileprivate func removeFinished(id: String) {
            guard let index = finished.firstIndex(where: { $0.id == id }) else { return }
            finishedEntries -= finished.remove(at: index).logEntries
        }

        /// Drops the oldest entries of the finished deliveries until at most `limit` are left:
        /// the oldest delivery's earliest attempts, then the delivery itself. Returns the
        /// deliveries gone and those that lost attempts.
        fileprivate func trimFinished(toEntries limit: Int) -> (gone: [String], shortened: [DeliveryRecord]) {
            let (gone, shortened) = finished.trimLog(entries: &finishedEntries, to: limit)
            return (gone, shortened.map { [$0] } ?? [])
        }
    }

    final class Delivery {
        fileprivate(set) var record: DeliveryRecord
        /// The store batch whose commit releases it (0: nothing to wait for).
        fileprivate let batch: Int
        fileprivate var retry: ScheduledAction?
        fileprivate var transfer: HTTPTransfer?
        fileprivate var deadline: ScheduledAction?

        fileprivate init(_ record: DeliveryRecord, batch: Int) {
            self.record = record
            self.batch = batch
        }

        fileprivate func stop() {
            retry?.cancel()
            retry = nil
            deadline?.cancel()
            deadline = nil
            transfer?.cancel()
            transfer = nil
        }
    }

    private let client: HTTPClient
    private let scheduler: EngineScheduler
    private let settings: WebhookSettings
    private let logger: Logger
    /// With a store: deliveries are written through it and wait for their batch to commit.
    private let durable: WebhookJournal?
    private(set) var hooks: [String: Hook] = [:]
    /// New deliveries in the order they were made, until their batch commits.
    private var awaitingCommit = Deque<Delivery>()
    private var randomBytes = RandomBytes()
    /// Attempts by outcome, for the metrics.
    private(set) var attempts: [String: Int] = ["delivered": 0, "failed": 0, "retrying": 0]

    init(client: HTTPClient, scheduler: EngineScheduler, settings: WebhookSettings, durable: WebhookJournal?, logger: Logger) {
        self.client = client
        self.scheduler = scheduler
        self.settings = settings
        self.durable = durable
        self.logger = logger
    }

    /// Deliveries not yet finished, across webhooks.
    var pendingCount: Int { hooks.values.reduce(0) { $0 + $1.pending.count } }

    // MARK: webhooks

    enum CreationError: Error {
        case tooMany
    }

    /// A new webhook and its secret; written in the batch of this turn.
    func create(url: HTTPURL, events: [EventKind], queue: String?, workflow: TaskID?) throws(CreationError) -> Hook {
        guard hooks.count < settings.maxWebhooks else { throw .tooMany }
        let key = Array(randomBytes.take(32))
        let record = WebhookRecord(
            id: "wh_" + Hex.encode(randomBytes.take(12)), url: url.text, events: events.map(\.rawValue), queue: queue,
            workflow: workflow?.description, enabled: true, createdAt: scheduler.wallClock, secret: "whsec_" + Base64.encode(key))
        let hook = Hook(record: record, url: url, key: key)
        hooks[record.id] = hook
        durable?.record(record)
        return hook
    }

    /// Oldest first.
    var all: [Hook] {
        hooks.values.sorted { ($0.record.createdAt, $0.record.id) < ($1.record.createdAt, $1.record.id) }
    }

    /// Ends its attempts and forgets it, its deliveries with it.
    func delete(_ id: String) -> Bool {
        guard let hook = hooks.removeValue(forKey: id) else { return false }
        for delivery in hook.pending.values { delivery.stop() }
        durable?.delete(webhook: id)
        return true
    }

    /// Its log, newest event first and an event's attempts newest first: an entry per attempt,
    /// each with the delivery's state as that attempt left it (`pending` before a retry), and one
    /// for a delivery not yet attempted.
    func deliveryLog(of hook: Hook, limit: Int) -> [DeliveryRecord] {
        Self.log(of: hook.pending.values.map(\.record) + hook.finished, limit: limit)
    }

    /// What a log bounded to `limit` entries of finished deliveries keeps of `all`, as
    /// `trimFinished` leaves it: the oldest delivery's earliest attempts leave first, then the
    /// delivery. Pending ones are all kept.
    static func bounded(_ all: [DeliveryRecord], finishedEntries limit: Int) -> [DeliveryRecord] {
        var finished = all.filter { $0.state != .pending }.sorted { ($0.eventSeq, $0.id) < ($1.eventSeq, $1.id) }
        var entries = finished.reduce(0) { $0 + $1.logEntries }
        finished.trimLog(entries: &entries, to: limit)
        return all.filter { $0.state == .pending } + finished
    }

    /// The log of these deliveries of one webhook, as `deliveryLog` gives it.
    static func log(of all: [DeliveryRecord], limit: Int) -> [DeliveryRecord] {
        var entries: [DeliveryRecord] = []
        for record in all.sorted(by: { ($0.eventSeq, $0.id) > ($1.eventSeq, $1.id) }) {
            var entry = record
            entry.earlierAttempts = []
            entries.append(entry)
            for earlier in record.earlierAttempts.reversed() {
                entry.attempt = earlier.number
                entry.state = .pending
                entry.statusCode = earlier.statusCode
                entry.error = earlier.error
                entry.durationMilliseconds = earlier.durationMilliseconds
                entry.attemptedAt = earlier.attemptedAt
                entry.nextAttemptAt = earlier.nextAttemptAt
                entries.append(entry)
            }
            if entries.count >= limit { break }
        }
        return Array(entries.prefix(limit))
    }

    // MARK: events

    /// A numbered event: a delivery for each enabled webhook it matches.
    func numbered(_ event: StreamEvent) {
        guard !hooks.isEmpty else { return }
        var body: [UInt8]?
        for hook in hooks.values where hook.record.enabled && hook.filter.matches(event) {
            let payload = body ?? Self.payload(of: event)
            body = payload
            var record = DeliveryRecord(id: "msg_" + Hex.encode(randomBytes.take(12)), webhook: hook.record.id,
                                        eventSeq: event.seq, type: event.kind.rawValue, body: payload,
                                        nextAttemptAt: scheduler.wallClock)
            guard hook.pending.count < settings.maxPending else {
                record.state = DeliveryState.failed
                record.error = "backlog_full: \(settings.maxPending) deliveries to this webhook are unfinished "
                    + "(--webhook-max-pending); this event was not sent."
                finish(record, of: hook)
                continue
            }
            durable?.record(record)
            let batch = durable?.pendingBatch ?? 0
            let delivery = Delivery(record, batch: batch)
            hook.pending[record.id] = delivery
            if batch == 0 {
                hook.due.append(delivery)
                pump(hook)
            } else {
                awaitingCommit.append(delivery)
            }
        }
    }

    /// Store batch `number` and all before it have committed: their deliveries may go.
    func committed(through number: Int) {
        var touched: [Hook] = []
        while let delivery = awaitingCommit.first, delivery.batch <= number {
            awaitingCommit.removeFirst()
            guard let hook = hooks[delivery.record.webhook], hook.pending[delivery.record.id] === delivery else { continue }
            hook.due.append(delivery)
            if !touched.contains(where: { $0 === hook }) { touched.append(hook) }
        }
        for hook in touched { pump(hook) }
    }

    /// `{type, timestamp, data}`, `data` as the event stream's.
    static func payload(of event: StreamEvent) -> [UInt8] {
        var body = Array(#"{"type":""#.utf8)
        body += event.kind.rawValue.utf8
        body += #"","timestamp":""#.utf8
        body += Representation.rfc3339(event.time).utf8
        body += #"","data":"#.utf8
        body += event.data
        body.append(UInt8(ascii: "}"))
        return body
    }

    // MARK: attempts

    private func pump(_ hook: Hook) {
        while hook.inFlight < settings.maxInFlight, let delivery = hook.due.popFirst() {
            attempt(delivery, of: hook)
        }
    }

    /// `v1,<base64 HMAC-SHA256(key, id.timestamp.body)>`.
    static func signature(id: String, timestamp: Int64, body: [UInt8], key: SymmetricKey) -> String {
        var signed = HMAC<SHA256>(key: key)
        signed.update(data: Array("\(id).\(timestamp).".utf8))
        signed.update(data: body)
        return "v1," + Base64.encode(Array(signed.finalize()))
    }

    private func attempt(_ delivery: Delivery, of hook: Hook) {
        hook.inFlight += 1
        let started = scheduler.now
        let id = delivery.record.id
        let timestamp = scheduler.wallClock / 1_000
        var request = HTTPClientRequest(method: "POST", url: hook.url, headers: [
            HTTPHeaderField("Content-Type", "application/json"),
            HTTPHeaderField("User-Agent", "Taskloop-Webhooks"),
            HTTPHeaderField("webhook-id", id),
            HTTPHeaderField("webhook-timestamp", String(timestamp)),
            HTTPHeaderField("webhook-signature", Self.signature(id: id, timestamp: timestamp, body: delivery.record.body,
                                                                key: hook.key)),
        ], body: delivery.record.body)
        // A redirect is an answer: the receiver's address is the one it was given.
        request.followRedirects = false
        request.maxKeptBodyBytes = 0
        request.connectTimeoutMilliseconds = settings.attemptTimeoutMilliseconds
        do {
            delivery.transfer = try client.start(request, onProgress: { _, _ in }) { [weak self, unowned delivery] result in
                guard let self else { return }
                switch result {
                case .success(let response): attempted(delivery, of: hook, started: started, status: response.status, error: nil)
                case .failure(let error): attempted(delivery, of: hook, started: started, status: nil, error: error.description)
                }
            }
        } catch {
            return attempted(delivery, of: hook, started: started, status: nil, error: error.description)
        }
        delivery.deadline = scheduler.schedule(after: settings.attemptTimeoutMilliseconds) { [weak self, unowned delivery] in
            delivery.transfer?.cancel()
            self?.attempted(delivery, of: hook, started: started, status: nil,
                            error: "timeout: no answer within \(self?.settings.attemptTimeoutMilliseconds ?? 0) ms")
        }
    }

    private func attempted(_ delivery: Delivery, of hook: Hook, started: UInt64, status: Int?, error: String?) {
        delivery.transfer = nil
        delivery.deadline?.cancel()
        delivery.deadline = nil
        hook.inFlight -= 1
        // Deleted meanwhile: its attempts were cancelled, and nothing of it is written again.
        guard hooks[hook.record.id] === hook else { return }
        var record = delivery.record
        if let last = record.lastAttempt { record.earlierAttempts.append(last) }
        record.attempt += 1
        record.statusCode = status
        record.error = error
        record.durationMilliseconds = Int64(scheduler.now &- started)
        record.attemptedAt = scheduler.wallClock
        if let status, (200...299).contains(status) {
            record.state = .delivered
            finish(record, of: hook)
        } else if status == 410 {
            record.state = .failed
            finish(record, of: hook)
            disable(hook)
        } else if !hook.record.enabled || record.attempt > settings.retrySchedule.count {
            record.state = .failed
            if !hook.record.enabled { record.error = (error ?? "status \(status ?? 0)") + "; the webhook is disabled." }
            finish(record, of: hook)
        } else {
            let wait = settings.retrySchedule[record.attempt - 1]
            record.nextAttemptAt = record.attemptedAt! + Int64(wait)
            attempts["retrying", default: 0] += 1
            delivery.record = record
            durable?.record(record)
            retry(delivery, of: hook, after: wait)
        }
        pump(hook)
    }

    /// Back in its webhook's line after `wait` ms.
    private func retry(_ delivery: Delivery, of hook: Hook, after wait: UInt64) {
        delivery.retry = scheduler.schedule(after: wait) { [weak self, unowned delivery] in
            delivery.retry = nil
            hook.due.append(delivery)
            self?.pump(hook)
        }
    }

    /// Delivered or given up (counted by that outcome): into the log.
    private func finish(_ record: DeliveryRecord, of hook: Hook) {
        var record = record
        record.body = []
        record.nextAttemptAt = nil
        attempts[record.state.rawValue, default: 0] += 1
        hook.pending.removeValue(forKey: record.id)
        hook.addFinished(record)
        durable?.record(record)
        trimLog(of: hook)
    }

    /// The log keeps the newest `deliveryLog` entries of finished deliveries; older ones leave
    /// the store too. (A pending delivery's attempts are bounded by the retry schedule.)
    private func trimLog(of hook: Hook) {
        let (pushedOut, shortened) = hook.trimFinished(toEntries: settings.deliveryLog)
        for record in shortened { durable?.record(record) }
        if !pushedOut.isEmpty { durable?.delete(deliveries: pushedOut) }
    }

    /// The receiver answered 410 Gone: no more deliveries; those waiting are given up.
    private func disable(_ hook: Hook) {
        guard hook.record.enabled else { return }
        hook.record.enabled = false
        durable?.record(hook.record)
        logger.warning("webhook disabled: its receiver answered 410 Gone", metadata: ["webhook": "\(hook.record.id)"])
        giveUpPending(of: hook, error: "webhook_disabled: the receiver answered 410 Gone to another delivery.")
    }

    /// Its waiting deliveries fail with `error` (those in flight end by their answer).
    private func giveUpPending(of hook: Hook, error: String) {
        hook.due.removeAll()
        for delivery in hook.pending.values where delivery.transfer == nil {
            delivery.stop()
            var record = delivery.record
            record.state = .failed
            record.error = error
            finish(record, of: hook)
        }
    }

    // MARK: restart and shutdown

    /// What the store kept: webhooks, and their deliveries, pending ones resuming on their
    /// schedule (at once when it is past).
    func restore(_ webhooks: [WebhookRecord], _ deliveries: [DeliveryRecord]) {
        for record in webhooks { adopt(record) }
        for record in deliveries {
            guard let hook = hooks[record.webhook] else { continue }
            guard record.state == .pending else {
                hook.addFinished(record)
                continue
            }
            resume(record, of: hook)
        }
        for hook in hooks.values {
            trimLog(of: hook)
            pump(hook)
        }
    }

    /// A webhook record as kept; false when it cannot be used (a damaged row).
    @discardableResult
    private func adopt(_ record: WebhookRecord) -> Bool {
        guard let url = try? HTTPURL(record.url), record.secret.hasPrefix("whsec_"),
              let key = Base64.decode(String(record.secret.dropFirst(6))) else {
            logger.error("a stored webhook cannot be used and is skipped", metadata: ["webhook": "\(record.id)"])
            return false
        }
        hooks[record.id] = Hook(record: record, url: url, key: key)
        return true
    }

    /// A pending delivery this replica attempts, on its schedule.
    private func resume(_ record: DeliveryRecord, of hook: Hook) {
        let delivery = Delivery(record, batch: 0)
        hook.pending[record.id] = delivery
        let wait = (record.nextAttemptAt ?? scheduler.wallClock) - scheduler.wallClock
        if wait <= 0 { hook.due.append(delivery) } else { retry(delivery, of: hook, after: UInt64(wait)) }
    }

    // MARK: cells

    /// With cells: the webhooks as the cluster's table holds them now. New ones are adopted,
    /// those gone end their attempts, and one disabled elsewhere gives up what waits here.
    func sync(_ records: [WebhookRecord]) {
        let kept = Set(records.map(\.id))
        for (id, hook) in hooks where !kept.contains(id) {
            hooks.removeValue(forKey: id)
            for delivery in hook.pending.values { delivery.stop() }
        }
        for record in records {
            guard let hook = hooks[record.id] else {
                adopt(record)
                continue
            }
            let disabled = hook.record.enabled && !record.enabled
            hook.record = record
            if disabled { giveUpPending(of: hook, error: "webhook_disabled: the receiver answered 410 Gone to another delivery.") }
        }
    }

    /// With cells: the deliveries a cell's commits kept, as its new owner finds them. Pending
    /// ones resume on their schedule; those this replica already has are left as they are (a
    /// commit of this replica may have written them after the read began).
    func resume(_ deliveries: [DeliveryRecord]) {
        var touched: [Hook] = []
        for record in deliveries {
            guard let hook = hooks[record.webhook], hook.pending[record.id] == nil,
                  !hook.finished.contains(where: { $0.id == record.id }) else { continue }
            if record.state == .pending { resume(record, of: hook) } else { hook.addFinished(record) }
            if !touched.contains(where: { $0 === hook }) { touched.append(hook) }
        }
        for hook in touched {
            trimLog(of: hook)
            pump(hook)
        }
    }

    /// With cells: these deliveries are no longer this replica's (their cell closed here, or
    /// the commit that made them failed): their attempts stop, and nothing of them is written.
    func drop(_ ids: Set<String>) {
        guard !ids.isEmpty else { return }
        for hook in hooks.values {
            for id in ids {
                guard let delivery = hook.pending.removeValue(forKey: id) else { continue }
                // A cancelled transfer never completes: its slot is given back here.
                if delivery.transfer != nil { hook.inFlight -= 1 }
                delivery.stop()
            }
            hook.due.removeAll { ids.contains($0.record.id) }
            for id in ids where hook.finished.contains(where: { $0.id == id }) { hook.removeFinished(id: id) }
        }
        awaitingCommit.removeAll { ids.contains($0.record.id) }
    }

    /// Ends every attempt and timer; what was pending stays so in the store, for the next start.
    func close() {
        for hook in hooks.values {
            for delivery in hook.pending.values { delivery.stop() }
            hook.due.removeAll()
        }
        awaitingCommit.removeAll()
    }
}

extension RangeReplaceableCollection where Self: MutableCollection, Element == DeliveryRecord {
    /// Drops log entries of these finished deliveries, oldest first, until `entries` (their
    /// count, kept up to date) is at most `limit`: the oldest delivery's earliest attempts,
    /// then the delivery itself. Returns the deliveries gone and the one left shorter, if any.
    @discardableResult
    mutating func trimLog(entries: inout Int, to limit: Int) -> (gone: [String], shortened: DeliveryRecord?) {
        var gone: [String] = []
        var shortened: DeliveryRecord?
        var index = startIndex
        while entries > limit, index != endIndex {
            let excess = entries - limit
            if excess < self[index].logEntries {
                self[index].earlierAttempts.removeFirst(excess)
                entries -= excess
                shortened = self[index]
            } else {
                entries -= self[index].logEntries
                gone.append(self[index].id)
                index = self.index(after: index)
            }
        }
        removeFirst(gone.count)
        return (gone, shortened)
    }
}
