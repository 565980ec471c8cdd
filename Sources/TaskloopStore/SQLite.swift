import CSQLite

/// A failed SQLite call: the extended result code, SQLite's message, and what was being done.
public struct SQLiteError: Error, Equatable, CustomStringConvertible {
    public let code: Int32
    public let message: String
    public let operation: String

    /// The primary result code (`SQLITE_FULL`, `SQLITE_IOERR`, `SQLITE_BUSY`, ...).
    public var primaryCode: Int32 { code & 0xFF }

    /// The disk is full or failing: the store cannot write now, and may again later.
    public var isStorageFailure: Bool {
        [SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_READONLY].contains(primaryCode)
    }

    public var description: String { "\(operation): \(message) (SQLite \(code))" }
}

/// One SQLite connection. Not thread-safe: it belongs to the one thread that opened it (the
/// store's writer thread, or a reader during start-up before the loop runs), and every call
/// happens there. Opened with SQLITE_OPEN_NOMUTEX: SQLite's own locks would only cost time.
public final class SQLiteDatabase {
    let handle: OpaquePointer
    public let path: String
    private var statements: [String: SQLiteStatement] = [:]

    public struct OpenMode: Sendable, Equatable {
        let flags: Int32
        public static let readWriteCreate = OpenMode(flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        public static let readWrite = OpenMode(flags: SQLITE_OPEN_READWRITE)
        public static let readOnly = OpenMode(flags: SQLITE_OPEN_READONLY)
    }

    public init(path: String, mode: OpenMode = .readWriteCreate) throws(SQLiteError) {
        var handle: OpaquePointer?
        let status = sqlite3_open_v2(path, &handle, mode.flags | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, nil)
        guard status == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(status))
            sqlite3_close_v2(handle)
            throw SQLiteError(code: status, message: message, operation: "open \(path)")
        }
        self.handle = handle
        self.path = path
        sqlite3_extended_result_codes(handle, 1)
    }

    deinit {
        statements.removeAll()
        sqlite3_close_v2(handle)
    }

    /// Runs one or more statements that return no rows (schema changes, pragmas, BEGIN/COMMIT).
    public func execute(_ sql: String) throws(SQLiteError) {
        var message: UnsafeMutablePointer<CChar>?
        let status = sqlite3_exec(handle, sql, nil, nil, &message)
        guard status == SQLITE_OK else {
            let text = message.map { String(cString: $0) } ?? String(cString: sqlite3_errstr(status))
            sqlite3_free(message)
            throw SQLiteError(code: status, message: text, operation: sql)
        }
    }

    /// The prepared statement for `sql`, prepared once and kept for the connection's life.
    public func statement(_ sql: String) throws(SQLiteError) -> SQLiteStatement {
        if let cached = statements[sql] {
            cached.reset()
            return cached
        }
        var prepared: OpaquePointer?
        let status = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &prepared, nil)
        guard status == SQLITE_OK, let prepared else { throw error(status, sql) }
        let statement = SQLiteStatement(handle: prepared, database: self, sql: sql)
        statements[sql] = statement
        return statement
    }

    /// The first column of the first row of `sql`, as an integer (pragmas, counts).
    public func integer(_ sql: String) throws(SQLiteError) -> Int64? {
        let statement = try statement(sql)
        defer { statement.reset() }
        guard try statement.step() else { return nil }
        return statement.isNull(0) ? nil : statement.int64(0)
    }

    /// The first column of the first row of `sql`, as text.
    public func text(_ sql: String) throws(SQLiteError) -> String? {
        let statement = try statement(sql)
        defer { statement.reset() }
        guard try statement.step() else { return nil }
        return statement.string(0)
    }

    /// Runs `body` in one transaction: committed if it returns, rolled back if it throws.
    public func transaction<Result>(_ body: () throws -> Result) throws -> Result {
        try execute("BEGIN IMMEDIATE")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    public var changes: Int { Int(sqlite3_changes64(handle)) }

    /// Copies the whole write-ahead log into the database and empties the log file; false when
    /// a reader's snapshot still needs part of it (then what could be copied was). Waits for
    /// nobody: the connection has no busy timeout.
    @discardableResult
    public func checkpointAndTruncateLog() -> Bool {
        sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_TRUNCATE, nil, nil) == SQLITE_OK
    }

    func error(_ status: Int32, _ operation: String) -> SQLiteError {
        SQLiteError(code: status, message: String(cString: sqlite3_errmsg(handle)), operation: operation)
    }
}

/// A prepared statement of one `SQLiteDatabase`, on that database's thread only. Parameters
/// are numbered from 1, columns from 0, as in SQLite's C API.
public final class SQLiteStatement {
    let handle: OpaquePointer
    unowned let database: SQLiteDatabase
    let sql: String

    init(handle: OpaquePointer, database: SQLiteDatabase, sql: String) {
        self.handle = handle
        self.database = database
        self.sql = sql
    }

    deinit { sqlite3_finalize(handle) }

    public func reset() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    @discardableResult
    public func bind(_ index: Int32, _ value: Int64?) -> SQLiteStatement {
        if let value { sqlite3_bind_int64(handle, index, value) } else { sqlite3_bind_null(handle, index) }
        return self
    }

    @discardableResult
    public func bind(_ index: Int32, _ value: Double?) -> SQLiteStatement {
        if let value { sqlite3_bind_double(handle, index, value) } else { sqlite3_bind_null(handle, index) }
        return self
    }

    @discardableResult
    public func bind(_ index: Int32, _ value: String?) -> SQLiteStatement {
        guard let value else {
            sqlite3_bind_null(handle, index)
            return self
        }
        var text = value
        text.withUTF8 { bytes in
            _ = sqlite3_bind_text(handle, index, bytes.baseAddress.map { UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self) },
                                  Int32(bytes.count), taskloop_sqlite_transient())
        }
        return self
    }

    @discardableResult
    public func bind(_ index: Int32, bytes: [UInt8]?) -> SQLiteStatement {
        guard let bytes else {
            sqlite3_bind_null(handle, index)
            return self
        }
        bytes.withUnsafeBytes { buffer in
            _ = sqlite3_bind_blob(handle, index, buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(buffer.count),
                                  taskloop_sqlite_transient())
        }
        return self
    }

    /// Advances to the next row: true if there is one, false when done.
    public func step() throws(SQLiteError) -> Bool {
        switch sqlite3_step(handle) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        case let status:
            let error = database.error(status, sql)
            sqlite3_reset(handle)
            throw error
        }
    }

    /// Runs a statement that returns no rows, then resets it for the next use.
    public func run() throws(SQLiteError) {
        defer { reset() }
        while try step() {}
    }

    public func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }

    public func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    public func double(_ column: Int32) -> Double { sqlite3_column_double(handle, column) }

    public func string(_ column: Int32) -> String? {
        guard let text = sqlite3_column_text(handle, column) else { return nil }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self)
    }

    /// The column's bytes in place, valid only inside `body` (until the next step).
    public func withBytes<Result, Failure: Error>(
        _ column: Int32, _ body: (UnsafeRawBufferPointer) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        let count = Int(sqlite3_column_bytes(handle, column))
        return try body(UnsafeRawBufferPointer(start: count > 0 ? sqlite3_column_blob(handle, column) : nil, count: count))
    }

    public func bytes(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(handle, column))
        guard count > 0, let blob = sqlite3_column_blob(handle, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: blob, count: count))
    }
}
