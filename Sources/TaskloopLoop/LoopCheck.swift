import CLibUV

/// A libuv check handle: its callback runs once per loop iteration, right after the loop has
/// handled that iteration's I/O and timers. The place to act on everything a turn of the loop
/// did, once (the store's group commit). Loop thread only; lives until `close()`.
public final class LoopCheck {
    private let handle: UnsafeMutablePointer<uv_check_t>
    private var callback: (() -> Void)?
    private var closed = false

    public init(loop: EventLoop, _ callback: @escaping () -> Void) throws(UVError) {
        handle = try UVHandle.make(uv_check_t.self, "uv_check_init") { uv_check_init(loop.uvLoop, $0) }
        self.callback = callback
        let owner = Owner()
        UVHandle.adopt(handle, owner: owner)
        owner.check = self
        // uv_check_start fails only for a closing handle or a nil callback.
        uv_check_start(handle, runCheck)
        // A check handle alone must not keep the loop running.
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) { uv_unref($0) }
    }

    public func close() {
        guard !closed else { return }
        closed = true
        callback = nil
        UVHandle.owner(handle, as: Owner.self).check = nil
        UVHandle.close(handle)
    }

    fileprivate func run() { callback?() }

    fileprivate final class Owner {
        var check: LoopCheck?
    }
}

private let runCheck: uv_check_cb = { handle in
    UVHandle.owner(handle, as: LoopCheck.Owner.self).check?.run()
}
