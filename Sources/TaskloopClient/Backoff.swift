/// Delays between retries of something that keeps failing: exponential from `initial`, capped
/// at `maximum`, each drawn at random from the upper half of its step ("equal jitter"). The
/// jitter keeps a fleet of workers (or watchers) that lost the same server from coming back in
/// lockstep; the lower bound keeps a single one from retrying at once by a lucky draw.
///
/// A value type without a clock: whoever owns it schedules the delay, so it is tested as
/// plain numbers.
public struct Backoff {
    public let initialMilliseconds: UInt64
    public let maximumMilliseconds: UInt64
    /// Failures since the last success.
    public private(set) var failures = 0

    public init(initialMilliseconds: UInt64 = 250, maximumMilliseconds: UInt64) {
        self.initialMilliseconds = max(1, min(initialMilliseconds, maximumMilliseconds))
        self.maximumMilliseconds = max(1, maximumMilliseconds)
    }

    /// The wait before the next try, after one more failure.
    public mutating func nextDelay<Random: RandomNumberGenerator>(using random: inout Random) -> UInt64 {
        failures += 1
        var step = initialMilliseconds
        // Past the cap more doublings change nothing; counting them would only cost time in a
        // long outage.
        for _ in 0..<min(failures - 1, 64) where step < maximumMilliseconds { step = min(maximumMilliseconds, step * 2) }
        let half = step / 2
        return step - half + UInt64.random(in: 0...half, using: &random)
    }

    public mutating func nextDelay() -> UInt64 {
        var random = SystemRandomNumberGenerator()
        return nextDelay(using: &random)
    }

    /// A success: the next failure starts again from `initial`.
    public mutating func reset() {
        failures = 0
    }
}
