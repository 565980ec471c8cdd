import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Leasing on the virtual clock: order, limits and kinds; waiting calls; heartbeats, expiry,
/// release, cancellation and fencing; and leases across a restart. Every settled batch is
/// checked against the engine's invariants.
@Suite struct LeaseTests {
    final class Harness {
        let base: EngineHarness
        var engine: Engine { base.engine }
        var clock: VirtualScheduler { base.clock }
        var violations: [String] = []
        /// What observers and grants saw, in order: `events` when a batch was published, then
        /// `grant:<names>` when a waiting call got its tasks.
        var trail: [String] = []

        init(concurrency: Int = 10, base: EngineHarness = EngineHarness()) throws {
            self.base = base
            base.engine.addObserver { [unowned self] settled in
                violations += engine.invariantViolations(of: settled.compactMap(Self.record))
                trail.append("events")
            }
            try base.engine.updateQueue("gpu", maxConcurrency: concurrency, dispatch: .workers)
        }

        static func record(_ event: EngineEvent) -> TaskRecord? {
            switch event {
            case .submitted(let record), .stateChanged(let record, _, _), .progressed(let record), .cancelRequested(let record),
                 .leaseRenewed(let record), .releasedByRetry(let record), .watched(let record), .evicted(let record, _): record
            case .workflowSubmitted, .queueChanged, .queueForgotten, .messageSent, .workflowReported, .scheduleChanged, .scheduleDeleted: nil
            }
        }

        @discardableResult
        func submit(_ name: String, _ kind: String = "noop", priority: Int = 0, retry: RetryPolicy = RetryPolicy(),
                    timeout: UInt64? = nil) throws -> TaskRecord {
            try base.submit(name, kind, params: kind == "sleep" ? base.sleep(1_000) : [:], queue: "gpu", priority: priority,
                            timeout: timeout, retry: retry)
        }

        func request(_ worker: String = "w1", kinds: Set<String>? = nil, max: Int = 1, milliseconds: UInt64 = 10_000,
                     onGrant: @escaping ([TaskRecord]) -> Void = { _ in }) -> LeaseRequest {
            LeaseRequest(worker: worker, kinds: kinds, maxTasks: max, milliseconds: milliseconds, onGrant: onGrant)
        }

        func lease(_ worker: String = "w1", kinds: Set<String>? = nil, max: Int = 1, milliseconds: UInt64 = 10_000) throws -> [TaskRecord] {
            try engine.lease(request(worker, kinds: kinds, max: max, milliseconds: milliseconds), from: "gpu", waiting: false)
        }

        func names(_ records: [TaskRecord]) -> [String] { records.map { $0.name ?? "?" } }
    }

    @Test func leasesFollowTheQueuesOrderLimitPauseAndKinds() throws {
        let h = try Harness(concurrency: 3)
        try h.submit("low", priority: -1)
        try h.submit("first")
        try h.submit("high", priority: 5)
        try h.submit("slow", "sleep")
        try h.submit("second")
        // Nothing starts by itself in a workers queue.
        #expect(h.engine.queues["gpu"]!.counts[.queued] == 5)
        #expect(h.names(try h.lease(max: 2)) == ["high", "first"])
        #expect(h.names(try h.lease(kinds: ["sleep"], max: 5)) == ["slow"])
        // The limit (3 running) holds whatever max_tasks asks.
        #expect(try h.lease(max: 5).isEmpty)
        let leased = h.engine.tasks.entries.compactMap { $0 }.filter { $0.state == .running }
        #expect(leased.count == 3 && leased.allSatisfy { $0.lease?.worker == "w1" && $0.startedAt != nil })
        try h.engine.updateQueue("gpu", maxConcurrency: 10, paused: true)
        #expect(try h.lease(max: 5).isEmpty)
        try h.engine.updateQueue("gpu", paused: false)
        #expect(h.names(try h.lease(max: 5)) == ["second", "low"])
        #expect(Set(leased.map { $0.lease!.token }).count == 3 && leased.allSatisfy { $0.lease!.token.utf8.count == 32 })
        #expect(h.engine.leasedCount == 5)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func onlyWorkerQueuesLease() throws {
        let h = try Harness()
        #expect(throws: EngineError.self) { try h.engine.lease(h.request(), from: "default", waiting: false) }
        do {
            _ = try h.engine.lease(h.request(), from: "default", waiting: false)
        } catch {
            #expect(error.code == .notLeasable)
        }
        do {
            _ = try h.engine.lease(h.request(), from: "nowhere", waiting: true)
        } catch {
            #expect(error.code == .notFound)
        }
    }

    @Test func waitingCallsAreServedInArrivalOrderAfterTheEventsArePublished() throws {
        let h = try Harness(concurrency: 10)
        var granted: [String] = []
        for worker in ["a", "b", "c"] {
            let request = h.request(worker, kinds: worker == "b" ? ["sleep"] : nil) { tasks in
                granted.append("\(worker):\(h.names(tasks).joined(separator: ","))")
                h.trail.append("grant:\(worker)")
            }
            #expect(try h.engine.lease(request, from: "gpu", waiting: true).isEmpty)
        }
        #expect(h.engine.queues["gpu"]!.waitingLessees == 3)
        h.trail.removeAll()
        try h.submit("n1")
        // `b` waits for a sleep task; `a` came first and takes n1; the events went out first.
        #expect(granted == ["a:n1"])
        #expect(h.trail == ["events", "grant:a"])
        try h.submit("s1", "sleep")
        #expect(granted == ["a:n1", "b:s1"])
        try h.submit("n2")
        #expect(granted == ["a:n1", "b:s1", "c:n2"])
        #expect(h.engine.queues["gpu"]!.waitingLessees == 0)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func aWithdrawnCallGetsNothing() throws {
        let h = try Harness()
        var calls = 0
        let request = h.request { _ in calls += 1 }
        _ = try h.engine.lease(request, from: "gpu", waiting: true)
        h.engine.withdraw(request)
        h.engine.withdraw(request)
        #expect(h.engine.queues["gpu"]!.waitingLessees == 0)
        try h.submit("n")
        #expect(calls == 0)
        #expect(h.engine.queues["gpu"]!.counts[.queued] == 1)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func heartbeatsExtendAndExpiryEndsTheAttemptUnderTheRetryPolicy() throws {
        let h = try Harness()
        let task = try h.submit("t", retry: RetryPolicy(maxAttempts: 2, backoffMilliseconds: 100))
        let token = try #require(try h.lease(milliseconds: 5_000).first?.lease?.token)
        h.clock.advance(by: 4_000)
        try h.engine.heartbeat(task.id, token: token, progress: .progress(fraction: 0.5, message: "half", details: nil))
        #expect(task.lease?.expiresAt == h.clock.wallClock + 5_000)
        #expect(task.progress.fraction == 0.5)
        h.clock.advance(by: 4_000)
        try h.engine.heartbeat(task.id, token: token, milliseconds: 20_000)
        h.clock.advance(by: 19_999)
        #expect(task.state == .running)
        h.clock.advance(by: 1)
        // Expired: the retry policy gives it a second attempt after the backoff.
        #expect(task.state == .pending && task.lease == nil && task.error?.code == "lease_expired")
        h.clock.advance(by: 100)
        #expect(task.state == .queued && task.attempt == 2)
        // The old token is fenced off everywhere.
        for call in [{ try h.engine.heartbeat(task.id, token: token) }, { try h.engine.release(task.id, token: token) },
                     { try h.engine.report(.complete(result: nil), for: task.id, leaseToken: token) }] as [() throws -> Any] {
            do { _ = try call(); Issue.record("a stale token was accepted") } catch let error as EngineError {
                #expect(error.code == .leaseLost)
            }
        }
        let second = try #require(try h.lease(milliseconds: 1_000).first?.lease?.token)
        #expect(second != token)
        h.clock.advance(by: 1_000)
        // The last attempt's lease expired: poison.
        #expect(task.state == .failed && task.error?.code == "lease_expired")
        #expect(h.engine.queues["gpu"]!.leaseCounts == LeaseCounts(granted: 2, expired: 2, released: 0, poisoned: 1))
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func reportsNeedTheCurrentToken() throws {
        let h = try Harness()
        let task = try h.submit("t")
        let token = try #require(try h.lease().first?.lease?.token)
        // One digit changed (to one it is not), one added, none.
        let changed = (token.first == "0" ? "1" : "0") + token.dropFirst()
        for wrong in [nil, changed, token + "0"] as [String?] {
            do { try h.engine.report(.complete(result: "x"), for: task.id, leaseToken: wrong); Issue.record("accepted \(wrong ?? "nil")") }
            catch { #expect(error.code == .leaseLost) }
        }
        #expect(task.state == .running)
        try h.engine.report(.progress(fraction: 0.3, message: nil, details: nil), for: task.id, leaseToken: token)
        try h.engine.report(.complete(result: "done"), for: task.id, leaseToken: token)
        #expect(task.state == .succeeded && task.result == "done" && task.lease == nil && h.engine.leasedCount == 0)
        do { try h.engine.report(.complete(result: nil), for: task.id, leaseToken: token); Issue.record("accepted twice") }
        catch { #expect(error.code == .leaseLost) }
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func releaseRequeuesAtItsPlaceWithoutConsumingTheAttempt() throws {
        let h = try Harness()
        try h.submit("a")
        try h.submit("b")
        let a = try #require(try h.lease().first)
        let token = try #require(a.lease?.token)
        try h.engine.release(a.id, token: token)
        #expect(a.state == .queued && a.attempt == 1 && a.lease == nil)
        #expect(h.names(try h.lease(max: 2)) == ["a", "b"])
        #expect(h.engine.queues["gpu"]!.leaseCounts.released == 1)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func cancellingALeasedTaskReachesItsWorkerAndEndsCancelled() throws {
        let h = try Harness()
        let reported = try h.submit("reported")
        let expired = try h.submit("expired")
        let leased = try h.lease(max: 2, milliseconds: 3_000)
        #expect(try h.engine.cancel(reported.id) == .cancelRequested)
        #expect(try h.engine.cancel(expired.id) == .cancelRequested)
        let answer = try h.engine.heartbeat(reported.id, token: leased[0].lease?.token)
        #expect(answer.cancelRequested)
        try h.engine.report(.fail(TaskError(code: "cancelled", message: "stopped")), for: reported.id, leaseToken: leased[0].lease?.token)
        #expect(reported.state == .cancelled)
        // Without a report, the lease's end settles it.
        h.clock.advance(by: 3_000)
        #expect(expired.state == .cancelled && h.engine.leasedCount == 0)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func timeoutsApplyToLeasedAttempts() throws {
        let h = try Harness()
        let task = try h.submit("t", timeout: 2_000)
        let token = try #require(try h.lease(milliseconds: 60_000).first?.lease?.token)
        h.clock.advance(by: 2_000)
        #expect(task.state == .failed && task.error?.code == "timeout")
        do { try h.engine.heartbeat(task.id, token: token); Issue.record("heartbeat after timeout") }
        catch { #expect(error.code == .leaseLost) }
    }

    @Test func switchingDispatchMovesQueuedTasksAndDismissesWaitingCalls() throws {
        let h = try Harness()
        var dismissed: [[TaskRecord]] = []
        try h.submit("leased")
        let held = try #require(try h.lease().first)
        _ = try h.engine.lease(h.request(kinds: ["sleep"]) { dismissed.append($0) }, from: "gpu", waiting: true)
        try h.submit("queued")
        try h.engine.updateQueue("gpu", dispatch: .server)
        #expect(dismissed.count == 1 && dismissed[0].isEmpty)
        // The server runs what was queued; the leased task keeps its lease.
        #expect(h.engine.tasks.entries.compactMap { $0 }.first { $0.name == "queued" }?.state == .succeeded)
        #expect(held.state == .running && held.lease != nil)
        try h.engine.report(.complete(result: nil), for: held.id, leaseToken: held.lease?.token)
        #expect(held.state == .succeeded)
        try h.engine.updateQueue("gpu", paused: true)
        try h.engine.updateQueue("gpu", dispatch: .workers)
        try h.submit("later")
        try h.engine.updateQueue("gpu", paused: false)
        #expect(h.names(try h.lease()) == ["later"])
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func leasesSurviveARestartWithTheirTokensUntilTheyExpire() throws {
        let h = try Harness()
        let kept = try h.submit("kept")
        let lapsing = try h.submit("lapsing", retry: RetryPolicy(maxAttempts: 3, backoffMilliseconds: 10))
        let keptToken = try #require(try h.lease(milliseconds: 30_000).first?.lease?.token)
        _ = try h.lease(milliseconds: 2_000)
        #expect(h.engine.suspendForShutdown() == 0)
        #expect(kept.state == .running && lapsing.state == .running)
        let restored = try RestoreTests.restored(from: h.base, later: 5_000)
        let engine = restored.engine
        let keptAgain = try #require(engine.task(kept.id))
        let lapsingAgain = try #require(engine.task(lapsing.id))
        // The wall clock moved 5 s: the 2 s lease is over, the 30 s one is not.
        restored.clock.advance(by: 0)
        #expect(lapsingAgain.state == .pending && lapsingAgain.error?.code == "lease_expired" && lapsingAgain.attempt == 2)
        #expect(keptAgain.state == .running && keptAgain.lease?.token == keptToken && engine.leasedCount == 1)
        #expect(engine.queues["gpu"]?.dispatch == .workers)
        try engine.heartbeat(kept.id, token: keptToken)
        try engine.report(.complete(result: "after restart"), for: kept.id, leaseToken: keptToken)
        #expect(keptAgain.state == .succeeded)
        #expect(engine.invariantViolations(of: engine.tasks.entries.compactMap { $0 }).isEmpty)
    }
}
