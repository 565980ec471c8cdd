/// RFC 3339 times (`2026-11-24T19:55:33.837Z`, or with a `±hh:mm` offset and any number of
/// fraction digits) as milliseconds since the epoch: what clients send as `run_at` and
/// `expires_at`, and what the CLI reads back. Digits past the millisecond are dropped.
public enum RFC3339 {
    /// Milliseconds since the epoch, or nil when `text` is not such a time (or names a day a
    /// month does not have).
    public static func milliseconds(_ text: String) -> Int64? {
        var text = text
        return text.withUTF8 { milliseconds(utf8: $0) }
    }

    static func milliseconds(utf8 bytes: UnsafeBufferPointer<UInt8>) -> Int64? {
        func number(_ start: Int, _ count: Int) -> Int64? {
            guard start + count <= bytes.count else { return nil }
            var value: Int64 = 0
            for byte in bytes[start..<start + count] {
                guard byte >= 0x30 && byte <= 0x39 else { return nil }
                value = value * 10 + Int64(byte - 0x30)
            }
            return value
        }
        guard bytes.count >= 20, bytes.count <= 64, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"),
              bytes[10] == UInt8(ascii: "T") || bytes[10] == UInt8(ascii: "t"),
              bytes[13] == UInt8(ascii: ":"), bytes[16] == UInt8(ascii: ":"),
              let year = number(0, 4), let month = number(5, 2), let day = number(8, 2),
              let hour = number(11, 2), let minute = number(14, 2), let second = number(17, 2),
              (1...12).contains(month), day >= 1, day <= CivilTime.daysInMonth(year: year, month: month),
              hour < 24, minute < 60, second < 61 else { return nil }
        var index = 19
        var milliseconds: Int64 = 0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            var scale: Int64 = 100
            let start = index
            while index < bytes.count, bytes[index] >= 0x30 && bytes[index] <= 0x39 {
                milliseconds += Int64(bytes[index] - 0x30) * scale
                scale /= 10
                index += 1
            }
            guard index > start else { return nil }
        }
        var offsetSeconds: Int64 = 0
        switch index < bytes.count ? bytes[index] : 0 {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            index += 1
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            guard index + 6 == bytes.count, bytes[index + 3] == UInt8(ascii: ":"),
                  let hours = number(index + 1, 2), let minutes = number(index + 4, 2), hours < 24, minutes < 60
            else { return nil }
            offsetSeconds = (hours * 3_600 + minutes * 60) * (bytes[index] == UInt8(ascii: "+") ? 1 : -1)
            index += 6
        default:
            return nil
        }
        guard index == bytes.count else { return nil }
        // A leap second (:60) is read as the next second's start, as POSIX time has no room for it.
        let days = CivilTime.days(year: year, month: month, day: day)
        let seconds = days * CivilTime.secondsPerDay + hour * 3_600 + minute * 60 + second - offsetSeconds
        return seconds * 1_000 + milliseconds
    }
}
