import TaskloopPostgres

/// What one cell tells another (a dependency's end, a cancellation, a retry across queues): a
/// row written in the sender's commit, read by the receiving cell's owner and deleted in the
/// commit that applies it, so each is applied once, fenced by the receiver's epoch (a deposed
/// owner's commit deletes nothing, and the next owner applies it). A sender's commits follow
/// one another, so its messages' ids increase in the order it sent them: read by id, they
/// arrive in that order. The body is the engine's, as bytes.
public enum ClusterMessages {
    /// The channel a sender's commit notifies with the receiving cell's number.
    public static let channel = "taskloop_cells"

    static let setUp = [
        PGQuery("""
            CREATE TABLE IF NOT EXISTS taskloop.cell_messages (id bigserial PRIMARY KEY, cell int NOT NULL, sender int NOT NULL,
                body bytea NOT NULL)
            """),
        PGQuery("CREATE INDEX IF NOT EXISTS cell_messages_cell ON taskloop.cell_messages (cell, id)"),
    ]

    public struct Message: Sendable, Equatable {
        public var id: Int64
        public var sender: Cell
        public var body: [UInt8]
    }

    /// The statements that send `bodies` to `cell`, inside a commit of `sender` (then `notify`).
    public static func send(_ bodies: [[UInt8]], to cell: Cell, from sender: Cell) -> [PGQuery] {
        guard !bodies.isEmpty else { return [] }
        var values: [PGValue] = []
        values.reserveCapacity(bodies.count * insertRows.columns)
        for body in bodies { values += [.int(Int(cell.index)), .int(Int(sender.index)), .bytes(body)] }
        return insertRows.queries(values)
    }

    static let insertRows = PGRowsStatement(name: "cell_messages_insert",
                                            head: "INSERT INTO taskloop.cell_messages (cell, sender, body)", columns: 3)

    /// Wakes the owners of `cells`: sent in a batch of its own after the commit that sent them
    /// messages, never inside it (PostgreSQL serialises the commits of every transaction that
    /// notifies, under one lock for the whole cluster held through the commit's flush).
    public static func notify(_ cells: [Cell]) -> [PGQuery] {
        cells.map { PGQuery(notifyStatement, [.text(String($0.index))]) }
    }

    static let notifyStatement = PGStatement("cell_messages_notify", "SELECT pg_notify('\(channel)', $1)")

    static let readFor = PGStatement("cell_messages_for", """
        SELECT id, sender, body FROM taskloop.cell_messages WHERE cell = $1 AND id > $2 ORDER BY id LIMIT $3
        """)

    /// At most `limit` messages for `cell` after the one with id `after`, in the order sent.
    public static func read(for cell: Cell, after id: Int64 = 0, limit: Int) -> PGQuery {
        PGQuery(readFor, [.int(Int(cell.index)), .int(id), .int(limit)], binaryResults: true)
    }

    public static func messages(of result: PGResult) -> [Message] {
        (0..<result.rowCount).compactMap { row in
            guard let id = result.int(row, 0), let sender = result.int(row, 1) else { return nil }
            return Message(id: id, sender: Cell(UInt16(truncatingIfNeeded: sender)), body: result.bytes(row, 2) ?? [])
        }
    }

    static let acknowledgeStatement = PGStatement("cell_messages_done", "DELETE FROM taskloop.cell_messages WHERE cell = $1 AND id = ANY($2::bigint[])")

    /// Deletes the applied messages, inside the receiving cell's commit that applies them.
    public static func acknowledge(_ ids: [Int64], of cell: Cell) -> PGQuery {
        PGQuery(acknowledgeStatement, [.int(Int(cell.index)), .text("{" + ids.map(String.init).joined(separator: ",") + "}")])
    }
}
