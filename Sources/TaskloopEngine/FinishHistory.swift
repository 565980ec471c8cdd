/// How many tasks of a queue reached a terminal state in each of the last `intervalCount`
/// intervals of `intervalMilliseconds`: the dashboard's throughput sparkline. Kept in memory
/// only, so it starts empty when the server starts. A ring of counts: recording and reading
/// cost O(1) and O(intervalCount), whatever the rate. By wall-clock time, so that an event
/// shows the history as of its own `time`; a clock set back adds to the newest interval.
///
/// Threading: engine thread only, as its queue.
public struct FinishHistory {
    public static let intervalMilliseconds: UInt64 = 10_000
    public static let intervalCount = 30

    private var counts = [Int](repeating: 0, count: intervalCount)
    /// The interval (wall-clock time / interval length) the newest count belongs to.
    private var newest: UInt64 = 0

    public init() {}

    mutating func record(at wallClock: Int64) {
        advance(to: Self.interval(wallClock))
        counts[Self.slot(newest)] += 1
    }

    /// The counts, oldest first; the last is the interval `wallClock` falls in (still filling).
    public func counts(at wallClock: Int64) -> [Int] {
        let current = Self.interval(wallClock)
        let count = UInt64(Self.intervalCount)
        return (0..<count).map { index in
            let age = count - 1 - index
            guard current >= age else { return 0 }
            let interval = current - age
            // Intervals after the newest recorded one, or too old to be in the ring, had none.
            guard interval <= newest, newest - interval < count else { return 0 }
            return counts[Self.slot(interval)]
        }
    }

    private mutating func advance(to interval: UInt64) {
        guard interval > newest else { return }
        let cleared = min(interval - newest, UInt64(Self.intervalCount))
        for step in 1...cleared { counts[Self.slot(newest + step)] = 0 }
        newest = interval
    }

    private static func interval(_ wallClock: Int64) -> UInt64 { UInt64(max(0, wallClock)) / intervalMilliseconds }

    private static func slot(_ interval: UInt64) -> Int { Int(interval % UInt64(intervalCount)) }
}
