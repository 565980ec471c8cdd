import Foundation
import Testing
import TaskloopTime
import TaskloopEngine
import TaskloopJSON
import TaskloopStore
import TaskloopTestSupport

/// An engine whose every settled change goes through a real SQLite store, reopened the way a
/// restarted server reopens it.
@Suite struct TaskStoreTests {
    final class Durable {
        let path: String
        let clock: VirtualScheduler
        let engine: Engine
        var store: SQLiteTaskStore?
        var builder = StoreBatchBuilder()
        let pending = Locked(0)
        let failures = Locked<[StoreWriteError]>([])

        init(path: String = DataDirectoryTests.temporaryPath(), wallClock: Int64 = 1_795_000_000_000,
             configure: (inout EngineConfiguration) -> Void = { _ in }) throws {
            self.path = path
            clock = VirtualScheduler(wallClockOrigin: wallClock)
            var configuration = EngineConfiguration()
            configure(&configuration)
            engine = Engine(configuration: configuration, scheduler: clock)
            store = try SQLiteTaskStore(dataDirectory: path, syncLevel: .normal) { $0() }
            engine.addObserver { [unowned self] events in builder.add(events) }
        }

        /// Ends a "loop turn": its changes go to the store, and this waits until committed.
        func flush() throws {
            guard !builder.isEmpty, let store else { return }
            pending.withLock { $0 += 1 }
            store.write(builder.take(from: engine)) { [pending, failures] result in
                if case .failure(let error) = result { failures.withLock { $0.append(error) } }
                pending.withLock { $0 -= 1 }
            }
            try pollUntil("the batch to commit") { pending.value == 0 }
            #expect(failures.value.isEmpty, "\(failures.value)")
        }

        /// Closes the store and opens a new engine on the same data dir, `later` ms on.
        func restart(later: Int64 = 0, configure: (inout EngineConfiguration) -> Void = { _ in }) throws -> Durable {
            store?.close()
            store = nil
            let next = try Durable(path: path, wallClock: clock.wallClock + later, configure: configure)
            let loaded = next.store!.takeLoaded()
            try next.engine.restore(queues: loaded.queues, workflows: loaded.workflows, tasks: loaded.tasks,
                                    uniqueKeys: loaded.uniqueKeys, schedules: loaded.schedules)
            try next.flush()
            return next
        }

        func everything() -> [TaskSnapshot] {
            var all: [TaskSnapshot] = []
            var before: TaskID?
            while true {
                let page = engine.listTasks(before: before, limit: 1_000) { _ in true }
                all += page.tasks.map { engine.snapshot(of: $0) }
                guard let next = page.next else { return all.reversed() }
                before = next
            }
        }

        func rows(of table: String = "tasks") throws -> Int64? {
            let reader = try SQLiteDatabase(path: path + "/taskloop.db", mode: .readOnly)
            return try reader.integer("SELECT count(*) FROM \(table)")
        }

        deinit {
            store?.close()
        }
    }

    /// A cell's engine's messages to other cells leave in the batch of the change that made
    /// them, for the commit that writes it to send.
    @Test func aCellsMessagesLeaveInTheBatchOfTheirChange() throws {
        let clock = VirtualScheduler(wallClockOrigin: 1_795_000_000_000)
        var configuration = EngineConfiguration()
        configuration.cells = CellPlacement(cell: 1) { $0 == "mine" ? 1 : 2 }
        let engine = Engine(configuration: configuration, scheduler: clock)
        var builder = StoreBatchBuilder()
        engine.addObserver { events in builder.add(events) }
        var elsewhere = TaskIDGenerator(cell: 2)
        let remote = elsewhere.next(wallClockMilliseconds: 1_795_000_000_000)
        var spec = TaskSpec(kind: "noop")
        spec.queue = "mine"
        spec.dependencies = [.task(remote)]
        let dependent = try engine.submit(spec)
        let batch = builder.take(from: engine)
        #expect(batch.tasks.map(\.id) == [dependent.id])
        #expect(batch.messages == [CellMessage(.watch, from: 1, to: 2, dependency: remote)])
        #expect(!batch.isEmpty)
        #expect(builder.take(from: engine).messages.isEmpty, "taken once")
    }

    @Test func everyStateSurvivesARestart() throws {
        let first = try Durable()
        defer { try? FileManager.default.removeItem(atPath: first.path) }
        let engine = first.engine
        let done = try engine.submit(TaskSpec(kind: "noop", name: "done", metadata: ["owner": "me", "n": 1.5]))
        let running = try engine.submit(TaskSpec(kind: "sleep", params: ["duration_ms": 1_000, "steps": 4], name: "running",
                                                 retry: RetryPolicy(maxAttempts: 3, backoffMilliseconds: 250, backoffFactor: 1.5)))
        let waiting = try engine.submit(TaskSpec(kind: "noop", name: "waiting", dependencies: [.task(running.id)],
                                                 onDependencyFailure: .run))
        let flaky = try engine.submit(TaskSpec(kind: "sleep", params: ["duration_ms": 10, "outcome": "fail"], name: "flaky",
                                               timeoutMilliseconds: 60_000, retry: RetryPolicy(maxAttempts: 2)))
        try engine.updateQueue("slow", maxConcurrency: 1, paused: true)
        let workflow = try engine.submitWorkflow(name: "wf", tasks: [
            (key: "x", spec: TaskSpec(kind: "noop", queue: "slow", priority: -2)),
            (key: "y", spec: TaskSpec(kind: "noop", queue: "slow", dependencies: [.sibling(key: "x")])),
        ])
        let cancelled = try engine.submit(TaskSpec(kind: "noop", queue: "slow"))
        try engine.cancel(cancelled.id)
        first.clock.advance(by: 300)
        try first.flush()
        #expect(running.state == .running && running.progress.fraction == 0.25 && flaky.state == .pending)
        #expect(done.state == .succeeded && waiting.state == .pending)

        let before = first.everything()
        let second = try first.restart(later: 100)
        let after = second.everything()
        #expect(after.map(\.id) == before.map(\.id), "ids and order unchanged")
        for (old, new) in zip(before, after) where old.id != running.id {
            #expect(new == old, "\(old.name ?? old.id.description)")
        }
        let interrupted = try #require(second.engine.task(running.id))
        #expect(interrupted.state == .pending && interrupted.attempt == 2 && interrupted.error?.code == "interrupted")
        #expect(second.engine.workflow(workflow.id)?.keys.map(\.key) == ["x", "y"])
        #expect(second.engine.queues["slow"]?.paused == true)

        // What the restart changed was written too: a second restart finds the same.
        let settled = second.everything()
        let third = try second.restart()
        #expect(third.everything() == settled)
        // And it all runs to the end.
        try third.engine.updateQueue("slow", paused: false)
        third.clock.advance(by: 60_000)
        try third.flush()
        #expect(third.engine.task(running.id)?.state == .succeeded)
        #expect(third.engine.task(waiting.id)?.state == .succeeded)
        #expect(third.engine.workflow(workflow.id)?.state == .succeeded)
        #expect(third.engine.task(flaky.id)?.state == .failed)
    }

    /// Retention deletes rows as it evicts tasks, so the table holds what memory holds.
    @Test func evictedTasksLeaveTheDatabase() throws {
        let durable = try Durable { $0.maxRetainedTasks = 10 }
        defer { try? FileManager.default.removeItem(atPath: durable.path) }
        for index in 0..<100 {
            _ = try durable.engine.submit(TaskSpec(kind: "noop", name: "t\(index)"))
            if index % 7 == 0 { try durable.flush() }
        }
        try durable.flush()
        #expect(durable.engine.taskCount == 10)
        #expect(try durable.rows() == 10)
        let restarted = try durable.restart { $0.maxRetainedTasks = 10 }
        #expect(restarted.everything().map(\.name) == (90..<100).map { "t\($0)" })
    }

    /// The unique key of a task retention forgot is written with the eviction, deleted when
    /// another task claims the key, and read back after a restart.
    @Test func uniqueKeysOfForgottenTasksSurviveARestart() throws {
        let durable = try Durable { $0.retentionMilliseconds = 10 }
        defer { try? FileManager.default.removeItem(atPath: durable.path) }
        let gone = try durable.engine.submit(TaskSpec(kind: "noop", uniqueKey: "a"))
        try durable.engine.submit(TaskSpec(kind: "noop", uniqueKey: "b"))
        durable.clock.advance(by: 20)
        try durable.flush()
        #expect(try durable.rows() == 0 && durable.rows(of: "unique_keys") == 2)
        let holder = try durable.engine.submit(TaskSpec(kind: "external", uniqueKey: "b"))
        try durable.flush()
        #expect(try durable.rows(of: "unique_keys") == 1)
        let restarted = try durable.restart { $0.retentionMilliseconds = 10 }
        #expect(restarted.engine.uniqueKeyHolder(queue: "default", key: "a") == gone.id)
        #expect(restarted.engine.uniqueKeyHolder(queue: "default", key: "b") == holder.id)
    }

    /// Webhooks and deliveries come back as written; deleting a webhook takes its deliveries.
    @Test func webhooksAndDeliveriesSurviveARestart() throws {
        let durable = try Durable()
        defer { try? FileManager.default.removeItem(atPath: durable.path) }
        let kept = WebhookRecord(id: "wh_a", url: "https://example.com/a", events: ["task.state", "task.created"], queue: "q",
                                 workflow: nil, enabled: false, createdAt: 5, secret: "whsec_AAAA")
        let dropped = WebhookRecord(id: "wh_b", url: "https://example.com/b", events: ["queue.updated"], queue: nil,
                                    workflow: "W", enabled: true, createdAt: 6, secret: "whsec_BBBB")
        let pending = DeliveryRecord(id: "msg_1", webhook: "wh_a", eventSeq: 7, type: "task.state", body: Array("{}".utf8),
                                     attempt: 2, statusCode: 500, error: nil, durationMilliseconds: 12, attemptedAt: 100,
                                     nextAttemptAt: 200, earlierAttempts: [DeliveryAttempt(
                                         number: 1, statusCode: nil, error: "timeout: no answer", durationMilliseconds: 15_000,
                                         attemptedAt: 50, nextAttemptAt: 100)])
        let finished = DeliveryRecord(id: "msg_2", webhook: "wh_a", eventSeq: 3, type: "task.created", body: [], attempt: 1,
                                      state: .delivered, statusCode: 204)
        let pushedOut = DeliveryRecord(id: "msg_3", webhook: "wh_a", eventSeq: 1, type: "task.created", body: [], state: .failed,
                                       error: "backlog_full")
        let ofDropped = DeliveryRecord(id: "msg_4", webhook: "wh_b", eventSeq: 2, type: "queue.updated", body: [1])
        var first = StoreBatch()
        first.webhooks = [kept, dropped]
        first.deliveries = [pending, finished, pushedOut, ofDropped]
        var second = StoreBatch()
        second.deletedWebhooks = ["wh_b"]
        second.deletedDeliveries = ["msg_3"]
        for batch in [first, second] {
            durable.store!.write(batch) { result in #expect((try? result.get()) != nil) }
        }
        let restarted = try durable.restart()
        let database = try SQLiteDatabase(path: durable.path + "/taskloop.db", mode: .readOnly)
        #expect(try database.integer("SELECT count(*) FROM webhook_deliveries") == 2)
        restarted.store?.close()
        restarted.store = nil
        let loaded = try SQLiteTaskStore(dataDirectory: durable.path, syncLevel: .normal) { $0() }
        defer { loaded.close() }
        let state = loaded.takeLoaded()
        #expect(state.webhooks == [kept])
        #expect(state.deliveries == [finished, pending], "in event order")
    }

    /// A version 4 file kept only a delivery's last attempt: it opens with none before it, and
    /// keeps the attempts written from then on.
    @Test func aVersionFourFileKeepsItsDeliveriesAndThenEveryAttempt() throws {
        let path = DataDirectoryTests.temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: path) }
        do {
            let directory = try DataDirectory(path: path)
            let database = try SQLiteDatabase(path: directory.databasePath)
            try StoreSchema.prepare(database, upTo: 4)
            try database.execute("""
                INSERT INTO webhooks VALUES ('wh_a', 'https://example.com/a', 'task.state', NULL, NULL, 1, 5, 'whsec_AAAA');
                INSERT INTO webhook_deliveries VALUES ('msg_1', 'wh_a', 7, 'task.state', X'7B7D', 1, 'pending', 500, NULL, 12, 100,
                    200);
                """)
        }
        var delivery = DeliveryRecord(id: "msg_1", webhook: "wh_a", eventSeq: 7, type: "task.state", body: Array("{}".utf8),
                                      attempt: 1, statusCode: 500, durationMilliseconds: 12, attemptedAt: 100, nextAttemptAt: 200)
        let store = try SQLiteTaskStore(dataDirectory: path, syncLevel: .normal) { $0() }
        #expect(store.takeLoaded().deliveries == [delivery])
        delivery.earlierAttempts = [delivery.lastAttempt!]
        delivery.attempt = 2
        delivery.statusCode = 200
        delivery.state = .delivered
        var batch = StoreBatch()
        batch.deliveries = [delivery]
        let written = Locked(false)
        store.write(batch) { result in
            #expect((try? result.get()) != nil)
            written.withLock { $0 = true }
        }
        try pollUntil("the write") { written.value }
        store.close()
        let reopened = try SQLiteTaskStore(dataDirectory: path, syncLevel: .normal) { $0() }
        defer { reopened.close() }
        #expect(reopened.takeLoaded().deliveries == [delivery])
        let database = try SQLiteDatabase(path: path + "/taskloop.db", mode: .readOnly)
        #expect(try database.integer("PRAGMA user_version") == Int64(StoreSchema.version))
    }

    @Test func aRowThisServerCannotReadStopsTheOpen() throws {
        let durable = try Durable()
        defer { try? FileManager.default.removeItem(atPath: durable.path) }
        _ = try durable.engine.submit(TaskSpec(kind: "noop"))
        try durable.flush()
        durable.store?.close()
        durable.store = nil
        do {
            let database = try SQLiteDatabase(path: durable.path + "/taskloop.db")
            try database.execute("UPDATE tasks SET record = '{\"id\": 42}'")
        }
        do {
            _ = try SQLiteTaskStore(dataDirectory: durable.path, syncLevel: .normal) { $0() }
            Issue.record("a damaged row was accepted")
        } catch {
            guard case .damaged = error else { throw error }
        }
    }
}

@Suite struct StoreBatchTests {
    /// A batch that failed is merged into the next: what the later batch writes or deletes wins.
    @Test func laterWritesAndDeletionsWin() {
        var earlier = StoreBatch()
        earlier.queues = [QueueSnapshot(name: "a", maxConcurrency: 1, paused: false), QueueSnapshot(name: "b", maxConcurrency: 1, paused: false)]
        earlier.forgottenQueues = ["c"]
        earlier.idempotencyKeys = [IdempotencyRecord(key: "k", requestHash: [1], status: 201, resource: "/tasks/x", expiresAt: 1)]
        let tombstone = UniqueKeyTombstone(queue: "q", key: "u", id: TaskID(high: 1, low: 1), finishedAt: 1)
        earlier.uniqueKeys = [tombstone]
        earlier.droppedUniqueKeys = [UniqueKeyName(queue: "q", key: "v")]
        var later = StoreBatch()
        later.queues = [QueueSnapshot(name: "b", maxConcurrency: 9, paused: true)]
        later.forgottenQueues = ["a"]
        later.expiredIdempotencyKeys = ["k"]
        later.droppedUniqueKeys = [tombstone.name]
        let merged = earlier.merged(with: later)
        #expect(merged.queues == [QueueSnapshot(name: "b", maxConcurrency: 9, paused: true)])
        #expect(merged.forgottenQueues == ["c", "a"])
        #expect(merged.idempotencyKeys.isEmpty && merged.expiredIdempotencyKeys == ["k"])
        #expect(merged.uniqueKeys.isEmpty && merged.droppedUniqueKeys == [UniqueKeyName(queue: "q", key: "v"), tombstone.name])
        #expect(StoreBatch().merged(with: StoreBatch()).isEmpty)
    }

    /// A webhook deleted later takes the earlier batch's writes of its deliveries with it.
    @Test func aDeletedWebhookDropsItsEarlierDeliveries() {
        var earlier = StoreBatch()
        earlier.deliveries = [DeliveryRecord(id: "msg_1", webhook: "wh_a", eventSeq: 1, type: "task.state", body: []),
                              DeliveryRecord(id: "msg_2", webhook: "wh_b", eventSeq: 1, type: "task.state", body: [])]
        var later = StoreBatch()
        later.deletedWebhooks = ["wh_a"]
        let merged = earlier.merged(with: later)
        #expect(merged.deliveries.map(\.id) == ["msg_2"])
        #expect(merged.deletedWebhooks == ["wh_a"] && merged.hasWebhookChanges)
    }
}

/// Schedules through a real SQLite store: a fired slot's run and `lastSlot` in one batch, and
/// what a restart reads back.
@Suite struct ScheduleStoreTests {
    typealias Durable = TaskStoreTests.Durable

    /// Its zone is loaded first, as the service loads it before the engine sees the schedule.
    static func nightly(_ template: ScheduleTemplate, catchup: ScheduleCatchup = .latest) throws -> ScheduleSpec {
        _ = try TimeZoneCatalog.system.load(named: "Europe/Berlin")
        return ScheduleSpec(name: "nightly", cron: "*/10 * * * * *", timezone: "Europe/Berlin", template: template, overlap: .allow,
                     catchup: catchup, maxCatchup: 3, jitterMilliseconds: 0)
    }

    /// A fired slot's run and the schedule's `lastSlot` are one batch (one transaction); the
    /// schedule, its runs and the run's task come back after a restart, and the slot that fired
    /// does not fire again.
    @Test func aScheduleAndItsLastSlotSurviveARestart() throws {
        let durable = try Durable(wallClock: 1_795_000_000_000)
        defer { try? FileManager.default.removeItem(atPath: durable.path) }
        let template = TaskSpec(kind: "sleep", params: ["duration_ms": 1], name: "tick", queue: "ticks", priority: 3, timeoutMilliseconds: 5_000,
                                retry: RetryPolicy(maxAttempts: 2, backoffMilliseconds: 10, backoffFactor: 1.5),
                                metadata: ["team": "a"], runAt: .after(0), expiry: .after(60_000), uniqueKey: "tick",
                                uniqueForMilliseconds: 1)
        let schedule = try durable.engine.createSchedule(Self.nightly(.task(template)))
        try durable.flush()
        #expect(try durable.rows(of: "schedules") == 1)
        durable.clock.advance(by: 10_000)
        let batch = durable.builder.take(from: durable.engine)
        let mark = try #require(batch.tasks.compactMap { $0.schedule }.first)
        #expect(mark.id == schedule.id && batch.schedules.map { $0.lastSlot } == [mark.slot])
        try durable.commit(batch)
        let saved = durable.engine.snapshot(of: schedule)
        let restarted = try durable.restart(later: 10)
        let restored = try #require(restarted.engine.schedule(schedule.id))
        #expect(restarted.engine.snapshot(of: restored) == saved)
        let run = try #require(restarted.engine.task(saved.lastRuns[0].target.id!))
        #expect(run.schedule == mark && run.uniqueKey == "tick")
        #expect(restored.firedCount == 1 && restored.missedCount == 0)
        try restarted.engine.deleteSchedule(schedule.id)
        try restarted.flush()
        #expect(try restarted.rows(of: "schedules") == 0)
    }

    /// Down for a minute: the slots passed meanwhile follow `catchup` once the store is read back.
    @Test func slotsPassedWhileDownAreCaughtUpFromTheStore() throws {
        let durable = try Durable(wallClock: 1_795_000_000_000)
        defer { try? FileManager.default.removeItem(atPath: durable.path) }
        let schedule = try durable.engine.createSchedule(Self.nightly(.task(TaskSpec(kind: "noop")), catchup: .all))
        try durable.flush()
        let restarted = try durable.restart(later: 60_000)
        let restored = try #require(restarted.engine.schedule(schedule.id))
        #expect(restored.firedCount == 3 && restored.missedCount == 3)
        let restartedAgain = try restarted.restart(later: 0)
        #expect(try #require(restartedAgain.engine.schedule(schedule.id)).firedCount == 3)
    }

    @Test func aScheduleRecordReadsBackAsWritten() throws {
        let workflow = ScheduleTemplate.workflow(name: "pipeline", tasks: [
            .init(key: "extract", spec: TaskSpec(kind: "noop", queue: "etl")),
            .init(key: "load", spec: TaskSpec(kind: "sleep", params: ["duration_ms": 5], dependencies: [.sibling(key: "extract")],
                                              onDependencyFailure: .run)),
        ])
        var spec = try Self.nightly(workflow)
        spec.paused = true
        spec.startAt = 1_000
        spec.endAt = 2_000_000_000_000
        let id = TaskID(high: 0x0123_4567_89AB_CDEF, low: 42)
        let snapshot = ScheduleSnapshot(
            id: id, spec: spec, createdAt: 5, updatedAt: 6, lastSlot: 7_000,
            lastRuns: [ScheduleRun(slot: 7_000, at: 7_001, target: .workflow(id), endedAs: .succeeded),
                       ScheduleRun(slot: 8_000, at: 8_000, target: .none, error: "refused"),
                       ScheduleRun(slot: 9_000, at: 9_000, target: .task(id))],
            firedCount: 2, skippedCount: 1, missedCount: 4, currentRun: .task(id))
        #expect(try ScheduleRecordCodec.decode(ScheduleRecordCodec.encode(snapshot)) == snapshot)
        #expect(throws: RecordDecodingError.self) { try ScheduleRecordCodec.decode(Array("{}".utf8)) }
    }
}

extension TaskStoreTests.Durable {
    /// Writes `batch` as one transaction and waits for the commit.
    func commit(_ batch: StoreBatch) throws {
        pending.withLock { $0 += 1 }
        store!.write(batch) { [pending, failures] result in
            if case .failure(let error) = result { failures.withLock { $0.append(error) } }
            pending.withLock { $0 -= 1 }
        }
        try pollUntil("the batch to commit") { pending.value == 0 }
        #expect(failures.value.isEmpty, "\(failures.value)")
    }
}
