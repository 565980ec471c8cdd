import TaskloopEngine
import TaskloopLoop
import TaskloopPostgres

/// The shared database of several replicas (docs/SCALING.md): PostgreSQL holds every record
/// and one order of turns. A replica changes anything only inside a turn: a transaction that
/// takes the turn lock (an advisory lock, so turns of all replicas form one order), reads what
/// other replicas committed since this replica's last turn, lets the replica do its work, and
/// writes what changed with the turn's number. Rows carry the turn that last wrote them, and
/// deletions leave a removal behind, so "what changed since turn N" is one indexed read per
/// table. Between turns, a replica catches up with a read of the same kind (`catchUp`), woken
/// by the `NOTIFY` each turn sends as it commits.
///
/// Three connections: one for the turns and reads, whose batches are pipelined; one that
/// listens; one for this replica's lease, whose renewals must not wait behind the turn lock
/// (a replica waiting for its turn longer than its lease would be taken for gone).
///
/// Threading: the loop's thread only; completions come back on it.
public final class PostgresJournal {
    public struct Settings: Sendable {
        public var url: String
        /// This replica's name in the `replicas` table and on the attempts it runs.
        public var replica: String
        /// This process among those that have used the name: new at each start, kept when the
        /// process starts over.
        public var incarnation = String(UInt64.random(in: .min ... .max), radix: 16)
        /// A replica that has not renewed its lease for this long is gone.
        public var leaseMilliseconds: UInt64 = 10_000
        /// Events and removals older than this are dropped (`--event-history-seconds`); a
        /// replica further behind than the oldest turn kept reloads everything.
        public var eventHistoryMilliseconds: Int64 = 3_600_000
        /// The newest events loaded at start (for resumes).
        public var loadedEvents = 10_000
        /// What every connection gives a silent peer (a replica frozen inside a turn, a
        /// vanished server); also the longest a statement may run.
        public var timeouts = PGTimeouts(seconds: 5)

        public init(url: String, replica: String) {
            self.url = url
            self.replica = replica
        }
    }

    /// Everything the database holds, for a replica starting (or starting over).
    public struct Loaded: Sendable {
        public var state = StoredState()
        public var turn: UInt64 = 0
        /// The newest events, oldest first.
        public var events: [SharedEvent] = []
        public var deliveryOwners: [String: String] = [:]
    }

    public let settings: Settings
    private let loop: EventLoop
    private let connection: PGConnection
    private let listener: PGConnection
    private let leases: PGConnection
    /// Called with the turn number each committed turn announces.
    public var onTurnCommitted: ((UInt64) -> Void)?
    /// Called once if either connection ends; the journal is then done.
    public var onLost: ((PGError) -> Void)?
    private var lost = false
    /// When a turn next drops history past `eventHistoryMilliseconds` (loop time, ms): a second
    /// after the last drop, or at once while drops find whole chunks.
    private var nextTrim: UInt64 = 0
    /// The transaction of the turn under way, taken as the turn begins.
    private var turnTransaction: String?
    /// The connection ended during a commit, and another connection asks what became of it:
    /// the loss is reported (`onLost`) once the commit's outcome is known.
    public private(set) var isResolvingCommit = false
    private var lossAfterResolving: PGError?

    public init(loop: EventLoop, settings: Settings) {
        self.loop = loop
        self.settings = settings
        connection = PGConnection(loop: loop)
        listener = PGConnection(loop: loop)
        leases = PGConnection(loop: loop)
    }

    // MARK: opening

    /// Connects, brings the schema up to date (one replica at a time, under the migration
    /// lock), registers this replica, and loads everything.
    ///
    /// A process starting (`replacing`) takes its name over from any earlier process of that
    /// name at once: one killed, whose attempts its first turn interrupts, or one still running
    /// by mistake, which stops at its next turn or renewal (`replicaReplaced`). A process
    /// starting over takes only its own row back: it fails with `replicaReplaced` if another
    /// holds the name (two processes would otherwise take it from each other for ever).
    public func open(replacing: Bool = true, _ completion: @escaping (Result<Loaded, PGError>) -> Void) {
        connection.onClosed = { [unowned self] error in lose(error) }
        listener.onClosed = { [unowned self] error in lose(error) }
        leases.onClosed = { [unowned self] error in lose(error) }
        listener.onNotification = { [unowned self] _, payload in
            if let turn = UInt64(payload) { onTurnCommitted?(turn) }
        }
        connection.connect(settings.url, timeouts: settings.timeouts) { [unowned self] result in
            if case .failure(let error) = result { return completion(.failure(error)) }
            listener.connect(settings.url, timeouts: settings.timeouts) { [unowned self] result in
                if case .failure(let error) = result { return completion(.failure(error)) }
                listener.execute([PGQuery("LISTEN taskloop")]) { [unowned self] result in
                    if case .failure(let error) = result { return completion(.failure(error)) }
                    leases.connect(settings.url, timeouts: settings.timeouts) { [unowned self] result in
                        if case .failure(let error) = result { return completion(.failure(error)) }
                        migrate { [unowned self] result in
                            if case .failure(let error) = result { return completion(.failure(error)) }
                            register(replacing: replacing) { [unowned self] result in
                                if case .failure(let error) = result { return completion(.failure(error)) }
                                loadEverything(completion)
                            }
                        }
                    }
                }
            }
        }
    }

    private func migrate(_ completion: @escaping (Result<Void, PGError>) -> Void) {
        connection.execute([
            // A turn's reads find a few rows by an index. Before a table's statistics cover the
            // newest turns, the planner may expect thousands, and then JIT-compile the query or
            // start parallel workers for it: measured, 1.7 ms of a 3 ms turn went to that.
            PGQuery("SET jit = off"),
            PGQuery("SET max_parallel_workers_per_gather = 0"),
            // Prepared statements spare the parsing; each execution is still planned for its
            // own turn number (a generic plan of `turn > $1` expects a third of the table).
            PGQuery("SET plan_cache_mode = force_custom_plan"),
            PGQuery("SELECT pg_advisory_lock(\(SharedSchema.migrationLock))"),
            PGQuery("CREATE SCHEMA IF NOT EXISTS taskloop"),
            PGQuery("CREATE TABLE IF NOT EXISTS taskloop.state (id int PRIMARY KEY CHECK (id = 1), schema_version int NOT NULL, "
                    + "turn bigint NOT NULL, event_seq bigint NOT NULL, horizon bigint NOT NULL)"),
            PGQuery("INSERT INTO taskloop.state VALUES (1, 0, 0, 0, 0) ON CONFLICT (id) DO NOTHING"),
            PGQuery("SELECT schema_version FROM taskloop.state"),
        ]) { [unowned self] result in
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let results):
                let version = Int(results[7].int(0, 0) ?? 0)
                guard version <= SharedSchema.version else {
                    return unlock(then: completion, .failure(PGError(
                        message: "the database's schema is version \(version), newer than this server's \(SharedSchema.version)")))
                }
                var queries = [PGQuery("BEGIN")]
                for migration in SharedSchema.migrations where migration.version > version {
                    queries += migration.statements.map { PGQuery($0) }
                }
                queries += [PGQuery("UPDATE taskloop.state SET schema_version = \(SharedSchema.version)"), PGQuery("COMMIT")]
                connection.execute(version == SharedSchema.version ? [] : queries) { [unowned self] result in
                    switch result {
                    case .success: unlock(then: completion, .success(()))
                    case .failure(let error):
                        connection.execute([PGQuery("ROLLBACK")]) { [unowned self] _ in unlock(then: completion, .failure(error)) }
                    }
                }
            }
        }
    }

    private func unlock(then completion: @escaping (Result<Void, PGError>) -> Void, _ outcome: Result<Void, PGError>) {
        connection.execute([PGQuery("SELECT pg_advisory_unlock(\(SharedSchema.migrationLock))")]) { result in
            if case .failure(let error) = result { return completion(.failure(error)) }
            completion(outcome)
        }
    }

    private func register(replacing: Bool, _ completion: @escaping (Result<Void, PGError>) -> Void) {
        leases.execute([PGQuery(
            "INSERT INTO taskloop.replicas (name, incarnation, started_at, expires_at) "
                + "VALUES ($1, $3, clock_timestamp(), clock_timestamp() + $2 * interval '1 millisecond') "
                + "ON CONFLICT (name) DO UPDATE SET incarnation = excluded.incarnation, started_at = excluded.started_at, "
                + "expires_at = excluded.expires_at WHERE $4 OR replicas.incarnation = excluded.incarnation",
            [.text(settings.replica), .int(Int64(settings.leaseMilliseconds)), .text(settings.incarnation), .bool(replacing)])]) {
            [unowned self] result in
            completion(result.flatMap { results in results[0].affectedRows == 1 ? .success(()) : .failure(replaced) })
        }
    }

    /// Everything, read in one snapshot.
    public func loadEverything(_ completion: @escaping (Result<Loaded, PGError>) -> Void) {
        let events = PGQuery(
            "SELECT seq, type, time, task, workflow, queue, ends_task, data FROM (SELECT * FROM taskloop.events ORDER BY seq DESC LIMIT $1) newest ORDER BY seq",
            [.int(settings.loadedEvents)], binaryResults: true)
        connection.execute([
            PGQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
            PGQuery("SELECT turn, event_seq FROM taskloop.state", binaryResults: true),
            PGQuery("SELECT sequence, record FROM taskloop.tasks ORDER BY sequence", binaryResults: true),
            PGQuery("SELECT id, record FROM taskloop.workflows", binaryResults: true),
            PGQuery("SELECT name, max_concurrency, paused, dispatch FROM taskloop.queues", binaryResults: true),
            PGQuery("SELECT key, request_hash, status, resource, expires_at FROM taskloop.idempotency_keys", binaryResults: true),
            PGQuery("SELECT record FROM taskloop.webhooks", binaryResults: true),
            PGQuery("SELECT owner, record FROM taskloop.webhook_deliveries ORDER BY event_seq, id", binaryResults: true),
            events,
            PGQuery("COMMIT"),
        ]) { result in
            completion(result.flatMap { results in
                do {
                    var loaded = Loaded()
                    loaded.turn = UInt64(results[1].int(0, 0) ?? 0)
                    loaded.state.eventSequence = UInt64(results[1].int(0, 1) ?? 0)
                    loaded.state.tasks = try Self.tasks(results[2])
                    loaded.state.workflows = try Self.workflows(results[3])
                    loaded.state.queues = Self.queues(results[4])
                    loaded.state.idempotencyKeys = Self.keys(results[5])
                    loaded.state.webhooks = try Self.webhooks(results[6])
                    for (record, owner) in try Self.deliveries(results[7]) {
                        loaded.state.deliveries.append(record)
                        loaded.deliveryOwners[record.id] = owner
                    }
                    loaded.events = Self.events(results[8])
                    return .success(loaded)
                } catch {
                    return .failure(PGError(message: "\(error)"))
                }
            })
        }
    }

    // MARK: turns

    /// Opens a turn: takes the turn lock (waiting for another replica's turn to end), then
    /// reads what was committed after turn `applied`. The transaction stays open until
    /// `commitTurn` or `abandonTurn`. Nil when this replica fell behind the retained history
    /// (it must reload everything).
    ///
    /// The wait for the lock has no timeout: a turn that holds it ends, or its session is ended
    /// by the server once idle for the timeout, which a waiter's own timeout of the same length
    /// would race (and lose, as it started waiting first). The turn itself has the timeouts.
    public func beginTurn(after applied: UInt64, _ completion: @escaping (Result<SharedDelta?, PGError>) -> Void) {
        turnTransaction = nil
        let timeout = PGValue.text(String(settings.timeouts.seconds * 1_000))
        connection.execute([
            PGQuery("BEGIN"),
            // Should the connection end before COMMIT's answer, this says whether the turn committed.
            PGQuery(SharedSchema.currentTransaction),
            PGQuery(SharedSchema.waitWithoutTimeouts),
            PGQuery(SharedSchema.takeTurnLock),
            PGQuery(SharedSchema.restoreTimeouts, [timeout]),
            PGQuery(SharedSchema.readState, binaryResults: true),
        ] + Self.deltaQueries(after: applied) + [
            PGQuery(SharedSchema.goneReplicas, [.text(settings.replica)]),
            // Under the turn lock: a process that took the name over did so before this turn,
            // or its first turn comes after this one and interrupts what this one starts.
            PGQuery(SharedSchema.nameHolder, [.text(settings.replica)]),
        ]) { [unowned self] result in
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let results):
                turnTransaction = results[1].text(0, 0)
                if let displaced = displacement(results[results.count - 1]) {
                    return abandonTurn { completion(.failure(displaced)) }
                }
                completion(delta(results, stateAt: 5, after: applied, goneAt: results.count - 2))
            }
        }
    }

    /// Writes this replica's turn (number `turn`, one after what `beginTurn` read) and commits,
    /// announcing it. What is written: `batch` (tasks, workflows, queues, keys, webhooks and
    /// deliveries; deletions as removals), `events`, and the replicas this turn found gone.
    /// When the connection ends before COMMIT's answer, the outcome is asked for on another
    /// connection before `completion` is called (`resolveOutcome`): success when the turn did
    /// commit.
    public func commitTurn(_ turn: UInt64, _ batch: StoreBatch, events: [SharedEvent], eventSequence: UInt64,
                           goneReplicas: [String] = [], deliveryOwners: [String: String] = [:],
                           _ completion: @escaping (Result<Void, PGError>) -> Void) {
        var queries = SharedSchema.writes(of: batch, turn: turn, replica: settings.replica, deliveryOwners: deliveryOwners)
        queries += SharedSchema.insert(events, turn: turn)
        for name in goneReplicas { queries.append(PGQuery(SharedSchema.forgetReplica, [.text(name)])) }
        queries.append(PGQuery(SharedSchema.advance, [.int(Int64(turn)), .int(Int64(eventSequence))]))
        var trim: Int?
        if loop.now >= nextTrim {
            nextTrim = loop.now + 1_000
            trim = queries.count
            queries.append(PGQuery(SharedSchema.trimHistory, [.int(settings.eventHistoryMilliseconds), .int(SharedSchema.trimChunk)]))
        }
        queries.append(PGQuery("SELECT pg_notify('taskloop', $1)", [.text(String(turn))]))
        queries.append(PGQuery("COMMIT"))
        connection.execute(queries) { [unowned self] result in
            switch result {
            case .success(let results):
                if let trim, (results[trim].int(0, 0) ?? 0) >= Int64(SharedSchema.trimChunk) { nextTrim = 0 }
                completion(.success(()))
            case .failure(let error):
                guard !error.isConnectionLost else {
                    guard let transaction = turnTransaction else { return completion(.failure(error)) }
                    return resolveOutcome(of: transaction, lostWith: error, completion)
                }
                // Whatever failed, the transaction must not stay open (or aborted) on the
                // connection; a lost connection ends it by itself.
                connection.execute([PGQuery("ROLLBACK")]) { _ in completion(.failure(error)) }
            }
        }
    }

    /// The connection ended before COMMIT's answer came: the turn may have committed. Another
    /// connection asks what became of its transaction, and only then is `completion` called
    /// (and the loss reported): `committed` is a success; `aborted` the failure it was; while
    /// the transaction is still `in progress` (its server process has not yet noticed that the
    /// connection ended) or the database cannot be asked, the question is asked again, a little
    /// later each time.
    private func resolveOutcome(of transaction: String, lostWith error: PGError, attempt: Int = 0,
                                _ completion: @escaping (Result<Void, PGError>) -> Void) {
        isResolvingCommit = true
        let askAgain = { [unowned self] in
            guard let timer = try? LoopTimer(loop: loop) else { return finishResolving(.failure(error), completion) }
            timer.start(after: min(1_000, 10 << UInt64(min(attempt, 7)))) { [unowned self] in
                timer.close()
                resolveOutcome(of: transaction, lostWith: error, attempt: attempt + 1, completion)
            }
        }
        let probe = PGConnection(loop: loop)
        probe.connect(settings.url) { [unowned self] connected in
            guard case .success = connected else { return askAgain() }
            probe.execute([PGQuery(SharedSchema.transactionStatus, [.text(transaction)])]) { [unowned self] result in
                probe.close()
                switch result.map({ $0[0].text(0, 0) }) {
                case .success("committed"): finishResolving(.success(()), completion)
                case .success("in progress"), .failure: askAgain()
                case .success: finishResolving(.failure(error), completion)
                }
            }
        }
    }

    private func finishResolving(_ outcome: Result<Void, PGError>, _ completion: (Result<Void, PGError>) -> Void) {
        isResolvingCommit = false
        completion(outcome)
        if let loss = lossAfterResolving {
            lossAfterResolving = nil
            onLost?(loss)
        }
    }

    /// Gives the turn up, changing nothing.
    public func abandonTurn(_ completion: @escaping () -> Void = {}) {
        connection.execute([PGQuery("ROLLBACK")]) { _ in completion() }
    }

    /// Reads what was committed after turn `applied`, without taking the turn: in one snapshot,
    /// so a delta never holds half a turn. Nil when nothing was; `.success(nil)` also when this
    /// replica fell behind the retained history (`needsReload`).
    public func catchUp(after applied: UInt64, _ completion: @escaping (Result<SharedDelta?, PGError>) -> Void) {
        connection.execute([PGQuery(SharedSchema.readState, binaryResults: true)]) { [unowned self] result in
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let results):
                guard let turn = results[0].int(0, 0), UInt64(turn) > applied else { return completion(.success(nil)) }
                connection.execute([
                    PGQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
                    PGQuery(SharedSchema.readState, binaryResults: true),
                ] + Self.deltaQueries(after: applied) + [PGQuery("COMMIT")]) { [unowned self] result in
                    completion(result.flatMap { results in delta(results, stateAt: 1, after: applied, goneAt: nil) })
                }
            }
        }
    }

    /// Whether the last delta said this replica is behind the retained history.
    public private(set) var needsReload = false

    // MARK: the replica's lease

    /// Renews this replica's lease, from the moment the row is written. Fails with
    /// `replicaGone` when the row is not there: other replicas took it for gone, and have
    /// interrupted what it ran; with `replicaReplaced` when another process took the name over.
    public func renewLease(_ completion: @escaping (Result<Void, PGError>) -> Void) {
        leases.execute([
            PGQuery(SharedSchema.renewLease,
                    [.text(settings.replica), .int(Int64(settings.leaseMilliseconds)), .text(settings.incarnation)]),
            PGQuery(SharedSchema.nameHolder, [.text(settings.replica)]),
        ]) { [unowned self] result in
            completion(result.flatMap { results in
                results[0].affectedRows == 1 ? .success(()) : .failure(displacement(results[1]) ?? replaced)
            })
        }
    }

    /// Why this process may no longer act as its replica, from its row (`nameHolder`).
    private func displacement(_ holder: PGResult) -> PGError? {
        guard holder.rowCount == 1 else { return PGError(message: "this replica was taken for gone", sqlState: Self.replicaGone) }
        return holder.text(0, 0) == settings.incarnation ? nil : replaced
    }

    private var replaced: PGError {
        PGError(message: "another process took the replica name \(settings.replica) over", sqlState: Self.replicaReplaced)
    }

    /// The error state of a turn or a renewal when this replica was taken for gone.
    public static let replicaGone = "TL001"
    /// The error state of an open, a turn or a renewal when another process holds this
    /// replica's name.
    public static let replicaReplaced = "TL002"

    /// Whether any replica's lease has expired (a turn then takes over what it ran).
    public func anyReplicaGone(_ completion: @escaping (Result<Bool, PGError>) -> Void) {
        leases.execute([PGQuery(SharedSchema.goneReplicas, [.text(settings.replica)])]) { result in
            completion(result.map { $0[0].rowCount > 0 })
        }
    }

    /// Leaves: this replica's row goes (what it still ran was handed back in its last turn).
    public func close(_ completion: @escaping () -> Void) {
        guard !lost else { return completion() }
        leases.execute([PGQuery("DELETE FROM taskloop.replicas WHERE name = $1 AND incarnation = $2",
                                [.text(settings.replica), .text(settings.incarnation)])]) { [self] _ in
            lost = true
            connection.close()
            listener.close()
            leases.close()
            completion()
        }
    }

    /// Closes the connections at once, failing what is in flight, without leaving: a replica
    /// starting over on a new journal keeps its row, and one replaced leaves it to the process
    /// that holds the name now. (A connection dropped unclosed would leave its socket's poll
    /// behind, and the next connection given the same descriptor could not be watched.)
    public func discard() {
        guard !lost else { return }
        lost = true
        connection.close()
        listener.close()
        leases.close()
    }

    private func lose(_ error: PGError) {
        guard !lost else { return }
        lost = true
        connection.close()
        listener.close()
        leases.close()
        // A commit under way gets its outcome first (closing the connection may have begun
        // asking for it).
        if isResolvingCommit { lossAfterResolving = error } else { onLost?(error) }
    }

    // MARK: reading rows

    private static func deltaQueries(after applied: UInt64) -> [PGQuery] {
        let since = PGValue.int(Int64(applied))
        return [PGQuery(SharedSchema.horizon, binaryResults: true)]
            + SharedSchema.deltaReads.map { PGQuery($0, [since], binaryResults: true) }
    }

    /// The delta in `results` (its state row at `stateAt`, then the delta queries).
    private func delta(_ results: [PGResult], stateAt state: Int, after applied: UInt64, goneAt gone: Int?)
        -> Result<SharedDelta?, PGError> {
        do {
            var delta = SharedDelta()
            delta.turn = UInt64(results[state].int(0, 0) ?? 0)
            delta.eventSequence = UInt64(results[state].int(0, 1) ?? 0)
            let first = state + 1
            if UInt64(results[first].int(0, 0) ?? 0) > applied {
                needsReload = true
                return .success(nil)
            }
            delta.changes.tasks = try Self.tasks(results[first + 1])
            delta.changes.workflows = try Self.workflows(results[first + 2])
            delta.changes.queues = Self.queues(results[first + 3])
            delta.idempotencyKeys = Self.keys(results[first + 4])
            delta.webhooks = try Self.webhooks(results[first + 5])
            delta.deliveries = try Self.deliveries(results[first + 6])
            let removals = results[first + 7]
            for row in 0..<removals.rowCount {
                guard let kind = removals.int(row, 0), let key = removals.text(row, 1) else { continue }
                switch SharedSchema.Removal(rawValue: Int(kind)) {
                case .task:
                    let parts = key.split(separator: ":")
                    if parts.count == 2, let id = TaskID(String(parts[0])), let sequence = UInt64(parts[1]) {
                        delta.changes.evictedTasks.append(StoredTaskKey(id: id, sequence: sequence))
                    }
                case .workflow: if let id = TaskID(key) { delta.changes.evictedWorkflows.append(id) }
                case .queue: delta.changes.forgottenQueues.append(key)
                case .idempotencyKey: delta.expiredIdempotencyKeys.append(key)
                case .webhook: delta.deletedWebhooks.append(key)
                case .delivery: delta.deletedDeliveries.append(key)
                case nil: break
                }
            }
            delta.events = Self.events(results[first + 8])
            if let gone {
                let rows = results[gone]
                delta.goneReplicas = (0..<rows.rowCount).compactMap { rows.text($0, 0) }
            }
            return .success(delta)
        } catch {
            return .failure(PGError(message: "\(error)"))
        }
    }

    static func tasks(_ rows: PGResult) throws -> [TaskSnapshot] {
        var tasks: [TaskSnapshot] = []
        tasks.reserveCapacity(rows.rowCount)
        for row in 0..<rows.rowCount {
            let bytes = rows.bytes(row, 1) ?? []
            let sequence = UInt64(rows.int(row, 0) ?? 0)
            tasks.append(try bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) in
                try RecordCodec.decodeTask(buffer, sequence: sequence)
            })
        }
        return tasks
    }

    static func workflows(_ rows: PGResult) throws -> [WorkflowSnapshot] {
        try (0..<rows.rowCount).map { row in
            guard let id = rows.text(row, 0).flatMap({ TaskID($0) }) else { throw RecordDecodingError(table: "workflows", reason: "a bad id") }
            let bytes = rows.bytes(row, 1) ?? []
            return try bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) in try RecordCodec.decodeWorkflow(buffer, id: id) }
        }
    }

    static func queues(_ rows: PGResult) -> [QueueSnapshot] {
        (0..<rows.rowCount).map { row in
            QueueSnapshot(name: rows.text(row, 0) ?? "", maxConcurrency: Int(rows.int(row, 1) ?? 1), paused: rows.bool(row, 2) ?? false,
                          dispatch: QueueDispatch(rawValue: rows.text(row, 3) ?? "") ?? .server)
        }
    }

    static func keys(_ rows: PGResult) -> [IdempotencyRecord] {
        (0..<rows.rowCount).map { row in
            IdempotencyRecord(key: rows.text(row, 0) ?? "", requestHash: rows.bytes(row, 1) ?? [], status: Int(rows.int(row, 2) ?? 0),
                              resource: rows.text(row, 3) ?? "", expiresAt: rows.int(row, 4) ?? 0)
        }
    }

    private static func webhooks(_ rows: PGResult) throws -> [WebhookRecord] {
        try (0..<rows.rowCount).map { row in try SharedRecordCodec.decodeWebhook(rows.bytes(row, 0) ?? []) }
    }

    private static func deliveries(_ rows: PGResult) throws -> [(record: DeliveryRecord, owner: String)] {
        try (0..<rows.rowCount).map { row in
            (try SharedRecordCodec.decodeDelivery(rows.bytes(row, 1) ?? []), rows.text(row, 0) ?? "")
        }
    }

    private static func events(_ rows: PGResult) -> [SharedEvent] {
        (0..<rows.rowCount).map { row in
            SharedEvent(seq: UInt64(rows.int(row, 0) ?? 0), type: rows.text(row, 1) ?? "", time: rows.int(row, 2) ?? 0,
                        task: rows.text(row, 3).flatMap { TaskID($0) }, workflow: rows.text(row, 4).flatMap { TaskID($0) },
                        queue: rows.text(row, 5), endsTask: rows.bool(row, 6) ?? false, data: rows.bytes(row, 7) ?? [])
        }
    }
}
