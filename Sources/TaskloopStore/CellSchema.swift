import TaskloopEngine
import TaskloopPostgres

/// The records of cells in the shared database: each row names its cell, and a cell's owner
/// writes its engine's settled batches here (in a commit that checks the cell's epoch first,
/// `TaskloopCluster`'s `ClusterSchema.fenceCommit`) and reads them back when it takes the cell.
/// Records are the SQLite store's binary forms (`RecordCodec`); the columns beside them are
/// what lists and routing read without decoding a record. No turn numbers, no removals: nobody
/// absorbs another cell's writes.
public enum CellSchema {
    public static let setUp = [
        // Ids in the "C" collation: they sort as bytes, so as their creation times (a locale's
        // collation need not). The columns after `state` are what `GET /tasks` filters on
        // (`CellReads`): the name in `String.lowercased()`'s folding, as the engine compares it.
        PGQuery("""
            CREATE TABLE IF NOT EXISTS taskloop.cell_tasks (id text COLLATE "C" PRIMARY KEY, cell int NOT NULL,
                sequence bigint NOT NULL, queue text NOT NULL, state text NOT NULL, kind text NOT NULL, name_folded text,
                dependencies text[], workflow text, finished_at bigint, record bytea NOT NULL)
            """),
        PGQuery("CREATE INDEX IF NOT EXISTS cell_tasks_cell ON taskloop.cell_tasks (cell, sequence)"),
        // Lists by state, newest first or after a cursor: ids sort by creation time.
        PGQuery("CREATE INDEX IF NOT EXISTS cell_tasks_state ON taskloop.cell_tasks (state, id)"),
        // A workflow's tasks, in order; only workflows' tasks pay for it.
        PGQuery("CREATE INDEX IF NOT EXISTS cell_tasks_workflow ON taskloop.cell_tasks (workflow, id) WHERE workflow IS NOT NULL"),
        PGQuery("CREATE TABLE IF NOT EXISTS taskloop.cell_workflows (id text PRIMARY KEY, cell int NOT NULL, record bytea NOT NULL)"),
        PGQuery("CREATE INDEX IF NOT EXISTS cell_workflows_cell ON taskloop.cell_workflows (cell)"),
        PGQuery("""
            CREATE TABLE IF NOT EXISTS taskloop.cell_queues (name text PRIMARY KEY, cell int NOT NULL, max_concurrency int NOT NULL,
                paused boolean NOT NULL, dispatch text NOT NULL)
            """),
        PGQuery("CREATE INDEX IF NOT EXISTS cell_queues_cell ON taskloop.cell_queues (cell)"),
        PGQuery("""
            CREATE TABLE IF NOT EXISTS taskloop.cell_idempotency_keys (key text PRIMARY KEY, cell int NOT NULL,
                request_hash bytea NOT NULL, status int NOT NULL, resource text NOT NULL, expires_at bigint NOT NULL)
            """),
        PGQuery("CREATE INDEX IF NOT EXISTS cell_idempotency_keys_cell ON taskloop.cell_idempotency_keys (cell)"),
        // Keys are the cluster's: a live key first used with another request (by two cells at
        // once, each before the other's commit) fails the commit that comes second, so it
        // creates nothing; its cells load again and the retried request finds the key.
        PGQuery("""
            CREATE OR REPLACE FUNCTION taskloop.keep_idempotency_key(p_key text, p_cell int, p_hash bytea, p_status int,
                p_resource text, p_expires bigint) RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO taskloop.cell_idempotency_keys AS k (key, cell, request_hash, status, resource, expires_at)
                VALUES (p_key, p_cell, p_hash, p_status, p_resource, p_expires)
                ON CONFLICT (key) DO UPDATE SET cell = excluded.cell, request_hash = excluded.request_hash,
                    status = excluded.status, resource = excluded.resource, expires_at = excluded.expires_at
                WHERE k.request_hash = excluded.request_hash
                    OR k.expires_at <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'idempotency key % was first used with another request', p_key USING ERRCODE = 'TL002';
                END IF;
            END $$
            """),
    ]

    /// A queue's cap on running tasks per concurrency key (`QueueSnapshot.keyConcurrency`).
    public static let keyConcurrencySetUp = [
        PGQuery("ALTER TABLE taskloop.cell_queues ADD COLUMN IF NOT EXISTS key_concurrency int"),
    ]

    /// A cell's tombstones of unique keys (the engine's, Engine+Unique), one per queue and key;
    /// a queue is in one cell, so a key is too.
    public static let uniqueKeysSetUp = [
        PGQuery("""
            CREATE TABLE IF NOT EXISTS taskloop.cell_unique_keys (queue text NOT NULL, key text NOT NULL, cell int NOT NULL,
                id text NOT NULL, finished_at bigint NOT NULL, PRIMARY KEY (queue, key))
            """),
        PGQuery("CREATE INDEX IF NOT EXISTS cell_unique_keys_cell ON taskloop.cell_unique_keys (cell)"),
    ]

    /// A queue's rate limit (both NULL: none).
    public static let rateLimitsSetUp = [
        PGQuery("ALTER TABLE taskloop.cell_queues ADD COLUMN IF NOT EXISTS rate_per_second double precision, "
                + "ADD COLUMN IF NOT EXISTS rate_burst int"),
    ]

    /// A cell's schedules (Engine+Schedules), in `ScheduleRecordCodec`'s JSON: a schedule's
    /// template names a queue of its cell, so the schedule is the cell's, and the commit that
    /// fires a slot writes its run's tasks and the schedule's `last_slot` together.
    public static let schedulesSetUp = [
        PGQuery("CREATE TABLE IF NOT EXISTS taskloop.cell_schedules (id text COLLATE \"C\" PRIMARY KEY, cell int NOT NULL, record bytea NOT NULL)"),
        PGQuery("CREATE INDEX IF NOT EXISTS cell_schedules_cell ON taskloop.cell_schedules (cell)"),
    ]

    static let insertTasks = PGRowsStatement(
        name: "cell_insert_tasks",
        head: "INSERT INTO taskloop.cell_tasks (id, cell, sequence, queue, state, kind, name_folded, dependencies, workflow, "
            + "finished_at, record)",
        tail: "ON CONFLICT (id) DO UPDATE SET state = excluded.state, finished_at = excluded.finished_at, record = excluded.record",
        columns: 11)
    static let deleteTask = PGStatement("cell_delete_task", "DELETE FROM taskloop.cell_tasks WHERE id = $1")
    static let upsertWorkflow = PGStatement("cell_upsert_workflow", """
        INSERT INTO taskloop.cell_workflows (id, cell, record) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET record = excluded.record
        """)
    static let deleteWorkflow = PGStatement("cell_delete_workflow", "DELETE FROM taskloop.cell_workflows WHERE id = $1")
    static let upsertQueue = PGStatement("cell_upsert_queue", """
        INSERT INTO taskloop.cell_queues (name, cell, max_concurrency, paused, dispatch, key_concurrency, rate_per_second, rate_burst)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        ON CONFLICT (name) DO UPDATE SET max_concurrency = excluded.max_concurrency, paused = excluded.paused,
            dispatch = excluded.dispatch, key_concurrency = excluded.key_concurrency,
            rate_per_second = excluded.rate_per_second, rate_burst = excluded.rate_burst
        """)
    /// A queue's columns as `PostgresRows.queues` reads them: `per_second` as text, which
    /// PostgreSQL writes exactly (shortest round trip), as it reads the text it is given.
    static let queueColumns = "name, max_concurrency, paused, dispatch, key_concurrency, rate_per_second::text, rate_burst"
    static let deleteQueue = PGStatement("cell_delete_queue", "DELETE FROM taskloop.cell_queues WHERE name = $1")
    static let upsertKey = PGStatement("cell_keep_key", "SELECT taskloop.keep_idempotency_key($1, $2, $3, $4, $5, $6)")
    static let deleteKey = PGStatement("cell_delete_key", "DELETE FROM taskloop.cell_idempotency_keys WHERE key = $1")
    static let upsertUniqueKey = PGStatement("cell_keep_unique_key", """
        INSERT INTO taskloop.cell_unique_keys (queue, key, cell, id, finished_at) VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (queue, key) DO UPDATE SET cell = excluded.cell, id = excluded.id, finished_at = excluded.finished_at
        """)
    static let deleteUniqueKey = PGStatement("cell_drop_unique_key", "DELETE FROM taskloop.cell_unique_keys WHERE queue = $1 AND key = $2")
    static let upsertSchedule = PGStatement("cell_upsert_schedule", """
        INSERT INTO taskloop.cell_schedules (id, cell, record) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET cell = excluded.cell, record = excluded.record
        """)
    static let deleteSchedule = PGStatement("cell_delete_schedule", "DELETE FROM taskloop.cell_schedules WHERE id = $1")

    /// The statements that write `batch`, a settled batch of `cell`'s engine. Webhooks and
    /// their deliveries are not a cell's (the batch must carry none).
    public static func writes(of batch: StoreBatch, cell: UInt16) -> [PGQuery] {
        writes(of: [(batch, cell)])
    }

    /// The statements that write the settled batches of several cells, in one commit. Their
    /// tasks go in statements of many rows whatever cell they are of: a statement costs the
    /// database more than its rows do, and a busy commit holds a task or two of many cells.
    public static func writes(of batches: [(batch: StoreBatch, cell: UInt16)]) -> [PGQuery] {
        var queries: [PGQuery] = []
        var writer = RecordWriter()
        let tasks = batches.flatMap { batch, cell in
            precondition(batch.webhooks.isEmpty && batch.deletedWebhooks.isEmpty && batch.deliveries.isEmpty
                         && batch.deletedDeliveries.isEmpty, "webhooks are not a cell's records")
            return batch.tasks.map { (task: $0, cell: PGValue.int(Int(cell))) }
        }
        var values: [PGValue] = []
        values.reserveCapacity(tasks.count * insertTasks.columns)
        for (task, cellValue) in tasks {
            values += [.text(task.id.description), cellValue, .int(Int64(task.sequence)), .text(task.queue),
                       .text(task.state.rawValue), .text(task.kind), .optional(task.name?.lowercased()),
                       task.dependencies.isEmpty ? .null : .text("{" + task.dependencies.map(\.description).joined(separator: ",") + "}"),
                       .optional(task.workflow?.description), task.finishedAt.map { .int($0) } ?? .null,
                       .bytes(writer.record(of: task))]
        }
        queries += insertTasks.queries(values)
        for (batch, cell) in batches {
            let cellValue = PGValue.int(Int(cell))
            for key in batch.evictedTasks { queries.append(PGQuery(deleteTask, [.text(key.id.description)])) }
            for workflow in batch.workflows {
                queries.append(PGQuery(upsertWorkflow, [.text(workflow.id.description), cellValue, .bytes(writer.record(of: workflow))]))
            }
            for id in batch.evictedWorkflows { queries.append(PGQuery(deleteWorkflow, [.text(id.description)])) }
            for queue in batch.queues {
                queries.append(PGQuery(upsertQueue, [.text(queue.name), cellValue, .int(queue.maxConcurrency), .bool(queue.paused),
                                                     .text(queue.dispatch.rawValue),
                                                     queue.keyConcurrency.map { .int($0) } ?? .null,
                                                     .optional(queue.rateLimit.map { "\($0.perSecond)" }),
                                                     queue.rateLimit.map { .int($0.burst) } ?? .null]))
            }
            for name in batch.forgottenQueues { queries.append(PGQuery(deleteQueue, [.text(name)])) }
            for key in batch.idempotencyKeys {
                queries.append(PGQuery(upsertKey, [.text(key.key), cellValue, .bytes(key.requestHash), .int(key.status),
                                                   .text(key.resource), .int(key.expiresAt)]))
            }
            for key in batch.expiredIdempotencyKeys { queries.append(PGQuery(deleteKey, [.text(key)])) }
            for tombstone in batch.uniqueKeys {
                queries.append(PGQuery(upsertUniqueKey, [.text(tombstone.queue), .text(tombstone.key), cellValue,
                                                         .text(tombstone.id.description), .int(tombstone.finishedAt)]))
            }
            for name in batch.droppedUniqueKeys { queries.append(PGQuery(deleteUniqueKey, [.text(name.queue), .text(name.key)])) }
            for schedule in batch.schedules {
                queries.append(PGQuery(upsertSchedule, [.text(schedule.id.description), cellValue,
                                                        .bytes(ScheduleRecordCodec.encode(schedule))]))
            }
            for id in batch.deletedSchedules { queries.append(PGQuery(deleteSchedule, [.text(id.description)])) }
        }
        return queries
    }

    /// Reads everything of `cell` in one snapshot, for its new owner; `loaded` decodes it.
    public static func load(cell: UInt16) -> [PGQuery] {
        let cellValue = [PGValue.int(Int(cell))]
        return [
            PGQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
            PGQuery("SELECT sequence, record FROM taskloop.cell_tasks WHERE cell = $1 ORDER BY sequence", cellValue, binaryResults: true),
            PGQuery("SELECT id, record FROM taskloop.cell_workflows WHERE cell = $1", cellValue, binaryResults: true),
            PGQuery("SELECT \(queueColumns) FROM taskloop.cell_queues WHERE cell = $1", cellValue,
                    binaryResults: true),
            PGQuery("SELECT key, request_hash, status, resource, expires_at FROM taskloop.cell_idempotency_keys WHERE cell = $1",
                    cellValue, binaryResults: true),
            PGQuery("SELECT queue, key, id, finished_at FROM taskloop.cell_unique_keys WHERE cell = $1", cellValue),
            PGQuery("SELECT record FROM taskloop.cell_schedules WHERE cell = $1", cellValue, binaryResults: true),
            PGQuery("COMMIT"),
        ]
    }

    /// The live record of `key`, whichever cell wrote it (`at`: the wall clock now);
    /// `keys(of:)` reads the answer.
    public static func findKey(_ key: String, at now: Int64) -> PGQuery {
        PGQuery("SELECT key, request_hash, status, resource, expires_at FROM taskloop.cell_idempotency_keys "
                + "WHERE key = $1 AND expires_at > $2", [.text(key), .int(now)], binaryResults: true)
    }

    public static func keys(of result: PGResult) -> [IdempotencyRecord] { PostgresRows.keys(result) }

    /// Deletes `keys` that have expired by `now`; one used again since stays.
    public static func deleteExpiredKeys(_ keys: [String], at now: Int64) -> PGQuery {
        // Keys are any visible ASCII: each element is quoted in the array literal.
        let elements = keys.map { key in
            var element = "\""
            for character in key {
                if character == "\\" || character == "\"" { element.append("\\") }
                element.append(character)
            }
            return element + "\""
        }
        return PGQuery("DELETE FROM taskloop.cell_idempotency_keys WHERE key = ANY($1::text[]) AND expires_at <= $2",
                       [.text("{" + elements.joined(separator: ",") + "}"), .int(now)])
    }

    public static func loaded(_ results: [PGResult]) throws -> StoredState {
        var state = StoredState()
        state.tasks = try PostgresRows.tasks(results[1])
        state.workflows = try PostgresRows.workflows(results[2])
        state.queues = PostgresRows.queues(results[3])
        state.idempotencyKeys = PostgresRows.keys(results[4])
        state.uniqueKeys = try PostgresRows.uniqueKeys(results[5])
        state.schedules = try schedules(results[6])
        return state
    }

    /// The schedules of `rows`, whose one column is a schedule's record.
    public static func schedules(_ rows: PGResult) throws(RecordDecodingError) -> [ScheduleSnapshot] {
        var schedules: [ScheduleSnapshot] = []
        schedules.reserveCapacity(rows.rowCount)
        for row in 0..<rows.rowCount { schedules.append(try ScheduleRecordCodec.decode(rows.bytes(row, 0) ?? [])) }
        return schedules
    }

    /// How many of the records in `rows` (one column, a task's record) are of unfinished tasks;
    /// a record that cannot be read counts as one.
    public static func unfinishedTasks(_ rows: PGResult) -> Int {
        (0..<rows.rowCount).count { row in
            let bytes = rows.bytes(row, 0) ?? []
            let task = try? bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) in
                try RecordCodec.decodeTask(buffer, sequence: 0)
            }
            return task.map { !$0.state.isTerminal } ?? true
        }
    }
}
