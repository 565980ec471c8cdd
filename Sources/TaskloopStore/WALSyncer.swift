import CSQLite
import Glibc

/// `--durability full`'s flush, on a thread of its own, so that writing the next transaction
/// overlaps the fsync of the last (the split a database makes between its log writer and its
/// log flusher).
///
/// The connection runs with `synchronous = NORMAL`: a commit is in the write-ahead log, not yet
/// on the platter, and SQLite still syncs the log before every checkpoint. The writer hands
/// each transaction's outcome here; one `fdatasync` of the log then makes every transaction
/// committed before it durable, and only then are their completions delivered, in order. So
/// a completion means what `synchronous = FULL` would mean, and while one fsync runs, the
/// writer commits the next batch, which the next fsync covers.
///
/// A failed fsync fails the transactions it was to cover (the kernel may have dropped their
/// pages): the service answers 503 and writes their records again.
///
/// Threading: `enqueue` from the writer thread only; the flush runs on the syncer's thread;
/// completions go to `deliver`.
final class WALSyncer: @unchecked Sendable {
    typealias Outcome = (result: Result<Void, SQLiteError>, completions: [StoreWriter.Completion])

    private let log: Int32
    private let path: String
    private let deliver: StoreWriter.Deliver
    private var thread: DrainingThread<Outcome>!

    /// Opens the write-ahead log at `path` (it must exist: the connection is in WAL mode and has
    /// read) and starts the thread.
    init(logPath path: String, deliver: @escaping StoreWriter.Deliver) throws(SQLiteError) {
        log = open(path, O_RDONLY | O_CLOEXEC)
        guard log >= 0 else {
            throw SQLiteError(code: SQLITE_CANTOPEN, message: String(cString: strerror(errno)), operation: "open \(path)")
        }
        self.path = path
        self.deliver = deliver
        thread = DrainingThread(name: "store log flusher") { [unowned self] outcomes in flush(outcomes) }
    }

    deinit {
        close(log)
    }

    func enqueue(_ outcome: Outcome) {
        thread.enqueue(outcome)
    }

    /// Flushes what is queued, then ends the thread and returns.
    func finish() {
        thread.finish()
    }

    private func flush(_ outcomes: [Outcome]) {
        var flushed: Result<Void, SQLiteError> = .success(())
        if outcomes.contains(where: { (try? $0.result.get()) != nil }), fdatasync(log) != 0 {
            flushed = .failure(SQLiteError(code: SQLITE_IOERR | (4 << 8) /* _FSYNC */, message: String(cString: strerror(errno)),
                                           operation: "fdatasync \(path)"))
        }
        let delivered = UncheckedSendable(outcomes.map { outcome in
            (result: outcome.result.flatMap { flushed }, completions: outcome.completions)
        })
        deliver {
            for outcome in delivered.value {
                for completion in outcome.completions { completion(outcome.result) }
            }
        }
    }
}
