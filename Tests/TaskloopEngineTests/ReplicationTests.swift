import Foundation
import Testing
import TaskloopJSON
import TaskloopTestSupport
@testable import TaskloopEngine

/// Replicas sharing one order of turns (docs/SCALING.md), without a database: a log of each
/// turn's changes stands for it. A replica's turn absorbs the turns it has not seen, runs what
/// waited for the turn, does its work, and appends its changes. After every turn each replica
/// catches up and must hold exactly what the one that made the turn holds: the records, and
/// what is rebuilt from them (counts, waits, leases).
final class ReplicaCluster {
    final class Gate: EngineGate {
        var isOpen = false
        var waiting: [() -> Void] = []
        func `defer`(_ work: @escaping () -> Void) { waiting.append(work) }
    }

    final class Replica {
        let name: String
        let engine: Engine
        let gate = Gate()
        let manual = ManualExecutor()
        var collector = ChangeCollector()
        var applied = 0
        var violations: [String] = []

        init(name: String, configuration: EngineConfiguration, clock: VirtualScheduler) {
            self.name = name
            var configuration = configuration
            configuration.replica = name
            // As the service runs them: an attempt starts once the turn that made it is shared.
            configuration.startsAfterCommit = true
            manual.startHasEffects = true
            engine = Engine(configuration: configuration, scheduler: clock, extraExecutors: ["manual": manual])
            engine.gate = gate
            engine.addObserver { [unowned self] settled in
                if !engine.isAbsorbing {
                    if !gate.isOpen { violations.append("\(name) changed outside its turn: \(settled.count) events") }
                    collector.add(settled)
                }
                let records = settled.compactMap { LeaseTests.Harness.record($0) }
                for rule in engine.invariantViolations(of: records) {
                    // Room that absorbed work found is used in the replica's next turn.
                    if engine.isAbsorbing && rule.contains("has room") { continue }
                    violations.append("\(name): \(rule)")
                }
            }
        }
    }

    let clock = VirtualScheduler()
    var log: [SharedChanges] = []
    var replicas: [Replica] = []

    init(count: Int, configure: (inout EngineConfiguration) -> Void = { _ in }) {
        var configuration = EngineConfiguration()
        configure(&configuration)
        replicas = (0..<count).map { Replica(name: "r\($0)", configuration: configuration, clock: clock) }
    }

    func catchUp(_ replica: Replica) {
        while replica.applied < log.count {
            replica.engine.absorb(log[replica.applied])
            replica.applied += 1
        }
    }

    /// One turn of replica `index`: what it does in `work` is shared once it returns.
    @discardableResult
    func turn<Result, Failure: Error>(_ index: Int, _ work: (Replica) throws(Failure) -> Result) throws(Failure) -> Result {
        let replica = replicas[index]
        catchUp(replica)
        replica.gate.isOpen = true
        replica.engine.dispatchWaiting()
        while !replica.gate.waiting.isEmpty {
            let waiting = replica.gate.waiting
            replica.gate.waiting = []
            for item in waiting { item() }
        }
        defer {
            replica.gate.isOpen = false
            let changes = replica.collector.take(from: replica.engine)
            let started = replica.engine.markHeldStarts()
            if !changes.isEmpty { log.append(changes) }
            replica.applied = log.count
            replica.engine.releaseStarts(through: started)
        }
        return try work(replica)
    }

    func turn(_ index: Int) {
        turn(index) { _ in }
    }

    /// Differences between each caught-up replica and `reference`.
    func disagreements(with reference: Replica) -> [String] {
        var found: [String] = []
        let expected = state(of: reference)
        for replica in replicas where replica !== reference {
            catchUp(replica)
            let actual = state(of: replica)
            if actual.tasks.count != expected.tasks.count {
                found.append("\(replica.name) holds \(actual.tasks.count) tasks, \(reference.name) \(expected.tasks.count)")
            }
            for (id, snapshot) in expected.tasks where actual.tasks[id] != snapshot {
                found.append("\(replica.name) holds \(id) as \(String(describing: actual.tasks[id])), \(reference.name) as \(snapshot)")
            }
            for (mine, theirs) in zip(actual.derived, expected.derived) where mine != theirs {
                found.append("\(replica.name) derives \(mine), \(reference.name) \(theirs)")
                if let id = TaskID(String(mine.prefix(26))) {
                    for holder in [replica, reference] {
                        let record = holder.engine.task(id)!
                        let waits = record.dependencies.map { dependency in
                            holder.engine.task(dependency).map { "\($0.id) \($0.state.rawValue) lists it: \($0.dependents.contains { $0 === record })" } ?? "\(dependency) gone"
                        }
                        found[found.count - 1] += "\n  \(holder.name): \(record.state.rawValue) released by \(record.releasedBy), waits \(waits)"
                    }
                }
            }
            if actual.derived.count != expected.derived.count {
                found.append("\(replica.name) derives \(actual.derived.count) facts, \(reference.name) \(expected.derived.count)")
            }
        }
        return found
    }

    private func state(of replica: Replica) -> (tasks: [TaskID: TaskSnapshot], derived: [String]) {
        let engine = replica.engine
        var tasks: [TaskID: TaskSnapshot] = [:]
        var derived: [String] = []
        for case let record? in engine.tasks.entries {
            tasks[record.id] = engine.snapshot(of: record)
            // What a terminal task was blocked by no longer means anything.
            let blocked = record.state.isTerminal ? "-" : "\(record.blockingDependencies)"
            derived.append("\(record.id) blocked by \(blocked) in \(record.workflow?.id.description ?? "-")")
        }
        for name in engine.queues.keys.sorted() {
            let queue = engine.queues[name]!
            derived.append("queue \(name) \(queue.counts) \(engine.snapshot(of: queue))")
        }
        for id in engine.workflows.keys.sorted(by: { $0.description < $1.description }) {
            let workflow = engine.workflows[id]!
            derived.append("workflow \(id) \(workflow.counts) \(workflow.tasks.map(\.id))")
        }
        derived.append("unfinished \(engine.unfinishedCount) leased \(engine.leasedCount)")
        return (tasks, derived)
    }
}

@Suite struct ReplicationTests {
    /// Random workloads over three replicas: submissions, workflows, cancels, retries, queue
    /// changes, reports, time passing, and now and then a replica that is declared gone.
    @Test func everyReplicaHoldsWhatTheTurnsMade() {
        if let failure = firstPropertyFailure(base: 0x5EA1_0000, count: 40, Self.run) { Issue.record(Comment(rawValue: failure)) }
    }

    static func run(seed: UInt64) -> String? {
        var random = SplitMix64(seed: seed)
        let cluster = ReplicaCluster(count: 3) { configuration in
            configuration.defaultConcurrency = 1 + random.below(3)
            configuration.cancelGraceMilliseconds = UInt64(50 + random.below(300))
            configuration.retentionMilliseconds = UInt64(2_000 + random.below(4_000))
        }
        for replica in cluster.replicas { replica.manual.confirmsCancel = random.below(2) == 0 }
        let queueNames = ["default", "a", "b", "w"]
        var submitted: [TaskID] = []
        // Queue w is leased by workers, through any replica.
        cluster.turn(0) { _ = try? $0.engine.updateQueue("w", maxConcurrency: 2, dispatch: .workers) }
        func leaseRequest(_ replica: ReplicaCluster.Replica) -> LeaseRequest {
            LeaseRequest(worker: "worker-\(replica.name)", kinds: nil, maxTasks: 1 + random.below(2),
                         milliseconds: UInt64(100 + random.below(400)), onGrant: { _ in })
        }
        func leased(_ engine: Engine) -> [TaskRecord] {
            submitted.compactMap { engine.task($0) }.filter { $0.lease != nil }
        }

        func randomSpec() -> TaskSpec {
            var dependencies: [DependencyReference] = []
            if !submitted.isEmpty {
                for _ in 0..<random.below(3) { dependencies.append(.task(submitted[submitted.count - 1 - random.below(min(30, submitted.count))])) }
            }
            var params: JSONValue = [:]
            let kind: String
            switch random.below(5) {
            case 0: kind = "noop"
            case 1, 2: kind = "manual"
            case 3: kind = "external"
            default:
                kind = "sleep"
                params = ["duration_ms": .int(Int64(random.below(200))), "steps": .int(Int64(1 + random.below(3))),
                          "outcome": random.below(4) == 0 ? "fail" : "succeed"]
            }
            return TaskSpec(kind: kind, params: params, queue: queueNames[random.below(4)], priority: random.below(5) - 2,
                            dependencies: dependencies.uniqued(),
                            onDependencyFailure: random.below(3) == 0 ? .run : .cancel,
                            timeoutMilliseconds: random.below(6) == 0 ? UInt64(1 + random.below(300)) : nil,
                            retry: RetryPolicy(maxAttempts: 1 + random.below(3), backoffMilliseconds: UInt64(random.below(100))))
        }

        func check(after index: Int) -> String? {
            for replica in cluster.replicas { if let violation = replica.violations.first { return violation } }
            return cluster.disagreements(with: cluster.replicas[index]).first
        }

        let steps = 200 + random.below(200)
        for step in 0..<steps {
            let index = random.below(3)
            let action = random.below(16)
            if action == 15 {
                cluster.clock.advance(by: UInt64(random.below(150)))
                continue
            }
            cluster.turn(index) { replica in
                let engine = replica.engine
                switch action {
                case 0...3:
                    if let record = try? engine.submit(randomSpec()) { submitted.append(record.id) }
                case 4:
                    let specs = (0..<(1 + random.below(4))).map { position -> (key: String, spec: TaskSpec) in
                        var spec = randomSpec()
                        if position > 0 && random.below(2) == 0 { spec.dependencies.append(.sibling(key: "k\(random.below(position))")) }
                        return (key: "k\(position)", spec: spec)
                    }
                    if let workflow = try? engine.submitWorkflow(name: nil, tasks: specs) { submitted += workflow.tasks.map(\.id) }
                case 5:
                    if !submitted.isEmpty { _ = try? engine.cancel(submitted[random.below(submitted.count)]) }
                case 6:
                    _ = try? engine.updateQueue(queueNames[random.below(4)], maxConcurrency: 1 + random.below(4),
                                                paused: random.below(4) == 0)
                case 7, 8:
                    let live = replica.manual.runs.filter(\.isCurrent)
                    if let run = live.isEmpty ? nil : live[random.below(live.count)] {
                        switch random.below(4) {
                        case 0: run.fail(TaskError(code: "manual", message: "failed by the test"))
                        case 1: run.progress(fraction: Double(random.below(100)) / 100)
                        default: run.succeed()
                        }
                    }
                case 9:
                    let running = submitted.compactMap { engine.task($0) }.filter { $0.kind == "external" && $0.state == .running }
                    if let record = running.isEmpty ? nil : running[random.below(running.count)] {
                        _ = try? engine.report(random.below(3) == 0 ? .progress(fraction: 0.5, message: nil, details: nil)
                                                   : .complete(result: nil), for: record.id)
                    }
                case 10, 11:
                    let ended = submitted.compactMap { engine.task($0) }.filter { $0.state == .failed || $0.state == .cancelled }
                    if let record = ended.isEmpty ? nil : ended[random.below(ended.count)] {
                        if let workflow = record.workflow, random.below(2) == 0 {
                            _ = try? engine.retryWorkflow(workflow.id)
                        } else {
                            _ = try? engine.retryTask(record.id)
                        }
                    }
                case 13:
                    _ = try? engine.lease(leaseRequest(replica), from: "w", waiting: random.below(2) == 0)
                case 14:
                    let held = leased(engine)
                    if let record = held.isEmpty ? nil : held[random.below(held.count)], let token = record.lease?.token {
                        switch random.below(5) {
                        case 0: _ = try? engine.heartbeat(record.id, token: token, progress: .progress(fraction: 0.3, message: nil, details: nil))
                        case 1: _ = try? engine.release(record.id, token: token)
                        case 2: _ = try? engine.report(.fail(TaskError(code: "worker", message: "failed")), for: record.id, leaseToken: token)
                        default: _ = try? engine.report(.complete(result: nil), for: record.id, leaseToken: token)
                        }
                    }
                default:
                    // Another replica is declared gone: what it ran is interrupted here.
                    let other = cluster.replicas[(index + 1 + random.below(2)) % 3]
                    engine.interruptAttempts(of: other.name)
                }
            }
            if let failure = check(after: index) { return "step \(step): \(failure)" }
        }

        // Everything ends: queues unpaused, work finished, time passing, every replica taking turns.
        for name in queueNames { cluster.turn(0) { _ = try? $0.engine.updateQueue(name, paused: false) } }
        for round in 0..<400 {
            for index in 0..<3 {
                cluster.turn(index) { replica in
                    for run in replica.manual.runs where run.isCurrent { run.succeed() }
                    _ = try? replica.engine.lease(leaseRequest(replica), from: "w", waiting: false)
                    for record in leased(replica.engine) {
                        _ = try? replica.engine.report(.complete(result: nil), for: record.id, leaseToken: record.lease?.token)
                    }
                    for id in submitted {
                        if let record = replica.engine.task(id), record.kind == "external", record.state == .running {
                            _ = try? replica.engine.report(.complete(result: nil), for: id)
                        }
                    }
                }
            }
            if let failure = check(after: 2) { return "ending, round \(round): \(failure)" }
            cluster.clock.advance(by: 500)
            let engine = cluster.replicas[0].engine
            if submitted.allSatisfy({ engine.task($0).map { $0.state.isTerminal } ?? true }) { return nil }
        }
        let engine = cluster.replicas[0].engine
        let stuck = submitted.compactMap { engine.task($0) }.first { !$0.state.isTerminal }
        return stuck.map { "\($0.id) never finished: \($0.state.rawValue), blocked by \($0.blockingDependencies)" }
    }

    @Test func aTaskStartsOnceAcrossReplicasAndTheLimitHoldsForAll() throws {
        let cluster = ReplicaCluster(count: 3) { $0.defaultConcurrency = 2 }
        for index in 0..<3 {
            cluster.turn(index) { replica in
                for _ in 0..<4 { _ = try? replica.engine.submit(TaskSpec(kind: "manual")) }
            }
        }
        let running = cluster.replicas.map { $0.manual.runs.count }
        #expect(running == [2, 0, 0], "the first turn fills the queue; later turns find it full")
        // A run that ends on r0 frees a place: the turn that ends it starts the next task there.
        cluster.turn(0) { $0.manual.runs[0].succeed() }
        #expect(cluster.replicas[0].manual.runs.count == 3)
        cluster.turn(1) { $0.manual.runs.forEach { $0.succeed() } }
        #expect(cluster.disagreements(with: cluster.replicas[0]).isEmpty)
        let queue = cluster.replicas[2].engine.queue(named: "default")
        #expect(queue.counts[.running] == 2 && queue.counts[.succeeded] == 1 && queue.counts[.queued] == 9)
    }

    @Test func aCancelOnAnotherReplicaStopsTheAttemptWhereItRuns() throws {
        let cluster = ReplicaCluster(count: 2)
        let id = try cluster.turn(0) { try $0.engine.submit(TaskSpec(kind: "manual")).id }
        let run = cluster.replicas[0].manual.runs[0]
        let outcome = try cluster.turn(1) { replica throws(EngineError) in try replica.engine.cancel(id) }
        #expect(outcome == .cancelRequested)
        #expect(!run.stopRequested, "r0 has not yet taken its turn")
        cluster.turn(0)
        #expect(run.stopRequested && cluster.replicas[0].manual.cancelRequests == 1)
        cluster.turn(0) { _ in run.cancelled() }
        cluster.catchUp(cluster.replicas[1])
        #expect(cluster.replicas[1].engine.task(id)?.state == .cancelled)
        #expect(cluster.replicas.allSatisfy { $0.violations.isEmpty })
    }

    @Test func theAttemptsOfAReplicaThatIsGoneAreInterruptedUnderTheRetryPolicy() throws {
        let cluster = ReplicaCluster(count: 2)
        let id = try cluster.turn(0) { try $0.engine.submit(TaskSpec(kind: "manual", retry: RetryPolicy(maxAttempts: 2))).id }
        cluster.catchUp(cluster.replicas[1])
        #expect(cluster.replicas[1].engine.task(id)?.runner == "r0")
        #expect(cluster.replicas[1].engine.otherRunners == ["r0"])
        let interrupted = cluster.turn(1) { $0.engine.interruptAttempts(of: "r0") }
        #expect(interrupted == 1)
        let task = try #require(cluster.replicas[1].engine.task(id))
        #expect(task.state == TaskState.pending && task.attempt == 2 && task.error?.code == "interrupted")
        // r0's attempt is dropped when it hears of it: its late success changes nothing.
        let oldRun = cluster.replicas[0].manual.runs[0]
        cluster.turn(0)
        #expect(!oldRun.isCurrent && oldRun.stopRequested)
        cluster.turn(0) { _ in oldRun.succeed() }
        #expect(cluster.replicas[0].engine.task(id)?.state != .succeeded)
        #expect(cluster.disagreements(with: cluster.replicas[0]).isEmpty)
    }

    /// Starting over from the database: a task this replica made in a turn that never committed
    /// is not there; its attempt stops and the task goes.
    @Test func aTaskTheDatabaseNeverGotStopsAndGoesWhenAReplicaStartsOver() throws {
        let cluster = ReplicaCluster(count: 1)
        let replica = cluster.replicas[0]
        let id = try cluster.turn(0) { try $0.engine.submit(TaskSpec(kind: "manual")).id }
        cluster.log.removeAll()
        let run = replica.manual.runs[0]
        var lost = SharedChanges()
        lost.evictedTasks = [StoredTaskKey(id: id, sequence: replica.engine.task(id)!.sequence)]
        replica.engine.absorb(lost)
        #expect(replica.engine.task(id) == nil && run.stopRequested && !run.isCurrent)
        #expect(replica.engine.unfinishedCount == 0 && replica.engine.queue(named: "default").counts.total == 0)
        #expect(replica.violations.isEmpty, "\(replica.violations)")
    }

    @Test func timersOfAReplicaWaitForItsTurn() throws {
        let cluster = ReplicaCluster(count: 2)
        let id = try cluster.turn(0) {
            try $0.engine.submit(TaskSpec(kind: "manual", timeoutMilliseconds: 100)).id
        }
        cluster.clock.advance(by: 200)
        #expect(cluster.replicas[0].engine.task(id)?.state == .running, "the timeout waits for r0's turn")
        #expect(cluster.replicas[0].violations.isEmpty)
        cluster.turn(0)
        #expect(cluster.replicas[0].engine.task(id)?.error?.code == "timeout")
        #expect(cluster.disagreements(with: cluster.replicas[0]).isEmpty)
    }
}

extension Array where Element == DependencyReference {
    /// Each task once (a submission refuses a repeated dependency).
    func uniqued() -> [DependencyReference] {
        var seen = Set<String>()
        return filter { seen.insert("\($0)").inserted }
    }
}
