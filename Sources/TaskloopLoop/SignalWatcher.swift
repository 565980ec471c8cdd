import CLibUV
import Glibc

/// Delivers a POSIX signal as a callback on the loop thread (uv_signal). Loop thread only;
/// `close()` frees the handle.
public final class SignalWatcher {
    private let handle: UnsafeMutablePointer<uv_signal_t>
    private var callback: (() -> Void)?

    public init(loop: EventLoop, signal: Int32, _ callback: @escaping () -> Void) throws(UVError) {
        handle = try UVHandle.make(uv_signal_t.self, "uv_signal_init") { uv_signal_init(loop.uvLoop, $0) }
        self.callback = callback
        UVHandle.adopt(handle, owner: self)
        do {
            try UVError.check(uv_signal_start(handle, deliverSignal, signal), "uv_signal_start")
        } catch {
            UVHandle.close(handle)
            throw error
        }
        // A process may inherit the signal blocked (posix_spawn keeps the parent's mask, and
        // some supervisors block SIGTERM); a watched signal must be able to arrive.
        unblock(signal)
    }

    public func close() {
        callback = nil
        UVHandle.close(handle)
    }

    fileprivate func deliver() { callback?() }
}

private let deliverSignal: uv_signal_cb = { handle, _ in
    UVHandle.owner(handle, as: SignalWatcher.self).deliver()
}

/// Unblocks `signal` for the calling (loop) thread: a mask inherited from the parent process
/// would otherwise keep it pending forever.
func unblock(_ signal: Int32) {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, signal)
    pthread_sigmask(SIG_UNBLOCK, &set, nil)
}
