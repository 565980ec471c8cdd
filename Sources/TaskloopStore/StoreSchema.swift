import CSQLite
import TaskloopEngine

/// The database's shape, versioned in `PRAGMA user_version`, with forward-only migrations in
/// code: migration N takes a database at version N to N + 1. A file from a newer server is
/// refused before anything is written to it.
public enum StoreSchema {
    typealias Migration = @Sendable (SQLiteDatabase) throws -> Void

    static let migrations: [Migration] = [
        // 1: tasks as JSON records keyed by id, with the columns recovery and retention looked
        // things up by; workflows, queue settings, idempotency keys and a few named values
        // (`meta`).
        { database in try database.execute("""
        CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            sequence INTEGER NOT NULL,
            state TEXT NOT NULL,
            workflow TEXT,
            record BLOB NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE workflows (id TEXT PRIMARY KEY, record BLOB NOT NULL) WITHOUT ROWID;
        CREATE TABLE queues (
            name TEXT PRIMARY KEY,
            max_concurrency INTEGER NOT NULL,
            paused INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE idempotency_keys (
            key TEXT PRIMARY KEY,
            request_hash BLOB NOT NULL,
            status INTEGER NOT NULL,
            resource TEXT NOT NULL,
            expires_at INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;
        """) },
        // 2: tasks keyed by their sequence number (an integer key appends and deletes without
        // comparing text, and restores in submission order with no sort), records in
        // `RecordCodec`'s binary form, a fifth of the JSON's size.
        { database in
            try database.execute("CREATE TABLE tasks_v2 (sequence INTEGER PRIMARY KEY, record BLOB NOT NULL)")
            let insert = try database.statement("INSERT INTO tasks_v2 (sequence, record) VALUES (?, ?)")
            let tasks = try database.statement("SELECT record FROM tasks")
            var output = RecordWriter()
            while try tasks.step() {
                let task = try JSONRecordsV1.decodeTask(tasks.bytes(0))
                try insert.bind(1, Int64(task.sequence)).bind(2, bytes: output.record(of: task)).run()
            }
            tasks.reset()
            try database.execute("DROP TABLE tasks; ALTER TABLE tasks_v2 RENAME TO tasks")
            var workflows: [WorkflowSnapshot] = []
            let select = try database.statement("SELECT record FROM workflows")
            while try select.step() { workflows.append(try JSONRecordsV1.decodeWorkflow(select.bytes(0))) }
            select.reset()
            let update = try database.statement("UPDATE workflows SET record = ? WHERE id = ?")
            for workflow in workflows {
                try update.bind(1, bytes: output.record(of: workflow)).bind(2, workflow.id.description).run()
            }
        },
        // 3: who dispatches a queue's tasks (`server`, or `workers` that lease them); task
        // records may carry a lease (a field older servers refuse: this version keeps them off).
        { database in
            try database.execute("ALTER TABLE queues ADD COLUMN dispatch TEXT NOT NULL DEFAULT 'server'")
        },
        // 4: webhooks and their deliveries: pending ones (with the body every attempt sends) and
        // each webhook's log of finished ones.
        { database in try database.execute("""
        CREATE TABLE webhooks (
            id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            events TEXT NOT NULL,
            queue TEXT,
            workflow TEXT,
            enabled INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            secret TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE webhook_deliveries (
            id TEXT PRIMARY KEY,
            webhook TEXT NOT NULL,
            event_seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            body BLOB NOT NULL,
            attempt INTEGER NOT NULL,
            state TEXT NOT NULL,
            status_code INTEGER,
            error TEXT,
            duration_ms INTEGER,
            attempted_at INTEGER,
            next_attempt_at INTEGER
        ) WITHOUT ROWID;
        CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook);
        """) },
        // 5: each attempt of a delivery in the log, not only the last: the ones before it, in
        // `SharedRecordCodec`'s form (NULL: none, as for every delivery written before).
        { database in
            try database.execute("ALTER TABLE webhook_deliveries ADD COLUMN earlier_attempts BLOB")
        },
        // 6: the unique keys of finished tasks retention forgot while a submission's window may
        // still reach them (the engine's tombstones), one per queue and key.
        { database in try database.execute("""
        CREATE TABLE unique_keys (
            queue TEXT NOT NULL,
            key TEXT NOT NULL,
            id TEXT NOT NULL,
            finished_at INTEGER NOT NULL,
            PRIMARY KEY (queue, key)
        ) WITHOUT ROWID;
        """) },
        // 7: a queue's cap on running tasks per concurrency key (NULL: none).
        { database in
            try database.execute("ALTER TABLE queues ADD COLUMN key_concurrency INTEGER")
        },
        // 8: schedules (cron), one row each, in `ScheduleRecordCodec`'s JSON. Self-contained: it
        // touches no other table.
        { database in try database.execute("""
        CREATE TABLE schedules (
            id TEXT PRIMARY KEY,
            record BLOB NOT NULL
        ) WITHOUT ROWID;
        """) },
        // 9: a queue's rate limit (both NULL: none).
        { database in try database.execute("""
        ALTER TABLE queues ADD COLUMN rate_per_second REAL;
        ALTER TABLE queues ADD COLUMN rate_burst INTEGER;
        """) },
        // 10: workflow records may carry the schedule run that made them (a field older servers
        // refuse: this version keeps them off). No table changes.
        { _ in },
    ]

    /// The version this server writes.
    public static var version: Int { migrations.count }

    /// Checks the file and brings it to `target` (tests stop early to make old files): refuses
    /// a damaged file or a newer schema without writing, then migrates in one transaction per
    /// step.
    public static func prepare(_ database: SQLiteDatabase, upTo target: Int = version) throws(DataDirectoryError) {
        let found: Int64
        do {
            // Reading the header is the first access: a file that is not a database fails here.
            found = try database.integer("PRAGMA user_version") ?? 0
            _ = try database.integer("SELECT count(*) FROM sqlite_schema")
        } catch {
            throw .damaged(path: database.path, reason: error.message)
        }
        guard found <= Int64(version) else {
            throw .newerSchema(path: database.path, found: found, supported: version)
        }
        do {
            for step in Int(found)..<max(Int(found), target) {
                try database.transaction {
                    try migrations[step](database)
                    try database.execute("PRAGMA user_version = \(step + 1)")
                }
            }
        } catch let error as RecordDecodingError {
            throw .damaged(path: database.path, reason: error.description)
        } catch let error as SQLiteError {
            throw error.isStorageFailure ? .unusable(path: database.path, reason: error.message)
                : .damaged(path: database.path, reason: error.message)
        } catch {
            throw .unusable(path: database.path, reason: "\(error)")
        }
    }
}
