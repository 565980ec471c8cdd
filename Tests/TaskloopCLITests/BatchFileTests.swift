import Testing
import TaskloopJSON
@testable import TaskloopCLI

/// `submit --batch`'s file: JSON lines or one array, cut into bodies of `POST /tasks/batch`.
@Suite struct BatchFileTests {
    static func tasks(_ body: [UInt8]) throws -> [JSONValue] {
        try #require(try JSONParser.parse(body).objectValue?["tasks"]?.arrayValue)
    }

    @Test func linesAndArraysAreCutIntoPartsInOrder() throws {
        let lines = (0..<5).map { #"{"kind":"noop","name":"t\#($0)"}"# }.joined(separator: "\n") + "\n\n"
        let parts = try Submission.batches(Array(lines.utf8), source: "f", size: 2)
        #expect(try parts.map { try Self.tasks($0).count } == [2, 2, 1])
        #expect(try Self.tasks(parts[2])[0].objectValue?["name"]?.stringValue == "t4")
        let array = " [" + (0..<3).map { #"{"kind":"noop","name":"a\#($0)"}"# }.joined(separator: ",") + "]"
        let whole = try Submission.batches(Array(array.utf8), source: "f")
        #expect(whole.count == 1)
        #expect(try Self.tasks(whole[0]).compactMap { $0.objectValue?["name"]?.stringValue } == ["a0", "a1", "a2"])
        // A line that is not an object is sent as it is: the server answers that item.
        #expect(try Self.tasks(try Submission.batches(Array("42\n".utf8), source: "f")[0]) == [.int(42)])
    }

    @Test func filesThatHoldNoTasksAreRefusedBeforeAnyCall() {
        for text in ["", "\n  \n", "[]", "{\"kind\":\"noop\"}\n{nope", "[1,"] {
            #expect(throws: UsageError.self, "\(text)") { try Submission.batches(Array(text.utf8), source: "f") }
        }
    }

    @Test func eachResultIsOneLine() throws {
        let created = try JSONParser.parse(Array(#"{"status":201,"task":{"id":"01ABC","kind":"noop"}}"#.utf8))
        #expect(Submission.batchLine(created) == "201 01ABC")
        let refused = try JSONParser.parse(Array(#"{"status":422,"problem":{"code":"invalid","detail":"tasks[1].kind: is required."}}"#.utf8))
        #expect(Submission.batchLine(refused) == "422 invalid tasks[1].kind: is required.")
    }
}
