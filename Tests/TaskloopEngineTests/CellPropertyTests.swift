import DequeModule
import Testing
import TaskloopJSON
import TaskloopTestSupport
@testable import TaskloopEngine

/// Cells reach the same ends as one engine: the same random operations (submissions with
/// dependencies across queues, workflows whose members span queues, outcomes, cancellations,
/// explicit retries, of tasks and of workflows) run on one engine holding every queue and on
/// one engine per cell (queues spread over 2-5 cells at random), joined by a bus that delivers
/// each sender's messages in order but late, interleaved at random with other senders' (only
/// a home's workflow messages are not overtaken at their cell by what was sent after them, as
/// `CellMessage` requires). After quiescence every task ends in the same state with the same
/// error code, and every workflow in the same state, which its home knows of every member.
/// `TASKLOOP_ENGINE_SEED=<n>` runs one seed.
@Suite struct CellPropertyTests {
    @Test func cellsEndLikeOneEngine() {
        if let failure = firstPropertyFailure(base: 0xCE11_0000, count: 150, Self.run) { Issue.record(Comment(rawValue: failure)) }
    }

    /// The comparison is not blind: lose the messages of one rule and some seed ends differently.
    @Test(arguments: [CellMessage.Kind.reopened, .ended, .watch, .members, .memberChanged, .cancelMembers, .retryMembers])
    func losingMessagesIsNoticed(kind: CellMessage.Kind) {
        let failures = (1...150).lazy.compactMap { seed in
            Self.run(seed: 0xCE11_0000 + UInt64(seed), dropping: { $0.kind == kind })
        }
        #expect(failures.first != nil)
    }

    /// The outcomes the test decides, shared by both worlds: by task number, whoever runs it when.
    final class Script {
        var decisions: [Int: Bool] = [:]
    }

    /// `{"task": n, "fails": k}` fails its first k attempts and then succeeds, at once;
    /// `{"task": n}` runs until the script decides its outcome. Cancellation is confirmed at once.
    final class ScriptedExecutor: TaskExecutor {
        let script: Script
        var held: [TaskRun] = []

        init(script: Script) {
            self.script = script
        }

        func validate(_ params: JSONValue) throws(EngineError) {}

        func start(_ run: TaskRun) {
            run.onCancel = { [weak run] in run?.cancelled() }
            if let fails = run.params.objectValue?["fails"]?.intValue {
                end(run, succeeding: Int64(run.attempt) > fails)
            } else {
                held.append(run)
                endDecided()
            }
        }

        func endDecided() {
            held.removeAll { !$0.isCurrent }
            for run in held {
                guard run.isCurrent, let task = run.params.objectValue?["task"]?.intValue, let succeeds = script.decisions[Int(task)]
                else {
                    continue
                }
                end(run, succeeding: succeeds)
            }
            held.removeAll { !$0.isCurrent }
        }

        private func end(_ run: TaskRun, succeeding: Bool) {
            if succeeding { run.succeed() } else { run.fail(TaskError(code: "scripted", message: "failed by the script")) }
        }
    }

    /// Engines for one placement of the queues: one engine for all (`cellOfQueue` nil) or one per cell.
    final class World {
        let clock: VirtualScheduler
        let executor: ScriptedExecutor
        var engines: [UInt16: Engine] = [:]
        let cellOfQueue: [String: UInt16]?
        /// Sent and not yet applied, by sender and receiver: each in the order sent, numbered.
        var inFlight: [Pair: Deque<(number: Int, message: CellMessage)>] = [:]
        var sent = 0
        /// Messages lost instead of applied (none, but for the test of the test).
        var dropping: (CellMessage) -> Bool = { _ in false }
        var violation: String?
        var ids: [TaskID] = []
        /// Each workflow's id and its members' task numbers.
        var workflows: [(id: TaskID, members: [Int])] = []

        struct Pair: Hashable {
            let from: UInt16
            let to: UInt16
        }

        init(cellOfQueue: [String: UInt16]?, script: Script, concurrency: [String: Int], clock: VirtualScheduler) {
            self.clock = clock
            self.cellOfQueue = cellOfQueue
            executor = ScriptedExecutor(script: script)
            let cells = cellOfQueue.map { Set($0.values).sorted() } ?? [0]
            for cell in cells {
                var configuration = EngineConfiguration()
                configuration.defaultConcurrency = 2
                if let cellOfQueue {
                    configuration.cells = CellPlacement(cell: cell, cellOfQueue: { cellOfQueue[$0]! })
                }
                let engine = Engine(configuration: configuration, scheduler: clock, extraExecutors: ["scripted": executor])
                engines[cell] = engine
                engine.addObserver { [unowned self, unowned engine] settled in
                    var records: [TaskRecord] = []
                    for event in settled {
                        switch event {
                        case .messageSent(let message):
                            if cellOfQueue == nil { fail("one engine sent \(message)") }
                            sent += 1
                            inFlight[Pair(from: message.from, to: message.to), default: []].append((sent, message))
                        case .submitted(let record), .stateChanged(let record, _, _), .watched(let record),
                             .releasedByRetry(let record):
                            records.append(record)
                        default:
                            break
                        }
                    }
                    for rule in engine.invariantViolations(of: records) { fail("cell \(engine.cell ?? 0): \(rule)") }
                }
                for (queue, limit) in concurrency where cellOfQueue?[queue] ?? cell == cell {
                    _ = try? engine.updateQueue(queue, maxConcurrency: limit)
                }
            }
        }

        func fail(_ text: String) { if violation == nil { violation = text } }

        func engine(ofQueue queue: String) -> Engine { engines[cellOfQueue?[queue] ?? 0]! }

        func engine(ofTask number: Int) -> Engine { engines[cellOfQueue == nil ? 0 : ids[number].cell]! }

        func task(_ number: Int) -> TaskRecord? { engine(ofTask: number).task(ids[number]) }

        /// Its home's record.
        func workflow(_ number: Int) -> WorkflowRecord? {
            let id = workflows[number].id
            return engines[cellOfQueue == nil ? 0 : id.cell]!.workflow(id)
        }

        /// Submits a workflow to the cell of its first member's queue; `existing` are task numbers.
        func submitWorkflow(_ members: [(key: String, spec: TaskSpec, existing: [Int], siblings: [String])]) {
            let batch = members.map { member in
                var spec = member.spec
                spec.dependencies = member.existing.map { .task(ids[$0]) } + member.siblings.map { .sibling(key: $0) }
                return (member.key, spec)
            }
            do {
                let workflow = try engine(ofQueue: batch[0].1.queue).submitWorkflow(name: nil, tasks: batch)
                workflows.append((workflow.id, Array(ids.count..<ids.count + batch.count)))
                ids += workflow.keys.map(\.id)
            } catch {
                fail("workflow refused: \(error)")
            }
        }

        func submit(_ spec: TaskSpec, dependencies: [Int]) {
            var spec = spec
            spec.dependencies = dependencies.map { .task(ids[$0]) }
            do {
                ids.append(try engine(ofQueue: spec.queue).submit(spec).id)
            } catch {
                fail("submission refused: \(error)")
            }
        }

        /// Applies `count` messages, each from a sender chosen at random.
        func deliver(_ count: Int, random: inout SplitMix64) {
            for _ in 0..<count {
                // A home's workflow message first reaches its cell before anything sent after it.
                var barrier: [UInt16: Int] = [:]
                for (pair, queue) in inFlight {
                    for (number, message) in queue where Self.isFanOut(message) {
                        barrier[pair.to] = min(barrier[pair.to] ?? .max, number)
                    }
                }
                let pairs = inFlight.filter { pair, queue in
                    queue.first.map { $0.number <= barrier[pair.to] ?? .max } ?? false
                }.keys.sorted { ($0.from, $0.to) < ($1.from, $1.to) }
                guard !pairs.isEmpty else { return }
                let pair = pairs[random.below(pairs.count)]
                let message = inFlight[pair]!.removeFirst().message
                if !dropping(message) { engines[pair.to]!.apply(message) }
            }
        }

        static func isFanOut(_ message: CellMessage) -> Bool {
            [.members, .cancelMembers, .retryMembers].contains(message.kind)
        }

        var quiet: Bool { inFlight.values.allSatisfy(\.isEmpty) }
    }

    static func run(seed: UInt64) -> String? {
        run(seed: seed, dropping: { _ in false })
    }

    /// Runs one seed; `dropping` loses the messages it picks (to see the test notice a broken rule).
    static func run(seed: UInt64, dropping: @escaping (CellMessage) -> Bool) -> String? {
        var random = SplitMix64(seed: seed)
        let queueNames = ["default", "a", "b", "c", "d", "e"]
        let cellCount = 2 + random.below(4)
        var cellOfQueue: [String: UInt16] = [:]
        for (index, name) in queueNames.enumerated() {
            // Every cell gets a queue; the rest go anywhere.
            cellOfQueue[name] = UInt16(index < cellCount ? index : random.below(cellCount)) &+ 7
        }
        var concurrency: [String: Int] = [:]
        for name in queueNames where random.below(2) == 0 { concurrency[name] = 1 + random.below(3) }
        let script = Script()
        let one = World(cellOfQueue: nil, script: script, concurrency: concurrency, clock: VirtualScheduler())
        let cells = World(cellOfQueue: cellOfQueue, script: script, concurrency: concurrency, clock: VirtualScheduler())
        cells.dropping = dropping
        let worlds = [one, cells]
        var holds: [Int] = []

        func endDecided() { for world in worlds { world.executor.endDecided() } }
        func state(_ number: Int, in world: World) -> TaskState? { world.task(number)?.state }

        /// Up to `most` earlier tasks, recent ones likelier; only tasks the cells hold already (a
        /// member of another cell is not there before its creation arrives).
        func someEarlierTasks(_ most: Int) -> [Int] {
            let count = one.ids.count
            var dependencies = Set<Int>()
            if count > 0 {
                for _ in 0..<random.below(most + 1) { dependencies.insert(count - 1 - random.below(min(30, count))) }
            }
            return dependencies.filter { cells.task($0) != nil }.sorted()
        }

        /// Task `number`'s spec, and whether the script holds it.
        func makeSpec(_ number: Int) -> (TaskSpec, held: Bool) {
            let held = random.below(3) == 0
            let params: JSONValue = held ? ["task": .int(Int64(number))]
                : ["task": .int(Int64(number)), "fails": .int(Int64(random.below(5) == 0 ? 1 + random.below(2) : 0))]
            let spec = TaskSpec(
                kind: "scripted", params: params, name: "t\(number)", queue: queueNames[random.below(queueNames.count)],
                priority: random.below(5) - 2, onDependencyFailure: random.below(3) == 0 ? .run : .cancel,
                retry: RetryPolicy(maxAttempts: 1 + random.below(2), backoffMilliseconds: UInt64(random.below(50))))
            return (spec, held)
        }

        /// Every message delivered, then true when each member of workflow `number` is in the
        /// same state and attempt in both worlds: what a workflow's cancellation or retry does
        /// then depends on nothing a message's delay changes (their own messages are delivered
        /// at once after them).
        func workflowAlike(_ number: Int) -> Bool {
            cells.deliver(Int.max, random: &random)
            return one.workflows[number].members.allSatisfy { member in
                guard let first = one.task(member), let second = cells.task(member) else { return false }
                return first.state == second.state && first.attempt == second.attempt
            }
        }

        let steps = 200 + random.below(300)
        for _ in 0..<steps {
            guard one.violation == nil && cells.violation == nil else { break }
            switch random.below(15) {
            case 0...3:
                let dependencies = someEarlierTasks(3)
                let number = one.ids.count
                let (spec, held) = makeSpec(number)
                for world in worlds { world.submit(spec, dependencies: dependencies) }
                if held { holds.append(number) }
            case 12:
                // Siblings name earlier siblings only (`Engine.cancelWorkflow` says why).
                var members: [(key: String, spec: TaskSpec, existing: [Int], siblings: [String])] = []
                for position in 0..<(1 + random.below(5)) {
                    let number = one.ids.count + position
                    let (spec, held) = makeSpec(number)
                    var siblings = Set<String>()
                    if position > 0 { for _ in 0..<random.below(3) { siblings.insert("k\(random.below(position))") } }
                    members.append(("k\(position)", spec, someEarlierTasks(2), siblings.sorted()))
                    if held { holds.append(number) }
                }
                for world in worlds { world.submitWorkflow(members) }
            case 13:
                guard !one.workflows.isEmpty else { break }
                let number = random.below(one.workflows.count)
                guard workflowAlike(number) else { break }
                for world in worlds {
                    do {
                        try world.engine(ofTask: world.workflows[number].members[0]).cancelWorkflow(world.workflows[number].id)
                    } catch {
                        world.fail("cancellation of workflow \(number) refused: \(error)")
                    }
                }
                cells.deliver(Int.max, random: &random)
            case 14:
                guard !one.workflows.isEmpty else { break }
                let number = random.below(one.workflows.count)
                guard workflowAlike(number) else { break }
                // Retried tasks held by the script wait for a new decision.
                for member in one.workflows[number].members where one.task(member).map({ $0.state == .failed || $0.state == .cancelled }) ?? false {
                    script.decisions.removeValue(forKey: member)
                }
                for world in worlds {
                    do {
                        _ = try world.engine(ofTask: world.workflows[number].members[0]).retryWorkflow(world.workflows[number].id)
                    } catch {
                        world.fail("retry of workflow \(number) refused: \(error)")
                    }
                }
                cells.deliver(Int.max, random: &random)
            case 4, 5:
                let undecided = holds.filter { script.decisions[$0] == nil }
                if let number = undecided.isEmpty ? nil : undecided[random.below(undecided.count)] {
                    script.decisions[number] = random.below(3) != 0
                    endDecided()
                }
            case 6:
                // Only where both worlds have it unfinished in the same attempt (a retry's backoff
                // may have begun in one only): a cancellation's effect then depends on nothing a
                // message's delay changes.
                guard !one.ids.isEmpty else { break }
                let number = random.below(one.ids.count)
                guard let first = one.task(number), let second = cells.task(number), !first.state.isTerminal,
                      !second.state.isTerminal, first.attempt == second.attempt else { break }
                for world in worlds { _ = try? world.engine(ofTask: number).cancel(world.ids[number]) }
            case 7:
                guard !one.ids.isEmpty else { break }
                let number = random.below(one.ids.count)
                guard let first = state(number, in: one), let second = state(number, in: cells),
                      first == .failed || first == .cancelled, second == .failed || second == .cancelled else { break }
                // A retried task held by the script waits for a new decision.
                script.decisions.removeValue(forKey: number)
                for world in worlds {
                    do {
                        try world.engine(ofTask: number).retryTask(world.ids[number])
                    } catch {
                        world.fail("retry of t\(number) refused: \(error)")
                    }
                }
            case 8, 9, 10:
                cells.deliver(1 + random.below(6), random: &random)
            default:
                let step = UInt64(random.below(100))
                for world in worlds { world.clock.advance(by: step) }
            }
        }

        // Quiescence: every held task decided, every message delivered, the clocks run.
        for number in holds where script.decisions[number] == nil { script.decisions[number] = true }
        var rounds = 0
        while rounds < 1_000 {
            rounds += 1
            endDecided()
            cells.deliver(Int.max, random: &random)
            for world in worlds { world.clock.advance(by: 1_000) }
            let unfinished = worlds.contains { world in (0..<world.ids.count).contains { !(state($0, in: world)?.isTerminal ?? true) } }
            if !unfinished && cells.quiet { break }
        }
        if let violation = one.violation ?? cells.violation { return violation }
        for number in 0..<one.ids.count {
            let first = one.task(number), second = cells.task(number)
            guard let first, let second else { return "t\(number) is missing: \(first == nil ? "one engine" : "cells")" }
            guard first.state.isTerminal && second.state.isTerminal else {
                return "t\(number) never finished: \(first.state.rawValue) on one engine, \(second.state.rawValue) in cells"
            }
            if first.state != second.state || first.error?.code != second.error?.code {
                return "t\(number) ended \(first.state.rawValue) (\(first.error?.code ?? "-")) on one engine, "
                    + "\(second.state.rawValue) (\(second.error?.code ?? "-")) in cells"
            }
        }
        for number in 0..<one.workflows.count {
            guard let first = one.workflow(number), let second = cells.workflow(number) else {
                return "workflow \(number) is missing: \(one.workflow(number) == nil ? "one engine" : "cells")"
            }
            if first.state != second.state {
                return "workflow \(number) ended \(first.state.rawValue) on one engine, \(second.state.rawValue) in cells"
            }
            for member in second.remoteMembers {
                let held = cells.engines[member.id.cell]!.task(member.id)
                if held?.state != member.state {
                    return "workflow \(number)'s home knows \(member.id) as \(member.state.rawValue), its cell holds it "
                        + (held?.state.rawValue ?? "nowhere")
                }
            }
        }
        return nil
    }
}
