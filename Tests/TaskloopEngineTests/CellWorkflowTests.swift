import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Workflows across cells, message by message (the random comparison with one engine is
/// CellPropertyTests): queue `a` is cell 1's, `b` cell 2's, `c` cell 3's.
@Suite struct CellWorkflowTests {
    final class Cells {
        let clock = VirtualScheduler()
        let manual = ManualExecutor()
        var engines: [UInt16: Engine] = [:]
        /// Every settled batch not yet delivered, by cell.
        var batches: [UInt16: [[EngineEvent]]] = [:]
        /// Every event, by cell.
        var history: [UInt16: [EngineEvent]] = [:]
        var violations: [String] = []

        static func cell(ofQueue queue: String) -> UInt16 { ["a": 1, "b": 2, "c": 3][queue] ?? 1 }

        init(restoring saved: [UInt16: (workflows: [WorkflowSnapshot], tasks: [TaskSnapshot])] = [:]) throws {
            manual.confirmsCancel = true
            for cell: UInt16 in [1, 2, 3] {
                var configuration = EngineConfiguration()
                configuration.cells = CellPlacement(cell: cell, cellOfQueue: { Cells.cell(ofQueue: $0) })
                let engine = Engine(configuration: configuration, scheduler: clock, extraExecutors: ["manual": manual])
                engine.addObserver { [unowned self, unowned engine] settled in
                    batches[cell, default: []].append(settled)
                    history[cell, default: []] += settled
                    let records = settled.compactMap { event -> TaskRecord? in
                        switch event {
                        case .submitted(let record), .stateChanged(let record, _, _), .releasedByRetry(let record): record
                        default: nil
                        }
                    }
                    violations += engine.invariantViolations(of: records).map { "cell \(cell): \($0)" }
                }
                if let state = saved[cell] { try engine.restore(queues: [], workflows: state.workflows, tasks: state.tasks) }
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

        /// Delivers until no cell has anything to send, home's first each round.
        func deliverAll() {
            while true {
                let delivered = [1, 2, 3].flatMap { deliver(from: $0) }
                if delivered.isEmpty { return }
            }
        }

        /// What each cell holds, as a store keeps it.
        func saved() -> [UInt16: (workflows: [WorkflowSnapshot], tasks: [TaskSnapshot])] {
            engines.mapValues { engine in
                (engine.workflows.values.map { engine.snapshot(of: $0) }, engine.tasks.entries.compactMap { $0.map { engine.snapshot(of: $0) } })
            }
        }

        func task(_ id: TaskID) -> TaskRecord? { engines[id.cell]!.task(id) }

        func run(of id: TaskID) -> TaskRun? { manual.runs.last { $0.taskID == id && $0.isCurrent } }

        func submitWorkflow(_ members: [(key: String, queue: String, after: [String], policy: DependencyFailurePolicy)],
                            on home: UInt16 = 1) throws -> WorkflowRecord {
            try engines[home]!.submitWorkflow(name: "flow", tasks: members.map { member in
                (member.key, TaskSpec(kind: "manual", params: ["key": .string(member.key)], name: member.key, queue: member.queue,
                                      dependencies: member.after.map { .sibling(key: $0) }, onDependencyFailure: member.policy,
                                      metadata: ["owner": "tests"]))
            })
        }
    }

    static func id(of key: String, in workflow: WorkflowRecord) -> TaskID { workflow.keys.first { $0.key == key }!.id }

    /// The home cannot see another cell's unique keys: a member there whose key a task of its
    /// queue holds is made (the workflow was answered) and cancelled at once as `duplicate_task`,
    /// naming the holder, which keeps the key.
    @Test func aMemberInAnotherCellWhoseKeyIsHeldThereIsCancelledAsADuplicate() throws {
        let cells = try Cells()
        let holder = try cells.engines[2]!.submit(TaskSpec(kind: "manual", queue: "b", uniqueKey: "k"))
        let workflow = try cells.engines[1]!.submitWorkflow(name: "flow", tasks: [
            (key: "first", spec: TaskSpec(kind: "manual", queue: "a", uniqueKey: "k")),
            (key: "second", spec: TaskSpec(kind: "manual", queue: "b", dependencies: [.sibling(key: "first")], uniqueKey: "k")),
        ])
        cells.deliverAll()
        let second = try #require(cells.task(Self.id(of: "second", in: workflow)))
        #expect(second.state == .cancelled && second.error?.code == "duplicate_task")
        #expect(second.error?.details["existing_id"] == .string(holder.id.description))
        #expect(cells.engines[2]!.uniqueKeyHolder(queue: "b", key: "k") == holder.id)
        #expect(cells.engines[1]!.uniqueKeyHolder(queue: "a", key: "k") == Self.id(of: "first", in: workflow))
        #expect(cells.violations.isEmpty)
    }

    @Test func aWorkflowAcrossThreeCellsIsMadeInEachWithIdsOfItsCell() throws {
        let cells = try Cells()
        let workflow = try cells.submitWorkflow([
            ("first", "a", [], .cancel), ("second", "b", ["first"], .cancel), ("third", "c", ["second", "fourth"], .cancel),
            ("fourth", "b", [], .cancel),
        ])
        #expect(workflow.id.cell == 1)
        #expect(workflow.keys.map(\.key) == ["first", "second", "third", "fourth"])
        #expect(workflow.keys.map(\.id.cell) == [1, 2, 3, 2])
        #expect(Set(workflow.keys.map(\.id)).count == 4)
        #expect(workflow.tasks.map(\.id) == [Self.id(of: "first", in: workflow)])
        #expect(workflow.remoteMembers.map(\.id) == ["second", "third", "fourth"].map { Self.id(of: $0, in: workflow) })
        #expect(workflow.state == .running)
        // Cell 2 makes a task of its own a moment later: the members it is sent sort below it.
        cells.clock.advance(by: 1)
        let own = try cells.engines[2]!.submit(TaskSpec(kind: "noop", queue: "b"))
        #expect(own.id > Self.id(of: "fourth", in: workflow))

        let creation = cells.sent(by: 1)
        #expect(creation.map(\.kind) == [.members, .members])
        #expect(creation.map(\.to) == [2, 3])
        #expect(creation[0].members.map(\.id) == ["second", "fourth"].map { Self.id(of: $0, in: workflow) })
        for message in creation { cells.engines[message.to]!.apply(message) }

        for key in ["second", "third", "fourth"] {
            let member = try #require(cells.task(Self.id(of: key, in: workflow)))
            #expect(member.name == key && member.params == ["key": .string(key)] && member.metadata == ["owner": "tests"])
            #expect(member.workflow == nil, "a member cell holds no workflow record: its events are the home's")
            #expect(cells.engines[member.id.cell]!.snapshot(of: member).workflow == workflow.id)
        }
        let third = try #require(cells.task(Self.id(of: "third", in: workflow)))
        #expect(third.dependencies == ["second", "fourth"].map { Self.id(of: $0, in: workflow) })
        #expect(cells.engines[2]!.listTasks(before: nil, limit: 10) { _ in true }.tasks.map(\.id)
                == [own.id, Self.id(of: "fourth", in: workflow), Self.id(of: "second", in: workflow)])
        #expect(cells.engines[2]!.workflow(workflow.id) == nil && cells.engines[3]!.workflow(workflow.id) == nil)

        cells.deliverAll()
        for key in ["first", "second", "fourth", "third"] {
            #expect(workflow.state == .running)
            cells.run(of: Self.id(of: key, in: workflow))?.succeed()
            cells.deliverAll()
        }
        #expect(workflow.state == .succeeded && workflow.fraction == 1)
        #expect(workflow.remoteMembers.allSatisfy { $0.state == .succeeded })
        // Workflow events come from the home alone.
        for cell: UInt16 in [2, 3] {
            #expect(!(cells.history[cell] ?? []).contains { if case .workflowSubmitted = $0 { true } else { false } })
        }
        #expect(cells.violations.isEmpty, "\(cells.violations)")
    }

    @Test func aMemberFailingElsewhereFailsTheWorkflowAndCancelsItsDependentsInOtherCells() throws {
        let cells = try Cells()
        let workflow = try cells.submitWorkflow([
            ("first", "a", [], .cancel), ("middle", "b", ["first"], .cancel), ("last", "c", ["middle"], .cancel),
            ("anyway", "a", ["middle"], .run),
        ])
        cells.deliverAll()
        cells.run(of: Self.id(of: "first", in: workflow))?.succeed()
        cells.deliverAll()
        let middle = Self.id(of: "middle", in: workflow)
        _ = cells.run(of: middle)?.progress(fraction: 0.5)
        cells.deliverAll()
        #expect(workflow.remoteMembers.first { $0.id == middle }?.fraction == 0.5)
        #expect(workflow.fraction == (1 + 0.5) / 4)

        cells.run(of: middle)?.fail(TaskError(code: "boom", message: "failed"))
        cells.deliverAll()
        let last = try #require(cells.task(Self.id(of: "last", in: workflow)))
        #expect(last.state == .cancelled && last.error?.code == "dependency_failed")
        let anyway = try #require(cells.task(Self.id(of: "anyway", in: workflow)))
        #expect(anyway.state == .running)
        #expect(workflow.state == .running)
        cells.run(of: anyway.id)?.succeed()
        cells.deliverAll()
        #expect(workflow.state == .failed)
        #expect(workflow.remoteMembers.map(\.state) == [.failed, .cancelled])
        #expect(cells.violations.isEmpty, "\(cells.violations)")
    }

    @Test func cancellingAndRetryingAWorkflowReachEveryMemberCell() throws {
        let cells = try Cells()
        let workflow = try cells.submitWorkflow([
            ("first", "a", [], .cancel), ("second", "b", ["first"], .cancel), ("third", "c", [], .cancel),
        ])
        cells.deliverAll()
        #expect(try cells.engines[1]!.cancelWorkflow(workflow.id) == 3)
        let fanOut = cells.sent(by: 1)
        #expect(fanOut.filter { $0.kind == .cancelMembers }.map(\.to) == [2, 3])
        // The members' cells are told before the home's own member ends.
        #expect(fanOut.first?.kind == .cancelMembers)
        for message in fanOut { cells.engines[message.to]!.apply(message) }
        cells.deliverAll()
        for key in ["first", "second", "third"] {
            let member = try #require(cells.task(Self.id(of: key, in: workflow)))
            #expect(member.state == .cancelled && member.error?.code == "cancelled", "\(key)")
        }
        #expect(workflow.state == .cancelled)

        #expect(try cells.engines[1]!.retryWorkflow(workflow.id) == 3)
        let retries = cells.deliver(from: 1)
        #expect(retries.filter { $0.kind == .retryMembers }.map(\.to) == [2, 3])
        // First: a member cancelled by the home's is retried as a member, as on one engine.
        #expect(retries.first?.kind == .retryMembers)
        #expect(workflow.state == .running)
        cells.deliverAll()
        for key in ["first", "second", "third"] {
            let member = try #require(cells.task(Self.id(of: key, in: workflow)))
            #expect(!member.state.isTerminal && member.attempt == 2, "\(key)")
        }
        for key in ["first", "third", "second"] {
            cells.run(of: Self.id(of: key, in: workflow))?.succeed()
            cells.deliverAll()
        }
        #expect(workflow.state == .succeeded)
        // Nothing is left to bring back; no member cell is told anything but the retry.
        #expect(try cells.engines[1]!.retryWorkflow(workflow.id) == 0)
        #expect(cells.violations.isEmpty, "\(cells.violations)")
    }

    @Test func homeAndMemberCellsRestartedMidWayKeepTheWorkflowRight() throws {
        let before = try Cells()
        let workflow = try before.submitWorkflow([
            ("first", "a", [], .cancel), ("second", "b", ["first"], .cancel), ("third", "c", [], .cancel),
            ("fourth", "c", ["second"], .cancel),
        ])
        // Cell 3 has its members (its watch of the second waits behind cell 2's creation, still
        // in flight) and reports the third's end.
        let creation = before.sent(by: 1)
        for message in creation where message.to == 3 { before.engines[3]!.apply(message) }
        let watch = before.sent(by: 3)
        #expect(watch.map(\.kind) == [.watch])
        before.run(of: Self.id(of: "third", in: workflow))?.fail(TaskError(code: "boom", message: "failed"))
        let report = before.sent(by: 3)
        #expect(report.map(\.kind) == [.memberChanged])
        for message in report { before.engines[1]!.apply(message) }
        #expect(workflow.remoteMembers.map(\.state) == [.pending, .failed, .pending])
        // The first's end leaves for cell 2, which does not hold the second yet.
        before.run(of: Self.id(of: "first", in: workflow))?.succeed()
        let inFlight = creation.filter { $0.to == 2 } + watch + before.sent(by: 1)

        let after = try Cells(restoring: before.saved())
        let home = try #require(after.engines[1]!.workflow(workflow.id))
        #expect(home.keys.map(\.id) == workflow.keys.map(\.id))
        #expect(home.remoteMembers.map(\.state) == [.pending, .failed, .pending])
        #expect(home.state == .running)
        let third = try #require(after.task(Self.id(of: "third", in: workflow)))
        #expect(third.state == .failed)
        // What was in flight first (sent before anything the restarts send), then the rest.
        for message in inFlight { after.engines[message.to]!.apply(message) }
        after.deliverAll()
        let second = try #require(after.task(Self.id(of: "second", in: workflow)))
        #expect(second.state == .running)
        after.run(of: second.id)?.succeed()
        after.deliverAll()
        after.run(of: Self.id(of: "fourth", in: workflow))?.succeed()
        after.deliverAll()
        #expect(home.state == .failed)

        // Restarted again, the member cells still know their members: a retry reaches the third.
        let again = try Cells(restoring: after.saved())
        let restored = try #require(again.engines[1]!.workflow(workflow.id))
        #expect(restored.state == .failed)
        #expect(try again.engines[1]!.retryWorkflow(workflow.id) == 1)
        again.deliverAll()
        #expect(restored.state == .running)
        again.run(of: Self.id(of: "third", in: workflow))?.succeed()
        again.deliverAll()
        #expect(restored.state == .succeeded)
        #expect(before.violations.isEmpty && after.violations.isEmpty && again.violations.isEmpty,
                "\(before.violations + after.violations + again.violations)")
    }

    @Test func theHomeKeepsTheWorkflowUntilEveryMemberHasEndedAndItsOwnAreEvicted() throws {
        let cells = try Cells()
        let workflow = try cells.submitWorkflow([("first", "a", [], .cancel), ("second", "b", [], .cancel)])
        cells.deliverAll()
        cells.run(of: Self.id(of: "first", in: workflow))?.succeed()
        cells.clock.advance(by: 3_600_001)
        #expect(workflow.tasks.isEmpty)
        #expect(cells.engines[1]!.workflow(workflow.id) === workflow, "a member elsewhere still runs")
        cells.run(of: Self.id(of: "second", in: workflow))?.succeed()
        cells.deliver(from: 2)
        #expect(cells.engines[1]!.workflow(workflow.id) == nil)
        #expect(cells.engines[1]!.takeReportedWorkflows().spent == [workflow.id])
    }

    @Test func aStoreWritesTheWorkflowsReportsChangeAndDeletesThoseTheyLeaveSpent() throws {
        let cells = try Cells()
        let home = cells.engines[1]!
        var collector = ChangeCollector()
        home.addObserver { collector.add($0) }
        let workflow = try cells.submitWorkflow([("here", "a", [], .cancel), ("there", "b", [], .cancel)])
        let there = Self.id(of: "there", in: workflow)
        cells.deliverAll()
        #expect(collector.take(from: home).workflows.map(\.remoteMembers) == [[.init(id: there)]])
        cells.run(of: there)?.fail(TaskError(code: "boom", message: "failed"))
        cells.deliverAll()
        #expect(collector.take(from: home).workflows.map(\.remoteMembers) == [[.init(id: there, state: .failed)]])

        #expect(try home.retryWorkflow(workflow.id) == 1)
        cells.deliverAll()
        #expect(collector.take(from: home).workflows.map(\.remoteMembers) == [[.init(id: there, state: .pending)]])

        // Its own member is evicted; the one elsewhere still runs, so the workflow stays.
        cells.run(of: Self.id(of: "here", in: workflow))?.succeed()
        cells.clock.advance(by: 3_600_001)
        var changes = collector.take(from: home)
        #expect(changes.evictedTasks.map(\.id) == [Self.id(of: "here", in: workflow)])
        #expect(changes.evictedWorkflows.isEmpty)
        cells.run(of: there)?.succeed()
        cells.deliverAll()
        changes = collector.take(from: home)
        #expect(changes.workflows.isEmpty && changes.evictedWorkflows == [workflow.id])
        #expect(home.workflow(workflow.id) == nil)
    }

    /// The home counts its ids on from the members it made for a cell; that cell's own ids,
    /// made after it received them, must not count on from the same place.
    @Test func idsMadeForACellNeverMeetItsOwn() throws {
        let cells = try Cells()
        var ids: [TaskID] = []
        for _ in 0..<3 {
            let workflow = try cells.submitWorkflow([("here", "a", [], .cancel), ("there", "b", ["here"], .cancel)])
            cells.deliverAll()
            for _ in 0..<2 { ids.append(try cells.engines[2]!.submit(TaskSpec(kind: "noop", queue: "b")).id) }
            ids += workflow.keys.map(\.id) + [workflow.id]
        }
        #expect(Set(ids).count == ids.count)
        #expect(cells.clock.now == 0, "all in one millisecond")
        #expect(cells.engines[2]!.listTasks(before: nil, limit: 100) { _ in true }.tasks.count == 9)
    }

    @Test func aWorkflowIsCheckedWholeAtItsHomeAndRefusedThere() throws {
        let cells = try Cells()
        // Every member elsewhere: it has no home here.
        #expect(throws: EngineError.self) { try cells.submitWorkflow([("only", "b", [], .cancel)]) }
        // A member of another cell with a bad kind refuses the whole workflow, and nothing is sent.
        do {
            _ = try cells.engines[1]!.submitWorkflow(name: nil, tasks: [
                ("here", TaskSpec(kind: "manual", queue: "a")), ("there", TaskSpec(kind: "nope", queue: "b")),
            ])
            Issue.record("an unknown kind elsewhere was accepted")
        } catch {
            #expect(error.code == .unknownKind && error.field == "tasks[1].kind")
        }
        #expect(cells.sent(by: 1).isEmpty)
        #expect(cells.engines[1]!.unfinishedCount == 0)
        // A queue of another cell is not made at home.
        _ = try cells.submitWorkflow([("here", "a", [], .cancel), ("there", "b", [], .cancel)])
        #expect(cells.engines[1]!.queues["b"] == nil)
    }

    @Test func workflowMessagesKeepABinaryFormOfTheirOwnVersion() throws {
        let workflow = TaskID(high: 0x0123_4567_89AB_0001, low: 0xFEDC_BA98_7654_3210)
        let member = TaskID(high: 0x0123_4567_89AB_0002, low: 0xFEDC_BA98_7654_3211)
        let spec = TaskSpec(
            kind: "sleep", params: ["duration_ms": 10, "text": "ü"], name: "nap", queue: "b", priority: -3,
            dependencies: [.task(workflow), .task(member)], onDependencyFailure: .run, timeoutMilliseconds: 5_000,
            retry: RetryPolicy(maxAttempts: 4, backoffMilliseconds: 250, backoffFactor: 1.5), metadata: ["team": "x"])
        let messages = [
            CellMessage(.members, from: 1, to: 2, workflow: workflow, members: [
                CellMessage.Member(id: member, spec: spec, createdAt: 1_795_000_000_000),
                CellMessage.Member(id: workflow, spec: TaskSpec(kind: "noop"), createdAt: -1),
                CellMessage.Member(id: member, spec: TaskSpec(kind: "noop", runAt: .at(1_795_000_005_000), expiry: .at(-7)),
                                   createdAt: 1_795_000_000_000),
                CellMessage.Member(id: member, spec: TaskSpec(kind: "noop", uniqueKey: "nap-ü", uniqueForMilliseconds: 60_000),
                                   createdAt: 1_795_000_000_000),
                CellMessage.Member(id: member, spec: TaskSpec(kind: "noop", concurrencyKey: "tenant-ü"), createdAt: 1_795_000_000_000),
                CellMessage.Member(id: member, spec: TaskSpec(kind: "noop", schedule: ScheduleSlot(id: workflow, slot: -1_000)),
                                   createdAt: 1_795_000_000_000),
            ]),
            CellMessage(.memberChanged, from: 2, to: 1, workflow: workflow, member: member, state: .scheduled),
            CellMessage(.memberChanged, from: 2, to: 1, workflow: workflow, member: member, epoch: 7, state: .pending, fraction: 0.25),
            CellMessage(.memberChanged, from: 2, to: 1, workflow: workflow, member: member, state: .running),
            CellMessage(.memberChanged, from: 2, to: 1, workflow: workflow, member: member, state: .cancelled, fraction: 1),
            CellMessage(.cancelMembers, from: 1, to: 3, workflow: workflow),
            CellMessage(.retryMembers, from: 1, to: 65535, workflow: workflow),
        ]
        for message in messages {
            let bytes = message.encoded
            #expect(bytes[0] == 3)
            #expect(CellMessage(encoded: bytes) == message)
            // Any shorter form, a byte more, or the dependency kinds' version is refused.
            for length in 0..<bytes.count { #expect(CellMessage(encoded: bytes[..<length]) == nil) }
            #expect(CellMessage(encoded: bytes + [0]) == nil)
            var wrong = bytes
            wrong[0] = 1
            #expect(CellMessage(encoded: wrong) == nil)
        }
        // Version 2, written before members had optional fields, still reads.
        for message in messages where message.kind != .members {
            var older = message.encoded
            older[0] = 2
            #expect(CellMessage(encoded: older) == message)
        }
        let plain = CellMessage(.members, from: 1, to: 2, workflow: workflow, members: [
            CellMessage.Member(id: member, spec: spec, createdAt: 1_795_000_000_000),
        ])
        var older = Array(plain.encoded.dropLast(2))
        older[0] = 2
        #expect(CellMessage(encoded: older) == plain)
        // A delay travels as the time it gives.
        let delayed = CellMessage(.members, from: 1, to: 2, workflow: workflow, members: [
            CellMessage.Member(id: member, spec: TaskSpec(kind: "noop", runAt: .after(5_000), expiry: .after(9_000)), createdAt: 1_000),
        ])
        let read = try #require(CellMessage(encoded: delayed.encoded))
        #expect(read.members.first?.spec.runAt == .at(6_000) && read.members.first?.spec.expiry == .at(10_000))
        // The dependency kinds keep version 1, and cannot name a state other than an end.
        let ended = CellMessage(.ended, from: 1, to: 2, dependency: member, state: .failed)
        #expect(ended.encoded.count == CellMessage.encodedSize && ended.encoded[0] == 1)
        var pending = ended.encoded
        pending[26] = 4
        #expect(CellMessage(encoded: pending) == nil)
        // A member change must name a state.
        var stateless = messages[1].encoded
        stateless[26] = 0
        #expect(CellMessage(encoded: stateless) == nil)
    }
}
