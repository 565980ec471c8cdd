import Testing
import TaskloopJSON
@testable import TaskloopEngine

/// Outputs flowing to dependents on the virtual clock: `{"$from", "pointer"}` in params checked
/// at submission and replaced at start by part of a dependency's result (Engine+Outputs).
@Suite struct OutputTests {
    /// Wants a `label` that is a string if any, then `url`, a string starting with `https://`,
    /// then a `retries` that is an integer if any; it names the first field it refuses.
    final class StrictExecutor: TaskExecutor {
        var runs: [TaskRun] = []

        func validate(_ params: JSONValue) throws(EngineError) {
            guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
            if let label = object["label"], label.stringValue == nil {
                throw EngineError(.invalid, "label must be a string.", field: "label")
            }
            guard object["url"]?.stringValue?.hasPrefix("https://") ?? false else {
                throw EngineError(.invalid, "url must be an https URL.", field: "url")
            }
            if let retries = object["retries"], retries.intValue == nil {
                throw EngineError(.invalid, "retries must be an integer.", field: "retries")
            }
        }

        func start(_ run: TaskRun) {
            runs.append(run)
        }
    }

    static func reference(_ from: String, _ pointer: String? = nil) -> JSONValue {
        var object: JSONObject = ["$from": .string(from)]
        if let pointer { object["pointer"] = .string(pointer) }
        return .object(object)
    }

    final class Fixture {
        let manual = ManualExecutor()
        let strict = StrictExecutor()
        let h: EngineHarness

        init(configure: (inout EngineConfiguration) -> Void = { _ in }) {
            h = EngineHarness(configure: configure, extra: ["manual": manual, "strict": strict])
        }

        func run(of record: TaskRecord) -> TaskRun? { manual.runs.last { $0.taskID == record.id && $0.isCurrent } }

        func submit(_ name: String, _ kind: String = "manual", params: JSONValue = [:], after: [TaskRecord] = [],
                    policy: DependencyFailurePolicy = .cancel, retry: RetryPolicy = RetryPolicy()) throws(EngineError) -> TaskRecord {
            try h.engine.submit(TaskSpec(kind: kind, params: params, name: name, dependencies: after.map { .task($0.id) },
                                         onDependencyFailure: policy, retry: retry))
        }
    }

    @Test func aReferenceTakesThePartItsPointerNamesAndWithoutOneTheWholeResult() throws {
        let f = Fixture()
        let first = try f.submit("first")
        let params: JSONValue = ["item": Self.reference(first.id.description, "/items/1"), "all": Self.reference(first.id.description),
                                 "kept": ["nested": [1, Self.reference(first.id.description, "/name")]]]
        let second = try f.submit("second", params: params, after: [first])
        let result: JSONValue = ["items": [1, ["x": 2]], "name": "first's"]
        #expect(second.state == .pending && second.resolvedParams == nil)
        f.run(of: first)?.succeed(result)
        let expected: JSONValue = ["item": ["x": 2], "all": result, "kept": ["nested": [1, "first's"]]]
        #expect(second.state == .running)
        #expect(f.run(of: second)?.params == expected)
        #expect(second.resolvedParams == expected)
        // The submitted params stay for a later attempt; the snapshot keeps both.
        #expect(second.params == params)
        let snapshot = f.h.engine.snapshot(of: second)
        #expect(snapshot.params == params && snapshot.resolvedParams == expected && snapshot.inputs.count == 3)
    }

    @Test func aMissingValueFailsTheTaskWithInputMissingAndNoRetry() throws {
        let f = Fixture()
        let first = try f.submit("first")
        let misses = try f.submit("misses", params: ["n": ["deep": Self.reference(first.id.description, "/absent")]], after: [first],
                                  retry: RetryPolicy(maxAttempts: 3, backoffMilliseconds: 10))
        let failing = try f.submit("failing")
        let afterFailure = try f.submit("afterFailure", params: ["n": Self.reference(failing.id.description)], after: [failing],
                                        policy: .run)
        let noResult = try f.submit("noResult")
        let wholeOfNothing = try f.submit("wholeOfNothing", params: ["n": Self.reference(noResult.id.description)], after: [noResult])
        f.run(of: first)?.succeed(["present": 1])
        f.run(of: failing)?.fail(TaskError(code: "boom", message: "no"))
        f.run(of: noResult)?.succeed()
        f.h.settle()
        for task in [misses, afterFailure, wholeOfNothing] {
            #expect(task.state == .failed && task.error?.code == "input_missing" && task.attempt == 1 && task.startedAt == nil)
        }
        #expect(!f.manual.runs.contains { [misses.id, afterFailure.id, wholeOfNothing.id].contains($0.taskID) })
        #expect(misses.error?.details["path"] == "params/n/deep")
        #expect(misses.error?.details["reference"] == ["$from": .string(first.id.description), "pointer": "/absent"])
        #expect(wholeOfNothing.error?.details["reference"] == ["$from": .string(noResult.id.description), "pointer": ""])
    }

    @Test func submissionRefusesAReferenceNamingNoDependencyOrMalformedAndChangesNothing() throws {
        let f = Fixture()
        let first = try f.submit("first")
        let other = try f.submit("other")
        let cases: [(JSONValue, String)] = [
            (["a": ["b": Self.reference(other.id.description)]], "params.a.b"),
            (["list": [1, Self.reference("no such task")]], "params.list[1]"),
            (["x": ["$from": 7]], "params.x"),
            (["x": ["$from": .string(first.id.description), "pointer": "no-slash"]], "params.x"),
            (["x": ["$from": .string(first.id.description), "extra": 1]], "params.x"),
        ]
        for (params, field) in cases {
            let error = #expect(throws: EngineError.self) { try f.submit("refused", params: params, after: [first]) }
            #expect(error?.code == .invalid && error?.field == field, "\(params)")
        }
        #expect(f.h.engine.unfinishedCount == 2)
        // The same reference to a dependency is fine.
        _ = try f.submit("accepted", params: ["a": ["b": Self.reference(first.id.description)]], after: [first])
    }

    @Test func theExecutorChecksWhatAReferenceStandsForOnceResolved() throws {
        let f = Fixture()
        let first = try f.submit("first")
        let url = Self.reference(first.id.description, "/url")
        // The executor wants a string where the reference stands: left to the start.
        let good = try f.submit("good", "strict", params: ["url": url], after: [first])
        let bad = try f.submit("bad", "strict", params: ["url": Self.reference(first.id.description, "/port")], after: [first])
        // A field without a reference is still checked at once.
        let error = #expect(throws: EngineError.self) {
            try f.submit("refused", "strict", params: ["url": "ftp://example.test/", "retries": url], after: [first])
        }
        #expect(error?.field == "params.url")
        // Nor does a reference checked before it hide it.
        let hidden = #expect(throws: EngineError.self) {
            try f.submit("refused", "strict", params: ["label": url, "url": "ftp://example.test/"], after: [first])
        }
        #expect(hidden?.field == "params.url")
        f.run(of: first)?.succeed(["url": "https://example.test/", "port": 443])
        #expect(good.state == .running && f.strict.runs.map(\.params) == [["url": "https://example.test/"]])
        #expect(bad.state == .failed && bad.error?.code == "invalid_params" && bad.error?.details["field"] == "params.url")
    }

    @Test func workflowMembersNameSiblingsByKeyAndTasksByID() throws {
        let f = Fixture()
        let outside = try f.submit("outside")
        let workflow = try f.h.engine.submitWorkflow(name: "flow", tasks: [
            (key: "fetch", spec: TaskSpec(kind: "manual", name: "fetch")),
            (key: "use", spec: TaskSpec(kind: "manual", params: ["body": Self.reference("fetch", "/body"),
                                                                  "from": Self.reference(outside.id.description)],
                                        name: "use", dependencies: [.sibling(key: "fetch"), .task(outside.id)])),
        ])
        let refused = #expect(throws: EngineError.self) {
            try f.h.engine.submitWorkflow(name: "bad", tasks: [
                (key: "fetch", spec: TaskSpec(kind: "manual")),
                (key: "other", spec: TaskSpec(kind: "manual")),
                (key: "use", spec: TaskSpec(kind: "manual", params: ["x": Self.reference("other")],
                                            dependencies: [.sibling(key: "fetch")])),
            ])
        }
        #expect(refused?.field == "tasks[2].params.x")
        let fetch = workflow.tasks[0], use = workflow.tasks[1]
        f.run(of: fetch)?.succeed(["body": "text"])
        f.run(of: outside)?.succeed(7)
        #expect(use.state == .running && use.resolvedParams == ["body": "text", "from": 7])
    }

    @Test func anExplicitRetryResolvesAgain() throws {
        let f = Fixture()
        let first = try f.submit("first")
        let second = try f.submit("second", params: ["v": Self.reference(first.id.description, "/v")], after: [first], policy: .run)
        f.run(of: first)?.fail(TaskError(code: "boom", message: "no"))
        #expect(second.state == .failed && second.error?.code == "input_missing")
        try f.h.engine.retryTask(first.id)
        try f.h.engine.retryTask(second.id)
        // Brought back, it shows its params as submitted, and waits for the new end.
        #expect(second.state == .pending && second.resolvedParams == nil)
        f.run(of: first)?.succeed(["v": 2])
        #expect(second.state == .running && f.run(of: second)?.params == ["v": 2] && second.attempt == 2)
        f.run(of: second)?.fail(TaskError(code: "boom", message: "no"))
        try f.h.engine.retryTask(second.id)
        #expect(second.state == .running && second.resolvedParams == ["v": 2] && second.attempt == 3)
    }

    @Test func aDependencyForgottenBeforeItsDependentStartsLeftItsValue() throws {
        let f = Fixture { $0.retentionMilliseconds = 1_000 }
        let first = try f.submit("first")
        let slow = try f.submit("slow")
        let second = try f.submit("second", params: ["v": Self.reference(first.id.description, "/v")], after: [first, slow])
        f.run(of: first)?.succeed(["v": "kept"])
        f.h.clock.advance(by: 5_000)
        #expect(f.h.engine.task(first.id) == nil)
        // Restarted from what a store kept, with the dependency already gone.
        let saved = [slow, second].map { f.h.engine.snapshot(of: $0) }
        let restarted = Fixture()
        try restarted.h.engine.restore(queues: [], workflows: [], tasks: saved)
        let restored = try #require(restarted.h.engine.task(second.id))
        f.run(of: slow)?.succeed()
        #expect(second.state == .running && f.run(of: second)?.params == ["v": "kept"])
        #expect(restored.inputs == second.inputs)
    }

    @Test func aLeaseCarriesResolvedParamsAndSkipsATaskWhoseInputIsMissing() throws {
        let f = Fixture()
        let first = try f.submit("first")
        _ = try f.h.engine.updateQueue("work", dispatch: .workers)
        let missing = try f.h.engine.submit(TaskSpec(kind: "sleep", params: ["duration_ms": Self.reference(first.id.description, "/absent")],
                                                     name: "missing", queue: "work", dependencies: [.task(first.id)]))
        let leased = try f.h.engine.submit(TaskSpec(kind: "sleep", params: ["duration_ms": Self.reference(first.id.description, "/v")],
                                                    name: "leased", queue: "work", dependencies: [.task(first.id)]))
        f.run(of: first)?.succeed(["v": 5])
        let request = LeaseRequest(worker: "w", kinds: nil, maxTasks: 2, milliseconds: 30_000) { _ in }
        let granted = try f.h.engine.lease(request, from: "work", waiting: false)
        #expect(granted.map(\.id) == [leased.id] && leased.resolvedParams == ["duration_ms": 5])
        #expect(missing.state == .failed && missing.error?.code == "input_missing" && missing.lease == nil)
        #expect(f.h.engine.leasedCount == 1 && f.h.engine.queues["work"]?.leaseCounts.granted == 1)
    }

    @Test func resolvedParamsBeyondTheLimitsFailTheTask() throws {
        let f = Fixture { $0.maxResolvedParamsBytes = 100 }
        let first = try f.submit("first")
        let large = try f.submit("large", params: ["v": Self.reference(first.id.description, "/text")], after: [first])
        let deep = try f.submit("deep", params: ["v": Self.reference(first.id.description, "/deep")], after: [first])
        var nested: JSONValue = 1
        for _ in 0..<Engine.maxResolvedParamsDepth { nested = [nested] }
        f.run(of: first)?.succeed(["text": .string(String(repeating: "x", count: 200)), "deep": nested])
        #expect(large.state == .failed && large.error?.code == "input_too_large")
        #expect(deep.state == .failed && deep.error?.code == "input_too_large")
    }

    @Test func aResultTravelsToADependentInAnotherCell() throws {
        let cells = try CellMessageTests.Cells()
        let dependency = try cells.submit("d", queue: "a")
        let dependent = try cells.engines[2]!.submit(TaskSpec(
            kind: "manual", params: ["v": Self.reference(dependency.id.description, "/v")], name: "x", queue: "b",
            dependencies: [.task(dependency.id)]))
        cells.deliver(from: 2)
        cells.run(of: dependency)?.succeed(["v": ["deep": true]])
        let ended = cells.deliver(from: 1)
        #expect(ended.map(\.result) == [["v": ["deep": true]]])
        #expect(CellMessage(encoded: ended[0].encoded) == ended[0])
        #expect(dependent.state == .running && dependent.resolvedParams == ["v": ["deep": true]])
        // A task submitted there after the end takes it from what the end brought.
        let later = try cells.engines[2]!.submit(TaskSpec(
            kind: "manual", params: ["v": Self.reference(dependency.id.description)], name: "y", queue: "b",
            dependencies: [.task(dependency.id)]))
        #expect(later.state == .running && later.resolvedParams == ["v": ["v": ["deep": true]]])
    }
}

extension OutputTests {
    /// A worker's engine runs copies of leased tasks, resolved by the server: a value that looks
    /// like a reference is data there, neither refused nor replaced.
    @Test func anEngineThatResolvesNothingTakesReferencesAsData() throws {
        let f = Fixture { $0.resolvesOutputs = false }
        let data: JSONValue = ["body": Self.reference("elsewhere", "/x")]
        let copy = try f.submit("copy", params: data)
        #expect(copy.state == .running && f.run(of: copy)?.params == data && copy.resolvedParams == nil)
    }
}

extension OutputTests {
    /// A workflow over three cells: its home (cell 1) names a sibling of cell 2 by key, and a
    /// member made in cell 3 names the home's member, its key turned into the id it has.
    @Test func workflowKeysNameSiblingsInOtherCells() throws {
        let cells = try CellWorkflowTests.Cells()
        let workflow = try cells.engines[1]!.submitWorkflow(name: "flow", tasks: [
            (key: "fetch", spec: TaskSpec(kind: "manual", name: "fetch", queue: "b")),
            (key: "use", spec: TaskSpec(kind: "manual", params: ["v": Self.reference("fetch", "/v")], name: "use", queue: "a",
                                        dependencies: [.sibling(key: "fetch")])),
            (key: "last", spec: TaskSpec(kind: "manual", params: ["w": Self.reference("use")], name: "last", queue: "c",
                                         dependencies: [.sibling(key: "use")])),
        ])
        cells.deliverAll()
        let ids = Dictionary(uniqueKeysWithValues: workflow.keys.map { ($0.key, $0.id) })
        let last = try #require(cells.task(ids["last"]!))
        #expect(last.params == ["w": Self.reference(ids["use"]!.description)])
        cells.run(of: ids["fetch"]!)?.succeed(["v": "fetched"])
        cells.deliverAll()
        let use = try #require(cells.task(ids["use"]!))
        #expect(use.state == .running && use.resolvedParams == ["v": "fetched"])
        cells.run(of: ids["use"]!)?.succeed(["used": true])
        cells.deliverAll()
        #expect(last.state == .running && last.resolvedParams == ["w": ["used": true]])
        #expect(cells.violations.isEmpty, "\(cells.violations)")
    }
}
