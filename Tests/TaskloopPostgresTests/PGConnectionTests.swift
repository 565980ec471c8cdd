import Foundation
import Testing
import TaskloopLoop
import TaskloopLoopTestSupport
import TaskloopPostgres
import TaskloopTestSupport

/// PGConnection against a real PostgreSQL (a throwaway cluster, `PostgresCluster`), on a loop
/// of its own thread.
@Suite struct PGConnectionTests {
    /// A loop thread and connections made on it; what the callbacks saw, for the test thread.
    final class Harness: @unchecked Sendable {
        let thread: LoopThread
        var connections: [PGConnection] = []
        let outcomes = Locked<[String]>([])
        let notifications = Locked<[String]>([])
        let closed = Locked<[String]>([])

        init() throws {
            thread = LoopThread(try EventLoop(), name: "pg-test")
        }

        /// Connects (on the loop); the connection's index, once connected.
        func connect(_ url: String, timeouts: PGTimeouts? = nil) throws -> Int {
            let index = thread.run { [self] in
                let connection = PGConnection(loop: thread.loop)
                connections.append(connection)
                let index = connections.count - 1
                connection.onNotification = { [self] channel, payload in notifications.withLock { $0.append("\(channel):\(payload)") } }
                connection.onClosed = { [self] error in closed.withLock { $0.append("\(index): \(error)") } }
                connection.connect(url, timeouts: timeouts) { [self] result in
                    outcomes.withLock { $0.append("connect \(index): \(result.map { "ok" })") }
                }
                return index
            }
            try pollUntil("connection \(index)") { outcomes.value.contains { $0.hasPrefix("connect \(index):") } }
            let outcome = outcomes.value.first { $0.hasPrefix("connect \(index):") }!
            guard outcome.hasSuffix("success(\"ok\")") else { throw PGError(message: outcome) }
            return index
        }

        /// Runs one batch and waits for its results, turned into text by `read` on the loop.
        func execute(_ index: Int, _ queries: [PGQuery], read: @escaping @Sendable ([PGResult]) -> String = { results in
            results.map { result in
                (0..<result.rowCount).map { row in
                    (0..<result.columnCount).map { result.text(row, $0) ?? "null" }.joined(separator: ",")
                }.joined(separator: ";")
            }.joined(separator: " | ")
        }) throws -> Result<String, PGError> {
            let answer = Locked<Result<String, PGError>?>(nil)
            thread.run { [self] in
                connections[index].execute(queries) { result in answer.withLock { $0 = result.map(read) } }
            }
            try pollUntil("the batch's results") { answer.value != nil }
            return answer.value!
        }

        func finish() throws {
            thread.run { [self] in
                for connection in connections { connection.close() }
                connections = []
                thread.loop.finish()
            }
            try thread.waitForExit(timeout: 10)
        }
    }

    @Test func aBatchRunsItsQueriesInOrderWithPreparedStatementsAndBinaryValues() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let connection = try harness.connect(database)
        let insert = PGStatement("insert_blob", "INSERT INTO blobs (id, body) VALUES ($1, $2) RETURNING id")
        let created = try harness.execute(connection, [
            PGQuery("CREATE TABLE blobs (id bigint PRIMARY KEY, body bytea NOT NULL)"),
            PGQuery(insert, [.int(1), .bytes([0, 1, 2, 255])]),
            PGQuery(insert, [.int(2), .bytes(Array("héllo".utf8))]),
            PGQuery("SELECT count(*) FROM blobs"),
        ]).get()
        #expect(created == " | 1 | 2 | 2")
        let read = try harness.execute(connection, [PGQuery("SELECT id, body FROM blobs ORDER BY id", binaryResults: true)]) { results in
            let rows = results[0]
            return (0..<rows.rowCount).map { "\(rows.int($0, 0)!)=\(rows.bytes($0, 1)!)" }.joined(separator: " ")
        }.get()
        #expect(read == "1=[0, 1, 2, 255] 2=\(Array("héllo".utf8))")
        // The statement was prepared once; using it again on the same connection works.
        #expect(try harness.execute(connection, [PGQuery(insert, [.int(3), .bytes([])])]).get() == "3")
        try harness.finish()
    }

    /// Any number of rows goes in statements of 1, 2, 4 ... rows, each prepared once per
    /// connection: every row lands, in order, and the server holds one statement per count used.
    @Test func rowsGoInPreparedStatementsOfPowersOfTwoRows() throws {
        let rows = PGRowsStatement(name: "insert_pairs", head: "INSERT INTO pairs (id, body)", tail: "ON CONFLICT (id) DO NOTHING",
                                   columns: 2, maxRows: 8)
        func values(_ ids: Range<Int>) -> [PGValue] { ids.flatMap { [PGValue.int($0), .bytes([UInt8(truncatingIfNeeded: $0)])] } }
        #expect(rows.queries([]).isEmpty)
        // 13 = 8 + 4 + 1; 21 = 8 + 8 + 4 + 1 (no statement of more than `maxRows`).
        #expect(rows.queries(values(0..<13)).map { $0.parameters.count / 2 } == [8, 4, 1])
        #expect(rows.queries(values(0..<21)).map { $0.parameters.count / 2 } == [8, 8, 4, 1])

        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let connection = try harness.connect(database)
        _ = try harness.execute(connection, [PGQuery("CREATE TABLE pairs (id bigint PRIMARY KEY, body bytea NOT NULL)")]).get()
        _ = try harness.execute(connection, rows.queries(values(0..<13))).get()
        _ = try harness.execute(connection, rows.queries(values(13..<34)) + rows.queries(values(34..<35))).get()
        let stored = try harness.execute(connection, [PGQuery("SELECT id, body FROM pairs ORDER BY id", binaryResults: true)]) { results in
            (0..<results[0].rowCount).map { "\(results[0].int($0, 0)!):\(results[0].bytes($0, 1)!)" }.joined(separator: " ")
        }.get()
        #expect(stored == (0..<35).map { "\($0):[\($0)]" }.joined(separator: " "))
        let prepared = try harness.execute(connection, [
            PGQuery("SELECT name FROM pg_prepared_statements WHERE name LIKE 'insert_pairs%' ORDER BY name"),
        ]).get()
        #expect(prepared == "insert_pairs_1;insert_pairs_4;insert_pairs_8")
        try harness.finish()
    }

    @Test func aFailedQueryFailsItsBatchAndTheConnectionGoesOn() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let connection = try harness.connect(database)
        let failed = try harness.execute(connection, [
            PGQuery("SELECT 1"), PGQuery("SELECT 1 / 0"), PGQuery("SELECT 3"),
        ])
        guard case .failure(let error) = failed else { Issue.record("the batch succeeded: \(failed)"); return }
        #expect(error.sqlState == "22012" && error.message.contains("division by zero") && !error.isConnectionLost)
        #expect(try harness.execute(connection, [PGQuery("SELECT $1::int + 1", [.int(41)])]).get() == "42")
        // Inside a transaction the failure aborts it; the caller rolls back.
        let inTransaction = try harness.execute(connection, [PGQuery("BEGIN"), PGQuery("SELECT 1 / 0")])
        #expect(inTransaction.failureState == "22012")
        #expect(try harness.execute(connection, [PGQuery("ROLLBACK"), PGQuery("SELECT 'after'")]).get() == " | after")
        // A statement first used after the failing query of its batch was not prepared (the
        // server skips what follows a failure, its Parse included): it is prepared when next used.
        let late = PGStatement("prepared_after_a_failure", "SELECT $1::int * 2")
        #expect(try harness.execute(connection, [PGQuery("SELECT 1 / 0"), PGQuery(late, [.int(1)])]).failureState == "22012")
        #expect(try harness.execute(connection, [PGQuery(late, [.int(21)])]).get() == "42")
        // A statement whose SQL the server refuses is prepared again when next used.
        let refused = PGStatement("refused_then_fixed", "SELECT * FROM a_table_made_later")
        #expect(try harness.execute(connection, [PGQuery(refused)]).failureState == "42P01")
        #expect(try harness.execute(connection, [PGQuery("CREATE TABLE a_table_made_later (x int)")]).failureState == nil)
        #expect(try harness.execute(connection, [PGQuery(refused)]).get() == "")
        try harness.finish()
    }

    /// A batch is one implicit transaction: a deferred trigger that raises as it commits fails
    /// the batch (its error belongs to no query), nothing of it stays, and the connection goes on.
    @Test func aBatchWhoseCommitFailsFailsAndTheConnectionGoesOn() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let connection = try harness.connect(database)
        _ = try harness.execute(connection, [
            PGQuery("CREATE TABLE guarded (x int)"),
            PGQuery("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$"),
            PGQuery("""
                CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON guarded DEFERRABLE INITIALLY DEFERRED
                    FOR EACH ROW EXECUTE FUNCTION refuse()
                """),
        ]).get()
        let failed = try harness.execute(connection, [PGQuery("INSERT INTO guarded VALUES (1)"), PGQuery("SELECT 'inserted'")])
        guard case .failure(let error) = failed else { Issue.record("the batch succeeded: \(failed)"); return }
        #expect(error.message.contains("refused at commit") && !error.isConnectionLost)
        #expect(try harness.execute(connection, [PGQuery("DROP TRIGGER refuse ON guarded"), PGQuery("SELECT count(*) FROM guarded")])
            .get() == " | 0")
        try harness.finish()
    }

    @Test func manyBatchesInFlightCompleteInOrder() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let connection = try harness.connect(database)
        let order = Locked<[Int]>([])
        let statement = PGStatement("echo", "SELECT $1::bigint")
        harness.thread.run {
            for index in 0..<2_000 {
                harness.connections[connection].execute([PGQuery(statement, [.int(index)])]) { result in
                    if case .success(let rows) = result, let value = rows[0].int(0, 0) { order.withLock { $0.append(Int(value)) } }
                }
            }
        }
        try pollUntil("2,000 batches", timeout: 30) { order.value.count == 2_000 }
        #expect(order.value == Array(0..<2_000))
        try harness.finish()
    }

    /// A connection let go without `close` stops being watched: the next one, given the same
    /// descriptor, works (before, its watch failed with EEXIST), and the loop closes clean.
    @Test func aConnectionLetGoUnclosedLeavesNothingBehind() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let dropped = try harness.connect(database)
        harness.thread.run { harness.connections[dropped] = PGConnection(loop: harness.thread.loop) }
        let next = try harness.connect(database)
        #expect(try harness.execute(next, [PGQuery("SELECT 'works'")]).get() == "works")
        try harness.finish()
    }

    @Test func aNotifyReachesTheConnectionThatListens() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let listener = try harness.connect(database)
        let talker = try harness.connect(database)
        _ = try harness.execute(listener, [PGQuery("LISTEN taskloop")]).get()
        _ = try harness.execute(talker, [PGQuery("SELECT pg_notify('taskloop', 'turn 7')")]).get()
        try pollUntil("the notification") { harness.notifications.value == ["taskloop:turn 7"] }
        try harness.finish()
    }

    @Test func aSessionEndedByTheServerFailsWhatWasInFlightAndSaysSo() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let victim = try harness.connect(database)
        let other = try harness.connect(database)
        let pid = harness.thread.run { harness.connections[victim].serverProcessID }
        let slow = Locked<Result<[PGResult], PGError>?>(nil)
        harness.thread.run {
            harness.connections[victim].execute([PGQuery("SELECT pg_sleep(30)")]) { result in slow.withLock { $0 = result } }
        }
        _ = try harness.execute(other, [PGQuery("SELECT pg_terminate_backend($1)", [.int(Int(pid))])]).get()
        try pollUntil("the batch to fail") { slow.value != nil }
        guard case .failure(let error)? = slow.value else { Issue.record("the sleep succeeded"); return }
        #expect(error.isConnectionLost)
        try pollUntil("onClosed") { harness.closed.value.count == 1 }
        #expect(harness.closed.value[0].hasPrefix("\(victim):"))
        let after = try harness.execute(victim, [PGQuery("SELECT 1")])
        #expect(after.failureState == nil && (try? after.get()) == nil, "a closed connection refuses at once")
        try harness.finish()
    }

    /// A frozen peer is given up on both ends: the socket has libpq's keepalives (derived from
    /// the timeout), and the session has the server's timeouts and keepalives.
    @Test func aConnectionWithTimeoutsHasThemOnItsSocketAndItsSession() throws {
        let database = try PostgresCluster.shared().makeDatabase()
        let harness = try Harness()
        let connection = try harness.connect(database, timeouts: PGTimeouts(seconds: 7))
        let socket = harness.thread.run { harness.connections[connection].socketDescriptor }
        func option(_ level: Int32, _ name: Int32) -> Int32 {
            var value: Int32 = -1
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(socket, level, name, &value, &length)
            return value
        }
        #expect(option(SOL_SOCKET, SO_KEEPALIVE) == 1)
        #expect(option(Int32(IPPROTO_TCP), TCP_KEEPIDLE) == 7 && option(Int32(IPPROTO_TCP), TCP_KEEPINTVL) == 2
                    && option(Int32(IPPROTO_TCP), TCP_KEEPCNT) == 3)
        #expect(option(Int32(IPPROTO_TCP), TCP_USER_TIMEOUT) == 14_000)
        let shown = try harness.execute(connection, [
            "statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout", "tcp_keepalives_idle",
            "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout",
        ].map { PGQuery("SHOW \($0)") }).get()
        #expect(shown == "7s | 7s | 7s | 7 | 2 | 3 | 14000")
        try harness.finish()
    }

    /// What the connection string says is kept, in either of libpq's forms; the timeouts'
    /// parameters fill in only what it leaves out.
    @Test func theConnectionStringsOwnParametersWinOverTheTimeouts() throws {
        let defaults = PGTimeouts(seconds: 5).connectionParameters
        func merged(_ connectionString: String) throws -> [String] {
            try PGTimeouts.parameters(of: connectionString, adding: defaults).get().map { "\($0.keyword)=\($0.value)" }
        }
        #expect(try merged("postgres://u:p@db.example:6432/tasks?keepalives_idle=60&sslmode=require") == [
            "user=u", "password=p", "dbname=tasks", "host=db.example", "port=6432", "keepalives_idle=60", "sslmode=require",
            "keepalives=1", "keepalives_interval=1", "keepalives_count=3", "tcp_user_timeout=10000",
        ])
        #expect(try merged("host=db.example dbname='my tasks' keepalives=0 keepalives_count=9") == [
            "dbname=my tasks", "host=db.example", "keepalives=0", "keepalives_count=9",
            "keepalives_idle=5", "keepalives_interval=1", "tcp_user_timeout=10000",
        ])
        #expect(throws: PGError.self) { try merged("host=db.example nonsense=1") }
        #expect(throws: PGError.self) { try merged("postgresql://db.example/tasks?nonsense=1") }
    }

    @Test func connectingWhereNothingListensFailsWithTheReason() throws {
        let harness = try Harness()
        let port = try OriginServer.freePort()
        #expect(throws: PGError.self) { try harness.connect("postgres://postgres@127.0.0.1:\(port)/postgres") }
        #expect(harness.outcomes.value[0].contains("Connection refused"))
        try harness.finish()
    }
}

extension Result where Failure == PGError {
    var failureState: String? {
        if case .failure(let error) = self { return error.sqlState }
        return nil
    }
}
