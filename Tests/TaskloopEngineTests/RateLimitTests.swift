import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Rate limits on the virtual clock: the token bucket's burst and refill (fractional rates
/// too), leases and held lease calls, changing and removing a limit, pause and concurrency
/// beside it, the count of delayed starts, and a restart. Every settled batch is checked
/// against the engine's invariants.
@Suite struct RateLimitTests {
    final class Harness {
        let base: EngineHarness
        var engine: Engine { base.engine }
        var clock: VirtualScheduler { base.clock }
        var violations: [String] = []
        /// Monotonic times of starts (leases included), by task name.
        var starts: [(name: String, at: UInt64)] = []

        init(base: EngineHarness = EngineHarness()) {
            self.base = base
            base.engine.addObserver { [unowned self] settled in
                violations += engine.invariantViolations(of: settled.compactMap(LeaseTests.Harness.record))
                for case .stateChanged(let record, _, .running) in settled { starts.append((record.name ?? "?", clock.now)) }
            }
        }

        func submit(_ count: Int, _ kind: String = "noop", queue: String = "api", prefix: String = "t") throws {
            for index in 0..<count {
                try base.submit("\(prefix)\(index)", kind, params: kind == "sleep" ? base.sleep(10_000) : [:], queue: queue)
            }
        }

        var startTimes: [UInt64] { starts.map(\.at) }
    }

    @Test func aFullBucketStartsTheBurstAtOnceThenOneTaskPerInterval() throws {
        let h = Harness()
        try h.engine.updateQueue("api", maxConcurrency: 100, rateLimit: RateLimit(perSecond: 5, burst: 3))
        try h.submit(10)
        #expect(h.startTimes == [0, 0, 0])
        h.clock.advance(by: 199)
        #expect(h.starts.count == 3)
        h.clock.advance(by: 1)
        #expect(h.startTimes == [0, 0, 0, 200])
        h.base.settle()
        #expect(h.startTimes == [0, 0, 0, 200, 400, 600, 800, 1_000, 1_200, 1_400])
        // The seven after the burst waited for a token; the burst did not.
        #expect(h.engine.queue(named: "api").delayedByRateLimit == 7)
        // An idle spell refills the bucket to its burst, no further.
        h.clock.advance(by: 100_000)
        h.starts = []
        let now = h.clock.now
        try h.submit(5, prefix: "later")
        h.base.settle()
        #expect(h.startTimes == [now, now, now, now + 200, now + 400])
        #expect(h.violations == [])
    }

    @Test func fractionalRatesKeepTheirAverageExactly() throws {
        let h = Harness()
        try h.engine.updateQueue("api", maxConcurrency: 100, rateLimit: RateLimit(perSecond: 0.5, burst: 1))
        try h.submit(3, prefix: "slow")
        h.clock.advance(by: 10_000)
        #expect(h.startTimes == [0, 2_000, 4_000])

        // Three a second with a burst of 2: the interval is no whole number of milliseconds, and
        // a start waits for the millisecond after its token is due without losing the fraction.
        let g = Harness()
        try g.engine.updateQueue("api", maxConcurrency: 100, rateLimit: RateLimit(perSecond: 3, burst: 2))
        try g.submit(1_000)
        g.clock.advance(by: 400_000)
        #expect(g.starts.count == 1_000)
        for (index, at) in g.startTimes.enumerated().dropFirst(2) {
            let due = Double(index - 1) * 1_000 / 3
            #expect(Double(at) >= due && Double(at) < due + 1.000_001, "start \(index) at \(at), its token due at \(due)")
        }
        #expect(g.violations == [])
    }

    @Test func leasesTakeTokensAndAHeldLeaseCallIsAnsweredWhenOneIsDue() throws {
        let h = Harness()
        try h.engine.updateQueue("api", maxConcurrency: 100, dispatch: .workers, rateLimit: RateLimit(perSecond: 2, burst: 2))
        try h.submit(5, "external")
        func request(_ onGrant: @escaping ([TaskRecord]) -> Void = { _ in }) -> LeaseRequest {
            LeaseRequest(worker: "w1", kinds: nil, maxTasks: 5, milliseconds: 60_000, onGrant: onGrant)
        }
        #expect(try h.engine.lease(request(), from: "api", waiting: false).count == 2)
        #expect(try h.engine.lease(request(), from: "api", waiting: false).isEmpty)
        var granted: [[TaskRecord]] = []
        #expect(try h.engine.lease(request { granted.append($0) }, from: "api", waiting: true).isEmpty)
        h.clock.advance(by: 499)
        #expect(granted.isEmpty)
        h.clock.advance(by: 1)
        #expect(granted.map(\.count) == [1])
        #expect(h.startTimes == [0, 0, 500])
        // Tokens left unused pile up to the burst for the next call.
        h.clock.advance(by: 5_000)
        #expect(try h.engine.lease(request(), from: "api", waiting: false).count == 2)
        #expect(h.engine.queue(named: "api").delayedByRateLimit == 1)
        #expect(h.violations == [])
    }

    @Test func removingTheLimitReleasesEverythingAtOnceAndANewLimitStartsFull() throws {
        let h = Harness()
        try h.engine.updateQueue("api", maxConcurrency: 100, rateLimit: RateLimit(perSecond: 1, burst: 1))
        try h.submit(20, "sleep")
        h.clock.advance(by: 2_500)
        #expect(h.startTimes == [0, 1_000, 2_000])
        // A new limit has a full bucket: its burst starts at once.
        try h.engine.updateQueue("api", rateLimit: RateLimit(perSecond: 1, burst: 4))
        #expect(h.startTimes == [0, 1_000, 2_000, 2_500, 2_500, 2_500, 2_500])
        try h.engine.updateQueue("api", rateLimit: .some(nil))
        #expect(h.starts.count == 20 && h.startTimes.dropFirst(7).allSatisfy { $0 == 2_500 })
        #expect(h.engine.queue(named: "api").rateLimit == nil)
        #expect(h.violations == [])
    }

    @Test func pauseAndConcurrencyStillApply() throws {
        let h = Harness()
        try h.engine.updateQueue("api", maxConcurrency: 2, paused: true, rateLimit: RateLimit(perSecond: 10, burst: 5))
        try h.submit(6, "sleep")
        h.clock.advance(by: 1_000)
        #expect(h.starts.isEmpty)
        try h.engine.updateQueue("api", paused: false)
        #expect(h.startTimes == [1_000, 1_000])
        // Starts held back by the concurrency limit did not wait for a token.
        try h.engine.updateQueue("api", maxConcurrency: 10)
        #expect(h.startTimes == [1_000, 1_000, 1_000, 1_000, 1_000])
        h.clock.advance(by: 100)
        #expect(h.startTimes.last == 1_100 && h.starts.count == 6)
        #expect(h.engine.queue(named: "api").delayedByRateLimit == 1)
        #expect(h.violations == [])
    }

    @Test func limitsOutOfRangeAreRefusedNamingTheField() throws {
        let h = Harness()
        for (limit, field) in [(RateLimit(perSecond: 0, burst: 1), "rate_limit.per_second"),
                               (RateLimit(perSecond: .infinity, burst: 1), "rate_limit.per_second"),
                               (RateLimit(perSecond: 2_000_000, burst: 1), "rate_limit.per_second"),
                               (RateLimit(perSecond: 1, burst: 0), "rate_limit.burst")] {
            #expect(throws: EngineError.self) { try h.engine.updateQueue("api", rateLimit: limit) }
            do {
                try h.engine.updateQueue("api", rateLimit: limit)
            } catch {
                #expect(error.field == field && error.code == .invalid)
            }
        }
        #expect(h.engine.queues["api"] == nil)
    }

    @Test func aRestoreKeepsTheLimitWithAFullBucket() throws {
        let h = Harness()
        try h.engine.updateQueue("api", maxConcurrency: 100, rateLimit: RateLimit(perSecond: 4, burst: 2))
        try h.submit(6, "sleep")
        #expect(h.starts.count == 2)
        let queue = h.engine.queue(named: "api")
        #expect(h.engine.snapshot(of: queue).rateLimit == RateLimit(perSecond: 4, burst: 2))
        let savedTasks = h.engine.tasks.entries.compactMap { $0.map(h.engine.snapshot(of:)) }

        let r = Harness()
        try r.engine.restore(queues: [h.engine.snapshot(of: queue)], workflows: [], tasks: savedTasks)
        #expect(r.engine.queue(named: "api").rateLimit == RateLimit(perSecond: 4, burst: 2))
        // Two were running and lost their attempt (retried as interrupted, one attempt only:
        // they fail); the four queued ones start two at once, then one per 250 ms.
        r.clock.advance(by: 600)
        #expect(r.startTimes == [0, 0, 250, 500])
        #expect(r.violations == [])
    }
}
