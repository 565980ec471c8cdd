import Glibc
import TaskloopEngine
import TaskloopLoop

/// The engine's clock on the libuv loop: one `uv_timer` armed for the earliest deadline of a
/// `TimerQueue`, however many timeouts, backoffs and long polls are waiting.
///
/// Threading: loop thread only; actions run on it.
public final class LoopScheduler: EngineScheduler {
    private let loop: EventLoop
    private var timers = TimerQueue()
    private var timer: LoopTimer?
    private var armedFor: UInt64?

    public init(loop: EventLoop) throws(UVError) {
        self.loop = loop
        timer = try LoopTimer(loop: loop)
    }

    public var now: UInt64 { loop.now }

    public var wallClock: Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Int64(spec.tv_sec) * 1_000 + Int64(spec.tv_nsec) / 1_000_000
    }

    public func schedule(after delay: UInt64, _ action: @escaping () -> Void) -> ScheduledAction {
        let scheduled = timers.schedule(at: now + delay, action)
        arm()
        return scheduled
    }

    /// Frees the timer handle; pending actions never run. The last step of a shutdown.
    public func close() {
        timer?.close()
        timer = nil
    }

    private func arm() {
        guard let timer else { return }
        guard let deadline = timers.nextDeadline() else {
            timer.stop()
            armedFor = nil
            return
        }
        guard armedFor != deadline else { return }
        armedFor = deadline
        timer.start(after: deadline > now ? deadline - now : 0) { [unowned self] in fire() }
    }

    private func fire() {
        armedFor = nil
        let now = self.now
        while let (_, body) = timers.popDue(at: now) { body() }
        arm()
    }
}
