/// A POSIX TZ string as TZif files carry it in their footer (RFC 8536 section 3.3, with the
/// version 3 extensions: hours up to 167 and negative in rule times), which governs every instant
/// after the file's last transition: `EST5EDT,M3.2.0,M11.1.0`,
/// `<+1030>-10:30<+11>-11,M10.1.0,M4.1.0`. Offsets are stored east of UTC, the TZif way,
/// although the string writes them west.
struct PosixTimeZone: Equatable, Sendable {
    struct Rule: Equatable, Sendable {
        enum Day: Equatable, Sendable {
            /// `Jn`: 1-365, February 29 never counted.
            case julianNoLeap(Int64)
            /// `n`: 0-365, counting February 29.
            case zeroBased(Int64)
            /// `Mm.w.d`: weekday d of week w (5 = last) of month m.
            case monthWeekDay(month: Int64, week: Int64, weekday: Int64)
        }

        let day: Day
        /// Local seconds after midnight of that day, in the offset in force before the change.
        let time: Int64

        /// The local midnight of this rule's day in `year`, as days from 1970-01-01.
        func days(in year: Int64) -> Int64 {
            switch day {
            case .julianNoLeap(let n):
                let january1 = CivilTime.days(year: year, month: 1, day: 1)
                return january1 + n - 1 + (CivilTime.isLeapYear(year) && n >= 60 ? 1 : 0)
            case .zeroBased(let n):
                return CivilTime.days(year: year, month: 1, day: 1) + n
            case .monthWeekDay(let month, let week, let weekday):
                let first = CivilTime.days(year: year, month: month, day: 1)
                var day = first + CivilTime.floorMod(weekday - CivilTime.weekday(days: first), 7) + (week - 1) * 7
                let length = CivilTime.daysInMonth(year: year, month: month)
                while day >= first + length { day -= 7 }
                return day
            }
        }
    }

    let standardOffset: Int64
    let daylightOffset: Int64?
    let start: Rule?
    let end: Rule?

    /// Parsing stops at the first thing it does not understand, which makes the whole footer
    /// unusable rather than half read.
    init?(_ text: String) {
        var scanner = Scanner(Array(text.utf8))
        guard scanner.skipName(), let standard = scanner.offset(maximumHours: 24) else { return nil }
        standardOffset = -standard
        if scanner.atEnd {
            (daylightOffset, start, end) = (nil, nil, nil)
            return
        }
        guard scanner.skipName() else { return nil }
        if !scanner.atEnd, scanner.peek != UInt8(ascii: ",") {
            guard let daylight = scanner.offset(maximumHours: 24) else { return nil }
            daylightOffset = -daylight
        } else {
            daylightOffset = -standard + 3600
        }
        if scanner.atEnd {
            // No rule: POSIX leaves it to the implementation; glibc and tzcode take the US rules.
            start = Rule(day: .monthWeekDay(month: 3, week: 2, weekday: 0), time: 7200)
            end = Rule(day: .monthWeekDay(month: 11, week: 1, weekday: 0), time: 7200)
            return
        }
        guard scanner.take(UInt8(ascii: ",")), let start = scanner.rule(), scanner.take(UInt8(ascii: ",")),
              let end = scanner.rule(), scanner.atEnd else { return nil }
        self.start = start
        self.end = end
    }

    /// The UTC instants daylight time starts and ends in `year` (by the zone's local calendar).
    func changes(in year: Int64) -> (start: Int64, end: Int64)? {
        guard let daylightOffset, let start, let end else { return nil }
        let startLocal = start.days(in: year) * CivilTime.secondsPerDay + start.time
        let endLocal = end.days(in: year) * CivilTime.secondsPerDay + end.time
        return (startLocal - standardOffset, endLocal - daylightOffset)
    }

    func offset(at instant: Int64) -> Int64 {
        guard let daylightOffset else { return standardOffset }
        let year = CivilTime.date(days: CivilTime.floorDiv(instant + standardOffset, CivilTime.secondsPerDay)).year
        guard let (start, end) = changes(in: year) else { return standardOffset }
        let inDaylight = start < end ? (instant >= start && instant < end) : (instant < end || instant >= start)
        return inDaylight ? daylightOffset : standardOffset
    }

    /// Every change in the years around `instant`, in order.
    func changes(around instant: Int64) -> [Int64] {
        let year = CivilTime.date(days: CivilTime.floorDiv(instant + standardOffset, CivilTime.secondsPerDay)).year
        return (year - 2...year + 2).flatMap { year -> [Int64] in
            guard let (start, end) = changes(in: year) else { return [] }
            return [start, end]
        }.sorted()
    }

    private struct Scanner {
        let bytes: [UInt8]
        var index = 0

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { index == bytes.count }
        var peek: UInt8? { atEnd ? nil : bytes[index] }

        mutating func take(_ byte: UInt8) -> Bool {
            guard peek == byte else { return false }
            index += 1
            return true
        }

        /// `EST` (3 or more letters) or `<+1030>` (letters, digits, + and -).
        mutating func skipName() -> Bool {
            let begin = index
            if take(UInt8(ascii: "<")) {
                while let byte = peek, byte != UInt8(ascii: ">") { index += 1 }
                return take(UInt8(ascii: ">")) && index - begin >= 5
            }
            while let byte = peek, (byte | 0x20) >= UInt8(ascii: "a"), (byte | 0x20) <= UInt8(ascii: "z") { index += 1 }
            return index - begin >= 3
        }

        mutating func number(maximum: Int64) -> Int64? {
            var value: Int64 = 0
            let begin = index
            while let byte = peek, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
                value = value * 10 + Int64(byte - UInt8(ascii: "0"))
                index += 1
                if value > maximum { return nil }
            }
            return index > begin ? value : nil
        }

        /// `[+-]hh[:mm[:ss]]` in seconds, as written (positive west for zone offsets).
        mutating func offset(maximumHours: Int64) -> Int64? {
            let negative = take(UInt8(ascii: "-"))
            if !negative { _ = take(UInt8(ascii: "+")) }
            guard let hours = number(maximum: maximumHours) else { return nil }
            var seconds = hours * 3600
            if take(UInt8(ascii: ":")) {
                guard let minutes = number(maximum: 59) else { return nil }
                seconds += minutes * 60
                if take(UInt8(ascii: ":")) {
                    guard let secs = number(maximum: 59) else { return nil }
                    seconds += secs
                }
            }
            return negative ? -seconds : seconds
        }

        mutating func rule() -> Rule? {
            let day: Rule.Day
            if take(UInt8(ascii: "J")) {
                guard let n = number(maximum: 365), n >= 1 else { return nil }
                day = .julianNoLeap(n)
            } else if take(UInt8(ascii: "M")) {
                guard let month = number(maximum: 12), month >= 1, take(UInt8(ascii: ".")),
                      let week = number(maximum: 5), week >= 1, take(UInt8(ascii: ".")),
                      let weekday = number(maximum: 6) else { return nil }
                day = .monthWeekDay(month: month, week: week, weekday: weekday)
            } else {
                guard let n = number(maximum: 365) else { return nil }
                day = .zeroBased(n)
            }
            var time: Int64 = 7200
            if take(UInt8(ascii: "/")) {
                guard let parsed = offset(maximumHours: 167) else { return nil }
                time = parsed
            }
            return Rule(day: day, time: time)
        }
    }
}
