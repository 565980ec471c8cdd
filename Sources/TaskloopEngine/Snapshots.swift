import TaskloopJSON

/// Everything a store keeps of a task, as plain values: what `Engine.restore` needs to rebuild
/// the record after a restart. Made by `Engine.snapshot(of:)` from the records a settled batch
/// names.
public struct TaskSnapshot: Sendable, Equatable {
    public var id: TaskID
    public var sequence: UInt64
    public var kind: String
    public var params: JSONValue
    public var name: String?
    public var queue: String
    public var priority: Int
    public var dependencies: [TaskID]
    public var onDependencyFailure: DependencyFailurePolicy
    public var timeoutMilliseconds: UInt64?
    public var retry: RetryPolicy
    public var metadata: JSONValue?
    public var workflow: TaskID?
    public var createdAt: Int64
    public var state: TaskState
    public var cancelRequested: Bool
    public var attempt: Int
    public var startedAt: Int64?
    public var finishedAt: Int64?
    public var result: JSONValue?
    public var error: TaskError?
    public var progress: TaskProgress
    public var notBefore: Int64?
    /// A running task's lease, token included: a worker keeps it across a restart.
    public var lease: LeaseSnapshot?
    /// See `TaskRecord.releasedBy`.
    public var releasedBy: [TaskID]
    /// See `Engine.watchers(of:)`.
    public var watchers: [UInt16]
    /// See `TaskRecord.reopenings`.
    public var reopenings: UInt32
    /// See `TaskRecord.scheduledFor` and `expiresAt`.
    public var scheduledFor: Int64?
    public var expiresAt: Int64?
    /// See `TaskRecord.inputs`.
    public var inputs: [TaskInput]
    /// See `TaskRecord.resolvedParams`.
    public var resolvedParams: JSONValue?
    public var uniqueKey: String?
    public var uniqueForMilliseconds: UInt64?
    public var concurrencyKey: String?
    /// See `TaskRecord.schedule`.
    public var schedule: ScheduleSlot?

    public init(
        id: TaskID, sequence: UInt64, kind: String, params: JSONValue, name: String?, queue: String, priority: Int,
        dependencies: [TaskID], onDependencyFailure: DependencyFailurePolicy, timeoutMilliseconds: UInt64?,
        retry: RetryPolicy, metadata: JSONValue?, workflow: TaskID?, createdAt: Int64, state: TaskState,
        cancelRequested: Bool, attempt: Int, startedAt: Int64?, finishedAt: Int64?, result: JSONValue?,
        error: TaskError?, progress: TaskProgress, notBefore: Int64?, lease: LeaseSnapshot? = nil,
        releasedBy: [TaskID] = [], watchers: [UInt16] = [], reopenings: UInt32 = 0, scheduledFor: Int64? = nil,
        expiresAt: Int64? = nil, inputs: [TaskInput] = [], resolvedParams: JSONValue? = nil, uniqueKey: String? = nil,
        uniqueForMilliseconds: UInt64? = nil, concurrencyKey: String? = nil, schedule: ScheduleSlot? = nil
    ) {
        self.id = id
        self.sequence = sequence
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
        self.workflow = workflow
        self.createdAt = createdAt
        self.state = state
        self.cancelRequested = cancelRequested
        self.attempt = attempt
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.result = result
        self.error = error
        self.progress = progress
        self.notBefore = notBefore
        self.lease = lease
        self.releasedBy = releasedBy
        self.watchers = watchers
        self.reopenings = reopenings
        self.scheduledFor = scheduledFor
        self.expiresAt = expiresAt
        self.inputs = inputs
        self.resolvedParams = resolvedParams
        self.uniqueKey = uniqueKey
        self.uniqueForMilliseconds = uniqueForMilliseconds
        self.concurrencyKey = concurrencyKey
        self.schedule = schedule
    }
}

public struct LeaseSnapshot: Sendable, Equatable {
    public var token: String
    public var worker: String
    public var grantedAt: Int64
    public var milliseconds: UInt64
    public var expiresAt: Int64

    public init(token: String, worker: String, grantedAt: Int64, milliseconds: UInt64, expiresAt: Int64) {
        self.token = token
        self.worker = worker
        self.grantedAt = grantedAt
        self.milliseconds = milliseconds
        self.expiresAt = expiresAt
    }
}

/// A workflow as a store keeps it: its tasks are found through their keys.
public struct WorkflowSnapshot: Sendable, Equatable {
    public var id: TaskID
    public var name: String?
    public var createdAt: Int64
    public var keys: [WorkflowKey]
    /// With cells: what the members in other cells last reported (`WorkflowRecord.remoteMembers`).
    public var remoteMembers: [WorkflowRecord.RemoteMember]
    /// The schedule run that made it (`WorkflowRecord.schedule`).
    public var schedule: ScheduleSlot?

    public struct WorkflowKey: Sendable, Equatable {
        public var key: String
        public var id: TaskID
        public init(key: String, id: TaskID) {
            self.key = key
            self.id = id
        }
    }

    public init(id: TaskID, name: String?, createdAt: Int64, keys: [WorkflowKey],
                remoteMembers: [WorkflowRecord.RemoteMember] = [], schedule: ScheduleSlot? = nil) {
        self.id = id
        self.name = name
        self.createdAt = createdAt
        self.keys = keys
        self.remoteMembers = remoteMembers
        self.schedule = schedule
    }
}

/// A queue's settings, kept when they differ from a new queue's.
public struct QueueSnapshot: Sendable, Equatable {
    public var name: String
    public var maxConcurrency: Int
    public var paused: Bool
    public var dispatch: QueueDispatch
    /// Running tasks per `concurrency_key` at most; nil: no cap.
    public var keyConcurrency: Int?
    public var rateLimit: RateLimit?

    public init(name: String, maxConcurrency: Int, paused: Bool, dispatch: QueueDispatch = .server, keyConcurrency: Int? = nil,
                rateLimit: RateLimit? = nil) {
        self.name = name
        self.maxConcurrency = maxConcurrency
        self.paused = paused
        self.dispatch = dispatch
        self.keyConcurrency = keyConcurrency
        self.rateLimit = rateLimit
    }
}
