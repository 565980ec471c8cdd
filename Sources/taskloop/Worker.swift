import ArgumentParser
import Dispatch
import Glibc
import Logging
import TaskloopEngine
import TaskloopHTTPClient
import TaskloopLoop
import TaskloopService
import TaskloopWorker

/// `taskloop worker`: the reference worker. Leases tasks of a `dispatch: workers` queue from a
/// server and runs them here as the server would.
struct Worker: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Lease tasks of a queue from a server and run them here (noop, sleep, http, exec).",
        discussion: """
            The queue must be dispatched to workers: PATCH /queues/NAME {"dispatch":"workers"}.
            The server's options --auth-token, --allow-exec, --exec-isolation, --shutdown-grace-seconds, --log-level, \
            --log-format, --log-buffer-bytes, --http-allow-hosts, --http-deny-private and \
            --http-max-host-connections apply to the worker too (see taskloop --help), with the same \
            environment variables. A 401 from the server is logged and retried with backoff, like an \
            unreachable server. On SIGTERM or SIGINT the worker stops leasing, gives running tasks \
            --shutdown-grace-seconds to finish, then stops and releases the rest and exits 0.
            """)

    /// The options the worker shares with the server (`--auth-token`, `--allow-exec`, ...):
    /// the server's parser reads them wherever they stand on the command line.
    @ParentCommand var common: Taskloop

    /// `--server`, `--request-timeout-seconds`, `--max-backoff-seconds`, `--max-answer-bytes`:
    /// as the client commands have them.
    @OptionGroup var connection: ServerOptions

    @Option(help: "The queue to lease tasks from (required). [env: TASKLOOP_QUEUE]")
    var queue: String = Environment.string("QUEUE") ?? ""

    @Option(help: "Most tasks run at once; default: the number of cores. [env: TASKLOOP_CONCURRENCY]")
    var concurrency: Int = Environment.int("CONCURRENCY") ?? Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))

    @Option(help: ArgumentHelp("Comma-separated kinds to lease, of exec, http, noop, sleep; default: all four. [env: TASKLOOP_KINDS]",
                               valueName: "kinds"))
    var kinds: String = Environment.string("KINDS") ?? ""

    @Option(help: "Lease length asked for; heartbeats renew it every third of it. [env: TASKLOOP_LEASE_SECONDS]")
    var leaseSeconds: Double = Environment.double("LEASE_SECONDS") ?? 30

    @Option(help: "How long one lease call may wait on the server for a task (1-60). [env: TASKLOOP_LEASE_WAIT_SECONDS]")
    var leaseWaitSeconds: Int = Environment.int("LEASE_WAIT_SECONDS") ?? 30

    @Option(help: "The name the server shows as the lease holder; default: host name and process id. [env: TASKLOOP_NAME]")
    var name: String?

    /// The flag, else the environment, else this host and process.
    private var effectiveName: String { name ?? Environment.string("NAME") ?? Self.defaultName() }

    @Option(help: "Shortest time between two progress reports of one task; newer progress replaces unsent. [env: TASKLOOP_PROGRESS_INTERVAL_MS]")
    var progressIntervalMs: Int = Environment.int("PROGRESS_INTERVAL_MS") ?? 200

    @Option(help: "Longest a report (a finished task's outcome, a running task's progress) waits to share one POST /tasks/reports with others; 0: send at once. [env: TASKLOOP_REPORT_LINGER_MS]")
    var reportLingerMs: Int = Environment.int("REPORT_LINGER_MS") ?? 5

    @Option(help: "Most reports sent in one call (1-1000, at most the server's --max-batch-items); 1: one call per task, through the single-task routes. [env: TASKLOOP_MAX_REPORT_BATCH]")
    var maxReportBatch: Int = Environment.int("MAX_REPORT_BATCH") ?? 1_000

    static func defaultName() -> String {
        var host = [CChar](repeating: 0, count: 256)
        let hostName = gethostname(&host, host.count - 1) == 0
            ? String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "worker"
        return "\(hostName)-\(getpid())"
    }

    /// `--kinds` as a list; nil for all.
    private var kindList: [String]? {
        let list = kinds.split(separator: ",").map { String($0.filter { $0 != " " }) }.filter { !$0.isEmpty }
        return list.isEmpty ? nil : Array(Set(list)).sorted()
    }

    func validate() throws {
        guard !queue.isEmpty else { throw ValidationError("--queue is required (or TASKLOOP_QUEUE)") }
        guard SubmissionValidator.isValidQueueName(queue) else {
            throw ValidationError("--queue: \(SubmissionValidator.queueNameRule)")
        }
        guard (1...10_000).contains(concurrency) else { throw ValidationError("--concurrency must be 1...10000") }
        for kind in kindList ?? [] where !WorkerConfiguration.runnableKinds.contains(kind) {
            throw ValidationError("--kinds: \(kind) is not one of \(WorkerConfiguration.runnableKinds.joined(separator: ", "))")
        }
        guard leaseSeconds >= 1 && leaseSeconds <= 3_600 else { throw ValidationError("--lease-seconds must be 1...3600") }
        guard (1...60).contains(leaseWaitSeconds) else { throw ValidationError("--lease-wait-seconds must be 1...60") }
        let name = effectiveName
        guard !name.isEmpty, name.unicodeScalars.count <= 200,
              !name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
            throw ValidationError("--name must be 1 to 200 characters without control characters")
        }
        guard (0...60_000).contains(progressIntervalMs) else { throw ValidationError("--progress-interval-ms must be 0...60000") }
        guard (0...10_000).contains(reportLingerMs) else { throw ValidationError("--report-linger-ms must be 0...10000") }
        guard (1...1_000).contains(maxReportBatch) else { throw ValidationError("--max-report-batch must be 1...1000") }
    }

    func run() throws {
        var configuration = WorkerConfiguration(server: connection.url, queue: queue, concurrency: concurrency,
                                                name: effectiveName)
        configuration.kinds = kindList
        configuration.allowExec = common.allowExec
        configuration.execIsolation = try common.execIsolationMode()
        configuration.authToken = common.effectiveAuthToken
        configuration.leaseMilliseconds = UInt64(leaseSeconds * 1_000)
        configuration.leaseWaitSeconds = leaseWaitSeconds
        configuration.shutdownGraceMilliseconds = UInt64(common.shutdownGraceSeconds * 1_000)
        configuration.maxBackoffMilliseconds = UInt64(connection.maxBackoffSeconds * 1_000)
        configuration.requestTimeoutMilliseconds = UInt64(connection.requestTimeoutSeconds * 1_000)
        configuration.progressIntervalMilliseconds = UInt64(progressIntervalMs)
        configuration.reportLingerMilliseconds = UInt64(reportLingerMs)
        configuration.maxReportBatch = maxReportBatch
        configuration.maxAnswerBytes = connection.maxAnswerBytes
        configuration.httpPolicy = HostPolicy(allowedHosts: common.allowedHostPatterns.compactMap(\.1),
                                              denyPrivateAddresses: common.httpDenyPrivate ?? false)
        configuration.httpMaxHostConnections = common.httpMaxHostConnections

        let level = Logger.Level(rawValue: common.logLevel)!
        let format = LogFormat(rawValue: common.logFormat)!
        let logSink = LogSink(capacity: common.logBufferBytes)
        LoggingSystem.bootstrap { label in format.makeHandler(label: label, level: level, sink: logSink) }

        // SIGPIPE on a write to a reset connection must be that call's error, not the end of
        // the process (the server does the same).
        signal(SIGPIPE, SIG_IGN)
        let loop = try EventLoop()
        let worker = TaskloopWorker(loop: loop, configuration: configuration, logger: Logger(label: "worker"))
        do {
            try worker.start()
        } catch {
            throw ValidationError("\(error)")
        }
        // The story ends within the grace and 0.75 s (`TaskloopWorker`).
        try runUntilSignalled(loop, program: "taskloop worker", grace: common.shutdownGraceSeconds,
                              stopping: "finishing running tasks",
                              started: "taskloop worker \(configuration.name) leasing from \(connection.server), queue \(queue)") { finished in
            worker.stop { finished() }
        }
        logSink.flush()
        print("taskloop worker stopped")
    }
}
