import Glibc

/// A thread of its own that takes everything queued for it at once: `drain` gets, in order,
/// all the items enqueued since it last ran, so work that arrives while it is busy is handled
/// together next time (group commit for the writer, one fsync for many commits for the log
/// flusher).
///
/// Threading: `enqueue` and `finish` from any thread; `start`, `drain` and `idle` run on the
/// thread. The owner calls `finish` before letting go of it.
final class DrainingThread<Item>: @unchecked Sendable {
    private let name: String
    private let start: () -> Void
    private let drain: ([Item]) -> Void
    /// Runs once nothing has been queued for `quietSeconds` after a drain: housekeeping that
    /// must not run between the batches of a steady load (it would then slow every batch) and
    /// that queued work should not wait behind.
    private let idle: (quietSeconds: Double, run: () -> Void)?
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let wake = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var queue: [Item] = []
    private var closing = false
    private var finished = false
    /// The thread is in (or about to enter) `pthread_cond_wait`; guarded by `mutex`.
    private var isWaiting = false
    private var thread = pthread_t()

    /// Starts the thread, which runs `start` once, then `drain` for each gathering of items, and
    /// `idle` when a drain was followed by `quietSeconds` with nothing queued (never without an
    /// `idle`).
    init(name: String, start: @escaping () -> Void = {}, idle: (quietSeconds: Double, run: () -> Void)? = nil,
         drain: @escaping ([Item]) -> Void) {
        self.name = name
        self.start = start
        self.idle = idle
        self.drain = drain
        pthread_mutex_init(mutex, nil)
        // Quiet periods are measured on the monotonic clock: a wall clock step must not run or
        // hold off the housekeeping.
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(wake, &attributes)
        pthread_condattr_destroy(&attributes)
        thread = spawnThread(name) { [unowned self] in run() }
    }

    deinit {
        pthread_mutex_destroy(mutex)
        pthread_cond_destroy(wake)
        mutex.deallocate()
        wake.deallocate()
    }

    func enqueue(_ item: Item) {
        pthread_mutex_lock(mutex)
        precondition(!closing, "\(name): enqueue after finish")
        queue.append(item)
        let threadIsWaiting = isWaiting
        pthread_mutex_unlock(mutex)
        // Signalled outside the lock, and only when the thread sleeps: a thread woken while we
        // held the mutex would block on it straight away.
        if threadIsWaiting { pthread_cond_signal(wake) }
    }

    /// Drains what is queued, then ends the thread and returns (at once when already done).
    func finish() {
        pthread_mutex_lock(mutex)
        let first = !closing
        closing = true
        pthread_cond_signal(wake)
        pthread_mutex_unlock(mutex)
        if first { pthread_join(thread, nil) }
    }

    private func run() {
        start()
        // When `idle` is due if nothing arrives before; nil when it has run since the last drain.
        var idleDue: timespec?
        while true {
            pthread_mutex_lock(mutex)
            var quiet = false
            while queue.isEmpty && !closing && !quiet {
                isWaiting = true
                if var deadline = idleDue {
                    quiet = pthread_cond_timedwait(wake, mutex, &deadline) == ETIMEDOUT
                } else {
                    pthread_cond_wait(wake, mutex)
                }
                isWaiting = false
            }
            if queue.isEmpty && !closing {
                pthread_mutex_unlock(mutex)
                idleDue = nil
                idle?.run()
                continue
            }
            let items = queue
            queue.removeAll(keepingCapacity: true)
            let done = closing && items.isEmpty
            pthread_mutex_unlock(mutex)
            if done { return }
            drain(items)
            if let idle { idleDue = Self.monotonicNow(plus: idle.quietSeconds) }
        }
    }

    private static func monotonicNow(plus seconds: Double) -> timespec {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let nanoseconds = Int(now.tv_nsec) + Int(seconds.truncatingRemainder(dividingBy: 1) * 1e9)
        return timespec(tv_sec: now.tv_sec + Int(seconds) + nanoseconds / 1_000_000_000, tv_nsec: nanoseconds % 1_000_000_000)
    }
}

/// What a new thread runs, carried through `pthread_create`'s context pointer.
private final class ThreadBody {
    let run: () -> Void
    init(_ run: @escaping () -> Void) { self.run = run }
}

private func spawnThread(_ name: String, _ body: @escaping () -> Void) -> pthread_t {
    var thread = pthread_t()
    let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    let started = pthread_create(&thread, nil, { context in
        Unmanaged<ThreadBody>.fromOpaque(context!).takeRetainedValue().run()
        return nil
    }, context)
    precondition(started == 0, "cannot start the \(name) thread")
    return thread
}
