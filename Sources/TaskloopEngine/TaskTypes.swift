import TaskloopJSON

public enum TaskState: String, Sendable, CaseIterable {
    /// Waiting for its time (`run_at`, `TaskRecord.scheduledFor`); then it is `pending`.
    case scheduled
    /// Waiting for dependencies (or for a retry's backoff).
    case pending
    /// Ready, waiting for a slot in its queue.
    case queued
    case running
    case succeeded
    case failed
    case cancelled

    public var isTerminal: Bool {
        switch self {
        case .succeeded, .failed, .cancelled: true
        case .scheduled, .pending, .queued, .running: false
        }
    }
}

/// What a dependent does when a dependency fails or is cancelled.
public enum DependencyFailurePolicy: String, Sendable {
    /// The dependent, and transitively its own dependents, are cancelled (`dependency_failed`).
    case cancel
    /// The dependent runs once every dependency is terminal, whatever the outcome
    /// (OperationQueue's semantics).
    case run
}

public struct RetryPolicy: Sendable, Equatable {
    public var maxAttempts: Int
    public var backoffMilliseconds: UInt64
    public var backoffFactor: Double

    public init(maxAttempts: Int = 1, backoffMilliseconds: UInt64 = 1_000, backoffFactor: Double = 2) {
        self.maxAttempts = maxAttempts
        self.backoffMilliseconds = backoffMilliseconds
        self.backoffFactor = backoffFactor
    }

    /// The wait before attempt `attempt + 1`, after attempt `attempt` failed.
    func backoff(after attempt: Int) -> UInt64 {
        var scaled = Double(backoffMilliseconds)
        for _ in 1..<max(1, attempt) where scaled < 86_400_000 { scaled *= backoffFactor }
        return scaled.isFinite && scaled >= 0 ? UInt64(min(scaled, 86_400_000)) : 86_400_000
    }
}

/// Why a task failed or was cancelled: `{code, message, ...details}` in the API.
public struct TaskError: Error, Sendable, Equatable {
    public var code: String
    public var message: String
    public var details: JSONObject

    public init(code: String, message: String, details: JSONObject = [:]) {
        self.code = code
        self.message = message
        self.details = details
    }

    public static func timeout(after milliseconds: UInt64) -> TaskError {
        TaskError(code: "timeout", message: "The attempt did not finish within \(milliseconds) ms.",
                  details: ["timeout_ms": .int(Int64(milliseconds))])
    }

    public static func dependencyFailed(_ dependency: TaskID, state: TaskState) -> TaskError {
        TaskError(code: "dependency_failed", message: "Dependency \(dependency) was \(state.rawValue).",
                  details: ["dependency": .string(dependency.description)])
    }

    /// A dependency in another cell that its cell does not hold (never made, or already forgotten).
    public static func unknownDependency(_ dependency: TaskID) -> TaskError {
        TaskError(code: "unknown_dependency", message: "Dependency \(dependency) does not exist.",
                  details: ["dependency": .string(dependency.description)])
    }

    public static let cancelled = TaskError(code: "cancelled", message: "The task was cancelled.")

    /// A task that had not started by its `expires_at`.
    public static func expired(at milliseconds: Int64) -> TaskError {
        TaskError(code: "expired", message: "The task had not started by its expiry.",
                  details: ["expires_at_ms": .int(milliseconds)])
    }
}

public struct TaskProgress: Sendable, Equatable {
    /// 0...1, or nil when unknown. Never decreases within one attempt.
    public var fraction: Double?
    public var message: String?
    public var details: JSONValue?
    /// Wall-clock milliseconds of the last update; nil before the first.
    public var updatedAt: Int64?

    public init(fraction: Double? = nil, message: String? = nil, details: JSONValue? = nil, updatedAt: Int64? = nil) {
        self.fraction = fraction
        self.message = message
        self.details = details
        self.updatedAt = updatedAt
    }
}

/// A dependency as submitted: an existing task, or (inside a workflow) a sibling's key.
public enum DependencyReference: Sendable, Equatable {
    case task(TaskID)
    case sibling(key: String)
}

/// A moment a client gives: a wall-clock time, or a span counted from the submission.
public enum TaskTime: Sendable, Equatable {
    /// Wall-clock milliseconds since the Unix epoch.
    case at(Int64)
    /// Milliseconds after the task is submitted.
    case after(UInt64)

    /// Wall-clock milliseconds, for a task submitted at `submittedAt`.
    public func instant(submittedAt: Int64) -> Int64 {
        switch self {
        case .at(let instant): instant
        case .after(let span): submittedAt &+ Int64(clamping: span)
        }
    }
}

/// Everything a client says about a task; validated by the engine on submission.
public struct TaskSpec: Sendable, Equatable {
    public var kind: String
    public var params: JSONValue
    public var name: String?
    public var queue: String
    public var priority: Int
    public var dependencies: [DependencyReference]
    public var onDependencyFailure: DependencyFailurePolicy
    public var timeoutMilliseconds: UInt64?
    public var retry: RetryPolicy
    public var metadata: JSONValue?
    /// `run_at` or `delay_ms`: the task waits `scheduled` until then.
    public var runAt: TaskTime?
    /// `expires_at` or `ttl_ms`: a task that has not started by then ends `cancelled` (`expired`).
    public var expiry: TaskTime?
    /// At most one unfinished task of a queue holds a key (Engine+Unique).
    public var uniqueKey: String?
    /// How long after a task with the key finished this submission is still refused; nil: only
    /// while one is unfinished.
    public var uniqueForMilliseconds: UInt64?
    /// Set by the engine on the tasks a schedule's run makes (Engine+Schedules); a client's
    /// submission never carries it.
    public var schedule: ScheduleSlot?

    public init(
        kind: String, params: JSONValue = [:], name: String? = nil, queue: String = "default", priority: Int = 0,
        dependencies: [DependencyReference] = [], onDependencyFailure: DependencyFailurePolicy = .cancel,
        timeoutMilliseconds: UInt64? = nil, retry: RetryPolicy = RetryPolicy(), metadata: JSONValue? = nil,
        runAt: TaskTime? = nil, expiry: TaskTime? = nil, uniqueKey: String? = nil, uniqueForMilliseconds: UInt64? = nil,
        schedule: ScheduleSlot? = nil
    ) {
        self.kind = kind
        self.params = params
        self.name = name
        self.queue = queue
        self.priority = priority
        self.dependencies = dependencies
        self.onDependencyFailure = onDependencyFailure
        self.timeoutMilliseconds = timeoutMilliseconds
        self.retry = retry
        self.metadata = metadata
        self.runAt = runAt
        self.expiry = expiry
        self.uniqueKey = uniqueKey
        self.uniqueForMilliseconds = uniqueForMilliseconds
        self.schedule = schedule
    }
}
