import Testing
import TaskloopClient
import TaskloopTestSupport

@Suite struct BackoffTests {
    @Test func backoffDoublesToItsCapWithJitterAndStartsOverAfterASuccess() {
        var random = SplitMix64(seed: 7)
        var backoff = Backoff(initialMilliseconds: 100, maximumMilliseconds: 1_000)
        let steps: [UInt64] = [100, 200, 400, 800, 1_000, 1_000]
        for step in steps {
            let delay = backoff.nextDelay(using: &random)
            #expect(delay >= step / 2 && delay <= step, "\(delay) for a step of \(step)")
        }
        backoff.reset()
        #expect(backoff.nextDelay(using: &random) <= 100)
        // Draws differ: a fleet does not come back in lockstep.
        let draws = Set((0..<20).map { _ -> UInt64 in
            var fresh = Backoff(initialMilliseconds: 1_000, maximumMilliseconds: 1_000)
            return fresh.nextDelay(using: &random)
        })
        #expect(draws.count > 10)
    }
}
