import Foundation
import Testing

/// `make bench`'s regression guard (`Benchmarks/compare.py`): every figure of
/// `Benchmarks/BASELINE.md` is found by its pattern in lines shaped exactly as its benchmark
/// prints them, and one that moved more than 5% the wrong way is marked.
@Suite struct BenchmarkBaselineTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// What the benchmarks print, at the baseline's values (`{GET}` and the like filled in).
    static let output = """
        GET /tasks/{id} (~700 B)            95879        69487    {GET}    0.63     0.88ms     1.93ms
        POST /tasks (noop, 201)             80465        33822    0.42    0.42     1.49ms     3.06ms
        taskloop RSS after both: 108862 KiB
        100x100 lattice workflow (10000 tasks, 0.7 MB of JSON): submitted and all succeeded in 0.12 s (best of 3)
        10000-task workflow (14997 dependencies, 0.7 MB of JSON): submitted and all succeeded in 0.128 s (best of 3)
        1000 concurrent http tasks (GET ~300 B from a local origin): submitted and all succeeded in 0.193 s (5170 transfers/s, best of 3)
          pinned normal     29959 req/s  1.13x memory (rounds: 0.95, 0.97, 0.95)
          pinned full       20601 req/s  0.81x memory (rounds: 0.74, 0.67, 0.65)
          shared normal     29966 req/s  1.11x memory (rounds: 0.85, 1.00, 0.93)
          shared full       22099 req/s  0.88x memory (rounds: 0.64, 0.72, 0.75)
          full: 100x100 lattice workflow (10000 tasks, 0.7 MB of JSON): submitted and all succeeded in 0.17 s (best of 3)
        restart with 200000 queued tasks: listening after 0.68 s (3.40 s per million, normal; 0.63 s of CPU); RSS then 302648 KiB, 1550 bytes per task
        restart with 1000000 queued tasks: listening after 11.03 s (11.03 s per million, full; 4.26 s of CPU); RSS then 1398840 KiB, 1432 bytes per task
          100000 run_at over 10.0 s: start lag p50 0 ms, p99 5 ms, max 8 ms (goals 10, 50); reference, 100000 started at once: p50 1 ms, p99 9 ms, max 9 ms
          idle with 100000 tasks due in an hour: 0.10% of a core over 10 s (goal under 5%)
          10000 schedules every second, memory: 9.4% of a core (goal under 20%), 9898 runs fired per second
          10000 schedules every second, full: 44.6% of a core (goal under 20%), 9880 runs fired per second
          rate limit 100.0/s, burst 10, over 60.0 s: 100.02/s, +0.02% (goal within 2%)
          rate limit 100.0/s, burst 1, over 60.0 s: 97.75/s, -2.25% (goal within 2%)
        memory: 297 bytes per retained terminal noop task (RSS +283.3 MiB over 1000000 tasks, 1000000 retained)
          100 streams:    21000 req/s, 135.0 us server CPU each: +66.6 us per request (rounds: 1, 2)
          task.progress data: 837 B whole, 285 B brief (0.34x)
        fresh 0.425 s, with 100000 retained tasks 0.381 s: ratio 1.01 (goal >= 0.9)
          memory POST /tasks/batch    247,720 tasks/s (goal 300,000) vs POST /tasks   33,286/s = 8.0x
          memory lease 100 + reports     63,542 tasks/s vs lease + complete   11,796/s = 4.6x
          full   POST /tasks/batch    142,420 tasks/s vs POST /tasks    8,569/s = 15.8x
          full   lease 100 + reports     42,710 tasks/s vs lease + complete    4,246/s = 10.8x
          memory workers, batched reports     14,729 tasks/s vs a call per report    3,874/s = 2.3x
          full   workers, batched reports      9,270 tasks/s vs a call per report    3,233/s = 1.9x

        """

    static func compare(_ output: String) throws -> (status: Int32, lines: [String]) {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("bench-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: file) }
        try output.write(to: file, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", root.appendingPathComponent("Benchmarks/compare.py").path,
                             root.appendingPathComponent("Benchmarks/BASELINE.md").path, file.path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init))
    }

    @Test func everyFigureIsFoundAndNoneIsWorseAtItsBaseline() throws {
        let result = try Self.compare(Self.output.replacingOccurrences(of: "{GET}", with: "0.72"))
        #expect(result.status == 0)
        #expect(result.lines.last == "30 figures compared, 0 worse than the baseline by more than 5%, 0 not measured")
    }

    @Test func aFigureMoreThanFivePercentWorseIsMarkedAndOneWithinIsNot() throws {
        let worse = try Self.compare(Self.output.replacingOccurrences(of: "{GET}", with: "0.68"))
        let line = try #require(worse.lines.first { $0.hasPrefix("service: GET /tasks/{id}") })
        #expect(line.hasSuffix("-5.6%  WORSE by more than 5%"))
        #expect(worse.lines.last?.contains(", 1 worse than") == true)
        let within = try Self.compare(Self.output.replacingOccurrences(of: "{GET}", with: "0.70"))
        #expect(within.lines.last?.contains(", 0 worse than") == true)
    }

    @Test func aFigureNotMeasuredIsSaidSo() throws {
        let result = try Self.compare("")
        #expect(result.lines.last == "0 figures compared, 0 worse than the baseline by more than 5%, 30 not measured")
    }
}
