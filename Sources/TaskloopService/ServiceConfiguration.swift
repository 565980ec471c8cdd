import TaskloopEngine
import TaskloopExecutors
import TaskloopHTTP
import TaskloopHTTPClient

/// Settings of a running service; `taskloop`'s flags fill it.
public struct ServiceConfiguration: Sendable {
    public var http = HTTPServerConfiguration()
    public var engine = EngineConfiguration()
    public var shutdownGraceMilliseconds: UInt64 = 10_000
    /// When set, every endpoint but `GET /healthz` and the dashboard's files requires
    /// `Authorization: Bearer <token>` (`--auth-token`, an admin token).
    public var authToken: String?
    /// `--auth-token-file`: tokens with roles, one per line, re-read by `reloadTokens()`.
    public var authTokenFile: String?
    /// `--allowed-hosts`: Host names answered besides the loopback ones (without a token, no
    /// other is); `name`, `name:port` or `*.domain`.
    public var allowedHosts: [String] = []
    /// `--allowed-origins`: web origins whose pages may call the API (CORS), `https://app.example`.
    public var allowedOrigins: [String] = []
    /// Whether `exec` tasks may be submitted (they run with the server user's rights).
    public var allowExec = false
    /// How an `exec` attempt's processes are held together (`--exec-isolation`).
    public var execIsolation = ExecIsolationMode.auto
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
    /// Several replicas on one PostgreSQL (`--database-url`): the database, this replica's name
    /// (unique among them), and how long a replica that stops renewing its lease is waited for
    /// before others take over what it ran. Nil: the embedded store, as `durability` says.
    public var sharedDatabase: SharedDatabaseSettings?
    /// How long an `Idempotency-Key` names its creation (`--idempotency-ttl-seconds`).
    public var idempotencyTTLMilliseconds: Int64 = 86_400_000
    /// Keys remembered at once (`--max-idempotency-keys`); past it a new key is refused (429).
    public var maxIdempotencyKeys = 1_000_000
    /// The longest a lease call waits for a task (`--max-lease-wait-seconds`); a longer `wait_s`
    /// is cut to it (the call is answered with no tasks then, as when its own time is up).
    public var maxLeaseWaitMilliseconds: UInt64 = 60_000
    /// Events kept for streams that resume (`--event-buffer`)...
    public var eventBufferSize = 100_000
    /// ...and the most bytes of them kept rendered (`--event-buffer-bytes`).
    public var eventBufferBytes = 256 << 20
    /// How long the shared database keeps events (and removals) for resumes and for replicas
    /// catching up (`--event-history-seconds`).
    public var eventHistoryMilliseconds: Int64 = 3_600_000
    /// A page of `GET /tasks` stops once its body passes this (`--max-response-bytes`); its
    /// `next` goes on from there.
    public var maxResponseBytes = 64 << 20
    /// The most items one `POST /tasks/batch` or `POST /tasks/reports` may carry
    /// (`--max-batch-items`); the body size limit applies as well.
    public var maxBatchItems = 1_000
    /// Unsent bytes past which an event stream's reader is disconnected
    /// (`--event-client-buffer-bytes`); it resumes with `Last-Event-ID`.
    public var eventClientBufferBytes = 4 * 1024 * 1024
    /// Event streams are written at most once per this many milliseconds
    /// (`--event-write-interval-ms`); 0 writes at the end of every loop turn that published.
    public var eventWriteIntervalMilliseconds: UInt64 = 5

    public var webhooks = WebhookSettings()

    /// Where the logger's lines go, for the count of dropped lines in the metrics.
    public var logSink: LogSink?

    public init() {}
}

/// How webhooks deliver (`--webhook-*`, `--max-webhooks`).
public struct WebhookSettings: Sendable, Equatable {
    /// Waits before each retry after a failed attempt; when they run out the delivery fails.
    public var retrySchedule: [UInt64] = [5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000]
    /// One attempt's limit, connecting included.
    public var attemptTimeoutMilliseconds: UInt64 = 15_000
    /// Attempts in flight to one webhook at a time; the rest wait their turn.
    public var maxInFlight = 4
    /// Deliveries not yet finished per webhook; events past it are recorded as failed
    /// (`backlog_full`) instead of piling up behind a receiver that is down.
    public var maxPending = 10_000
    /// Entries (attempts) of finished deliveries kept per webhook for `GET /webhooks/{id}/deliveries`.
    public var deliveryLog = 1_000
    public var maxWebhooks = 100

    public init() {}

    /// `5s,5m,30m,2h`: each a whole number with a unit of ms, s, m or h, at most a week; the
    /// empty text is no retries. Nil if it is not such a list.
    public static func parseSchedule(_ text: String) -> [UInt64]? {
        guard !text.isEmpty else { return [] }
        let units: [(suffix: String, scale: UInt64)] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)]
        var schedule: [UInt64] = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let digits = item.prefix { $0.isASCII && $0.isNumber }
            guard !digits.isEmpty, digits.count <= 12, let count = UInt64(digits),
                  let unit = units.first(where: { $0.suffix == item.dropFirst(digits.count) }),
                  count * unit.scale <= 7 * 86_400_000 else { return nil }
            schedule.append(count * unit.scale)
        }
        return schedule.count <= 100 ? schedule : nil
    }
}

public struct SharedDatabaseSettings: Sendable {
    public var url: String
    public var replica: String
    public var leaseMilliseconds: UInt64 = 10_000
    /// How long PostgreSQL lets a statement, a lock wait or a replica idle inside a
    /// transaction last, and about how long a silent connection is kept (`PGTimeouts`).
    public var timeoutSeconds = 5
    /// The cell count of a cluster this replica creates (`--cells`); a cluster keeps its own.
    public var cells = 256
    /// Where other replicas forward requests for this replica's cells (`host:port`); nil: the
    /// address the server is bound to.
    public var advertiseAddress: String?
    /// How often a following event feed reads without a notification (tests make it long, to
    /// show that notifications alone bring the events).
    var eventPollMilliseconds: UInt64 = 100
    /// How long a replica whose cells have moved keeps its kept-alive connections open as it
    /// stops: the others learn of the move at their next renewal, which its announcement brings
    /// forward to a round trip; meanwhile a request they forward here is answered (the cell
    /// moved on, and they ask its new owner) instead of being cut off with its connection,
    /// which for a change could not be told from one made.
    var releasedCellsLingerMilliseconds: UInt64 = 500

    public init(url: String, replica: String) {
        self.url = url
        self.replica = replica
    }
}
