import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// An engine rebuilt from its own snapshots, as after a restart: it answers as before, and what
/// was running when the process died ends its attempt as `interrupted`.
@Suite struct RestoreTests {
    /// Everything a store would hold of `engine`: every task, workflow and queue.
    static func saved(_ engine: Engine) -> (queues: [QueueSnapshot], workflows: [WorkflowSnapshot], tasks: [TaskSnapshot]) {
        let tasks = engine.tasks.entries.compactMap { $0 }.map { engine.snapshot(of: $0) }
        let workflowIDs = Set(tasks.compactMap(\.workflow))
        let workflows = workflowIDs.compactMap { engine.workflow($0) }.map { engine.snapshot(of: $0) }
        let queues = engine.queues.values.map { engine.snapshot(of: $0) }
        return (queues, workflows, tasks)
    }

    /// A second engine on a clock `later` milliseconds of wall time past the first's.
    static func restored(from original: EngineHarness, later: Int64 = 0,
                         configure: (inout EngineConfiguration) -> Void = { _ in }) throws -> EngineHarness {
        let saved = Self.saved(original.engine)
        let harness = EngineHarness(configure: configure, clock: VirtualScheduler(wallClockOrigin: original.clock.wallClock + later))
        try harness.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks)
        return harness
    }

    /// A dependency that released its dependent and was then retried does not hold it up
    /// again after a restart, as it did not before.
    @Test func aRetriedDependencyDoesNotHoldUpWhatItReleasedAfterARestart() throws {
        let h = EngineHarness()
        let dependency = try h.submit("dependency", "sleep", params: h.sleep(10, fail: true), queue: "slow")
        let other = try h.submit("other", "sleep", params: h.sleep(1_000))
        let dependent = try h.submit("dependent", after: [dependency, other], policy: .run)
        h.clock.advance(by: 20)
        try h.engine.updateQueue("slow", paused: true)
        try h.engine.retryTask(dependency.id)
        #expect(dependency.state == .queued && other.state == .running)
        #expect(dependent.releasedBy == [dependency.id] && dependent.blockingDependencies == 1)
        let r = try Self.restored(from: h)
        // The restart interrupted `other`, which failed; under `run` that releases the dependent,
        // and nothing else holds it: the retried dependency, still queued, released it before.
        #expect(r.engine.task(other.id)?.state == .failed && r.engine.task(dependency.id)?.state == .queued)
        #expect(r.engine.task(dependent.id)?.state == .succeeded)
        #expect(r.engine.invariantViolations(of: r.engine.tasks.entries.compactMap { $0 }).isEmpty)
    }

    @Test func aRestoredEngineAnswersAsBefore() throws {
        let h = EngineHarness()
        let done = try h.submit("done")
        let failed = try h.submit("failed", "sleep", params: h.sleep(10, fail: true))
        let first = try h.submit("first", "sleep", params: h.sleep(1_000))
        let second = try h.submit("second", "sleep", params: h.sleep(1_000), after: [first])
        let third = try h.submit("third", after: [second])
        try h.engine.updateQueue("held", maxConcurrency: 5, paused: true)
        let held = try h.submit("held", queue: "held", priority: 3)
        let workflow = try h.engine.submitWorkflow(name: "pair", tasks: [
            (key: "a", spec: TaskSpec(kind: "noop", name: "wa", metadata: ["owner": "me"])),
            (key: "b", spec: TaskSpec(kind: "noop", name: "wb", queue: "held", dependencies: [.sibling(key: "a")])),
        ])
        let cancelled = try h.submit("cancelled", queue: "held")
        try h.engine.cancel(cancelled.id)
        h.clock.advance(by: 100)
        #expect(first.state == .running && second.state == .pending && held.state == .queued && failed.state == .failed)

        let saved = Self.saved(h.engine)
        let r = try Self.restored(from: h)
        // All but the running sleep and its two dependents, which its interruption ends.
        for task in saved.tasks where ![first.id, second.id, third.id].contains(task.id) {
            #expect(r.engine.task(task.id).map { r.engine.snapshot(of: $0) } == task, "\(task.name ?? "?")")
        }
        #expect(r.engine.queues["held"].map { r.engine.snapshot(of: $0) } == QueueSnapshot(name: "held", maxConcurrency: 5, paused: true))
        let restoredWorkflow = try #require(r.engine.workflow(workflow.id))
        #expect(restoredWorkflow.keys.map(\.key) == ["a", "b"] && restoredWorkflow.state == .running)
        #expect(r.engine.invariantViolations(of: r.engine.tasks.entries.compactMap { $0 }).isEmpty)
        #expect(h.engine.unfinishedCount == 5 && r.engine.unfinishedCount == 2, "held and wb wait on the paused queue")
        _ = done
        _ = third

        // The running sleep lost its attempt; with one attempt allowed it failed, and took its
        // dependents with it.
        let restoredFirst = try #require(r.engine.task(first.id))
        #expect(restoredFirst.state == .failed && restoredFirst.error?.code == "interrupted")
        #expect(r.engine.task(second.id)?.error?.code == "dependency_failed")
        #expect(r.engine.task(third.id)?.state == .cancelled)
        #expect(r.events.contains("first:running->failed"))

        // And it goes on: new ids sort after the restored ones, and the held queue runs once
        // resumed.
        let next = try r.submit("next")
        #expect(next.id > workflow.id && next.state == .succeeded)
        try r.engine.updateQueue("held", paused: false)
        r.settle()
        #expect(r.engine.task(held.id)?.state == .succeeded)
        #expect(r.engine.workflow(workflow.id)?.state == .succeeded)
    }

    @Test func anInterruptedAttemptIsRetriedAndACancellationUnderWayCompletes() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(extra: ["manual": manual])
        let retried = try h.submit("retried", "manual", retry: RetryPolicy(maxAttempts: 2, backoffMilliseconds: 500))
        let stopping = try h.submit("stopping", "manual")
        try h.engine.cancel(stopping.id)
        #expect(retried.state == .running && stopping.state == .running && stopping.cancelRequested)
        let restoredManual = ManualExecutor()
        let saved = Self.saved(h.engine)
        let r = EngineHarness(extra: ["manual": restoredManual], clock: VirtualScheduler(wallClockOrigin: h.clock.wallClock))
        try r.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks)
        #expect(r.engine.task(stopping.id)?.state == .cancelled)
        let again = try #require(r.engine.task(retried.id))
        #expect(again.state == .pending && again.attempt == 2 && again.error?.code == "interrupted")
        r.clock.advance(by: 499)
        #expect(again.state == .pending)
        r.clock.advance(by: 1)
        #expect(again.state == .running && restoredManual.runs.count == 1)
    }

    /// A retry's backoff is a wall time: whatever of it passed while the server was down counts.
    @Test func backoffResumesFromWallTime() throws {
        let h = EngineHarness()
        let task = try h.submit("flaky", "sleep", params: h.sleep(10, fail: true),
                                retry: RetryPolicy(maxAttempts: 2, backoffMilliseconds: 1_000))
        h.clock.advance(by: 10)
        #expect(task.state == .pending && task.notBefore == h.clock.wallClock + 1_000)
        let soon = try Self.restored(from: h, later: 400)
        let soonTask = try #require(soon.engine.task(task.id))
        soon.clock.advance(by: 599)
        #expect(soonTask.state == .pending)
        soon.clock.advance(by: 1)
        #expect(soonTask.state == .running)
        let late = try Self.restored(from: h, later: 5_000)
        #expect(late.engine.task(task.id)?.state == .running, "a backoff that ran out while down ends at once")
    }

    @Test func aKindThisServerDoesNotRunRefusesTheRestore() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(extra: ["manual": manual])
        _ = try h.submit("m", "manual")
        let saved = Self.saved(h.engine)
        let r = EngineHarness()
        #expect(throws: EngineError.self) {
            try r.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks)
        }
        #expect(r.engine.taskCount == 0 && r.events.isEmpty)
    }

    /// Retention goes by finishing time across the restart: what aged out while down goes.
    @Test func retentionCountsTheTimeDown() throws {
        let h = EngineHarness { $0.retentionMilliseconds = 10_000 }
        let old = try h.submit("old")
        h.clock.advance(by: 6_000)
        let young = try h.submit("young")
        let r = try Self.restored(from: h, later: 5_000) { $0.retentionMilliseconds = 10_000 }
        #expect(r.engine.task(old.id) == nil, "finished 11 s ago")
        #expect(r.engine.task(young.id) != nil)
        r.clock.advance(by: 5_000)
        #expect(r.engine.task(young.id) == nil)
    }
}

@Suite struct SuspendTests {
    /// SIGTERM with durability: running work goes back to `queued`, attempt not consumed, and
    /// nothing starts any more; a cancellation under way completes.
    @Test func suspendingRequeuesRunningWorkWithItsAttempt() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(extra: ["manual": manual])
        let running = try h.submit("running", "manual", retry: RetryPolicy(maxAttempts: 3))
        let stopping = try h.submit("stopping", "manual")
        try h.engine.cancel(stopping.id)
        let waiting = try h.submit("waiting", "manual")
        #expect(waiting.state == .queued)
        #expect(h.engine.suspendForShutdown() == 1)
        #expect(running.state == .queued && running.attempt == 1 && manual.cancelRequests == 2)
        #expect(stopping.state == .cancelled)
        _ = try h.submit("late", "manual")
        h.settle()
        #expect(manual.runs.count == 2, "nothing started after the suspension")
        let saved = RestoreTests.saved(h.engine)
        let again = ManualExecutor()
        let r = EngineHarness(extra: ["manual": again], clock: VirtualScheduler(wallClockOrigin: h.clock.wallClock))
        try r.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks)
        #expect(r.engine.task(running.id)?.state == .running && r.engine.task(running.id)?.attempt == 1)
        #expect(again.runs.map(\.taskID).first == running.id, "it runs first again, in its old place in the queue")
    }
}
