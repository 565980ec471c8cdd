import Prometheus
import TaskloopEngine
import TaskloopHTTP

/// What `GET /metrics` shows, through swift-prometheus's registry and text format.
///
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
    private var requests: [RequestKey: Counter] = [:]
    private var latency: [String: ValueHistogram] = [:]
    private var taskGauges: [LabelPair: Gauge] = [:]
    private let openConnections: Gauge
    private let waiting: Gauge
    private let transfers: Gauge

    /// Two label values (kind and state, queue and state): a struct, not a joined string, so a
    /// lookup on the per-task path allocates nothing.
    private struct LabelPair: Hashable {
        let first: String
        let state: TaskState
    }

    private struct RequestKey: Hashable {
        let route: String
        let method: HTTPMethod
        let status: Int
    }

    private static let runTimeBuckets: [Double] = [0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 30, 120, 600, 3_600]
    private static let latencyBuckets: [Double] = [0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25, 1, 10, 60]

    init() {
        openConnections = registry.makeGauge(descriptor: Self.name("http_open_connections", "", "Client connections open now."))
        waiting = registry.makeGauge(descriptor: Self.name("http_long_polls", "", "GET /tasks/{id}?wait= requests waiting now."))
        transfers = registry.makeGauge(descriptor: Self.name("http_task_transfers", "", "Requests of http tasks in flight now."))
    }

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

    func taskSubmitted(kind: String) {
        Self.collector(kind, in: &submitted) {
            registry.makeCounter(descriptor: Self.name("tasks_submitted", "total", "Tasks accepted, by kind."),
                                 labels: [("kind", kind)])
        }.increment()
    }

    func taskFinished(_ task: TaskRecord) {
        Self.collector(LabelPair(first: task.kind, state: task.state), in: &finished) {
            registry.makeCounter(
                descriptor: Self.name("tasks_finished", "total", "Tasks that reached a terminal state, by kind and state."),
                labels: [("kind", task.kind), ("state", task.state.rawValue)])
        }.increment()
        guard let started = task.startedAt, let ended = task.finishedAt else { return }
        Self.collector(task.kind, in: &runTime) {
            registry.makeValueHistogram(
                descriptor: Self.name("task_run", "seconds", "Time from a task's first start to its end, by kind."),
                labels: [("kind", task.kind)], buckets: Self.runTimeBuckets)
        }.record(Double(max(0, ended - started)) / 1_000)
    }

    func requestAnswered(route: String, method: HTTPMethod, status: HTTPStatus, seconds: Double) {
        Self.collector(RequestKey(route: route, method: method, status: status.code), in: &requests) {
            registry.makeCounter(
                descriptor: Self.name("http_requests", "total", "Requests answered, by route, method and status."),
                labels: [("route", route), ("method", method.description), ("status", String(status.code))])
        }.increment()
        Self.collector(route, in: &latency) {
            registry.makeValueHistogram(
                descriptor: Self.name("http_request_duration", "seconds", "Time from a request's arrival to its answer, by route."),
                labels: [("route", route)], buckets: Self.latencyBuckets)
        }.record(seconds)
    }

    /// The text exposition, with the state gauges brought up to date first.
    func render(engine: Engine, connections: Int, longPolls: Int, transfers activeTransfers: Int) -> [UInt8] {
        for (name, queue) in engine.queues {
            for state in TaskState.allCases {
                Self.collector(LabelPair(first: name, state: state), in: &taskGauges) {
                    registry.makeGauge(
                        descriptor: Self.name("tasks", "", "Tasks known now, by queue and state (finished ones until evicted)."),
                        labels: [("queue", name), ("state", state.rawValue)])
                }.set(Double(queue.counts[state]))
            }
        }
        openConnections.set(Double(connections))
        waiting.set(Double(longPolls))
        transfers.set(Double(activeTransfers))
        var buffer: [UInt8] = []
        buffer.reserveCapacity(8_192)
        registry.emit(into: &buffer)
        return buffer
    }
}
