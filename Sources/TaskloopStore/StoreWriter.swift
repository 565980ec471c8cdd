import CSQLite
import Glibc
import Synchronization

/// How far a commit goes before it counts as done (`--durability`): `full` waits for fsync of
/// the WAL (survives a power cut; see `WALSyncer`), `normal` for the write to the WAL
/// (survives the process).
public enum SyncLevel: String, Sendable, CaseIterable {
    case full, normal
}

/// The one thread that writes to the database, with group commit.
///
/// Threading: `submit` may be called from any thread (in the service, the loop thread); the
/// work closures run on the writer's own thread, which owns the connection from `init` on;
/// completions are handed to `deliver` (the service hops them onto its loop), all of one
/// transaction in one call, in submission order. Work submitted while a transaction is being
/// written waits for the next one, which then takes everything queued: under load one fsync
/// commits many changes.
///
/// A transaction that fails (a full or failing disk) fails every item in it, and the
/// database is as before; later submissions try again, so the store recovers by itself once
/// writes succeed.
public final class StoreWriter: @unchecked Sendable {
    public typealias Work = (SQLiteDatabase) throws -> Void
    public typealias Completion = (Result<Void, SQLiteError>) -> Void
    public typealias Deliver = @Sendable (@escaping @Sendable () -> Void) -> Void

    private struct Item {
        let work: Work
        let completion: Completion
    }

    private let database: SQLiteDatabase
    private let deliver: Deliver
    /// With `full`, completions wait for its fsync of the log.
    private let syncer: WALSyncer?
    private var thread: DrainingThread<Item>!
    private let committed = Atomic<Int>(0)
    /// Bytes of write-ahead log kept once the writer is idle (`journal_size_limit`).
    public static let logSizeLimit = 4 << 20

    /// Takes over `database` (no other thread may touch it from now on) and starts the thread.
    public init(database: SQLiteDatabase, syncLevel: SyncLevel, deliver: @escaping Deliver) throws(SQLiteError) {
        try database.execute("PRAGMA journal_mode = WAL")
        // `full` syncs through `WALSyncer`, after the commit rather than inside it.
        try database.execute("PRAGMA synchronous = NORMAL")
        // Checkpoints every 10,000 pages (40 MB of WAL) rather than 1,000 copy pages back in
        // fewer, larger runs. The page cache stays at SQLite's 2 MB: writes append at the right
        // edge of the tasks B-tree and delete at its left, so little else is hot, and a larger
        // cache made every commit slower (a 64 MB one cost 15% of POST throughput, spent in the
        // page cache truncation that ends each transaction).
        try database.execute("PRAGMA wal_autocheckpoint = 10000")
        // SQLite rewinds the log after a checkpoint but keeps the file at its high-water mark,
        // so a burst left a 40 MB log beside a database retention keeps at a few MB. Past this
        // limit it cuts the file back when it rewinds. 4 MB, a thousand pages (SQLite's own
        // checkpoint size), spares growing the file again after every checkpoint;
        // `checkpointWhenIdle` brings it back within the limit once writes stop.
        try database.execute("PRAGMA journal_size_limit = \(Self.logSizeLimit)")
        self.database = database
        self.deliver = deliver
        if syncLevel == .full {
            // Reading makes SQLite open (and create) the log first.
            _ = try database.integer("SELECT count(*) FROM sqlite_schema")
            syncer = try WALSyncer(logPath: database.path + "-wal", deliver: deliver)
        } else {
            syncer = nil
        }
        thread = DrainingThread(name: "store writer", start: {
            // SCHED_BATCH: waking the writer does not preempt the loop. On a busy core the loop
            // then goes on gathering the next batch until it waits on its own (for the commit),
            // so one transaction carries many requests; on an idle core nothing changes. Best
            // effort.
            var parameters = sched_param()
            _ = sched_setscheduler(0, 3 /* SCHED_BATCH */, &parameters)
        }, idle: (Self.quietSecondsBeforeCheckpoint, { [unowned self] in checkpointWhenIdle() }),
           drain: { [unowned self] batch in commit(batch) })
    }

    /// Writes must have stopped this long before the log is emptied. Between the batches of a
    /// steady load the queue is often empty for a moment; checkpointing there (as this writer
    /// once did) copied the whole log back on almost every batch. Waiting for quiet took
    /// `Benchmarks/store` from 35k to 44k POST/s in `normal` (shared cores) and its churn from
    /// 246k to 316k tasks.
    static let quietSecondsBeforeCheckpoint = 0.5

    /// Once writes have stopped, a log past its limit is checkpointed and emptied: the automatic
    /// checkpoint waits for 40 MB, and would leave the file at that size for good once writes
    /// stop. A reader holding an older snapshot (a backup) makes it partial; the next idle
    /// moment tries again.
    private func checkpointWhenIdle() {
        var status = stat()
        guard stat(database.path + "-wal", &status) == 0, status.st_size > Self.logSizeLimit else { return }
        database.checkpointAndTruncateLog()
    }

    /// Queues `work` for the next transaction; `completion` learns whether it committed.
    public func submit(_ work: @escaping Work, completion: @escaping Completion) {
        thread.enqueue(Item(work: work, completion: completion))
    }

    /// Transactions committed so far (for tests and metrics).
    public var transactionsCommitted: Int { committed.load(ordering: .relaxed) }

    /// Writes what is queued, then ends the thread and returns (at once when already closed).
    /// Completions of that last work are still handed to `deliver`.
    public func close() {
        thread.finish()
        syncer?.finish()
    }

    private func commit(_ batch: [Item]) {
        let outcome = write(batch)
        if let syncer {
            syncer.enqueue((outcome, batch.map(\.completion)))
        } else {
            let completions = UncheckedSendable(batch.map(\.completion))
            deliver { for completion in completions.value { completion(outcome) } }
        }
    }

    private func write(_ batch: [Item]) -> Result<Void, SQLiteError> {
        do {
            try database.transaction {
                for item in batch { try item.work(database) }
            }
            committed.add(1, ordering: .relaxed)
            return .success(())
        } catch let error as SQLiteError {
            return .failure(error)
        } catch {
            return .failure(SQLiteError(code: SQLITE_ERROR, message: "\(error)", operation: "store work"))
        }
    }
}
/// Carries loop-thread closures across the writer thread untouched: they are only called
/// again where `deliver` runs them, on the loop.
struct UncheckedSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
