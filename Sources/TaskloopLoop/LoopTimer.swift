import CLibUV

/// A libuv timer. Loop thread only. Its handle lives until `close()`; a timer that is never
/// closed keeps the loop from finishing (and `EventLoop.run` reports it).
public final class LoopTimer {
    private let handle: UnsafeMutablePointer<uv_timer_t>
    private var callback: (() -> Void)?
    private var closed = false

    public init(loop: EventLoop) throws(UVError) {
        handle = try UVHandle.make(uv_timer_t.self, "uv_timer_init") { uv_timer_init(loop.uvLoop, $0) }
        let owner = Owner()
        UVHandle.adopt(handle, owner: owner)
        owner.timer = self
    }

    private var owner: Owner { UVHandle.owner(handle, as: Owner.self) }

    /// Calls `callback` after `delay` milliseconds, then every `interval` milliseconds if it is
    /// not zero. Restarting replaces the previous schedule.
    public func start(after delay: UInt64, every interval: UInt64 = 0, _ callback: @escaping () -> Void) {
        precondition(!closed, "LoopTimer used after close")
        self.callback = callback
        // uv_timer_start fails only for a closing handle or a nil callback, both excluded above.
        uv_timer_start(handle, fireTimer, delay, interval)
    }

    public func stop() {
        guard !closed else { return }
        callback = nil
        uv_timer_stop(handle)
    }

    /// Stops the timer for good and frees its handle (in libuv's close callback).
    public func close() {
        guard !closed else { return }
        closed = true
        callback = nil
        owner.timer = nil
        UVHandle.close(handle)
    }

    fileprivate func fire() {
        callback?()
    }

    /// What the handle's `data` retains. It holds the timer until `close()`, so a started timer
    /// keeps running even when its creator drops its reference: the lifetime is the handle's.
    fileprivate final class Owner {
        var timer: LoopTimer?
    }
}

private let fireTimer: uv_timer_cb = { handle in
    UVHandle.owner(handle, as: LoopTimer.Owner.self).timer?.fire()
}
