import ArgumentParser
import TaskloopCLI

/// `taskloop schedule create|ls|pause|resume|trigger|rm`.
struct ScheduleGroup: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "schedule",
        abstract: "Make, list, pause, resume, trigger and delete cron schedules.",
        subcommands: [ScheduleCreate.self, ScheduleList.self, SchedulePause.self, ScheduleResume.self, ScheduleTrigger.self,
                      ScheduleRemove.self])
}

private let scheduleDiscussion = """
    Talks to --server with the token of --auth-token (or TASKLOOP_AUTH_TOKEN). Errors print the server's problem \
    (title, detail, invalid fields) on standard error.

    \(ExitStatus.help)
    """

struct ScheduleCreate: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Make a schedule that runs a task (--kind ...) or the task or workflow of a JSON file (-f); print its id.",
        discussion: scheduleDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Option(help: "The schedule's name.")
    var name: String

    @Option(help: ArgumentHelp("When it runs: 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or @hourly, @daily, ...",
                               valueName: "expression"))
    var cron: String

    @Option(help: "The IANA zone its cron is read in, e.g. Europe/Berlin (default UTC).")
    var timezone: String?

    @Option(help: "While the previous run is unfinished: skip (default), allow or cancel_previous.")
    var overlap: String?

    @Option(help: "Slots missed while the server was down: none (default), latest or all.")
    var catchup: String?

    @Option(help: "With --catchup all: the most missed slots run (default 10).")
    var maxCatchup: Int?

    @Option(help: ArgumentHelp("Delay each run by a fixed pseudo-random amount up to this, e.g. 30s.", valueName: "span"))
    var jitter: String?

    @Flag(help: "Make it paused: nothing runs until `schedule resume`.")
    var paused = false

    @Option(help: "Each run's task kind: noop, sleep, http, exec (when the server allows it) or external.")
    var kind: String?

    @Option(help: ArgumentHelp("Each run's task params, as JSON.", valueName: "json"))
    var params: String?

    @Option(help: "Each run's task queue (default: default).")
    var queue: String?

    @Option(name: [.customShort("f"), .long], help: ArgumentHelp(
        "A JSON file holding each run's task, or a workflow ({\"name\", \"tasks\": [...]}); - reads standard input.", valueName: "file"))
    var file: String?

    func validate() throws {
        guard (kind == nil) != (file == nil) else { throw ValidationError("give either --kind or -f FILE") }
        if file != nil, params != nil || queue != nil {
            throw ValidationError("--params and --queue go with --kind; a file says them itself")
        }
    }

    func clientCommand() throws -> ClientCommand {
        let template = if let file {
            try Submission.file(file)
        } else {
            try Submission.task(kind: kind!, params: params, queue: queue, priority: nil, name: nil)
        }
        return .schedule(.create(body: try ScheduleRequest.body(
            name: name, cron: cron, timezone: timezone, overlap: overlap, catchup: catchup, maxCatchup: maxCatchup, jitter: jitter,
            paused: paused, template: template)))
    }
}

struct ScheduleList: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List schedules, oldest first: a line each on a terminal (next run, last run's state), one JSON object per line otherwise.",
        discussion: scheduleDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Flag(help: "One JSON object per line even on a terminal.")
    var json = false

    func clientCommand() -> ClientCommand { .schedule(.list(format: json ? .jsonLines : .automatic)) }
}

/// `pause` and `resume`: one command under two names, setting `paused` as `Switch` says.
struct ScheduleSetPaused<Switch: PauseSwitch>: ClientCommandLine {
    static var configuration: CommandConfiguration {
        CommandConfiguration(commandName: Switch.name, abstract: Switch.abstract, discussion: scheduleDiscussion)
    }

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A schedule id.")
    var id: String

    func clientCommand() -> ClientCommand { .schedule(.setPaused(id: id, paused: Switch.paused)) }
}

protocol PauseSwitch {
    static var name: String { get }
    static var abstract: String { get }
    static var paused: Bool { get }
}

enum Pause: PauseSwitch {
    static let name = "pause"
    static let abstract = "Pause a schedule: nothing runs, and slots passed meanwhile are not caught up."
    static let paused = true
}

enum Resume: PauseSwitch {
    static let name = "resume"
    static let abstract = "Resume a paused schedule from now."
    static let paused = false
}

typealias SchedulePause = ScheduleSetPaused<Pause>
typealias ScheduleResume = ScheduleSetPaused<Resume>

struct ScheduleTrigger: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "trigger", abstract: "Run a schedule once now (paused or not); print the run's task or workflow id.",
        discussion: scheduleDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A schedule id.")
    var id: String

    func clientCommand() -> ClientCommand { .schedule(.trigger(id: id)) }
}

struct ScheduleRemove: ClientCommandLine {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete a schedule; the tasks its runs made are left alone.", discussion: scheduleDiscussion)

    @ParentCommand var common: Taskloop
    @OptionGroup var connection: ServerOptions

    @Argument(help: "A schedule id.")
    var id: String

    func clientCommand() -> ClientCommand { .schedule(.remove(id: id)) }
}
