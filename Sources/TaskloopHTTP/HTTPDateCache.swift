import Glibc

/// The `Date` header line, formatted at most once per second (IMF-fixdate, RFC 9110).
/// Loop thread only.
final class HTTPDateCache {
    private var second: time_t = -1
    private(set) var headerLine: [UInt8] = []

    /// `Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n` for the current second.
    func currentHeaderLine() -> [UInt8] {
        let now = time(nil)
        if now != second {
            second = now
            headerLine = Self.format(now)
        }
        return headerLine
    }

    static func format(_ seconds: time_t) -> [UInt8] {
        var seconds = seconds
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let text = "Date: \(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) "
            + "\(parts.tm_year + 1900) \(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT\r\n"
        return Array(text.utf8)
    }
}
