import TaskloopJSON

/// Everything a store keeps of a task, as plain values: what `Engine.restore` needs to rebuild
/// the record after a restart. Made by `Engine.snapshot(of:)` from the records a settled batch
/// names.
public struct TaskSnapshot: Sendable, Equatable {
    /// The fields live in one copy-on-write box, as `TaskSpec`'s do: a snapshot is copied
    /// several times on its way to a store (the collector's list, the batch, the writer's queue)
    /// and back (the decoded list, `restore`'s sorted order), and a copy of the box is one retain
    /// where a copy of some 35 fields, a dozen of them reference-counted, went through the
    /// runtime's generic copy and destroy. The getters are inlinable: a store's encoder reads
    /// every field, and a call into this module per field cost as much as the copies saved.
    @usableFromInline struct Fields: Equatable {
        @usableFromInline var id: TaskID
        @usableFromInline var sequence: UInt64
        @usableFromInline var kind: String
        @usableFromInline var params: JSONValue
        @usableFromInline var name: String?
        @usableFromInline var queue: String
        @usableFromInline var priority: Int
        @usableFromInline var dependencies: [TaskID]
        @usableFromInline var onDependencyFailure: DependencyFailurePolicy
        @usableFromInline var timeoutMilliseconds: UInt64?
        @usableFromInline var retry: RetryPolicy
        @usableFromInline var metadata: JSONValue?
        @usableFromInline var workflow: TaskID?
        @usableFromInline var createdAt: Int64
        @usableFromInline var state: TaskState
        @usableFromInline var cancelRequested: Bool
        @usableFromInline var attempt: Int
        @usableFromInline var startedAt: Int64?
        @usableFromInline var finishedAt: Int64?
        @usableFromInline var result: JSONValue?
        @usableFromInline var error: TaskError?
        @usableFromInline var progress: TaskProgress
        @usableFromInline var notBefore: Int64?
        @usableFromInline var lease: LeaseSnapshot?
        @usableFromInline var releasedBy: [TaskID]
        @usableFromInline var watchers: [UInt16]
        @usableFromInline var reopenings: UInt32
        @usableFromInline var scheduledFor: Int64?
        @usableFromInline var expiresAt: Int64?
        @usableFromInline var inputs: [TaskInput]
        @usableFromInline var resolvedParams: JSONValue?
        @usableFromInline var uniqueKey: String?
        @usableFromInline var uniqueForMilliseconds: UInt64?
        @usableFromInline var concurrencyKey: String?
        @usableFromInline var schedule: ScheduleSlot?
    }

    @usableFromInline final class Box: @unchecked Sendable {
        @usableFromInline var fields: Fields
        init(_ fields: Fields) { self.fields = fields }
    }

    // Threading: copies share a box, and a copy about to change is first given its own
    // (`boxForChange`), so no box is ever written while another copy, on any thread, reads it.
    @usableFromInline var box: Box

    private var boxForChange: Box {
        mutating get {
            if !isKnownUniquelyReferenced(&box) { box = Box(box.fields) }
            return box
        }
    }

    public var id: TaskID {
        @inlinable get { box.fields.id }
        _modify { yield &boxForChange.fields.id }
    }
    public var sequence: UInt64 {
        @inlinable get { box.fields.sequence }
        _modify { yield &boxForChange.fields.sequence }
    }
    public var kind: String {
        @inlinable get { box.fields.kind }
        _modify { yield &boxForChange.fields.kind }
    }
    public var params: JSONValue {
        @inlinable get { box.fields.params }
        _modify { yield &boxForChange.fields.params }
    }
    public var name: String? {
        @inlinable get { box.fields.name }
        _modify { yield &boxForChange.fields.name }
    }
    public var queue: String {
        @inlinable get { box.fields.queue }
        _modify { yield &boxForChange.fields.queue }
    }
    public var priority: Int {
        @inlinable get { box.fields.priority }
        _modify { yield &boxForChange.fields.priority }
    }
    public var dependencies: [TaskID] {
        @inlinable get { box.fields.dependencies }
        _modify { yield &boxForChange.fields.dependencies }
    }
    public var onDependencyFailure: DependencyFailurePolicy {
        @inlinable get { box.fields.onDependencyFailure }
        _modify { yield &boxForChange.fields.onDependencyFailure }
    }
    public var timeoutMilliseconds: UInt64? {
        @inlinable get { box.fields.timeoutMilliseconds }
        _modify { yield &boxForChange.fields.timeoutMilliseconds }
    }
    public var retry: RetryPolicy {
        @inlinable get { box.fields.retry }
        _modify { yield &boxForChange.fields.retry }
    }
    public var metadata: JSONValue? {
        @inlinable get { box.fields.metadata }
        _modify { yield &boxForChange.fields.metadata }
    }
    public var workflow: TaskID? {
        @inlinable get { box.fields.workflow }
        _modify { yield &boxForChange.fields.workflow }
    }
    public var createdAt: Int64 {
        @inlinable get { box.fields.createdAt }
        _modify { yield &boxForChange.fields.createdAt }
    }
    public var state: TaskState {
        @inlinable get { box.fields.state }
        _modify { yield &boxForChange.fields.state }
    }
    public var cancelRequested: Bool {
        @inlinable get { box.fields.cancelRequested }
        _modify { yield &boxForChange.fields.cancelRequested }
    }
    public var attempt: Int {
        @inlinable get { box.fields.attempt }
        _modify { yield &boxForChange.fields.attempt }
    }
    public var startedAt: Int64? {
        @inlinable get { box.fields.startedAt }
        _modify { yield &boxForChange.fields.startedAt }
    }
    public var finishedAt: Int64? {
        @inlinable get { box.fields.finishedAt }
        _modify { yield &boxForChange.fields.finishedAt }
    }
    public var result: JSONValue? {
        @inlinable get { box.fields.result }
        _modify { yield &boxForChange.fields.result }
    }
    public var error: TaskError? {
        @inlinable get { box.fields.error }
        _modify { yield &boxForChange.fields.error }
    }
    public var progress: TaskProgress {
        @inlinable get { box.fields.progress }
        _modify { yield &boxForChange.fields.progress }
    }
    public var notBefore: Int64? {
        @inlinable get { box.fields.notBefore }
        _modify { yield &boxForChange.fields.notBefore }
    }
    /// A running task's lease, token included: a worker keeps it across a restart.
    public var lease: LeaseSnapshot? {
        @inlinable get { box.fields.lease }
        _modify { yield &boxForChange.fields.lease }
    }
    /// See `TaskRecord.releasedBy`.
    public var releasedBy: [TaskID] {
        @inlinable get { box.fields.releasedBy }
        _modify { yield &boxForChange.fields.releasedBy }
    }
    /// See `Engine.watchers(of:)`.
    public var watchers: [UInt16] {
        @inlinable get { box.fields.watchers }
        _modify { yield &boxForChange.fields.watchers }
    }
    /// See `TaskRecord.reopenings`.
    public var reopenings: UInt32 {
        @inlinable get { box.fields.reopenings }
        _modify { yield &boxForChange.fields.reopenings }
    }
    /// See `TaskRecord.scheduledFor` and `expiresAt`.
    public var scheduledFor: Int64? {
        @inlinable get { box.fields.scheduledFor }
        _modify { yield &boxForChange.fields.scheduledFor }
    }
    public var expiresAt: Int64? {
        @inlinable get { box.fields.expiresAt }
        _modify { yield &boxForChange.fields.expiresAt }
    }
    /// See `TaskRecord.inputs`.
    public var inputs: [TaskInput] {
        @inlinable get { box.fields.inputs }
        _modify { yield &boxForChange.fields.inputs }
    }
    /// See `TaskRecord.resolvedParams`.
    public var resolvedParams: JSONValue? {
        @inlinable get { box.fields.resolvedParams }
        _modify { yield &boxForChange.fields.resolvedParams }
    }
    public var uniqueKey: String? {
        @inlinable get { box.fields.uniqueKey }
        _modify { yield &boxForChange.fields.uniqueKey }
    }
    public var uniqueForMilliseconds: UInt64? {
        @inlinable get { box.fields.uniqueForMilliseconds }
        _modify { yield &boxForChange.fields.uniqueForMilliseconds }
    }
    public var concurrencyKey: String? {
        @inlinable get { box.fields.concurrencyKey }
        _modify { yield &boxForChange.fields.concurrencyKey }
    }
    /// See `TaskRecord.schedule`.
    public var schedule: ScheduleSlot? {
        @inlinable get { box.fields.schedule }
        _modify { yield &boxForChange.fields.schedule }
    }

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
        box = Box(Fields(id: id, sequence: sequence, kind: kind, params: params, name: name, queue: queue,
                         priority: priority, dependencies: dependencies, onDependencyFailure: onDependencyFailure,
                         timeoutMilliseconds: timeoutMilliseconds, retry: retry, metadata: metadata, workflow: workflow,
                         createdAt: createdAt, state: state, cancelRequested: cancelRequested, attempt: attempt,
                         startedAt: startedAt, finishedAt: finishedAt, result: result, error: error, progress: progress,
                         notBefore: notBefore, lease: lease, releasedBy: releasedBy, watchers: watchers,
                         reopenings: reopenings, scheduledFor: scheduledFor, expiresAt: expiresAt, inputs: inputs,
                         resolvedParams: resolvedParams, uniqueKey: uniqueKey,
                         uniqueForMilliseconds: uniqueForMilliseconds, concurrencyKey: concurrencyKey,
                         schedule: schedule))
    }

    public static func == (lhs: TaskSnapshot, rhs: TaskSnapshot) -> Bool {
        lhs.box === rhs.box || lhs.box.fields == rhs.box.fields
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
