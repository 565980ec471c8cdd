/// Why the engine refused a request. Each has a stable `code`; the service maps codes to HTTP
/// statuses in one place. A refused request changes nothing.
public struct EngineError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        /// A field breaks a rule (`field` names it).
        case invalid
        case unknownKind = "unknown_kind"
        case unknownDependency = "unknown_dependency"
        case selfDependency = "self_dependency"
        case duplicateDependency = "duplicate_dependency"
        /// Workflow tasks depend on each other in a circle; `keys` lists the circle.
        case cycle
        /// `maxUnfinishedTasks` would be exceeded.
        case tooManyUnfinishedTasks = "too_many_unfinished_tasks"
        /// `maxQueues` would be exceeded.
        case tooManyQueues = "too_many_queues"
        case notFound = "not_found"
        /// The task already finished; its state never changes again.
        case alreadyTerminal = "already_terminal"
        /// A worker report for a task that is not running (or not external).
        case notRunning = "not_running"
        /// A lease token that is not the task's current lease (or none for a leased task).
        case leaseLost = "lease_lost"
        /// A retry of a task that is not failed or cancelled.
        case notRetryable = "not_retryable"
        /// Leasing from a queue whose tasks the server runs itself.
        case notLeasable = "queue_not_leasable"
        /// An unfinished task of the queue, or one finished within the window, holds the
        /// submission's `unique_key` (`existing` names it).
        case duplicateTask = "duplicate_task"
        /// `maxSchedules` would be exceeded.
        case tooManySchedules = "too_many_schedules"
        /// A trigger of a schedule with `overlap: skip` whose previous run (`existing`) is unfinished.
        case previousRunUnfinished = "previous_run_unfinished"
    }

    public let code: Code
    public let message: String
    /// The offending field, as a path into the submitted body (`tasks[2].dependencies[0]`).
    public var field: String?
    /// The workflow keys on a dependency cycle, in order.
    public var keys: [String] = []
    /// The task that holds a duplicate's unique key.
    public var existing: TaskID?

    public init(_ code: Code, _ message: String, field: String? = nil, keys: [String] = [], existing: TaskID? = nil) {
        self.code = code
        self.message = message
        self.field = field
        self.keys = keys
        self.existing = existing
    }

    public var description: String { "\(code.rawValue): \(message)" }
}
