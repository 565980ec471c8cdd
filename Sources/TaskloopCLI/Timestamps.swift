import Glibc

/// The API's times (RFC 3339 in UTC with milliseconds, `2026-11-24T19:55:33.837Z`) as
/// milliseconds since the epoch, and back; and spans as a person reads them.
enum Timestamp {
    /// Milliseconds since the epoch of an RFC 3339 time (`Z` or a `±hh:mm` offset, any number
    /// of fraction digits); nil when `text` is not one.
    static func milliseconds(_ text: String) -> Int64? {
        let bytes = Array(text.utf8)
        func number(_ start: Int, _ count: Int) -> Int? {
            guard start + count <= bytes.count else { return nil }
            var value = 0
            for byte in bytes[start..<start + count] {
                guard (0x30...0x39).contains(byte) else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            return value
        }
        guard bytes.count >= 20, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"),
              bytes[10] == UInt8(ascii: "T") || bytes[10] == UInt8(ascii: "t"),
              bytes[13] == UInt8(ascii: ":"), bytes[16] == UInt8(ascii: ":"),
              let year = number(0, 4), let month = number(5, 2), let day = number(8, 2),
              let hour = number(11, 2), let minute = number(14, 2), let second = number(17, 2),
              (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61 else { return nil }
        var index = 19
        var milliseconds: Int64 = 0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            var scale: Int64 = 100
            let start = index
            while index < bytes.count, (0x30...0x39).contains(bytes[index]) {
                milliseconds += Int64(bytes[index] - 0x30) * scale
                scale /= 10
                index += 1
            }
            guard index > start else { return nil }
        }
        var offsetSeconds = 0
        switch index < bytes.count ? bytes[index] : 0 {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            index += 1
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            guard index + 6 == bytes.count, bytes[index + 3] == UInt8(ascii: ":"),
                  let hours = number(index + 1, 2), let minutes = number(index + 4, 2) else { return nil }
            offsetSeconds = (hours * 3_600 + minutes * 60) * (bytes[index] == UInt8(ascii: "+") ? 1 : -1)
            index += 6
        default:
            return nil
        }
        guard index == bytes.count else { return nil }
        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month - 1)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour)
        parts.tm_min = Int32(minute)
        parts.tm_sec = Int32(second)
        let seconds = Int64(timegm(&parts)) - Int64(offsetSeconds)
        return seconds * 1_000 + milliseconds
    }

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
