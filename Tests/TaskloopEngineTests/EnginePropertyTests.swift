import Foundation
import Testing
import TaskloopJSON
import TaskloopTestSupport
@testable import TaskloopEngine

/// Random DAGs under random failures, cancellations, pauses, limit changes, rate limits and
/// unique keys, on the virtual clock. Every event and every step is checked against the
/// engine's invariants. Each seed is independent; a failure names its seed
/// (`TASKLOOP_ENGINE_SEED=<n>` runs just that one).
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
                case .workflowSubmitted, .queueChanged, .queueForgotten, .evicted, .messageSent, .workflowReported: nil
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
            // The best queued task started.
            for other in queuedByQueue[queue.name, default: [:]].values {
                if other.priority > record.priority || (other.priority == record.priority && other.sequence < record.sequence) {
                    fail("\(record.id) (p\(record.priority) #\(record.sequence)) started before \(other.id) (p\(other.priority) #\(other.sequence))")
                }
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

        /// A rate-limited queue with tasks ready, room and a token is not left idle (no lost
        /// wake-up): between steps every action due has run.
        func checkRateLimitedQueuesBusy() {
            for name in rateLimits.keys {
                let queue = engine.queue(named: name)
                guard let bucket = queue.rateBucket, !queue.paused, queue.running < queue.maxConcurrency,
                      queue.counts[.queued] > 0, bucket.hasToken(at: clock.now) else { continue }
                fail("queue \(name) holds \(queue.counts[.queued]) queued tasks, has room and a token at \(clock.now), and is idle")
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
                _ = try? engine.updateQueue(queueNames[random.below(queueNames.count)], maxConcurrency: 1 + random.below(5))
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
            checkRateLimitedQueuesBusy()
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
            checkRateLimitedQueuesBusy()
        }
        if let stuck = submitted.first(where: { !$0.state.isTerminal }) {
            fail("\(stuck.id) never finished: \(stuck.state.rawValue), blocked by \(stuck.blockingDependencies)")
        }
        return violation
    }
}
