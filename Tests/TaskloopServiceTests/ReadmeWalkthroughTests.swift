import Foundation
import Testing
import TaskloopTestSupport

/// Runs the README's curl walkthrough (the `sh` block after `<!-- walkthrough -->`) with bash,
/// curl and jq against a real service, so the documentation cannot go stale.
@Suite struct ReadmeWalkthroughTests {
    static let readme = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("README.md")

    static func walkthrough() throws -> String {
        let text = try String(contentsOf: readme, encoding: .utf8)
        guard let marker = text.range(of: "<!-- walkthrough -->\n```sh\n"),
              let end = text.range(of: "\n```", range: marker.upperBound..<text.endIndex) else {
            throw ClientError.malformed("README has no walkthrough block")
        }
        return String(text[marker.upperBound..<end.lowerBound])
    }

    @Test func readmeWalkthroughRunsAsDocumented() throws {
        let script = try Self.walkthrough()
        let service = try ServiceHarness()
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
        process.environment = ProcessInfo.processInfo.environment.merging(["TASKLOOP": "http://127.0.0.1:\(service.port)"]) { $1 }
        process.standardOutput = try FileHandle(forWritingTo: stdoutFile)
        process.standardError = try FileHandle(forWritingTo: stderrFile)
        let finished = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in finished.signal() }
        try process.run()
        let ended = finished.wait(timeout: .now() + 70) == .success
        if !ended { kill(-process.processIdentifier, SIGKILL) }
        try #require(ended, "the walkthrough outlived its 60 s bound")
        let lines = try String(contentsOf: stdoutFile, encoding: .utf8).split(separator: "\n").map(String.init)
        let stderr = try String(contentsOf: stderrFile, encoding: .utf8)
        #expect(process.terminationStatus != 124, "the walkthrough took longer than 60 s")
        #expect(process.terminationStatus == 0, "walkthrough failed: \(stderr)")
        try #require(lines.count == 8, "printed: \(lines)")
        #expect(lines[0].contains(#""state":"running""#) && lines[0].contains(#""publish":"#))
        #expect(lines[1].hasPrefix(#"{"state":"running""#))
        #expect(lines[2] == #"{"state":"succeeded","progress":1}"#)
        #expect(lines[3] == #"{"state":"running"}"#)
        #expect(lines[4] == #"{"state":"cancelled","error":"cancelled"}"#)
        #expect(lines[5].hasPrefix(#"{"state":"cancelled","error":"dependency_failed","cause":""#))
        #expect(lines[6] == #"{"state":"cancelled","progress":1}"#)
        #expect(lines[7] == #"{"state":"succeeded","status":200,"body":"{\"status\":\"ok\"}","bytes":15}"#)
        try service.stop()
    }
}
