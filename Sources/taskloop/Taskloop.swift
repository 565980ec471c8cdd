import ArgumentParser
import Dispatch
import Glibc
import Logging
import TaskloopExecutors
import TaskloopHTTP
import TaskloopLoop
import TaskloopHTTPClient
import TaskloopService

@main
struct Taskloop: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "taskloop",
        abstract: "A task-orchestration service: submit tasks over HTTP, watch them run, cancel them.",
        discussion: "Every option can also be set with an environment variable TASKLOOP_<OPTION>, "
            + "e.g. TASKLOOP_PORT=9000; a flag on the command line wins.",
        subcommands: [Backup.self, Worker.self, Submit.self, Get.self, List.self, Cancel.self, Retry.self, Watch.self,
                      ScheduleGroup.self, QueueGroup.self])

    @Option(help: "Address to listen on (IPv4, IPv6 or a host name). [env: TASKLOOP_HOST]")
    var host: String = Environment.string("HOST") ?? "127.0.0.1"

    @Option(help: "TCP port; 0 picks a free one. [env: TASKLOOP_PORT]")
    var port: Int = Environment.int("PORT") ?? 8080

    @Option(help: "Largest accepted request body in bytes, and largest task params once resolved. [env: TASKLOOP_MAX_BODY_BYTES]")
    var maxBodyBytes: Int = Environment.int("MAX_BODY_BYTES") ?? 1024 * 1024

    @Option(help: "Largest accepted request header section in bytes, at most 81920. [env: TASKLOOP_MAX_HEADER_BYTES]")
    var maxHeaderBytes: Int = Environment.int("MAX_HEADER_BYTES") ?? 16 * 1024

    @Option(help: "Seconds a client has to send a request's headers. [env: TASKLOOP_HEADER_TIMEOUT_SECONDS]")
    var headerTimeoutSeconds: Double = Environment.double("HEADER_TIMEOUT_SECONDS") ?? 10

    @Option(help: "Seconds a client has to send a request's whole body, once its headers are in. [env: TASKLOOP_BODY_TIMEOUT_SECONDS]")
    var bodyTimeoutSeconds: Double = Environment.double("BODY_TIMEOUT_SECONDS") ?? 30

    @Option(help: "Seconds an idle keep-alive connection stays open. [env: TASKLOOP_IDLE_TIMEOUT_SECONDS]")
    var idleTimeoutSeconds: Double = Environment.double("IDLE_TIMEOUT_SECONDS") ?? 60

    @Option(help: "Most open client connections. [env: TASKLOOP_MAX_CONNECTIONS]")
    var maxConnections: Int = Environment.int("MAX_CONNECTIONS") ?? 10_000

    @Option(help: "Seconds to finish in-flight work on SIGTERM/SIGINT. [env: TASKLOOP_SHUTDOWN_GRACE_SECONDS]")
    var shutdownGraceSeconds: Double = Environment.double("SHUTDOWN_GRACE_SECONDS") ?? 10

    @Option(help: "An admin token, at least 16 characters: every endpoint but /healthz and /ui then requires `Authorization: Bearer <token>`. Visible to `ps`: prefer --auth-token-file. [env: TASKLOOP_AUTH_TOKEN]")
    var authToken: String?

    /// The flag, else the environment; empty means none.
    var effectiveAuthToken: String? {
        (authToken ?? Environment.string("AUTH_TOKEN")).flatMap { $0.isEmpty ? nil : $0 }
    }

    @Option(help: ArgumentHelp(
        "A file of tokens, one per line, each optionally followed by its role: admin (the default), read or worker; re-read on SIGHUP. [env: TASKLOOP_AUTH_TOKEN_FILE]",
        valueName: "path"))
    var authTokenFile: String? = Environment.string("AUTH_TOKEN_FILE").flatMap { $0.isEmpty ? nil : $0 }

    @Flag(help: "Listen on a non-loopback address without any token (anyone who reaches the port may run tasks). [env: TASKLOOP_INSECURE_NO_AUTH]")
    var insecureNoAuth: Bool = Environment.bool("INSECURE_NO_AUTH") ?? false

    @Option(help: ArgumentHelp(
        "Comma-separated Host names answered besides localhost, 127.0.0.1 and [::1] (name, name:port or *.domain); without a token no other is. [env: TASKLOOP_ALLOWED_HOSTS]",
        valueName: "hosts"))
    var allowedHosts: String = Environment.string("ALLOWED_HOSTS") ?? ""

    @Option(help: ArgumentHelp(
        "Comma-separated web origins (https://app.example.com) whose pages may call the API: CORS for exactly these. [env: TASKLOOP_ALLOWED_ORIGINS]",
        valueName: "origins"))
    var allowedOrigins: String = Environment.string("ALLOWED_ORIGINS") ?? ""

    static func list(_ text: String) -> [String] {
        text.split(separator: ",").map { String($0.filter { $0 != " " }) }.filter { !$0.isEmpty }
    }

    @Flag(inversion: .prefixedNo,
          help: "Accept `exec` tasks; API clients then run programs with this server user's rights. [env: TASKLOOP_ALLOW_EXEC]")
    var allowExec: Bool = Environment.bool("ALLOW_EXEC") ?? false

    @Option(help: ArgumentHelp(
        "What holds an `exec` attempt's processes together: auto (a cgroup of its own, killed whole, where this process can make cgroup v2 groups; else cookie), cgroup (refuse to start without), cookie (process group and environment cookie only). [env: TASKLOOP_EXEC_ISOLATION]",
        valueName: "mode"))
    var execIsolation: String = Environment.string("EXEC_ISOLATION") ?? "auto"

    /// `--exec-isolation` read, for the server and the worker.
    func execIsolationMode() throws -> ExecIsolationMode {
        guard let mode = ExecIsolationMode(rawValue: execIsolation) else {
            throw ValidationError("--exec-isolation must be auto, cgroup or cookie")
        }
        return mode
    }

    @Option(help: ArgumentHelp(
        "Comma-separated hosts `http` tasks may fetch from: api.example.com, *.example.com (subdomains), 10.0.0.7, [fd00::1], each optionally :port; default: any. Redirects are checked too. [env: TASKLOOP_HTTP_ALLOW_HOSTS]",
        valueName: "patterns"))
    var httpAllowHosts: String = Environment.string("HTTP_ALLOW_HOSTS") ?? ""

    @Flag(name: .customLong("http-deny-private"), inversion: .prefixedNo,
          help: "Refuse `http` tasks' and webhooks' connections to loopback, private and other internal addresses, checked after DNS resolution; default: on when --host is not a loopback address. [env: TASKLOOP_HTTP_DENY_PRIVATE]")
    var httpDenyPrivateFlag: Bool?

    /// The flag, else the environment; nil when neither says.
    var httpDenyPrivate: Bool? { httpDenyPrivateFlag ?? Environment.bool("HTTP_DENY_PRIVATE") }

    @Option(help: "Most connections `http` tasks open to one host; further requests to it wait for a free one. [env: TASKLOOP_HTTP_MAX_HOST_CONNECTIONS]")
    var httpMaxHostConnections: Int = Environment.int("HTTP_MAX_HOST_CONNECTIONS") ?? 64

    /// `--http-allow-hosts` parsed; nil entries are invalid patterns.
    var allowedHostPatterns: [(String, HostPattern?)] {
        httpAllowHosts.split(separator: ",").map { String($0.filter { $0 != " " }) }.filter { !$0.isEmpty }
            .map { ($0, HostPattern($0)) }
    }

    @Option(help: "max_concurrency of queues created on first use; default: the number of cores. [env: TASKLOOP_DEFAULT_CONCURRENCY]")
    var defaultConcurrency: Int = Environment.int("DEFAULT_CONCURRENCY") ?? Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))

    @Option(help: "Most queues known at once; a new one beyond is refused with 422 (idle queues with default settings are forgotten first). [env: TASKLOOP_MAX_QUEUES]")
    var maxQueues: Int = Environment.int("MAX_QUEUES") ?? 1_000

    @Option(help: "Most schedules held; a new one beyond is refused with 409 too_many_schedules. [env: TASKLOOP_MAX_SCHEDULES]")
    var maxSchedules: Int = Environment.int("MAX_SCHEDULES") ?? 10_000

    @Option(help: "Most unfinished tasks held; submissions beyond are refused with 429. [env: TASKLOOP_MAX_UNFINISHED_TASKS]")
    var maxUnfinishedTasks: Int = Environment.int("MAX_UNFINISHED_TASKS") ?? 100_000

    @Option(help: "How far ahead run_at, delay_ms, expires_at and ttl_ms may reach, in milliseconds; beyond is refused with 422. [env: TASKLOOP_MAX_SCHEDULE_AHEAD_MS]")
    var maxScheduleAheadMs: Int = Environment.int("MAX_SCHEDULE_AHEAD_MS") ?? 366 * 86_400_000

    @Option(help: "Seconds a finished task stays readable. [env: TASKLOOP_RETENTION_SECONDS]")
    var retentionSeconds: Double = Environment.double("RETENTION_SECONDS") ?? 3_600

    @Option(help: "Most finished tasks kept; the oldest are forgotten first. [env: TASKLOOP_MAX_RETAINED_TASKS]")
    var maxRetainedTasks: Int = Environment.int("MAX_RETAINED_TASKS") ?? 100_000

    @Option(help: "Longest unique_for_ms a task may carry, in milliseconds, 1...31536000000; a finished task's unique_key is remembered this long. [env: TASKLOOP_MAX_UNIQUE_FOR_MS]")
    var maxUniqueForMs: Int = Environment.int("MAX_UNIQUE_FOR_MS") ?? 86_400_000

    @Option(help: "Most unique keys of forgotten tasks remembered, 0...100000000; past it the oldest go before their time. [env: TASKLOOP_MAX_FORGOTTEN_UNIQUE_KEYS]")
    var maxForgottenUniqueKeys: Int = Environment.int("MAX_FORGOTTEN_UNIQUE_KEYS") ?? 100_000

    @Option(help: "full (answer after fsync), normal (after the write-ahead log) or memory (nothing on disk). [env: TASKLOOP_DURABILITY]")
    var durability: String = Environment.string("DURABILITY") ?? "full"

    @Option(help: "Where the database and its lock live (not touched with --durability memory). [env: TASKLOOP_DATA_DIR]")
    var dataDir: String = Environment.string("DATA_DIR") ?? "taskloop-data"

    @Option(help: "PostgreSQL shared by several replicas (postgres://user:password@host:port/database), instead of the embedded store in --data-dir. [env: TASKLOOP_DATABASE_URL]")
    var databaseURL: String? = Environment.string("DATABASE_URL")

    @Option(help: "This replica's name among those sharing --database-url; unique among them, kept across its restarts. Default: the host name and process id. [env: TASKLOOP_REPLICA_NAME]")
    var replicaName: String? = Environment.string("REPLICA_NAME")

    @Option(help: "Seconds a replica that stops renewing its lease is waited for before the others take over what it ran, 1...600. [env: TASKLOOP_REPLICA_LEASE_SECONDS]")
    var replicaLeaseSeconds: Double = Environment.double("REPLICA_LEASE_SECONDS") ?? 10

    @Option(help: "Cells of a cluster this replica creates (--database-url), 1...65536; a cluster keeps the count it was created with. [env: TASKLOOP_CELLS]")
    var cells: Int = Environment.int("CELLS") ?? 256

    @Option(help: "host:port where other replicas reach this one (--database-url). Default: the address it listens on. [env: TASKLOOP_ADVERTISE_ADDRESS]")
    var advertiseAddress: String? = Environment.string("ADVERTISE_ADDRESS")

    @Option(help: "Seconds PostgreSQL lets a statement, a lock wait, or a replica idle inside a transaction (frozen: SIGSTOP, a paused VM) last before ending it; a connection that stays silent is given up after about twice this (TCP keepalives), 1...3600. [env: TASKLOOP_DATABASE_TIMEOUT_SECONDS]")
    var databaseTimeoutSeconds: Int = Environment.int("DATABASE_TIMEOUT_SECONDS") ?? 5

    @Option(help: "Seconds an Idempotency-Key names what its first request created. [env: TASKLOOP_IDEMPOTENCY_TTL_SECONDS]")
    var idempotencyTTLSeconds: Int = Environment.int("IDEMPOTENCY_TTL_SECONDS") ?? 86_400

    @Option(help: "Idempotency keys remembered at once, 1...100000000; past it a request with a new key gets 429 too_many_idempotency_keys. [env: TASKLOOP_MAX_IDEMPOTENCY_KEYS]")
    var maxIdempotencyKeys: Int = Environment.int("MAX_IDEMPOTENCY_KEYS") ?? 1_000_000

    @Option(help: "Longest a worker's lease call waits for a task, 0...60; a longer wait_s is cut to it. [env: TASKLOOP_MAX_LEASE_WAIT_SECONDS]")
    var maxLeaseWaitSeconds: Double = Environment.double("MAX_LEASE_WAIT_SECONDS") ?? 60

    @Option(help: "Events kept for event streams that resume (GET /events with Last-Event-ID), 1...10000000. [env: TASKLOOP_EVENT_BUFFER]")
    var eventBuffer: Int = Environment.int("EVENT_BUFFER") ?? 100_000

    @Option(help: "Most bytes of rendered events kept for streams that resume, besides --event-buffer's count, 1048576...17179869184. [env: TASKLOOP_EVENT_BUFFER_BYTES]")
    var eventBufferBytes: Int = Environment.int("EVENT_BUFFER_BYTES") ?? 256 << 20

    @Option(help: "Seconds of events the shared database (--database-url) keeps for streams that resume on any replica, and of deletions for replicas catching up, 60...2592000. [env: TASKLOOP_EVENT_HISTORY_SECONDS]")
    var eventHistorySeconds: Int = Environment.int("EVENT_HISTORY_SECONDS") ?? 3_600

    @Option(help: "A page of GET /tasks stops once its body passes this many bytes (its `next` goes on), 65536...4294967296. [env: TASKLOOP_MAX_RESPONSE_BYTES]")
    var maxResponseBytes: Int = Environment.int("MAX_RESPONSE_BYTES") ?? 64 << 20

    @Option(help: "Items one POST /tasks/batch or POST /tasks/reports may carry (more is 422 too_many_items; --max-body-bytes applies too), 1...100000. [env: TASKLOOP_MAX_BATCH_ITEMS]")
    var maxBatchItems: Int = Environment.int("MAX_BATCH_ITEMS") ?? 1_000

    @Option(help: "Unsent bytes past which an event stream's reader is disconnected (it resumes), 65536...1073741824. [env: TASKLOOP_EVENT_CLIENT_BUFFER_BYTES]")
    var eventClientBufferBytes: Int = Environment.int("EVENT_CLIENT_BUFFER_BYTES") ?? 4 * 1024 * 1024

    @Option(help: "Event streams are written at most once per this many milliseconds, each write carrying what was published meanwhile (0: at the end of every loop turn), 0...1000. [env: TASKLOOP_EVENT_WRITE_INTERVAL_MS]")
    var eventWriteIntervalMs: Int = Environment.int("EVENT_WRITE_INTERVAL_MS") ?? 5

    @Option(help: "Waits before each retry of a failed webhook delivery, comma-separated, each a whole number with ms, s, m or h (at most 7 days, at most 100 of them; empty: no retries). [env: TASKLOOP_WEBHOOK_RETRY_SCHEDULE]")
    var webhookRetrySchedule: String = Environment.string("WEBHOOK_RETRY_SCHEDULE") ?? "5s,5m,30m,2h,5h,10h,10h"

    @Option(help: "Longest one webhook delivery attempt may take, connecting included, 1...300 seconds. [env: TASKLOOP_WEBHOOK_TIMEOUT_SECONDS]")
    var webhookTimeoutSeconds: Double = Environment.double("WEBHOOK_TIMEOUT_SECONDS") ?? 15

    @Option(help: "Delivery attempts in flight to one webhook at a time, 1...1000. [env: TASKLOOP_WEBHOOK_MAX_IN_FLIGHT]")
    var webhookMaxInFlight: Int = Environment.int("WEBHOOK_MAX_IN_FLIGHT") ?? 4

    @Option(help: "Unfinished deliveries per webhook; later events are logged as failed (backlog_full), 1...1000000. [env: TASKLOOP_WEBHOOK_MAX_PENDING]")
    var webhookMaxPending: Int = Environment.int("WEBHOOK_MAX_PENDING") ?? 10_000

    @Option(help: "Attempts of finished deliveries kept per webhook in its delivery log, 1...100000. [env: TASKLOOP_WEBHOOK_DELIVERY_LOG]")
    var webhookDeliveryLog: Int = Environment.int("WEBHOOK_DELIVERY_LOG") ?? 1_000

    @Option(help: "Most webhooks the server keeps, 0...10000. [env: TASKLOOP_MAX_WEBHOOKS]")
    var maxWebhooks: Int = Environment.int("MAX_WEBHOOKS") ?? 100

    @Option(help: "trace, debug, info, notice, warning, error or critical. [env: TASKLOOP_LOG_LEVEL]")
    var logLevel: String = Environment.string("LOG_LEVEL") ?? "info"

    @Option(help: "text or json (one object per line), on standard error. [env: TASKLOOP_LOG_FORMAT]")
    var logFormat: String = Environment.string("LOG_FORMAT") ?? "text"

    @Option(help: "Bytes of log lines held for a slow reader of standard error; beyond them lines are dropped and counted, never waited for. [env: TASKLOOP_LOG_BUFFER_BYTES]")
    var logBufferBytes: Int = Environment.int("LOG_BUFFER_BYTES") ?? 1 << 20

    @Flag(help: "Ask the server at --host/--port for /healthz and exit 0 if it answers 200, else 1 (for container health checks).")
    var healthCheck = false

    func validate() throws {
        guard (0...65535).contains(port) else { throw ValidationError("--port must be 0...65535") }
        guard maxBodyBytes >= 0 else { throw ValidationError("--max-body-bytes must not be negative") }
        // http_parser stops at its compiled-in 80 KiB anyway; a larger setting would not apply.
        guard (256...80 * 1024).contains(maxHeaderBytes) else {
            throw ValidationError("--max-header-bytes must be 256...81920")
        }
        guard maxConnections >= 1 else { throw ValidationError("--max-connections must be at least 1") }
        guard (1...10_000).contains(defaultConcurrency) else {
            throw ValidationError("--default-concurrency must be 1...10000")
        }
        guard maxUnfinishedTasks >= 1 else { throw ValidationError("--max-unfinished-tasks must be at least 1") }
        guard maxScheduleAheadMs >= 1 else { throw ValidationError("--max-schedule-ahead-ms must be at least 1") }
        guard maxQueues >= 1 else { throw ValidationError("--max-queues must be at least 1") }
        guard maxSchedules >= 0 else { throw ValidationError("--max-schedules must be at least 0") }
        guard maxRetainedTasks >= 0 else { throw ValidationError("--max-retained-tasks must not be negative") }
        guard (1...31_536_000_000).contains(maxUniqueForMs) else {
            throw ValidationError("--max-unique-for-ms must be 1...31536000000")
        }
        guard (0...100_000_000).contains(maxForgottenUniqueKeys) else {
            throw ValidationError("--max-forgotten-unique-keys must be 0...100000000")
        }
        guard retentionSeconds >= 0 && retentionSeconds <= 31_536_000 else {
            throw ValidationError("--retention-seconds must be a non-negative number")
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard (1...10_000).contains(httpMaxHostConnections) else {
            throw ValidationError("--http-max-host-connections must be 1...10000")
        }
        for (text, pattern) in allowedHostPatterns where pattern == nil {
            throw ValidationError("--http-allow-hosts: \(text) is not a host pattern (host, *.domain or IP address, optionally :port)")
        }
        guard LogFormat(rawValue: logFormat) != nil else { throw ValidationError("--log-format must be text or json") }
        guard Durability(rawValue: durability) != nil else { throw ValidationError("--durability must be full, normal or memory") }
        guard !dataDir.isEmpty else { throw ValidationError("--data-dir must name a directory") }
        if let databaseURL {
            guard !databaseURL.isEmpty else { throw ValidationError("--database-url must not be empty") }
            guard durability != "memory" else {
                throw ValidationError("--durability memory cannot be used with --database-url: replicas share their state through it")
            }
        }
        if let replicaName {
            guard (1...64).contains(replicaName.utf8.count), replicaName.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
                throw ValidationError("--replica-name must be 1 to 64 visible ASCII characters")
            }
        }
        guard (1...65_536).contains(cells) else { throw ValidationError("--cells must be 1...65536") }
        if let advertiseAddress {
            guard let colon = advertiseAddress.lastIndex(of: ":"), colon != advertiseAddress.startIndex,
                  let port = UInt16(advertiseAddress[advertiseAddress.index(after: colon)...]), port > 0 else {
                throw ValidationError("--advertise-address must be host:port")
            }
        }
        // Other replicas forward requests to the address a replica advertises: one that listens
        // on every address has none they could use unless it is told.
        if databaseURL != nil, advertiseAddress == nil, ["0.0.0.0", "::", "[::]"].contains(host) {
            throw ValidationError("--advertise-address is required with --database-url on \(host): "
                                  + "the address other replicas reach this one at")
        }
        guard (1...600).contains(replicaLeaseSeconds) else { throw ValidationError("--replica-lease-seconds must be 1...600") }
        guard (1...3_600).contains(databaseTimeoutSeconds) else { throw ValidationError("--database-timeout-seconds must be 1...3600") }
        guard (1...31_536_000).contains(idempotencyTTLSeconds) else {
            throw ValidationError("--idempotency-ttl-seconds must be 1...31536000")
        }
        guard (1...100_000_000).contains(maxIdempotencyKeys) else {
            throw ValidationError("--max-idempotency-keys must be 1...100000000")
        }
        guard (0...60).contains(maxLeaseWaitSeconds) else { throw ValidationError("--max-lease-wait-seconds must be 0...60") }
        guard (1...10_000_000).contains(eventBuffer) else { throw ValidationError("--event-buffer must be 1...10000000") }
        guard (60...2_592_000).contains(eventHistorySeconds) else {
            throw ValidationError("--event-history-seconds must be 60...2592000")
        }
        guard (1 << 20...1 << 34).contains(eventBufferBytes) else {
            throw ValidationError("--event-buffer-bytes must be 1048576...17179869184")
        }
        guard (1...100_000).contains(maxBatchItems) else { throw ValidationError("--max-batch-items must be 1...100000") }
        guard (65_536...1 << 32).contains(maxResponseBytes) else {
            throw ValidationError("--max-response-bytes must be 65536...4294967296")
        }
        guard (65_536...1 << 30).contains(eventClientBufferBytes) else {
            throw ValidationError("--event-client-buffer-bytes must be 65536...1073741824")
        }
        guard (0...1_000).contains(eventWriteIntervalMs) else { throw ValidationError("--event-write-interval-ms must be 0...1000") }
        guard WebhookSettings.parseSchedule(webhookRetrySchedule) != nil else {
            throw ValidationError("--webhook-retry-schedule must be durations like 5s,5m,30m,2h (units ms, s, m, h; each at most 7 days)")
        }
        guard (1...300).contains(webhookTimeoutSeconds) else { throw ValidationError("--webhook-timeout-seconds must be 1...300") }
        guard (1...1_000).contains(webhookMaxInFlight) else { throw ValidationError("--webhook-max-in-flight must be 1...1000") }
        guard (1...1_000_000).contains(webhookMaxPending) else { throw ValidationError("--webhook-max-pending must be 1...1000000") }
        guard (1...100_000).contains(webhookDeliveryLog) else { throw ValidationError("--webhook-delivery-log must be 1...100000") }
        guard (0...10_000).contains(maxWebhooks) else { throw ValidationError("--max-webhooks must be 0...10000") }
        guard (4_096...1 << 30).contains(logBufferBytes) else { throw ValidationError("--log-buffer-bytes must be 4096...1073741824") }
        if let authToken = effectiveAuthToken {
            do { _ = try AccessToken(authToken) } catch { throw ValidationError("--auth-token: \(error.reason)") }
        }
        if let authTokenFile {
            do { _ = try AccessToken.readFile(authTokenFile) } catch { throw ValidationError("--auth-token-file: \(error.reason)") }
        }
        for origin in Self.list(allowedOrigins) where !(origin.hasPrefix("http://") || origin.hasPrefix("https://")) || origin.hasSuffix("/") {
            throw ValidationError("--allowed-origins: \(origin) is not an origin (scheme://host[:port], no path)")
        }
        for (name, value) in [("--header-timeout-seconds", headerTimeoutSeconds),
                              ("--body-timeout-seconds", bodyTimeoutSeconds),
                              ("--idle-timeout-seconds", idleTimeoutSeconds),
                              ("--shutdown-grace-seconds", shutdownGraceSeconds)] where !(value >= 0 && value <= 31_536_000) {
            throw ValidationError("\(name) must be a number of seconds from 0 to 31536000")
        }
    }

    func run() throws {
        if healthCheck {
            throw ExitCode(HealthProbe.check(host: host, port: port) ? 0 : 1)
        }
        let listensBeyondThisMachine: Bool
        do {
            listensBeyondThisMachine = try !SocketAddress.resolve(host: host, port: port).isLoopback
        } catch {
            throw ValidationError("--host: \(error)")
        }
        if listensBeyondThisMachine && effectiveAuthToken == nil && authTokenFile == nil && !insecureNoAuth {
            throw ValidationError("--host \(host) is not a loopback address, and without a token anyone who reaches it may run tasks: "
                + "give --auth-token-file (a file of tokens; or --auth-token), or --insecure-no-auth to listen open on purpose")
        }
        var configuration = ServiceConfiguration()
        configuration.http.host = host
        configuration.http.port = port
        configuration.http.parserLimits.maxBodyBytes = maxBodyBytes
        configuration.engine.maxResolvedParamsBytes = maxBodyBytes
        configuration.http.parserLimits.maxHeaderBytes = maxHeaderBytes
        configuration.http.headerTimeoutMilliseconds = UInt64(headerTimeoutSeconds * 1000)
        configuration.http.bodyTimeoutMilliseconds = UInt64(bodyTimeoutSeconds * 1000)
        configuration.http.idleTimeoutMilliseconds = UInt64(idleTimeoutSeconds * 1000)
        configuration.http.maxConnections = maxConnections
        configuration.shutdownGraceMilliseconds = UInt64(shutdownGraceSeconds * 1000)
        configuration.authToken = effectiveAuthToken
        configuration.authTokenFile = authTokenFile
        configuration.allowedHosts = Self.list(allowedHosts)
        configuration.allowedOrigins = Self.list(allowedOrigins)
        configuration.allowExec = allowExec
        configuration.execIsolation = try execIsolationMode()
        configuration.adoptsOrphans = allowExec
        configuration.httpMaxHostConnections = httpMaxHostConnections
        // A server others can reach must not be their way into this machine's network.
        configuration.httpPolicy = HostPolicy(allowedHosts: allowedHostPatterns.compactMap(\.1),
                                              denyPrivateAddresses: httpDenyPrivate ?? listensBeyondThisMachine)
        configuration.engine.defaultConcurrency = defaultConcurrency
        configuration.engine.maxUnfinishedTasks = maxUnfinishedTasks
        configuration.engine.maxScheduleAheadMilliseconds = UInt64(maxScheduleAheadMs)
        configuration.engine.maxQueues = maxQueues
        configuration.engine.maxSchedules = maxSchedules
        configuration.engine.maxRetainedTasks = maxRetainedTasks
        configuration.engine.retentionMilliseconds = UInt64(retentionSeconds * 1000)
        configuration.engine.maxUniqueForMilliseconds = UInt64(maxUniqueForMs)
        configuration.engine.maxForgottenUniqueKeys = maxForgottenUniqueKeys
        configuration.engine.cancelGraceMilliseconds = configuration.shutdownGraceMilliseconds
        configuration.durability = Durability(rawValue: durability)!
        configuration.dataDirectory = dataDir
        if let databaseURL {
            var settings = SharedDatabaseSettings(url: databaseURL, replica: replicaName ?? Self.defaultReplicaName())
            settings.leaseMilliseconds = UInt64(replicaLeaseSeconds * 1_000)
            settings.timeoutSeconds = databaseTimeoutSeconds
            settings.cells = cells
            settings.advertiseAddress = advertiseAddress
            configuration.sharedDatabase = settings
        }
        configuration.idempotencyTTLMilliseconds = Int64(idempotencyTTLSeconds) * 1_000
        configuration.maxIdempotencyKeys = maxIdempotencyKeys
        configuration.maxLeaseWaitMilliseconds = UInt64(maxLeaseWaitSeconds * 1_000)
        configuration.eventBufferSize = eventBuffer
        configuration.eventClientBufferBytes = eventClientBufferBytes
        configuration.eventWriteIntervalMilliseconds = UInt64(eventWriteIntervalMs)
        configuration.eventBufferBytes = eventBufferBytes
        configuration.eventHistoryMilliseconds = Int64(eventHistorySeconds) * 1_000
        configuration.maxResponseBytes = maxResponseBytes
        configuration.maxBatchItems = maxBatchItems
        configuration.webhooks.retrySchedule = WebhookSettings.parseSchedule(webhookRetrySchedule)!
        configuration.webhooks.attemptTimeoutMilliseconds = UInt64(webhookTimeoutSeconds * 1_000)
        configuration.webhooks.maxInFlight = webhookMaxInFlight
        configuration.webhooks.maxPending = webhookMaxPending
        configuration.webhooks.deliveryLog = webhookDeliveryLog
        configuration.webhooks.maxWebhooks = maxWebhooks

        let level = Logger.Level(rawValue: logLevel)!
        let format = LogFormat(rawValue: logFormat)!
        let logSink = LogSink(capacity: logBufferBytes)
        LoggingSystem.bootstrap { label in format.makeHandler(label: label, level: level, sink: logSink) }
        configuration.logSink = logSink
        let logger = Logger(label: "taskloop")
        if listensBeyondThisMachine && insecureNoAuth && effectiveAuthToken == nil && authTokenFile == nil {
            logger.warning("listening on \(host) without a token (--insecure-no-auth): anyone who reaches it may run and cancel tasks")
        }
        if listensBeyondThisMachine && httpDenyPrivate == false {
            logger.warning("--no-http-deny-private on a non-loopback address: http tasks may reach this machine's private network")
        }

        let loop = try EventLoop()
        let application = TaskloopApplication(loop: loop, configuration: configuration, logger: logger)
        let address: SocketAddress
        do {
            address = try application.start()
        } catch {
            throw ValidationError("\(error)")
        }
        // The story ends within the grace and half a second (`TaskloopApplication`).
        try runUntilSignalled(loop, program: "taskloop", grace: shutdownGraceSeconds, stopping: "finishing in-flight requests",
                              started: "taskloop listening on http://\(address)",
                              reload: authTokenFile == nil ? nil : { application.reloadTokens() }) { finished in
            application.stop(completion: finished)
        }
        logSink.flush()
        print("taskloop stopped")
    }
}

extension Taskloop {
    /// The host's name and this process's id: unique among replicas on their hosts.
    static func defaultReplicaName() -> String {
        var name = [CChar](repeating: 0, count: 256)
        gethostname(&name, name.count - 1)
        return "\(String(cString: name))-\(getpid())"
    }
}

/// Reads `TASKLOOP_<NAME>` defaults for the flags.
enum Environment {
    static func string(_ name: String) -> String? {
        getenv("TASKLOOP_" + name).map { String(cString: $0) }
    }

    static func int(_ name: String) -> Int? { string(name).flatMap { Int($0) } }

    static func double(_ name: String) -> Double? { string(name).flatMap { Double($0) } }

    static func bool(_ name: String) -> Bool? {
        switch string(name)?.lowercased() {
        case "1", "true", "yes", "on": true
        case "0", "false", "no", "off", "": false
        default: nil
        }
    }
}
