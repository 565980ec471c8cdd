import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Dependencies across cells, message by message (the random comparison with one engine is
/// CellPropertyTests): queue `a` is cell 1's, `b` cell 2's.
@Suite struct CellMessageTests {
    final class Cells {
        let clock = VirtualScheduler()
        let manual = ManualExecutor()
        var engines: [UInt16: Engine] = [:]
        /// Every settled batch, by cell.
        var batches: [UInt16: [[EngineEvent]]] = [:]

        init(restoring saved: [UInt16: [TaskSnapshot]] = [:]) throws {
            for cell: UInt16 in [1, 2] {
                var configuration = EngineConfiguration()
                configuration.cells = CellPlacement(cell: cell, cellOfQueue: { $0 == "a" ? 1 : 2 })
                let engine = Engine(configuration: configuration, scheduler: clock, extraExecutors: ["manual": manual])
                engine.addObserver { [unowned self] settled in batches[cell, default: []].append(settled) }
                if let tasks = saved[cell] { try engine.restore(queues: [], workflows: [], tasks: tasks) }
                engines[cell] = engine
            }
        }

        /// Messages cell `from` sent, oldest first, and forgets them.
        func sent(by from: UInt16) -> [CellMessage] {
            defer { batches[from] = [] }
            return (batches[from] ?? []).flatMap { $0 }.compactMap { event in
                if case .messageSent(let message) = event { message } else { nil }
            }
        }

        /// Applies what `from` sent; returns it.
        @discardableResult
        func deliver(from: UInt16) -> [CellMessage] {
            let messages = sent(by: from)
            for message in messages { engines[message.to]!.apply(message) }
            return messages
        }

        func submit(_ name: String, _ kind: String = "manual", queue: String, after dependencies: [TaskID] = [],
                    policy: DependencyFailurePolicy = .cancel) throws -> TaskRecord {
            try engines[queue == "a" ? 1 : 2]!.submit(TaskSpec(
                kind: kind, name: name, queue: queue, dependencies: dependencies.map { .task($0) }, onDependencyFailure: policy))
        }

        func run(of record: TaskRecord) -> TaskRun? { manual.runs.last { $0.taskID == record.id && $0.isCurrent } }
    }

    @Test func messagesKeepOneBinaryForm() throws {
        let dependency = TaskID(high: 0x0123_4567_89AB_CDEF, low: 0xFEDC_BA98_7654_3210)
        let messages = [
            CellMessage(.watch, from: 2, to: 1, dependency: dependency),
            CellMessage(.ended, from: 1, to: 2, dependency: dependency, epoch: 3, state: .failed),
            CellMessage(.ended, from: 1, to: 2, dependency: dependency, epoch: 0, state: .succeeded),
            CellMessage(.ended, from: 65535, to: 0, dependency: dependency, epoch: .max, state: .cancelled),
            CellMessage(.reopened, from: 1, to: 2, dependency: dependency, epoch: 4),
            CellMessage(.missing, from: 1, to: 2, dependency: dependency),
        ]
        for message in messages {
            #expect(message.encoded.count == CellMessage.encodedSize)
            #expect(CellMessage(encoded: message.encoded) == message)
        }
        // Pinned: a store keeps these bytes across versions of the server.
        let pinned: [UInt8] = [1, 2, 0, 1, 0, 2, 0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF,
                               0xFE, 0xDC, 0xBA, 0x98, 0x76, 0x54, 0x32, 0x10, 0, 0, 0, 3, 2]
        #expect(messages[1].encoded == pinned)
        var wrong = messages[1].encoded
        wrong[0] = 2
        #expect(CellMessage(encoded: wrong) == nil)
        #expect(CellMessage(encoded: messages[1].encoded.dropLast()) == nil)
        wrong = messages[1].encoded
        wrong[26] = 0
        #expect(CellMessage(encoded: wrong) == nil)
        wrong[26] = 9
        #expect(CellMessage(encoded: wrong) == nil)
    }

    @Test func aDependencyInAnotherCellReleasesItsDependentWhenItEnds() throws {
        let cells = try Cells()
        let dependency = try cells.submit("d", queue: "a")
        let dependent = try cells.submit("x", queue: "b", after: [dependency.id])
        #expect(dependency.id.cell == 1 && dependent.id.cell == 2)
        #expect(dependent.state == .pending)
        // The watch leaves in the batch that created the dependent.
        let batch = try #require(cells.batches[2]?.last)
        #expect(batch.contains { if case .submitted(let record) = $0 { record === dependent } else { false } })
        #expect(batch.contains { if case .messageSent(let message) = $0 { message.kind == .watch } else { false } })
        #expect(cells.engines[2]!.task(dependency.id) == nil)
        #expect(cells.engines[2]!.unfinishedCount == 1)

        #expect(cells.deliver(from: 2).map(\.kind) == [.watch])
        #expect(cells.engines[1]!.watchers(of: dependency) == [2])
        #expect(cells.engines[1]!.snapshot(of: dependency).watchers == [2])
        #expect(cells.sent(by: 1).isEmpty)

        cells.run(of: dependency)?.succeed()
        // The end leaves in the batch of the dependency's own end.
        let ending = try #require(cells.batches[1]?.last)
        #expect(ending.contains { if case .stateChanged(let record, _, .succeeded) = $0 { record === dependency } else { false } })
        #expect(cells.deliver(from: 1) == [CellMessage(.ended, from: 1, to: 2, dependency: dependency.id, state: .succeeded)])
        #expect(dependent.state == .running)
    }

    @Test func aFailedDependencyElsewhereCancelsAndItsRetryBringsTheDependentsBack() throws {
        let cells = try Cells()
        let dependency = try cells.submit("d", queue: "a")
        let dependent = try cells.submit("x", queue: "b", after: [dependency.id])
        let next = try cells.submit("y", queue: "b", after: [dependent.id])
        cells.deliver(from: 2)
        cells.run(of: dependency)?.fail(TaskError(code: "boom", message: "failed"))
        cells.deliver(from: 1)
        #expect(dependent.state == .cancelled && dependent.error?.code == "dependency_failed")
        #expect(next.state == .cancelled)
        // The stand-in knows the end: a later dependent that runs whatever happens runs at once.
        let late = try cells.submit("z", queue: "b", after: [dependency.id], policy: .run)
        #expect(late.state == .running)

        try cells.engines[1]!.retryTask(dependency.id)
        #expect(cells.deliver(from: 1).map(\.kind) == [.reopened])
        #expect(dependent.state == .pending && next.state == .pending)
        #expect(dependent.error == nil && dependent.attempt == 1)
        #expect(late.state == .running && late.releasedBy == [dependency.id])
        #expect(dependency.reopenings == 1)
        cells.run(of: dependency)?.succeed()
        #expect(cells.deliver(from: 1).map(\.kind) == [.ended])
        #expect(dependent.state == .running && next.state == .pending)
    }

    @Test func anEndOlderThanAReopeningIsIgnored() throws {
        let cells = try Cells()
        let remote = TaskID(high: 1 << 20 | 1, low: 42)
        let dependent = try cells.submit("x", queue: "b", after: [remote])
        let engine = cells.engines[2]!
        engine.apply(CellMessage(.reopened, from: 1, to: 2, dependency: remote, epoch: 2))
        engine.apply(CellMessage(.ended, from: 1, to: 2, dependency: remote, epoch: 1, state: .failed))
        #expect(dependent.state == .pending)
        engine.apply(CellMessage(.ended, from: 1, to: 2, dependency: remote, epoch: 2, state: .succeeded))
        #expect(dependent.state == .running)
        // A second copy of the same end changes nothing.
        engine.apply(CellMessage(.ended, from: 1, to: 2, dependency: remote, epoch: 2, state: .failed))
        #expect(dependent.state == .running)
    }

    @Test func anUnknownDependencyElsewhereCancelsItsDependent() throws {
        let cells = try Cells()
        let made = try cells.submit("d", queue: "a")
        let unknown = TaskID(high: made.id.high, low: made.id.low &+ 1)
        let dependent = try cells.submit("x", queue: "b", after: [unknown], policy: .run)
        cells.deliver(from: 2)
        #expect(cells.deliver(from: 1).map(\.kind) == [.missing])
        #expect(dependent.state == .cancelled)
        #expect(dependent.error?.code == "unknown_dependency")
    }

    @Test func anEngineRefusesQueuesOfOtherCellsAndRepeatedRemoteDependencies() throws {
        let cells = try Cells()
        #expect(throws: EngineError.self) { try cells.engines[1]!.submit(TaskSpec(kind: "noop", queue: "b")) }
        #expect(cells.engines[1]!.queues["default"] == nil && cells.engines[2]!.queues["default"] != nil)
        let dependency = try cells.submit("d", queue: "a")
        do {
            _ = try cells.submit("x", queue: "b", after: [dependency.id, dependency.id])
            Issue.record("a repeated dependency was accepted")
        } catch let error as EngineError {
            #expect(error.code == .duplicateDependency)
        }
        #expect(cells.sent(by: 2).isEmpty)
    }

    @Test func watchersAndWaitsSurviveRestarts() throws {
        let before = try Cells()
        try before.engines[1]!.updateQueue("a", paused: true)
        let dependency = try before.submit("d", queue: "a")
        let dependent = try before.submit("x", queue: "b", after: [dependency.id])
        before.deliver(from: 2)
        let saved: [UInt16: [TaskSnapshot]] = [
            1: [before.engines[1]!.snapshot(of: dependency)], 2: [before.engines[2]!.snapshot(of: dependent)],
        ]

        let after = try Cells(restoring: saved)
        let restored = try #require(after.engines[1]!.task(dependency.id))
        #expect(after.engines[1]!.watchers(of: restored) == [2])
        #expect(restored.state == .running)
        // The dependent's cell asks again, and waits.
        #expect(after.deliver(from: 2).map(\.kind) == [.watch])
        #expect(after.sent(by: 1).isEmpty)
        let waiting = try #require(after.engines[2]!.task(dependent.id))
        #expect(waiting.state == .pending)
        after.run(of: restored)?.succeed()
        #expect(after.deliver(from: 1).map(\.kind) == [.ended])
        #expect(waiting.state == .running)
    }

    @Test func aDependentReleasedBeforeARestartDoesNotWaitAgain() throws {
        let before = try Cells()
        try before.engines[2]!.updateQueue("b", paused: true)
        let dependency = try before.submit("d", queue: "a")
        let local = try before.submit("l", queue: "b")
        let dependent = try before.submit("x", queue: "b", after: [dependency.id, local.id], policy: .run)
        before.deliver(from: 2)
        before.run(of: dependency)?.fail(TaskError(code: "boom", message: "failed"))
        before.deliver(from: 1)
        #expect(dependent.state == .pending && dependent.releasedBy == [dependency.id])
        // Brought back in its cell; the news has not reached the dependent's cell at the restart.
        try before.engines[1]!.retryTask(dependency.id)
        let reopening = before.sent(by: 1)
        #expect(reopening.map(\.kind) == [.reopened])
        let saved: [UInt16: [TaskSnapshot]] = [
            1: [before.engines[1]!.snapshot(of: dependency)],
            2: [before.engines[2]!.snapshot(of: local), before.engines[2]!.snapshot(of: dependent)],
        ]

        let after = try Cells(restoring: saved)
        for message in reopening { after.engines[2]!.apply(message) }
        let restored = try #require(after.engines[2]!.task(dependent.id))
        #expect(restored.state == .pending)
        // The running dependency released it once; only the local one holds it now.
        after.run(of: try #require(after.engines[2]!.task(local.id)))?.succeed()
        #expect(restored.state == .running)
    }
}
