import Foundation
import Testing
import TaskloopEngine
import TaskloopJSON
import TaskloopPostgres
import TaskloopStore
import TaskloopTestSupport
@testable import TaskloopCluster

/// A cell's records in the shared database: written by its owner's commits (fenced by the
/// epoch), read back whole by whoever owns the cell next, and only that cell's.
@Suite struct CellSchemaTests {
    static func task(_ number: UInt64, cell: UInt16, queue: String, state: TaskState = .queued) -> TaskSnapshot {
        var ids = TaskIDGenerator(random: SplitMix64(seed: number), cell: cell)
        return TaskSnapshot(id: ids.next(wallClockMilliseconds: 1_700_000_000_000 + Int64(number)), sequence: number, kind: "noop",
                            params: .object([:]), name: "t\(number)", queue: queue, priority: 0, dependencies: [],
                            onDependencyFailure: .cancel, timeoutMilliseconds: nil, retry: RetryPolicy(), metadata: nil,
                            workflow: nil, createdAt: 1_700_000_000_000, state: state, cancelRequested: false, attempt: 1,
                            startedAt: nil, finishedAt: nil, result: nil, error: nil, progress: TaskProgress(), notBefore: nil)
    }

    @Test func aCellsRecordsGoBackToItsNextOwnerWhole() throws {
        let cluster = try CellKeeperTests.Cluster()
        let epochs = try cluster.startOwningEverything()
        let a = ReplicaIdentity(name: "a", incarnation: "a")
        let writer = try cluster.connection(), reader = try cluster.connection()
        func commit(_ batch: StoreBatch, cell: UInt16, epoch: UInt64? = nil) throws -> String? {
            try cluster.execute(writer, [PGQuery("BEGIN"), ClusterSchema.fenceCommit(Cell(cell), epoch: epoch ?? epochs[Cell(cell)]!, by: a, token: "t1")]
                                + CellSchema.writes(of: batch, cell: cell) + [PGQuery("COMMIT")])
        }
        func load(_ cell: UInt16) throws -> StoredState {
            let loaded = Locked<Result<StoredState, PGError>?>(nil)
            cluster.thread.run {
                cluster.connections[reader].execute(CellSchema.load(cell: cell)) { result in
                    loaded.withLock { $0 = result.flatMap { results in Result { try CellSchema.loaded(results) }.mapError { PGError(message: "\($0)") } } }
                }
            }
            try pollUntil("the load") { loaded.value != nil }
            return try loaded.value!.get()
        }

        var first = StoreBatch()
        first.tasks = (1...3).map { Self.task($0, cell: 7, queue: "mail") }
        first.queues = [QueueSnapshot(name: "mail", maxConcurrency: 4, paused: true)]
        first.idempotencyKeys = [IdempotencyRecord(key: "k1", requestHash: [1, 2, 3], status: 201, resource: "/tasks/x", expiresAt: 99)]
        let run = ScheduleRun(slot: 1_700_000_060_000, at: 1_700_000_060_004, target: .task(first.tasks[0].id))
        first.schedules = [1, 2].map { number in
            ScheduleSnapshot(id: Self.task(100 + number, cell: 7, queue: "mail").id,
                             spec: ScheduleSpec(name: "s\(number)", cron: "* * * * *", template: .task(TaskSpec(kind: "noop", queue: "mail"))),
                             createdAt: 1_700_000_000_000, updatedAt: 1_700_000_000_000, lastSlot: 1_700_000_060_000,
                             lastRuns: [run], firedCount: 1, currentRun: run.target)
        }
        #expect(try commit(first, cell: 7) == nil)
        var other = StoreBatch()
        other.tasks = [Self.task(1, cell: 8, queue: "video")]
        #expect(try commit(other, cell: 8) == nil)

        let loaded = try load(7)
        #expect(loaded.tasks == first.tasks)
        #expect(loaded.queues == first.queues)
        #expect(loaded.idempotencyKeys == first.idempotencyKeys)
        #expect(loaded.schedules.sorted { $0.id < $1.id } == first.schedules.sorted { $0.id < $1.id })
        #expect(try load(8).schedules.isEmpty)
        #expect(try load(8).tasks == other.tasks)

        var second = StoreBatch()
        second.tasks = [Self.task(2, cell: 7, queue: "mail", state: .succeeded)]
        second.evictedTasks = [first.tasks[0].storedKey]
        second.forgottenQueues = []
        second.expiredIdempotencyKeys = ["k1"]
        var fired = first.schedules[1]
        fired.lastSlot += 60_000
        second.schedules = [fired]
        second.deletedSchedules = [first.schedules[0].id]
        #expect(try commit(second, cell: 7) == nil)
        // A commit under a stale epoch changes nothing.
        var stale = StoreBatch()
        stale.evictedTasks = [first.tasks[2].storedKey]
        #expect(try commit(stale, cell: 7, epoch: epochs[Cell(7)]! - 1) == ClusterSchema.deposedState)
        #expect(try cluster.execute(writer, [PGQuery("ROLLBACK")]) == nil)

        let again = try load(7)
        #expect(again.tasks.map(\.name) == ["t2", "t3"])
        #expect(again.tasks.map(\.state) == [.succeeded, .queued])
        #expect(again.idempotencyKeys.isEmpty)
        #expect(again.schedules == [fired])
        try cluster.finish()
    }

    /// A commit of several cells writes all their tasks in the fewest statements of many rows
    /// (a statement costs the database more than its rows; prepared ones of 1, 2, 4 ... rows),
    /// and each cell's next owner still loads its own.
    @Test func theTasksOfSeveralCellsGoInFewStatements() throws {
        let cluster = try CellKeeperTests.Cluster()
        let epochs = try cluster.startOwningEverything()
        let a = ReplicaIdentity(name: "a", incarnation: "a")
        let writer = try cluster.connection(), reader = try cluster.connection()
        let batches = (3...5).map { cell in
            var batch = StoreBatch()
            batch.tasks = (1...2).map { Self.task(UInt64(cell * 10 + $0), cell: UInt16(cell), queue: "q\(cell)") }
            batch.queues = [QueueSnapshot(name: "q\(cell)", maxConcurrency: cell, paused: false)]
            return (batch: batch, cell: UInt16(cell))
        }
        let writes = CellSchema.writes(of: batches)
        let taskStatements = writes.filter { query in
            if case .prepared(let statement) = query.statement { return statement.sql.hasPrefix("INSERT INTO taskloop.cell_tasks") }
            return false
        }
        // Six tasks of three cells: four rows, then two.
        #expect(taskStatements.map { $0.parameters.count / 11 } == [4, 2])
        let fence = ClusterSchema.fenceCommit(batches.map { (Cell($0.cell), epochs[Cell($0.cell)]!) }, by: a, token: "t1")
        #expect(try cluster.execute(writer, [fence] + writes) == nil)
        for (batch, cell) in batches {
            let loaded = Locked<Result<StoredState, PGError>?>(nil)
            cluster.thread.run {
                cluster.connections[reader].execute(CellSchema.load(cell: cell)) { result in
                    loaded.withLock { $0 = result.flatMap { results in Result { try CellSchema.loaded(results) }.mapError { PGError(message: "\($0)") } } }
                }
            }
            try pollUntil("the load") { loaded.value != nil }
            let state = try loaded.value!.get()
            #expect(state.tasks == batch.tasks)
            #expect(state.queues == batch.queues)
        }
        try cluster.finish()
    }
}
