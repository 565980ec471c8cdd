import TaskloopEngine

/// Gathers the engine's settled batches of one loop turn into one `StoreBatch`: each task,
/// workflow and queue changed in the turn is snapshotted once, when the turn ends, as it is
/// then.
///
/// Threading: the engine's (loop) thread.
public struct StoreBatchBuilder {
    /// Tasks, workflows and queues changed in the turn.
    private var changes = ChangeCollector()
    private var idempotencyKeys: [IdempotencyRecord] = []
    private var expiredIdempotencyKeys: [String] = []
    /// Webhooks and deliveries as the turn left them (the latest write of each wins).
    private var webhooks: [String: WebhookRecord] = [:]
    private var deletedWebhooks: [String] = []
    private var deliveries: [String: DeliveryRecord] = [:]
    private var deletedDeliveries: [String] = []

    public init() {}

    public var isEmpty: Bool {
        changes.isEmpty && idempotencyKeys.isEmpty && expiredIdempotencyKeys.isEmpty && webhooks.isEmpty && deletedWebhooks.isEmpty
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
        changes.add(events)
    }

    /// The turn's batch, snapshotted now; the builder starts afresh.
    public mutating func take(from engine: Engine) -> StoreBatch {
        var batch = StoreBatch()
        let shared = changes.take(from: engine)
        batch.tasks = shared.tasks
        batch.evictedTasks = shared.evictedTasks
        batch.workflows = shared.workflows
        batch.evictedWorkflows = shared.evictedWorkflows
        batch.queues = shared.queues
        batch.forgottenQueues = shared.forgottenQueues
        batch.messages = shared.messages
        batch.uniqueKeys = shared.uniqueKeys
        batch.droppedUniqueKeys = shared.droppedUniqueKeys
        batch.schedules = shared.schedules
        batch.deletedSchedules = shared.deletedSchedules
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
