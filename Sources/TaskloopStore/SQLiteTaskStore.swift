import CSQLite
import Glibc
import TaskloopEngine

/// The store of one server: SQLite in a data directory, written by its own thread.
public final class SQLiteTaskStore: TaskStore {
    public let directory: DataDirectory
    private let writer: StoreWriter
    /// What the database held when the store was opened, until `takeLoaded()`.
    private var loaded: StoredState?

    /// Locks the data dir, checks and migrates the schema, reads everything back (on the
    /// calling thread, before the server serves anyone), then starts the writer thread.
    public init(dataDirectory path: String, syncLevel: SyncLevel, deliver: @escaping StoreWriter.Deliver)
        throws(DataDirectoryError) {
        directory = try DataDirectory(path: path)
        let file = directory.databasePath
        let database: SQLiteDatabase
        do { database = try SQLiteDatabase(path: file) } catch { throw .unusable(path: file, reason: error.message) }
        try StoreSchema.prepare(database)
        do {
            loaded = try Self.load(database)
        } catch let error as SQLiteError {
            throw error.isStorageFailure ? .unusable(path: file, reason: error.message) : .damaged(path: file, reason: error.message)
        } catch {
            throw .damaged(path: file, reason: "\(error)")
        }
        do {
            writer = try StoreWriter(database: database, syncLevel: syncLevel, deliver: deliver)
        } catch {
            throw .unusable(path: file, reason: error.message)
        }
    }

    /// The state read at open; later calls get nothing (it is large, and restored once).
    public func takeLoaded() -> StoredState {
        defer { loaded = nil }
        return loaded ?? StoredState()
    }

    public func write(_ batch: StoreBatch, completion: @escaping (Result<Void, StoreWriteError>) -> Void) {
        let batch = UncheckedSendable(batch)
        writer.submit({ database in try Self.apply(batch.value, to: database) }) { result in
            completion(result.mapError { error in
                StoreWriteError(reason: error.description, isStorageFailure: error.isStorageFailure)
            })
        }
    }

    public func close() {
        writer.close()
        directory.release()
    }

    /// Caps the database at its present size plus `extraPages` (nil lifts the cap): a disk that
    /// fills up, for the tests of what the service does then. Applied in order with writes.
    package func limitGrowth(toExtraPages extraPages: Int?) {
        writer.submit({ database in
            if let extraPages {
                let pages = try database.integer("PRAGMA page_count") ?? 0
                try database.execute("PRAGMA max_page_count = \(pages + Int64(extraPages))")
            } else {
                try database.execute("PRAGMA max_page_count = 4294967294")
            }
        }, completion: { _ in })
    }

    /// Transactions committed so far.
    public var transactionsCommitted: Int { writer.transactionsCommitted }

    /// Writes a consistent copy of the data dir's database to `file`, 0600, while a server may
    /// be running on it: SQLite's `VACUUM INTO` reads one snapshot and takes no lock a writer
    /// would wait on. `file` must not exist: it is created here first, exclusively and not
    /// through a link, so a backup never replaces a file nor writes where a link points; SQLite
    /// then fills the empty file. To restore, copy the file to `taskloop.db` in an empty data dir.
    public static func backup(dataDirectory path: String, to file: String) throws(SQLiteError) {
        let database = try SQLiteDatabase(path: path + "/taskloop.db", mode: .readOnly)
        try database.execute("PRAGMA busy_timeout = 10000")
        guard try database.integer("PRAGMA user_version") ?? 0 > 0 else {
            throw SQLiteError(code: SQLITE_ERROR, message: "\(path) holds no Taskloop database", operation: "backup")
        }
        let output = open(file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard output >= 0 else {
            let reason = errno == EEXIST ? "it already exists (a backup never replaces a file, nor writes through a link)"
                : String(cString: strerror(errno))
            throw SQLiteError(code: SQLITE_CANTOPEN, message: "cannot create \(file): \(reason)", operation: "backup")
        }
        defer { Glibc.close(output) }
        var created = stat()
        fstat(output, &created)
        // Still the file made above: nobody put another in its place meanwhile.
        func isOurs() -> Bool {
            var now = stat()
            return lstat(file, &now) == 0 && now.st_dev == created.st_dev && now.st_ino == created.st_ino
        }
        do throws(SQLiteError) {
            // 0600 whatever the umask took away from the owner.
            fchmod(output, 0o600)
            try database.statement("VACUUM INTO ?").bind(1, file).run()
            guard isOurs() else {
                throw SQLiteError(code: SQLITE_CANTOPEN, message: "\(file) was replaced while the backup was written", operation: "backup")
            }
            guard fsync(output) == 0 else {
                throw SQLiteError(code: SQLITE_IOERR, message: "fsync \(file): \(String(cString: strerror(errno)))", operation: "backup")
            }
        } catch {
            if isOurs() { unlink(file) }
            throw error
        }
    }

    static func apply(_ batch: StoreBatch, to database: SQLiteDatabase) throws(SQLiteError) {
        var output = RecordWriter()
        if !batch.tasks.isEmpty {
            let upsert = try database.statement("""
                INSERT INTO tasks (sequence, record) VALUES (?, ?) ON CONFLICT (sequence) DO UPDATE SET record = excluded.record
                """)
            for task in batch.tasks {
                try upsert.bind(1, Int64(task.sequence)).bind(2, bytes: output.record(of: task)).run()
            }
        }
        if !batch.evictedTasks.isEmpty {
            // Retention evicts in finishing order, which for most tasks is submission order: runs
            // of consecutive sequence numbers go as one range each.
            let delete = try database.statement("DELETE FROM tasks WHERE sequence BETWEEN ? AND ?")
            for run in consecutiveRuns(batch.evictedTasks.map(\.sequence)) {
                try delete.bind(1, Int64(run.lowerBound)).bind(2, Int64(run.upperBound)).run()
            }
        }
        if !batch.workflows.isEmpty {
            let upsert = try database.statement("""
                INSERT INTO workflows (id, record) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET record = excluded.record
                """)
            for workflow in batch.workflows {
                try upsert.bind(1, workflow.id.description).bind(2, bytes: output.record(of: workflow)).run()
            }
        }
        if !batch.evictedWorkflows.isEmpty {
            let delete = try database.statement("DELETE FROM workflows WHERE id = ?")
            for id in batch.evictedWorkflows { try delete.bind(1, id.description).run() }
        }
        if !batch.queues.isEmpty {
            let upsert = try database.statement("""
                INSERT INTO queues (name, max_concurrency, paused, dispatch, key_concurrency, rate_per_second, rate_burst)
                VALUES (?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (name) DO UPDATE SET max_concurrency = excluded.max_concurrency, paused = excluded.paused,
                    dispatch = excluded.dispatch, key_concurrency = excluded.key_concurrency,
                    rate_per_second = excluded.rate_per_second, rate_burst = excluded.rate_burst
                """)
            for queue in batch.queues {
                try upsert.bind(1, queue.name).bind(2, Int64(queue.maxConcurrency)).bind(3, Int64(queue.paused ? 1 : 0))
                    .bind(4, queue.dispatch.rawValue).bind(5, queue.keyConcurrency.map(Int64.init))
                    .bind(6, queue.rateLimit?.perSecond).bind(7, queue.rateLimit.map { Int64($0.burst) }).run()
            }
        }
        if !batch.forgottenQueues.isEmpty {
            let delete = try database.statement("DELETE FROM queues WHERE name = ?")
            for name in batch.forgottenQueues { try delete.bind(1, name).run() }
        }
        if !batch.idempotencyKeys.isEmpty {
            let insert = try database.statement("""
                INSERT OR REPLACE INTO idempotency_keys (key, request_hash, status, resource, expires_at) VALUES (?, ?, ?, ?, ?)
                """)
            for key in batch.idempotencyKeys {
                try insert.bind(1, key.key).bind(2, bytes: key.requestHash).bind(3, Int64(key.status)).bind(4, key.resource)
                    .bind(5, key.expiresAt).run()
            }
        }
        if !batch.expiredIdempotencyKeys.isEmpty {
            let delete = try database.statement("DELETE FROM idempotency_keys WHERE key = ?")
            for key in batch.expiredIdempotencyKeys { try delete.bind(1, key).run() }
        }
        if !batch.uniqueKeys.isEmpty {
            let upsert = try database.statement("INSERT OR REPLACE INTO unique_keys (queue, key, id, finished_at) VALUES (?, ?, ?, ?)")
            for tombstone in batch.uniqueKeys {
                try upsert.bind(1, tombstone.queue).bind(2, tombstone.key).bind(3, tombstone.id.description)
                    .bind(4, tombstone.finishedAt).run()
            }
        }
        if !batch.droppedUniqueKeys.isEmpty {
            let delete = try database.statement("DELETE FROM unique_keys WHERE queue = ? AND key = ?")
            for name in batch.droppedUniqueKeys { try delete.bind(1, name.queue).bind(2, name.key).run() }
        }
        if !batch.schedules.isEmpty {
            let upsert = try database.statement("""
                INSERT INTO schedules (id, record) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET record = excluded.record
                """)
            for schedule in batch.schedules {
                try upsert.bind(1, schedule.id.description).bind(2, bytes: ScheduleRecordCodec.encode(schedule)).run()
            }
        }
        if !batch.deletedSchedules.isEmpty {
            let delete = try database.statement("DELETE FROM schedules WHERE id = ?")
            for id in batch.deletedSchedules { try delete.bind(1, id.description).run() }
        }
        if batch.hasWebhookChanges { try applyWebhookChanges(batch, to: database) }
        if let sequence = batch.eventSequence {
            try database.statement("""
                INSERT INTO meta (name, value) VALUES ('event_seq', ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value
                """).bind(1, Int64(bitPattern: sequence)).run()
        }
    }

    /// Deliveries are written before webhooks are deleted, so a webhook deleted in the same
    /// batch takes its deliveries with it.
    private static func applyWebhookChanges(_ batch: StoreBatch, to database: SQLiteDatabase) throws(SQLiteError) {
        if !batch.webhooks.isEmpty {
            let upsert = try database.statement("""
                INSERT OR REPLACE INTO webhooks (id, url, events, queue, workflow, enabled, created_at, secret)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                """)
            for webhook in batch.webhooks {
                try upsert.bind(1, webhook.id).bind(2, webhook.url).bind(3, webhook.events.joined(separator: ","))
                    .bind(4, webhook.queue).bind(5, webhook.workflow).bind(6, Int64(webhook.enabled ? 1 : 0))
                    .bind(7, webhook.createdAt).bind(8, webhook.secret).run()
            }
        }
        if !batch.deliveries.isEmpty {
            let upsert = try database.statement("""
                INSERT OR REPLACE INTO webhook_deliveries (id, webhook, event_seq, type, body, attempt, state, status_code, error,
                    duration_ms, attempted_at, next_attempt_at, earlier_attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """)
            for delivery in batch.deliveries {
                try upsert.bind(1, delivery.id).bind(2, delivery.webhook).bind(3, Int64(bitPattern: delivery.eventSeq))
                    .bind(4, delivery.type).bind(5, bytes: delivery.body).bind(6, Int64(delivery.attempt))
                    .bind(7, delivery.state.rawValue).bind(8, delivery.statusCode.map(Int64.init)).bind(9, delivery.error)
                    .bind(10, delivery.durationMilliseconds).bind(11, delivery.attemptedAt).bind(12, delivery.nextAttemptAt)
                    .bind(13, bytes: delivery.earlierAttempts.isEmpty ? nil : SharedRecordCodec.encode(delivery.earlierAttempts)).run()
            }
        }
        if !batch.deletedDeliveries.isEmpty {
            let delete = try database.statement("DELETE FROM webhook_deliveries WHERE id = ?")
            for id in batch.deletedDeliveries { try delete.bind(1, id).run() }
        }
        if !batch.deletedWebhooks.isEmpty {
            let deleteDeliveries = try database.statement("DELETE FROM webhook_deliveries WHERE webhook = ?")
            let delete = try database.statement("DELETE FROM webhooks WHERE id = ?")
            for id in batch.deletedWebhooks {
                try deleteDeliveries.bind(1, id).run()
                try delete.bind(1, id).run()
            }
        }
    }

    private static func loadWebhooks(_ database: SQLiteDatabase, into state: inout StoredState) throws {
        let webhooks = try database.statement(
            "SELECT id, url, events, queue, workflow, enabled, created_at, secret FROM webhooks ORDER BY created_at, id")
        while try webhooks.step() {
            state.webhooks.append(WebhookRecord(
                id: webhooks.string(0) ?? "", url: webhooks.string(1) ?? "",
                events: (webhooks.string(2) ?? "").split(separator: ",").map(String.init),
                queue: webhooks.string(3), workflow: webhooks.string(4), enabled: webhooks.int64(5) != 0,
                createdAt: webhooks.int64(6), secret: webhooks.string(7) ?? ""))
        }
        webhooks.reset()
        let deliveries = try database.statement("""
            SELECT id, webhook, event_seq, type, body, attempt, state, status_code, error, duration_ms, attempted_at,
                next_attempt_at, earlier_attempts FROM webhook_deliveries ORDER BY event_seq
            """)
        while try deliveries.step() {
            guard let deliveryState = DeliveryState(rawValue: deliveries.string(6) ?? "") else {
                throw RecordDecodingError(table: "webhook_deliveries", reason: "delivery \(deliveries.string(0) ?? "") has an unknown state")
            }
            func optional(_ column: Int32) -> Int64? { deliveries.isNull(column) ? nil : deliveries.int64(column) }
            state.deliveries.append(DeliveryRecord(
                id: deliveries.string(0) ?? "", webhook: deliveries.string(1) ?? "",
                eventSeq: UInt64(bitPattern: deliveries.int64(2)), type: deliveries.string(3) ?? "", body: deliveries.bytes(4),
                attempt: Int(deliveries.int64(5)), state: deliveryState, statusCode: optional(7).map { Int($0) },
                error: deliveries.string(8), durationMilliseconds: optional(9), attemptedAt: optional(10),
                nextAttemptAt: optional(11),
                earlierAttempts: deliveries.isNull(12) ? [] : try SharedRecordCodec.decodeAttempts(deliveries.bytes(12))))
        }
        deliveries.reset()
    }

    /// `numbers` as the fewest closed ranges that cover exactly them.
    static func consecutiveRuns(_ numbers: [UInt64]) -> [ClosedRange<UInt64>] {
        var runs: [ClosedRange<UInt64>] = []
        for number in numbers.sorted() {
            if let last = runs.last, number - last.upperBound <= 1 {
                runs[runs.count - 1] = last.lowerBound...number
            } else {
                runs.append(number...number)
            }
        }
        return runs
    }

    package static func load(_ database: SQLiteDatabase) throws -> StoredState {
        var state = StoredState()
        let queues = try database.statement(
            "SELECT name, max_concurrency, paused, dispatch, key_concurrency, rate_per_second, rate_burst FROM queues")
        while try queues.step() {
            guard let dispatch = QueueDispatch(rawValue: queues.string(3) ?? "") else {
                throw RecordDecodingError(table: "queues", reason: "queue \(queues.string(0) ?? "") has an unknown dispatch")
            }
            let rateLimit = queues.isNull(5) ? nil : RateLimit(perSecond: queues.double(5), burst: Int(queues.int64(6)))
            state.queues.append(QueueSnapshot(name: queues.string(0) ?? "", maxConcurrency: Int(queues.int64(1)),
                                              paused: queues.int64(2) != 0, dispatch: dispatch,
                                              keyConcurrency: queues.isNull(4) ? nil : Int(queues.int64(4)), rateLimit: rateLimit))
        }
        queues.reset()
        let workflows = try database.statement("SELECT id, record FROM workflows")
        while try workflows.step() {
            guard let id = TaskID(workflows.string(0) ?? "") else {
                throw RecordDecodingError(table: "workflows", reason: "a key is not a workflow id")
            }
            state.workflows.append(try workflows.withBytes(1) { bytes throws(RecordDecodingError) in
                try RecordCodec.decodeWorkflow(bytes, id: id)
            })
        }
        workflows.reset()
        let keys = try database.statement("SELECT key, request_hash, status, resource, expires_at FROM idempotency_keys")
        while try keys.step() {
            state.idempotencyKeys.append(IdempotencyRecord(
                key: keys.string(0) ?? "", requestHash: keys.bytes(1), status: Int(keys.int64(2)),
                resource: keys.string(3) ?? "", expiresAt: keys.int64(4)))
        }
        keys.reset()
        let uniqueKeys = try database.statement("SELECT queue, key, id, finished_at FROM unique_keys")
        while try uniqueKeys.step() {
            guard let id = TaskID(uniqueKeys.string(2) ?? "") else {
                throw RecordDecodingError(table: "unique_keys", reason: "an id is not a task id")
            }
            state.uniqueKeys.append(UniqueKeyTombstone(queue: uniqueKeys.string(0) ?? "", key: uniqueKeys.string(1) ?? "", id: id,
                                                       finishedAt: uniqueKeys.int64(3)))
        }
        uniqueKeys.reset()
        let schedules = try database.statement("SELECT record FROM schedules")
        while try schedules.step() { state.schedules.append(try ScheduleRecordCodec.decode(schedules.bytes(0))) }
        schedules.reset()
        try loadWebhooks(database, into: &state)
        state.eventSequence = UInt64(bitPattern: try database.integer("SELECT value FROM meta WHERE name = 'event_seq'") ?? 0)
        // In key order, which is submission order, as `Engine.restore` wants them.
        let tasks = try database.statement("SELECT sequence, record FROM tasks")
        while try tasks.step() {
            let sequence = UInt64(tasks.int64(0))
            state.tasks.append(try tasks.withBytes(1) { bytes throws(RecordDecodingError) in
                try RecordCodec.decodeTask(bytes, sequence: sequence)
            })
        }
        tasks.reset()
        return state
    }
}
