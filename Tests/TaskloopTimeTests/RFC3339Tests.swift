import Foundation
import Testing
import TaskloopTime

/// The API's times: every form RFC 3339 allows reads as the instant Foundation reads, and
/// anything else (or a day the month lacks) is refused.
@Suite struct RFC3339Tests {
    @Test func formsReadAsTheSameInstantFoundationReads() throws {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let cases = [
            "2026-11-24T19:55:33.837Z", "2026-11-24T21:55:33.837+02:00", "2026-11-24T14:25:33.837-05:30",
            "1970-01-01T00:00:00.000Z", "1969-12-31T23:59:59.999Z", "2024-02-29T12:00:00.000Z", "9999-12-31T23:59:59.999Z",
        ]
        for text in cases {
            let expected = try #require(formatter.date(from: text))
            #expect(RFC3339.milliseconds(text) == Int64((expected.timeIntervalSince1970 * 1_000).rounded()), "\(text)")
        }
        #expect(RFC3339.milliseconds("2026-11-24T19:55:33Z") == RFC3339.milliseconds("2026-11-24t19:55:33.000z"))
        #expect(RFC3339.milliseconds("2026-11-24T19:55:33.1234567Z") == RFC3339.milliseconds("2026-11-24T19:55:33.123Z"))
    }

    @Test func anythingElseIsRefused() {
        for bad in ["", "2026-11-24", "2026-11-24T19:55:33", "2026-13-01T00:00:00Z", "2026-02-29T00:00:00Z",
                    "2026-04-31T00:00:00Z", "2026-11-24T24:00:00Z", "2026-11-24T19:60:00Z", "2026-11-24T19:55:33.Z",
                    "2026-11-24T19:55:33+2:00", "2026-11-24T19:55:33+02:60", "2026-11-24T19:55:33Zx", " 2026-11-24T19:55:33Z",
                    "2026-11-24 19:55:33Z", "+2026-11-24T19:55:33Z", "２０２６-11-24T19:55:33Z"] {
            #expect(RFC3339.milliseconds(bad) == nil, "\(bad)")
        }
    }
}
