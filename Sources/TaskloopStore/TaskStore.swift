import TaskloopEngine

/// An `Idempotency-Key` and what its first request created, kept until `expiresAt` (wall ms).
public struct IdempotencyRecord: Sendable, Equatable {
    public var key: String
    /// SHA-256 of the request that used the key first (method, path and body).
    public var requestHash: [UInt8]
    public var status: Int
    /// The path of what it created (`/tasks/<id>`, `/workflows/<id>`).
    public var resource: String
    public var expiresAt: Int64

    public init(key: String, requestHash: [UInt8], status: Int, resource: String, expiresAt: Int64) {
        self.key = key
        self.requestHash = requestHash
        self.status = status
        self.resource = resource
        self.expiresAt = expiresAt
    }
}

extension TaskSnapshot {
    public var storedKey: StoredTaskKey { StoredTaskKey(id: id, sequence: sequence) }
}

/// What changed in one turn of the loop, as a store writes it: one transaction. Tasks carry
/// their latest snapshot (a task changed twice in the turn is written once).
public struct StoreBatch: Sendable {
    public var tasks: [TaskSnapshot] = []
    public var evictedTasks: [StoredTaskKey] = []
    public var workflows: [WorkflowSnapshot] = []
    public var evictedWorkflows: [TaskID] = []
    public var queues: [QueueSnapshot] = []
    public var forgottenQueues: [String] = []
    public var idempotencyKeys: [IdempotencyRecord] = []
    public var expiredIdempotencyKeys: [String] = []
    public var webhooks: [WebhookRecord] = []
    /// Deleting a webhook deletes its deliveries too.
    public var deletedWebhooks: [String] = []
    public var deliveries: [DeliveryRecord] = []
    /// Finished deliveries pushed out of their webhook's log.
    public var deletedDeliveries: [String] = []
    /// What a cell's engine tells other cells, in the order sent (only in a cluster: the
    /// commit that writes the batch sends them).
    public var messages: [CellMessage] = []
    /// The event stream's last number when the batch was made: numbers go on after a restart.
    public var eventSequence: UInt64?
    /// Unique keys of forgotten tasks, made and dropped (the engine's `takeUniqueKeyChanges`).
    public var uniqueKeys: [UniqueKeyTombstone] = []
    public var droppedUniqueKeys: [UniqueKeyName] = []
    /// Schedules made or changed (a slot fired: `lastSlot` and the run's tasks are in the same
    /// batch), and deleted.
    public var schedules: [ScheduleSnapshot] = []
    public var deletedSchedules: [TaskID] = []

    public init() {}

    public var isEmpty: Bool {
        tasks.isEmpty && evictedTasks.isEmpty && workflows.isEmpty && evictedWorkflows.isEmpty && queues.isEmpty
            && forgottenQueues.isEmpty && idempotencyKeys.isEmpty && expiredIdempotencyKeys.isEmpty && !hasWebhookChanges
            && messages.isEmpty && uniqueKeys.isEmpty && droppedUniqueKeys.isEmpty && schedules.isEmpty && deletedSchedules.isEmpty
    }

    public var hasWebhookChanges: Bool {
        !webhooks.isEmpty || !deletedWebhooks.isEmpty || !deliveries.isEmpty || !deletedDeliveries.isEmpty
    }

    /// Only the webhook and delivery changes: what a failed batch carries into the next as it
    /// was (tasks, workflows and the rest are written again from the engine's state instead).
    public var webhookChanges: StoreBatch {
        var changes = StoreBatch()
        changes.webhooks = webhooks
        changes.deletedWebhooks = deletedWebhooks
        changes.deliveries = deliveries
        changes.deletedDeliveries = deletedDeliveries
        return changes
    }

    public var hasUniqueKeyChanges: Bool {
        !uniqueKeys.isEmpty || !droppedUniqueKeys.isEmpty
    }

    /// Only the unique keys' changes, carried into the next batch like `webhookChanges` (the
    /// engine hands each out once).
    public var uniqueKeyChanges: StoreBatch {
        var changes = StoreBatch()
        changes.uniqueKeys = uniqueKeys
        changes.droppedUniqueKeys = droppedUniqueKeys
        return changes
    }

    /// This batch followed by `later` as one: what `later` writes or deletes wins. A batch that
    /// failed to commit is merged into the next, so nothing it held is dropped.
    public func merged(with later: StoreBatch) -> StoreBatch {
        var result = StoreBatch()
        (result.tasks, result.evictedTasks) = Self.merge((tasks, evictedTasks), (later.tasks, later.evictedTasks), key: \.storedKey)
        (result.workflows, result.evictedWorkflows) = Self.merge(
            (workflows, evictedWorkflows), (later.workflows, later.evictedWorkflows), key: \.id)
        (result.queues, result.forgottenQueues) = Self.merge(
            (queues, forgottenQueues), (later.queues, later.forgottenQueues), key: \.name)
        (result.idempotencyKeys, result.expiredIdempotencyKeys) = Self.merge(
            (idempotencyKeys, expiredIdempotencyKeys), (later.idempotencyKeys, later.expiredIdempotencyKeys), key: \.key)
        (result.webhooks, result.deletedWebhooks) = Self.merge(
            (webhooks, deletedWebhooks), (later.webhooks, later.deletedWebhooks), key: \.id)
        let deletedLater = Set(later.deletedWebhooks)
        (result.deliveries, result.deletedDeliveries) = Self.merge(
            (deliveries.filter { !deletedLater.contains($0.webhook) }, deletedDeliveries),
            (later.deliveries, later.deletedDeliveries), key: \.id)
        (result.uniqueKeys, result.droppedUniqueKeys) = Self.merge(
            (uniqueKeys, droppedUniqueKeys), (later.uniqueKeys, later.droppedUniqueKeys), key: \.name)
        (result.schedules, result.deletedSchedules) = Self.merge(
            (schedules, deletedSchedules), (later.schedules, later.deletedSchedules), key: \.id)
        result.eventSequence = [eventSequence, later.eventSequence].compactMap { $0 }.max()
        return result
    }

    /// Writes and deletions of one kind of record, earlier then later: for a key the later
    /// batch writes or deletes, the earlier batch's entry goes.
    private static func merge<Record, Key: Hashable>(
        _ earlier: (writes: [Record], deletions: [Key]), _ later: (writes: [Record], deletions: [Key]),
        key: (Record) -> Key
    ) -> ([Record], [Key]) {
        let touchedLater = Set(later.writes.map(key)).union(later.deletions)
        return (earlier.writes.filter { !touchedLater.contains(key($0)) } + later.writes,
                earlier.deletions.filter { !touchedLater.contains($0) } + later.deletions)
    }
}

/// Everything a store kept, for `Engine.restore` at start.
public struct StoredState: Sendable {
    public var queues: [QueueSnapshot] = []
    public var workflows: [WorkflowSnapshot] = []
    public var tasks: [TaskSnapshot] = []
    public var idempotencyKeys: [IdempotencyRecord] = []
    public var webhooks: [WebhookRecord] = []
    /// Every delivery kept, pending and finished, in event order.
    public var deliveries: [DeliveryRecord] = []
    /// The event stream's last number before the restart (0 for a new database).
    public var eventSequence: UInt64 = 0
    public var uniqueKeys: [UniqueKeyTombstone] = []
    public var schedules: [ScheduleSnapshot] = []

    public init() {}
}

/// Why a store could not make a batch durable. The batch's changes are not on disk; the
/// store keeps working and a later batch may succeed (a disk that filled up and was freed).
public struct StoreWriteError: Error, CustomStringConvertible {
    public let reason: String
    /// The disk is full or failing, rather than the batch being at fault.
    public let isStorageFailure: Bool
    public var description: String { reason }
}

/// Where the engine's settled changes become durable: the engine stays in memory and pure,
/// and hands each turn's changes to a store, which never hands SQL back. A PostgreSQL store
/// for several replicas implements the same protocol (see docs/SCALING.md).
///
/// Threading: `write` and `close` are called on the loop thread; completions come back there,
/// in the order of the writes, through the hop the store was given.
public protocol TaskStore: AnyObject {
    func write(_ batch: StoreBatch, completion: @escaping (Result<Void, StoreWriteError>) -> Void)
    /// Writes what is queued, then releases the database and the data dir's lock.
    func close()
}
