import Foundation
import Testing
import TaskloopJSON
import TaskloopTestSupport
import TaskloopTime
@testable import TaskloopEngine

/// Random DAGs under random failures, cancellations, pauses, limit changes, rate limits, unique
/// keys and concurrency keys with changing caps, on the virtual clock. Every event and every
/// step is checked against the engine's invariants. Each seed is independent; a failure names
/// its seed (`TASKLOOP_ENGINE_SEED=<n>` runs just that one).
@Suite struct EnginePropertyTests {
    @Test func invariantsHoldForRandomWorkloads() {
        if let failure = firstPropertyFailure(base: 0xE17E_0000, count: 200, Self.run) { Issue.record(Comment(rawValue: failure)) }
    }

    static func run(seed: UInt64) -> String? {
        var random = SplitMix64(seed: seed)
        let manual = ManualExecutor()
        manual.confirmsCancel = random.below(2) == 0
        let clock = VirtualScheduler()
        var configuration = EngineConfiguration()
        configuration.defaultConcurrency = 1 + random.below(4)
        configuration.cancelGraceMilliseconds = UInt64(50 + random.below(500))
        let engine = Engine(configuration: configuration, scheduler: clock, extraExecutors: ["manual": manual])
        let queueNames = ["default", "a", "b"]
        var submitted: [TaskRecord] = []
        var finishedStates: [TaskID: TaskState] = [:]
        // Kept from the events themselves, so the checks do not rely on the engine's own books.
        var known: [TaskID: TaskRecord] = [:]
        var queuedByQueue: [String: [TaskID: TaskRecord]] = [:]
        var violation: String?
        var reopened = Set<TaskID>()
        // Fair share, replayed from the events: running tasks per queue and concurrency key, and
        // for each lane (a key, or nil for the tasks without one) of a queue, the other lanes
        // that were ready and under their cap at its last start, owed a turn before its next.
        var runningByKey: [String: [String: Int]] = [:]
        var owedTurns: [String: [String?: Set<String?>]] = [:]
        // After a cap is lowered, a key may run more than it until enough of its tasks end:
        // the most it may run, per queue and key, falling as they end.
        var overCap: [String: [String: Int]] = [:]
        // Each rate-limited queue's limit and the monotonic times of its starts since it was set.
        var rateLimits: [String: (limit: RateLimit, starts: [UInt64])] = [:]

        func fail(_ text: String) { if violation == nil { violation = text } }

        engine.addObserver { settled in
            // Observers run once a call has settled: the engine's own rules hold in full here.
            // (Before events were batched, an observer ran in the middle of a transition and
            // saw counts not yet updated and queued tasks not yet dispatched.)
            let records = settled.compactMap { event -> TaskRecord? in
                switch event {
                case .submitted(let record), .stateChanged(let record, _, _), .progressed(let record),
                     .cancelRequested(let record), .leaseRenewed(let record), .releasedByRetry(let record), .watched(let record): record
                case .workflowSubmitted, .queueChanged, .queueForgotten, .evicted, .messageSent, .workflowReported, .scheduleChanged,
                     .scheduleDeleted: nil
                }
            }
            for rule in engine.invariantViolations(of: records) { fail("inside an observer: \(rule)") }
            for case .stateChanged(let record, let from, let to) in settled { check(record, from: from, to: to) }
            for case .messageSent(let message) in settled { fail("a server on its own sent \(message)") }
        }

        func check(_ record: TaskRecord, from: TaskState, to: TaskState) {
            known[record.id] = record
            if from == .queued { queuedByQueue[record.queue.name]?.removeValue(forKey: record.id) }
            if to == .queued { queuedByQueue[record.queue.name, default: [:]][record.id] = record }
            if let final = finishedStates[record.id] {
                // Only an explicit retry reopens a finished task: failed or cancelled, to pending.
                if to == .pending && (final == .failed || final == .cancelled) {
                    finishedStates.removeValue(forKey: record.id)
                    reopened.insert(record.id)
                } else {
                    fail("\(record.id) changed after reaching \(final.rawValue)")
                }
            }
            if to.isTerminal { finishedStates[record.id] = to }
            checkFairShare(record, from: from, to: to)
            // Wall-clock times hold, whichever way the clock was set meanwhile. (A task that left
            // `scheduled` on time may start after the clock was set back before its time.)
            if from == .scheduled, to == .pending, let scheduledFor = record.scheduledFor, clock.wallClock < scheduledFor {
                fail("\(record.id) left scheduled at \(clock.wallClock), before its time \(scheduledFor)")
            }
            if to == .cancelled, record.error?.code == "expired" {
                if let expiresAt = record.expiresAt, clock.wallClock < expiresAt { fail("\(record.id) expired early") }
                if record.startedAt != nil { fail("\(record.id) expired after it had started") }
            }
            guard to == .running, from == .queued else { return }
            if record.attempt == 1, !reopened.contains(record.id), let expiresAt = record.expiresAt, clock.wallClock >= expiresAt {
                fail("\(record.id) started at \(clock.wallClock), after its expiry \(expiresAt)")
            }
            // Dependencies allow the start.
            // A dependency that a retry brought back had already released its `run` dependents.
            for id in record.dependencies where !reopened.contains(id) {
                guard let dependency = known[id] else { continue }
                if !dependency.state.isTerminal {
                    fail("\(record.id) started before dependency \(id) finished")
                }
                if record.onDependencyFailure == .cancel && dependency.state != .succeeded {
                    fail("\(record.id) started although dependency \(id) \(dependency.state.rawValue)")
                }
            }
            // The limit holds.
            let queue = record.queue
            if queue.running > queue.maxConcurrency {
                fail("queue \(queue.name) runs \(queue.running) > \(queue.maxConcurrency)")
            }
            if queue.paused { fail("paused queue \(queue.name) started \(record.id)") }
            if var limited = rateLimits[queue.name] {
                limited.starts.append(clock.now)
                rateLimits[queue.name] = limited
                checkRate(of: queue.name, limited)
            }
            // The best queued task of its lane started (across lanes, turns decide).
            for other in queuedByQueue[queue.name, default: [:]].values
            where queue.lanes == nil || other.concurrencyKey == record.concurrencyKey {
                if other.priority > record.priority || (other.priority == record.priority && other.sequence < record.sequence) {
                    fail("\(record.id) (p\(record.priority) #\(record.sequence)) started before \(other.id) (p\(other.priority) #\(other.sequence))")
                }
            }
        }

        func isReady(lane: String?, in queue: TaskQueue) -> Bool {
            queuedByQueue[queue.name, default: [:]].values.contains { $0.concurrencyKey == lane }
        }

        func isUnderCap(lane: String?, in queue: TaskQueue) -> Bool {
            guard let lane, let cap = queue.keyConcurrency else { return true }
            return runningByKey[queue.name, default: [:]][lane, default: 0] < cap
        }

        /// Replays running counts per key, and checks that while lanes are ready and under their
        /// cap, none starts twice before each of the others got a turn (a start, or a task
        /// taken that expired or failed instead of starting).
        func checkFairShare(_ record: TaskRecord, from: TaskState, to: TaskState) {
            let queue = record.queue
            let lane = record.concurrencyKey
            if let key = lane {
                if to == .running { runningByKey[queue.name, default: [:]][key, default: 0] += 1 }
                if from == .running { runningByKey[queue.name, default: [:]][key, default: 0] -= 1 }
            }
            guard queue.lanes != nil, from == .queued else { return }
            let tookTurn = to == .running || to == .failed || (to == .cancelled && record.error?.code == "expired")
            if tookTurn {
                for other in owedTurns[queue.name, default: [:]].keys { owedTurns[queue.name]?[other]?.remove(lane) }
            }
            // A lane no longer ready is owed nothing: it rejoins at the back.
            if !isReady(lane: lane, in: queue) {
                for other in owedTurns[queue.name, default: [:]].keys { owedTurns[queue.name]?[other]?.remove(lane) }
            }
            guard to == .running else { return }
            let stillOwed = owedTurns[queue.name, default: [:]][lane, default: []].filter { isReady(lane: $0, in: queue) && isUnderCap(lane: $0, in: queue) }
            if let skipped = stillOwed.first {
                fail("lane \(lane ?? "(no key)") of \(queue.name) started \(record.id) again before lane \(skipped ?? "(no key)") had a turn")
            }
            var owed = Set<String?>()
            for other in queuedByQueue[queue.name, default: [:]].values where other.concurrencyKey != lane {
                if isUnderCap(lane: other.concurrencyKey, in: queue) { owed.insert(other.concurrencyKey) }
            }
            owedTurns[queue.name, default: [:]][lane] = owed
        }

        /// No key runs more than its cap (or, after the cap was lowered, more than it ran then),
        /// and no queued task waits while its queue has room, a token if it is rate-limited, and
        /// its key under the cap (no lost wake-up).
        func checkKeyCaps() {
            for name in queueNames {
                let queue = engine.queue(named: name)
                var running: [String: Int] = [:]
                var startable = false
                for record in submitted where record.queue === queue {
                    if record.state == .running, let key = record.concurrencyKey { running[key, default: 0] += 1 }
                }
                for record in submitted where record.queue === queue && record.state == .queued {
                    guard let cap = queue.keyConcurrency, let key = record.concurrencyKey else { startable = true; continue }
                    if running[key, default: 0] < cap { startable = true }
                }
                // A rate-limited queue without a token waits for it: its timer is due later.
                let hasToken = queue.rateBucket?.hasToken(at: clock.now) ?? true
                if startable && hasToken && !queue.paused && queue.running < queue.maxConcurrency {
                    fail("queue \(name) runs \(queue.running) of \(queue.maxConcurrency) with a startable task queued")
                }
                guard let cap = queue.keyConcurrency else {
                    overCap[name] = nil
                    continue
                }
                for (key, count) in running {
                    let allowed = max(cap, overCap[name, default: [:]][key] ?? 0)
                    if count > allowed { fail("key \(key) of \(name) runs \(count) > \(allowed) (cap \(cap))") }
                    overCap[name, default: [:]][key] = count > cap ? count : nil
                }
                for key in overCap[name, default: [:]].keys where running[key] == nil { overCap[name]?[key] = nil }
            }
        }

        func changeKeyConcurrency(of name: String) {
            let queue = engine.queue(named: name)
            let cap: Int? = random.below(3) == 0 ? nil : 1 + random.below(3)
            var running: [String: Int] = [:]
            for record in submitted where record.queue === queue && record.state == .running {
                if let key = record.concurrencyKey { running[key, default: 0] += 1 }
            }
            if (try? engine.updateQueue(name, keyConcurrency: .some(cap))) != nil {
                overCap[name] = cap.map { cap in running.filter { $0.value > cap } }
                // Lanes freed by a new cap rejoin at the back: turns owed before are void.
                owedTurns[name] = nil
            }
        }

        /// In every window that ends with the latest start, since the limit was set: at most
        /// `burst + per_second * w` starts.
        func checkRate(of queue: String, _ limited: (limit: RateLimit, starts: [UInt64])) {
            guard let last = limited.starts.last else { return }
            for (index, first) in limited.starts.enumerated() {
                let count = limited.starts.count - index
                let allowed = Double(limited.limit.burst) + limited.limit.perSecond * Double(last - first) / 1_000
                if Double(count) > allowed + 1e-9 {
                    fail("queue \(queue) started \(count) tasks from \(first) to \(last) ms, beyond \(allowed) at \(limited.limit)")
                }
            }
        }

        func randomSpec() -> TaskSpec {
            var dependencies: [DependencyReference] = []
            if !submitted.isEmpty {
                var chosen = Set<Int>()
                for _ in 0..<random.below(4) { chosen.insert(submitted.count - 1 - random.below(min(40, submitted.count))) }
                dependencies = chosen.map { .task(submitted[$0].id) }
            }
            let kind: String
            var params: JSONValue = [:]
            switch random.below(6) {
            case 0: kind = "noop"
            case 1: kind = "manual"
            case 2: kind = "external"
            default:
                kind = "sleep"
                params = ["duration_ms": .int(Int64(random.below(200))), "steps": .int(Int64(1 + random.below(4))),
                          "outcome": random.below(5) == 0 ? "fail" : "succeed"]
            }
            // Some wait for a time (some already passed), some may expire.
            let delay = random.below(4) == 0 ? random.below(400) - 50 : nil
            let runAt: TaskTime? = delay.map { $0 < 0 ? .at(clock.wallClock + Int64($0)) : .after(UInt64($0)) }
            let expiry: TaskTime? = random.below(5) == 0 ? .after(UInt64(max(0, delay ?? 0) + 1 + random.below(400))) : nil
            var spec = TaskSpec(
                kind: kind, params: params, queue: queueNames[random.below(queueNames.count)],
                priority: random.below(17) - 8, dependencies: dependencies,
                onDependencyFailure: random.below(3) == 0 ? .run : .cancel,
                timeoutMilliseconds: random.below(5) == 0 ? UInt64(1 + random.below(300)) : nil,
                retry: RetryPolicy(maxAttempts: 1 + random.below(3), backoffMilliseconds: UInt64(random.below(100))),
                runAt: runAt, expiry: expiry)
            if random.below(4) == 0 { spec.concurrencyKey = "c\(random.below(3))" }
            if random.below(4) == 0 {
                spec.uniqueKey = "u\(random.below(3))"
                spec.uniqueForMilliseconds = random.below(2) == 0 ? UInt64(1 + random.below(300)) : nil
            }
            return spec
        }

        /// No two unfinished tasks of a queue carry one key; a refused duplicate names a task
        /// that holds its key (unfinished, or finished within the spec's window).
        func checkUniqueKeys() {
            var holders: [String: TaskID] = [:]
            for record in submitted where !record.state.isTerminal {
                guard let key = record.uniqueKey else { continue }
                if let other = holders.updateValue(record.id, forKey: "\(record.queue.name)/\(key)") {
                    fail("\(other) and \(record.id) are unfinished with unique key \(key) in \(record.queue.name)")
                }
            }
        }

        func checkRefusal(_ error: EngineError, of spec: TaskSpec) {
            guard error.code == .duplicateTask else { return }
            guard let id = error.existing, let holder = submitted.first(where: { $0.id == id }), holder.queue.name == spec.queue,
                  holder.uniqueKey == spec.uniqueKey else { return fail("\(error) names no task holding the key") }
            let window = Int64(spec.uniqueForMilliseconds ?? 0)
            if let finishedAt = holder.finishedAt, clock.wallClock - finishedAt >= window {
                fail("\(error): \(id) finished \(clock.wallClock - finishedAt) ms ago, past the window of \(window) ms")
            }
        }

        func checkCounts() {
            var expected: [String: StateCounts] = [:]
            var unfinished = 0
            for record in submitted where engine.task(record.id) != nil {
                expected[record.queue.name, default: StateCounts()][record.state] += 1
                if !record.state.isTerminal { unfinished += 1 }
            }
            for name in queueNames where engine.queue(named: name).counts != expected[name, default: StateCounts()] {
                fail("queue \(name) counts \(engine.queue(named: name).counts), expected \(expected[name, default: StateCounts()])")
            }
            if engine.unfinishedCount != unfinished { fail("unfinished \(engine.unfinishedCount) != \(unfinished)") }
        }

        let steps = 300 + random.below(300)
        for _ in 0..<steps {
            guard violation == nil else { break }
            switch random.below(15) {
            case 0...4:
                let spec = randomSpec()
                do {
                    submitted.append(try engine.submit(spec))
                } catch {
                    checkRefusal(error, of: spec)
                }
            case 5:
                let specs = (0..<(1 + random.below(6))).map { index -> (key: String, spec: TaskSpec) in
                    var spec = randomSpec()
                    if index > 0 && random.below(2) == 0 { spec.dependencies.append(.sibling(key: "k\(random.below(index))")) }
                    return (key: "k\(index)", spec: spec)
                }
                if let workflow = try? engine.submitWorkflow(name: nil, tasks: specs) { submitted += workflow.tasks }
            case 6:
                if !submitted.isEmpty { _ = try? engine.cancel(submitted[random.below(submitted.count)].id) }
            case 7:
                _ = try? engine.updateQueue(queueNames[random.below(queueNames.count)], paused: random.below(3) == 0)
            case 8:
                if random.below(2) == 0 {
                    changeKeyConcurrency(of: queueNames[random.below(queueNames.count)])
                } else {
                    _ = try? engine.updateQueue(queueNames[random.below(queueNames.count)], maxConcurrency: 1 + random.below(5))
                }
            case 9:
                let live = manual.runs.filter(\.isCurrent)
                if let run = live.isEmpty ? nil : live[random.below(live.count)] {
                    switch random.below(4) {
                    case 0: run.fail(TaskError(code: "manual", message: "failed by the test"))
                    case 1: run.progress(fraction: Double(random.below(100)) / 100)
                    default: run.succeed()
                    }
                }
            case 10:
                let external = submitted.filter { $0.kind == "external" && $0.state == .running }
                if let record = external.isEmpty ? nil : external[random.below(external.count)] {
                    let report: ExternalReport = random.below(3) == 0
                        ? .fail(TaskError(code: "worker", message: "failed")) : .complete(result: nil)
                    _ = try? engine.report(report, for: record.id)
                }
            case 11:
                let ended = submitted.filter { $0.state == .failed || $0.state == .cancelled }
                if let record = ended.isEmpty ? nil : ended[random.below(ended.count)] {
                    if let workflow = record.workflow, random.below(2) == 0 {
                        _ = try? engine.retryWorkflow(workflow.id)
                    } else {
                        _ = try? engine.retryTask(record.id)
                    }
                }
            case 13:
                // A rate limit set, changed or removed: a new one starts with a full bucket.
                let name = queueNames[random.below(queueNames.count)]
                let rates = [2.5, 3, 7.5, 40, 200]
                let limit = random.below(4) == 0 ? nil : RateLimit(perSecond: rates[random.below(rates.count)], burst: 1 + random.below(4))
                // The log starts before the call: the new bucket's burst starts inside it.
                let previous = rateLimits[name]
                rateLimits[name] = limit.map { ($0, []) }
                if (try? engine.updateQueue(name, rateLimit: .some(limit))) == nil { rateLimits[name] = previous }
            case 12:
                // The wall clock is set forward or back.
                clock.wallClockSkew += Int64(random.below(1_200)) - 600
            default:
                clock.advance(by: UInt64(random.below(120)))
            }
            checkCounts()
            checkUniqueKeys()
            checkKeyCaps()
        }

        // Let everything finish: unpause, finish manual and external work, run the clock.
        for name in queueNames { _ = try? engine.updateQueue(name, paused: false) }
        var rounds = 0
        while rounds < 1_000, submitted.contains(where: { !$0.state.isTerminal }) {
            rounds += 1
            for run in manual.runs where run.isCurrent { run.succeed() }
            for record in submitted where record.kind == "external" && record.state == .running {
                _ = try? engine.report(.complete(result: nil), for: record.id)
            }
            clock.advance(by: 1_000)
            checkCounts()
            checkKeyCaps()
        }
        if let stuck = submitted.first(where: { !$0.state.isTerminal }) {
            fail("\(stuck.id) never finished: \(stuck.state.rawValue), blocked by \(stuck.blockingDependencies)")
        }
        return violation
    }

    /// Random schedules made, paused, resumed, changed and deleted while the clock runs and
    /// the engine is restored (from what a store would hold) after random time down. No
    /// (schedule, slot) ever runs twice, and every slot of a schedule while it was active (not
    /// paused, not yet deleted) is dealt with, fired, skipped or missed, exactly once.
    @Test func scheduleSlotsAreDealtWithExactlyOnce() {
        if let failure = firstPropertyFailure(base: 0x5C4E_0000, count: 40, Self.runSchedules) {
            Issue.record(Comment(rawValue: failure))
        }
    }

    static func runSchedules(seed: UInt64) -> String? {
        var random = SplitMix64(seed: seed)
        let crons = ["*/20 * * * * *", "0 * * * * *", "*/7 * * * *", "15,45 * * * * *", "0 0 * * * *"]
        var clock = VirtualScheduler()
        var configuration = EngineConfiguration()
        configuration.wallClockCheckMilliseconds = 1_000
        var engine = Engine(configuration: configuration, scheduler: clock)
        var violation: String?
        func fail(_ text: String) { if violation == nil { violation = text } }
        var ran = Set<ScheduleSlot>()
        func observe(_ engine: Engine) {
            engine.addObserver { settled in
                for case .submitted(let record) in settled {
                    guard let mark = record.schedule else { continue }
                    if !ran.insert(mark).inserted { fail("slot \(mark.slot) of \(mark.id) ran twice") }
                }
            }
        }
        observe(engine)
        /// The test's own books: per schedule, its cron and the slots it owes (counted over the
        /// stretches it was active), against the engine's fired + skipped + missed.
        final class Model {
            var cron: CronSchedule
            var activeSince: Int64?
            var owed = 0
            init(cron: CronSchedule, activeSince: Int64?) {
                self.cron = cron
                self.activeSince = activeSince
            }
            /// Closes the active stretch at `now` (exclusive of its start, inclusive of `now`).
            func settle(at now: Int64, reopen: Bool) {
                if let since = activeSince {
                    owed += Engine.countSlots(of: cron, after: Engine.seconds(since), through: Engine.seconds(now), cap: .max)
                }
                activeSince = reopen ? now : nil
            }
        }
        var models: [TaskID: Model] = [:]

        func checkBooks() {
            let now = clock.wallClock
            for (id, model) in models {
                guard let schedule = engine.schedule(id) else { continue }
                let owed = model.owed + (model.activeSince.map {
                    Engine.countSlots(of: model.cron, after: Engine.seconds($0), through: Engine.seconds(now), cap: .max)
                } ?? 0)
                let dealt = Int(schedule.firedCount + schedule.skippedCount + schedule.missedCount)
                if dealt != owed { fail("schedule \(id) (\(schedule.spec.cron)) dealt with \(dealt) slots, owed \(owed)") }
            }
        }

        for _ in 0..<60 where violation == nil {
            let live = engine.allSchedules
            switch random.below(10) {
            case 0, 1:
                let cron = crons[random.below(crons.count)]
                let catchup = ScheduleCatchup.allCases[random.below(3)]
                let overlap = ScheduleOverlap.allCases[random.below(3)]
                guard let schedule = try? engine.createSchedule(ScheduleSpec(
                    name: "s", cron: cron, template: .task(TaskSpec(kind: "noop")), overlap: overlap, catchup: catchup,
                    maxCatchup: 1 + random.below(5))) else { fail("create refused"); break }
                models[schedule.id] = Model(cron: schedule.cron, activeSince: clock.wallClock)
            case 2:
                guard let schedule = live.isEmpty ? nil : live[random.below(live.count)] else { break }
                var spec = schedule.spec
                spec.paused.toggle()
                _ = try? engine.updateSchedule(schedule.id, to: spec)
                models[schedule.id]?.settle(at: clock.wallClock, reopen: !spec.paused)
            case 3:
                guard let schedule = live.isEmpty ? nil : live[random.below(live.count)] else { break }
                var spec = schedule.spec
                spec.cron = crons[random.below(crons.count)]
                let changed = spec.cron != schedule.spec.cron
                _ = try? engine.updateSchedule(schedule.id, to: spec)
                if changed, let model = models[schedule.id] {
                    let wasActive = model.activeSince != nil
                    model.settle(at: clock.wallClock, reopen: wasActive)
                    model.cron = schedule.cron
                }
            case 4:
                guard let schedule = live.isEmpty ? nil : live[random.below(live.count)] else { break }
                _ = try? engine.deleteSchedule(schedule.id)
                models.removeValue(forKey: schedule.id)
            case 5:
                // A restart after time down; slots passed meanwhile are owed (and caught up or missed).
                let saved = RestoreTests.saved(engine)
                let schedules = engine.allSchedules.map { engine.snapshot(of: $0) }
                let down = Int64(random.below(600_000))
                clock = VirtualScheduler(wallClockOrigin: clock.wallClock + down)
                engine = Engine(configuration: configuration, scheduler: clock)
                observe(engine)
                do {
                    try engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks, schedules: schedules)
                } catch {
                    fail("restore refused: \(error)")
                }
            default:
                clock.advance(by: UInt64(random.below(200_000)))
            }
            checkBooks()
        }
        return violation
    }
}
