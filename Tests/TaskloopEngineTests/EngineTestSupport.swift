import TaskloopEngine
import TaskloopJSON

/// An engine on a virtual clock, with helpers that keep tests short.
final class EngineHarness {
    let clock: VirtualScheduler
    let engine: Engine
    var events: [String] = []

    init(configure: (inout EngineConfiguration) -> Void = { _ in }, extra: [String: TaskExecutor] = [:],
         clock: VirtualScheduler = VirtualScheduler()) {
        self.clock = clock
        var configuration = EngineConfiguration()
        configure(&configuration)
        engine = Engine(configuration: configuration, scheduler: clock, extraExecutors: extra)
        engine.addObserver { [unowned self] settled in
            for case .stateChanged(let record, let from, let to) in settled {
                events.append("\(record.name ?? "?"):\(from.rawValue)->\(to.rawValue)")
            }
        }
    }

    @discardableResult
    func submit(
        _ name: String, _ kind: String = "noop", params: JSONValue = [:], queue: String = "default", priority: Int = 0,
        after dependencies: [TaskRecord] = [], policy: DependencyFailurePolicy = .cancel, timeout: UInt64? = nil,
        retry: RetryPolicy = RetryPolicy()
    ) throws(EngineError) -> TaskRecord {
        try engine.submit(TaskSpec(
            kind: kind, params: params, name: name, queue: queue, priority: priority,
            dependencies: dependencies.map { .task($0.id) }, onDependencyFailure: policy,
            timeoutMilliseconds: timeout, retry: retry))
    }

    /// Runs everything due in the next minute: far less than the retention period, so finished
    /// tasks are still there to inspect.
    func settle() { clock.advance(by: 60_000) }

    func sleep(_ milliseconds: Int64, steps: Int64 = 10, fail: Bool = false) -> JSONValue {
        ["duration_ms": .int(milliseconds), "steps": .int(steps), "outcome": fail ? "fail" : "succeed"]
    }
}

/// An executor whose attempts a test finishes by hand; it ignores cancellation unless told.
final class ManualExecutor: TaskExecutor {
    var runs: [TaskRun] = []
    var confirmsCancel = false
    var cancelRequests = 0
    var stopGrace: UInt64?
    var startHasEffects = false

    func validate(_ params: JSONValue) throws(EngineError) {}

    func start(_ run: TaskRun) {
        runs.append(run)
        run.stopGraceMilliseconds = stopGrace
        run.onCancel = { [unowned self, weak run] in
            cancelRequests += 1
            if confirmsCancel { run?.cancelled() }
        }
    }
}
