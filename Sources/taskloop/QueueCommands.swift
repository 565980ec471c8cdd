import ArgumentParser
import TaskloopCLI

/// `taskloop queue ls|show|set`.
struct QueueGroup: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "queue",
        abstract: "List queues, show one, and change its settings (limits, rate limit, pause, dispatch).",
        subcommands: [QueueList.self, QueueShow.self, QueueSet.self])
}

private let queueDiscussion = """
    Talks to --server with the token of --auth-token (or TASKLOOP_AUTH_TOKEN). Errors print the server's problem \
    (title, detail, invalid fields) on standard error.

    \(ExitStatus.help)
    """

struct QueueList: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List queues: a line each on a terminal (paused or active, running and limit, queued, per-key cap, rate limit), "
            + "one JSON object per line otherwise.",
        discussion: queueDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Flag(help: "One JSON object per line even on a terminal.")
    var json = false

    func clientCommand() -> ClientCommand { .queue(.list(format: json ? .jsonLines : .automatic)) }
}

struct QueueShow: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "show", abstract: "Print a queue's settings and counts as JSON.", discussion: queueDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A queue name.")
    var name: String

    func clientCommand() -> ClientCommand { .queue(.show(name: name)) }
}

struct QueueSet: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "set",
        abstract: "Change a queue's settings (only those given; the queue is made if it is new) and print the queue.",
        discussion: """
            --rate 10/s --burst 5 lets the queue start at most 10 tasks a second, 5 at once after a pause \
            (a token bucket; units /s, /m, /h, fractions allowed); --no-rate-limit removes it.

            \(queueDiscussion)
            """)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A queue name.")
    var name: String

    @Option(help: "Most of its tasks running at once.")
    var maxConcurrency: Int?

    @Flag(help: "Pause it: none of its tasks starts until --resume.")
    var pause = false

    @Flag(help: "Resume it.")
    var resume = false

    @Option(help: "Who starts its tasks: server, or workers that lease them.")
    var dispatch: String?

    @Option(help: "Fair share: most running tasks per concurrency key.")
    var keyConcurrency: Int?

    @Flag(help: "Lift the per-key cap.")
    var noKeyConcurrency = false

    @Option(help: ArgumentHelp("Most tasks started per unit of time, e.g. 10/s, 600/m, 0.5/s (with --burst).", valueName: "count/unit"))
    var rate: String?

    @Option(help: "With --rate: most tasks started at once.")
    var burst: Int?

    @Flag(help: "Remove the rate limit (what waited for it starts).")
    var noRateLimit = false

    func validate() throws {
        guard !(pause && resume) else { throw ValidationError("give --pause or --resume, not both") }
        guard !(keyConcurrency != nil && noKeyConcurrency) else {
            throw ValidationError("give --key-concurrency or --no-key-concurrency, not both")
        }
        guard !(rate != nil && noRateLimit) else { throw ValidationError("give --rate or --no-rate-limit, not both") }
        guard (rate == nil) == (burst == nil) else { throw ValidationError("--rate and --burst go together") }
    }

    func clientCommand() throws -> ClientCommand {
        let keyCap: QueueRequest.Setting<Int>? = noKeyConcurrency ? .removed : keyConcurrency.map { .to($0) }
        let rateLimit: QueueRequest.Setting<(rate: String, burst: Int)>? = noRateLimit ? .removed
            : rate.map { .to((rate: $0, burst: burst!)) }
        return .queue(.update(name: name, body: try QueueRequest.body(
            maxConcurrency: maxConcurrency, paused: pause ? true : resume ? false : nil, dispatch: dispatch,
            keyConcurrency: keyCap, rate: rateLimit)))
    }
}
