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
    /// The fields live in one copy-on-write box: a spec is copied many times on its way into a
    /// record (a workflow's members pass through several checks and maps), and a copy of the
    /// box is one retain where a copy of the fields, a dozen of them reference-counted, went
    /// through the runtime's generic copy (callgrind, a 10,000-task lattice workflow: 737M
    /// instructions with the fields inline, 641M boxed).
    private struct Fields: Equatable {
        var kind: String
        var params: JSONValue
        var name: String?
        var queue: String
        var priority: Int
        var dependencies: [DependencyReference]
        var onDependencyFailure: DependencyFailurePolicy
        var timeoutMilliseconds: UInt64?
        var retry: RetryPolicy
        var metadata: JSONValue?
        var runAt: TaskTime?
        var expiry: TaskTime?
        var uniqueKey: String?
        var uniqueForMilliseconds: UInt64?
        var concurrencyKey: String?
        var schedule: ScheduleSlot?
    }

    private final class Box: @unchecked Sendable {
        var fields: Fields
        init(_ fields: Fields) { self.fields = fields }
    }

    // Threading: copies share a box, and a copy about to change is first given its own
    // (`boxForChange`), so no box is ever written while another copy, on any thread, reads it.
    private var box: Box

    private var boxForChange: Box {
        mutating get {
            if !isKnownUniquelyReferenced(&box) { box = Box(box.fields) }
            return box
        }
    }

    public var kind: String {
        get { box.fields.kind }
        _modify { yield &boxForChange.fields.kind }
    }
    public var params: JSONValue {
        get { box.fields.params }
        _modify { yield &boxForChange.fields.params }
    }
    public var name: String? {
        get { box.fields.name }
        _modify { yield &boxForChange.fields.name }
    }
    public var queue: String {
        get { box.fields.queue }
        _modify { yield &boxForChange.fields.queue }
    }
    public var priority: Int {
        get { box.fields.priority }
        _modify { yield &boxForChange.fields.priority }
    }
    public var dependencies: [DependencyReference] {
        get { box.fields.dependencies }
        _modify { yield &boxForChange.fields.dependencies }
    }
    public var onDependencyFailure: DependencyFailurePolicy {
        get { box.fields.onDependencyFailure }
        _modify { yield &boxForChange.fields.onDependencyFailure }
    }
    public var timeoutMilliseconds: UInt64? {
        get { box.fields.timeoutMilliseconds }
        _modify { yield &boxForChange.fields.timeoutMilliseconds }
    }
    public var retry: RetryPolicy {
        get { box.fields.retry }
        _modify { yield &boxForChange.fields.retry }
    }
    public var metadata: JSONValue? {
        get { box.fields.metadata }
        _modify { yield &boxForChange.fields.metadata }
    }
    /// `run_at` or `delay_ms`: the task waits `scheduled` until then.
    public var runAt: TaskTime? {
        get { box.fields.runAt }
        _modify { yield &boxForChange.fields.runAt }
    }
    /// `expires_at` or `ttl_ms`: a task that has not started by then ends `cancelled` (`expired`).
    public var expiry: TaskTime? {
        get { box.fields.expiry }
        _modify { yield &boxForChange.fields.expiry }
    }
    /// At most one unfinished task of a queue holds a key (Engine+Unique).
    public var uniqueKey: String? {
        get { box.fields.uniqueKey }
        _modify { yield &boxForChange.fields.uniqueKey }
    }
    /// How long after a task with the key finished this submission is still refused; nil: only
    /// while one is unfinished.
    public var uniqueForMilliseconds: UInt64? {
        get { box.fields.uniqueForMilliseconds }
        _modify { yield &boxForChange.fields.uniqueForMilliseconds }
    }
    /// Fair share: the queue takes ready tasks round-robin across keys, and runs at most its
    /// `key_concurrency` of one key at once (`KeyLanes`).
    public var concurrencyKey: String? {
        get { box.fields.concurrencyKey }
        _modify { yield &boxForChange.fields.concurrencyKey }
    }
    /// Set by the engine on the tasks a schedule's run makes (Engine+Schedules); a client's
    /// submission never carries it.
    public var schedule: ScheduleSlot? {
        get { box.fields.schedule }
        _modify { yield &boxForChange.fields.schedule }
    }

    public init(
        kind: String, params: JSONValue = [:], name: String? = nil, queue: String = "default", priority: Int = 0,
        dependencies: [DependencyReference] = [], onDependencyFailure: DependencyFailurePolicy = .cancel,
        timeoutMilliseconds: UInt64? = nil, retry: RetryPolicy = RetryPolicy(), metadata: JSONValue? = nil,
        runAt: TaskTime? = nil, expiry: TaskTime? = nil, uniqueKey: String? = nil, uniqueForMilliseconds: UInt64? = nil,
        concurrencyKey: String? = nil, schedule: ScheduleSlot? = nil
    ) {
        box = Box(Fields(kind: kind, params: params, name: name, queue: queue, priority: priority, dependencies: dependencies,
                         onDependencyFailure: onDependencyFailure, timeoutMilliseconds: timeoutMilliseconds, retry: retry,
                         metadata: metadata, runAt: runAt, expiry: expiry, uniqueKey: uniqueKey,
                         uniqueForMilliseconds: uniqueForMilliseconds, concurrencyKey: concurrencyKey,
                         schedule: schedule))
    }

    public static func == (lhs: TaskSpec, rhs: TaskSpec) -> Bool {
        lhs.box === rhs.box || lhs.box.fields == rhs.box.fields
    }
}
