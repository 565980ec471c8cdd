import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Work starts only after the commit that started it (`startsAfterCommit`): the executor of a
/// start with effects is called once the journal releases the batch that made it.
@Suite struct HeldStartsTests {
    static func harness(_ manual: ManualExecutor, concurrency: Int = 4) -> EngineHarness {
        manual.startHasEffects = true
        return EngineHarness(configure: {
            $0.startsAfterCommit = true
            $0.defaultConcurrency = concurrency
        }, extra: ["manual": manual])
    }

    @Test func startsWithEffectsWaitForTheirBatchAndAreReleasedInOrder() throws {
        let manual = ManualExecutor()
        let h = Self.harness(manual)
        let a = try h.submit("a", "manual")
        let b = try h.submit("b", "manual")
        #expect(a.state == .running && b.state == .running && manual.runs.isEmpty)
        let first = h.engine.markHeldStarts()
        let c = try h.submit("c", "manual")
        #expect(c.state == .running && h.engine.heldStartCount == 3)
        h.engine.releaseStarts(through: first)
        #expect(manual.runs.map(\.taskID) == [a.id, b.id], "a later batch's start waits for that batch")
        h.engine.releaseStarts(through: first)
        #expect(manual.runs.count == 2, "a start is released once")
        h.engine.releaseStarts(through: h.engine.markHeldStarts())
        #expect(manual.runs.map(\.taskID) == [a.id, b.id, c.id] && h.engine.heldStartCount == 0)
        manual.runs[2].succeed()
        #expect(c.state == .succeeded)
    }

    @Test func startsWithoutEffectsAndEnginesWithoutTheSettingStartAtOnce() throws {
        let manual = ManualExecutor()
        let h = Self.harness(manual)
        #expect(try h.submit("n").state == .succeeded, "a noop has nothing to take back")
        let plain = ManualExecutor()
        plain.startHasEffects = true
        let unheld = EngineHarness(extra: ["manual": plain])
        _ = try unheld.submit("m", "manual")
        #expect(plain.runs.count == 1 && unheld.engine.heldStartCount == 0)
    }

    @Test func droppedStartsNeverRun() throws {
        let manual = ManualExecutor()
        let h = Self.harness(manual)
        let a = try h.submit("a", "manual")
        let mark = h.engine.markHeldStarts()
        h.engine.dropHeldStarts()
        h.engine.releaseStarts(through: mark)
        #expect(manual.runs.isEmpty && h.engine.heldStartCount == 0)
        // Later starts are released by their own marks.
        let b = try h.submit("b", "manual")
        h.engine.releaseStarts(through: h.engine.markHeldStarts())
        #expect(manual.runs.map(\.taskID) == [b.id] && a.state == .running)
    }

    @Test func aTaskCancelledWhileItsStartWaitsIsCancelledAtTheReleaseWithoutStarting() throws {
        let manual = ManualExecutor()
        let h = Self.harness(manual)
        let a = try h.submit("a", "manual")
        #expect(try h.engine.cancel(a.id) == .cancelRequested)
        h.engine.releaseStarts(through: h.engine.markHeldStarts())
        // Nothing ran, so nothing waits for the grace period.
        #expect(manual.runs.isEmpty && a.state == .cancelled)
    }

    @Test func anAttemptThatEndedWhileItsStartWaitedNeverStarts() throws {
        let manual = ManualExecutor()
        let h = Self.harness(manual)
        let a = try h.submit("a", "manual", timeout: 10, retry: RetryPolicy(maxAttempts: 2, backoffMilliseconds: 0))
        let first = h.engine.markHeldStarts()
        h.clock.advance(by: 10)
        #expect(a.attempt == 2 && a.state == .running, "timed out, and retried at once")
        h.engine.releaseStarts(through: first)
        #expect(manual.runs.isEmpty, "the first attempt ended before its batch committed")
        h.engine.releaseStarts(through: h.engine.markHeldStarts())
        #expect(manual.runs.map(\.attempt) == [2])
    }
}
