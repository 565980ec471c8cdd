import Testing
import TaskloopClient
import TaskloopJSON
@testable import TaskloopCLI
import TaskloopTime

/// The watch's model fed plain events, as the streams send them.
@Suite struct WatchModelTests {
    static func task(_ id: String, _ state: String, fraction: Double? = nil, message: String? = nil, name: String? = nil,
                     attempt: Int = 1, error: String? = nil, started: String? = "2026-11-24T19:55:30.000Z",
                     finished: String? = nil) -> String {
        func text(_ value: String?) -> String { value.map { "\"\($0)\"" } ?? "null" }
        let errorJSON = error.map { #"{"code":"\#($0)","message":"it broke"}"# } ?? "null"
        return #"{"id":"\#(id)","name":\#(text(name)),"kind":"sleep","state":"\#(state)","cancel_requested":false,"#
            + #""progress":{"fraction":\#(fraction.map { "\($0)" } ?? "null"),"message":\#(text(message))},"attempt":\#(attempt),"#
            + #""created_at":"2026-11-24T19:55:29.000Z","started_at":\#(text(started)),"finished_at":\#(text(finished)),"#
            + #""error":\#(errorJSON)}"#
    }

    static func event(_ type: String, seq: Int, _ member: String, _ object: String, id: Bool = true) -> ServerSentEvent {
        ServerSentEvent(id: id ? "\(seq)" : nil, type: type,
                        data: #"{"seq":\#(seq),"type":"\#(type)","time":"2026-11-24T19:55:33.837Z","\#(member)":\#(object)}"#)
    }

    static func workflow(_ state: String, tasks: [String]) throws -> JSONObject {
        let text = #"{"id":"W","name":"thumbnails","state":"\#(state)","progress":{"fraction":0},"created_at":"2026-11-24T19:55:29.000Z","#
            + #""tasks":[\#(tasks.joined(separator: ","))],"keys":{"download":"A","publish":"B"}}"#
        return try #require(try JSONParser.parse(text).objectValue)
    }

    /// Ids are the server's: numbers on a single server, positions of 24 hex digits on cells;
    /// either way, what came before the snapshot is dropped and what came after is taken.
    @Test func idsOfEitherFormAreOrdered() {
        #expect(WatchModel.comesAfter("10", "9") && !WatchModel.comesAfter("9", "10") && !WatchModel.comesAfter("10", "10"))
        var model = WatchModel()
        let snapshot = #"{"seq":"00000000000003e800000005","type":"task.snapshot","time":"2026-11-24T19:55:33.837Z","task":"#
            + Self.task("A", "running") + "}"
        #expect(model.apply(ServerSentEvent(id: nil, type: "task.snapshot", data: snapshot)) == .changed([.task(0, at: nil)]))
        #expect(model.lastSeq == "00000000000003e800000005")
        func progress(_ seq: String) -> ServerSentEvent {
            ServerSentEvent(id: seq, type: "task.progress", data: #"{"seq":"\#(seq)","type":"task.progress","time":"2026-11-24T19:55:33.837Z","task":"#
                                + Self.task("A", "running", fraction: 0.5) + "}")
        }
        #expect(model.apply(progress("00000000000003e700000009")) == .unchanged)
        #expect(model.apply(progress("00000000000003e900000000")) != .unchanged)
        #expect(model.lastSeq == "00000000000003e900000000")
    }

    @Test func aTaskStreamStartsFromItsSnapshotAndIgnoresWhatCameBefore() {
        var model = WatchModel()
        #expect(model.apply(Self.event("task.snapshot", seq: 10, "task", Self.task("A", "running"), id: false)) == .changed([.task(0, at: nil)]))
        #expect(model.subject == .task("A") && model.lastSeq == "10" && model.outcome == nil)
        // An event numbered before the snapshot is already in it.
        #expect(model.apply(Self.event("task.progress", seq: 9, "task", Self.task("A", "running", fraction: 0.1))) == .unchanged)
        let at = RFC3339.milliseconds("2026-11-24T19:55:33.837Z")
        #expect(model.apply(Self.event("task.progress", seq: 11, "task", Self.task("A", "running", fraction: 0.5, message: "half")))
            == .changed([.task(0, at: at)]))
        #expect(model.tasks[0].fraction == 0.5 && model.tasks[0].message == "half")
        #expect(model.apply(Self.event("task.state", seq: 12, "task", Self.task("A", "failed", error: "exit_status"))) == .changed([.task(0, at: at)]))
        #expect(model.outcome == "failed" && model.tasks[0].detail == "exit_status: it broke")
        // A resumed stream's fresh snapshot replaces what was known.
        _ = model.apply(Self.event("task.snapshot", seq: 20, "task", Self.task("A", "running", attempt: 2), id: false))
        #expect(model.outcome == nil && model.tasks.count == 1 && model.tasks[0].detail == "attempt 2")
        #expect(model.apply(ServerSentEvent(id: "21", type: "task.state", data: "not json")) == .unchanged)
    }

    @Test func aWorkflowIsLoadedThenKeptCurrentAndResetAsksForAFetch() throws {
        var model = WatchModel()
        let changes = model.load(workflow: try Self.workflow("running", tasks: [Self.task("A", "running"), Self.task("B", "pending", started: nil)]),
                                 seq: "40")
        #expect(changes == [.task(0, at: nil), .task(1, at: nil), .workflow(at: nil)])
        #expect(model.tasks.map(\.label) == ["download", "publish"] && model.lastSeq == "40")
        #expect(model.workflowFraction == 0)
        _ = model.apply(Self.event("task.state", seq: 41, "task", Self.task("A", "succeeded", fraction: 1)))
        _ = model.apply(Self.event("task.progress", seq: 42, "task", Self.task("B", "running", fraction: 0.5)))
        #expect(model.workflowFraction == 0.75 && model.outcome == nil)
        let summary = #"{"id":"W","name":"thumbnails","state":"succeeded","progress":{"fraction":1}}"#
        #expect(model.apply(Self.event("workflow.state", seq: 43, "workflow", summary)) == .changed([.workflow(at: RFC3339.milliseconds("2026-11-24T19:55:33.837Z"))]))
        #expect(model.outcome == "succeeded")
        // Another workflow's summary changes nothing.
        #expect(model.apply(Self.event("workflow.state", seq: 44, "workflow", #"{"id":"X","state":"failed"}"#)) == .unchanged)
        #expect(model.apply(ServerSentEvent(id: nil, type: "reset", data: #"{"oldest":90}"#)) == .reset)
    }

    @Test func exitStatusesFollowStatesAndAnswers() {
        #expect(ExitStatus.forTerminalState("succeeded") == .succeeded && ExitStatus.forTerminalState("failed") == .failed)
        #expect(ExitStatus.forTerminalState("cancelled") == .cancelled && ExitStatus.forTerminalState("running") == nil)
        #expect([404, 500, 503].map { ExitStatus.forFailedAnswer(status: $0).code } == [3, 3, 3])
        #expect([400, 401, 409, 422, 429].map { ExitStatus.forFailedAnswer(status: $0).code } == [4, 4, 4, 4, 4])
        #expect(ExitStatus.stopped(by: 2).code == 130)
    }
}
