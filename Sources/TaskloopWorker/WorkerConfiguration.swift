import TaskloopExecutors
import TaskloopHTTPClient

/// Settings of a worker; `taskloop worker`'s flags fill it.
public struct WorkerConfiguration: Sendable {
    /// The server's base URL, e.g. `http://10.0.0.5:8080` (a path prefix is kept).
    public var server: HTTPURL
    /// The queue leased from; its `dispatch` must be `workers`.
    public var queue: String
    /// Most tasks held at once (running, or being reported).
    public var concurrency: Int
    /// Kinds leased; nil: every kind this worker runs.
    public var kinds: [String]?
    /// Runs `exec` tasks; without it they are leased and failed with `exec_not_allowed`.
    public var allowExec = false
    /// How an `exec` attempt's processes are held together (`--exec-isolation`).
    public var execIsolation = ExecIsolationMode.auto
    /// Sent as `Authorization: Bearer <token>` on every call.
    public var authToken: String?
    /// Asked for with each lease; heartbeats go out at a third of it.
    public var leaseMilliseconds: UInt64 = 30_000
    /// How long a lease call may wait on the server for a task (`wait_s`, at most 60).
    public var leaseWaitSeconds = 30
    /// Time running tasks get to finish after SIGTERM before they are stopped and released.
    public var shutdownGraceMilliseconds: UInt64 = 10_000
    /// The name the server shows as the lease holder.
    public var name: String
    /// Longest wait between retries while the server is away or refuses.
    public var maxBackoffMilliseconds: UInt64 = 30_000
    /// Longest a call to the server may take, beyond the lease call's own wait.
    public var requestTimeoutMilliseconds: UInt64 = 10_000
    /// Shortest time between two progress reports of one task (later progress replaces
    /// unsent progress).
    public var progressIntervalMilliseconds: UInt64 = 200
    /// Longest a report (a finished task's outcome, a running task's progress) waits for others
    /// to share one `POST /tasks/reports` with; 0 sends each at once (still batched with those
    /// already waiting).
    public var reportLingerMilliseconds: UInt64 = 5
    /// Most reports in one `POST /tasks/reports`: a full batch leaves without waiting out the
    /// linger. At most the server's `--max-batch-items` (1000 by default); 1 is one report
    /// per call, through the single-task routes.
    public var maxReportBatch = 1_000
    /// Largest answer from the server that is read (a lease answer carries whole tasks).
    public var maxAnswerBytes = 64 << 20
    /// Where `http` tasks may connect; the worker's own calls to the server are not bound by it.
    public var httpPolicy = HostPolicy()
    /// Most connections `http` tasks open to one host.
    public var httpMaxHostConnections = 64

    /// The kinds a worker can run (`external` is the server's bookkeeping, not work).
    public static let runnableKinds = ["exec", "http", "noop", "sleep"]

    public init(server: HTTPURL, queue: String, concurrency: Int, name: String) {
        self.server = server
        self.queue = queue
        self.concurrency = concurrency
        self.name = name
    }

    /// The kinds sent with each lease call.
    var leasedKinds: [String] { kinds ?? Self.runnableKinds }
}
