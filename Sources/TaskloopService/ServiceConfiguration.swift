import TaskloopEngine
import TaskloopHTTP
import TaskloopHTTPClient

/// Settings of a running service; `taskloop`'s flags fill it.
public struct ServiceConfiguration: Sendable {
    public var http = HTTPServerConfiguration()
    public var engine = EngineConfiguration()
    public var shutdownGraceMilliseconds: UInt64 = 10_000
    /// When set, every endpoint but `GET /healthz` requires `Authorization: Bearer <token>`.
    public var authToken: String?
    /// Whether `exec` tasks may be submitted (they run with the server user's rights).
    public var allowExec = false
    /// Whether the process becomes a child subreaper (process-wide, for good), so what `exec`
    /// programs leave behind stays its child: the process-tree kill reaches it, and it is
    /// waited for once dead. The executable sets it; an embedding process may not want it.
    public var adoptsOrphans = false
    /// Where `http` tasks may connect (`--http-allow-hosts`, `--http-deny-private`).
    public var httpPolicy = HostPolicy()
    /// Most connections `http` tasks open to one host; further requests wait for one.
    public var httpMaxHostConnections = 64

    /// How changes are kept (`--durability`), and where (`--data-dir`) unless in memory.
    public var durability = Durability.memory
    public var dataDirectory = "taskloop-data"
    /// How long an `Idempotency-Key` names its creation (`--idempotency-ttl-seconds`).
    public var idempotencyTTLMilliseconds: Int64 = 86_400_000
    /// The longest a lease call waits for a task (`--max-lease-wait-seconds`); a longer `wait_s`
    /// is cut to it (the call is answered with no tasks then, as when its own time is up).
    public var maxLeaseWaitMilliseconds: UInt64 = 60_000
    /// Events kept for streams that resume (`--event-buffer`).
    public var eventBufferSize = 100_000
    /// Unsent bytes past which an event stream's reader is disconnected
    /// (`--event-client-buffer-bytes`); it resumes with `Last-Event-ID`.
    public var eventClientBufferBytes = 4 * 1024 * 1024

    /// Where the logger's lines go, for the count of dropped lines in the metrics.
    public var logSink: LogSink?

    public init() {}
}
