import Glibc

/// A value guarded by a pthread mutex. Used only where threads meet (`EventLoop.execute`, and
/// the tests' helpers); a pthread mutex rather than `Synchronization.Mutex` because
/// ThreadSanitizer understands it (it reports false races through `Mutex` on Linux).
package final class PThreadLocked<Value>: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private var value: Value

    package init(_ value: Value) {
        self.value = value
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    package func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
