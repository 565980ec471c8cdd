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

@Suite struct BodyReaderTests {
    @Test func jsonMediaTypes() {
        for accepted in ["application/json", "Application/JSON", " application/json ; charset=utf-8", "application/problem+json",
                         "application/vnd.api+json"] {
            #expect(BodyReader.isJSON(accepted), "\(accepted)")
        }
        for refused in ["", "text/json", "application/jsonx", "application/+json", "application/x-www-form-urlencoded", "json",
                        "application/"] {
            #expect(!BodyReader.isJSON(refused), "\(refused)")
        }
    }

    @Test func timestampsAreRFC3339WithMilliseconds() {
        #expect(Representation.rfc3339(0) == "1970-01-01T00:00:00.000Z")
        #expect(Representation.rfc3339(1_795_000_000_123) == "2026-11-18T11:06:40.123Z")
        #expect(Representation.rfc3339(951_782_400_000) == "2000-02-29T00:00:00.000Z")
        #expect(Representation.rfc3339(-1) == "1969-12-31T23:59:59.999Z")
    }
}
