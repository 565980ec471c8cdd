import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// `run_at`/`delay_ms` (the `scheduled` state) and expiry on the virtual clock: when a task
/// leaves `scheduled`, how it meets dependencies, cancellation, retries and restarts, and a
/// wall clock set forward or back.
@Suite struct ScheduledTaskTests {
    /// A harness whose observer collects the engine's broken rules after every settled call.
    final class Checked {
        let h: EngineHarness
        var violations: [String] = []

        init(configure: (inout EngineConfiguration) -> Void = { _ in }, extra: [String: TaskExecutor] = [:],
             clock: VirtualScheduler = VirtualScheduler()) {
            h = EngineHarness(configure: configure, extra: extra, clock: clock)
            h.engine.addObserver { [unowned self] settled in
                violations += h.engine.invariantViolations(of: settled.compactMap(LeaseTests.Harness.record))
            }
        }

        func submit(_ name: String, _ kind: String = "noop", params: JSONValue = [:], queue: String = "default",
                    after dependencies: [TaskRecord] = [], runAt: TaskTime? = nil, expiry: TaskTime? = nil) throws(EngineError) -> TaskRecord {
            try h.engine.submit(TaskSpec(kind: kind, params: params, name: name, queue: queue,
                                         dependencies: dependencies.map { .task($0.id) }, runAt: runAt, expiry: expiry))
        }
    }

    @Test func aDelayedTaskWaitsScheduledUntilItsTimeToTheMillisecond() throws {
        let c = Checked()
        let submittedAt = c.h.clock.wallClock
        let task = try c.submit("later", runAt: .after(5_000))
        #expect(task.state == .scheduled && task.scheduledFor == submittedAt + 5_000)
        #expect(c.h.events == ["later:pending->scheduled"])
        c.h.clock.advance(by: 4_999)
        #expect(task.state == .scheduled && task.queue.counts[.scheduled] == 1)
        c.h.clock.advance(by: 1)
        #expect(task.state == .succeeded)
        #expect(c.h.events == ["later:pending->scheduled", "later:scheduled->pending", "later:pending->queued",
                               "later:queued->running", "later:running->succeeded"])
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    @Test func aRunAtThatHasPassedRunsAtOnceAndKeepsItsTime() throws {
        let c = Checked()
        let past = c.h.clock.wallClock - 60_000
        let task = try c.submit("overdue", runAt: .at(past))
        #expect(task.state == .succeeded && task.scheduledFor == past)
        #expect(!c.h.events.contains { $0.contains("scheduled") })
    }

    @Test func cancellingAScheduledTaskEndsItAndItNeverStarts() throws {
        let c = Checked()
        let task = try c.submit("later", runAt: .after(1_000))
        #expect(try c.h.engine.cancel(task.id) == .cancelled)
        #expect(task.state == .cancelled && task.error?.code == "cancelled")
        c.h.clock.advance(by: 5_000)
        #expect(task.state == .cancelled && task.startedAt == nil)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    /// Its time and its dependencies both hold it: it runs once the later of the two has come.
    @Test func aScheduledTaskAlsoWaitsForItsDependencies() throws {
        let c = Checked()
        let slow = try c.submit("slow", "sleep", params: c.h.sleep(3_000))
        let early = try c.submit("early", after: [slow], runAt: .after(1_000))
        let fast = try c.submit("fast", "sleep", params: c.h.sleep(500), queue: "other")
        let late = try c.submit("late", after: [fast], runAt: .after(2_000))
        c.h.clock.advance(by: 1_000)
        #expect(early.state == .pending && slow.state == .running)
        #expect(late.state == .scheduled && fast.state == .succeeded)
        c.h.clock.advance(by: 1_000)
        #expect(late.state == .succeeded)
        #expect(early.state == .pending)
        c.h.clock.advance(by: 1_000)
        #expect(slow.state == .succeeded && early.state == .succeeded)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    @Test func aFailedDependencyCancelsAScheduledDependent() throws {
        let c = Checked()
        let failing = try c.submit("failing", "sleep", params: c.h.sleep(100, fail: true))
        let dependent = try c.submit("dependent", after: [failing], runAt: .after(10_000))
        c.h.clock.advance(by: 100)
        #expect(dependent.state == .cancelled && dependent.error?.code == "dependency_failed")
        c.h.clock.advance(by: 20_000)
        #expect(dependent.startedAt == nil)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    @Test func aTaskThatHasNotStartedByItsExpiryIsCancelledAsExpired() throws {
        let c = Checked { $0.defaultConcurrency = 1 }
        let blocker = try c.submit("blocker", "sleep", params: c.h.sleep(10_000))
        let waiting = try c.submit("waiting", expiry: .after(2_000))
        let expiresAt = try #require(waiting.expiresAt)
        let dependent = try c.submit("dependent", queue: "other", after: [waiting])
        c.h.clock.advance(by: 1_999)
        #expect(waiting.state == .queued)
        c.h.clock.advance(by: 1)
        #expect(waiting.state == .cancelled && waiting.error?.code == "expired")
        #expect(waiting.error?.details["expires_at_ms"] == .int(expiresAt))
        #expect(dependent.state == .cancelled && dependent.error?.code == "dependency_failed")
        c.h.clock.advance(by: 10_000)
        #expect(blocker.state == .succeeded && waiting.startedAt == nil)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    /// Room opens in its queue after its expiry came, with the clock set forward: it is not started.
    @Test func aTaskWhoseExpiryCameIsNeverStarted() throws {
        let c = Checked { $0.defaultConcurrency = 1 }
        let blocker = try c.submit("blocker", "sleep", params: c.h.sleep(5_000))
        let task = try c.submit("task", expiry: .after(10_000))
        c.h.clock.advance(by: 4_999)
        c.h.clock.wallClockSkew = 7_000
        c.h.clock.advance(by: 1)
        #expect(blocker.state == .succeeded)
        #expect(task.state == .cancelled && task.error?.code == "expired" && task.startedAt == nil)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    @Test func aTaskThatStartedBeforeItsExpiryRunsOn() throws {
        let c = Checked()
        let task = try c.submit("task", "sleep", params: c.h.sleep(5_000), expiry: .after(1_000))
        c.h.clock.advance(by: 1_000)
        #expect(task.state == .running)
        c.h.clock.advance(by: 4_000)
        #expect(task.state == .succeeded)
    }

    @Test func aScheduledTaskExpiresIfItsDependencyHoldsItPastTheExpiry() throws {
        let c = Checked()
        let slow = try c.submit("slow", "sleep", params: c.h.sleep(10_000))
        let task = try c.submit("task", after: [slow], runAt: .after(1_000), expiry: .after(3_000))
        c.h.clock.advance(by: 1_000)
        #expect(task.state == .pending)
        c.h.clock.advance(by: 2_000)
        #expect(task.state == .cancelled && task.error?.code == "expired")
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    @Test func timesThatContradictEachOtherOrReachTooFarAreRefused() throws {
        let c = Checked { $0.maxScheduleAheadMilliseconds = 86_400_000 }
        let now = c.h.clock.wallClock
        func field(_ runAt: TaskTime?, _ expiry: TaskTime?) -> String? {
            do {
                _ = try c.submit("x", runAt: runAt, expiry: expiry)
                return nil
            } catch {
                #expect(error.code == .invalid)
                return error.field ?? "(none)"
            }
        }
        #expect(field(.after(5_000), .after(5_000)) == "ttl_ms")
        #expect(field(.at(now + 5_000), .at(now + 4_000)) == "expires_at")
        #expect(field(nil, .at(now)) == "expires_at")
        #expect(field(.after(86_400_001), nil) == "delay_ms")
        #expect(field(.at(now + 86_400_001), nil) == "run_at")
        #expect(field(nil, .after(86_400_001)) == "ttl_ms")
        #expect(field(.after(5_000), .after(5_001)) == nil)
        #expect(c.h.engine.unfinishedCount == 1)
    }

    @Test func aWallClockSetForwardStartsWhatFellDueWithinASecond() throws {
        let c = Checked()
        let task = try c.submit("in an hour", runAt: .after(3_600_000))
        c.h.clock.advance(by: 10_000)
        c.h.clock.wallClockSkew = 3_600_000
        let jumpedAt = c.h.clock.wallClock
        c.h.clock.advance(by: 999)
        #expect(task.state == .scheduled || task.state == .succeeded)
        c.h.clock.advance(by: 1)
        #expect(task.state == .succeeded)
        let started = try #require(task.startedAt)
        #expect(started > task.scheduledFor! && started - jumpedAt <= 1_000)
    }

    @Test func aWallClockSetBackHoldsTheTaskUntilItsWallTime() throws {
        let c = Checked()
        let task = try c.submit("in ten seconds", runAt: .after(10_000))
        c.h.clock.wallClockSkew = -60_000
        c.h.clock.advance(by: 10_000)
        #expect(task.state == .scheduled)
        c.h.clock.advance(by: 59_999)
        #expect(task.state == .scheduled)
        c.h.clock.advance(by: 1)
        #expect(task.state == .succeeded && task.startedAt == task.scheduledFor)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    @Test func aRetriedTaskWhoseTimeHasNotComeIsScheduledAgain() throws {
        let c = Checked()
        let task = try c.submit("later", runAt: .after(10_000), expiry: .after(20_000))
        try c.h.engine.cancel(task.id)
        try c.h.engine.retryTask(task.id)
        #expect(task.state == .scheduled)
        c.h.clock.advance(by: 10_000)
        #expect(task.state == .succeeded)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    /// Brought back on purpose after its expiry, a task runs: the expiry that passed no longer applies.
    @Test func aRetryAfterTheExpiryRuns() throws {
        let c = Checked { $0.defaultConcurrency = 1 }
        _ = try c.submit("blocker", "sleep", params: c.h.sleep(5_000))
        let task = try c.submit("task", expiry: .after(1_000))
        c.h.clock.advance(by: 1_000)
        #expect(task.error?.code == "expired")
        try c.h.engine.retryTask(task.id)
        #expect(task.expiresAt == nil)
        c.h.clock.advance(by: 5_000)
        #expect(task.state == .succeeded)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }

    @Test func aRestartRunsWhatFellDueWhileDownAndExpiresWhatExpired() throws {
        let manual = ManualExecutor()
        let c = Checked(extra: ["manual": manual])
        let due = try c.submit("due", runAt: .after(5_000))
        let notYet = try c.submit("not yet", runAt: .after(60_000))
        try c.h.engine.updateQueue("held", paused: true)
        let expiring = try c.submit("expiring", "manual", queue: "held", expiry: .after(5_000))
        let saved = RestoreTests.saved(c.h.engine)
        let restoredManual = ManualExecutor()
        let r = EngineHarness(extra: ["manual": restoredManual],
                              clock: VirtualScheduler(wallClockOrigin: c.h.clock.wallClock + 10_000))
        try r.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks)
        #expect(try #require(r.engine.task(due.id)).state == .succeeded)
        let restoredExpiring = try #require(r.engine.task(expiring.id))
        #expect(restoredExpiring.state == .cancelled && restoredExpiring.error?.code == "expired")
        let restoredNotYet = try #require(r.engine.task(notYet.id))
        #expect(restoredNotYet.state == .scheduled && restoredNotYet.scheduledFor == notYet.scheduledFor)
        r.clock.advance(by: 49_999)
        #expect(restoredNotYet.state == .scheduled)
        r.clock.advance(by: 1)
        #expect(restoredNotYet.state == .succeeded)
        #expect(restoredManual.runs.isEmpty)
    }

    /// Far-off tasks submitted and cancelled leave entries behind; they are dropped in bulk.
    @Test func cancelledFarOffTasksDoNotGrowTheDeadlinesWithoutEnd() throws {
        let h = EngineHarness()
        for _ in 0..<5_000 {
            let task = try h.engine.submit(TaskSpec(kind: "noop", runAt: .after(3_600_000), expiry: .after(7_200_000)))
            try h.engine.cancel(task.id)
        }
        #expect(h.engine.wallTimers.count <= 1_026)
        #expect(h.engine.unfinishedCount == 0)
    }

    @Test func aWorkflowMemberMayWaitForItsTime() throws {
        let c = Checked()
        let workflow = try c.h.engine.submitWorkflow(name: "w", tasks: [
            (key: "a", spec: TaskSpec(kind: "noop", name: "a")),
            (key: "b", spec: TaskSpec(kind: "noop", name: "b", dependencies: [.sibling(key: "a")], runAt: .after(2_000))),
        ])
        #expect(workflow.state == .running || workflow.state == .pending)
        let b = try #require(workflow.tasks.first { $0.name == "b" })
        #expect(b.state == .scheduled)
        c.h.clock.advance(by: 2_000)
        #expect(b.state == .succeeded && workflow.state == .succeeded)
        #expect(c.violations.isEmpty, "\(c.violations)")
    }
}
