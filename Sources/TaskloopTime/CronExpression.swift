/// Why a cron expression was refused, naming the field (`second`, `minute`, `hour`,
/// `day_of_month`, `month`, `day_of_week`, or `cron` for the expression as a whole) so an API
/// can answer 422 pointing at it.
public struct CronError: Error, Equatable, Sendable, CustomStringConvertible {
    public let field: String
    public let message: String

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }

    public var description: String { "\(field): \(message)" }
}

/// The values one field allows, as bits: a field has at most 60 values, so finding the next or
/// previous allowed value is one mask and one bit count.
struct CronFieldSet: Equatable, Sendable {
    var bits: UInt64

    func contains(_ value: Int64) -> Bool {
        value >= 0 && value < 64 && bits & (1 << UInt64(value)) != 0
    }

    func next(atLeast value: Int64) -> Int64? {
        if value >= 64 { return nil }
        let masked = bits & (UInt64.max << UInt64(max(value, 0)))
        return masked == 0 ? nil : Int64(masked.trailingZeroBitCount)
    }

    func previous(atMost value: Int64) -> Int64? {
        if value < 0 { return nil }
        let masked = value >= 63 ? bits : bits & ((1 << UInt64(value + 1)) - 1)
        return masked == 0 ? nil : Int64(63 - masked.leadingZeroBitCount)
    }
}

/// A cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds
/// first; `*`, lists, ranges, steps (`*/15`, `10-50/10`, `5/10` = from 5 to the end), month and
/// weekday names, weekday 7 for Sunday, and the `@yearly`-style macros. When both day fields are
/// restricted (neither is `*`) a day matches if either does, as in Vixie cron; otherwise both must.
/// An expression that can never fire is refused at parse, so a schedule always has a next slot.
public struct CronExpression: Equatable, Sendable, CustomStringConvertible {
    public static let maximumLength = 256

    let seconds: CronFieldSet
    let minutes: CronFieldSet
    let hours: CronFieldSet
    let daysOfMonth: CronFieldSet
    let months: CronFieldSet
    let daysOfWeek: CronFieldSet
    let daysOfMonthRestricted: Bool
    let daysOfWeekRestricted: Bool

    /// The expression as given (macros kept), for showing back.
    public let description: String

    private struct Field {
        let name: String
        let range: ClosedRange<Int64>
        var names: [String] = []
        /// Day-of-week 7 is Sunday, stored as 0.
        var wrapsToZero: Int64?
    }

    private static let secondField = Field(name: "second", range: 0...59)
    private static let minuteField = Field(name: "minute", range: 0...59)
    private static let hourField = Field(name: "hour", range: 0...23)
    private static let dayOfMonthField = Field(name: "day_of_month", range: 1...31)
    private static let monthField = Field(
        name: "month", range: 1...12,
        names: ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"])
    private static let dayOfWeekField = Field(
        name: "day_of_week", range: 0...7, names: ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"], wrapsToZero: 7)

    private static let macros: [String: String] = [
        "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
        "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
    ]

    public init(_ text: String) throws(CronError) {
        guard text.utf8.count <= Self.maximumLength else {
            throw CronError(field: "cron", message: "longer than \(Self.maximumLength) characters")
        }
        let trimmed = text.split(whereSeparator: { $0 == " " || $0 == "\t" })
        var fields = trimmed.map(String.init)
        if fields.count == 1, fields[0].hasPrefix("@") {
            guard let expansion = Self.macros[fields[0].lowercased()] else {
                throw CronError(field: "cron", message: "\(fields[0]) is not one of \(Self.macros.keys.sorted().joined(separator: " "))")
            }
            fields = expansion.split(separator: " ").map(String.init)
        }
        guard fields.count == 5 || fields.count == 6 else {
            throw CronError(field: "cron", message: "has \(fields.count) fields, not 5 (minute hour day_of_month month day_of_week) or 6 (second first)")
        }
        if fields.count == 5 { fields.insert("0", at: 0) }
        seconds = try Self.parse(fields[0], Self.secondField)
        minutes = try Self.parse(fields[1], Self.minuteField)
        hours = try Self.parse(fields[2], Self.hourField)
        daysOfMonth = try Self.parse(fields[3], Self.dayOfMonthField)
        months = try Self.parse(fields[4], Self.monthField)
        daysOfWeek = try Self.parse(fields[5], Self.dayOfWeekField)
        daysOfMonthRestricted = fields[3] != "*"
        daysOfWeekRestricted = fields[5] != "*"
        description = trimmed.joined(separator: " ")
        if daysOfMonthRestricted && !daysOfWeekRestricted {
            // Only the day of month decides, so some chosen month must have some chosen day
            // (February counting its 29th).
            let longest: [Int64] = [0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
            let possible = (1...12).contains { month in
                months.contains(month) && daysOfMonth.next(atLeast: 1).map { $0 <= longest[Int(month)] } == true
            }
            guard possible else {
                throw CronError(field: "day_of_month", message: "no chosen month has any of the chosen days, so it never fires")
            }
        }
    }

    func matchesDay(year: Int64, month: Int64, day: Int64) -> Bool {
        let byMonthDay = daysOfMonth.contains(day)
        let byWeekday = daysOfWeek.contains(CivilTime.weekday(days: CivilTime.days(year: year, month: month, day: day)))
        if daysOfMonthRestricted && daysOfWeekRestricted { return byMonthDay || byWeekday }
        return byMonthDay && byWeekday
    }

    private static func parse(_ text: String, _ field: Field) throws(CronError) -> CronFieldSet {
        var set = CronFieldSet(bits: 0)
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            guard !item.isEmpty else { throw CronError(field: field.name, message: "\(text) has an empty list item") }
            let parts = item.split(separator: "/", omittingEmptySubsequences: false)
            guard parts.count <= 2 else { throw CronError(field: field.name, message: "\(item) has more than one /") }
            let base = parts[0]
            var low: Int64
            var high: Int64
            if base == "*" {
                (low, high) = (field.range.lowerBound, field.wrapsToZero.map { $0 - 1 } ?? field.range.upperBound)
            } else if let dash = base.firstIndex(of: "-") {
                low = try value(base[..<dash], field)
                high = try value(base[base.index(after: dash)...], field)
                guard low <= high else { throw CronError(field: field.name, message: "range \(base) runs backwards") }
            } else {
                low = try value(base, field)
                // `5/10` steps from 5 to the end of the field; a bare value is itself.
                high = parts.count == 2 ? (field.wrapsToZero.map { $0 - 1 } ?? field.range.upperBound) : low
            }
            var step: Int64 = 1
            if parts.count == 2 {
                let span = field.range.upperBound - field.range.lowerBound + 1
                guard let parsed = Int64(parts[1]), parsed >= 1, parsed <= span else {
                    throw CronError(field: field.name, message: "step \(parts[1]) is not a number from 1 to \(span)")
                }
                step = parsed
            }
            var current = low
            while current <= high {
                let stored = current == field.wrapsToZero ? 0 : current
                set.bits |= 1 << UInt64(stored)
                current += step
            }
        }
        return set
    }

    private static func value(_ text: Substring, _ field: Field) throws(CronError) -> Int64 {
        if let index = field.names.firstIndex(of: text.uppercased()) {
            return field.range.lowerBound + Int64(index)
        }
        guard !text.isEmpty, text.utf8.count <= 4, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
              let number = Int64(text) else {
            let names = field.names.isEmpty ? "" : " or a name (\(field.names.first!)-\(field.names.last!))"
            throw CronError(field: field.name, message: "\(text.isEmpty ? "an empty value" : String(text)) is not a number\(names)")
        }
        guard field.range.contains(number) else {
            throw CronError(field: field.name, message: "\(number) is outside \(field.range.lowerBound)-\(field.range.upperBound)")
        }
        return number
    }
}
