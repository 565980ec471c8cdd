import Foundation
import TaskloopLoop
import TaskloopTestSupport

/// An event loop running on a thread of its own, for tests: run work on it and wait for it, and
/// wait for the loop to end, learning whether it closed clean.
public final class LoopThread: Sendable {
    public let loop: EventLoop
    private let finished = DispatchSemaphore(value: 0)
    private let outcome = Locked<Result<Void, EventLoopError>?>(nil)

    public init(_ loop: EventLoop, name: String) {
        self.loop = loop
        let thread = Thread { [finished, outcome] in
            let result = Result { () throws(EventLoopError) in try loop.run() }
            outcome.withLock { $0 = result }
            finished.signal()
        }
        thread.name = name
        thread.start()
    }

    /// Runs `body` on the loop thread and returns its result.
    public func run<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let done = DispatchSemaphore(value: 0)
        let result = Locked<T?>(nil)
        loop.execute {
            let value = body()
            result.withLock { $0 = value }
            done.signal()
        }
        done.wait()
        return result.withLock { $0! }
    }

    /// Waits until `condition` (evaluated on the loop) holds, or throws after `timeout` seconds.
    public func waitUntil(_ what: String, timeout: Double, _ condition: @escaping @Sendable () -> Bool) throws {
        try pollUntil(what, timeout: timeout, every: 1_000) { run(condition) }
    }

    /// Waits for the loop thread to end. Throws if it did not end in time or the loop did not
    /// close clean.
    public func waitForExit(timeout: Double, what: String = "the loop to finish") throws {
        guard finished.wait(timeout: .now() + timeout) == .success else {
            throw TestTimeout(what: "\(what) (handles still open: \(loop.openHandlesWhileIdle().joined(separator: ", ")))")
        }
        finished.signal()
        try outcome.withLock { $0 }!.get()
    }
}
