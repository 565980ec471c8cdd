import Foundation
import Testing
import TaskloopLoop
import TaskloopLoopTestSupport
import TaskloopTestSupport

/// The loop on its own: the cross-thread door, timers, and the clean-close check every other
/// test relies on.
@Suite struct EventLoopTests {
    @Test func executeRunsWorkFromOtherThreadsOnTheLoop() throws {
        let thread = LoopThread(try EventLoop(), name: "loop-test")
        let loop = thread.loop
        let ran = Locked(0)
        let offLoop = Locked(0)
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            for _ in 0..<1000 {
                loop.execute {
                    if !loop.inLoopThread { offLoop.withLock { $0 += 1 } }
                    ran.withLock { $0 += 1 }
                }
            }
        }
        try thread.waitUntil("all work to run", timeout: 10) { ran.value == 8000 }
        #expect(offLoop.value == 0)
        loop.execute { loop.finish() }
        try thread.waitForExit(timeout: 10)
        #expect(!loop.execute {}, "work offered after finish is refused")
    }

    @Test func timersFireInDeadlineOrderAndRepeat() throws {
        let loop = try EventLoop()
        var fired: [String] = []
        var timers: [LoopTimer] = []
        for (name, delay) in [("third", UInt64(30)), ("first", 10), ("second", 20)] {
            let timer = try LoopTimer(loop: loop)
            timer.start(after: delay) { fired.append(name) }
            timers.append(timer)
        }
        let repeating = try LoopTimer(loop: loop)
        var ticks = 0
        repeating.start(after: 1, every: 1) {
            ticks += 1
            guard ticks == 3 else { return }
            repeating.close()
        }
        let closer = try LoopTimer(loop: loop)
        closer.start(after: 40) {
            for timer in timers { timer.close() }
            closer.close()
            loop.finish()
        }
        try loop.run()
        #expect(fired == ["first", "second", "third"])
        #expect(ticks == 3)
    }

    /// A handle nobody closed keeps `uv_loop_close` from succeeding; `run` names it instead of
    /// returning as if all were well, and succeeds once it is closed.
    @Test func aHandleLeftOpenIsNamedWhenTheLoopEnds() throws {
        let loop = try EventLoop()
        let forgotten = try LoopTimer(loop: loop)
        loop.execute { loop.finish() }
        #expect(throws: EventLoopError.handlesStillOpen(["timer"])) { try loop.run() }
        forgotten.close()
        try loop.run()
    }
}
