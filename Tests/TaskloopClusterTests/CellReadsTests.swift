import Foundation
import Testing
import TaskloopEngine
import TaskloopJSON
import TaskloopPostgres
import TaskloopStore
import TaskloopTestSupport
@testable import TaskloopCluster

/// Pages of tasks read across cells, against the engine's listing over the same tasks.
@Suite struct CellReadsTests {
    /// What `Engine.listTasks` gives with `TaskloopAPI.listTasks`'s filter: newest first below
    /// the cursor, at most `limit`, and the cursor of the next page while any match is left.
    static func enginePage(_ tasks: [TaskSnapshot], _ filter: CellReads.TaskFilter, before: TaskID?, limit: Int)
        -> (ids: [TaskID], next: TaskID?) {
        let matching = tasks.sorted { $0.id > $1.id }.filter { task in
            before.map { task.id < $0 } ?? true
                && (filter.state == nil || task.state == filter.state) && (filter.queue == nil || task.queue == filter.queue)
                && (filter.workflow == nil || task.workflow == filter.workflow) && (filter.kind == nil || task.kind == filter.kind)
                && (filter.dependsOn == nil || task.dependencies.contains(filter.dependsOn!))
                && (filter.nameContains == nil || task.name?.lowercased().contains(filter.nameContains!.lowercased()) == true)
        }
        let page = matching.prefix(limit).map(\.id)
        return (page, matching.count > limit ? page.last : nil)
    }

    /// Five cells make tasks in the same milliseconds, so their ids interleave: every filter
    /// and page size pages through the same ids, in the same order, with the same cursors, as
    /// the engine's listing of the same tasks.
    @Test func pagesAcrossCellsAreTheEnginesListing() throws {
        let cluster = try CellKeeperTests.Cluster()
        try cluster.start("a")
        let connection = try cluster.connection()
        var random = SplitMix64(seed: 25)
        var generators = (0..<5).map { TaskIDGenerator(random: SplitMix64(seed: UInt64($0) + 1), cell: UInt16($0)) }
        let workflows = [TaskID(high: 1 << 20, low: 1), TaskID(high: 1 << 20, low: 2)]
        let names: [(Int) -> String?] = [{ "Alpha \($0)" }, { _ in "beta" }, { _ in nil }, { "ÜBER \($0)" }, { "straße-\($0)" }]
        var tasks: [TaskSnapshot] = []
        for number in 0..<400 {
            let cell = Int(random.next() % 5)
            let id = generators[cell].next(wallClockMilliseconds: 1_700_000_000_000 + Int64(number / 20))
            let earlier = tasks.isEmpty ? [] : (0..<Int(random.next() % 3)).map { _ in tasks[Int(random.next() % UInt64(tasks.count))].id }
            tasks.append(TaskSnapshot(
                id: id, sequence: UInt64(number + 1), kind: ["noop", "external", "http"][Int(random.next() % 3)], params: .object([:]),
                name: names[Int(random.next() % 5)](number), queue: "q\(cell)\(["a", "b"][Int(random.next() % 2)])", priority: 0,
                dependencies: Array(Set(earlier)), onDependencyFailure: .cancel, timeoutMilliseconds: nil, retry: RetryPolicy(),
                metadata: nil, workflow: random.next() % 4 == 0 ? workflows[Int(random.next() % 2)] : nil, createdAt: 1,
                state: TaskState.allCases[Int(random.next() % 6)], cancelRequested: false, attempt: 1, startedAt: nil,
                finishedAt: nil, result: nil, error: nil, progress: TaskProgress(), notBefore: nil))
        }
        #expect(Set(tasks.map(\.id)).count == tasks.count)
        for cell in 0..<5 {
            var batch = StoreBatch()
            batch.tasks = tasks.filter { $0.id.cell == cell }
            #expect(try cluster.execute(connection, CellSchema.writes(of: batch, cell: UInt16(cell))) == nil)
        }

        func page(_ filter: CellReads.TaskFilter, before: TaskID?, limit: Int) throws -> (ids: [TaskID], next: TaskID?) {
            let read = Locked<Result<(ids: [TaskID], next: TaskID?), Error>?>(nil)
            cluster.thread.run {
                cluster.connections[connection].execute([CellReads.tasks(filter, before: before, limit: limit)]) { result in
                    read.withLock { $0 = Result { try CellReads.page(result.get()[0], limit: limit) }.map { ($0.tasks.map(\.id), $0.next) } }
                }
            }
            try pollUntil("the page") { read.value != nil }
            return try read.value!.get()
        }

        func pick<T>(_ values: [T]) -> T? { random.next() % 3 == 0 ? values[Int(random.next() % UInt64(values.count))] : nil }
        var pages = 0, found = 0
        for _ in 0..<60 {
            let filter = CellReads.TaskFilter(
                state: pick(TaskState.allCases), queue: pick(["q0a", "q1b", "q4a", "none"]), workflow: pick(workflows),
                kind: pick(["noop", "http", "exec"]), nameContains: pick(["alpha", "BETA", "über", "ß", "1", "x"]),
                dependsOn: pick(tasks.map(\.id)))
            let limit = [2, 5, 50, 1_000][Int(random.next() % 4)]
            var cursor: TaskID?
            repeat {
                let expected = Self.enginePage(tasks, filter, before: cursor, limit: limit)
                let answer = try page(filter, before: cursor, limit: limit)
                #expect(answer.ids == expected.ids && answer.next == expected.next, "\(filter) after \(String(describing: cursor)) limit \(limit)")
                found += answer.ids.count
                pages += 1
                cursor = answer.next
            } while cursor != nil && pages < 5_000
        }
        #expect(found > 500, "the filters matched \(found) tasks over \(pages) pages")
        try cluster.finish()
    }
}
