import Logging
import TaskloopEngine
import TaskloopLoop
import TaskloopStore

/// How the service keeps its state (`--durability`).
public enum Durability: String, Sendable, CaseIterable {
    /// Every change committed and fsynced before an answer shows it.
    case full
    /// Committed to the write-ahead log: survives the process dying, not the machine.
    case normal
    /// Nothing on disk, as in v1; no data dir is touched.
    case memory
}

/// Where webhooks and their deliveries are kept: the service's journal, or with cells the
/// cluster's webhooks table and each cell's commits (`CellWebhookJournal`).
///
/// Threading: loop thread only.
protocol WebhookJournal: AnyObject {
    func record(_ webhook: WebhookRecord)
    func delete(webhook id: String)
    func record(_ delivery: DeliveryRecord)
    func delete(deliveries ids: [String])
    /// The batch a change made now will be committed in, or nil when everything so far is.
    var pendingBatch: Int? { get }
}

/// Where a single server's changes become durable, and when answers may leave: `DurableState`,
/// the embedded SQLite store (replicas commit each cell's changes through `CellHost`).
///
/// Threading: loop thread only.
protocol Journal: WebhookJournal {
    func record(_ events: [EngineEvent])
    func record(_ key: IdempotencyRecord)
    func expire(_ keys: [String])
    /// Nothing changed and uncommitted: an answer may leave at once.
    var isCaughtUp: Bool { get }
    /// Runs `action(true)` once every change made so far is committed; `action(false)` when the
    /// batch it waited for could not be.
    func whenDurable(_ action: @escaping (Bool) -> Void)
    /// Changes cannot be made durable now: changing requests are refused.
    var isFailing: Bool { get }
    /// Told the number of each batch that commits (all before it have too).
    var onCommitted: ((Int) -> Void)? { get set }
    /// The event stream's last number, kept with each batch so numbers never repeat.
    var eventSequence: (() -> UInt64)? { get set }
    /// The live record of an idempotency key, to write it again after a failed batch.
    var currentKey: ((String) -> IdempotencyRecord?)? { get set }
}

/// Between the engine and its store, on the loop thread: every settled change of one loop turn
/// goes to the store as one batch when the turn ends (group commit), and answers wait until
/// what they may show is committed, so no client sees a state a crash could take back.
///
/// When the store cannot write (a full or failing disk), answers that waited on the failed
/// batch become 503, requests that would change state are refused, reads go on, and the
/// unwritten records are written again, from the engine's current state, every second until
/// a write succeeds; then all is as before.
///
/// Threading: loop thread only (the store's completions arrive through `EventLoop.execute`).
final class DurableState: Journal {
    let store: TaskStore
    private unowned let engine: Engine
    private let scheduler: EngineScheduler
    private let logger: Logger
    private var builder = StoreBatchBuilder()
    private var endOfTurn: LoopCheck?
    /// Batches handed to the store, and how many of them it has answered (in order).
    private var sent = 0
    private var answered = 0
    /// Batches handed to the store so far (each one transaction).
    var sentBatches: Int { sent }
    private var waiting: [(batch: Int, action: (Bool) -> Void)] = []
    private var firstWaiting = 0
    /// What a failed batch held, written again from the engine's state as it is by then.
    private var unwrittenTasks = Set<StoredTaskKey>()
    private var unwrittenWorkflows = Set<TaskID>()
    private var unwrittenQueues = Set<String>()
    private var unwrittenKeys = Set<String>()
    /// Webhook changes of a failed batch, as they were: merged before the next batch's own.
    private var unwrittenWebhookChanges = StoreBatch()
    /// The live record of an idempotency key, to write it again after a failed batch.
    var currentKey: ((String) -> IdempotencyRecord?)?
    /// The event stream's last number, kept with each batch so numbers never repeat.
    var eventSequence: (() -> UInt64)?
    /// Told the number of each batch that commits (all before it have too).
    var onCommitted: ((Int) -> Void)?

    /// The batch a change made now will be committed in, or nil when everything so far is
    /// (while writes fail, the retry that will carry it).
    var pendingBatch: Int? {
        if isFailing { return sent + 1 }
        let target = builder.isEmpty ? sent : sent + 1
        return answered < target ? target : nil
    }
    private var retry: ScheduledAction?
    private(set) var isFailing = false

    init(store: TaskStore, engine: Engine, loop: EventLoop, scheduler: EngineScheduler, logger: Logger) throws(UVError) {
        self.store = store
        self.engine = engine
        self.scheduler = scheduler
        self.logger = logger
        endOfTurn = try LoopCheck(loop: loop) { [unowned self] in
            if !builder.isEmpty { send() }
        }
    }

    func record(_ events: [EngineEvent]) {
        builder.add(events)
    }

    func record(_ key: IdempotencyRecord) {
        builder.add(key)
    }

    func expire(_ keys: [String]) {
        builder.expire(keys)
    }

    func record(_ webhook: WebhookRecord) {
        builder.write(webhook)
    }

    func delete(webhook id: String) {
        builder.delete(webhook: id)
    }

    func record(_ delivery: DeliveryRecord) {
        builder.write(delivery)
    }

    func delete(deliveries ids: [String]) {
        builder.delete(deliveries: ids)
    }

    private var hasUnwritten: Bool {
        !unwrittenTasks.isEmpty || !unwrittenWorkflows.isEmpty || !unwrittenQueues.isEmpty || !unwrittenKeys.isEmpty
            || unwrittenWebhookChanges.hasWebhookChanges || unwrittenWebhookChanges.hasUniqueKeyChanges
    }

    /// Runs `action(true)` once every change made so far is committed: at once when nothing is
    /// in flight. `action(false)` when the batch it waited for could not be written.
    /// Nothing changed and uncommitted: an answer may leave at once.
    var isCaughtUp: Bool { builder.isEmpty && answered == sent }

    func whenDurable(_ action: @escaping (Bool) -> Void) {
        let target = builder.isEmpty ? sent : sent + 1
        guard answered < target else { return action(true) }
        waiting.append((target, action))
    }

    /// Sends what is left and closes the store (which writes it before returning).
    func close() {
        retry?.cancel()
        retry = nil
        if !builder.isEmpty || hasUnwritten { send() }
        endOfTurn?.close()
        endOfTurn = nil
        store.close()
    }

    private func send() {
        var batch = builder.take(from: engine)
        if hasUnwritten { batch = rewrite().merged(with: batch) }
        guard !batch.isEmpty else { return }
        batch.eventSequence = eventSequence?()
        sent += 1
        let number = sent
        let started = engine.markHeldStarts()
        store.write(batch) { [weak self] result in
            guard let self else { return }
            if case .failure(let error) = result {
                // Which records it held; they are written again as they are by then.
                unwrittenTasks.formUnion(batch.tasks.lazy.map(\.storedKey))
                unwrittenTasks.formUnion(batch.evictedTasks)
                unwrittenWorkflows.formUnion(batch.workflows.lazy.map(\.id))
                unwrittenWorkflows.formUnion(batch.evictedWorkflows)
                unwrittenQueues.formUnion(batch.queues.lazy.map(\.name))
                unwrittenQueues.formUnion(batch.forgottenQueues)
                unwrittenKeys.formUnion(batch.idempotencyKeys.lazy.map(\.key))
                unwrittenKeys.formUnion(batch.expiredIdempotencyKeys)
                unwrittenWebhookChanges = unwrittenWebhookChanges.merged(with: batch.webhookChanges)
                    .merged(with: batch.uniqueKeyChanges)
                failed(error)
            } else if isFailing && !hasUnwritten {
                isFailing = false
                logger.info("storage writes again; changes are accepted")
            }
            // A failed batch's attempts wait for the batch that writes them again.
            if case .success = result { engine.releaseStarts(through: started) }
            answer(through: number, committed: (try? result.get()) != nil)
            if case .success = result { onCommitted?(number) }
        }
    }

    /// The unwritten records as the engine holds them now (gone ones as deletions).
    private func rewrite() -> StoreBatch {
        var batch = StoreBatch()
        for key in unwrittenTasks {
            if let record = engine.task(key.id) { batch.tasks.append(engine.snapshot(of: record)) } else {
                batch.evictedTasks.append(key)
            }
        }
        for id in unwrittenWorkflows {
            if let workflow = engine.workflow(id) { batch.workflows.append(engine.snapshot(of: workflow)) } else {
                batch.evictedWorkflows.append(id)
            }
        }
        for name in unwrittenQueues {
            if let queue = engine.queues[name] { batch.queues.append(engine.snapshot(of: queue)) } else {
                batch.forgottenQueues.append(name)
            }
        }
        for key in unwrittenKeys {
            if let record = currentKey?(key) { batch.idempotencyKeys.append(record) } else { batch.expiredIdempotencyKeys.append(key) }
        }
        unwrittenTasks.removeAll()
        unwrittenWorkflows.removeAll()
        unwrittenQueues.removeAll()
        unwrittenKeys.removeAll()
        batch = unwrittenWebhookChanges.merged(with: batch)
        unwrittenWebhookChanges = StoreBatch()
        return batch
    }

    private func failed(_ error: StoreWriteError) {
        if !isFailing { logger.error("storage cannot write; changes are refused until it can", metadata: ["error": "\(error)"]) }
        isFailing = true
        guard retry == nil else { return }
        retry = scheduler.schedule(after: 1_000) { [weak self] in
            guard let self else { return }
            retry = nil
            send()
        }
    }

    private func answer(through number: Int, committed: Bool) {
        answered = number
        while firstWaiting < waiting.count, waiting[firstWaiting].batch <= number {
            let action = waiting[firstWaiting].action
            // Answers for earlier batches were sent when those were answered.
            action(committed)
            firstWaiting += 1
        }
        if firstWaiting == waiting.count {
            waiting.removeAll(keepingCapacity: true)
            firstWaiting = 0
        }
    }
}
