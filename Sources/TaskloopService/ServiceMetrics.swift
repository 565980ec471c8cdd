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
    private var finished: [String: Counter] = [:]
    private var runTime: [String: ValueHistogram] = [:]
    private var requests: [RequestKey: Counter] = [:]
    private var latency: [String: ValueHistogram] = [:]
    private var taskGauges: [String: Gauge] = [:]
    private let openConnections: Gauge
    private let waiting: Gauge

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
    }

    private static func name(_ metric: String, _ unit: String, _ help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(namespace: "taskloop", metricName: metric, unitName: unit, helpText: help)
    }

    func taskSubmitted(kind: String) {
        if let counter = submitted[kind] { return counter.increment() }
        let counter = registry.makeCounter(descriptor: Self.name("tasks_submitted", "total", "Tasks accepted, by kind."),
                                           labels: [("kind", kind)])
        submitted[kind] = counter
        counter.increment()
    }

    func taskFinished(_ task: TaskRecord) {
        let key = task.kind + "\u{0}" + task.state.rawValue
        let counter = finished[key] ?? {
            let counter = registry.makeCounter(
                descriptor: Self.name("tasks_finished", "total", "Tasks that reached a terminal state, by kind and state."),
                labels: [("kind", task.kind), ("state", task.state.rawValue)])
            finished[key] = counter
            return counter
        }()
        counter.increment()
        guard let started = task.startedAt, let ended = task.finishedAt else { return }
        let histogram = runTime[task.kind] ?? {
            let histogram = registry.makeValueHistogram(
                descriptor: Self.name("task_run", "seconds", "Time from a task's first start to its end, by kind."),
                labels: [("kind", task.kind)], buckets: Self.runTimeBuckets)
            runTime[task.kind] = histogram
            return histogram
        }()
        histogram.record(Double(max(0, ended - started)) / 1_000)
    }

    func requestAnswered(route: String, method: HTTPMethod, status: HTTPStatus, seconds: Double) {
        let key = RequestKey(route: route, method: method, status: status.code)
        let counter = requests[key] ?? {
            let counter = registry.makeCounter(
                descriptor: Self.name("http_requests", "total", "Requests answered, by route, method and status."),
                labels: [("route", route), ("method", method.description), ("status", String(status.code))])
            requests[key] = counter
            return counter
        }()
        counter.increment()
        let histogram = latency[route] ?? {
            let histogram = registry.makeValueHistogram(
                descriptor: Self.name("http_request_duration", "seconds", "Time from a request's arrival to its answer, by route."),
                labels: [("route", route)], buckets: Self.latencyBuckets)
            latency[route] = histogram
            return histogram
        }()
        histogram.record(seconds)
    }

    /// The text exposition, with the state gauges brought up to date first.
    func render(engine: Engine, connections: Int, longPolls: Int) -> [UInt8] {
        for (name, queue) in engine.queues {
            for state in TaskState.allCases {
                let key = name + "\u{0}" + state.rawValue
                let gauge = taskGauges[key] ?? {
                    let gauge = registry.makeGauge(
                        descriptor: Self.name("tasks", "", "Tasks known now, by queue and state (finished ones until evicted)."),
                        labels: [("queue", name), ("state", state.rawValue)])
                    taskGauges[key] = gauge
                    return gauge
                }()
                gauge.set(Double(queue.counts[state]))
            }
        }
        openConnections.set(Double(connections))
        waiting.set(Double(longPolls))
        var buffer: [UInt8] = []
        buffer.reserveCapacity(8_192)
        registry.emit(into: &buffer)
        return buffer
    }
}
