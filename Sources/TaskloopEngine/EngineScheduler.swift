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

/// A clock that moves only when told to. `advance(by:)` runs every action that falls due, in
/// deadline order (ties in scheduling order), each at its own `now`.
public final class VirtualScheduler: EngineScheduler {
    public private(set) var now: UInt64 = 0
    private let wallClockOrigin: Int64
    private var pending = Heap<Entry>()
    private var sequence: UInt64 = 0

    public var wallClock: Int64 { wallClockOrigin + Int64(now) }

    public init(wallClockOrigin: Int64 = 1_795_000_000_000) {
        self.wallClockOrigin = wallClockOrigin
    }

    private final class Action: ScheduledAction {
        var body: (() -> Void)?
        init(_ body: @escaping () -> Void) { self.body = body }
        func cancel() { body = nil }
    }

    private struct Entry: Comparable {
        let deadline: UInt64
        let sequence: UInt64
        let action: Action
        static func < (lhs: Entry, rhs: Entry) -> Bool { (lhs.deadline, lhs.sequence) < (rhs.deadline, rhs.sequence) }
        static func == (lhs: Entry, rhs: Entry) -> Bool { lhs.deadline == rhs.deadline && lhs.sequence == rhs.sequence }
    }

    public func schedule(after delay: UInt64, _ body: @escaping () -> Void) -> ScheduledAction {
        let action = Action(body)
        sequence += 1
        pending.insert(Entry(deadline: now + delay, sequence: sequence, action: action))
        return action
    }

    /// Moves time forward, running what falls due on the way.
    public func advance(by milliseconds: UInt64) {
        let target = now + milliseconds
        while let next = pending.min, next.deadline <= target {
            _ = pending.removeMin()
            now = max(now, next.deadline)
            if let body = next.action.body {
                next.action.body = nil
                body()
            }
        }
        now = target
    }

    /// The deadline of the next live action, if any.
    public var nextDeadline: UInt64? {
        while let next = pending.min, next.action.body == nil { _ = pending.removeMin() }
        return pending.min?.deadline
    }
}
