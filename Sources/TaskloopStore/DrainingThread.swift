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
    /// Runs when a drain left nothing queued, before the thread waits: housekeeping that queued
    /// work should not wait behind.
    private let idle: () -> Void
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let wake = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var queue: [Item] = []
    private var closing = false
    private var finished = false
    /// The thread is in (or about to enter) `pthread_cond_wait`; guarded by `mutex`.
    private var isWaiting = false
    private var thread = pthread_t()

    /// Starts the thread, which runs `start` once, then `drain` for each gathering of items, and
    /// `idle` whenever it has drained all there was.
    init(name: String, start: @escaping () -> Void = {}, idle: @escaping () -> Void = {}, drain: @escaping ([Item]) -> Void) {
        self.name = name
        self.start = start
        self.idle = idle
        self.drain = drain
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(wake, nil)
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
        var drained = false
        while true {
            pthread_mutex_lock(mutex)
            if drained && queue.isEmpty && !closing {
                pthread_mutex_unlock(mutex)
                drained = false
                idle()
                continue
            }
            while queue.isEmpty && !closing {
                isWaiting = true
                pthread_cond_wait(wake, mutex)
                isWaiting = false
            }
            let items = queue
            queue.removeAll(keepingCapacity: true)
            let done = closing && items.isEmpty
            pthread_mutex_unlock(mutex)
            if done { return }
            drain(items)
            drained = true
        }
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
