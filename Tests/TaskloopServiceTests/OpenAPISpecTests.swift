import Foundation
import Testing
@testable import TaskloopService

@Suite struct OpenAPISpecTests {
    /// The binary serves an embedded copy; `make openapi` regenerates it after edits.
    @Test func servedSpecIsTheCheckedInFile() throws {
        let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("openapi.yaml")
        let onDisk = try String(contentsOf: file, encoding: .utf8)
        #expect(OpenAPISpec.text + "\n" == onDisk, "run `make openapi` after editing openapi.yaml")
    }
}
