import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Explicit retry on the virtual clock: a new attempt for a failed or cancelled task, its
/// `dependency_failed` dependents waiting again (transitively), workflows, limits, and
/// retention after a retry.
@Suite struct RetryTests {
    @Test func aFailedTaskGetsANewAttemptAndItsCancelledDependentsWaitAgain() throws {
        let h = EngineHarness()
        var violations: [String] = []
        h.engine.addObserver { settled in
            violations += h.engine.invariantViolations(of: settled.compactMap(LeaseTests.Harness.record))
        }
        let failing = try h.submit("failing", "sleep", params: h.sleep(10, fail: true), retry: RetryPolicy(maxAttempts: 1))
        let child = try h.submit("child", "sleep", params: h.sleep(10), after: [failing])
        let grandchild = try h.submit("grandchild", after: [child])
        let runs = try h.submit("runs", after: [failing], policy: .run)
        h.settle()
        #expect(failing.state == .failed && child.state == .cancelled && grandchild.state == .cancelled)
        #expect(runs.state == .succeeded)
        #expect(throws: EngineError.self) { try h.engine.retryTask(runs.id) }
        h.events.removeAll()
        try h.engine.retryTask(failing.id)
        #expect(failing.state == .running && failing.attempt == 2 && failing.maxAttempts == 2)
        #expect(failing.finishedAt == nil && failing.result == nil)
        #expect(child.state == .pending && child.error == nil && child.attempt == 1)
        #expect(grandchild.state == .pending)
        #expect(h.events == ["failing:failed->pending", "child:cancelled->pending", "grandchild:cancelled->pending",
                             "failing:pending->queued", "failing:queued->running"])
        h.settle()
        // The sleep fails again (its params say so): the dependents are cancelled again.
        #expect(failing.state == .failed && child.state == .cancelled && grandchild.state == .cancelled)
        #expect(violations.isEmpty, "\(violations)")
    }

    @Test func retryingADependentOfAStillFailedTaskCancelsItAgainAtOnce() throws {
        let h = EngineHarness()
        let failing = try h.submit("failing", "sleep", params: h.sleep(10, fail: true))
        let child = try h.submit("child", after: [failing])
        h.settle()
        try h.engine.retryTask(child.id)
        #expect(child.state == .cancelled && child.attempt == 2 && child.error?.code == "dependency_failed")
    }

    @Test func aWorkflowRetryCountsEveryTaskThatLeftATerminalState() throws {
        let h = EngineHarness()
        let workflow = try h.engine.submitWorkflow(name: "w", tasks: [
            (key: "a", spec: TaskSpec(kind: "sleep", params: h.sleep(10, fail: true), name: "a")),
            (key: "b", spec: TaskSpec(kind: "noop", name: "b", dependencies: [.sibling(key: "a")])),
            (key: "c", spec: TaskSpec(kind: "noop", name: "c")),
        ])
        h.settle()
        #expect(workflow.state == .failed)
        #expect(try h.engine.retryWorkflow(workflow.id) == 2)
        #expect(workflow.state == .running)
        h.settle()
        #expect(try h.engine.retryWorkflow(workflow.id) == 2)
        #expect(throws: EngineError.self) { try h.engine.retryWorkflow(TaskID(high: 1, low: 7)) }
    }

    @Test func theUnfinishedLimitHoldsAndChangesNothing() throws {
        let h = EngineHarness { $0.maxUnfinishedTasks = 2 }
        let failing = try h.submit("failing", "sleep", params: h.sleep(10, fail: true))
        let child = try h.submit("child", after: [failing])
        h.settle()
        try h.submit("blocker", "sleep", params: h.sleep(100_000))
        do {
            try h.engine.retryTask(failing.id)
            Issue.record("the limit was passed")
        } catch {
            #expect(error.code == .tooManyUnfinishedTasks)
        }
        #expect(failing.state == .failed && child.state == .cancelled && failing.attempt == 1)
    }

    @Test func aRetriedTaskIsRetainedAgainOnlyFromItsNewEnd() throws {
        let h = EngineHarness { $0.maxRetainedTasks = 3; $0.retentionMilliseconds = 1_000 }
        let failing = try h.submit("failing", "sleep", params: h.sleep(10, fail: true))
        h.clock.advance(by: 510)
        try h.engine.retryTask(failing.id)
        h.clock.advance(by: 10)
        #expect(failing.state == .failed && failing.attempt == 2)
        // Its first retention entry is stale: with two more finished tasks, three are kept.
        try h.submit("x")
        try h.submit("y")
        #expect(h.engine.task(failing.id) != nil)
        // Past a second after its first end, not its second.
        h.clock.advance(by: 600)
        #expect(h.engine.task(failing.id) != nil)
        h.clock.advance(by: 500)
        #expect(h.engine.task(failing.id) == nil)
    }
}
