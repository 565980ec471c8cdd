import Testing
import TaskloopJSON
@testable import TaskloopEngine

@Suite struct EngineStateTests {
    @Test func noopSucceedsAtOnceWithFullProgress() throws {
        let h = EngineHarness()
        let task = try h.submit("a")
        #expect(task.state == .succeeded)
        #expect(task.progress.fraction == 1)
        #expect(task.attempt == 1)
        #expect(task.startedAt != nil && task.finishedAt != nil)
        #expect(h.events == ["a:pending->queued", "a:queued->running", "a:running->succeeded"])
        #expect(h.engine.unfinishedCount == 0)
    }

    @Test func sleepReportsStepsThenSucceeds() throws {
        let h = EngineHarness()
        let task = try h.submit("s", "sleep", params: h.sleep(1_000, steps: 4))
        #expect(task.state == .running)
        h.clock.advance(by: 250)
        #expect(task.progress.fraction == 0.25)
        #expect(task.progress.message == "step 1 of 4")
        h.clock.advance(by: 500)
        #expect(task.progress.fraction == 0.75)
        h.clock.advance(by: 249)
        #expect(task.state == .running)
        h.clock.advance(by: 1)
        #expect(task.state == .succeeded)
        #expect(task.progress.fraction == 1)
    }

    @Test func failingSleepFails() throws {
        let h = EngineHarness()
        let task = try h.submit("f", "sleep", params: h.sleep(10, fail: true))
        h.settle()
        #expect(task.state == .failed)
        #expect(task.error?.code == "sleep_failed")
    }

    @Test func lateReportsNeverChangeATerminalState() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(extra: ["manual": manual])
        let task = try h.submit("m", "manual")
        manual.runs[0].succeed(["n": 1])
        manual.runs[0].fail(TaskError(code: "x", message: "late"))
        manual.runs[0].cancelled()
        #expect(!manual.runs[0].progress(fraction: 0.1))
        #expect(task.state == .succeeded)
        #expect(task.result == ["n": 1])
        #expect(task.error == nil)
    }

    @Test func progressNeverMovesBackwardsAndIsClamped() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(extra: ["manual": manual])
        let task = try h.submit("m", "manual")
        let run = manual.runs[0]
        run.progress(fraction: 0.5, message: "half", details: ["bytes": 50])
        run.progress(fraction: 0.2)
        #expect(task.progress.fraction == 0.5)
        #expect(task.progress.message == "half")
        run.progress(fraction: 7)
        #expect(task.progress.fraction == 1)
        run.progress(fraction: .nan, message: "still")
        #expect(task.progress.fraction == 1)
        #expect(task.progress.message == "still")
        #expect(task.progress.details == ["bytes": 50])
    }
}

@Suite struct DependencyTests {
    @Test func dependentWaitsUntilDependencySucceeds() throws {
        let h = EngineHarness()
        let a = try h.submit("a", "sleep", params: h.sleep(100))
        let b = try h.submit("b", after: [a])
        #expect(b.state == .pending)
        #expect(b.dependencies == [a.id])
        h.clock.advance(by: 100)
        #expect(a.state == .succeeded)
        #expect(b.state == .succeeded)
    }

    @Test func failureCascadesCancellationTransitively() throws {
        let h = EngineHarness()
        let a = try h.submit("a", "sleep", params: h.sleep(10, fail: true))
        let b = try h.submit("b", after: [a])
        let c = try h.submit("c", after: [b])
        h.settle()
        #expect(a.state == .failed)
        #expect(b.state == .cancelled)
        #expect(b.error?.code == "dependency_failed")
        #expect(b.error?.details["dependency"] == .string(a.id.description))
        #expect(c.state == .cancelled)
        #expect(c.error?.details["dependency"] == .string(b.id.description))
        #expect(b.startedAt == nil && b.finishedAt != nil)
    }

    @Test func runPolicyRunsAfterAnyOutcome() throws {
        let h = EngineHarness()
        let a = try h.submit("a", "sleep", params: h.sleep(10, fail: true))
        let ok = try h.submit("ok", "sleep", params: h.sleep(20))
        let b = try h.submit("b", after: [a, ok], policy: .run)
        h.clock.advance(by: 10)
        #expect(b.state == .pending)  // still waiting for `ok`
        h.clock.advance(by: 10)
        #expect(b.state == .succeeded)
    }

    @Test func finishedDependenciesApplyAtSubmission() throws {
        let h = EngineHarness()
        let failed = try h.submit("f", "sleep", params: h.sleep(0, steps: 1, fail: true))
        h.settle()
        let cancelled = try h.submit("c", after: [failed])
        let runs = try h.submit("r", after: [failed], policy: .run)
        #expect(cancelled.state == .cancelled)
        #expect(cancelled.error?.code == "dependency_failed")
        #expect(runs.state == .succeeded)
    }

    @Test func badDependenciesAreRefusedAndNothingIsCreated() throws {
        let h = EngineHarness()
        let a = try h.submit("a")
        let before = h.engine.taskCount
        let missing = TaskID(high: 1, low: 2)
        #expect(throws: EngineError.self) { try h.engine.submit(TaskSpec(kind: "noop", dependencies: [.task(missing)])) }
        do {
            try h.engine.submit(TaskSpec(kind: "noop", dependencies: [.task(a.id), .task(a.id)]))
            Issue.record("duplicate accepted")
        } catch {
            #expect(error.code == .duplicateDependency)
            #expect(error.field == "dependencies[1]")
        }
        #expect(h.engine.taskCount == before)
    }

    @Test func invalidSpecsNameTheirField() {
        let h = EngineHarness()
        func field(_ spec: TaskSpec) -> String? {
            do {
                try h.engine.submit(spec)
                return nil
            } catch {
                return error.field
            }
        }
        #expect(field(TaskSpec(kind: "nope")) == "kind")
        #expect(field(TaskSpec(kind: "noop", priority: 9)) == "priority")
        #expect(field(TaskSpec(kind: "noop", queue: "bad queue")) == "queue")
        #expect(field(TaskSpec(kind: "sleep", params: [:])) == "params.duration_ms")
        #expect(field(TaskSpec(kind: "sleep", params: ["duration_ms": -1])) == "params.duration_ms")
        #expect(field(TaskSpec(kind: "sleep", params: ["duration_ms": 1, "steps": 0])) == "params.steps")
        #expect(field(TaskSpec(kind: "sleep", params: ["duration_ms": 1, "outcome": "maybe"])) == "params.outcome")
        #expect(field(TaskSpec(kind: "noop", retry: RetryPolicy(maxAttempts: 0))) == "retry.max_attempts")
        #expect(field(TaskSpec(kind: "noop", retry: RetryPolicy(backoffMilliseconds: 86_400_001))) == "retry.backoff_ms")
        #expect(field(TaskSpec(kind: "noop", retry: RetryPolicy(backoffFactor: .nan))) == "retry.backoff_factor")
        #expect(field(TaskSpec(kind: "noop", timeoutMilliseconds: 604_800_001)) == "timeout_ms")
        #expect(field(TaskSpec(kind: "noop", name: String(repeating: "é", count: 257))) == "name")
        #expect(field(TaskSpec(kind: "noop", name: String(repeating: "é", count: 256))) == nil)
        #expect(h.engine.taskCount == 1)
    }
}

@Suite struct WorkflowTests {
    @Test func siblingsResolveByKeyAndRunInOrder() throws {
        let h = EngineHarness()
        let workflow = try h.engine.submitWorkflow(name: "build", tasks: [
            (key: "fetch", spec: TaskSpec(kind: "sleep", params: h.sleep(100), name: "fetch")),
            (key: "compile", spec: TaskSpec(kind: "sleep", params: h.sleep(100), name: "compile", dependencies: [.sibling(key: "fetch")])),
            (key: "report", spec: TaskSpec(kind: "noop", name: "report", dependencies: [.sibling(key: "compile")])),
        ])
        #expect(workflow.keys.map(\.key) == ["fetch", "compile", "report"])
        #expect(workflow.tasks[1].dependencies == [workflow.tasks[0].id])
        #expect(workflow.state == .running)
        h.clock.advance(by: 150)
        #expect(abs(workflow.fraction - (1 + 0.5 + 0) / 3) < 1e-9)
        h.settle()
        #expect(workflow.state == .succeeded)
        #expect(workflow.tasks.allSatisfy { $0.workflow === workflow })
    }

    @Test func cyclesAreRefusedNamingTheirKeys() {
        let h = EngineHarness()
        do {
            _ = try h.engine.submitWorkflow(name: nil, tasks: [
                (key: "a", spec: TaskSpec(kind: "noop")),
                (key: "b", spec: TaskSpec(kind: "noop", dependencies: [.sibling(key: "d")])),
                (key: "c", spec: TaskSpec(kind: "noop", dependencies: [.sibling(key: "b")])),
                (key: "d", spec: TaskSpec(kind: "noop", dependencies: [.sibling(key: "c"), .sibling(key: "a")])),
            ])
            Issue.record("cycle accepted")
        } catch {
            #expect(error.code == .cycle)
            #expect(Set(error.keys) == ["b", "c", "d"])
        }
        #expect(h.engine.taskCount == 0)
    }

    @Test func selfUnknownAndDuplicateKeysAreRefused() {
        let h = EngineHarness()
        func code(_ tasks: [(key: String, spec: TaskSpec)]) -> EngineError.Code? {
            do {
                _ = try h.engine.submitWorkflow(name: nil, tasks: tasks)
                return nil
            } catch {
                return error.code
            }
        }
        #expect(code([(key: "a", spec: TaskSpec(kind: "noop", dependencies: [.sibling(key: "a")]))]) == .selfDependency)
        #expect(code([(key: "a", spec: TaskSpec(kind: "noop", dependencies: [.sibling(key: "zz")]))]) == .unknownDependency)
        #expect(code([(key: "a", spec: TaskSpec(kind: "noop")), (key: "a", spec: TaskSpec(kind: "noop"))]) == .invalid)
        #expect(code([]) == .invalid)
        #expect(h.engine.taskCount == 0)
    }

    @Test func workflowStateFollowsItsTasks() throws {
        let h = EngineHarness()
        let failing = try h.engine.submitWorkflow(name: nil, tasks: [
            (key: "a", spec: TaskSpec(kind: "sleep", params: h.sleep(10, fail: true))),
            (key: "b", spec: TaskSpec(kind: "noop", dependencies: [.sibling(key: "a")])),
        ])
        let cancelled = try h.engine.submitWorkflow(name: nil, tasks: [
            (key: "a", spec: TaskSpec(kind: "sleep", params: h.sleep(10))),
            (key: "b", spec: TaskSpec(kind: "sleep", params: h.sleep(10))),
        ])
        #expect(try h.engine.cancelWorkflow(cancelled.id) == 2)
        h.settle()
        #expect(failing.state == .failed)
        #expect(cancelled.state == .cancelled)
    }

    /// A running task that confirms its cancellation at once frees its queue's slot in the
    /// middle of the cancellation: nothing of the workflow (or queue) starts in it.
    @Test func cancellingAWorkflowStartsNoneOfItsQueuedTasks() throws {
        let manual = ManualExecutor()
        manual.confirmsCancel = true
        let h = EngineHarness(extra: ["manual": manual])
        try h.engine.updateQueue("q", maxConcurrency: 1)
        // The newer task runs first (cancellations go newest first), the older waits.
        let workflow = try h.engine.submitWorkflow(name: nil, tasks: [
            (key: "a", spec: TaskSpec(kind: "noop", queue: "q")),
            (key: "b", spec: TaskSpec(kind: "manual", queue: "q", priority: 5)),
        ])
        #expect(workflow.tasks.map(\.state) == [.queued, .running])
        #expect(try h.engine.cancelWorkflow(workflow.id) == 2)
        #expect(workflow.tasks.map(\.state) == [.cancelled, .cancelled])
        try h.engine.updateQueue("q", paused: true)
        let waiting = try h.submit("c", "noop", queue: "q")
        let running = try h.submit("d", "manual", queue: "q", priority: 5)
        try h.engine.updateQueue("q", paused: false)
        #expect(waiting.state == .queued && running.state == .running)
        #expect(h.engine.cancelAll(inQueue: "q") == 2)
        #expect(waiting.state == .cancelled && running.state == .cancelled)
    }
}

@Suite struct QueueTests {
    @Test func higherPriorityFirstThenSubmissionOrder() throws {
        let h = EngineHarness()
        try h.engine.updateQueue("q", maxConcurrency: 1, paused: true)
        for (name, priority) in [("low", -4), ("mid1", 0), ("high", 8), ("mid2", 0), ("top", 8)] {
            try h.submit(name, "sleep", params: h.sleep(10, steps: 1), queue: "q", priority: priority)
        }
        h.events.removeAll()
        try h.engine.updateQueue("q", paused: false)
        h.settle()
        let starts = h.events.filter { $0.hasSuffix("queued->running") }.map { $0.split(separator: ":")[0] }
        #expect(starts == ["high", "top", "mid1", "mid2", "low"])
    }

    @Test func concurrencyLimitHoldsAndChangesTakeEffectAtOnce() throws {
        let h = EngineHarness()
        try h.engine.updateQueue("q", maxConcurrency: 3)
        let tasks = try (0..<10).map { try h.submit("t\($0)", "sleep", params: h.sleep(100, steps: 1), queue: "q") }
        let queue = h.engine.queue(named: "q")
        #expect(queue.running == 3)
        #expect(queue.counts[.queued] == 7)
        try h.engine.updateQueue("q", maxConcurrency: 5)
        #expect(queue.running == 5)
        h.settle()
        #expect(tasks.allSatisfy { $0.state == .succeeded })
        #expect(queue.counts[.succeeded] == 10)
    }

    @Test func pausedQueueStartsNothingNewButRunningGoOn() throws {
        let h = EngineHarness()
        try h.engine.updateQueue("q", maxConcurrency: 1)
        let first = try h.submit("first", "sleep", params: h.sleep(100, steps: 1), queue: "q")
        let second = try h.submit("second", "sleep", params: h.sleep(100, steps: 1), queue: "q")
        try h.engine.updateQueue("q", paused: true)
        h.clock.advance(by: 100)
        #expect(first.state == .succeeded)
        #expect(second.state == .queued)
        try h.engine.updateQueue("q", paused: false)
        #expect(second.state == .running)
    }

    @Test func cancelAllInAQueue() throws {
        let h = EngineHarness()
        try h.engine.updateQueue("q", maxConcurrency: 1)
        let a = try h.submit("a", "sleep", params: h.sleep(100), queue: "q")
        let b = try h.submit("b", "sleep", params: h.sleep(100), queue: "q")
        let c = try h.submit("c", after: [b], policy: .cancel)
        let other = try h.submit("other", "sleep", params: h.sleep(100))
        #expect(h.engine.cancelAll(inQueue: "q") == 2)
        #expect(a.state == .cancelled && b.state == .cancelled)
        #expect(c.state == .cancelled && c.error?.code == "dependency_failed")
        #expect(other.state == .running)
    }
}

@Suite struct CancellationTests {
    @Test func cancellingWaitingTasksFinishesThemAtOnce() throws {
        let h = EngineHarness()
        let blocker = try h.submit("blocker", "sleep", params: h.sleep(100))
        let pending = try h.submit("pending", after: [blocker])
        try h.engine.updateQueue("p", paused: true)
        let queued = try h.submit("queued", queue: "p")
        #expect(try h.engine.cancel(pending.id) == .cancelled)
        #expect(try h.engine.cancel(queued.id) == .cancelled)
        #expect(pending.startedAt == nil && pending.finishedAt != nil)
        #expect(queued.state == .cancelled)
        #expect(throws: EngineError.self) { try h.engine.cancel(queued.id) }
    }

    @Test func cancellingASleepStopsItsTimerAtOnce() throws {
        let h = EngineHarness()
        let task = try h.submit("s", "sleep", params: h.sleep(10_000))
        #expect(try h.engine.cancel(task.id) == .cancelled)
        #expect(task.state == .cancelled)
        #expect(h.clock.nextDeadline == nil || h.clock.nextDeadline! > 10_000)
    }

    @Test func runningTaskWaitsForItsExecutorToConfirm() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(extra: ["manual": manual])
        let task = try h.submit("m", "manual")
        #expect(try h.engine.cancel(task.id) == .cancelRequested)
        #expect(task.state == .running && task.cancelRequested)
        #expect(manual.cancelRequests == 1)
        #expect(try h.engine.cancel(task.id) == .cancelRequested)
        #expect(manual.cancelRequests == 1)
        manual.runs[0].cancelled()
        #expect(task.state == .cancelled)
    }

    /// An attempt that states its own grace (an `exec` with a long `grace_ms`) is waited for
    /// that long, not the engine's default.
    @Test func anAttemptsOwnGraceReplacesTheDefault() throws {
        let manual = ManualExecutor()
        manual.stopGrace = 30_000
        let h = EngineHarness(configure: { $0.cancelGraceMilliseconds = 500 }, extra: ["manual": manual])
        let task = try h.submit("m", "manual")
        try h.engine.cancel(task.id)
        h.clock.advance(by: 29_999)
        #expect(task.state == .running && task.cancelRequested)
        h.clock.advance(by: 1)
        #expect(task.state == .cancelled)
    }

    @Test func unconfirmedCancellationEndsAfterTheGracePeriod() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(configure: { $0.cancelGraceMilliseconds = 500 }, extra: ["manual": manual])
        let task = try h.submit("m", "manual")
        try h.engine.cancel(task.id)
        h.clock.advance(by: 499)
        #expect(task.state == .running)
        h.clock.advance(by: 1)
        #expect(task.state == .cancelled)
        manual.runs[0].succeed()
        #expect(task.state == .cancelled)
    }

    @Test func externalWorkerLearnsOfCancellationOnItsNextReport() throws {
        let h = EngineHarness()
        let task = try h.submit("x", "external")
        try h.engine.report(.progress(fraction: 0.3, message: "working", details: nil), for: task.id)
        #expect(task.progress.fraction == 0.3)
        #expect(try h.engine.cancel(task.id) == .cancelRequested)
        do {
            try h.engine.report(.progress(fraction: 0.4, message: nil, details: nil), for: task.id)
            Issue.record("report accepted after cancel")
        } catch {
            #expect(error.code == .notRunning)
        }
        #expect(task.state == .cancelled)
    }
}

@Suite struct TimeoutAndRetryTests {
    @Test func timedOutAttemptFailsAndStopsTheWork() throws {
        let manual = ManualExecutor()
        let h = EngineHarness(extra: ["manual": manual])
        let task = try h.submit("m", "manual", timeout: 100)
        h.clock.advance(by: 100)
        #expect(task.state == .failed)
        #expect(task.error?.code == "timeout")
        #expect(manual.cancelRequests == 1)
    }

    /// `sleep` confirms a stop at once, from inside the stop request; a timeout must still end
    /// the task as failed with `timeout`, not as cancelled.
    @Test func timeoutOfAnExecutorThatStopsAtOnceIsStillATimeout() throws {
        let h = EngineHarness()
        let task = try h.submit("s", "sleep", params: h.sleep(1_000, steps: 1, fail: false), timeout: 100)
        h.clock.advance(by: 100)
        #expect(task.state == .failed)
        #expect(task.error?.code == "timeout")
    }

    @Test func retriesBackOffExponentiallyAndCountAttempts() throws {
        let h = EngineHarness()
        let task = try h.submit("r", "sleep", params: h.sleep(10, steps: 1, fail: true),
                                retry: RetryPolicy(maxAttempts: 3, backoffMilliseconds: 100, backoffFactor: 2))
        h.clock.advance(by: 10)       // attempt 1 fails at 10
        #expect(task.state == .pending)
        #expect(task.attempt == 2)
        #expect(task.error?.code == "sleep_failed")
        h.clock.advance(by: 99)
        #expect(task.state == .pending)
        h.clock.advance(by: 1)        // backoff 100 -> attempt 2 starts at 110
        #expect(task.state == .running)
        #expect(task.progress.fraction == nil)
        h.clock.advance(by: 10 + 200) // fails at 120, backoff 200 -> attempt 3 at 320
        #expect(task.state == .running)
        #expect(task.attempt == 3)
        h.clock.advance(by: 10)
        #expect(task.state == .failed)
        #expect(task.attempt == 3)
    }

    @Test func retriedTaskCanSucceedAndReleaseDependents() throws {
        final class Flaky: TaskExecutor {
            func validate(_ params: JSONValue) throws(EngineError) {}
            func start(_ run: TaskRun) {
                if run.attempt == 1 { run.fail(TaskError(code: "flaky", message: "first try")) } else { run.succeed("ok") }
            }
        }
        let h = EngineHarness(extra: ["flaky": Flaky()])
        let task = try h.submit("f", "flaky", retry: RetryPolicy(maxAttempts: 2, backoffMilliseconds: 50))
        let after = try h.submit("after", after: [task])
        h.settle()
        #expect(task.state == .succeeded)
        #expect(task.result == "ok")
        #expect(task.error == nil)
        #expect(after.state == .succeeded)
    }

    @Test func externalHeartbeatTimeoutFailsTheAttempt() throws {
        let h = EngineHarness()
        let task = try h.submit("x", "external", params: ["heartbeat_timeout_ms": 100])
        h.clock.advance(by: 90)
        try h.engine.report(.progress(fraction: 0.5, message: nil, details: nil), for: task.id)
        h.clock.advance(by: 90)
        #expect(task.state == .running)
        h.clock.advance(by: 10)
        #expect(task.state == .failed)
        #expect(task.error?.code == "heartbeat_timeout")
        #expect(throws: EngineError.self) { try h.engine.report(.complete(result: nil), for: task.id) }
    }
}

@Suite struct RetentionAndLimitTests {
    @Test func terminalTasksAreEvictedByCountOldestFirst() throws {
        let h = EngineHarness(configure: { $0.maxRetainedTasks = 2 })
        let tasks = try (0..<4).map { try h.submit("t\($0)") }
        #expect(h.engine.task(tasks[0].id) == nil)
        #expect(h.engine.task(tasks[1].id) == nil)
        #expect(h.engine.task(tasks[3].id) != nil)
        #expect(h.engine.queue(named: "default").counts[.succeeded] == 2)
    }

    @Test func terminalTasksAreEvictedAfterTheRetentionPeriod() throws {
        let h = EngineHarness(configure: { $0.retentionMilliseconds = 1_000 })
        let early = try h.submit("early")
        h.clock.advance(by: 600)
        let late = try h.submit("late")
        h.clock.advance(by: 400)
        #expect(h.engine.task(early.id) == nil)
        #expect(h.engine.task(late.id) != nil)
        h.clock.advance(by: 600)
        #expect(h.engine.task(late.id) == nil)
    }

    @Test func submissionsBeyondTheUnfinishedLimitAreRefused() throws {
        let h = EngineHarness(configure: { $0.maxUnfinishedTasks = 2 })
        try h.submit("a", "sleep", params: h.sleep(100))
        try h.submit("b", "sleep", params: h.sleep(100))
        do {
            try h.submit("c")
            Issue.record("accepted over the limit")
        } catch {
            #expect(error.code == .tooManyUnfinishedTasks)
        }
        #expect(h.engine.taskCount == 2)
        h.settle()
        #expect(throws: Never.self) { try h.submit("d") }
    }

    /// A workflow task may depend on a sibling listed after it (before, building the
    /// dependency ids indexed past the records made so far, and the server crashed).
    @Test func workflowTasksMayDependOnSiblingsListedLater() throws {
        let h = EngineHarness()
        let workflow = try h.engine.submitWorkflow(name: nil, tasks: [
            ("report", TaskSpec(kind: "noop", name: "report", dependencies: [.sibling(key: "fetch"), .sibling(key: "parse")])),
            ("parse", TaskSpec(kind: "noop", name: "parse", dependencies: [.sibling(key: "fetch")])),
            ("fetch", TaskSpec(kind: "sleep", params: h.sleep(10), name: "fetch")),
        ])
        let ids = Dictionary(uniqueKeysWithValues: workflow.keys.map { ($0.key, $0.id) })
        #expect(workflow.tasks[0].dependencies == [ids["fetch"]!, ids["parse"]!])
        #expect(workflow.tasks.map(\.id) == workflow.tasks.map(\.id).sorted())
        h.settle()
        #expect(workflow.state == .succeeded)
        let parsed = try #require(h.events.firstIndex(of: "parse:running->succeeded"))
        let reportStarted = try #require(h.events.firstIndex(of: "report:queued->running"))
        #expect(parsed < reportStarted)
    }

    @Test func queuesAreBoundedAndIdleOnesForgotten() throws {
        let h = EngineHarness {
            $0.maxQueues = 3
            $0.retentionMilliseconds = 1_000
        }
        try h.submit("a1", "sleep", params: h.sleep(100), queue: "a")
        try h.submit("b1", "sleep", params: h.sleep(100), queue: "b")
        // default, a and b hold tasks: a fourth queue is refused, by submit and by PATCH alike.
        for attempt in [{ _ = try h.submit("c1", queue: "c") }, { _ = try h.engine.updateQueue("c", paused: true) }] {
            do {
                try attempt()
                Issue.record("a fourth queue was accepted")
            } catch let error as EngineError {
                #expect(error.code == .tooManyQueues)
            }
        }
        #expect(h.engine.queues.count == 3 && h.engine.taskCount == 2)
        h.clock.advance(by: 100)
        h.clock.advance(by: 1_000)  // a1 and b1 finished and were evicted: a and b are idle and forgotten
        #expect(h.engine.taskCount == 0)
        #expect(Set(h.engine.queues.keys) == ["default"])
        _ = try h.engine.updateQueue("slow", maxConcurrency: 1)   // not default: kept while empty
        _ = try h.engine.updateQueue("idle")                       // default settings, no task
        // A workflow that needs two new queues at once is refused whole.
        do {
            _ = try h.engine.submitWorkflow(name: nil, tasks: [("x", TaskSpec(kind: "noop", queue: "x")),
                                                               ("y", TaskSpec(kind: "noop", queue: "y"))])
            Issue.record("two new queues over the limit were accepted")
        } catch {
            #expect(error.code == .tooManyQueues)
        }
        // One new queue fits once the idle one is forgotten to make room.
        try h.submit("x1", queue: "x")
        #expect(Set(h.engine.queues.keys) == ["default", "slow", "x"])
    }
}

@Suite struct TaskIDTests {
    @Test func idsAreUniqueIncreasingAndRoundTrip() {
        var generator = TaskIDGenerator()
        var previous = generator.next(wallClockMilliseconds: 1_000)
        for step in 0..<10_000 {
            // The wall clock stands still and even steps back now and then.
            let id = generator.next(wallClockMilliseconds: 1_000 + Int64(step / 100) - (step % 333 == 0 ? 5 : 0))
            #expect(id > previous)
            #expect(id.description > previous.description)
            #expect(TaskID(id.description) == id)
            previous = id
        }
        #expect(previous.description.count == 26)
        #expect(TaskID(previous.description.lowercased()) == previous)
        #expect(TaskID("not-an-id") == nil)
        #expect(TaskID("8ZZZZZZZZZZZZZZZZZZZZZZZZZ") == nil)
    }
}
