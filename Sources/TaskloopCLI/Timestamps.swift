import Glibc

/// The API's times (RFC 3339 in UTC with milliseconds, `2026-11-24T19:55:33.837Z`) from
/// milliseconds since the epoch (`RFC3339.milliseconds` reads them); and spans as a person
/// reads them.
enum Timestamp {
    /// `2026-11-24T19:55:33.837Z`.
    static func text(_ milliseconds: Int64) -> String {
        var seconds = time_t(milliseconds / 1_000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let millis = milliseconds - Int64(seconds) * 1_000
        let fraction = millis < 10 ? "00\(millis)" : millis < 100 ? "0\(millis)" : "\(millis)"
        return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T"
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)).\(fraction)Z"
    }

    /// Wall-clock milliseconds since the epoch.
    static func now() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Int64(spec.tv_sec) * 1_000 + Int64(spec.tv_nsec) / 1_000_000
    }

    /// Milliseconds of a span written as numbers with units, largest first: `90s`, `1h30m`,
    /// `2d`, `250ms`; nil for anything else (a bare number has no unit to trust).
    static func spanMilliseconds(_ text: String) -> Int64? {
        let units: [(suffix: String, milliseconds: Int64)] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]
        var rest = Substring(text)
        var total: Int64 = 0
        var lastUnit = Int64.max
        guard !rest.isEmpty else { return nil }
        while !rest.isEmpty {
            let digits = rest.prefix { $0.isASCII && $0.isNumber }
            guard !digits.isEmpty, digits.count <= 12, let value = Int64(digits) else { return nil }
            rest = rest.dropFirst(digits.count)
            // "ms" before "m", so that 250ms is not read as 250 minutes and an "s".
            guard let unit = units.sorted(by: { $0.suffix.count > $1.suffix.count }).first(where: { rest.hasPrefix($0.suffix) }),
                  unit.milliseconds < lastUnit else { return nil }
            rest = rest.dropFirst(unit.suffix.count)
            lastUnit = unit.milliseconds
            total += value * unit.milliseconds
        }
        return total
    }

    /// A span in its two largest units, whole: `0s`, `42s`, `3m07s`, `2h05m`, `4d03h`.
    static func span(_ milliseconds: Int64) -> String {
        let seconds = max(0, milliseconds) / 1_000
        func two(_ value: Int64) -> String { value < 10 ? "0\(value)" : "\(value)" }
        switch seconds {
        case ..<60: return "\(seconds)s"
        case ..<3_600: return "\(seconds / 60)m\(two(seconds % 60))s"
        case ..<86_400: return "\(seconds / 3_600)h\(two(seconds % 3_600 / 60))m"
        default: return "\(seconds / 86_400)d\(two(seconds % 86_400 / 3_600))h"
        }
    }
}
