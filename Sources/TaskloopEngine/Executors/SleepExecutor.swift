import TaskloopJSON

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
