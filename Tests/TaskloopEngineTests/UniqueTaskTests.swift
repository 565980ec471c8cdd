import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Unique tasks: a key is held by the unfinished task of its queue that carries it, and by one
/// that finished within the submission's window, even after retention forgot it and after a
/// restart; a refused submission creates nothing.
@Suite struct UniqueTaskTests {
    static func spec(_ name: String, _ kind: String = "external", key: String?, for window: UInt64? = nil,
                     queue: String = "default") -> TaskSpec {
        TaskSpec(kind: kind, name: name, queue: queue, uniqueKey: key, uniqueForMilliseconds: window)
    }

    /// The duplicate refusal `body` throws, after checking that it created nothing.
    static func refusal(_ h: EngineHarness, _ body: () throws(EngineError) -> Void) -> EngineError? {
        let tasksBefore = h.engine.tasks.count, unfinishedBefore = h.engine.unfinishedCount
        defer {
            #expect(h.engine.tasks.count == tasksBefore && h.engine.unfinishedCount == unfinishedBefore)
        }
        do {
            try body()
            return nil
        } catch {
            #expect(error.code == .duplicateTask)
            return error
        }
    }

    @Test func anUnfinishedTaskOfTheQueueHoldsItsKey() throws {
        let h = EngineHarness()
        let first = try h.engine.submit(Self.spec("first", key: "invoice-7"))
        #expect(first.state == .running)
        let refused = Self.refusal(h) { () throws(EngineError) in try h.engine.submit(Self.spec("again", key: "invoice-7")) }
        #expect(refused?.existing == first.id && refused?.field == "unique_key")
        // Another queue, or another key, does not collide.
        let elsewhere = try h.engine.submit(Self.spec("elsewhere", key: "invoice-7", queue: "other"))
        let otherKey = try h.engine.submit(Self.spec("other key", key: "invoice-8"))
        let unkeyed = try h.engine.submit(Self.spec("unkeyed", key: nil))
        #expect(h.engine.uniqueKeyHolder(queue: "other", key: "invoice-7") == elsewhere.id)
        #expect(h.engine.uniqueKeyHolder(queue: "default", key: "invoice-8") == otherKey.id && unkeyed.uniqueKey == nil)
        // Finished, it no longer holds the key for a submission without a window.
        try h.engine.report(.complete(result: nil), for: first.id)
        let next = try h.engine.submit(Self.spec("next", key: "invoice-7"))
        #expect(h.engine.uniqueKeyHolder(queue: "default", key: "invoice-7") == next.id)
        #expect(h.engine.invariantViolations(of: [first, next, elsewhere, otherKey]).isEmpty)
    }

    @Test func theSubmissionsWindowCountsFromTheFinish() throws {
        let h = EngineHarness()
        let done = try h.engine.submit(Self.spec("done", "noop", key: "report"))
        #expect(done.state == .succeeded)
        h.clock.advance(by: 999)
        let refused = Self.refusal(h) { () throws(EngineError) in try h.engine.submit(Self.spec("soon", key: "report", for: 1_000)) }
        #expect(refused?.existing == done.id)
        // A shorter window, or none, is the submitter's to ask for: the finish is past it.
        let shorter = try h.engine.submit(Self.spec("shorter", "noop", key: "report", for: 999))
        h.clock.advance(by: 1)
        #expect(Self.refusal(h) { () throws(EngineError) in try h.engine.submit(Self.spec("a", key: "report", for: 2)) }?
            .existing == shorter.id)
        h.clock.advance(by: 2)
        let later = try h.engine.submit(Self.spec("later", key: "report", for: 2))
        #expect(h.engine.uniqueKeyHolder(queue: "default", key: "report") == later.id)
    }

    @Test func cancelledAndFailedTasksCountAsFinished() throws {
        let h = EngineHarness()
        let cancelled = try h.engine.submit(Self.spec("cancelled", key: "c"))
        try h.engine.cancel(cancelled.id)
        // The worker of an external task never confirms: it ends at the grace.
        h.clock.advance(by: h.engine.configuration.cancelGraceMilliseconds)
        let failed = try h.engine.submit(Self.spec("failed", key: "f"))
        try h.engine.report(.fail(TaskError(code: "boom", message: "boom")), for: failed.id)
        #expect(cancelled.state == .cancelled && failed.state == .failed)
        for (key, holder) in [("c", cancelled), ("f", failed)] {
            #expect(Self.refusal(h) { () throws(EngineError) in try h.engine.submit(Self.spec("window", key: key, for: 60_000)) }?
                .existing == holder.id)
            let replacement = try h.engine.submit(Self.spec("no window", key: key))
            #expect(replacement.state == .running)
        }
    }

    @Test func aTaskRetentionForgotStillHoldsItsKeyWithinTheWindow() throws {
        let h = EngineHarness { $0.retentionMilliseconds = 100; $0.maxUniqueForMilliseconds = 10_000 }
        let done = try h.engine.submit(Self.spec("done", "noop", key: "k"))
        _ = h.engine.takeUniqueKeyChanges()
        h.clock.advance(by: 200)
        #expect(h.engine.task(done.id) == nil)
        let changes = h.engine.takeUniqueKeyChanges()
        #expect(changes.kept == [UniqueKeyTombstone(queue: "default", key: "k", id: done.id, finishedAt: done.finishedAt!)])
        #expect(Self.refusal(h) { () throws(EngineError) in try h.engine.submit(Self.spec("again", key: "k", for: 5_000)) }?
            .existing == done.id)
        // A new holder replaces the tombstone, which the store then drops.
        let next = try h.engine.submit(Self.spec("next", key: "k"))
        #expect(h.engine.takeUniqueKeyChanges().dropped == [UniqueKeyName(queue: "default", key: "k")])
        #expect(h.engine.uniqueKeyHolder(queue: "default", key: "k") == next.id && h.engine.forgottenUniqueKeyCount == 0)
    }

    @Test func tombstonesGoOnceNoWindowReachesThemOrPastTheLimit() throws {
        let h = EngineHarness { $0.retentionMilliseconds = 100; $0.maxUniqueForMilliseconds = 1_000; $0.maxForgottenUniqueKeys = 2 }
        for key in ["a", "b", "c"] { try h.engine.submit(Self.spec(key, "noop", key: key)) }
        h.clock.advance(by: 200)
        // The oldest went before its time, past the limit.
        #expect(h.engine.forgottenUniqueKeyCount == 2 && h.engine.uniqueKeyHolder(queue: "default", key: "a") == nil)
        #expect(Set(h.engine.takeUniqueKeyChanges().dropped) == [UniqueKeyName(queue: "default", key: "a")])
        h.clock.advance(by: 1_000)
        // The next tombstone made sweeps those no window can reach any more.
        try h.engine.submit(Self.spec("d", "noop", key: "d"))
        h.clock.advance(by: 200)
        #expect(h.engine.forgottenUniqueKeyCount == 1 && h.engine.uniqueKeyHolder(queue: "default", key: "d") != nil)
        let dropped = Set(h.engine.takeUniqueKeyChanges().dropped.map(\.key))
        #expect(dropped == ["b", "c"])
        // A task that finished longer ago than any window leaves none.
        let h2 = EngineHarness { $0.retentionMilliseconds = 5_000; $0.maxUniqueForMilliseconds = 1_000 }
        try h2.engine.submit(Self.spec("e", "noop", key: "e"))
        h2.clock.advance(by: 6_000)
        #expect(h2.engine.forgottenUniqueKeyCount == 0 && h2.engine.takeUniqueKeyChanges().kept.isEmpty)
    }

    @Test func keysAreRestoredFromRecordsAndTombstones() throws {
        let h = EngineHarness { $0.retentionMilliseconds = 100 }
        let running = try h.engine.submit(Self.spec("running", key: "held"))
        let forgotten = try h.engine.submit(Self.spec("forgotten", "noop", key: "gone"))
        h.clock.advance(by: 200)
        let retained = try h.engine.submit(Self.spec("retained", "noop", key: "kept"))
        let tombstones = h.engine.takeUniqueKeyChanges().kept
        let saved = RestoreTests.saved(h.engine)
        let r = EngineHarness(clock: VirtualScheduler(wallClockOrigin: h.clock.wallClock + 1_000))
        try r.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks, uniqueKeys: tombstones)
        // The external task was running outside the process: it still is, and holds its key.
        #expect(r.engine.task(running.id)?.state == .running)
        for (key, holder) in [("held", running), ("gone", forgotten), ("kept", retained)] {
            #expect(Self.refusal(r) { () throws(EngineError) in try r.engine.submit(Self.spec("again", key: key, for: 60_000)) }?
                .existing == holder.id)
        }
        #expect(r.engine.invariantViolations(of: r.engine.tasks.entries.compactMap { $0 }).isEmpty)
    }

    @Test func aTombstoneOlderThanARecordOfItsKeyIsDroppedOnRestore() throws {
        let h = EngineHarness()
        let current = try h.engine.submit(Self.spec("current", key: "k"))
        let saved = RestoreTests.saved(h.engine)
        let stale = UniqueKeyTombstone(queue: "default", key: "k", id: TaskID(high: 1, low: 1), finishedAt: 1)
        let r = EngineHarness(clock: VirtualScheduler(wallClockOrigin: h.clock.wallClock))
        try r.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks, uniqueKeys: [stale])
        #expect(r.engine.uniqueKeyHolder(queue: "default", key: "k") == current.id)
        #expect(r.engine.takeUniqueKeyChanges().dropped == [UniqueKeyName(queue: "default", key: "k")])
    }

    @Test func aWorkflowMemberWithAHeldKeyRefusesTheWholeWorkflow() throws {
        let h = EngineHarness()
        let holder = try h.engine.submit(Self.spec("holder", key: "k"))
        let refused = Self.refusal(h) { () throws(EngineError) in
            _ = try h.engine.submitWorkflow(name: "w", tasks: [
                (key: "a", spec: Self.spec("a", "noop", key: nil)),
                (key: "b", spec: Self.spec("b", "noop", key: "k")),
            ])
        }
        #expect(refused?.existing == holder.id && refused?.field == "tasks[1].unique_key")
        let twice = Self.refusal(h) { () throws(EngineError) in
            _ = try h.engine.submitWorkflow(name: "w", tasks: [
                (key: "a", spec: Self.spec("a", "noop", key: "same")),
                (key: "b", spec: Self.spec("b", "noop", key: "same")),
            ])
        }
        #expect(twice?.field == "tasks[1].unique_key" && twice?.existing == nil)
        // One key in two queues is two keys.
        let workflow = try h.engine.submitWorkflow(name: "w", tasks: [
            (key: "a", spec: Self.spec("a", key: "same")),
            (key: "b", spec: Self.spec("b", key: "same", queue: "other")),
        ])
        #expect(workflow.tasks.allSatisfy { h.engine.uniqueKeyHolder(queue: $0.queue.name, key: "same") == $0.id })
    }

    /// A retry would make a second unfinished task of the key: refused while the task that
    /// replaced it is unfinished, allowed once that finished (the window is a submission's).
    @Test func aRetryOfATaskWhoseKeyAnotherHoldsIsRefused() throws {
        let h = EngineHarness()
        let first = try h.engine.submit(Self.spec("first", key: "k"))
        try h.engine.cancel(first.id)
        h.clock.advance(by: h.engine.configuration.cancelGraceMilliseconds)
        let replacement = try h.engine.submit(Self.spec("replacement", key: "k"))
        let refused = Self.refusal(h) { () throws(EngineError) in try h.engine.retryTask(first.id) }
        #expect(refused?.existing == replacement.id && first.state == .cancelled)
        try h.engine.report(.complete(result: nil), for: replacement.id)
        try h.engine.retryTask(first.id)
        #expect(first.state == .running && h.engine.uniqueKeyHolder(queue: "default", key: "k") == first.id)
        #expect(h.engine.invariantViolations(of: [first, replacement]).isEmpty)
    }

    @Test func badKeysAndWindowsAreInvalid() throws {
        let h = EngineHarness { $0.maxUniqueForMilliseconds = 60_000 }
        let cases: [(TaskSpec, String)] = [
            (Self.spec("empty", key: ""), "unique_key"),
            (Self.spec("long", key: String(repeating: "é", count: 256)), "unique_key"),
            (Self.spec("no key", key: nil, for: 1_000), "unique_for_ms"),
            (Self.spec("zero", key: "k", for: 0), "unique_for_ms"),
            (Self.spec("too long", key: "k", for: 60_001), "unique_for_ms"),
        ]
        for (spec, field) in cases {
            do {
                try h.engine.submit(spec)
                Issue.record("\(spec.name!) was accepted")
            } catch {
                #expect(error.code == .invalid && error.field == field, "\(spec.name!)")
            }
        }
        #expect(h.engine.tasks.count == 0)
        try h.engine.submit(Self.spec("longest", key: String(repeating: "é", count: 255), for: 60_000))
    }
}
