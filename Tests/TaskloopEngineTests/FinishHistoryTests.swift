import Testing
@testable import TaskloopEngine

@Suite struct FinishHistoryTests {
    let interval = Int64(FinishHistory.intervalMilliseconds)

    @Test func countsLandInTheirIntervalsOldestFirst() {
        var history = FinishHistory()
        let start = Int64(1_800_000_000_000)
        history.record(at: start)
        history.record(at: start + 1)
        history.record(at: start + interval)
        history.record(at: start + 3 * interval)
        let counts = history.counts(at: start + 3 * interval)
        #expect(counts.count == FinishHistory.intervalCount)
        #expect(Array(counts.suffix(4)) == [2, 1, 0, 1])
        #expect(counts.dropLast(4).allSatisfy { $0 == 0 })
        // Read later, the same finishes have moved left; quiet intervals count zero.
        #expect(Array(history.counts(at: start + 5 * interval).suffix(6)) == [2, 1, 0, 1, 0, 0])
    }

    @Test func intervalsOlderThanTheWindowAreForgotten() {
        var history = FinishHistory()
        let start = Int64(1_800_000_000_000)
        history.record(at: start)
        let window = Int64(FinishHistory.intervalCount)
        #expect(history.counts(at: start + (window - 1) * interval).first == 1)
        #expect(history.counts(at: start + window * interval).allSatisfy { $0 == 0 }, "read past the window")
        // A record long after the last one clears the whole ring, not just the next slot.
        history.record(at: start + 1_000 * interval)
        #expect(history.counts(at: start + 1_000 * interval).reduce(0, +) == 1)
    }

    @Test func aClockSetBackAddsToTheNewestInterval() {
        var history = FinishHistory()
        let start = Int64(1_800_000_000_000)
        history.record(at: start + 2 * interval)
        history.record(at: start)
        #expect(history.counts(at: start + 2 * interval).last == 2)
        #expect(history.counts(at: 0).allSatisfy { $0 == 0 }, "read before anything: nothing, no trap")
    }
}
