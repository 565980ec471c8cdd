import CLibPQ

/// A statement prepared once per connection, under its name, the first time a query uses it.
public struct PGStatement: Sendable, Hashable {
    public let name: String
    public let sql: String

    public init(_ name: String, _ sql: String) {
        self.name = name
        self.sql = sql
    }
}

/// A parameter: text as PostgreSQL reads its literals, or bytes for a `bytea` (sent binary).
public enum PGValue: Sendable, Equatable {
    case null
    case text(String)
    case bytes([UInt8])

    public static func int(_ value: Int64) -> PGValue { .text(String(value)) }
    public static func int(_ value: Int) -> PGValue { .text(String(value)) }
    public static func bool(_ value: Bool) -> PGValue { .text(value ? "t" : "f") }
    public static func optional(_ text: String?) -> PGValue { text.map { .text($0) } ?? .null }
}

/// One query of a batch.
public struct PGQuery: Sendable {
    public enum Statement: Sendable {
        case text(String)
        case prepared(PGStatement)
    }

    public var statement: Statement
    public var parameters: [PGValue]
    /// Columns come back in binary (a `bytea` as its bytes, a `bigint` as 8 bytes, big end
    /// first) rather than as text.
    public var binaryResults: Bool

    public init(_ sql: String, _ parameters: [PGValue] = [], binaryResults: Bool = false) {
        statement = .text(sql)
        self.parameters = parameters
        self.binaryResults = binaryResults
    }

    public init(_ statement: PGStatement, _ parameters: [PGValue] = [], binaryResults: Bool = false) {
        self.statement = .prepared(statement)
        self.parameters = parameters
        self.binaryResults = binaryResults
    }
}

/// What went wrong: the server's message and SQLSTATE, or the connection's end.
public struct PGError: Error, CustomStringConvertible, Sendable {
    public let message: String
    /// The five-character SQLSTATE (e.g. `40001`), when the server sent one.
    public var sqlState: String?
    /// The connection is gone; whatever was in flight may or may not have been committed.
    public var isConnectionLost: Bool

    public init(message: String, sqlState: String? = nil, isConnectionLost: Bool = false) {
        self.message = message
        self.sqlState = sqlState
        self.isConnectionLost = isConnectionLost
    }

    public var description: String { sqlState.map { "\(message) (SQLSTATE \($0))" } ?? message }
}

/// The rows of one query (freed with it).
public final class PGResult {
    private let result: OpaquePointer

    init(_ result: OpaquePointer) {
        self.result = result
    }

    deinit {
        PQclear(result)
    }

    public var rowCount: Int { Int(PQntuples(result)) }
    public var columnCount: Int { Int(PQnfields(result)) }
    /// Rows an INSERT, UPDATE or DELETE touched.
    public var affectedRows: Int { Int(String(cString: PQcmdTuples(result))) ?? 0 }

    var error: PGError? {
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_SINGLE_TUPLE, PGRES_EMPTY_QUERY, PGRES_COPY_OUT, PGRES_COPY_IN:
            return nil
        case PGRES_PIPELINE_ABORTED:
            return PGError(message: "not run: an earlier query of the batch failed")
        default:
            let message = PQresultErrorField(result, Int32(UInt8(ascii: "M"))).map { String(cString: $0) }
                ?? String(cString: PQresultErrorMessage(result))
            let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            return PGError(message: message, sqlState: state)
        }
    }

    public func isNull(_ row: Int, _ column: Int) -> Bool {
        PQgetisnull(result, Int32(row), Int32(column)) == 1
    }

    /// A text column (or a binary one's raw bytes read as UTF-8).
    public func text(_ row: Int, _ column: Int) -> String? {
        guard !isNull(row, column) else { return nil }
        return String(cString: PQgetvalue(result, Int32(row), Int32(column)))
    }

    public func bytes(_ row: Int, _ column: Int) -> [UInt8]? {
        guard !isNull(row, column) else { return nil }
        let length = Int(PQgetlength(result, Int32(row), Int32(column)))
        guard let value = PQgetvalue(result, Int32(row), Int32(column)) else { return [] }
        return value.withMemoryRebound(to: UInt8.self, capacity: length) { Array(UnsafeBufferPointer(start: $0, count: length)) }
    }

    /// An integer column, from text or from binary (2, 4 or 8 bytes, big end first).
    public func int(_ row: Int, _ column: Int) -> Int64? {
        guard !isNull(row, column) else { return nil }
        if PQfformat(result, Int32(column)) == 0 { return text(row, column).flatMap { Int64($0) } }
        guard let bytes = bytes(row, column), [2, 4, 8].contains(bytes.count) else { return nil }
        var value: Int64 = bytes[0] & 0x80 != 0 ? -1 : 0
        for byte in bytes { value = value << 8 | Int64(byte) }
        return value
    }

    public func bool(_ row: Int, _ column: Int) -> Bool? {
        guard !isNull(row, column) else { return nil }
        if PQfformat(result, Int32(column)) == 0 { return text(row, column) == "t" }
        return bytes(row, column)?.first == 1
    }
}

/// A statement of many rows (an INSERT's VALUES), prepared once per connection for each row
/// count of 1, 2, 4 ... `maxRows`: any number of rows goes in the fewest statements whose counts
/// add up to it. A statement text of its own for each count would be parsed and planned at each
/// use; these few are planned once (with a generic plan: `PGConnection`'s users set
/// `plan_cache_mode` where it pays) and serve every batch.
public struct PGRowsStatement: Sendable {
    public let columns: Int
    /// The statement of `1 << k` rows at `k`.
    private let statements: [PGStatement]

    /// `head` comes before `VALUES ...`, `tail` after it (`ON CONFLICT ...`).
    public init(name: String, head: String, tail: String = "", columns: Int, maxRows: Int = 128) {
        precondition(columns > 0 && maxRows > 0 && maxRows & (maxRows - 1) == 0, "a power of two of rows")
        self.columns = columns
        statements = (0...maxRows.trailingZeroBitCount).map { power in
            let rows = 1 << power
            return PGStatement("\(name)_\(rows)", head + " VALUES " + PGQuery.placeholders(rows: rows, columns: columns)
                               + (tail.isEmpty ? "" : " " + tail))
        }
    }

    /// The queries that write `values`, `columns` to a row, in order.
    public func queries(_ values: [PGValue]) -> [PGQuery] {
        precondition(values.count % columns == 0, "whole rows")
        var queries: [PGQuery] = []
        var row = 0, rows = values.count / columns
        while row < rows {
            let power = min(statements.count - 1, Int.bitWidth - 1 - (rows - row).leadingZeroBitCount)
            let count = 1 << power
            queries.append(PGQuery(statements[power], Array(values[row * columns..<(row + count) * columns])))
            row += count
        }
        return queries
    }
}

extension PGQuery {
    /// `($1, $2), ($3, $4)` for two rows of two columns: the VALUES of a statement of many rows.
    public static func placeholders(rows: Int, columns: Int) -> String {
        var text = ""
        text.reserveCapacity(rows * columns * 5)
        for row in 0..<rows {
            text += row == 0 ? "(" : ", ("
            for column in 0..<columns {
                if column > 0 { text += ", " }
                text += "$\(row * columns + column + 1)"
            }
            text += ")"
        }
        return text
    }
}
