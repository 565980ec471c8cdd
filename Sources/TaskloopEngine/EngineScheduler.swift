import HeapModule

/// Time for the engine: the libuv loop in production, `VirtualScheduler` in tests, so timeouts,
/// backoff and heartbeats are tested instantly and deterministically.
///
/// Threading: called only on the engine's thread, and actions run on it.
public protocol EngineScheduler: AnyObject {
    /// Monotonic milliseconds; drives timeouts, backoff and retention.
    var now: UInt64 { get }
    /// Wall-clock milliseconds since the Unix epoch; for timestamps and ids only.
    var wallClock: Int64 { get }
    /// Runs `action` once, `delay` milliseconds from now.
    func schedule(after delay: UInt64, _ action: @escaping () -> Void) -> ScheduledAction
}

public protocol ScheduledAction: AnyObject {
    /// Prevents the action from running; harmless after it ran.
    func cancel()
}

/// Actions by deadline (ties in scheduling order): the part every scheduler shares. A real
/// scheduler arms one OS timer for `nextDeadline`; the virtual one just walks the queue.
/// Cancelled actions are dropped when they surface, or all at once when they outnumber the
/// live ones, so a million cancelled timeouts do not linger until their deadlines.
///
/// Threading: one thread, the scheduler's.
public struct TimerQueue {
    private final class Action: ScheduledAction {
        var body: (() -> Void)?
        let cancelled: Counter
        init(_ body: @escaping () -> Void, cancelled: Counter) {
            self.body = body
            self.cancelled = cancelled
        }
        func cancel() {
            guard body != nil else { return }
            body = nil
            cancelled.value += 1
        }
    }

    private struct Entry: Comparable {
        let deadline: UInt64
        let sequence: UInt64
        let action: Action
        static func < (lhs: Entry, rhs: Entry) -> Bool { (lhs.deadline, lhs.sequence) < (rhs.deadline, rhs.sequence) }
        static func == (lhs: Entry, rhs: Entry) -> Bool { lhs.deadline == rhs.deadline && lhs.sequence == rhs.sequence }
    }

    private var pending = Heap<Entry>()
    private var sequence: UInt64 = 0
    /// Shared with the actions, which count themselves when cancelled.
    private let cancelled = Counter()

    private final class Counter {
        var value = 0
    }

    public init() {}

    /// Queues `body` for `deadline`.
    public mutating func schedule(at deadline: UInt64, _ body: @escaping () -> Void) -> ScheduledAction {
        if cancelled.value > 1_024 && cancelled.value > pending.count / 2 { dropCancelled() }
        let action = Action(body, cancelled: cancelled)
        sequence += 1
        pending.insert(Entry(deadline: deadline, sequence: sequence, action: action))
        return action
    }

    /// The earliest deadline of a live action.
    public mutating func nextDeadline() -> UInt64? {
        while let next = pending.min, next.action.body == nil {
            _ = pending.removeMin()
            cancelled.value -= 1
        }
        return pending.min?.deadline
    }

    /// Removes and returns the earliest live action due at `now`, with its deadline.
    public mutating func popDue(at now: UInt64) -> (deadline: UInt64, body: () -> Void)? {
        guard let deadline = nextDeadline(), deadline <= now, let entry = pending.popMin(), let body = entry.action.body
        else { return nil }
        entry.action.body = nil
        return (deadline, body)
    }

    /// Live actions waiting.
    public var count: Int { pending.count - cancelled.value }

    private mutating func dropCancelled() {
        pending = Heap(pending.unordered.filter { $0.action.body != nil })
        cancelled.value = 0
    }
}

/// A clock that moves only when told to. `advance(by:)` runs every action that falls due, in
/// deadline order (ties in scheduling order), each at its own `now`.
public final class VirtualScheduler: EngineScheduler {
    public private(set) var now: UInt64 = 0
    private let wallClockOrigin: Int64
    private var timers = TimerQueue()

    /// Where the wall clock stands apart from the monotonic one: a test sets the clock
    /// forward or back by changing it.
    public var wallClockSkew: Int64 = 0

    public var wallClock: Int64 { wallClockOrigin + Int64(now) + wallClockSkew }

    public init(wallClockOrigin: Int64 = 1_795_000_000_000) {
        self.wallClockOrigin = wallClockOrigin
    }

    public func schedule(after delay: UInt64, _ body: @escaping () -> Void) -> ScheduledAction {
        timers.schedule(at: now + delay, body)
    }

    /// Moves time forward, running what falls due on the way.
    public func advance(by milliseconds: UInt64) {
        let target = now + milliseconds
        while let (deadline, body) = timers.popDue(at: target) {
            now = max(now, deadline)
            body()
        }
        now = target
    }

    /// The deadline of the next live action, if any.
    public var nextDeadline: UInt64? { timers.nextDeadline() }
}
