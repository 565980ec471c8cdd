import Foundation
import Testing
import TaskloopLoop
@testable import TaskloopService
import TaskloopTestSupport

/// `exec` tasks end to end: real child processes, their output, progress and exit, and
/// cancellation that really stops them (checked by pid).
@Suite(.serialized) struct ExecTests {
    static func isGone(_ pid: Int32) -> Bool {
        // A zombie is dead; it is reaped by whoever inherited it, not by us.
        guard kill(pid, 0) == 0 else { return true }
        let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        return stat.split(separator: ")").last?.split(separator: " ").first == "Z"
    }

    static func waitUntilGone(_ pid: Int32, timeout: Double = 10) throws {
        try pollUntil("process \(pid) to end", timeout: timeout) { isGone(pid) }
    }

    static func json(_ value: Any) -> String {
        String(decoding: try! JSONSerialization.data(withJSONObject: value), as: UTF8.self)
    }

    func submit(_ client: APIClient, _ argv: [String], extra: [String: Any] = [:], params: [String: Any] = [:]) throws -> String {
        var body: [String: Any] = ["kind": "exec", "params": params.merging(["argv": argv]) { $1 }]
        body.merge(extra) { $1 }
        return try #require(try client.submit(Self.json(body))["id"] as? String)
    }

    @Test func outputProgressAndExitStatus() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let ok = try submit(client, ["sh", "-c", "echo PROGRESS 25% a quarter; echo PROGRESS 0.5; echo out; echo err >&2; echo $GREETING"],
                            params: ["env": ["GREETING": "hello"]])
        let done = try client.waitForState(ok, "succeeded")
        let result = try #require(done["result"] as? [String: Any])
        #expect(result["exit_code"] as? Int == 0)
        #expect((result["stdout"] as? String)?.contains("out\nhello\n") == true)
        #expect(result["stderr"] as? String == "err\n")
        #expect((done["progress"] as? [String: Any])?["message"] as? String == "a quarter")

        let failing = try submit(client, ["sh", "-c", "echo broken >&2; exit 3"])
        let failed = try client.waitForState(failing, "failed")
        let error = try #require(failed["error"] as? [String: Any])
        #expect(error["code"] as? String == "exit_status" && error["exit_code"] as? Int == 3)
        #expect(error["stderr"] as? String == "broken\n")

        let missing = try submit(client, ["/no/such/program"])
        #expect((try client.waitForState(missing, "failed")["error"] as? [String: Any])?["code"] as? String == "spawn_failed")

        let directory = FileManager.default.temporaryDirectory.path
        let cwd = try submit(client, ["pwd"], params: ["cwd": directory])
        let printed = (try client.waitForState(cwd, "succeeded")["result"] as? [String: Any])?["stdout"] as? String
        #expect(printed?.trimmingCharacters(in: .newlines) == URL(fileURLWithPath: directory).resolvingSymlinksInPath().path
            || printed?.trimmingCharacters(in: .newlines) == directory)
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"exec","params":{"argv":[]}}"#).status == 422)
        try service.stop()
    }

    /// The server ignores SIGPIPE; a program it starts must not inherit that (a pipeline in it
    /// would never stop at a closed reader), nor a blocked signal mask.
    @Test func childrenGetDefaultSignalHandling() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        _ = signal(SIGPIPE, SIG_IGN)   // as the server does (it is already, once a server started)
        let id = try submit(client, ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"])
        let output = (try client.waitForState(id, "succeeded")["result"] as? [String: Any])?["stdout"] as? String ?? ""
        let masks = Dictionary(uniqueKeysWithValues: output.split(separator: "\n").map { line in
            let parts = line.split(separator: ":")
            return (String(parts[0]), UInt64(parts[1].trimmingCharacters(in: .whitespaces), radix: 16) ?? .max)
        })
        let pipeBit: UInt64 = 1 << (UInt64(SIGPIPE) - 1)
        #expect(masks["SigIgn"].map { $0 & pipeBit == 0 } == true, "\(output)")
        #expect(masks["SigBlk"] == 0, "\(output)")
        try service.stop()
    }

    /// A program starts with descriptors 0, 1 and 2 only, whatever the server holds open: curl's
    /// connections and socketpair (an http task ran), an event stream, the store's files. The
    /// built binary, not the harness: other tests' threads in this process open descriptors
    /// without O_CLOEXEC at any moment, and one opened during a spawn would be inherited.
    @Test func programsInheritOnlyTheStandardDescriptors() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let binary = try BinaryTests.RunningBinary(arguments: ["--port", "0", "--allow-exec"])
        let port = try #require(BinaryTests.port(from: try binary.waitForLine(containing: "listening on")))
        let client = try APIClient(port: port)
        let fetch = try #require(try client.submit(Self.json(["kind": "http", "params": ["url": origin.url("/text/10")]]))["id"] as? String)
        _ = try client.waitForState(fetch, "succeeded")
        let stream = try EventStreamTests.Stream(port: port, "/events")
        #expect(stream.head.contains("200"))
        // The descriptors still open once listing them has closed its own.
        let listing = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd') if os.path.exists('/proc/self/fd/' + fd)))"
        let id = try submit(client, ["python3", "-c", listing])
        let output = (try client.waitForState(id, "succeeded")["result"] as? [String: Any])?["stdout"] as? String
        #expect(output == "[0, 1, 2]\n")
        #expect(try binary.stop() == 0)
    }

    /// The child writes its pid and its background grandchild's pid, then waits.
    func startFamily(_ client: APIClient, extra: [String: Any] = [:], params: [String: Any] = [:],
                     trap: String = "") throws -> (task: String, child: Int32, grandchild: Int32) {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("family-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let script = "\(trap) sleep 300 & echo $$ $! > \(file).tmp; mv \(file).tmp \(file); echo PROGRESS 0.1 started; wait; sleep 300"
        let task = try submit(client, ["sh", "-c", script], extra: extra, params: params)
        try pollUntil("the child to start") { FileManager.default.fileExists(atPath: file) }
        let pids = try String(contentsOfFile: file, encoding: .utf8).split(separator: " ").compactMap {
            Int32($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        return (task, pids[0], pids[1])
    }

    @Test func cancelStopsTheChildAndItsGrandchild() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let family = try startFamily(client)
        #expect(!Self.isGone(family.child) && !Self.isGone(family.grandchild))
        let cancel = try client.call("DELETE", "/tasks/\(family.task)")
        #expect(cancel.status == 202 || cancel.status == 200)
        _ = try client.waitForState(family.task, "cancelled")
        // Cancelled means reaped: the child is gone by now, not just signalled.
        #expect(Self.isGone(family.child))
        try Self.waitUntilGone(family.grandchild)
        try service.stop()
    }

    @Test func aChildIgnoringSIGTERMIsKilledAfterTheGrace() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let family = try startFamily(client, params: ["grace_ms": 200], trap: "trap '' TERM;")
        let started = Date()
        #expect(try client.call("DELETE", "/tasks/\(family.task)").status == 202)
        _ = try client.waitForState(family.task, "cancelled")
        #expect(Date().timeIntervalSince(started) >= 0.2)
        #expect(Self.isGone(family.child))
        try Self.waitUntilGone(family.grandchild)
        try service.stop()
    }

    /// A `grace_ms` longer than the engine's own cancel grace is the one that counts: the task
    /// is not declared cancelled while its program still runs.
    @Test func aLongGraceOutlastsTheEngineDefault() throws {
        let service = try ServiceHarness {
            $0.allowExec = true
            $0.engine.cancelGraceMilliseconds = 50
        }
        let client = try service.client()
        let family = try startFamily(client, params: ["grace_ms": 600], trap: "trap '' TERM;")
        #expect(try client.call("DELETE", "/tasks/\(family.task)").status == 202)
        _ = try client.waitForState(family.task, "cancelled")
        #expect(Self.isGone(family.child), "cancelled only once the program was killed at its grace and reaped")
        try service.stop()
    }

    @Test func aTimeoutFailsTheTaskAndStopsTheChild() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let family = try startFamily(client, extra: ["timeout_ms": 300])
        let failed = try client.waitForState(family.task, "failed")
        #expect((failed["error"] as? [String: Any])?["code"] as? String == "timeout")
        try Self.waitUntilGone(family.child)
        try Self.waitUntilGone(family.grandchild)
        try service.stop()
    }

    // MARK: descendants that leave the process group

    /// A program that leaves two descendants behind outside its process group, each writing its
    /// pid to a file and holding the program's stdout: one through `setsid`, one through a
    /// double fork into a new session. Returns the task, the two pids and the directory of their
    /// files, which the program waits for (the caller removes it). `{dir}` in `rest` names it.
    func startEscapees(_ client: APIClient, then rest: String, extra: [String: Any] = [:]) throws
        -> (task: String, escapees: [Int32], directory: String) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("escapees-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let script = """
            setsid sh -c 'echo $$ > \(directory)/a.tmp; mv \(directory)/a.tmp \(directory)/a; exec sleep 300' &
            (setsid sh -c 'echo $$ > \(directory)/b.tmp; mv \(directory)/b.tmp \(directory)/b; exec sleep 300' &)
            while [ ! -e \(directory)/a ] || [ ! -e \(directory)/b ]; do sleep 0.01; done
            \(rest.replacingOccurrences(of: "{dir}", with: directory))
            """
        let task = try submit(client, ["sh", "-c", script], extra: extra)
        try pollUntil("the escapees to start") {
            FileManager.default.fileExists(atPath: "\(directory)/a") && FileManager.default.fileExists(atPath: "\(directory)/b")
        }
        let pids = try ["a", "b"].map { name in
            try #require(Int32(try String(contentsOfFile: "\(directory)/\(name)", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
        }
        for pid in pids { #expect(!Self.isGone(pid)) }
        return (task, pids, directory)
    }

    /// Before the cookie, cancelling killed the group but not these; holding stdout, they kept
    /// the task cancelling until the engine's grace ended it (10 s), and lived on.
    @Test func cancelKillsDescendantsThatLeftTheGroup() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let family = try startEscapees(client, then: "sleep 300")
        defer { try? FileManager.default.removeItem(atPath: family.directory) }
        let started = Date()
        #expect(try client.call("DELETE", "/tasks/\(family.task)").status == 202)
        let cancelled = try client.waitForState(family.task, "cancelled", timeout: 5)
        #expect((cancelled["error"] as? [String: Any])?["message"] as? String == "The task was cancelled.")
        #expect(Date().timeIntervalSince(started) < 5)
        for pid in family.escapees { try Self.waitUntilGone(pid, timeout: 5) }
        try service.stop()
    }

    /// A program that exits leaving a daemon holding its stdout ends with its daemon, at once.
    /// (Before, the pipe never reached EOF and the task ran forever.)
    @Test func whatAProgramLeavesBehindDiesWithIt() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        // The program ends once the test has seen its descendants alive (the file `go`).
        let family = try startEscapees(client, then: "while [ ! -e {dir}/go ]; do sleep 0.01; done; echo daemons started")
        defer { try? FileManager.default.removeItem(atPath: family.directory) }
        #expect(FileManager.default.createFile(atPath: "\(family.directory)/go", contents: nil))
        let done = try client.waitForState(family.task, "succeeded", timeout: 5)
        #expect((done["result"] as? [String: Any])?["exit_code"] as? Int == 0)
        for pid in family.escapees { try Self.waitUntilGone(pid, timeout: 5) }
        try service.stop()
    }

    @Test func aTimeoutKillsDescendantsThatLeftTheGroup() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        // Time enough for the escapees to start first, on a loaded machine too: a timeout that
        // comes before them kills a family that has not yet left the group.
        let family = try startEscapees(client, then: "sleep 300", extra: ["timeout_ms": 5_000])
        defer { try? FileManager.default.removeItem(atPath: family.directory) }
        let failed = try client.waitForState(family.task, "failed", timeout: 20)
        #expect((failed["error"] as? [String: Any])?["code"] as? String == "timeout")
        for pid in family.escapees { try Self.waitUntilGone(pid, timeout: 5) }
        try service.stop()
    }

    @Test func everyProcessCarriesTheTaskCookie() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let id = try submit(client, ["sh", "-c", "sh -c 'env' | grep ^TASKLOOP_ | sort"], extra: ["retry": ["max_attempts": 1]])
        let output = (try client.waitForState(id, "succeeded")["result"] as? [String: Any])?["stdout"] as? String
        #expect(output == "TASKLOOP_TASK_ATTEMPT=1\nTASKLOOP_TASK_ID=\(id)\n")
        let spoof = try client.call("POST", "/tasks", json: #"{"kind":"exec","params":{"argv":["true"],"env":{"TASKLOOP_TASK_ID":"x"}}}"#)
        #expect(spoof.status == 422 && spoof.text.contains(#""field":"params.env.TASKLOOP_TASK_ID""#), "\(spoof.text)")
        try service.stop()
    }

    // MARK: cgroups

    /// Where servers this process starts make their attempts' cgroups; nil on a machine that
    /// lets it make none (then the tests that count on them do not run: on this project's
    /// machines and CI they do, cgroup2 being mounted and writable by root).
    static let cgroups = try? CgroupParent.probe()

    /// The attempts' cgroups of `task` still there.
    static func cgroupsLeft(of task: String) -> [String] {
        guard let parent = cgroups else { return [] }
        return ((try? FileManager.default.contentsOfDirectory(atPath: parent.path)) ?? []).filter { $0.hasPrefix("\(task):") }
    }

    static func waitUntilNoCgroupIsLeft(of task: String) throws {
        try pollUntil("the cgroups of \(task) to be removed", timeout: 5) { cgroupsLeft(of: task).isEmpty }
    }

    /// A program that leaves behind a process beyond every mark but its cgroup: it clears its
    /// environment (no cookie), and is double-forked into a session of its own (no process
    /// group, no parent). Its pid is in `{dir}/e`; then the program does `rest` (`{dir}` in it
    /// names the directory, which the caller removes).
    func startHiddenEscapee(_ client: APIClient, then rest: String, extra: [String: Any] = [:]) throws
        -> (task: String, escapee: Int32, directory: String) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("hidden-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let script = """
            (env -i setsid sh -c 'echo $$ > \(directory)/e.tmp; mv \(directory)/e.tmp \(directory)/e; exec sleep 300' &)
            while [ ! -e \(directory)/e ]; do sleep 0.01; done
            \(rest.replacingOccurrences(of: "{dir}", with: directory))
            """
        let task = try submit(client, ["sh", "-c", script], extra: extra)
        let escapee = try BinaryTests.pid(in: "\(directory)/e")
        #expect(!Self.isGone(escapee))
        let environment = (try? String(contentsOfFile: "/proc/\(escapee)/environ", encoding: .utf8)) ?? ""
        #expect(!environment.contains("TASKLOOP_TASK_ID"), "the cookie cannot find it")
        return (task, escapee, directory)
    }

    /// Before cgroups, this process lived on: no group, no cookie led to it.
    @Test(.enabled(if: ExecTests.cgroups != nil))
    func cancelKillsAProgramThatClearedItsEnvironmentAndLeftItsSession() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let family = try startHiddenEscapee(client, then: "sleep 300")
        defer { try? FileManager.default.removeItem(atPath: family.directory) }
        #expect(try client.call("DELETE", "/tasks/\(family.task)").status == 202)
        _ = try client.waitForState(family.task, "cancelled", timeout: 5)
        try Self.waitUntilGone(family.escapee, timeout: 5)
        try Self.waitUntilNoCgroupIsLeft(of: family.task)
        try service.stop()
    }

    @Test(.enabled(if: ExecTests.cgroups != nil))
    func aTimeoutKillsAProgramThatClearedItsEnvironmentAndLeftItsSession() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let family = try startHiddenEscapee(client, then: "sleep 300", extra: ["timeout_ms": 1_000])
        defer { try? FileManager.default.removeItem(atPath: family.directory) }
        let failed = try client.waitForState(family.task, "failed", timeout: 6)
        #expect((failed["error"] as? [String: Any])?["code"] as? String == "timeout")
        try Self.waitUntilGone(family.escapee, timeout: 5)
        try Self.waitUntilNoCgroupIsLeft(of: family.task)
        try service.stop()
    }

    /// A program that exits leaving such a process behind ends with it, at once.
    @Test(.enabled(if: ExecTests.cgroups != nil))
    func whatAProgramThatClearedItsEnvironmentLeavesBehindDiesWithIt() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        // The program ends once the test has seen what it left behind alive (the file `go`).
        let family = try startHiddenEscapee(client, then: "while [ ! -e {dir}/go ]; do sleep 0.01; done; echo left")
        defer { try? FileManager.default.removeItem(atPath: family.directory) }
        #expect(FileManager.default.createFile(atPath: "\(family.directory)/go", contents: nil))
        _ = try client.waitForState(family.task, "succeeded", timeout: 5)
        try Self.waitUntilGone(family.escapee, timeout: 5)
        try Self.waitUntilNoCgroupIsLeft(of: family.task)
        try service.stop()
    }

    /// The program itself (not only what it starts) is in a cgroup named by task and attempt,
    /// removed once the attempt is over; a program that cannot start still fails to start.
    @Test(.enabled(if: ExecTests.cgroups != nil))
    func eachAttemptRunsInACgroupOfItsOwn() throws {
        let service = try ServiceHarness { $0.allowExec = true }
        let client = try service.client()
        let first = try submit(client, ["sh", "-c", "cat /proc/self/cgroup; exit $((2 - TASKLOOP_TASK_ATTEMPT))"],
                               extra: ["retry": ["max_attempts": 2, "backoff_ms": 0]])
        let done = try client.waitForState(first, "succeeded")
        #expect(done["attempt"] as? Int == 2)
        let line = ((done["result"] as? [String: Any])?["stdout"] as? String ?? "").split(separator: "\n")
            .first { $0.hasPrefix("0::") }
        #expect(line?.hasSuffix("/taskloop/\(first):2") == true, "\(String(describing: line))")
        try Self.waitUntilNoCgroupIsLeft(of: first)

        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(FileManager.default.createFile(atPath: "\(directory)/not-executable", contents: Data("true\n".utf8)))
        for argv in [["/no/such/program"], ["no-such-program-on-the-path"], ["\(directory)/not-executable"], [directory]] {
            let task = try submit(client, argv)
            let error = try #require(try client.waitForState(task, "failed")["error"] as? [String: Any])
            #expect(error["code"] as? String == "spawn_failed", "\(argv): \(error)")
            try Self.waitUntilNoCgroupIsLeft(of: task)
        }
        let relative = try submit(client, ["./not-executable"], params: ["cwd": directory])
        #expect((try client.waitForState(relative, "failed")["error"] as? [String: Any])?["code"] as? String == "spawn_failed")
        try service.stop()
    }

    /// `GET /healthz` says what holds programs together: cgroups where they can be made, the
    /// cookie when told so (or when they cannot), nothing without exec.
    @Test func healthSaysHowProgramsAreHeldTogether() throws {
        func isolation(_ configure: @escaping (inout ServiceConfiguration) -> Void) throws -> String? {
            let service = try ServiceHarness(configure)
            defer { try? service.stop() }
            return try service.client().call("GET", "/healthz").json["process_isolation"] as? String
        }
        #expect(try isolation { $0.allowExec = true } == (Self.cgroups == nil ? "cookie" : "cgroup"))
        #expect(try isolation {
            $0.allowExec = true
            $0.execIsolation = .cookie
        } == "cookie")
        #expect(try isolation { _ in } == "none")
    }

    /// Told to use the cookie only, programs run where the server runs, as in v2.
    @Test func theCookieModeMakesNoCgroups() throws {
        let service = try ServiceHarness {
            $0.allowExec = true
            $0.execIsolation = .cookie
        }
        let client = try service.client()
        let id = try submit(client, ["cat", "/proc/self/cgroup"])
        let output = (try client.waitForState(id, "succeeded")["result"] as? [String: Any])?["stdout"] as? String ?? ""
        let own = (try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)) ?? ""
        #expect(output == own && !output.contains("/taskloop/"), "\(output)")
        try service.stop()
    }
}
