import Foundation
import Testing
@testable import TaskloopService

@Suite struct OpenAPISpecTests {
    static let specOnDisk = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("openapi.yaml")

    /// The binary compiles the file in as a resource: what it serves is the checked-in spec.
    @Test func servedSpecIsTheCheckedInFile() throws {
        let service = try ServiceHarness()
        let served = try service.client().call("GET", "/openapi.yaml")
        #expect(served.status == 200 && served.header("Content-Type") == "application/yaml")
        #expect(served.body == Array(try Data(contentsOf: Self.specOnDisk)))
        try service.stop()
    }

    /// The statuses each operation documents, read from the spec's own layout: a path at two
    /// spaces, an operation at four, a response code at eight.
    static func documentedStatuses() throws -> [String: Set<Int>] {
        var statuses: [String: Set<Int>] = [:]
        var path = "", operation = ""
        for line in try String(contentsOf: specOnDisk, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false) {
            if line == "components:" { break }
            if let match = line.wholeMatch(of: #/ {2}(\/[^:]*):/#) { path = String(match.1) }
            if let match = line.wholeMatch(of: #/ {4}(get|put|post|delete|patch|head|options|trace):/#) {
                operation = "\(match.1.uppercased()) \(path)"
                statuses[operation] = []
            }
            if let match = line.prefixMatch(of: #/ {8}"(\d{3})":/#) { statuses[operation]?.insert(Int(match.1)!) }
        }
        return statuses
    }

    /// Every route is documented with exactly the statuses it can answer: its own, and those
    /// any request may get (but 401 on what needs no token); and nothing else is documented.
    @Test func everyRouteDocumentsExactlyTheStatusesItAnswers() throws {
        let service = try ServiceHarness()
        let routes = service.onLoop { application in
            application.routes().map { ("\($0.method) \($0.pattern)", Set($0.answers), $0.isPublic) }
        }
        let documented = try Self.documentedStatuses()
        #expect(Set(documented.keys) == Set(routes.map(\.0)))
        for (operation, answers, isPublic) in routes {
            let expected = answers.union(Route.anyRequest).subtracting(isPublic ? [401] : [])
            #expect(documented[operation] == expected, "\(operation): documents \(documented[operation]?.sorted() ?? []), answers \(expected.sorted())")
        }
        try service.stop()
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
        // The day reused from the last time written, and not past midnight.
        func reusing(_ milliseconds: Int64) -> String {
            String(unsafeUninitializedCapacity: 24) { Representation.writeRFC3339(milliseconds, to: $0.baseAddress!, reusingDay: true) }
        }
        for milliseconds: Int64 in [1_795_000_000_123, 1_795_000_000_999, 1_795_046_399_999, 1_795_046_400_000, 951_782_400_000, 0] {
            #expect(reusing(milliseconds) == Representation.rfc3339(milliseconds))
        }
    }
}
