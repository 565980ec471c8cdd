import TaskloopPostgres

/// Where an event stands in the cluster's one order of events: the id of the transaction that
/// committed it (PostgreSQL's 64-bit `xid8`) and its place among that transaction's events.
/// Cells commit side by side, so their transactions commit in any order; a reader takes only
/// events of transactions older than the oldest one still running (`pg_snapshot_xmin`), so no
/// event can later appear behind a position a reader has passed: a resume after any position,
/// on any replica, gets every later event exactly once.
public struct EventPosition: Comparable, Hashable, Sendable, CustomStringConvertible {
    public let transaction: UInt64
    public let index: UInt32

    public init(transaction: UInt64, index: UInt32) {
        self.transaction = transaction
        self.index = index
    }

    public static let start = EventPosition(transaction: 0, index: 0)

    public static func < (lhs: EventPosition, rhs: EventPosition) -> Bool {
        (lhs.transaction, lhs.index) < (rhs.transaction, rhs.index)
    }

    /// The opaque id clients see (`id:` of a stream, `Last-Event-ID`): fixed-width hex, so ids
    /// also sort as text.
    public var description: String {
        let transaction = String(transaction, radix: 16), index = String(index, radix: 16)
        return String(repeating: "0", count: 16 - transaction.count) + transaction
            + String(repeating: "0", count: 8 - index.count) + index
    }

    /// Reads an id made by `description`; nil for anything else.
    public init?(_ id: String) {
        guard id.utf8.count == 24, id.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) }),
              let transaction = UInt64(id.prefix(16), radix: 16), let index = UInt32(id.suffix(8), radix: 16) else { return nil }
        self.init(transaction: transaction, index: index)
    }
}

/// The cluster's events table and its statements: written in each cell's commit, read in
/// order by any replica (`ClusterEventFeed`).
public enum ClusterEvents {
    /// The channel that wakes readers once a commit wrote events (`notify`).
    public static let channel = "taskloop_events"

    static let setUp = [
        PGQuery("""
            CREATE TABLE IF NOT EXISTS taskloop.cell_events (transaction xid8 NOT NULL DEFAULT pg_current_xact_id(),
                index int NOT NULL, cell int NOT NULL, time bigint NOT NULL, type text NOT NULL, task text, workflow text,
                queue text, data bytea NOT NULL, PRIMARY KEY (transaction, index))
            """),
        // Kept by time: the oldest are dropped by `time`.
        PGQuery("CREATE INDEX IF NOT EXISTS cell_events_time ON taskloop.cell_events (time)"),
    ]

    /// The schedule an event is of (`?schedule=`): a `schedule.updated`'s, or the one whose run
    /// made the task or workflow (cluster schema 8).
    static let scheduleSetUp = [
        PGQuery("ALTER TABLE taskloop.cell_events ADD COLUMN IF NOT EXISTS schedule text"),
    ]

    /// One event as a cell's commit writes it.
    public struct Written: Sendable {
        public var time: Int64
        public var type: String
        public var task: String?
        public var workflow: String?
        public var queue: String?
        public var schedule: String?
        public var data: [UInt8]

        public init(time: Int64, type: String, task: String?, workflow: String?, queue: String?, schedule: String? = nil,
                    data: [UInt8]) {
            self.time = time
            self.type = type
            self.task = task
            self.workflow = workflow
            self.queue = queue
            self.schedule = schedule
            self.data = data
        }
    }

    /// One event as a reader gets it.
    public struct Read: Sendable {
        public var position: EventPosition
        public var cell: Cell
        public var event: Written
    }

    /// The statements that write `events` inside a commit of `cell` (numbered in order; the
    /// transaction's id comes from the database).
    /// `firstIndex`: where these events start among the transaction's (a commit of several
    /// cells numbers them all in one line).
    public static func insert(_ events: [Written], cell: Cell, firstIndex: Int = 0) -> [PGQuery] {
        insert(events.map { (cell, $0) }, firstIndex: firstIndex)
    }

    /// The statements that write the events of a commit of several cells, numbered in the
    /// order given, in statements of many rows whatever cell each is of.
    public static func insert(_ events: [(cell: Cell, event: Written)], firstIndex: Int = 0) -> [PGQuery] {
        var values: [PGValue] = []
        values.reserveCapacity(events.count * insertRows.columns)
        for (offset, (cell, event)) in events.enumerated() {
            values += [.int(firstIndex + offset), .int(Int(cell.index)), .int(event.time), .text(event.type), .optional(event.task),
                       .optional(event.workflow), .optional(event.queue), .optional(event.schedule), .bytes(event.data)]
        }
        return insertRows.queries(values)
    }

    static let insertRows = PGRowsStatement(
        name: "cell_events_insert",
        head: "INSERT INTO taskloop.cell_events (index, cell, time, type, task, workflow, queue, schedule, data)", columns: 9)

    /// Wakes the readers (`ClusterEventFeed`): sent by a committer in a batch of its own after a
    /// commit that wrote events, not inside the commit. PostgreSQL serialises the commits of
    /// every transaction that notifies, under one lock for the whole cluster held through the
    /// commit's flush, so a notification in each cell's commit would put every cell's commits
    /// in one line again. One in flight per committer is enough (the readers read every event
    /// committed before it, and poll besides).
    public static func notify(cell: Cell) -> PGQuery {
        PGQuery(notifyStatement, [.text(String(cell.index))])
    }

    static let notifyStatement = PGStatement("cell_events_notify", "SELECT pg_notify('\(channel)', $1)")

    // The statements order by `cell_events.transaction`: a bare `transaction` would name the
    // output column, the id as text, and "1000" sorts before "999".
    static let readAfter = PGStatement("cell_events_after", """
        SELECT transaction::text, index, cell, time, type, task, workflow, queue, data, schedule FROM taskloop.cell_events
        WHERE (transaction, index) > ($1::text::xid8, $2) AND transaction < pg_snapshot_xmin(pg_current_snapshot())
        ORDER BY cell_events.transaction, index LIMIT $3
        """)

    /// At most `limit` events after `position`, in order, of transactions that no running
    /// transaction can come before.
    public static func read(after position: EventPosition, limit: Int) -> PGQuery {
        PGQuery(readAfter, [.text(String(position.transaction)), .int(Int(position.index)), .int(limit)], binaryResults: true)
    }

    static let newest = PGStatement("cell_events_newest", """
        SELECT transaction::text, index FROM taskloop.cell_events WHERE transaction < pg_snapshot_xmin(pg_current_snapshot())
        ORDER BY cell_events.transaction DESC, index DESC LIMIT 1
        """)

    /// Where a reader that starts now starts: the last event of the transactions older than the
    /// oldest one still running (`position(of:)` reads it). Every event committed later comes
    /// after it, and so may a few committed just before, by a transaction younger than one
    /// still running: a start after those could skip the older transaction's events, which
    /// commit later but come before them.
    public static func now() -> PGQuery {
        PGQuery(newest)
    }

    static let oldestKept = PGStatement("cell_events_oldest", """
        SELECT transaction::text, index FROM taskloop.cell_events ORDER BY cell_events.transaction, index LIMIT 1
        """)

    /// The oldest event the history still keeps (`position(of:)` reads it; `.start` when it
    /// keeps none): a resume from before it may have missed events dropped by `trim`.
    public static func oldest() -> PGQuery {
        PGQuery(oldestKept)
    }

    /// The position `now` read; the start when no event is older than every running transaction.
    public static func position(of result: PGResult) -> EventPosition {
        guard result.rowCount == 1, let transaction = result.text(0, 0).flatMap({ UInt64($0) }), let index = result.int(0, 1) else {
            return .start
        }
        return EventPosition(transaction: transaction, index: UInt32(index))
    }

    public static func events(of result: PGResult) -> [Read] {
        (0..<result.rowCount).compactMap { row in
            guard let transaction = result.text(row, 0).flatMap({ UInt64($0) }), let index = result.int(row, 1),
                  let cell = result.int(row, 2), let time = result.int(row, 3), let type = result.text(row, 4) else { return nil }
            let data = result.bytes(row, 8) ?? []
            return Read(position: EventPosition(transaction: transaction, index: UInt32(index)),
                        cell: Cell(UInt16(truncatingIfNeeded: cell)),
                        event: Written(time: time, type: type, task: result.text(row, 5), workflow: result.text(row, 6),
                                       queue: result.text(row, 7), schedule: result.text(row, 9), data: data))
        }
    }

    /// Drops events older than `time` (wall-clock ms), at most `limit` of them: the history is
    /// kept by time, in bounded steps.
    public static func trim(before time: Int64, limit: Int) -> PGQuery {
        PGQuery("""
            DELETE FROM taskloop.cell_events WHERE (transaction, index) IN
                (SELECT transaction, index FROM taskloop.cell_events WHERE time < $1 ORDER BY time LIMIT $2)
            """, [.int(time), .int(limit)])
    }
}
