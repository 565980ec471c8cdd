import Foundation
import Testing
import TaskloopEngine
import TaskloopLoop
import TaskloopLoopTestSupport
import TaskloopPostgres
import TaskloopTestSupport
@testable import TaskloopStore

/// The shared database's journal against a real PostgreSQL: migrations under their lock,
/// turns in one order, deltas, removals, notifications, and replicas' leases.
/// A value handed to the loop thread and back, used on one thread at a time.
struct Unchecked<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

@Suite struct PostgresJournalTests {
    final class Harness: @unchecked Sendable {
        let thread: LoopThread
        let url: String
        var journals: [PostgresJournal] = []
        let notified = Locked<[String]>([])

        init() throws {
            url = try PostgresCluster.shared().makeDatabase()
            thread = LoopThread(try EventLoop(), name: "journal-test")
        }

        /// Calls `start` on the loop with a completion, and waits for the completion's value.
        func call<Value>(_ what: String, timeout: Double = 15,
                         _ start: @escaping (@escaping (Value) -> Void) -> Void) throws -> Value {
            let box = Locked<[Value]>([])
            let start = Unchecked(start)
            thread.run { start.value { value in box.withLock { $0.append(value) } } }
            try pollUntil(what, timeout: timeout) { !box.value.isEmpty }
            return box.value[0]
        }

        /// A journal opened for replica `name`; its index.
        func open(_ name: String, leaseMilliseconds: UInt64 = 10_000, timeoutSeconds: Int = 5) throws
            -> (index: Int, loaded: PostgresJournal.Loaded) {
            var configured = PostgresJournal.Settings(url: url, replica: name)
            configured.leaseMilliseconds = leaseMilliseconds
            configured.timeouts = PGTimeouts(seconds: timeoutSeconds)
            let settings = configured
            let index = thread.run { [self] in
                let journal = PostgresJournal(loop: thread.loop, settings: settings)
                journal.onTurnCommitted = { [self] turn in notified.withLock { $0.append("\(name) heard \(turn)") } }
                journals.append(journal)
                return journals.count - 1
            }
            let loaded = try call("open \(name)") { [self] done in journals[index].open(done) }.get()
            return (index, loaded)
        }

        func finish() throws {
            for index in 0..<thread.run({ [self] in journals.count }) {
                _ = try call("close") { [self] done in journals[index].close { done(()) } }
            }
            thread.run { [self] in
                journals = []
                thread.loop.finish()
            }
            try thread.waitForExit(timeout: 10)
        }
    }

    static func task(_ sequence: UInt64, state: TaskState = .queued, workflow: TaskID? = nil) -> TaskSnapshot {
        TaskSnapshot(
            id: TaskID(high: 0x0192_0000_0000_0000 | sequence, low: sequence), sequence: sequence, kind: "noop", params: [:],
            name: "t\(sequence)", queue: "q", priority: 0, dependencies: [], onDependencyFailure: .cancel,
            timeoutMilliseconds: nil, retry: RetryPolicy(), metadata: nil, workflow: workflow, createdAt: 1_795_000_000_000,
            state: state, cancelRequested: false, attempt: 1, startedAt: nil, finishedAt: nil, result: nil, error: nil,
            progress: TaskProgress(), notBefore: nil, runner: state == .running ? "a" : nil)
    }

    @Test func replicasOpeningTogetherMigrateOnceAndFindTheSameEmptyDatabase() throws {
        let h = try Harness()
        let opened = Locked<[String]>([])
        h.thread.run {
            for name in ["a", "b", "c"] {
                var settings = PostgresJournal.Settings(url: h.url, replica: name)
                settings.leaseMilliseconds = 10_000
                let journal = PostgresJournal(loop: h.thread.loop, settings: settings)
                h.journals.append(journal)
                journal.open { result in opened.withLock { $0.append("\(name): \(result.map { "turn \($0.turn)" })") } }
            }
        }
        try pollUntil("three opens") { opened.value.count == 3 }
        #expect(opened.value.sorted() == ["a: success(\"turn 0\")", "b: success(\"turn 0\")", "c: success(\"turn 0\")"])
        let cluster = try PostgresCluster.shared()
        #expect(try cluster.sql("SELECT schema_version FROM taskloop.state", database: h.url).trimmingCharacters(in: .newlines) == "\(SharedSchema.version)")
        #expect(try cluster.sql("SELECT string_agg(name, ',' ORDER BY name) FROM taskloop.replicas", database: h.url)
            .trimmingCharacters(in: .newlines) == "a,b,c")
        try h.finish()
    }

    @Test func aTurnsChangesReachAnotherReplicaAsADeltaAndAtStart() throws {
        let h = try Harness()
        let a = try h.open("a").index
        let b = try h.open("b").index
        let workflow = TaskID(high: 0x0192_0000_0000_0099, low: 9)
        var batch = StoreBatch()
        batch.tasks = [Self.task(1, workflow: workflow), Self.task(2, state: .running)]
        batch.workflows = [WorkflowSnapshot(id: workflow, name: "w", createdAt: 5, keys: [.init(key: "k", id: batch.tasks[0].id)])]
        batch.queues = [QueueSnapshot(name: "q", maxConcurrency: 3, paused: true, dispatch: .workers)]
        batch.idempotencyKeys = [IdempotencyRecord(key: "key-1", requestHash: [1, 2, 3], status: 201, resource: "/tasks/x", expiresAt: 99)]
        batch.webhooks = [WebhookRecord(id: "wh", url: "http://127.0.0.1:9/", events: ["task.state"], queue: nil, workflow: "w",
                                        enabled: true, createdAt: 7, secret: "whsec_x")]
        batch.deliveries = [DeliveryRecord(id: "d1", webhook: "wh", eventSeq: 1, type: "task.state", body: Array("{}".utf8),
                                           attempt: 2, state: .pending, statusCode: 500, error: nil, durationMilliseconds: 12,
                                           attemptedAt: 8, nextAttemptAt: 9, earlierAttempts: [DeliveryAttempt(
                                               number: 1, statusCode: nil, error: "connect_failed", durationMilliseconds: 1,
                                               attemptedAt: 6, nextAttemptAt: 7)])]
        // Made now: history older than an hour is dropped by the turns.
        let event = SharedEvent(seq: 1, type: "task.state", time: Int64(Date().timeIntervalSince1970 * 1_000), task: batch.tasks[0].id,
                                workflow: workflow, queue: "q",
                                data: Array(#"{"seq":1}"#.utf8))
        let opened = try h.call("a's turn") { done in h.journals[a].beginTurn(after: 0, done) }.get()
        #expect(opened?.isEmpty == true && opened?.turn == 0)
        try h.call("a's commit") { done in h.journals[a].commitTurn(1, batch, events: [event], eventSequence: 1, done) }.get()
        try pollUntil("the notification") { h.notified.value.contains("b heard 1") }

        let delta = try #require(try h.call("b catches up") { done in h.journals[b].catchUp(after: 0, done) }.get())
        #expect(delta.turn == 1 && delta.eventSequence == 1)
        #expect(delta.changes.tasks == batch.tasks && delta.changes.workflows == batch.workflows && delta.changes.queues == batch.queues)
        #expect(delta.idempotencyKeys == batch.idempotencyKeys && delta.webhooks == batch.webhooks)
        #expect(delta.deliveries.map(\.record) == batch.deliveries && delta.deliveries.map(\.owner) == ["a"])
        #expect(delta.events == [event])
        #expect(try h.call("nothing new") { done in h.journals[b].catchUp(after: 1, done) }.get() == nil)

        // Removals: what a turn forgets reaches the others as deletions.
        var removals = StoreBatch()
        removals.evictedTasks = [StoredTaskKey(id: batch.tasks[0].id, sequence: 1)]
        removals.evictedWorkflows = [workflow]
        removals.expiredIdempotencyKeys = ["key-1"]
        removals.deletedWebhooks = ["wh"]
        _ = try h.call("b's turn") { done in h.journals[b].beginTurn(after: 1, done) }.get()
        try h.call("b's commit") { done in h.journals[b].commitTurn(2, removals, events: [], eventSequence: 1, done) }.get()
        let forgotten = try #require(try h.call("a catches up") { done in h.journals[a].catchUp(after: 1, done) }.get())
        #expect(forgotten.changes.evictedTasks == removals.evictedTasks && forgotten.changes.evictedWorkflows == [workflow])
        #expect(forgotten.expiredIdempotencyKeys == ["key-1"] && forgotten.deletedWebhooks == ["wh"] && forgotten.deletedDeliveries == ["d1"])

        // A replica starting now loads what is left.
        let c = try h.open("c").loaded
        #expect(c.turn == 2 && c.state.tasks == [batch.tasks[1]] && c.state.queues == batch.queues && c.events == [event])
        #expect(c.state.webhooks.isEmpty && c.state.deliveries.isEmpty && c.state.idempotencyKeys.isEmpty)
        try h.finish()
    }

    @Test func turnsOfReplicasFollowOneAnotherAndAnAbandonedTurnChangesNothing() throws {
        let h = try Harness()
        let a = try h.open("a").index
        let b = try h.open("b").index
        _ = try h.call("a's turn") { done in h.journals[a].beginTurn(after: 0, done) }.get()
        // b asks for a turn while a holds one: it waits for a's commit, and then sees it.
        let bTurn = Locked<Result<SharedDelta?, PGError>?>(nil)
        h.thread.run { h.journals[b].beginTurn(after: 0) { result in bTurn.withLock { $0 = result } } }
        // The lock is visible in pg_locks while b waits on it.
        try pollUntil("b waiting on the turn lock") {
            try PostgresCluster.shared().sql(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    + "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                database: h.url).trimmingCharacters(in: .newlines) == "1"
        }
        #expect(bTurn.value == nil)
        var batch = StoreBatch()
        batch.tasks = [Self.task(1)]
        try h.call("a's commit") { done in h.journals[a].commitTurn(1, batch, events: [], eventSequence: 0, done) }.get()
        try pollUntil("b's turn") { bTurn.value != nil }
        let delta = try #require(try bTurn.value!.get())
        #expect(delta.turn == 1 && delta.changes.tasks == batch.tasks)
        // b gives its turn up: nothing it did is kept.
        h.thread.run { h.journals[b].abandonTurn() }
        _ = try h.call("a's next turn") { done in h.journals[a].beginTurn(after: 1, done) }.get()
        var second = StoreBatch()
        second.tasks = [Self.task(2)]
        try h.call("a's second commit") { done in h.journals[a].commitTurn(2, second, events: [], eventSequence: 0, done) }.get()
        let loaded = try h.call("reload") { done in h.journals[b].loadEverything(done) }.get()
        #expect(loaded.turn == 2 && loaded.state.tasks.map(\.sequence) == [1, 2])
        try h.finish()
    }

    /// A replica frozen inside its turn (SIGSTOP, a paused VM: it sends nothing more) holds the
    /// turn lock only until the server ends its idle session; a replica waiting for the lock
    /// meanwhile waits past its own timeouts and then gets it.
    @Test func aReplicaFrozenInsideItsTurnHasItsSessionEndedAndAnotherGetsTheTurn() throws {
        let h = try Harness()
        let frozen = try h.open("frozen", timeoutSeconds: 2).index
        let waiting = try h.open("waiting", timeoutSeconds: 1).index
        let lost = Locked<PGError?>(nil)
        h.thread.run { h.journals[frozen].onLost = { error in lost.withLock { $0 = error } } }
        _ = try h.call("frozen's turn") { done in h.journals[frozen].beginTurn(after: 0, done) }.get()
        let turn = Locked<Result<SharedDelta?, PGError>?>(nil)
        h.thread.run { h.journals[waiting].beginTurn(after: 0) { result in turn.withLock { $0 = result } } }
        try pollUntil("the waiting replica's turn", timeout: 15) { turn.value != nil }
        #expect(try turn.value!.get()?.turn == 0, "the turn came, not a timeout")
        try pollUntil("the frozen replica to hear its session ended") { lost.value != nil }
        try h.call("the turn's commit") { done in h.journals[waiting].commitTurn(1, StoreBatch(), events: [], eventSequence: 0, done) }.get()
        try h.finish()
    }

    /// How many sessions on the test's database wait for a lock.
    static func waitingForLocks(_ url: String) throws -> String {
        try PostgresCluster.shared().sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            database: url).trimmingCharacters(in: .newlines)
    }

    /// A renewal does not wait behind the turn lock (a replica waiting for its turn would
    /// otherwise be taken for gone), and its lease runs from when the row is written, not
    /// from the start of the statement's transaction.
    @Test func aLeaseIsRenewedWhileTheTurnWaitsAndRunsFromTheRenewalsWrite() throws {
        let h = try Harness()
        let a = try h.open("a", leaseMilliseconds: 60_000).index
        // b's turn is not cut short by its idle timeout while a waits for it.
        let b = try h.open("b", timeoutSeconds: 60).index
        _ = try h.call("b's turn") { done in h.journals[b].beginTurn(after: 0, done) }.get()
        let aTurn = Locked<Result<SharedDelta?, PGError>?>(nil)
        h.thread.run { h.journals[a].beginTurn(after: 0) { result in aTurn.withLock { $0 = result } } }
        try pollUntil("a waiting for the turn lock") { try Self.waitingForLocks(h.url) == "1" }
        try h.call("a renews while its turn waits", timeout: 5) { done in h.journals[a].renewLease(done) }.get()
        #expect(aTurn.value == nil)
        h.thread.run { h.journals[b].abandonTurn() }
        try pollUntil("a's turn") { aTurn.value != nil }
        _ = try h.call("a gives its turn up") { done in h.journals[a].abandonTurn { done(()) } }

        // Another session changes a's row: the renewal waits for it, and its lease counts from
        // after that change committed.
        let holder = Locked<[String]>([])
        let connection = h.thread.run { Unchecked(PGConnection(loop: h.thread.loop)) }
        let hold = { (queries: [PGQuery]) in
            let before = holder.value.count
            h.thread.run {
                connection.value.execute(queries) { result in
                    let rows = (try? result.get().filter { $0.rowCount > 0 }.compactMap { $0.text(0, 0) }) ?? ["\(result)"]
                    holder.withLock { $0.append(rows.joined()) }
                }
            }
            try pollUntil("the holder's batch") { holder.value.count > before }
        }
        _ = try h.call("the holder connects") { done in connection.value.connect(h.url) { done($0) } }.get()
        try hold([PGQuery("BEGIN"), PGQuery("UPDATE taskloop.replicas SET started_at = clock_timestamp() WHERE name = 'a'")])
        let renewed = Locked<Result<Void, PGError>?>(nil)
        h.thread.run { h.journals[a].renewLease { result in renewed.withLock { $0 = result } } }
        try pollUntil("the renewal waiting for the row") { try Self.waitingForLocks(h.url) == "1" }
        try hold([PGQuery("SELECT extract(epoch FROM clock_timestamp())::text"), PGQuery("COMMIT")])
        let released = try #require(Double(holder.value[1]), "\(holder.value)")
        try pollUntil("the renewal") { renewed.value != nil }
        try renewed.value!.get()
        let expires = try PostgresCluster.shared().sql(
            "SELECT extract(epoch FROM expires_at) FROM taskloop.replicas WHERE name = 'a'", database: h.url)
        let leaseStart = try #require(Double(expires.trimmingCharacters(in: .whitespacesAndNewlines))) - 60
        #expect(leaseStart > released, "the lease started \(released - leaseStart) s before the renewal wrote it")
        h.thread.run { connection.value.close() }
        try h.finish()
    }

    static func failureState<Value>(_ result: Result<Value, PGError>) -> String? {
        if case .failure(let error) = result { return error.sqlState }
        return nil
    }

    /// A process opening under a name in use takes it over: the older one's renewals and turns
    /// fail with `replicaReplaced` (its turn gives the lock back), starting over does not take
    /// the name back, and leaving does not remove the newer one's row.
    @Test func aProcessOpeningUnderANameInUseTakesItOverAndTheOlderIsFenced() throws {
        let h = try Harness()
        let older = try h.open("a").index
        let newer = try h.open("a").index
        let renewed = try h.call("the older renews") { done in h.journals[older].renewLease(done) }
        #expect(Self.failureState(renewed) == PostgresJournal.replicaReplaced)
        let turn = try h.call("the older's turn") { done in h.journals[older].beginTurn(after: 0, done) }
        #expect(Self.failureState(turn) == PostgresJournal.replicaReplaced)
        _ = try h.call("the newer's turn", timeout: 5) { done in h.journals[newer].beginTurn(after: 0, done) }.get()
        h.thread.run { h.journals[newer].abandonTurn() }
        try h.call("the newer renews") { done in h.journals[newer].renewLease(done) }.get()

        let settings = h.thread.run { h.journals[older].settings }
        let again = h.thread.run {
            h.journals.append(PostgresJournal(loop: h.thread.loop, settings: settings))
            return h.journals.count - 1
        }
        let reopened = try h.call("the older starts over") { done in h.journals[again].open(replacing: false, done) }
        #expect(Self.failureState(reopened) == PostgresJournal.replicaReplaced)
        _ = try h.call("the older leaves") { done in h.journals[older].close { done(()) } }
        #expect(try PostgresCluster.shared().sql("SELECT count(*) FROM taskloop.replicas WHERE name = 'a'", database: h.url)
            .hasPrefix("1"))
        try h.call("the newer renews again") { done in h.journals[newer].renewLease(done) }.get()
        try h.finish()
    }

    @Test func aReplicaThatStopsRenewingIsFoundGoneAndLearnsItWhenItComesBack() throws {
        let h = try Harness()
        let a = try h.open("a", leaseMilliseconds: 200).index
        let b = try h.open("b").index
        try pollUntil("a's lease to run out", timeout: 10) {
            try h.call("check") { done in h.journals[b].anyReplicaGone(done) }.get()
        }
        let delta = try #require(try h.call("b's turn") { done in h.journals[b].beginTurn(after: 0, done) }.get())
        #expect(delta.goneReplicas == ["a"])
        try h.call("b's commit") { done in
            h.journals[b].commitTurn(1, StoreBatch(), events: [], eventSequence: 0, goneReplicas: ["a"], done)
        }.get()
        let renewed = try h.call("a renews") { done in h.journals[a].renewLease(done) }
        guard case .failure(let error) = renewed else { Issue.record("a renewed its lease after being found gone"); return }
        #expect(error.sqlState == PostgresJournal.replicaGone)
        try h.call("b renews") { done in h.journals[b].renewLease(done) }.get()
        try h.finish()
    }
}
