import Prometheus
import TaskloopCluster
import TaskloopEngine
import TaskloopHTTP

/// What `GET /metrics` shows, through swift-prometheus's registry and text format.
///
/// Every family is declared from the first scrape: its known label values (kinds, final
/// states, routes with the statuses they answer) start at zero, so a fresh server's dashboards
/// show zeros, not gaps; queues get their series as they appear, and lose them when forgotten.
/// Collectors are looked up once per label set and kept here, so recording is a dictionary hit
/// and an atomic add, not a registry lookup. Gauges of current state (tasks by queue and state,
/// open connections) are read from the engine and the server when scraped.
///
/// Threading: loop thread only (the collectors themselves are thread-safe).
final class ServiceMetrics {
    private let registry = PrometheusCollectorRegistry()
    private var submitted: [String: Counter] = [:]
    private var finished: [LabelPair: Counter] = [:]
    private var runTime: [String: ValueHistogram] = [:]
    /// The collectors of the kind used last: tasks come in runs of one kind, and a string
    /// compare spares three hash lookups per task.
    private var lastKind: KindCollectors?
    private var requests: [RequestKey: Counter] = [:]
    private var latency: [String: ValueHistogram] = [:]
    /// Each route's collectors, by the route's index: a request's are found without hashing.
    private var routeCollectors: [RouteCollectors] = []
    private var taskGauges: [String: [Gauge]] = [:]
    private let openConnections: Gauge
    private let waiting: Gauge
    private let transfers: Gauge
    private let eventStreams: Gauge
    private let eventStreamsDisconnected: Counter
    private var eventStreamsDisconnectedCounted = 0
    private let webhookPending: Gauge
    /// Attempts by outcome, and how many of them the counter has been told.
    private var webhookAttempts: [String: (counter: Counter, counted: Int)] = [:]
    private let droppedLogLines: Counter
    /// Schedules' runs made, slots missed and slots skipped, as counted at the last scrape.
    private var scheduleRuns: [(counter: Counter, counted: UInt64)] = []
    private var droppedLogLinesCounted = 0
    private var leaseCollectors: [String: LeaseCollectors] = [:]
    /// Rate-limited queues' starts that waited for a token, and how many the counter was told.
    private var rateDelayed: [String: (counter: Counter, counted: Int)] = [:]
    private let leaseLatency: ValueHistogram
    /// Items of `POST /tasks/batch` and `POST /tasks/reports` by route and item status (the
    /// request itself is counted as every request is, by its 207).
    private var batchItems: [RequestKey: Counter] = [:]
    /// Two label values (kind and state): a struct, not a joined string, so a lookup on the
    /// per-task path allocates nothing.
    private struct LabelPair: Hashable {
        let first: String
        let state: TaskState
    }

    private struct RequestKey: Hashable {
        let route: String
        let method: HTTPMethod
        let status: Int
    }

    private final class KindCollectors {
        let kind: String
        let submitted: Counter
        /// By terminal state: succeeded, failed, cancelled.
        let finished: [Counter]
        let runTime: ValueHistogram
        init(kind: String, submitted: Counter, finished: [Counter], runTime: ValueHistogram) {
            self.kind = kind
            self.submitted = submitted
            self.finished = finished
            self.runTime = runTime
        }
    }

    /// A worker queue's lease series; the engine keeps the totals, each scrape adds what is new.
    private final class LeaseCollectors {
        let granted: Counter, expired: Counter, released: Counter, poisoned: Counter
        let waiting: Gauge
        var counted = LeaseCounts()
        init(granted: Counter, expired: Counter, released: Counter, poisoned: Counter, waiting: Gauge) {
            self.granted = granted
            self.expired = expired
            self.released = released
            self.poisoned = poisoned
            self.waiting = waiting
        }
    }

    private final class RouteCollectors {
        let latency: ValueHistogram
        /// A route answers a handful of statuses; a scan beats hashing them.
        var counters: [(method: HTTPMethod, status: Int, counter: Counter)] = []
        init(latency: ValueHistogram) { self.latency = latency }
    }

    static let unmatchedRoute = "unmatched"

    private static let runTimeBuckets: [Double] = [0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 30, 120, 600, 3_600]
    private static let latencyBuckets: [Double] = [0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25, 1, 10, 60]

    init(kinds: [String], routes: [Route]) {
        openConnections = registry.makeGauge(descriptor: Self.name("http_open_connections", "", "Client connections open now."))
        waiting = registry.makeGauge(descriptor: Self.name("http_long_polls", "", "GET /tasks/{id}?wait= requests waiting now."))
        transfers = registry.makeGauge(descriptor: Self.name("http_task_transfers", "", "Requests of http tasks in flight now."))
        eventStreams = registry.makeGauge(descriptor: Self.name("event_streams", "", "Event streams (GET /events, GET /tasks/{id}/events) open now."))
        eventStreamsDisconnected = registry.makeCounter(descriptor: Self.name(
            "event_streams_disconnected", "total",
            "Event streams disconnected because their reader fell behind (--event-client-buffer-bytes); each resumes with Last-Event-ID."))
        webhookPending = registry.makeGauge(descriptor: Self.name(
            "webhook_deliveries_pending", "", "Webhook deliveries not yet delivered or given up."))
        for outcome in ["delivered", "failed", "retrying"] {
            webhookAttempts[outcome] = (registry.makeCounter(
                descriptor: Self.name("webhook_attempts", "total",
                                      "Webhook delivery attempts (and deliveries given up unsent) by outcome."),
                labels: [("outcome", outcome)]), 0)
        }
        droppedLogLines = registry.makeCounter(descriptor: Self.name(
            "log_lines_dropped", "total", "Log lines dropped because standard error's reader was too slow."))
        leaseLatency = registry.makeValueHistogram(
            descriptor: Self.name("lease_latency", "seconds", "Time from a lease call's arrival to its answer with tasks."),
            buckets: Self.latencyBuckets)
        for (name, help) in [
            ("schedule_runs_fired", "Runs schedules made: slots fired, catch-up runs and triggers."),
            ("schedule_runs_missed", "Schedule slots passed unseen (server down, clock jumped) that catchup did not run."),
            ("schedule_runs_skipped", "Schedule slots skipped because the previous run had not finished (overlap skip), or whose run was refused."),
        ] {
            scheduleRuns.append((registry.makeCounter(descriptor: Self.name(name, "total", help)), 0))
        }
        for kind in kinds {
            _ = submittedCounter(kind)
            _ = runTimeHistogram(kind)
            for state in TaskState.allCases where state.isTerminal { _ = finishedCounter(kind, state) }
        }
        for route in routes {
            let collectors = RouteCollectors(latency: latencyHistogram(route.pattern))
            for status in route.answers {
                collectors.counters.append((route.method, status, requestCounter(RequestKey(route: route.pattern, method: route.method, status: status))))
            }
            routeCollectors.append(collectors)
        }
    }

    /// The series of a replica on a cluster (`--database-url`).
    func cellSeries() {
        guard cells == nil else { return }
        cells = CellCollectors(
            served: registry.makeGauge(descriptor: Self.name("cells_served", "", "Cells whose engines serve on this replica now.")),
            commits: registry.makeCounter(descriptor: Self.name("cell_commits", "total", "Commits of this replica's cells.")),
            failedCommits: registry.makeCounter(descriptor: Self.name(
                "cell_commits_failed", "total", "Commits of this replica's cells that did not commit (the cell loaded again, or moved).")),
            forwarded: registry.makeCounter(descriptor: Self.name(
                "requests_forwarded", "total", "Requests forwarded to the replica that owns their cell.")),
            databaseUp: registry.makeGauge(descriptor: Self.name(
                "replica_database_up", "", "1 while this replica's lease in the database is renewed, 0 while it cannot reach it.")))
    }

    /// The items of one batch request answered here, by their statuses.
    func batchItemsAnswered(route: Route, outcomes: [TaskloopApplication.BatchItemOutcome]) {
        // Counted by runs of one status: a batch's items nearly all share one.
        var start = 0
        while start < outcomes.count {
            let status = outcomes[start].status
            var end = start + 1
            while end < outcomes.count && outcomes[end].status == status { end += 1 }
            batchItemCounter(route: route, status: status).increment(by: Int64(end - start))
            start = end
        }
    }

    private func batchItemCounter(route: Route, status: Int) -> Counter {
        let key = RequestKey(route: route.pattern, method: route.method, status: status)
        if let counter = batchItems[key] { return counter }
        let counter = registry.makeCounter(descriptor: Self.name("batch_items", "total", "Items of batch requests by route and item status."),
                                           labels: [("route", route.pattern), ("status", String(status))])
        batchItems[key] = counter
        return counter
    }

    /// A request went to its cell's owner.
    func requestForwarded() {
        cells?.forwarded.increment()
    }

    /// A turn of this replica committed after `seconds`.
    final class CellCollectors {
        let served: Gauge
        let commits: Counter
        let failedCommits: Counter
        let forwarded: Counter
        let databaseUp: Gauge
        var counted = (commits: 0, failed: 0)

        init(served: Gauge, commits: Counter, failedCommits: Counter, forwarded: Counter, databaseUp: Gauge) {
            self.served = served
            self.commits = commits
            self.failedCommits = failedCommits
            self.forwarded = forwarded
            self.databaseUp = databaseUp
        }
    }

    private var cells: CellCollectors?

    private static func name(_ metric: String, _ unit: String, _ help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(namespace: "taskloop", metricName: metric, unitName: unit, helpText: help)
    }

    /// The collector kept under `key`, made (and registered) on first use.
    private static func collector<Key: Hashable, Collector>(
        _ key: Key, in table: inout [Key: Collector], make: () -> Collector
    ) -> Collector {
        if let collector = table[key] { return collector }
        let collector = make()
        table[key] = collector
        return collector
    }

    private func submittedCounter(_ kind: String) -> Counter {
        Self.collector(kind, in: &submitted) {
            registry.makeCounter(descriptor: Self.name("tasks_submitted", "total", "Tasks accepted, by kind."),
                                 labels: [("kind", kind)])
        }
    }

    private func finishedCounter(_ kind: String, _ state: TaskState) -> Counter {
        Self.collector(LabelPair(first: kind, state: state), in: &finished) {
            registry.makeCounter(
                descriptor: Self.name("tasks_finished", "total", "Tasks that reached a terminal state, by kind and state."),
                labels: [("kind", kind), ("state", state.rawValue)])
        }
    }

    private func runTimeHistogram(_ kind: String) -> ValueHistogram {
        Self.collector(kind, in: &runTime) {
            registry.makeValueHistogram(
                descriptor: Self.name("task_run", "seconds", "Time from a task's first start to its end, by kind."),
                labels: [("kind", kind)], buckets: Self.runTimeBuckets)
        }
    }

    private func requestCounter(_ key: RequestKey) -> Counter {
        Self.collector(key, in: &requests) {
            registry.makeCounter(
                descriptor: Self.name("http_requests", "total", "Requests answered, by route, method and status."),
                labels: [("route", key.route), ("method", key.method.description), ("status", String(key.status))])
        }
    }

    private func latencyHistogram(_ route: String) -> ValueHistogram {
        Self.collector(route, in: &latency) {
            registry.makeValueHistogram(
                descriptor: Self.name("http_request_duration", "seconds", "Time from a request's arrival to its answer, by route."),
                labels: [("route", route)], buckets: Self.latencyBuckets)
        }
    }

    private func collectors(ofKind kind: String) -> KindCollectors {
        if let lastKind, lastKind.kind == kind { return lastKind }
        let collectors = KindCollectors(
            kind: kind, submitted: submittedCounter(kind),
            finished: [TaskState.succeeded, .failed, .cancelled].map { finishedCounter(kind, $0) },
            runTime: runTimeHistogram(kind))
        lastKind = collectors
        return collectors
    }

    func taskSubmitted(kind: String) {
        collectors(ofKind: kind).submitted.increment()
    }

    func taskFinished(_ task: TaskRecord) {
        let collectors = collectors(ofKind: task.kind)
        switch task.state {
        case .succeeded: collectors.finished[0].increment()
        case .failed: collectors.finished[1].increment()
        case .cancelled: collectors.finished[2].increment()
        case .scheduled, .pending, .queued, .running: return
        }
        guard let started = task.startedAt, let ended = task.finishedAt else { return }
        collectors.runTime.record(Double(max(0, ended - started)) / 1_000)
    }

    func requestAnswered(route: Route?, method: HTTPMethod, status: HTTPStatus, seconds: Double) {
        guard let route, route.index >= 0, route.index < routeCollectors.count else {
            // A method outside HTTP's general-purpose ones is any token a client sends: one
            // label value for all of them keeps the series bounded.
            let method = method.isGeneralPurpose ? method : Self.otherMethod
            requestCounter(RequestKey(route: Self.unmatchedRoute, method: method, status: status.code)).increment()
            latencyHistogram(Self.unmatchedRoute).record(seconds)
            return
        }
        let collectors = routeCollectors[route.index]
        collectors.latency.record(seconds)
        for entry in collectors.counters where entry.status == status.code && entry.method == method {
            return entry.counter.increment()
        }
        let counter = requestCounter(RequestKey(route: route.pattern, method: method, status: status.code))
        collectors.counters.append((method, status.code, counter))
        counter.increment()
    }

    private static let otherMethod = HTTPMethod(token: "OTHER")

    func leaseAnswered(seconds: Double) {
        leaseLatency.record(seconds)
    }

    private func updateLeaseSeries(_ queues: [String: TaskQueue]) {
        for (name, queue) in queues where queue.dispatch == .workers || leaseCollectors[name] != nil {
            let collectors = leaseCollectors[name] ?? {
                func counter(_ metric: String, _ help: String) -> Counter {
                    registry.makeCounter(descriptor: Self.name(metric, "total", help), labels: [("queue", name)])
                }
                return LeaseCollectors(
                    granted: counter("leases_granted", "Leases handed to workers, by queue."),
                    expired: counter("leases_expired", "Leases that ran out before their worker renewed them, by queue."),
                    released: counter("leases_released", "Leases handed back by their workers, by queue."),
                    poisoned: counter("leases_poisoned",
                                      "Tasks failed for good because the lease of their last attempt expired, by queue."),
                    waiting: registry.makeGauge(descriptor: Self.name("lease_waiting_workers", "", "Lease calls waiting now, by queue."),
                                                labels: [("queue", name)]))
            }()
            leaseCollectors[name] = collectors
            // A queue forgotten and made again between scrapes starts from zero: no negative steps.
            let now = queue.leaseCounts, then = collectors.counted
            collectors.granted.increment(by: Int64(max(0, now.granted - then.granted)))
            collectors.expired.increment(by: Int64(max(0, now.expired - then.expired)))
            collectors.released.increment(by: Int64(max(0, now.released - then.released)))
            collectors.poisoned.increment(by: Int64(max(0, now.poisoned - then.poisoned)))
            collectors.counted = now
            collectors.waiting.set(Double(queue.waitingLessees))
        }
        for (name, collectors) in leaseCollectors where queues[name] == nil {
            for counter in [collectors.granted, collectors.expired, collectors.released, collectors.poisoned] {
                registry.unregisterCounter(counter)
            }
            registry.unregisterGauge(collectors.waiting)
            leaseCollectors[name] = nil
        }
    }

    /// A series for each queue once it is rate-limited, kept while the queue is (a limit removed
    /// leaves its count standing).
    private func updateRateLimitSeries(_ queues: [String: TaskQueue]) {
        for (name, queue) in queues where queue.rateLimit != nil || rateDelayed[name] != nil {
            var entry = rateDelayed[name] ?? (registry.makeCounter(
                descriptor: Self.name("tasks_delayed_by_rate_limit", "total",
                                      "Task starts and leases that waited for a token of their queue's rate limit, by queue."),
                labels: [("queue", name)]), 0)
            // A queue forgotten and made again between scrapes starts from zero: no negative steps.
            entry.counter.increment(by: Int64(max(0, queue.delayedByRateLimit - entry.counted)))
            entry.counted = queue.delayedByRateLimit
            rateDelayed[name] = entry
        }
        for (name, entry) in rateDelayed where queues[name] == nil {
            registry.unregisterCounter(entry.counter)
            rateDelayed[name] = nil
        }
    }

    /// The text exposition, with the state gauges brought up to date first. `queues`: those of
    /// the engines here (with cells, of the cells this replica owns).
    func render(queues: [String: TaskQueue], connections: Int, longPolls: Int, transfers activeTransfers: Int, eventStreams streams: Int,
                eventStreamsDisconnected disconnected: Int, webhooks: Webhooks, droppedLogLines dropped: Int, cellHost: CellHost? = nil,
                scheduleTotals: ScheduleTotals = ScheduleTotals()) -> [UInt8] {
        for (index, total) in [scheduleTotals.fired, scheduleTotals.missed, scheduleTotals.skipped].enumerated()
        where total > scheduleRuns[index].counted {
            scheduleRuns[index].counter.increment(by: Int64(total - scheduleRuns[index].counted))
            scheduleRuns[index].counted = total
        }
        if let cellHost, let cells {
            cells.served.set(Double(cellHost.openEngines.count))
            cells.commits.increment(by: Int64(cellHost.commitCount - cells.counted.commits))
            cells.failedCommits.increment(by: Int64(cellHost.failedCommitCount - cells.counted.failed))
            cells.counted = (cellHost.commitCount, cellHost.failedCommitCount)
            cells.databaseUp.set(Double(cellHost.keeper.isRenewed ? 1 : 0))
        }
        for (name, queue) in queues {
            let gauges = taskGauges[name] ?? TaskState.allCases.map { state in
                registry.makeGauge(
                    descriptor: Self.name("tasks", "", "Tasks known now, by queue and state (finished ones until evicted)."),
                    labels: [("queue", name), ("state", state.rawValue)])
            }
            taskGauges[name] = gauges
            for (state, gauge) in zip(TaskState.allCases, gauges) { gauge.set(Double(queue.counts[state])) }
        }
        for (name, gauges) in taskGauges where queues[name] == nil {
            for gauge in gauges { registry.unregisterGauge(gauge) }
            taskGauges[name] = nil
        }
        updateLeaseSeries(queues)
        updateRateLimitSeries(queues)
        openConnections.set(Double(connections))
        waiting.set(Double(longPolls))
        transfers.set(Double(activeTransfers))
        eventStreams.set(Double(streams))
        if disconnected > eventStreamsDisconnectedCounted {
            eventStreamsDisconnected.increment(by: Int64(disconnected - eventStreamsDisconnectedCounted))
            eventStreamsDisconnectedCounted = disconnected
        }
        webhookPending.set(Double(webhooks.pendingCount))
        for (outcome, count) in webhooks.attempts {
            guard let collector = webhookAttempts[outcome], count > collector.counted else { continue }
            collector.counter.increment(by: Int64(count - collector.counted))
            webhookAttempts[outcome]?.counted = count
        }
        if dropped > droppedLogLinesCounted {
            droppedLogLines.increment(by: Int64(dropped - droppedLogLinesCounted))
            droppedLogLinesCounted = dropped
        }
        var buffer: [UInt8] = []
        buffer.reserveCapacity(16_384)
        registry.emit(into: &buffer)
        return buffer
    }
}
