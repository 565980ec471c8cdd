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
