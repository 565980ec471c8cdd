import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Fair share on the virtual clock: ready tasks with a `concurrency_key` are taken round-robin
/// across keys (the tasks without one taking turns as one more lane), priority first within a
/// key; a queue's `key_concurrency` caps each key's running tasks, and whatever ends a running
/// attempt frees its slot; by the server's dispatch and by leases alike, across a change of
/// dispatch, of the cap, and a restart. Every settled batch is checked against the invariants.
@Suite struct ConcurrencyKeyTests {
    final class Harness {
        let base: EngineHarness
        let manual = ManualExecutor()
        var engine: Engine { base.engine }
        var violations: [String] = []
        /// Names of the tasks that became `running`, in order.
        var starts: [String] = []

        init(concurrency: Int = 1, keyConcurrency: Int? = nil, dispatch: QueueDispatch = .server, paused: Bool = false,
             base: EngineHarness? = nil) throws {
            self.base = base ?? EngineHarness(extra: ["manual": manual])
            self.base.engine.addObserver { [unowned self] settled in
                violations += engine.invariantViolations(of: settled.compactMap(LeaseTests.Harness.record))
                for case .stateChanged(let record, _, .running) in settled { starts.append(record.name ?? "?") }
            }
            try engine.updateQueue("fair", maxConcurrency: concurrency, paused: paused, dispatch: dispatch,
                                   keyConcurrency: .some(keyConcurrency))
        }

        @discardableResult
        func submit(_ name: String, key: String?, priority: Int = 0, kind: String = "manual",
                    retry: RetryPolicy = RetryPolicy()) throws(EngineError) -> TaskRecord {
            try engine.submit(TaskSpec(kind: kind, name: name, queue: "fair", priority: priority, retry: retry,
                                       concurrencyKey: key))
        }

        /// Succeeds running tasks one at a time, oldest start first, until none runs.
        func finishAll() {
            while let run = manual.runs.first(where: { $0.isCurrent && $0.record.state == .running }) { run.succeed() }
        }

        func finish(_ record: TaskRecord) {
            record.run?.succeed()
        }

        func lease(max: Int = 10, kinds: Set<String>? = nil, milliseconds: UInt64 = 10_000) throws -> [String] {
            let request = LeaseRequest(worker: "w", kinds: kinds, maxTasks: max, milliseconds: milliseconds) { _ in }
            return try engine.lease(request, from: "fair", waiting: false).map { $0.name ?? "?" }
        }

        func unpause() throws {
            try engine.updateQueue("fair", paused: false)
        }
    }

    @Test func keysTakeTurnsAndPriorityComesFirstWithinAKey() throws {
        let h = try Harness(paused: true)
        try h.submit("a1", key: "a")
        try h.submit("a2", key: "a", priority: 5)
        try h.submit("a3", key: "a")
        try h.submit("b1", key: "b")
        try h.submit("b2", key: "b", priority: 1)
        try h.submit("c1", key: "c")
        try h.unpause()
        h.finishAll()
        #expect(h.starts == ["a2", "b2", "c1", "a1", "b1", "a3"])
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    /// Without fair share a high-priority flood of one key would run first; with it the other
    /// keys and the tasks without a key get every other turn.
    @Test func tasksWithoutAKeyTakeTheirTurnAsOneLane() throws {
        let h = try Harness(paused: true)
        try h.submit("x1", key: nil)
        try h.submit("x2", key: nil)
        try h.submit("a1", key: "a", priority: 8)
        try h.submit("a2", key: "a", priority: 8)
        try h.submit("x3", key: nil, priority: 1)
        try h.unpause()
        h.finishAll()
        #expect(h.starts == ["x3", "a1", "x1", "a2", "x2"])
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func aQueueWithoutKeysHasNoLanesAndOrdersAsBefore() throws {
        let h = try Harness(paused: true)
        try h.submit("low", key: nil, priority: -1)
        try h.submit("first", key: nil)
        try h.submit("high", key: nil, priority: 3)
        #expect(h.engine.queues["fair"]?.lanes == nil)
        try h.unpause()
        h.finishAll()
        #expect(h.starts == ["high", "first", "low"])
    }

    /// The tasks queued before the first keyed one keep their order in the lane without a key.
    @Test func theFirstKeyedTaskMakesTheLanesWithWhatWasQueued() throws {
        let h = try Harness(paused: true)
        try h.submit("x1", key: nil)
        try h.submit("x2", key: nil, priority: 2)
        try h.submit("a1", key: "a")
        #expect(h.engine.queues["fair"]?.lanes != nil)
        try h.unpause()
        h.finishAll()
        #expect(h.starts == ["x2", "a1", "x1"])
    }

    @Test func theCapHoldsEachKeyAndACompletionReleasesItsNext() throws {
        let h = try Harness(concurrency: 10, keyConcurrency: 1)
        let a1 = try h.submit("a1", key: "a")
        let a2 = try h.submit("a2", key: "a")
        try h.submit("a3", key: "a")
        let b1 = try h.submit("b1", key: "b")
        let b2 = try h.submit("b2", key: "b")
        let x1 = try h.submit("x1", key: nil)
        let x2 = try h.submit("x2", key: nil)
        // The queue has room for all; each key runs one, the tasks without a key are not capped.
        #expect(h.starts == ["a1", "b1", "x1", "x2"])
        #expect(a2.state == .queued && b2.state == .queued)
        h.finish(x1)
        h.finish(x2)
        #expect(h.starts.count == 4)
        h.finish(a1)
        #expect(h.starts == ["a1", "b1", "x1", "x2", "a2"])
        h.finish(b1)
        #expect(b2.state == .running)
        h.finishAll()
        #expect(h.starts == ["a1", "b1", "x1", "x2", "a2", "b2", "a3"])
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func aCancelledRunningTaskFreesItsKeysSlot() throws {
        let h = try Harness(concurrency: 10, keyConcurrency: 1)
        h.manual.confirmsCancel = true
        let a1 = try h.submit("a1", key: "a")
        let a2 = try h.submit("a2", key: "a")
        #expect(a2.state == .queued)
        _ = try h.engine.cancel(a1.id)
        #expect(a1.state == .cancelled && a2.state == .running)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    /// A failed attempt waiting out its backoff does not hold the slot; back in `queued` it
    /// waits its turn behind the task that took it.
    @Test func aFailedAttemptFreesItsSlotAndItsRetryWaitsForOne() throws {
        let h = try Harness(concurrency: 10, keyConcurrency: 1)
        let a1 = try h.submit("a1", key: "a", retry: RetryPolicy(maxAttempts: 2, backoffMilliseconds: 1_000))
        let a2 = try h.submit("a2", key: "a")
        a1.run?.fail(TaskError(code: "boom", message: "boom"))
        #expect(a1.state == .pending && a2.state == .running)
        h.base.clock.advance(by: 1_000)
        #expect(a1.state == .queued)
        h.finish(a2)
        #expect(a1.state == .running && a1.attempt == 2)
        // An explicit retry of a failed task waits for the slot as well.
        let a3 = try h.submit("a3", key: "a")
        a1.run?.fail(TaskError(code: "boom", message: "boom"))
        #expect(a1.state == .failed && a3.state == .running)
        try h.engine.retryTask(a1.id)
        #expect(a1.state == .queued)
        h.finish(a3)
        #expect(a1.state == .running && a1.attempt == 3)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func leasesGoRoundRobinUnderTheCapAndAnExpiryFreesTheSlot() throws {
        let h = try Harness(concurrency: 10, keyConcurrency: 1, dispatch: .workers)
        for name in ["a1", "a2", "b1", "b2"] { try h.submit(name, key: String(name.first!), kind: "noop") }
        try h.submit("x1", key: nil, kind: "noop")
        try h.submit("x2", key: nil, kind: "noop")
        #expect(try h.lease() == ["a1", "b1", "x1", "x2"])
        #expect(try h.lease().isEmpty)
        let a1 = try #require(h.engine.tasks.entries.compactMap { $0 }.first { $0.name == "a1" })
        let token = try #require(a1.lease?.token)
        try h.engine.report(.complete(result: nil), for: a1.id, leaseToken: token)
        #expect(try h.lease(milliseconds: 1_000) == ["a2"])
        h.base.clock.advance(by: 1_000)
        let a2 = try #require(h.engine.tasks.entries.compactMap { $0 }.first { $0.name == "a2" })
        #expect(a2.state == .failed && a2.error?.code == "lease_expired")
        try h.submit("a3", key: "a", kind: "noop")
        #expect(try h.lease() == ["a3"])
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    /// A lease for some kinds takes the next lane in turn that has one; lanes passed over keep
    /// their places for the next call.
    @Test func aLeaseForSomeKindsPassesOverLanesWithoutThem() throws {
        let h = try Harness(concurrency: 10, dispatch: .workers)
        try h.submit("a-manual", key: "a", kind: "manual")
        try h.submit("b-noop", key: "b", kind: "noop")
        try h.submit("c-noop", key: "c", kind: "noop")
        try h.submit("b-noop2", key: "b", kind: "noop")
        #expect(try h.lease(max: 2, kinds: ["noop"]) == ["b-noop", "c-noop"])
        #expect(try h.lease(max: 10) == ["a-manual", "b-noop2"])
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func switchingDispatchKeepsTheLanesAndTheirTurns() throws {
        let h = try Harness(concurrency: 10, keyConcurrency: 1, paused: true)
        for name in ["a1", "a2", "b1", "b2", "c1"] { try h.submit(name, key: String(name.first!), kind: "noop") }
        try h.engine.updateQueue("fair", paused: false, dispatch: .workers)
        #expect(try h.lease(max: 2) == ["a1", "b1"])
        try h.engine.updateQueue("fair", dispatch: .server)
        // a and b are at their cap under leases; c runs, and the rest wait for the leases.
        #expect(h.starts == ["a1", "b1", "c1"])
        let leased = h.engine.tasks.entries.compactMap { $0 }.filter { $0.lease != nil }
        for record in leased { try h.engine.report(.complete(result: nil), for: record.id, leaseToken: record.lease?.token) }
        #expect(h.starts == ["a1", "b1", "c1", "a2", "b2"])
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func theCapChangesAtOnceUpDownAndAway() throws {
        let h = try Harness(concurrency: 10, keyConcurrency: 1)
        let a1 = try h.submit("a1", key: "a")
        let a2 = try h.submit("a2", key: "a")
        let a3 = try h.submit("a3", key: "a")
        let a4 = try h.submit("a4", key: "a")
        #expect(h.starts == ["a1"])
        try h.engine.updateQueue("fair", keyConcurrency: .some(2))
        #expect(h.starts == ["a1", "a2"])
        // Lowering stops nothing; it holds the key until it is under the new cap.
        try h.engine.updateQueue("fair", keyConcurrency: .some(1))
        h.finish(a1)
        #expect(a3.state == .queued)
        h.finish(a2)
        #expect(a3.state == .running && a4.state == .queued)
        try h.engine.updateQueue("fair", keyConcurrency: .some(nil))
        #expect(a4.state == .running)
        #expect(h.engine.queues["fair"]?.keyConcurrency == nil)
        // Other settings leave the cap as it is.
        try h.engine.updateQueue("fair", keyConcurrency: .some(3))
        try h.engine.updateQueue("fair", maxConcurrency: 5)
        #expect(h.engine.queues["fair"]?.keyConcurrency == 3)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    /// Many keys come and go: a key with nothing queued or running keeps no lane.
    @Test func idleKeysAreForgotten() throws {
        let h = try Harness(concurrency: 4, keyConcurrency: 1)
        for index in 0..<100 { try h.submit("t\(index)", key: "tenant-\(index)") }
        h.finishAll()
        #expect(h.starts.count == 100)
        let lanes = try #require(h.engine.queues["fair"]?.lanes)
        #expect(lanes.keyCount == 0)
        // Queued tasks that expire or are cancelled leave their lanes once they surface.
        try h.engine.updateQueue("fair", paused: true)
        try h.engine.submit(TaskSpec(kind: "manual", name: "late", queue: "fair", expiry: .after(10), concurrencyKey: "late"))
        let cancelled = try h.submit("cancelled", key: "gone")
        _ = try h.engine.cancel(cancelled.id)
        h.base.clock.advance(by: 20)
        try h.unpause()
        #expect(lanes.keyCount == 0 && h.starts.count == 100)
        #expect(h.violations.isEmpty, "\(h.violations)")
    }

    @Test func badKeysAndCapsAreRefusedNamingTheField() throws {
        let h = try Harness()
        for key in ["", String(repeating: "k", count: 256)] {
            do {
                try h.submit("bad", key: key)
                Issue.record("concurrency_key of \(key.count) characters was taken")
            } catch {
                #expect(error.field == "concurrency_key")
            }
        }
        #expect(h.engine.tasks.entries.compactMap { $0 }.isEmpty)
        try h.submit("longest", key: String(repeating: "é", count: 255))
        for cap in [0, 10_001] {
            do {
                try h.engine.updateQueue("fair", keyConcurrency: .some(cap))
                Issue.record("key_concurrency \(cap) was taken")
            } catch {
                #expect(error.field == "key_concurrency")
            }
        }
        #expect(h.engine.queues["fair"]?.keyConcurrency == nil)
    }

    /// After a restart a leased task still counts against its key, the cap is kept, and the
    /// queued tasks take their turns as before.
    @Test func theCapAndTheRunningCountsSurviveARestart() throws {
        let h = try Harness(concurrency: 10, keyConcurrency: 1, dispatch: .workers)
        for name in ["a1", "a2", "b1", "b2"] { try h.submit(name, key: String(name.first!), kind: "noop") }
        #expect(try h.lease(max: 1) == ["a1"])
        #expect(h.engine.suspendForShutdown() == 0)
        let restored = try RestoreTests.restored(from: h.base)
        let engine = restored.engine
        #expect(engine.queues["fair"]?.keyConcurrency == 1)
        let request = LeaseRequest(worker: "w", kinds: nil, maxTasks: 10, milliseconds: 10_000) { _ in }
        #expect(try engine.lease(request, from: "fair", waiting: false).map(\.name) == ["b1"])
        let a1 = try #require(engine.tasks.entries.compactMap { $0 }.first { $0.name == "a1" })
        try engine.report(.complete(result: nil), for: a1.id, leaseToken: a1.lease?.token)
        #expect(try engine.lease(request, from: "fair", waiting: false).map(\.name) == ["a2"])
        #expect(engine.invariantViolations(of: engine.tasks.entries.compactMap { $0 }).isEmpty)
    }
}
