import TaskloopJSON

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

    public var runsOutsideTheProcess: Bool { true }

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
