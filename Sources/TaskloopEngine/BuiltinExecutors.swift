import TaskloopJSON

/// `noop`: finishes at once (a join point, like dispatch_group_notify).
public final class NoopExecutor: TaskExecutor {
    public init() {}

    public func validate(_ params: JSONValue) throws(EngineError) {
        guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
        if let key = object.keys.first { throw EngineError(.invalid, "Unknown parameter \(key): noop takes none.", field: key) }
    }

    public func start(_ run: TaskRun) {
        run.succeed()
    }
}

/// `sleep`: `{duration_ms, steps = 10, outcome = "succeed" | "fail"}`. A timer that reports
/// progress `steps` times; cancellation stops it at once.
public final class SleepExecutor: TaskExecutor {
    private let scheduler: EngineScheduler

    public init(scheduler: EngineScheduler) {
        self.scheduler = scheduler
    }

    struct Params {
        var duration: UInt64
        var steps: Int
        var fails: Bool
    }

    static func parse(_ params: JSONValue) throws(EngineError) -> Params {
        guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
        guard let duration = object["duration_ms"] else {
            throw EngineError(.invalid, "duration_ms is required.", field: "duration_ms")
        }
        guard let milliseconds = duration.intValue, milliseconds >= 0, milliseconds <= 86_400_000 else {
            throw EngineError(.invalid, "duration_ms must be an integer from 0 to 86400000.", field: "duration_ms")
        }
        var steps: Int64 = 10
        if let value = object["steps"] {
            guard let count = value.intValue, (1...10_000).contains(count) else {
                throw EngineError(.invalid, "steps must be an integer from 1 to 10000.", field: "steps")
            }
            steps = count
        }
        var fails = false
        if let value = object["outcome"] {
            guard let outcome = value.stringValue, outcome == "succeed" || outcome == "fail" else {
                throw EngineError(.invalid, "outcome must be \"succeed\" or \"fail\".", field: "outcome")
            }
            fails = outcome == "fail"
        }
        for key in object.keys where !["duration_ms", "steps", "outcome"].contains(key) {
            throw EngineError(.invalid, "Unknown parameter \(key).", field: key)
        }
        return Params(duration: UInt64(milliseconds), steps: Int(steps), fails: fails)
    }

    public func validate(_ params: JSONValue) throws(EngineError) {
        _ = try Self.parse(params)
    }

    public func start(_ run: TaskRun) {
        guard let params = try? Self.parse(run.params) else {
            return run.fail(TaskError(code: "invalid_params", message: "The sleep parameters are invalid."))
        }
        var timer: ScheduledAction?
        run.onCancel = { [weak run] in
            timer?.cancel()
            run?.cancelled()
        }
        func step(_ index: Int) {
            let due = params.duration * UInt64(index) / UInt64(params.steps)
            let previous = params.duration * UInt64(index - 1) / UInt64(params.steps)
            timer = scheduler.schedule(after: due - previous) { [weak run] in
                guard let run, run.isCurrent else { return }
                if index < params.steps {
                    run.progress(fraction: Double(index) / Double(params.steps), message: "step \(index) of \(params.steps)")
                    step(index + 1)
                } else if params.fails {
                    run.fail(TaskError(code: "sleep_failed", message: "The sleep ended with outcome \"fail\"."))
                } else {
                    run.succeed()
                }
            }
        }
        step(1)
    }
}

/// What an outside worker says about an `external` task.
public enum ExternalReport: Sendable {
    case progress(fraction: Double?, message: String?, details: JSONValue?)
    case complete(result: JSONValue?)
    case fail(TaskError)
}

/// `external`: `{heartbeat_timeout_ms?}`. Run by an outside worker that reports through the
/// API; the engine only tracks it. Without a report for `heartbeat_timeout_ms` the attempt fails.
public final class ExternalExecutor: TaskExecutor {
    private let scheduler: EngineScheduler
    private var heartbeats: [TaskID: ScheduledAction] = [:]

    public init(scheduler: EngineScheduler) {
        self.scheduler = scheduler
    }

    static func heartbeatTimeout(_ params: JSONValue) throws(EngineError) -> UInt64? {
        guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
        for key in object.keys where key != "heartbeat_timeout_ms" {
            throw EngineError(.invalid, "Unknown parameter \(key).", field: key)
        }
        guard let value = object.nonNull("heartbeat_timeout_ms") else { return nil }
        guard let milliseconds = value.intValue, (1...86_400_000).contains(milliseconds) else {
            throw EngineError(.invalid, "heartbeat_timeout_ms must be an integer from 1 to 86400000.",
                              field: "heartbeat_timeout_ms")
        }
        return UInt64(milliseconds)
    }

    public func validate(_ params: JSONValue) throws(EngineError) {
        _ = try Self.heartbeatTimeout(params)
    }

    public func start(_ run: TaskRun) {
        // Nothing runs here; the worker's cancellation is delivered as a 409 on its next report.
        run.onCancel = { [weak self, weak run] in
            guard let self, let run else { return }
            heartbeats.removeValue(forKey: run.taskID)?.cancel()
        }
        armHeartbeat(run)
    }

    /// Applies a worker's report to its current attempt.
    func report(_ report: ExternalReport, for run: TaskRun) {
        switch report {
        case .progress(let fraction, let message, let details):
            armHeartbeat(run)
            run.progress(fraction: fraction, message: message, details: details)
        case .complete(let result):
            heartbeats.removeValue(forKey: run.taskID)?.cancel()
            run.succeed(result)
        case .fail(let error):
            heartbeats.removeValue(forKey: run.taskID)?.cancel()
            run.fail(error)
        }
    }

    private func armHeartbeat(_ run: TaskRun) {
        heartbeats.removeValue(forKey: run.taskID)?.cancel()
        guard let timeout = (try? Self.heartbeatTimeout(run.params)) ?? nil else { return }
        heartbeats[run.taskID] = scheduler.schedule(after: timeout) { [weak self, weak run] in
            guard let run, run.isCurrent else { return }
            self?.heartbeats.removeValue(forKey: run.taskID)
            run.fail(TaskError(code: "heartbeat_timeout", message: "No report from the worker for \(timeout) ms.",
                               details: ["heartbeat_timeout_ms": .int(Int64(timeout))]))
        }
    }
}
