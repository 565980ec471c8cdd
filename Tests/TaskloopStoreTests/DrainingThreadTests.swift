import Foundation
import Testing
@testable import TaskloopStore
import TaskloopTestSupport

/// The thread the store writer and the log flusher run on: housekeeping waits for a quiet spell.
@Suite struct DrainingThreadTests {
    /// `idle` runs once after the writes stop, never before the first drain and not again
    /// until something more was drained; each drain gets what was queued, in order.
    @Test func idleRunsOnceAfterEachQuietSpell() throws {
        let idles = Locked(0)
        let drained = Locked<[Int]>([])
        let thread = DrainingThread<Int>(name: "test", idle: (quietSeconds: 0.05, run: { idles.withLock { $0 += 1 } })) { items in
            drained.withLock { $0.append(contentsOf: items) }
        }
        defer { thread.finish() }
        #expect(idles.value == 0, "nothing drained yet, so nothing to tidy")
        for item in 0..<100 { thread.enqueue(item) }
        try pollUntil("the quiet spell's idle") { idles.value == 1 }
        #expect(drained.value == Array(0..<100))
        thread.enqueue(100)
        try pollUntil("the next quiet spell's idle") { idles.value == 2 }
        #expect(drained.value == Array(0...100))
    }

    /// `finish` drains what is still queued, with or without an idle due.
    @Test func finishDrainsWhatIsQueued() {
        let drained = Locked<[Int]>([])
        let thread = DrainingThread<Int>(name: "test", idle: (quietSeconds: 3600, run: {})) { items in
            drained.withLock { $0.append(contentsOf: items) }
        }
        thread.enqueue(1)
        thread.enqueue(2)
        thread.finish()
        #expect(drained.value == [1, 2])
    }
}
