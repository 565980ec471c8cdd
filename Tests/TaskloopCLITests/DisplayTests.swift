import Testing
import TaskloopClient
import TaskloopJSON
@testable import TaskloopCLI
import TaskloopTime

/// The displays as pure functions: frames for a size and a time, the bytes that put a frame
/// in place, plain lines, the `ls` table, JSON for a person.
@Suite struct DisplayTests {
    static let now = RFC3339.milliseconds("2026-11-24T19:56:35.000Z")!

    /// A workflow of three tasks at a moment: one done, one halfway, one waiting.
    static func thumbnails() throws -> WatchModel {
        var model = WatchModel()
        let tasks = [
            WatchModelTests.task("A", "succeeded", fraction: 1, message: "step 4 of 4", finished: "2026-11-24T19:55:32.000Z"),
            WatchModelTests.task("B", "running", fraction: 0.5, message: #"resizing \u001b[31mred\u001b[0m\nnow"#,
                                 started: "2026-11-24T19:55:32.000Z"),
            WatchModelTests.task("C", "pending", started: nil),
        ]
        let object = try #require(try JSONParser.parse(
            #"{"id":"W","name":"thumbnails","state":"running","progress":{"fraction":0.5},"created_at":"2026-11-24T19:55:29.000Z","#
                + #""tasks":[\#(tasks.joined(separator: ","))],"keys":{"download":"A","resize":"B","publish":"C"}}"#).objectValue)
        _ = model.load(workflow: object, seq: "1")
        return model
    }

    @Test func aFrameHasAWorkflowLineThenOneLinePerTask() throws {
        let lines = ProgressFrame.lines(try Self.thumbnails(), note: nil, width: 100, height: 30, now: Self.now)
        #expect(lines == [
            "workflow thumbnails (W)   50%  running  1/3 done  1m06s",
            "download  [==================] 100%  succeeded      2s  step 4 of 4",
            "resize    [========>         ]  50%  running     1m03s  resizing ?[31mred?[0m now",
            "publish   [                  ]  --%  pending",
        ])
        // Escape sequences from a task never reach the terminal.
        #expect(!lines.joined().contains("\u{1B}"))
    }

    @Test func linesNeverReachTheLastColumnAndShortTerminalsShowWhatMattersMost() throws {
        var model = try Self.thumbnails()
        for width in [10, 30, 55, 79, 100] {
            let lines = ProgressFrame.lines(model, note: "lost the event stream; trying again in 2s", width: width, height: 30, now: Self.now)
            #expect(lines.allSatisfy { TerminalText.columns(of: $0) <= width - 1 }, "width \(width): \(lines)")
            #expect(lines.last?.hasPrefix("lost the") == true)
        }
        // Three rows for three tasks and a workflow: the running task is shown, the rest summed up.
        model = try Self.thumbnails()
        let lines = ProgressFrame.lines(model, note: nil, width: 100, height: 4, now: Self.now)
        #expect(lines.count == 3)
        #expect(lines[1].hasPrefix("resize "))
        #expect(lines[2] == "+ 2 more: 1 pending, 1 succeeded")
    }

    @Test func barsAndPercentagesRoundDown() {
        #expect(ProgressFrame.bar(0, width: 12) == "[          ]")
        #expect(ProgressFrame.bar(0.5, width: 12) == "[====>     ]")
        #expect(ProgressFrame.bar(1, width: 12) == "[==========]")
        #expect(ProgressFrame.bar(nil, width: 12) == "[          ]")
        #expect(ProgressFrame.percentage(0.999) == " 99%" && ProgressFrame.percentage(1) == "100%" && ProgressFrame.percentage(nil) == " --%")
    }

    @Test func framesAreRedrawnInPlaceInOneWrite() {
        var writer = FrameWriter()
        #expect(writer.end() == "", "nothing drawn, nothing to restore")
        #expect(writer.frame(["a", "b"]) == "\u{1B}[?25la\u{1B}[K\nb\u{1B}[K\n\u{1B}[J")
        #expect(writer.frame(["c"]) == "\r\u{1B}[2Ac\u{1B}[K\n\u{1B}[J")
        #expect(writer.linesOnScreen == 1)
        #expect(writer.end() == "\u{1B}[?25h")
    }

    @Test func plainLinesComeOnlyForVisibleChangesWithTheirTimes() throws {
        var model = try Self.thumbnails()
        var log = PlainLog()
        let loaded = log.lines(for: [.workflow(at: nil), .task(0, at: nil), .task(1, at: nil), .task(2, at: nil)], in: model, now: Self.now)
        #expect(loaded == [
            "2026-11-24T19:56:35.000Z W thumbnails running 50%",
            "2026-11-24T19:56:35.000Z A download succeeded 100% step 4 of 4",
            "2026-11-24T19:56:35.000Z B resize running 50% resizing ?[31mred?[0m now",
            "2026-11-24T19:56:35.000Z C publish pending --",
        ])
        // A progress event that moves no whole percentage prints nothing; a new message does.
        _ = model.apply(WatchModelTests.event("task.progress", seq: 2, "task", WatchModelTests.task("B", "running", fraction: 0.504,
                                                                                                     message: #"resizing \u001b[31mred\u001b[0m\nnow"#)))
        #expect(log.lines(for: [.task(1, at: 1)], in: model, now: Self.now).isEmpty)
        _ = model.apply(WatchModelTests.event("task.progress", seq: 3, "task", WatchModelTests.task("B", "running", fraction: 0.6, message: "more",
                                                                                                     name: "big files")))
        #expect(log.lines(for: [.task(1, at: Self.now + 1_000)], in: model, now: Self.now)
            == [#"2026-11-24T19:56:36.000Z B "big files" running 60% more"#])
    }

    @Test func theTableFitsItsColumnsAndTheTerminal() throws {
        let tasks = try [
            WatchModelTests.task("01M87PQE14GCJXGN16BW5C625M", "running", fraction: 0.25, name: "download"),
            WatchModelTests.task("01M87PQE14GCJXGN16BW5C625N", "succeeded", name: nil),
        ].map { try #require(try JSONParser.parse($0).objectValue) }
        let lines = TaskTable.lines(tasks, width: 100, now: Self.now)
        #expect(lines == [
            "ID                          STATE      KIND   QUEUE  PROGRESS  AGE    NAME",
            "01M87PQE14GCJXGN16BW5C625M  running    sleep  ?      25%       1m06s  download",
            "01M87PQE14GCJXGN16BW5C625N  succeeded  sleep  ?      100%      1m06s",
        ])
        #expect(TaskTable.lines(tasks, width: 40, now: Self.now).allSatisfy { TerminalText.columns(of: $0) <= 39 })
    }

    @Test func prettyJSONKeepsTheServersOrderAndNumbers() throws {
        let value = try JSONParser.parse(#"{"b":1,"a":[0.5,"x\n",{}],"c":{"d":null},"e":[]}"#)
        #expect(JSONText.pretty(value) == """
            {
              "b": 1,
              "a": [
                0.5,
                "x\\n",
                {}
              ],
              "c": {
                "d": null
              },
              "e": []
            }
            """)
    }
}

/// Text on a terminal, times, and what the command line turns into.
@Suite struct CommandLineTextTests {
    @Test func controlCharactersAreDefusedAndWidthsCounted() {
        #expect(TerminalText.sanitized("a\tb\r\nc\u{1B}[2J\u{7F}\u{9B}d\u{202E}e") == "a b  c?[2J??de")
        #expect(TerminalText.columns(of: "漢字ok") == 6)
        #expect(TerminalText.columns(of: "e\u{301}") == 1)
        #expect(TerminalText.fitted("abcdef", to: 4) == "abc…")
        #expect(TerminalText.fitted("漢字漢字", to: 5) == "漢字…")
        #expect(TerminalText.padded("ab", to: 4) == "ab  " && TerminalText.rightAligned("7%", to: 4) == "  7%")
    }

    @Test func timesReadAndWriteTheAPIsFormat() {
        let text = "2026-11-24T19:55:33.837Z"
        let milliseconds = RFC3339.milliseconds(text)
        #expect(milliseconds.map(Timestamp.text) == text)
        #expect(RFC3339.milliseconds("2026-11-24T21:55:33.837+02:00") == milliseconds)
        #expect(RFC3339.milliseconds("2026-11-24T19:55:33Z") == milliseconds.map { $0 - 837 })
        for bad in ["", "2026-11-24", "2026-13-24T19:55:33Z", "2026-11-24T19:55:33", "2026-11-24T19:55:33.Z", "2026-11-24T19:55:33Zx"] {
            #expect(RFC3339.milliseconds(bad) == nil, "\(bad)")
        }
        #expect([0, 42_900, 187_000, 7_500_000, 356_400_000].map(Timestamp.span) == ["0s", "42s", "3m07s", "2h05m", "4d03h"])
    }

    @Test func submissionsAreBuiltFromFlagsOrTakenFromFiles() throws {
        let task = try Submission.task(kind: "sleep", params: #"{"duration_ms": 10}"#, queue: "q", priority: -2, name: "nap")
        #expect(String(decoding: task.body, as: UTF8.self) == #"{"kind":"sleep","params":{"duration_ms":10},"queue":"q","priority":-2,"name":"nap"}"#)
        #expect(!task.isWorkflow)
        let unique = try Submission.task(kind: "noop", params: nil, queue: nil, priority: nil, name: nil, uniqueKey: "k",
                                         uniqueFor: "1m")
        #expect(String(decoding: unique.body, as: UTF8.self) == #"{"kind":"noop","unique_key":"k","unique_for_ms":60000}"#)
        let fair = try Submission.task(kind: "noop", params: nil, queue: "q", priority: nil, name: nil, concurrencyKey: "tenant-7")
        #expect(String(decoding: fair.body, as: UTF8.self) == #"{"kind":"noop","queue":"q","concurrency_key":"tenant-7"}"#)
        #expect(throws: UsageError.self) {
            try Submission.task(kind: "noop", params: nil, queue: nil, priority: nil, name: nil, uniqueKey: "k", uniqueFor: "soon")
        }
        #expect(throws: UsageError.self) { try Submission.task(kind: "sleep", params: "{duration: 1}", queue: nil, priority: nil, name: nil) }
        let timed = try Submission.task(kind: "noop", params: nil, queue: nil, priority: nil, name: nil, times: Submission.Times(
            at: "2026-11-28T02:00:00+01:00", ttl: "1h30m"))
        #expect(String(decoding: timed.body, as: UTF8.self) == #"{"kind":"noop","run_at":"2026-11-28T02:00:00+01:00","ttl_ms":5400000}"#)
        let delayed = try Submission.task(kind: "noop", params: nil, queue: nil, priority: nil, name: nil, times: Submission.Times(
            delay: "250ms", expiresAt: "2026-11-28T02:00:00Z"))
        #expect(String(decoding: delayed.body, as: UTF8.self) == #"{"kind":"noop","expires_at":"2026-11-28T02:00:00Z","delay_ms":250}"#)
        for bad in [Submission.Times(at: "tomorrow"), Submission.Times(delay: "90"), Submission.Times(delay: "5s1m"),
                    Submission.Times(ttl: "m"), Submission.Times(expiresAt: "2026-02-30T00:00:00Z")] {
            #expect(throws: UsageError.self) { try Submission.task(kind: "noop", params: nil, queue: nil, priority: nil, name: nil, times: bad) }
        }
        #expect(["90s", "1h30m", "2d", "250ms", "1m30s500ms"].map(Timestamp.spanMilliseconds) == [90_000, 5_400_000, 172_800_000, 250, 90_500])
        let workflow = Array(#"{ "tasks": [{"key": "a", "kind": "noop"}] }"#.utf8)
        let document = try Submission.document(workflow, source: "wf.json")
        #expect(document.isWorkflow && document.body == workflow, "sent as written")
        #expect(throws: UsageError.self) { try Submission.document(Array("[1]".utf8), source: "x") }
        #expect(throws: UsageError.self) { try Submission.document(Array(#"{"kind":"noop","kind":"sleep"}"#.utf8), source: "x") }
        #expect(throws: UsageError.self) { try Submission.file("/nonexistent/task.json") }
    }

    @Test func idsAndFiltersStayInTheirPartOfTheURL() {
        #expect(URLText.encoded("01M8-._~") == "01M8-._~")
        #expect(URLText.encoded("../queues?x=1&y é") == "..%2Fqueues%3Fx%3D1%26y%20%C3%A9")
        let query = TaskQuery(state: "failed", queue: "a b", workflow: nil, limit: 5_000, after: "01M8")
        #expect(query.path(count: 5_000, after: "01M9") == "/tasks?limit=1000&state=failed&queue=a%20b&after=01M9")
    }
}
