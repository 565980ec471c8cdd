import Foundation
import TaskloopTime

/// An RFC 3339 time with its offset, as UTC epoch seconds: tests write the wall time and offset
/// they expect, so each expectation reads as the clock on the wall would show it.
func at(_ text: String) -> Int64 {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime]
    guard let date = formatter.date(from: text) else { fatalError("not RFC 3339: \(text)") }
    return Int64(date.timeIntervalSince1970)
}

func schedule(_ cron: String, _ zone: String = "UTC") throws -> CronSchedule {
    try CronSchedule(expression: CronExpression(cron), zone: TimeZoneRules.load(named: zone))
}

/// A fresh directory under the system's temporary one, removed by the caller.
func temporaryDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-time-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}
