import ArgumentParser
import TaskloopCLI
import TaskloopHTTPClient

/// How to reach a server: the options `taskloop worker` and the client commands share.
struct ServerOptions: ParsableArguments {
    @Option(help: "The server's URL. [env: TASKLOOP_SERVER]")
    var server: String = Environment.string("SERVER") ?? "http://127.0.0.1:8080"

    @Option(help: "Longest a call to the server may take (a worker's lease call also gets its wait). [env: TASKLOOP_REQUEST_TIMEOUT_SECONDS]")
    var requestTimeoutSeconds: Double = Environment.double("REQUEST_TIMEOUT_SECONDS") ?? 10

    @Option(help: "Longest wait between retries while the server is away (or refuses a worker). [env: TASKLOOP_MAX_BACKOFF_SECONDS]")
    var maxBackoffSeconds: Double = Environment.double("MAX_BACKOFF_SECONDS") ?? 30

    @Option(help: "Largest answer read from the server (a lease answer or a page of tasks carries whole tasks). [env: TASKLOOP_MAX_ANSWER_BYTES]")
    var maxAnswerBytes: Int = Environment.int("MAX_ANSWER_BYTES") ?? 64 << 20

    /// `--server`, checked by `validate()`.
    var url: HTTPURL { try! HTTPURL(server) }

    func validate() throws {
        guard (try? HTTPURL(server)) != nil else { throw ValidationError("--server must be an http or https URL, not \(server)") }
        guard requestTimeoutSeconds >= 0.1 && requestTimeoutSeconds <= 3_600 else {
            throw ValidationError("--request-timeout-seconds must be 0.1...3600")
        }
        guard maxBackoffSeconds >= 0.1 && maxBackoffSeconds <= 3_600 else {
            throw ValidationError("--max-backoff-seconds must be 0.1...3600")
        }
        guard (1_024...1 << 30).contains(maxAnswerBytes) else { throw ValidationError("--max-answer-bytes must be 1024...1073741824") }
    }
}

/// How `watch` and `submit --watch` show a task or workflow, and how long they hold on to a
/// server that went away.
struct WatchOptions: ParsableArguments {
    @Flag(help: "One plain line per change even on a terminal (without one, that is the default).")
    var plain = false

    @Option(help: "How long to keep trying to get a lost server back before giving up with status 3. [env: TASKLOOP_RECONNECT_TIMEOUT_SECONDS]")
    var reconnectTimeoutSeconds: Double = Environment.double("RECONNECT_TIMEOUT_SECONDS") ?? 60

    @Option(help: "Silence after which the event stream counts as lost and is opened again (the server sends something every 15 s). [env: TASKLOOP_STREAM_IDLE_TIMEOUT_SECONDS]")
    var streamIdleTimeoutSeconds: Double = Environment.double("STREAM_IDLE_TIMEOUT_SECONDS") ?? 45

    @Option(help: "Shortest time between two frames of the progress bars (100: at most ten a second). [env: TASKLOOP_FRAME_INTERVAL_MS]")
    var frameIntervalMs: Int = Environment.int("FRAME_INTERVAL_MS") ?? 100

    func validate() throws {
        guard reconnectTimeoutSeconds >= 0 && reconnectTimeoutSeconds <= 31_536_000 else {
            throw ValidationError("--reconnect-timeout-seconds must be 0...31536000")
        }
        guard streamIdleTimeoutSeconds >= 1 && streamIdleTimeoutSeconds <= 3_600 else {
            throw ValidationError("--stream-idle-timeout-seconds must be 1...3600")
        }
        guard (10...10_000).contains(frameIntervalMs) else { throw ValidationError("--frame-interval-ms must be 10...10000") }
    }
}

/// What the client commands have in common: the server's options, the token from the
/// parent's `--auth-token` (or TASKLOOP_AUTH_TOKEN), and the exit status as the process's.
protocol ClientCommandLine: ParsableCommand {
    var common: Taskloop { get }
    var connection: ServerOptions { get }
    /// Set by the commands that follow a task.
    var watching: WatchOptions? { get }
    func clientCommand() throws -> ClientCommand
}

extension ClientCommandLine {
    var watching: WatchOptions? { nil }

    func run() throws {
        let command: ClientCommand
        do {
            command = try clientCommand()
        } catch let error as UsageError {
            throw ValidationError(error.description)
        }
        var settings = ClientSettings(server: connection.url)
        settings.authToken = common.effectiveAuthToken
        settings.requestTimeoutMilliseconds = UInt64(connection.requestTimeoutSeconds * 1_000)
        settings.maxBackoffMilliseconds = UInt64(connection.maxBackoffSeconds * 1_000)
        settings.maxAnswerBytes = connection.maxAnswerBytes
        if let watching {
            settings.plainOutput = watching.plain
            settings.reconnectTimeoutMilliseconds = UInt64(watching.reconnectTimeoutSeconds * 1_000)
            settings.streamIdleTimeoutMilliseconds = UInt64(watching.streamIdleTimeoutSeconds * 1_000)
            settings.frameIntervalMilliseconds = UInt64(watching.frameIntervalMs)
        }
        let status = CommandLineClient.run(command, settings: settings)
        if status != .succeeded { throw ExitCode(status.code) }
    }
}

/// Said in every client command's help.
private let clientDiscussion = """
    Talks to --server with the token of --auth-token (or TASKLOOP_AUTH_TOKEN), as `taskloop worker` does. \
    Errors print the server's problem (title, detail, invalid fields) on standard error.

    \(ExitStatus.help)
    """

struct Submit: ClientCommandLine {
    static let configuration = CommandConfiguration(
        abstract: "Submit a task (--kind ...) or a task or workflow from a JSON file (-f); print its id, or follow it.",
        discussion: """
            A file with a "tasks" array is a workflow (POST /workflows), any other object a task (POST /tasks); \
            it is sent as written. --wait prints the task or workflow as it ended; --watch shows it as `watch` does. \
            Either way the exit status says how it ended.

            \(clientDiscussion)
            """)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions
    @OptionGroup(title: "Following") var watchOptions: WatchOptions
    var watching: WatchOptions? { watchOptions }

    @Option(help: "The task's kind: noop, sleep, http, exec (when the server allows it) or external.")
    var kind: String?

    @Option(help: ArgumentHelp("The task's params, as JSON, e.g. '{\"duration_ms\": 2000}'.", valueName: "json"))
    var params: String?

    @Option(help: "The queue (default: default).")
    var queue: String?

    @Option(help: "Priority in its queue, -8...8 (default 0).")
    var priority: Int?

    @Option(help: "A name to show for the task.")
    var name: String?

    @Option(help: ArgumentHelp("Run it no sooner than this RFC 3339 time, e.g. 2026-11-28T02:00:00+01:00 (it waits scheduled).", valueName: "time"))
    var at: String?

    @Option(help: ArgumentHelp("Run it no sooner than this long from now, e.g. 90s, 1h30m, 250ms.", valueName: "span"))
    var delay: String?

    @Option(help: ArgumentHelp("Cancel it (expired) if it has not started by this RFC 3339 time.", valueName: "time"))
    var expiresAt: String?

    @Option(help: ArgumentHelp("Cancel it (expired) if it has not started this long after submission, e.g. 10m.", valueName: "span"))
    var ttl: String?

    @Option(help: "Refused (409 duplicate_task) while an unfinished task of the queue carries this key.")
    var uniqueKey: String?

    @Option(help: ArgumentHelp("With --unique-key: refused too while a task with the key finished less than this long ago, e.g. 1h.",
                               valueName: "span"))
    var uniqueFor: String?

    @Option(help: "Fair share: the queue takes tasks round-robin across these keys and runs at most its key_concurrency of one key.")
    var concurrencyKey: String?

    @Option(name: [.customShort("f"), .long], help: ArgumentHelp(
        "A JSON file holding a task, or a workflow ({\"name\", \"tasks\": [...]}); - reads standard input.", valueName: "file"))
    var file: String?

    @Option(help: ArgumentHelp(
        "A file of tasks, JSON lines or one JSON array; - reads standard input. Sent in batches of up to 1000 (POST /tasks/batch), "
            + "printing a line per task: its status and id, or its status, problem code and detail.", valueName: "file"))
    var batch: String?

    @Option(help: "Sent as Idempotency-Key: a repeat of the same submission under it creates nothing new and prints the same id (with --batch, part i of several goes under KEY-i).")
    var idempotencyKey: String?

    @Flag(help: "Wait until it ends, then print it as it ended.")
    var wait = false

    @Flag(help: "Print its id, then show its progress until it ends.")
    var watch = false

    func validate() throws {
        guard [kind, file, batch].compactMap({ $0 }).count == 1 else {
            throw ValidationError("give one of --kind, -f FILE or --batch FILE")
        }
        if batch != nil && (wait || watch) { throw ValidationError("--wait and --watch follow one task; --batch prints each task's id") }
        if batch != nil, params != nil || queue != nil || priority != nil || name != nil || at != nil || delay != nil
            || expiresAt != nil || ttl != nil || uniqueKey != nil || uniqueFor != nil || concurrencyKey != nil {
            throw ValidationError("--params, --queue, --priority, --name, the times and the keys go with --kind; a batch's tasks say them themselves")
        }
        if file != nil, params != nil || queue != nil || priority != nil || name != nil || at != nil || delay != nil
            || expiresAt != nil || ttl != nil || uniqueKey != nil || uniqueFor != nil || concurrencyKey != nil {
            throw ValidationError("--params, --queue, --priority, --name, the times and the keys go with --kind; a file says them itself")
        }
        guard at == nil || delay == nil else { throw ValidationError("give --at or --delay, not both") }
        guard expiresAt == nil || ttl == nil else { throw ValidationError("give --expires-at or --ttl, not both") }
        guard !(wait && watch) else { throw ValidationError("give --wait or --watch, not both") }
    }

    func clientCommand() throws -> ClientCommand {
        if let batch {
            return .submitBatches(try Submission.batchFile(batch), idempotencyKey: idempotencyKey)
        }
        let submission = if let file {
            try Submission.file(file)
        } else {
            try Submission.task(kind: kind!, params: params, queue: queue, priority: priority, name: name,
                                times: Submission.Times(at: at, delay: delay, expiresAt: expiresAt, ttl: ttl), uniqueKey: uniqueKey,
                                uniqueFor: uniqueFor, concurrencyKey: concurrencyKey)
        }
        return .submit(submission, idempotencyKey: idempotencyKey, then: wait ? .wait : watch ? .watch : .printID)
    }
}

struct Get: ClientCommandLine {
    static let configuration = CommandConfiguration(
        abstract: "Print a task or workflow as JSON (indented on a terminal, one line otherwise).",
        discussion: clientDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A task or workflow id.")
    var id: String

    func clientCommand() -> ClientCommand { .get(id: id) }
}

struct List: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List tasks, newest first: a table on a terminal, one JSON object per line otherwise.",
        discussion: clientDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Option(help: "Only tasks in this state: pending, queued, running, succeeded, failed or cancelled.")
    var state: String?

    @Option(help: "Only tasks of this queue.")
    var queue: String?

    @Option(help: "Only tasks of this workflow.")
    var workflow: String?

    @Option(help: "Most tasks listed; when more match, where the next ones start is said on standard error.")
    var limit = 100

    @Flag(help: "Every task that matches, however many (no --limit).")
    var all = false

    @Option(help: "Start after this task id (the cursor a limited listing gives).")
    var after: String?

    @Flag(help: "One JSON object per line even on a terminal.")
    var json = false

    func validate() throws {
        guard limit >= 1 else { throw ValidationError("--limit must be at least 1") }
    }

    func clientCommand() -> ClientCommand {
        .list(TaskQuery(state: state, queue: queue, workflow: workflow, limit: all ? nil : limit, after: after),
              format: json ? .jsonLines : .automatic)
    }
}

struct Cancel: ClientCommandLine {
    static let configuration = CommandConfiguration(
        abstract: "Cancel a task, or every unfinished task of a workflow; print the answer.",
        discussion: "A running task may still be stopping (cancel_requested: true) when this returns: `watch` shows when it is cancelled.\n\n"
            + clientDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A task or workflow id.")
    var id: String

    func clientCommand() -> ClientCommand { .cancel(id: id) }
}

struct Retry: ClientCommandLine {
    static let configuration = CommandConfiguration(
        abstract: "Give a failed or cancelled task (or every one of a workflow) a new attempt; print the answer.",
        discussion: clientDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A task or workflow id.")
    var id: String

    func clientCommand() -> ClientCommand { .retry(id: id) }
}

struct Watch: ClientCommandLine {
    static let configuration = CommandConfiguration(
        abstract: "Follow a task or workflow to its end: live progress bars on a terminal, a line per change otherwise.",
        discussion: """
            A lost connection is resumed where it left off (Last-Event-ID) for up to --reconnect-timeout-seconds. \
            Ctrl-C stops watching; the task goes on.

            \(clientDiscussion)
            """)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions
    @OptionGroup(title: "Following") var watchOptions: WatchOptions
    var watching: WatchOptions? { watchOptions }

    @Argument(help: "A task or workflow id.")
    var id: String

    func clientCommand() -> ClientCommand { .watch(id: id) }
}
