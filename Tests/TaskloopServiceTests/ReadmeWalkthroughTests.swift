import Foundation
import Testing
import TaskloopTestSupport

/// Runs the README's command blocks with bash, curl and jq against a real service, so the
/// documentation cannot go stale: the curl walkthrough (the `sh` block after
/// `<!-- walkthrough -->`) and the workers section (after `<!-- workers -->`), which starts
/// `taskloop worker` processes of the built binary.
@Suite struct ReadmeWalkthroughTests {
    static let readme = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("README.md")

    /// The `sh` block right after `marker`.
    static func block(after marker: String) throws -> String {
        let text = try String(contentsOf: readme, encoding: .utf8)
        guard let start = text.range(of: "\(marker)\n```sh\n"),
              let end = text.range(of: "\n```", range: start.upperBound..<text.endIndex) else {
            throw ClientError.malformed("README has no block after \(marker)")
        }
        return String(text[start.upperBound..<end.lowerBound])
    }

    static func walkthrough() throws -> String { try block(after: "<!-- walkthrough -->") }

    struct Run {
        var status: Int32
        var lines: [String]
        var stderr: String
    }

    /// Runs `script` with `bash -euo pipefail` in a fresh directory and `environment`, bounded
    /// to 60 s.
    static func run(_ script: String, environment: [String: String]) throws -> Run {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("walkthrough-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }

        // coreutils' timeout makes its own process group and, at the deadline, signals all of it
        // (bash and the curl it is waiting on), so the walkthrough is bounded however it hangs.
        // Output goes to files: nothing here blocks on a pipe.
        let stdoutFile = directory.appendingPathComponent("stdout"), stderrFile = directory.appendingPathComponent("stderr")
        FileManager.default.createFile(atPath: stdoutFile.path, contents: nil)
        FileManager.default.createFile(atPath: stderrFile.path, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments = ["--kill-after=5", "60", "/bin/bash", "-euo", "pipefail", "-c", script]
        process.currentDirectoryURL = directory
        process.environment = environment
        process.standardOutput = try FileHandle(forWritingTo: stdoutFile)
        process.standardError = try FileHandle(forWritingTo: stderrFile)
        try process.run()
        let status = try? process.waitForExit("the walkthrough", timeout: 70)
        // Whatever the script started in the background and left behind goes with its group.
        kill(-process.processIdentifier, status != nil ? SIGTERM : SIGKILL)
        guard let status else { throw TestTimeout(what: "the walkthrough, which outlived its 60 s bound") }
        let lines = try String(contentsOf: stdoutFile, encoding: .utf8).split(separator: "\n").map(String.init)
        let stderr = try String(contentsOf: stderrFile, encoding: .utf8)
        #expect(status != 124, "the walkthrough took longer than 60 s")
        return Run(status: status, lines: lines, stderr: stderr)
    }

    @Test func readmeWalkthroughRunsAsDocumented() throws {
        let service = try ServiceHarness()
        let run = try Self.run(try Self.walkthrough(), environment: ProcessInfo.processInfo.environment.merging(
            ["TASKLOOP": "http://127.0.0.1:\(service.port)"]) { $1 })
        #expect(run.status == 0, "walkthrough failed: \(run.stderr)")
        let lines = run.lines
        try #require(lines.count == 8, "printed: \(lines)")
        #expect(lines[0].contains(#""state":"running""#) && lines[0].contains(#""publish":"#))
        #expect(lines[1].hasPrefix(#"{"state":"running""#))
        #expect(lines[2] == #"{"state":"succeeded","progress":1}"#)
        #expect(lines[3] == #"{"state":"running"}"#)
        #expect(lines[4] == #"{"state":"cancelled","error":"cancelled"}"#)
        #expect(lines[5].hasPrefix(#"{"state":"cancelled","error":"dependency_failed","cause":""#))
        #expect(lines[6] == #"{"state":"cancelled","progress":1}"#)
        #expect(lines[7] == #"{"state":"succeeded","status":200,"body":"{\"status\":\"ok\",\"process_isolation\":\"none\"}","bytes":42}"#)
        try service.stop()
    }

    @Test func timeAndFlowRunsAsDocumented() throws {
        let service = try ServiceHarness()
        let run = try Self.run(try Self.block(after: "<!-- time-and-flow -->"), environment: ProcessInfo.processInfo.environment.merging(
            ["TASKLOOP": "http://127.0.0.1:\(service.port)"]) { $1 })
        #expect(run.status == 0, "the block failed: \(run.stderr)")
        #expect(run.lines == [
            #"{"state":"scheduled","scheduled":true}"#,
            #"{"state":"succeeded"}"#,
            #"{"state":"cancelled","error":"expired"}"#,
            #"{"state":"cancelled"}"#,
            #"{"status":422,"field":"ttl_ms"}"#,
        ])
        try service.stop()
    }

    @Test(.disabled(if: ServiceHarness.replicaCount > 1, "schedules are served by a single server only so far"))
    func schedulesRunAsDocumented() throws {
        let service = try ServiceHarness()
        let run = try Self.run(try Self.block(after: "<!-- schedules -->"), environment: ProcessInfo.processInfo.environment.merging(
            ["TASKLOOP": "http://127.0.0.1:\(service.port)"]) { $1 })
        #expect(run.status == 0, "the block failed: \(run.stderr)")
        #expect(run.lines == [
            #"{"name":"tick","timezone":"UTC","overlap":"skip","catchup":"none","next_runs":5}"#,
            #"{"state":"succeeded","queue":"ticks","from_schedule":true}"#,
            #"{"paused":true,"next_runs":[]}"#,
            #"{"kind":"noop","queue":"ticks"}"#,
            #"{"name":"tick"}"#,
            #"{"status":422,"field":"cron"}"#,
        ])
        let readme = try String(contentsOf: Self.readme, encoding: .utf8)
        #expect(readme.contains("It prints:\n\n```\n" + run.lines.joined(separator: "\n") + "\n```"), "the README shows what the block prints")
        try service.stop()
    }

    /// The workers section, against a server with a token of its own, the built `taskloop` first
    /// on the PATH; it prints what the README says it prints.
    @Test func readmeWorkersSectionRunsAsDocumented() throws {
        let token = "t\(UUID().uuidString)"
        let service = try ServiceHarness { $0.authToken = token }
        let binaries = BinaryTests.executable.deletingLastPathComponent().path
        // The test runner's own TASKLOOP_* settings are not the workers' flags.
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("TASKLOOP_") }.merging([
            "TASKLOOP": "http://127.0.0.1:\(service.port)", "TASKLOOP_AUTH_TOKEN": token,
            "PATH": binaries + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
        ]) { $1 }
        let run = try Self.run(try Self.block(after: "<!-- workers -->"), environment: environment)
        #expect(run.status == 0, "the workers section failed: \(run.stderr)")
        #expect(run.lines == [
            #"{"name":"render","dispatch":"workers","max_concurrency":4}"#,
            #"{"name":"frame 1","state":"succeeded","message":"rendering","output":"frame 1 done"}"#,
            #"{"name":"frame 2","state":"succeeded","message":"rendering","output":"frame 2 done"}"#,
            #"{"name":"frame 3","state":"succeeded","message":"rendering","output":"frame 3 done"}"#,
            #"{"name":"health","state":"succeeded","status":200}"#,
            "4",
            "workers stopped",
        ])
        let readme = try String(contentsOf: Self.readme, encoding: .utf8)
        #expect(readme.contains("It prints:\n\n```\n" + run.lines.joined(separator: "\n") + "\n```"),
                "the README shows what the block prints")
        try service.stop()
    }
}
