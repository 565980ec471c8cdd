import CLibUV

/// A `uv_poll` on a socket a C library owns (curl's, libpq's): readiness goes to `onReady`.
///
/// Lifecycle: `start` as often as the library asks, then `close`, which stops watching at once
/// (the library may close the descriptor right after); the handle is freed in its close
/// callback, and holds this object until then.
///
/// Threading: loop thread only; `onReady` runs on it.
package final class SocketPoll {
    package let socket: Int32
    private let handle: UnsafeMutablePointer<uv_poll_t>
    private let onReady: (_ status: Int32, _ readable: Bool, _ writable: Bool) -> Void

    package init(loop: EventLoop, socket: Int32,
                 onReady: @escaping (_ status: Int32, _ readable: Bool, _ writable: Bool) -> Void) throws(UVError) {
        self.socket = socket
        self.onReady = onReady
        handle = try UVHandle.make(uv_poll_t.self, "uv_poll_init_socket") { uv_poll_init_socket(loop.uvLoop, $0, socket) }
        UVHandle.adopt(handle, owner: self)
    }

    /// Watches for what is asked (replacing what was); false if libuv refused.
    @discardableResult
    package func start(readable: Bool, writable: Bool) -> Bool {
        var events: Int32 = 0
        if readable { events |= Int32(UV_READABLE.rawValue) }
        if writable { events |= Int32(UV_WRITABLE.rawValue) }
        return uv_poll_start(handle, events, socketPollReady) == 0
    }

    package func close() {
        uv_poll_stop(handle)
        UVHandle.close(handle)
    }

    fileprivate func ready(status: Int32, events: Int32) {
        onReady(status, events & Int32(UV_READABLE.rawValue) != 0, events & Int32(UV_WRITABLE.rawValue) != 0)
    }
}

private let socketPollReady: uv_poll_cb = { handle, status, events in
    UVHandle.owner(handle, as: SocketPoll.self).ready(status: status, events: events)
}
