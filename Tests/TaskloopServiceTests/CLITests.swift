import Foundation
import Testing
import TaskloopTestSupport

/// `taskloop submit`, `get`, `ls`, `cancel`, `retry` and `watch` as users run them: the built
/// binary against a real server over real sockets, their output and exit statuses; the live
/// display in a real pseudo-terminal (tmux). One at a time: each runs processes that wait on
/// each other, and the machine's two cores are shared with every other suite.
@Suite(.serialized) struct CLITests {
    struct Run {
        var status: Int32
        var stdout: String
        var stderr: String
        var lines: [String] { stdout.split(separator: "\n").map(String.init) }
        var json: [String: Any] {
            (try? JSONSerialization.jsonObject(with: Data(stdout.utf8))) as? [String: Any] ?? [:]
        }
    }

    /// Runs `taskloop` with `arguments` to its end (bounded), `input` on its standard input,
    /// the test runner's TASKLOOP_* settings left out.
    static func taskloop(_ arguments: [String], input: String = "", environment: [String: String] = [:],
                         timeout: Double = 30) throws -> Run {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cli-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let files = ["stdin", "stdout", "stderr"].map { directory.appendingPathComponent($0) }
        FileManager.default.createFile(atPath: files[0].path, contents: Data(input.utf8))
        for file in files.dropFirst() { FileManager.default.createFile(atPath: file.path, contents: nil) }
        let process = Process()
        // Through env(1), which gives every signal its default action back, as a shell does.
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["--default-signal", BinaryTests.executable.path] + arguments
        process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("TASKLOOP_") }
            .merging(environment) { $1 }
        process.standardInput = try FileHandle(forReadingFrom: files[0])
        process.standardOutput = try FileHandle(forWritingTo: files[1])
        process.standardError = try FileHandle(forWritingTo: files[2])
        try process.run()
        let status: Int32
        do {
            status = try process.waitForExit("taskloop \(arguments.joined(separator: " ")) to end", timeout: timeout)
        } catch {
            process.terminate()
            throw error
        }
        return Run(status: status, stdout: try String(contentsOf: files[1], encoding: .utf8),
                   stderr: try String(contentsOf: files[2], encoding: .utf8))
    }

    /// A server with `exec` allowed and a runner of commands against it.
    struct Setup {
        let service: ServiceHarness
        let api: APIClient
        var server: String { "http://127.0.0.1:\(service.port)" }

        init() throws {
            service = try ServiceHarness { $0.allowExec = true }
            api = try service.client()
        }

        func taskloop(_ arguments: [String], input: String = "") throws -> Run {
            try CLITests.taskloop(arguments + ["--server", server], input: input)
        }

        /// Submits from flags and returns the new id.
        func submit(_ arguments: [String]) throws -> String {
            let run = try taskloop(["submit"] + arguments)
            try #require(run.status == 0, "submit \(arguments): \(run.stderr)")
            return try #require(run.lines.first)
        }
    }

    static let idPattern = "[0-9A-Z]{26}"

    // MARK: commands

    @Test func submitGetListCancelAndRetryRoundTrip() throws {
        let setup = try Setup()
        let noop = try setup.submit(["--kind", "noop", "--name", "first"])
        #expect(noop.range(of: "^\(Self.idPattern)$", options: .regularExpression) != nil)
        let got = try setup.taskloop(["get", noop])
        #expect(got.status == 0 && got.json["id"] as? String == noop && got.json["name"] as? String == "first")
        #expect(got.lines.count == 1, "one line of JSON without a terminal")

        let long = try setup.submit(["--kind", "sleep", "--params", #"{"duration_ms": 600000}"#, "--queue", "slow", "--priority", "3"])
        let cancelled = try setup.taskloop(["cancel", long])
        #expect(cancelled.status == 0 && cancelled.json["state"] as? String == "cancelled" && cancelled.json["priority"] as? Int == 3)
        let again = try setup.taskloop(["cancel", long])
        #expect(again.status == 4 && again.stderr.hasPrefix("taskloop: 409 Conflict: ") && again.stdout.isEmpty, "\(again)")
        let retried = try setup.taskloop(["retry", long])
        #expect(retried.status == 0 && retried.json["attempt"] as? Int == 2, "\(retried)")
        #expect(try setup.taskloop(["cancel", long]).status == 0)

        // Newest first; a limit that stops short says where to go on.
        let newest = try setup.taskloop(["ls", "--limit", "1"])
        #expect(newest.status == 0 && newest.lines.count == 1, "\(newest)")
        #expect((try JSONSerialization.jsonObject(with: Data(newest.lines[0].utf8)) as? [String: Any])?["id"] as? String == long)
        #expect(newest.stderr == "taskloop: more tasks follow: add --after \(long)\n")
        let rest = try setup.taskloop(["ls", "--after", long, "--json"])
        #expect(rest.lines.count == 1 && rest.lines[0].contains(noop) && rest.stderr.isEmpty)
        #expect(try setup.taskloop(["ls", "--all", "--state", "succeeded"]).lines.count == 1)
        #expect(try setup.taskloop(["ls", "--queue", "slow"]).lines.count == 1)
        #expect(try setup.taskloop(["ls", "--state", "bogus"]).status == 4)

        // A workflow from standard input; get, cancel and retry find it by its id.
        let workflowFile = #"{"name": "pair", "tasks": [{"key": "a", "kind": "sleep", "params": {"duration_ms": 600000}}, {"key": "b", "kind": "noop", "dependencies": ["a"]}]}"#
        let submitted = try setup.taskloop(["submit", "-f", "-"], input: workflowFile)
        let workflow = try #require(submitted.lines.first)
        let shown = try setup.taskloop(["get", workflow])
        #expect(shown.json["name"] as? String == "pair" && (shown.json["keys"] as? [String: String])?.count == 2)
        #expect(try setup.taskloop(["ls", "--workflow", workflow]).lines.count == 2)
        #expect(try setup.taskloop(["cancel", workflow]).json["state"] as? String == "cancelled")
        #expect(try setup.taskloop(["retry", workflow]).json["retried"] as? Int == 2)
        #expect(try setup.taskloop(["cancel", workflow]).status == 0)

        // A file of tasks in batches: a line per task, in order; one refused, the others created.
        let batch = try setup.taskloop(["submit", "--batch", "-"],
                                       input: #"{"kind":"noop","queue":"batched"}"# + "\n" + #"{"queue":"batched"}"# + "\n"
                                           + #"{"kind":"noop","queue":"batched"}"# + "\n")
        #expect(batch.status == 4, "\(batch)")
        #expect(batch.lines.count == 3 && batch.lines[1].hasPrefix("422 invalid tasks[1].kind"), "\(batch.lines)")
        #expect(batch.lines[0].hasPrefix("201 ") && batch.lines[2].hasPrefix("201 "))
        #expect(try setup.taskloop(["ls", "--queue", "batched"]).lines.count == 2)

        // The same Idempotency-Key and request: the same task, not a second one.
        let keyed = try setup.submit(["--kind", "noop", "--idempotency-key", "k-1"])
        #expect(try setup.submit(["--kind", "noop", "--idempotency-key", "k-1"]) == keyed)
        try setup.service.stop()
    }

    @Test func mistakesEndWithTheirOwnStatusAndTheServersWords() throws {
        let setup = try Setup()
        let unknown = try setup.taskloop(["get", "01M87PQE14GCJXGN16BW5C625M"])
        #expect(unknown.status == 3 && unknown.stderr == "taskloop: no task or workflow 01M87PQE14GCJXGN16BW5C625M at \(setup.server)\n")
        let invalid = try setup.taskloop(["submit", "--kind", "sleep", "--params", #"{"duration_ms": -1}"#])
        #expect(invalid.status == 4 && invalid.stdout.isEmpty)
        #expect(invalid.stderr.hasPrefix("taskloop: 422 Unprocessable Content: ") && invalid.stderr.contains("\n  params.duration_ms: "),
                "\(invalid.stderr)")
        #expect(!invalid.stderr.contains("Fatal") && !invalid.stderr.contains("Backtrac"))
        for arguments in [["submit"], ["submit", "--kind", "noop", "-f", "x.json"], ["submit", "--kind", "noop", "--wait", "--watch"],
                          ["submit", "--kind", "noop", "--params", "{nope"], ["submit", "-f", "/nonexistent.json"],
                          ["ls", "--limit", "0"], ["get"]] {
            let run = try setup.taskloop(arguments)
            #expect(run.status == 64 && !run.stderr.isEmpty, "\(arguments): \(run)")
        }
        #expect(try CLITests.taskloop(["watch", "x", "--server", "ftp://x"]).status == 64)
        let help = try CLITests.taskloop(["submit", "--help"])
        #expect(help.status == 0 && help.stdout.contains("Exit status:") && help.stdout.contains("--idempotency-key"))
        try setup.service.stop()
    }

    @Test func theTokenComesFromTheFlagOrTheEnvironment() throws {
        let token = "t\(UUID().uuidString)"
        let service = try ServiceHarness { $0.authToken = token }
        let server = "http://127.0.0.1:\(service.port)"
        let refused = try CLITests.taskloop(["submit", "--kind", "noop", "--server", server])
        #expect(refused.status == 4 && refused.stderr.hasPrefix("taskloop: 401 Unauthorized") && refused.stderr.contains("--auth-token"))
        let id = try #require(try CLITests.taskloop(["submit", "--kind", "noop", "--server", server, "--auth-token", token]).lines.first)
        let watched = try CLITests.taskloop(["watch", id, "--server", server], environment: ["TASKLOOP_AUTH_TOKEN": token])
        #expect(watched.status == 0 && watched.lines.count == 1, "\(watched)")
        try service.stop()
    }

    @Test func submitWaitEndsWithWhatTheTaskEndedAs() throws {
        let setup = try Setup()
        let succeeded = try setup.taskloop(["submit", "--kind", "noop", "--wait"])
        #expect(succeeded.status == 0 && succeeded.json["state"] as? String == "succeeded")
        let failed = try setup.taskloop(["submit", "--kind", "exec", "--params", #"{"argv": ["false"]}"#, "--wait"])
        #expect(failed.status == 1 && failed.json["state"] as? String == "failed")
        let closed = try OriginServer.freePort()
        let unreachable = try setup.taskloop(["submit", "--kind", "http", "--params", #"{"url": "http://127.0.0.1:\#(closed)/"}"#, "--wait"])
        #expect(unreachable.status == 1 && (unreachable.json["error"] as? [String: Any])?["code"] as? String == "connect_failed")
        let workflow = try setup.taskloop(["submit", "--wait", "-f", "-"], input: #"{"tasks": [{"key": "a", "kind": "noop"}]}"#)
        #expect(workflow.status == 0 && workflow.json["state"] as? String == "succeeded" && workflow.json["tasks"] != nil)

        // Cancelled from another call while it waits.
        let waiting = try BinaryTests.RunningBinary(arguments: ["submit", "--kind", "sleep", "--params", #"{"duration_ms": 600000}"#,
                                                                "--name", "cancel-me", "--wait", "--server", setup.server])
        var id: String?
        try pollUntil("the waited-for task to run") {
            let running = try setup.api.call("GET", "/tasks?state=running").json["tasks"] as? [[String: Any]] ?? []
            id = running.first { $0["name"] as? String == "cancel-me" }?["id"] as? String
            return id != nil
        }
        #expect(try setup.taskloop(["cancel", try #require(id)]).status == 0)
        #expect(try waiting.waitForExit() == 2)
        #expect(waiting.printed.contains(#""state":"cancelled""#))
        try setup.service.stop()
    }

    // MARK: watch

    @Test func watchWithoutATerminalPrintsALinePerChange() throws {
        let setup = try Setup()
        let task = try setup.submit(["--kind", "sleep", "--params", #"{"duration_ms": 600, "steps": 3}"#, "--name", "nap time"])
        let watched = try setup.taskloop(["watch", task])
        #expect(watched.status == 0, "\(watched)")
        let pattern = #"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \#(task) "nap time" "#
        #expect(watched.lines.allSatisfy { $0.range(of: pattern, options: .regularExpression) != nil }, "\(watched.lines)")
        #expect(watched.lines.last?.hasSuffix(#" "nap time" succeeded 100% step 2 of 3"#) == true, "\(watched.lines)")
        // Progress events come at most five a second per task, so some steps may be folded
        // into later ones; the first line and the last always come.
        #expect(watched.lines.first?.contains(#" "nap time" running "#) == true, "\(watched.lines)")
        // Watching what has ended shows how it ended, at once.
        let again = try setup.taskloop(["watch", task])
        #expect(again.status == 0 && again.lines.count == 1)

        let failing = try setup.taskloop(["submit", "--watch", "-f", "-"], input: #"{"name": "w", "tasks": [{"key": "bad", "kind": "exec", "params": {"argv": ["sh", "-c", "exit 3"]}}, {"key": "after", "kind": "noop", "dependencies": ["bad"]}]}"#)
        #expect(failing.status == 1, "\(failing)")
        #expect(failing.lines.first?.range(of: "^\(Self.idPattern)$", options: .regularExpression) != nil)
        // It ended before the watch began: the tasks, then the workflow's end.
        #expect(failing.lines.last?.contains(" w failed 100%") == true, "\(failing.lines)")
        #expect(failing.lines.contains { $0.contains(" bad failed ") && $0.contains("exit_status") })
        #expect(failing.lines.contains { $0.contains(" after cancelled ") && $0.contains("dependency_failed") })

        let cancelled = try setup.submit(["--kind", "sleep", "--params", #"{"duration_ms": 600000}"#])
        let watcher = try BinaryTests.RunningBinary(arguments: ["watch", cancelled, "--server", setup.server])
        _ = try watcher.waitForLine(containing: " running ")
        #expect(try setup.taskloop(["cancel", cancelled]).status == 0)
        #expect(try watcher.waitForExit() == 2)
        try setup.service.stop()
    }

    @Test func watchEndsWith3ForAnUnknownIdOrAnUnreachableServer() throws {
        let setup = try Setup()
        let unknown = try setup.taskloop(["watch", "01M87PQE14GCJXGN16BW5C625M"])
        #expect(unknown.status == 3 && unknown.stderr.contains("no task or workflow 01M87PQE14GCJXGN16BW5C625M"))
        try setup.service.stop()
        let port = try OriginServer.freePort()
        let unreachable = try CLITests.taskloop(["watch", "01M87PQE14GCJXGN16BW5C625M", "--server", "http://127.0.0.1:\(port)"])
        #expect(unreachable.status == 3 && unreachable.stderr.hasPrefix("taskloop: cannot reach the server at http://127.0.0.1:\(port): "),
                "\(unreachable)")
        let submitted = try CLITests.taskloop(["submit", "--kind", "noop", "--server", "http://127.0.0.1:\(port)"])
        #expect(submitted.status == 3)
    }

    /// The server is stopped (SIGTERM) and started again on the same port and data dir while
    /// a watched task runs: the watch comes back and sees it to its end.
    @Test func watchComesBackAfterTheServerRestarts() throws {
        let port = try OriginServer.freePort()
        let dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("cli-restart-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        let arguments = ["--port", String(port), "--data-dir", dataDirectory, "--shutdown-grace-seconds", "0.2", "--log-level", "warning"]
        let first = try BinaryTests.RunningBinary(arguments: arguments)
        _ = try first.waitForLine(containing: "listening on")
        let server = "http://127.0.0.1:\(port)"
        let task = try #require(try CLITests.taskloop(["submit", "--kind", "sleep", "--params", #"{"duration_ms": 1000, "steps": 4}"#,
                                                       "--server", server]).lines.first)
        let watcher = try BinaryTests.RunningBinary(arguments: ["watch", task, "--server", server, "--max-backoff-seconds", "0.5"])
        _ = try watcher.waitForLine(containing: " running ")
        #expect(try first.stop() == 0)
        _ = try watcher.waitForLine(containing: "lost the event stream")
        let second = try BinaryTests.RunningBinary(arguments: arguments)
        _ = try second.waitForLine(containing: "listening on")
        #expect(try watcher.waitForExit(timeout: 20) == 0, "\(watcher.printed)")
        #expect(watcher.printed.contains("taskloop: the event stream is back"))
        #expect(watcher.printed.contains(" succeeded 100%"))
        #expect(try second.stop() == 0)
    }

    /// A scripted server drops a workflow's stream, then says its events are gone: the watch
    /// resumes with `Last-Event-ID` set to the last event it took, then fetches the workflow
    /// again and streams from its new `Event-Seq`.
    @Test func aWorkflowWatchResumesWithLastEventIDAndFetchesAgainAfterAReset() throws {
        let origin = try ScriptedServer { request, round in
            func workflow(_ seq: Int, fraction: Double) -> ScriptedServer.Answer {
                let task = #"{"id":"T","name":null,"kind":"sleep","state":"running","progress":{"fraction":\#(fraction),"message":null},"attempt":1}"#
                return .close(status: 200, headers: ["Event-Seq: \(seq)", "Content-Type: application/json"],
                              body: #"{"id":"W","name":"scripted","state":"running","progress":{"fraction":0},"tasks":[\#(task)],"keys":{"only":"T"}}"#)
            }
            func event(_ seq: Int, _ type: String, _ member: String, _ object: String) -> String {
                "id: \(seq)\nevent: \(type)\ndata: {\"seq\":\(seq),\"type\":\"\(type)\",\"time\":\"2026-11-24T19:55:33.837Z\",\"\(member)\":\(object)}\n\n"
            }
            switch (request.path, round) {
            case ("/tasks/W/events", _):
                return .close(status: 404, headers: ["Content-Type: application/problem+json"], body: #"{"status":404,"title":"Not Found"}"#)
            case ("/workflows/W", 0):
                return workflow(5, fraction: 0.1)
            case ("/events?workflow=W&since=5", 0):
                // One event, then the connection ends under the watch.
                return .close(status: 200, headers: ["Content-Type: text/event-stream"],
                              body: "retry: 50\n\n" + event(6, "task.progress", "task", #"{"id":"T","kind":"sleep","state":"running","progress":{"fraction":0.5}}"#))
            case ("/events?workflow=W&since=6", _):
                return .hold(status: 200, headers: ["Content-Type: text/event-stream"], body: "event: reset\ndata: {\"oldest\":50}\n\n")
            case ("/workflows/W", _):
                return workflow(60, fraction: 0.9)
            case ("/events?workflow=W&since=60", _):
                return .hold(status: 200, headers: ["Content-Type: text/event-stream"], body:
                    event(61, "task.state", "task", #"{"id":"T","kind":"sleep","state":"succeeded","progress":{"fraction":1}}"#)
                        + event(62, "workflow.state", "workflow", #"{"id":"W","name":"scripted","state":"succeeded","progress":{"fraction":1}}"#))
            default:
                return .close(status: 500, headers: [], body: "unexpected")
            }
        }
        defer { origin.stop() }
        let watched = try CLITests.taskloop(["watch", "W", "--server", "http://127.0.0.1:\(origin.port)"])
        #expect(watched.status == 0, "\(watched)")
        let requests = origin.requests.value
        #expect(requests.map(\.path) == ["/tasks/W/events", "/workflows/W", "/events?workflow=W&since=5", "/events?workflow=W&since=6",
                                         "/workflows/W", "/events?workflow=W&since=60"])
        #expect(requests.map { $0.headers["last-event-id"] } == [nil, nil, nil, "6", nil, nil])
        #expect(requests.allSatisfy { $0.headers["accept"] != nil })
        #expect(watched.lines.map { $0.split(separator: " ").dropFirst().joined(separator: " ") } == [
            "T only running 10%", "W scripted running 10%", "T only running 50%",
            "T only running 90%", "W scripted running 90%", "T only succeeded 100%", "W scripted succeeded 100%",
        ])
        #expect(watched.stderr.contains("lost the event stream (the server ended the event stream)"))
    }

    // MARK: on a terminal

    /// A terminal of its own: a tmux server in the foreground (`-D`) on a socket of its own,
    /// with one session running `command`; killed, with the pane's processes, when the test is
    /// done with it.
    ///
    /// tmux is started with posix_spawn and waited for with waitpid, its output going to a
    /// file the child opens itself, rather than through Foundation's `Process` and `Pipe`:
    /// those leave descriptors behind in this process that any child started meanwhile inherits
    /// (an in-process server's `exec` program, say), and a read that waits for a pipe's end,
    /// or a wait for a child's end, then lasts as long as that other child. Its children also
    /// start with every signal unblocked and at its default, as from a shell, rather than
    /// with the test runner's mask.
    final class Terminal {
        let socket = FileManager.default.temporaryDirectory.appendingPathComponent("tmux-\(UUID().uuidString.prefix(8))").path
        private let server: pid_t

        init(command: String, width: Int = 100, height: Int = 30) throws {
            guard FileManager.default.isExecutableFile(atPath: "/usr/bin/tmux") else {
                throw TestTimeout(what: "tmux, which this test needs (make test installs it)")
            }
            server = try Self.spawn(["/usr/bin/tmux", "-S", socket, "-D"], output: nil)
            try pollUntil("the tmux server's socket") { FileManager.default.fileExists(atPath: socket) }
            try tmux(["new-session", "-d", "-x", String(width), "-y", String(height), command])
            // -D turned it off: should the test be killed, the server goes with its session.
            try tmux(["set-option", "-g", "exit-empty", "on"])
        }

        /// Starts `arguments` (the first a path), its output to the file `output` (else
        /// nowhere), and returns its pid.
        static func spawn(_ arguments: [String], output: String?) throws -> pid_t {
            var attributes = posix_spawnattr_t()
            posix_spawnattr_init(&attributes)
            defer { posix_spawnattr_destroy(&attributes) }
            var unblocked = sigset_t()
            sigemptyset(&unblocked)
            var defaults = sigset_t()
            sigfillset(&defaults)
            sigdelset(&defaults, SIGKILL)
            sigdelset(&defaults, SIGSTOP)
            posix_spawnattr_setsigmask(&attributes, &unblocked)
            posix_spawnattr_setsigdefault(&attributes, &defaults)
            posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
            var actions = posix_spawn_file_actions_t()
            posix_spawn_file_actions_init(&actions)
            defer { posix_spawn_file_actions_destroy(&actions) }
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 1, output ?? "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
            let argv = arguments.map { strdup($0) } + [nil]
            defer { for argument in argv { free(argument) } }
            var pid: pid_t = 0
            let status = posix_spawn(&pid, arguments[0], &actions, &attributes, argv, environ)
            guard status == 0 else { throw ClientError.system("posix_spawn \(arguments[0])", status) }
            return pid
        }

        /// Runs a tmux command on this server and returns what it printed.
        @discardableResult
        func tmux(_ arguments: [String]) throws -> String {
            let output = socket + "-output"
            defer { unlink(output) }
            let client = try Self.spawn(["/usr/bin/tmux", "-S", socket] + arguments, output: output)
            var status: Int32 = 0
            while waitpid(client, &status, 0) < 0 && errno == EINTR {}
            return (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        }

        /// What the pane shows, line by line, without trailing blank lines.
        func screen() throws -> [String] {
            var lines = try tmux(["capture-pane", "-p"]).components(separatedBy: "\n")
            while lines.last?.trimmingCharacters(in: .whitespaces).isEmpty == true { lines.removeLast() }
            return lines
        }

        /// Waits until the screen satisfies `condition` and returns it.
        func waitForScreen(_ what: String, timeout: Double = 20, _ condition: ([String]) -> Bool) throws -> [String] {
            var shown: [String] = []
            do {
                try pollUntil(what, timeout: timeout, every: 20_000) {
                    shown = try screen()
                    return condition(shown)
                }
            } catch {
                throw TestTimeout(what: "\(what); the screen: \(shown.joined(separator: "\n"))")
            }
            return shown
        }

        var cursorIsVisible: Bool { (try? tmux(["display-message", "-p", "#{cursor_flag}"]))?.hasPrefix("1") == true }

        deinit {
            let panes = (try? tmux(["list-panes", "-a", "-F", "#{pane_pid}"])) ?? ""
            for pane in panes.split(separator: "\n").compactMap({ Int32($0) }) { kill(-pane, SIGKILL) }
            kill(server, SIGKILL)
            var status: Int32 = 0
            while waitpid(server, &status, 0) < 0 && errno == EINTR {}
            unlink(socket)
        }
    }

    /// The command line of a shell in the pane: `taskloop` with `arguments`, then its status,
    /// then a pause that keeps the pane to be read (and bounds the server's life should the
    /// test itself be killed).
    static func paneCommand(_ arguments: [String]) -> String {
        let quoted = ([BinaryTests.executable.path] + arguments).map { "'\($0.replacingOccurrences(of: "'", with: "'\\''"))'" }
        return quoted.joined(separator: " ") + "; echo EXIT=$?; sleep 60"
    }

    @Test func progressBarsAreDrawnInPlaceOnATerminal() throws {
        // The server is a process of its own: its `exec` programs then inherit nothing of this one.
        let server = try BinaryTests.RunningBinary(arguments: ["--port", "0", "--allow-exec", "--durability", "memory",
                                                               "--log-level", "warning"])
        let port = try #require(BinaryTests.port(from: try server.waitForLine(containing: "listening on")))
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cli-tty-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("workflow.json")
        let gate = directory.appendingPathComponent("gate").path
        // Two programs that report 40% and wait for the test to let them finish.
        let program = #"["sh", "-c", "echo PROGRESS 40% working; while [ ! -e \#(gate) ]; do sleep 0.02; done"]"#
        try Data(#"{"name": "thumbnails", "tasks": [{"key": "download", "kind": "exec", "params": {"argv": \#(program)}}, {"key": "resize", "kind": "exec", "params": {"argv": \#(program)}}, {"key": "publish", "kind": "noop", "dependencies": ["download", "resize"]}]}"#.utf8)
            .write(to: file)
        let terminal = try Terminal(command: Self.paneCommand(["submit", "-f", file.path, "--watch", "--server", "http://127.0.0.1:\(port)"]))
        let labels = ["download", "resize", "publish"]
        func linesOf(_ screen: [String], _ label: String) -> [String] { screen.filter { $0.hasPrefix(label + " ") } }
        // Midway: each task on one line of its own, redrawn rather than scrolled.
        let midway = try terminal.waitForScreen("both programs at 40%") { screen in
            screen.filter { $0.range(of: #"^(download|resize) +\[======> +\]  40%  running +\d+s  working$"#,
                                     options: .regularExpression) != nil }.count == 2
        }
        #expect(labels.allSatisfy { linesOf(midway, $0).count == 1 }, "\(midway)")
        #expect(linesOf(midway, "publish").first?.hasSuffix(" --%  pending") == true, "\(midway)")
        #expect(midway[1].contains(" 26%  running  0/3 done"), "the workflow's line: \(midway)")
        #expect(!terminal.cursorIsVisible, "the cursor is hidden while bars are drawn")
        FileManager.default.createFile(atPath: gate, contents: nil)
        let end = try terminal.waitForScreen("the watch to end") { $0.contains { $0.hasPrefix("EXIT=") } }
        #expect(end.last == "EXIT=0", "\(end)")
        #expect(end.first?.range(of: "^\(Self.idPattern)$", options: .regularExpression) != nil)
        #expect(end[1].hasPrefix("workflow thumbnails (") && end[1].contains(" 100%  succeeded  3/3 done"), "\(end)")
        for label in labels {
            let lines = linesOf(end, label)
            #expect(lines.count == 1 && lines[0].contains("[==================] 100%  succeeded"), "\(label): \(end)")
        }
        #expect(end.count == 6, "the id, the workflow, three tasks, the status: \(end)")
        #expect(end.allSatisfy { $0.count < 100 })
        #expect(terminal.cursorIsVisible)
        #expect(try server.stop() == 0)
    }

    @Test func ctrlCStopsWatchingAndGivesTheCursorBack() throws {
        let setup = try Setup()
        let task = try setup.submit(["--kind", "sleep", "--params", #"{"duration_ms": 600000}"#, "--name", "long"])
        let terminal = try Terminal(command: Self.paneCommand(["watch", task, "--server", setup.server]), width: 60, height: 10)
        _ = try terminal.waitForScreen("the bar") { $0.first?.hasPrefix("long  [") == true }
        try terminal.tmux(["send-keys", "C-c"])
        let end = try terminal.waitForScreen("the watch to stop") { $0.contains { $0.hasPrefix("EXIT=") } }
        #expect(end.contains("EXIT=130") && terminal.cursorIsVisible, "\(end)")
        #expect(end.allSatisfy { $0.count < 60 })
        #expect(try setup.api.task(task)["state"] as? String == "running", "the task goes on")
        // Cancelled, so the stop need not give it the grace to finish.
        #expect(try setup.taskloop(["cancel", task]).status == 0)
        try setup.service.stop()
    }
}

/// An HTTP/1.1 server that answers from a script, for behaviour a real server shows only by
/// accident: `script(request, round)` decides each answer, `round` counting earlier requests
/// for the same target. An answer either ends with the connection closed (the body delimited
/// by the close) or holds the connection open after its body, like a live event stream.
final class ScriptedServer: @unchecked Sendable {
    enum Answer {
        case close(status: Int, headers: [String], body: String)
        case hold(status: Int, headers: [String], body: String)
    }

    struct Request: Sendable {
        /// The target: path and query.
        let path: String
        /// Names lower-cased.
        let headers: [String: String]
    }

    let port: Int
    let requests = Locked<[Request]>([])
    private let listener: Int32
    private let held = Locked<[Int32]>([])
    private let script: @Sendable (Request, Int) -> Answer

    init(_ script: @escaping @Sendable (Request, Int) -> Answer) throws {
        self.script = script
        let (listener, port) = try loopbackListener(backlog: 16)
        self.port = port
        self.listener = listener
        Thread { [self] in
            while case let fd = accept(listener, nil, nil), fd >= 0 { serve(fd) }
        }.start()
    }

    /// One request per connection, answered in turn.
    private func serve(_ fd: Int32) {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4_096)
        while buffer.firstRange(of: Array("\r\n\r\n".utf8)) == nil {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else {
                close(fd)
                return
            }
            buffer += chunk[..<count]
        }
        let lines = String(decoding: buffer, as: UTF8.self).components(separatedBy: "\r\n")
        let target = lines[0].split(separator: " ").dropFirst().first.map(String.init) ?? ""
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let request = Request(path: target, headers: headers)
        let round = requests.withLock { all in
            defer { all.append(request) }
            return all.filter { $0.path == target }.count
        }
        switch script(request, round) {
        case .close(let status, let fields, let body):
            send(fd, status, fields, body)
            close(fd)
        case .hold(let status, let fields, let body):
            send(fd, status, fields, body)
            held.withLock { $0.append(fd) }
        }
    }

    private func send(_ fd: Int32, _ status: Int, _ fields: [String], _ body: String) {
        let bytes = Array("HTTP/1.1 \(status) Scripted\r\nConnection: close\r\n\(fields.map { $0 + "\r\n" }.joined())\r\n\(body)".utf8)
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent > 0 else { return }
            offset += sent
        }
    }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        for fd in held.value { close(fd) }
    }
}
