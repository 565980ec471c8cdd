import CSQLite

/// The database's shape, versioned in `PRAGMA user_version`, with forward-only migrations in
/// code: migration N takes a database at version N to N + 1. A file from a newer server is
/// refused before anything is written to it.
public enum StoreSchema {
    static let migrations: [String] = [
        // 1: tasks as the engine's own encoding of a record, with the columns recovery and
        // retention look things up by; workflows, queue settings, idempotency keys and a few
        // named values (`meta`).
        """
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
        """,
    ]

    /// The version this server writes.
    public static var version: Int { migrations.count }

    /// Checks the file and brings it to `version`: refuses a damaged file or a newer schema
    /// without writing, then migrates in one transaction per step.
    public static func prepare(_ database: SQLiteDatabase) throws(DataDirectoryError) {
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
            for step in Int(found)..<version {
                try database.transaction {
                    try database.execute(migrations[step])
                    try database.execute("PRAGMA user_version = \(step + 1)")
                }
            }
        } catch let error as SQLiteError {
            throw error.isStorageFailure ? .unusable(path: database.path, reason: error.message)
                : .damaged(path: database.path, reason: error.message)
        } catch {
            throw .unusable(path: database.path, reason: "\(error)")
        }
    }
}
