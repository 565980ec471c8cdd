import Glibc
import TaskloopClient
import TaskloopHTTPClient
import TaskloopJSON
import TaskloopLoop

/// The command-line client: `taskloop submit`, `get`, `ls`, `cancel`, `retry` and `watch`.
public enum CommandLineClient {
    /// Runs `command` on a loop of its own on the calling thread, printing as it goes, and
    /// returns how it ended (`ExitStatus`).
    public static func run(_ command: ClientCommand, settings: ClientSettings) -> ExitStatus {
        let session: ClientSession
        do {
            session = try ClientSession(loop: try EventLoop(), settings: settings)
        } catch {
            Console.complain("cannot start the HTTP client: \(error)")
            return .unknownOrUnreachable
        }
        session.start(command)
        do {
            try session.loop.run()
        } catch {
            Console.complain("\(error)")
        }
        return session.exitStatus
    }
}

/// One command's run: the loop, the HTTP client and the calls to the server, what is printed,
/// and the end (an exit status, the handles closed, the terminal restored). SIGINT and SIGTERM
/// end it too, as 128 + the signal, after the same cleanup; a task being watched goes on.
///
/// Threading: loop thread only. Everything here runs on the loop thread, `run()`'s caller.
final class ClientSession {
    let loop: EventLoop
    let settings: ClientSettings
    let server: ServerClient
    private let http: HTTPClient
    private(set) var exitStatus = ExitStatus.succeeded
    private(set) var isFinished = false
    /// Some answer has come from the server: later trouble is an outage to wait out rather
    /// than a server that is not there.
    var hasReachedServer = false
    private var signalWatchers: [SignalWatcher] = []
    private var closers: [() -> Void] = []
    /// The watch under way (`watch`, `submit --wait` or `--watch`), held until the end.
    private var watcher: Watcher?

    init(loop: EventLoop, settings: ClientSettings) throws {
        self.loop = loop
        self.settings = settings
        // A command has at most two calls in flight (a stream and a fetch). The server is the
        // one the user named, wherever it is: the tasks' address policy is not for it.
        http = try HTTPClient(loop: loop, policy: .unrestricted, maxHostConnections: 2)
        server = ServerClient(client: http, server: settings.server, authToken: settings.authToken,
                              timeoutMilliseconds: settings.requestTimeoutMilliseconds, maxAnswerBytes: settings.maxAnswerBytes)
        do {
            for signal in [SIGINT, SIGTERM] {
                signalWatchers.append(try SignalWatcher(loop: loop, signal: signal) { [unowned self] in finish(.stopped(by: signal)) })
            }
        } catch {
            for watcher in signalWatchers { watcher.close() }
            http.close()
            throw error
        }
    }

    /// `close` runs when the session ends, however it ends (last registered, first run).
    func onFinish(_ close: @escaping () -> Void) {
        closers.append(close)
    }

    /// Ends the run with `status`: what is open is closed and the loop left to end.
    func finish(_ status: ExitStatus) {
        guard !isFinished else { return }
        isFinished = true
        exitStatus = status
        for close in closers.reversed() { close() }
        closers.removeAll()
        for watcher in signalWatchers { watcher.close() }
        signalWatchers.removeAll()
        // curl may be calling us right now (the last event came in a chunk): its client is
        // closed once it has returned.
        let http = LoopBound(self.http, loop: loop)
        loop.execute {
            http.value.close()
            http.loop.finish()
        }
    }

    // MARK: ending badly

    /// The server answered no (its problem on standard error), or has no such id.
    func fail(_ response: ServerResponse) {
        var message = response.problem?.description ?? "unexpected answer: status \(response.status)"
        if response.status == 401 { message += "\n  give the server's token with --auth-token or TASKLOOP_AUTH_TOKEN" }
        end(.forFailedAnswer(status: response.status), saying: message)
    }

    func failUnknown(_ id: String) {
        end(.unknownOrUnreachable, saying: "no task or workflow \(id) at \(server.base)")
    }

    func failUnreachable(_ reason: String) {
        end(.unknownOrUnreachable, saying: "cannot reach the server at \(server.base): \(reason)")
    }

    /// An answer this client cannot use.
    func failUnreadable(_ reason: String) {
        end(.unknownOrUnreachable, saying: "\(server.base): \(reason)")
    }

    /// Finishes first, so a live display has put its last frame down and given the terminal
    /// back before the message goes below it.
    private func end(_ status: ExitStatus, saying message: String) {
        guard !isFinished else { return }
        finish(status)
        Console.complain(message)
    }

    /// The answer of a call that must succeed; nil once the run has ended over it.
    private func success(_ reply: ServerReply) -> ServerResponse? {
        guard !isFinished else { return nil }
        switch reply {
        case .failed(let reason):
            failUnreachable(reason)
            return nil
        case .answered(let response):
            hasReachedServer = true
            guard response.isSuccess else {
                fail(response)
                return nil
            }
            return response
        }
    }

    // MARK: output

    /// An answer's JSON: indented on a terminal, as the server wrote it otherwise (one line).
    func printJSON(_ response: ServerResponse) {
        if Console.isTerminal(Console.output), let json = response.json {
            Console.print(JSONText.pretty(json))
        } else {
            Console.print(String(decoding: response.body, as: UTF8.self))
        }
    }

    // MARK: commands

    func start(_ command: ClientCommand) {
        switch command {
        case .submit(let submission, let key, let then): submit(submission, idempotencyKey: key, then: then)
        case .submitBatches(let bodies, let key): submitBatches(bodies, from: 0, idempotencyKey: key, allCreated: true)
        case .get(let id): onTaskOrWorkflow(id, "GET", "") { [unowned self] in printJSON($0); finish(.succeeded) }
        case .cancel(let id): onTaskOrWorkflow(id, "DELETE", "") { [unowned self] in printJSON($0); finish(.succeeded) }
        case .retry(let id): onTaskOrWorkflow(id, "POST", "/retry") { [unowned self] in printJSON($0); finish(.succeeded) }
        case .list(let query, let format): list(query, format: format)
        case .watch(let id): follow(id, isWorkflow: false, display: liveOrLines()) { [unowned self] in finish($0) }
        case .schedule(let command): schedule(command)
        case .queue(let command): queue(command)
        }
    }

    // MARK: queue

    private func queue(_ command: QueueCommand) {
        switch command {
        case .list(let format):
            server.call("GET", "/queues") { [unowned self] reply in
                guard let response = success(reply) else { return }
                guard let queues = response.json?.objectValue?["queues"]?.arrayValue?.compactMap(\.objectValue) else {
                    return failUnreadable("the answer to GET /queues is not a list of queues")
                }
                printLines(queues, format: format, line: QueueRequest.line)
            }
        case .show(let name):
            server.call("GET", "/queues/\(URLText.encoded(name))") { [unowned self] reply in
                if case .answered(let response) = reply, response.status == 404 {
                    return end(.unknownOrUnreachable, saying: "no queue \(name) at \(server.base)")
                }
                guard let response = success(reply) else { return }
                printJSON(response)
                finish(.succeeded)
            }
        case .update(let name, let body):
            server.call("PATCH", "/queues/\(URLText.encoded(name))", body: body) { [unowned self] reply in
                guard let response = success(reply) else { return }
                printJSON(response)
                finish(.succeeded)
            }
        }
    }

    // MARK: schedule

    private func schedule(_ command: ScheduleCommand) {
        switch command {
        case .create(let body):
            server.call("POST", "/schedules", body: body) { [unowned self] reply in
                guard let response = success(reply) else { return }
                printID(response)
            }
        case .list(let format):
            server.call("GET", "/schedules") { [unowned self] reply in
                guard let response = success(reply) else { return }
                guard let schedules = response.json?.objectValue?["schedules"]?.arrayValue?.compactMap(\.objectValue) else {
                    return failUnreadable("the answer to GET /schedules is not a list of schedules")
                }
                printLines(schedules, format: format, line: ScheduleRequest.line)
            }
        case .setPaused(let id, let paused):
            onSchedule(id, "PATCH", body: Array(#"{"paused":\#(paused)}"#.utf8)) { [unowned self] in printJSON($0); finish(.succeeded) }
        case .trigger(let id):
            onSchedule(id, "POST", "/trigger") { [unowned self] in printID($0) }
        case .remove(let id):
            onSchedule(id, "DELETE") { [unowned self] in printJSON($0); finish(.succeeded) }
        }
    }

    /// Calls `/schedules/{id}<suffix>`; `done` gets the answer when it succeeded. No such
    /// schedule ends the run with status 3.
    private func onSchedule(_ id: String, _ method: String, _ suffix: String = "", body: [UInt8]? = nil,
                            _ done: @escaping (ServerResponse) -> Void) {
        server.call(method, "/schedules/\(URLText.encoded(id))\(suffix)", body: body) { [unowned self] reply in
            if case .answered(let response) = reply, response.status == 404 {
                return end(.unknownOrUnreachable, saying: "no schedule \(id) at \(server.base)")
            }
            if let response = success(reply) { done(response) }
        }
    }

    /// Prints the `id` of the answer's object (what it made) and ends.
    private func printID(_ response: ServerResponse) {
        guard let id = response.json?.objectValue?["id"]?.stringValue else { return failUnreadable("the answer names no id") }
        Console.print(id)
        finish(.succeeded)
    }

    /// A list's objects, a `line` each on a terminal (unless `format` asks for JSON), one JSON
    /// object per line otherwise; then ends.
    private func printLines(_ objects: [JSONObject], format: ListFormat, line: (JSONObject) -> String) {
        let lines = format == .automatic && Console.isTerminal(Console.output)
            ? objects.map(line) : objects.map { JSONText.compact(.object($0)) }
        if !lines.isEmpty { Console.write(lines.map { $0 + "\n" }.joined(), to: Console.output) }
        finish(.succeeded)
    }

    /// Calls `/tasks/{id}<suffix>` and, when no task has the id, `/workflows/{id}<suffix>`;
    /// `done` gets the answer that succeeded.
    private func onTaskOrWorkflow(_ id: String, _ method: String, _ suffix: String,
                                  _ done: @escaping (ServerResponse) -> Void) {
        let segment = URLText.encoded(id)
        server.call(method, "/tasks/\(segment)\(suffix)") { [unowned self] reply in
            if !isFinished, case .answered(let response) = reply, response.status == 404 {
                hasReachedServer = true
                server.call(method, "/workflows/\(segment)\(suffix)") { [unowned self] reply in
                    if case .answered(let response) = reply, response.status == 404 { return failUnknown(id) }
                    if let response = success(reply) { done(response) }
                }
                return
            }
            if let response = success(reply) { done(response) }
        }
    }

    private func submit(_ submission: Submission, idempotencyKey: String?, then: AfterSubmission) {
        let headers = idempotencyKey.map { [HTTPHeaderField("Idempotency-Key", $0)] } ?? []
        server.call("POST", submission.isWorkflow ? "/workflows" : "/tasks", body: submission.body,
                    headers: headers) { [unowned self] reply in
            guard let response = success(reply) else { return }
            guard let id = response.json?.objectValue?["id"]?.stringValue else {
                return failUnreadable("the answer to the submission names no id")
            }
            switch then {
            case .printID:
                Console.print(id)
                finish(.succeeded)
            case .watch:
                Console.print(id)
                follow(id, isWorkflow: submission.isWorkflow, display: liveOrLines()) { [unowned self] in finish($0) }
            case .wait:
                follow(id, isWorkflow: submission.isWorkflow, display: LineDisplay(printsChanges: false)) { [unowned self] status in
                    let path = submission.isWorkflow ? "/workflows/" : "/tasks/"
                    server.call("GET", path + URLText.encoded(id)) { [unowned self] reply in
                        guard let response = success(reply) else { return }
                        printJSON(response)
                        finish(status)
                    }
                }
            }
        }
    }

    /// Sends the parts one after another, printing each item's line (`Submission.batchLine`) as
    /// its part is answered. Ends `succeeded` when every task was created, `refused` when some
    /// were not (the others were: items are independent).
    private func submitBatches(_ bodies: [[UInt8]], from part: Int, idempotencyKey: String?, allCreated: Bool) {
        guard part < bodies.count else { return finish(allCreated ? .succeeded : .refused) }
        let key = idempotencyKey.map { bodies.count == 1 ? $0 : "\($0)-\(part + 1)" }
        let headers = key.map { [HTTPHeaderField("Idempotency-Key", $0)] } ?? []
        server.call("POST", "/tasks/batch", body: bodies[part], headers: headers) { [unowned self] reply in
            guard let response = success(reply) else { return }
            guard let results = response.json?.objectValue?["results"]?.arrayValue else {
                return failUnreadable("the answer to POST /tasks/batch has no results")
            }
            Console.write(results.map { Submission.batchLine($0) + "\n" }.joined(), to: Console.output)
            let created = results.allSatisfy { $0.objectValue?["status"]?.intValue == 201 }
            submitBatches(bodies, from: part + 1, idempotencyKey: idempotencyKey, allCreated: allCreated && created)
        }
    }

    /// Live bars on a terminal that can take them (unless plain output was asked for), lines
    /// otherwise.
    private func liveOrLines() -> WatchDisplay {
        if !settings.plainOutput, Console.isCapableTerminal(Console.output),
           let live = try? LiveDisplay(loop: loop, intervalMilliseconds: settings.frameIntervalMilliseconds) {
            return live
        }
        return LineDisplay(printsChanges: true)
    }

    /// Watches `id` until it ends; `done` gets the status its end means.
    private func follow(_ id: String, isWorkflow: Bool, display: WatchDisplay, _ done: @escaping (ExitStatus) -> Void) {
        do {
            let watcher = try Watcher(session: self, id: id, display: display) { state in
                done(ExitStatus.forTerminalState(state) ?? .unknownOrUnreachable)
            }
            self.watcher = watcher
            watcher.start(isWorkflow: isWorkflow)
        } catch {
            display.close()
            Console.complain("cannot watch: \(error)")
            finish(.unknownOrUnreachable)
        }
    }

    // MARK: ls

    /// Pages through `GET /tasks`: JSON lines printed page by page, or one table at the end
    /// (its columns fit every row). A limit that stops short of the last task says where the
    /// next page starts.
    private func list(_ query: TaskQuery, format: ListFormat) {
        let asTable = format == .automatic && Console.isTerminal(Console.output)
        var rows: [JSONObject] = []
        func page(after cursor: String?, remaining: Int?) {
            server.call("GET", query.path(count: remaining ?? TaskQuery.pageLimit, after: cursor)) { [unowned self] reply in
                guard let response = success(reply) else { return }
                guard let object = response.json?.objectValue, let tasks = object["tasks"]?.arrayValue else {
                    return failUnreadable("the answer to GET /tasks is not a list of tasks")
                }
                let taken = tasks.compactMap(\.objectValue).prefix(remaining ?? Int.max)
                if asTable {
                    rows += taken
                } else if !taken.isEmpty {
                    Console.write(taken.map { JSONText.compact(.object($0)) + "\n" }.joined(), to: Console.output)
                }
                let left = remaining.map { $0 - taken.count }
                let next = object["next"]?.stringValue
                if let next, left.map({ $0 > 0 }) ?? true { return page(after: next, remaining: left) }
                if asTable {
                    let width = Console.size(of: Console.output).columns
                    Console.write(TaskTable.lines(rows, width: width, now: Timestamp.now()).map { $0 + "\n" }.joined(), to: Console.output)
                }
                if let next { Console.complain("more tasks follow: add --after \(next)") }
                finish(.succeeded)
            }
        }
        page(after: query.after, remaining: query.limit)
    }
}
