import Foundation

/// What a wait that ran out of time throws, naming what it waited for.
public struct TestTimeout: Error, CustomStringConvertible {
    public let what: String
    public init(what: String) { self.what = what }
    public var description: String { "timed out waiting for \(what)" }
}

/// Evaluates `condition` every `interval` microseconds until it holds, or throws `TestTimeout`
/// after `timeout` seconds. The one way tests wait for something they cannot be told about.
public func pollUntil(_ what: @autoclosure () -> String, timeout: Double = 10, every interval: useconds_t = 2_000,
                      _ condition: () throws -> Bool) throws {
    let deadline = Date().addingTimeInterval(timeout)
    while try !condition() {
        guard Date() < deadline else { throw TestTimeout(what: what()) }
        usleep(interval)
    }
}

/// A value behind a lock that closures and threads can share. NSLock is a pthread mutex on
/// Linux, which ThreadSanitizer sees.
public final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var storage: Value
    public init(_ value: Value) { storage = value }
    public func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&storage)
    }
    public var value: Value { withLock { $0 } }
}

extension Locked where Value == [String] {
    /// Appends each line `handle` yields (without its newline) on a thread of its own, until
    /// the other end closes: how tests follow a child process's output while waiting on it.
    public func collectLines(from handle: FileHandle) {
        Thread {
            var pending = ""
            while case let chunk = handle.availableData, !chunk.isEmpty {
                pending += String(decoding: chunk, as: UTF8.self)
                while let end = pending.firstIndex(of: "\n") {
                    let line = String(pending[..<end])
                    pending = String(pending[pending.index(after: end)...])
                    self.withLock { $0.append(line) }
                }
            }
        }.start()
    }
}

extension Process {
    /// How the process ended: its exit status, or the number of the signal that ended it (as
    /// `terminationStatus` says); nil while it runs. Read from the kernel without reaping the
    /// child, not from Foundation: Foundation learns of an exit when a socket the child inherited
    /// closes, and in a test process that also starts programs from a libuv loop, a spawn that
    /// marks every descriptor close-on-exec can take that socket from a child started at the same
    /// moment. Foundation then waits for that child on its one monitoring thread, and the exits
    /// of every other child go unnoticed for as long as that one runs.
    public var exitStatus: Int32? {
        var info = siginfo_t()
        guard waitid(P_PID, id_t(processIdentifier), &info, WEXITED | WNOHANG | WNOWAIT) == 0 else {
            // Already reaped: by Foundation, which then knows the status.
            return errno == ECHILD && !isRunning ? terminationStatus : nil
        }
        guard info._sifields._sigchld.si_pid == processIdentifier else { return nil }
        return info._sifields._sigchld.si_status
    }

    /// Waits until the process has exited and returns `exitStatus`, or throws `TestTimeout`.
    public func waitForExit(_ what: @autoclosure () -> String, timeout: Double) throws -> Int32 {
        var status: Int32?
        try pollUntil(what(), timeout: timeout, every: 5_000) {
            status = exitStatus
            return status != nil
        }
        return status!
    }
}
