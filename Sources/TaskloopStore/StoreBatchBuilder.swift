import TaskloopEngine

/// Gathers the engine's settled batches of one loop turn into one `StoreBatch`: each task,
/// workflow and queue changed in the turn is snapshotted once, when the turn ends, as it is
/// then.
///
/// Threading: the engine's (loop) thread.
public struct StoreBatchBuilder {
    /// Tasks changed in the turn, in order of first change; a task changed by several events
    /// in a row (submitted, started, finished) is listed once, others are deduplicated in `take`.
    private var tasks: [TaskRecord] = []
    /// Held (not just their identities) until `take`, so no new record can reuse an address.
    private var evictedRecords: [TaskRecord] = []
    private var workflows: [WorkflowRecord] = []
    private var queues: [String: TaskQueue] = [:]
    private var evictedTasks: [StoredTaskKey] = []
    private var evictedWorkflows: [TaskID] = []
    private var forgottenQueues: [String] = []
    private var idempotencyKeys: [IdempotencyRecord] = []
    private var expiredIdempotencyKeys: [String] = []
    /// Webhooks and deliveries as the turn left them (the latest write of each wins).
    private var webhooks: [String: WebhookRecord] = [:]
    private var deletedWebhooks: [String] = []
    private var deliveries: [String: DeliveryRecord] = [:]
    private var deletedDeliveries: [String] = []

    public init() {}

    public var isEmpty: Bool {
        tasks.isEmpty && workflows.isEmpty && queues.isEmpty && evictedTasks.isEmpty && forgottenQueues.isEmpty
            && idempotencyKeys.isEmpty && expiredIdempotencyKeys.isEmpty && webhooks.isEmpty && deletedWebhooks.isEmpty
            && deliveries.isEmpty && deletedDeliveries.isEmpty
    }

    public mutating func write(_ webhook: WebhookRecord) {
        webhooks[webhook.id] = webhook
    }

    /// The webhook and every delivery of it go.
    public mutating func delete(webhook id: String) {
        webhooks.removeValue(forKey: id)
        deliveries = deliveries.filter { $0.value.webhook != id }
        deletedWebhooks.append(id)
    }

    public mutating func write(_ delivery: DeliveryRecord) {
        deliveries[delivery.id] = delivery
    }

    public mutating func delete(deliveries ids: [String]) {
        for id in ids { deliveries.removeValue(forKey: id) }
        deletedDeliveries += ids
    }

    /// A key used for the first time: written in the same transaction as what it created.
    public mutating func add(_ key: IdempotencyRecord) {
        idempotencyKeys.append(key)
    }

    public mutating func expire(_ keys: [String]) {
        let expired = Set(keys)
        idempotencyKeys.removeAll { expired.contains($0.key) }
        expiredIdempotencyKeys += keys
    }

    public mutating func add(_ events: [EngineEvent]) {
        for event in events {
            switch event {
            case .submitted(let record), .stateChanged(let record, _, _), .progressed(let record), .cancelRequested(let record),
                 .leaseRenewed(let record):
                if tasks.last !== record { tasks.append(record) }
            case .workflowSubmitted(let workflow):
                workflows.append(workflow)
            case .queueChanged(let queue):
                queues[queue.name] = queue
                forgottenQueues.removeAll { $0 == queue.name }
            case .queueForgotten(let name):
                queues.removeValue(forKey: name)
                forgottenQueues.append(name)
            case .evicted(let record, let workflowEmptied):
                // `take` skips it if it also changed in this turn.
                evictedRecords.append(record)
                evictedTasks.append(StoredTaskKey(id: record.id, sequence: record.sequence))
                if workflowEmptied, let workflow = record.workflow {
                    workflows.removeAll { $0 === workflow }
                    evictedWorkflows.append(workflow.id)
                }
            }
        }
    }

    /// The turn's batch, snapshotted now; the builder starts afresh.
    public mutating func take(from engine: Engine) -> StoreBatch {
        var batch = StoreBatch()
        batch.tasks.reserveCapacity(tasks.count)
        // Evicted in the same turn: only the deletion is written.
        var seen = Set<ObjectIdentifier>(minimumCapacity: tasks.count + evictedRecords.count)
        for record in evictedRecords { seen.insert(ObjectIdentifier(record)) }
        for record in tasks where seen.insert(ObjectIdentifier(record)).inserted {
            batch.tasks.append(engine.snapshot(of: record))
        }
        batch.workflows = workflows.map { engine.snapshot(of: $0) }
        batch.queues = queues.values.map { engine.snapshot(of: $0) }
        batch.evictedTasks = evictedTasks
        batch.evictedWorkflows = evictedWorkflows
        batch.forgottenQueues = forgottenQueues
        batch.idempotencyKeys = idempotencyKeys
        batch.expiredIdempotencyKeys = expiredIdempotencyKeys
        batch.webhooks = Array(webhooks.values)
        batch.deletedWebhooks = deletedWebhooks
        batch.deliveries = Array(deliveries.values)
        batch.deletedDeliveries = deletedDeliveries
        self = StoreBatchBuilder()
        return batch
    }
}
