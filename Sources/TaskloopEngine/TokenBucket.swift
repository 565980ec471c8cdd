/// A queue's rate limit: on average at most `perSecond` tasks start per second, and at most
/// `burst` at once after a quiet spell.
public struct RateLimit: Sendable, Equatable {
    public var perSecond: Double
    public var burst: Int

    public init(perSecond: Double, burst: Int) {
        self.perSecond = perSecond
        self.burst = burst
    }
}

/// The token bucket of a rate-limited queue: `burst` tokens at most, refilled continuously at
/// `perSecond` on the engine's monotonic clock; every start (a lease included) takes one.
///
/// The fill level is kept as the instant the bucket will be full again (`fullAt`), so a refill
/// is no step of its own and the rate stays exact however long it runs: at `now` the bucket
/// holds `burst - (fullAt - now) / interval` tokens (at most `burst`), so a token is there once
/// `now >= fullAt - (burst - 1) * interval`, and taking one moves `fullAt` on by one interval
/// (from `now` if it had filled up meanwhile, as a full bucket gains nothing).
///
/// The clock counts whole milliseconds, so a start waiting for a token starts at the first
/// millisecond after the token is due; with `burst` >= 2 the bucket absorbs that lateness and
/// the rate is exact, with `burst` 1 a rate whose interval is no whole number of milliseconds
/// runs slower by up to one millisecond per task.
///
/// Threading: engine thread only.
final class TokenBucket {
    let limit: RateLimit
    /// Milliseconds between tokens.
    private let interval: Double
    /// How far ahead of now `fullAt` may be while a token is left.
    private let slack: Double
    private var fullAt: Double
    /// Set while the queue's last dispatch stopped for want of a token: its starts until then
    /// count as delayed (`TaskQueue.delayedByRateLimit`).
    var throttled = false
    /// Wakes the queue when its next token is due; armed only while it waits for one.
    var wake: ScheduledAction?

    /// A full bucket.
    init(_ limit: RateLimit, now: UInt64) {
        self.limit = limit
        interval = 1_000 / limit.perSecond
        slack = Double(limit.burst - 1) * interval
        fullAt = Double(now)
    }

    func hasToken(at now: UInt64) -> Bool {
        Double(now) >= fullAt - slack
    }

    func take(at now: UInt64) {
        fullAt = max(fullAt, Double(now)) + interval
    }

    /// Whole milliseconds from `now` until the next token, at least 1 while none is left.
    /// (Subtracting `now` is exact: a whole number is a multiple of every ulp below 2^53, so the
    /// wake finds the token `hasToken` looks for.)
    func millisecondsUntilToken(at now: UInt64) -> UInt64 {
        UInt64(max(0, (fullAt - slack - Double(now)).rounded(.up)))
    }
}
