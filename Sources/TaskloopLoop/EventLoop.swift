import CLibUV
import Glibc

/// One libuv loop and the thread that drives it.
///
/// Threading rules:
/// - Exactly one thread runs the loop: the one that calls `run()`. It is the *loop thread*.
/// - Every handle on the loop (timers, signal watchers, child processes here; servers and
///   connections in TaskloopHTTP; curl's sockets in TaskloopHTTPClient) and every object they
///   hand to callbacks is touched only on the loop thread, without locks.
/// - The one door in from other threads is `execute(_:)`: it queues a closure under a mutex and
///   wakes the loop with `uv_async_send`. Sends coalesce, so each wake-up drains the whole queue.
/// - Values that must travel through `execute` but belong to the loop are wrapped in `LoopBound`,
///   which checks on every access that it is on the loop thread.
public final class EventLoop: Sendable {
    nonisolated(unsafe) package let uvLoop: UnsafeMutablePointer<uv_loop_t>
    private let inbox: Inbox
    nonisolated(unsafe) private var wakeup: UnsafeMutablePointer<uv_async_t>?
    private let loopThread = PThreadLocked<pthread_t?>(nil)

    public init() throws(UVError) {
        let loop = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
        do {
            try UVError.check(uv_loop_init(loop), "uv_loop_init")
        } catch {
            loop.deallocate()
            throw error
        }
        uvLoop = loop
        inbox = Inbox()
        let async: UnsafeMutablePointer<uv_async_t>
        do {
            async = try UVHandle.make(uv_async_t.self, "uv_async_init") { uv_async_init(loop, $0, drainInbox) }
        } catch {
            uv_loop_close(loop)
            loop.deallocate()
            throw error
        }
        UVHandle.adopt(async, owner: inbox)
        wakeup = async
        inbox.wakeup = async
    }

    deinit {
        uvLoop.deallocate()
    }

    /// Runs the loop on the calling thread until every handle is closed, then closes the loop.
    /// Throws if libuv refuses to close it (a handle was leaked), naming the open handles.
    public func run() throws(EventLoopError) {
        loopThread.withLock { $0 = pthread_self() }
        defer { loopThread.withLock { $0 = nil } }
        while uv_run(uvLoop, UV_RUN_DEFAULT) != 0 {}
        let status = uv_loop_close(uvLoop)
        if status != 0 {
            throw EventLoopError.handlesStillOpen(openHandleDescriptions())
        }
    }

    /// Before `run()`, on the thread that will run the loop: runs it until `done()` holds (a
    /// start that must wait for I/O of its own, such as connecting to a database, before it
    /// serves). Never from inside the loop's callbacks.
    public func run(until done: () -> Bool) {
        precondition(loopThread.withLock { $0 == nil }, "run(until:) is for a start, before run()")
        while !done() { uv_run(uvLoop, UV_RUN_ONCE) }
    }

    /// True on the thread currently running this loop.
    public var inLoopThread: Bool {
        loopThread.withLock { thread in thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }

    /// Runs `work` on the loop thread soon. Safe from any thread. Returns false, dropping the
    /// work, once the loop has been told to finish (`finish()`).
    @discardableResult
    public func execute(_ work: @escaping @Sendable () -> Void) -> Bool {
        inbox.post(work)
    }

    /// Closes the loop's own cross-thread wake-up handle, so `run()` returns once the handles
    /// owned by others are closed too. Loop thread only; the last step of a shutdown story.
    public func finish() {
        precondition(inLoopThread, "EventLoop.finish must run on the loop thread")
        guard let wakeup else { return }
        self.wakeup = nil
        inbox.close()
        UVHandle.close(wakeup)
    }

    /// Milliseconds of the loop's monotonic clock, cached at the start of each iteration.
    public var now: UInt64 { uv_now(uvLoop) }

    /// The kinds of the handles still open, read from another thread: only to say why a loop
    /// that should have finished did not, while it sits idle waiting on them (tests).
    public func openHandlesWhileIdle() -> [String] { openHandleDescriptions() }

    private func openHandleDescriptions() -> [String] {
        final class Collector { var names: [String] = [] }
        let collector = Collector()
        withExtendedLifetime(collector) {
            uv_walk(uvLoop, { handle, arg in
                let collector = Unmanaged<Collector>.fromOpaque(arg!).takeUnretainedValue()
                collector.names.append(String(cString: uv_handle_type_name(uv_handle_get_type(handle))))
            }, Unmanaged.passUnretained(collector).toOpaque())
        }
        return collector.names
    }
}

public enum EventLoopError: Error, Equatable {
    /// `uv_loop_close` failed because these handles were never closed.
    case handlesStillOpen([String])
}

/// The cross-thread queue behind `EventLoop.execute`.
private final class Inbox: Sendable {
    private struct State {
        var work: [@Sendable () -> Void] = []
        var open = true
    }
    private let state = PThreadLocked(State())
    nonisolated(unsafe) var wakeup: UnsafeMutablePointer<uv_async_t>?

    func post(_ work: @escaping @Sendable () -> Void) -> Bool {
        let accepted = state.withLock { state -> Bool in
            guard state.open else { return false }
            state.work.append(work)
            // The send happens under the lock so `close()` cannot free the handle in between.
            uv_async_send(wakeup)
            return true
        }
        return accepted
    }

    func drain() {
        let batch = state.withLock { state -> [@Sendable () -> Void] in
            let batch = state.work
            state.work.removeAll(keepingCapacity: true)
            return batch
        }
        for work in batch { work() }
    }

    func close() {
        let leftover = state.withLock { state -> [@Sendable () -> Void] in
            state.open = false
            let leftover = state.work
            state.work = []
            return leftover
        }
        for work in leftover { work() }
    }
}

private let drainInbox: uv_async_cb = { handle in
    UVHandle.owner(handle, as: Inbox.self).drain()
}

/// A loop-confined value that may be carried through `EventLoop.execute` (like NIOLoopBound):
/// reading it anywhere but on its loop's thread is a programming error and traps.
public struct LoopBound<Value>: @unchecked Sendable {
    public let loop: EventLoop
    private let stored: Value

    public init(_ value: Value, loop: EventLoop) {
        self.loop = loop
        self.stored = value
    }

    public var value: Value {
        precondition(loop.inLoopThread, "LoopBound value read off its loop thread")
        return stored
    }
}
