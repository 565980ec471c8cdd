import Testing
import TaskloopEngine
import TaskloopJSON
@testable import TaskloopStore

/// What outputs flowing to dependents add to a task's record (Engine+Outputs).
@Suite struct OutputRecordTests {
    @Test func takenInputsAndResolvedParamsRoundTrip() throws {
        var task = RecordCodecTests.rich
        task.inputs = [TaskInput(from: "fetch", pointer: try JSONPointer("/a~1b/0"), value: ["x": 1]),
                       TaskInput(from: "01M8ZZZZZZZZZZZZZZZZZZZZZZ", pointer: .wholeDocument, value: .null)]
        task.resolvedParams = ["url": "http://example.test/", "n": ["x": 1]]
        #expect(try RecordCodecTests.decoded(RecordCodecTests.encoded(task)) == task)
        var bad = RecordCodecTests.encoded(TaskSnapshot(
            id: TaskID(high: 1, low: 1), sequence: 1, kind: "noop", params: .object([:]), name: nil, queue: "default",
            priority: 0, dependencies: [], onDependencyFailure: .cancel, timeoutMilliseconds: nil, retry: RetryPolicy(),
            metadata: nil, workflow: nil, createdAt: 1, state: .pending, cancelRequested: false, attempt: 1, startedAt: nil,
            finishedAt: nil, result: nil, error: nil, progress: TaskProgress(), notBefore: nil,
            inputs: [TaskInput(from: "a", pointer: try JSONPointer("/p"), value: 1)]))
        // The pointer's text ("/p", after its length byte) made malformed: the record is refused.
        let slash = try #require(bad.lastIndex(of: UInt8(ascii: "/")))
        bad[slash] = UInt8(ascii: "p")
        #expect(throws: RecordDecodingError.self) { try RecordCodecTests.decoded(bad, sequence: 1) }
    }
}
