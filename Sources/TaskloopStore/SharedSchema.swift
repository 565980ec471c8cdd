import TaskloopEngine
import TaskloopPostgres

/// The shared database's tables (schema `taskloop`), their migrations, and the statements of a
/// turn. Records are the SQLite store's binary forms (`RecordCodec`); each row carries the turn
/// that last wrote it, and a deletion leaves a removal, so a replica reads "what changed after
/// turn N" with one indexed query per table.
enum SharedSchema {
    static let version = 4

    /// Advisory lock keys ("TLMIGRAT", "TLTURN__" as 64-bit integers would be clearer in a
    /// lock listing, but the numbers only have to be fixed and unlikely to collide).
    static let migrationLock: Int64 = 7_361_000_000_001
    static let turnLock: Int64 = 7_361_000_000_002

    struct Migration {
        let version: Int
        let statements: [String]
    }

    /// In order; each runs once, in one transaction with the version's update.
    static let migrations = [
        Migration(version: 1, statements: [
            """
            CREATE TABLE taskloop.tasks (sequence bigint PRIMARY KEY, id text NOT NULL UNIQUE, turn bigint NOT NULL,
                record bytea NOT NULL)
            """,
            "CREATE INDEX tasks_turn ON taskloop.tasks (turn)",
            "CREATE TABLE taskloop.workflows (id text PRIMARY KEY, turn bigint NOT NULL, record bytea NOT NULL)",
            "CREATE INDEX workflows_turn ON taskloop.workflows (turn)",
            """
            CREATE TABLE taskloop.queues (name text PRIMARY KEY, turn bigint NOT NULL, max_concurrency int NOT NULL,
                paused boolean NOT NULL, dispatch text NOT NULL)
            """,
            "CREATE INDEX queues_turn ON taskloop.queues (turn)",
            """
            CREATE TABLE taskloop.idempotency_keys (key text PRIMARY KEY, turn bigint NOT NULL, request_hash bytea NOT NULL,
                status int NOT NULL, resource text NOT NULL, expires_at bigint NOT NULL)
            """,
            "CREATE INDEX idempotency_keys_turn ON taskloop.idempotency_keys (turn)",
            "CREATE TABLE taskloop.webhooks (id text PRIMARY KEY, turn bigint NOT NULL, record bytea NOT NULL)",
            "CREATE INDEX webhooks_turn ON taskloop.webhooks (turn)",
            """
            CREATE TABLE taskloop.webhook_deliveries (id text PRIMARY KEY, webhook text NOT NULL, event_seq bigint NOT NULL,
                owner text NOT NULL, turn bigint NOT NULL, record bytea NOT NULL)
            """,
            "CREATE INDEX webhook_deliveries_turn ON taskloop.webhook_deliveries (turn)",
            "CREATE TABLE taskloop.removals (turn bigint NOT NULL, kind smallint NOT NULL, key text NOT NULL)",
            "CREATE INDEX removals_turn ON taskloop.removals (turn)",
            """
            CREATE TABLE taskloop.events (seq bigint PRIMARY KEY, turn bigint NOT NULL, type text NOT NULL, time bigint NOT NULL,
                task text, workflow text, queue text, ends_task boolean NOT NULL, data bytea NOT NULL)
            """,
            // (turn, seq): a delta reads its events in order by this index alone; ordered by seq,
            // the planner walks the primary key through every older event instead.
            "CREATE INDEX events_turn ON taskloop.events (turn, seq)",
            """
            CREATE TABLE taskloop.replicas (name text PRIMARY KEY, started_at timestamptz NOT NULL,
                expires_at timestamptz NOT NULL)
            """,
        ]),
        // A delivery's record (format 2) carries its earlier attempts. The tables stay as they
        // are, but a replica of version 1 cannot read such records: the version keeps it out.
        Migration(version: 2, statements: []),
        // History is dropped by time, not by turns: removals carry when they were made (by the
        // database's clock), and both tables are read by time when old rows go.
        Migration(version: 3, statements: [
            "ALTER TABLE taskloop.removals ADD COLUMN time bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000)::bigint",
            "CREATE INDEX removals_time ON taskloop.removals (time)",
            "CREATE INDEX events_time ON taskloop.events (time)",
        ]),
        // Which process holds a replica's name: one started under a name in use takes it over,
        // and the other, fenced by it, stops (PostgresJournal.open).
        Migration(version: 4, statements: ["ALTER TABLE taskloop.replicas ADD COLUMN incarnation text NOT NULL DEFAULT ''"]),
    ]

    enum Removal: Int {
        case task = 0, workflow, queue, idempotencyKey, webhook, delivery
    }

    /// What changed after turn $1, table by table (the order `PostgresJournal` reads them in).
    /// No ORDER BY that another index could serve: a delta is a few rows found by `turn`
    /// (the engine orders tasks itself).
    static let deltaReads = [
        PGStatement("delta_tasks", "SELECT sequence, record FROM taskloop.tasks WHERE turn > $1"),
        PGStatement("delta_workflows", "SELECT id, record FROM taskloop.workflows WHERE turn > $1"),
        PGStatement("delta_queues", "SELECT name, max_concurrency, paused, dispatch FROM taskloop.queues WHERE turn > $1"),
        PGStatement("delta_keys",
                    "SELECT key, request_hash, status, resource, expires_at FROM taskloop.idempotency_keys WHERE turn > $1"),
        PGStatement("delta_webhooks", "SELECT record FROM taskloop.webhooks WHERE turn > $1"),
        PGStatement("delta_deliveries",
                    "SELECT owner, record FROM taskloop.webhook_deliveries WHERE turn > $1 ORDER BY turn, event_seq, id"),
        PGStatement("delta_removals", "SELECT kind, key FROM taskloop.removals WHERE turn > $1 ORDER BY turn"),
        PGStatement("delta_events",
                    "SELECT seq, type, time, task, workflow, queue, ends_task, data FROM taskloop.events WHERE turn > $1 ORDER BY turn, seq"),
    ]

    static let takeTurnLock = PGStatement("take_turn_lock", "SELECT pg_advisory_xact_lock(\(turnLock))")
    static let currentTransaction = PGStatement("current_transaction", "SELECT pg_current_xact_id()")
    static let transactionStatus = PGStatement("transaction_status", "SELECT pg_xact_status($1::xid8)")
    static let waitWithoutTimeouts = PGStatement(
        "wait_without_timeouts", "SELECT set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true)")
    static let restoreTimeouts = PGStatement(
        "restore_timeouts", "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $1, true)")
    static let readState = PGStatement("read_state", "SELECT turn, event_seq FROM taskloop.state")
    /// The oldest turn whose removals and events are all still kept.
    static let horizon = PGStatement("horizon", "SELECT horizon FROM taskloop.state")
    static let goneReplicas = PGStatement(
        "gone_replicas", "SELECT name FROM taskloop.replicas WHERE expires_at < now() AND name <> $1 ORDER BY name")
    static let forgetReplica = PGStatement("forget_replica", "DELETE FROM taskloop.replicas WHERE name = $1 AND expires_at < now()")
    /// From when the row is written (recomputed after waiting out another change of the row):
    /// `now()` is when the statement's transaction began, before any wait.
    static let renewLease = PGStatement(
        "renew_lease",
        "UPDATE taskloop.replicas SET expires_at = clock_timestamp() + $2 * interval '1 millisecond' WHERE name = $1 AND incarnation = $3")
    static let nameHolder = PGStatement("name_holder", "SELECT incarnation FROM taskloop.replicas WHERE name = $1")
    static let advance = PGStatement("advance", "UPDATE taskloop.state SET turn = $1, event_seq = $2")
    /// Drops events and removals older than $1 ms (by the database's clock), at most $2 of each
    /// (a turn that drops history stays short), and moves the horizon past the turns they were
    /// made in: a replica that has not absorbed those turns reloads. Answers the larger of the
    /// two counts: a whole chunk means there is more to drop.
    static let trimHistory = PGStatement("trim_history", """
        WITH cutoff AS (SELECT (extract(epoch FROM now()) * 1000)::bigint - $1 AS time),
        old_events AS (DELETE FROM taskloop.events WHERE seq IN (
            SELECT seq FROM taskloop.events WHERE time < (SELECT time FROM cutoff) LIMIT $2) RETURNING turn),
        old_removals AS (DELETE FROM taskloop.removals WHERE ctid IN (
            SELECT ctid FROM taskloop.removals WHERE time < (SELECT time FROM cutoff) LIMIT $2) RETURNING turn)
        UPDATE taskloop.state SET horizon = GREATEST(horizon,
            (SELECT max(turn) + 1 FROM (SELECT turn FROM old_events UNION ALL SELECT turn FROM old_removals) gone))
        RETURNING GREATEST((SELECT count(*) FROM old_events), (SELECT count(*) FROM old_removals))
        """)
    static let trimChunk = 2_000

    static let deleteTask = PGStatement("delete_task", "DELETE FROM taskloop.tasks WHERE sequence = $1")
    static let upsertWorkflow = PGStatement("upsert_workflow", """
        INSERT INTO taskloop.workflows (id, turn, record) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET turn = excluded.turn, record = excluded.record
        """)
    static let deleteWorkflow = PGStatement("delete_workflow", "DELETE FROM taskloop.workflows WHERE id = $1")
    static let upsertQueue = PGStatement("upsert_queue", """
        INSERT INTO taskloop.queues (name, turn, max_concurrency, paused, dispatch) VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (name) DO UPDATE SET turn = excluded.turn, max_concurrency = excluded.max_concurrency,
            paused = excluded.paused, dispatch = excluded.dispatch
        """)
    static let deleteQueue = PGStatement("delete_queue", "DELETE FROM taskloop.queues WHERE name = $1")
    static let upsertKey = PGStatement("upsert_key", """
        INSERT INTO taskloop.idempotency_keys (key, turn, request_hash, status, resource, expires_at) VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (key) DO UPDATE SET turn = excluded.turn, request_hash = excluded.request_hash, status = excluded.status,
            resource = excluded.resource, expires_at = excluded.expires_at
        """)
    static let deleteKey = PGStatement("delete_key", "DELETE FROM taskloop.idempotency_keys WHERE key = $1")
    static let upsertWebhook = PGStatement("upsert_webhook", """
        INSERT INTO taskloop.webhooks (id, turn, record) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET turn = excluded.turn, record = excluded.record
        """)
    static let deleteWebhook = PGStatement("delete_webhook", "DELETE FROM taskloop.webhooks WHERE id = $1")
    static let deleteWebhookDeliveries = PGStatement("delete_webhook_deliveries", """
        WITH gone AS (DELETE FROM taskloop.webhook_deliveries WHERE webhook = $1 RETURNING id)
        INSERT INTO taskloop.removals (turn, kind, key) SELECT $2, \(Removal.delivery.rawValue), id FROM gone
        """)
    static let upsertDelivery = PGStatement("upsert_delivery", """
        INSERT INTO taskloop.webhook_deliveries (id, webhook, event_seq, owner, turn, record) VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (id) DO UPDATE SET turn = excluded.turn, record = excluded.record, owner = excluded.owner
        """)
    static let deleteDelivery = PGStatement("delete_delivery", "DELETE FROM taskloop.webhook_deliveries WHERE id = $1")
    static let addRemoval = PGStatement("add_removal", "INSERT INTO taskloop.removals (turn, kind, key) VALUES ($1, $2, $3)")

    /// The statements that write `batch` as turn `turn`. Deliveries written here are attempted by
    /// `replica` unless the batch says otherwise (`deliveryOwners`).
    static func writes(of batch: StoreBatch, turn: UInt64, replica: String, deliveryOwners: [String: String] = [:]) -> [PGQuery] {
        let turnValue = PGValue.int(Int64(turn))
        var queries: [PGQuery] = []
        var writer = RecordWriter()
        func removal(_ kind: Removal, _ key: String) {
            queries.append(PGQuery(addRemoval, [turnValue, .int(kind.rawValue), .text(key)]))
        }
        // Tasks in statements of many rows: a busy turn writes hundreds, and a statement per row
        // costs the database more than the rows do.
        for chunk in stride(from: 0, to: batch.tasks.count, by: 1_000) {
            let rows = batch.tasks[chunk..<min(chunk + 1_000, batch.tasks.count)]
            var values: [PGValue] = []
            values.reserveCapacity(rows.count * 4)
            for task in rows {
                values += [.int(Int64(task.sequence)), .text(task.id.description), turnValue, .bytes(writer.record(of: task))]
            }
            queries.append(PGQuery(
                "INSERT INTO taskloop.tasks (sequence, id, turn, record) VALUES \(PGQuery.placeholders(rows: rows.count, columns: 4)) "
                    + "ON CONFLICT (sequence) DO UPDATE SET turn = excluded.turn, record = excluded.record", values))
        }
        for key in batch.evictedTasks {
            queries.append(PGQuery(deleteTask, [.int(Int64(key.sequence))]))
            removal(.task, "\(key.id):\(key.sequence)")
        }
        for workflow in batch.workflows {
            queries.append(PGQuery(upsertWorkflow, [.text(workflow.id.description), turnValue, .bytes(writer.record(of: workflow))]))
        }
        for id in batch.evictedWorkflows {
            queries.append(PGQuery(deleteWorkflow, [.text(id.description)]))
            removal(.workflow, id.description)
        }
        for queue in batch.queues {
            queries.append(PGQuery(upsertQueue, [.text(queue.name), turnValue, .int(queue.maxConcurrency), .bool(queue.paused),
                                                 .text(queue.dispatch.rawValue)]))
        }
        for name in batch.forgottenQueues {
            queries.append(PGQuery(deleteQueue, [.text(name)]))
            removal(.queue, name)
        }
        for key in batch.idempotencyKeys {
            queries.append(PGQuery(upsertKey, [.text(key.key), turnValue, .bytes(key.requestHash), .int(key.status),
                                               .text(key.resource), .int(key.expiresAt)]))
        }
        for key in batch.expiredIdempotencyKeys {
            queries.append(PGQuery(deleteKey, [.text(key)]))
            removal(.idempotencyKey, key)
        }
        for id in batch.deletedWebhooks {
            queries.append(PGQuery(deleteWebhook, [.text(id)]))
            queries.append(PGQuery(deleteWebhookDeliveries, [.text(id), turnValue]))
            removal(.webhook, id)
        }
        for webhook in batch.webhooks {
            queries.append(PGQuery(upsertWebhook, [.text(webhook.id), turnValue, .bytes(SharedRecordCodec.encode(webhook))]))
        }
        for id in batch.deletedDeliveries {
            queries.append(PGQuery(deleteDelivery, [.text(id)]))
            removal(.delivery, id)
        }
        for delivery in batch.deliveries {
            queries.append(PGQuery(upsertDelivery, [.text(delivery.id), .text(delivery.webhook), .int(Int64(delivery.eventSeq)),
                                                    .text(deliveryOwners[delivery.id] ?? replica), turnValue,
                                                    .bytes(SharedRecordCodec.encode(delivery))]))
        }
        return queries
    }

    /// The events of a turn, in statements of many rows.
    static func insert(_ events: [SharedEvent], turn: UInt64) -> [PGQuery] {
        stride(from: 0, to: events.count, by: 500).map { chunk in
            let rows = events[chunk..<min(chunk + 500, events.count)]
            var values: [PGValue] = []
            values.reserveCapacity(rows.count * 9)
            for event in rows {
                values += [.int(Int64(event.seq)), .int(Int64(turn)), .text(event.type), .int(event.time),
                           .optional(event.task?.description), .optional(event.workflow?.description), .optional(event.queue),
                           .bool(event.endsTask), .bytes(event.data)]
            }
            return PGQuery("INSERT INTO taskloop.events (seq, turn, type, time, task, workflow, queue, ends_task, data) VALUES "
                           + PGQuery.placeholders(rows: rows.count, columns: 9), values)
        }
    }
}
