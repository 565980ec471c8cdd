/// When a cron expression fires in a zone. Times are UTC instants in whole seconds from
/// 1970-01-01T00:00:00Z (multiply by 1000 for the engine's milliseconds; a millisecond instant
/// `m` asks `next(after: floorDiv(m, 1000))`).
///
/// The expression is matched against local wall times, which map to instants this way: a wall
/// time the clock skips (02:30 on a night that jumps from 02:00 to 03:00) runs at the first
/// instant after the gap, and one the clock passes twice runs once, at its first occurrence.
/// Wall times that land on the same instant (every skipped one and the end of the gap itself)
/// are one slot, so slots are strictly increasing.
///
/// The search jumps field by field (month, day, hour, minute, second) over local wall times,
/// never scanning second by second; the only loop over days stays within one month.
public struct CronSchedule: Sendable {
    public let expression: CronExpression
    public let zone: TimeZoneRules

    /// Instants from 0001-01-01 to 9999-12-31 (UTC): outside them a schedule has no slots, and
    /// the wall-time arithmetic stays far from overflowing.
    public static let supportedInstants: ClosedRange<Int64> = -62_135_596_800...253_402_300_799

    /// Searches end this many years past their start: every expression that can fire at all does
    /// within the 400-year Gregorian cycle, so this is a bound, not a limit anyone meets.
    static let searchYears: Int64 = 401

    public init(expression: CronExpression, zone: TimeZoneRules) {
        self.expression = expression
        self.zone = zone
    }

    /// The first slot strictly after `instant`.
    public func next(after instant: Int64) -> Int64? {
        guard Self.supportedInstants.contains(instant) else { return nil }
        var start = zone.localTime(at: instant) + 1
        // Inside the second pass of a repeated hour, the wall times left in that hour already
        // ran at their first occurrence, before `instant`.
        if let change = zone.transition(atOrBefore: instant) {
            let before = zone.offset(at: change - 1)
            if before > zone.offset(at: change) { start = max(start, change + before) }
        }
        return nextLocal(atOrAfter: start).map { zone.resolve(localTime: $0).firstInstant }
    }

    /// The first `count` slots after `instant`, ascending: fewer only past the search bound or
    /// past `through`, the last instant a slot may fall on.
    public func next(count: Int, after instant: Int64, through: Int64 = .max) -> [Int64] {
        var slots: [Int64] = []
        var cursor = instant
        while slots.count < count, let slot = next(after: cursor), slot <= through {
            slots.append(slot)
            cursor = slot
        }
        return slots
    }

    /// The last slot at or before `instant`.
    public func previous(atOrBefore instant: Int64) -> Int64? {
        guard Self.supportedInstants.contains(instant) else { return nil }
        var end = zone.localTime(at: instant)
        // Inside the second pass of a repeated hour, the rest of that hour's wall times had their
        // first occurrence before `instant`.
        if let change = zone.transition(atOrBefore: instant) {
            let before = zone.offset(at: change - 1)
            if before > zone.offset(at: change) { end = max(end, change + before - 1) }
        }
        return previousLocal(atOrBefore: end).map { zone.resolve(localTime: $0).firstInstant }
    }

    /// The newest `limit` slots in `(after, through]`, oldest first: what a schedule missed
    /// while down (`limit` 1 for catch-up "latest", `max_catchup` for "all"). Costs `limit`
    /// searches however long the interval.
    public func slots(after: Int64, through: Int64, limit: Int) -> [Int64] {
        var newestFirst: [Int64] = []
        var cursor = through
        while newestFirst.count < limit, let slot = previous(atOrBefore: cursor), slot > after {
            newestFirst.append(slot)
            cursor = slot - 1
        }
        return newestFirst.reversed()
    }

    private func nextLocal(atOrAfter local: Int64) -> Int64? {
        let days = CivilTime.floorDiv(local, CivilTime.secondsPerDay)
        var (year, month, day) = CivilTime.date(days: days)
        let secondOfDay = local - days * CivilTime.secondsPerDay
        var (hour, minute, second) = (secondOfDay / 3600, secondOfDay % 3600 / 60, secondOfDay % 60)
        let lastYear = year + Self.searchYears
        let cron = expression
        while year <= lastYear {
            guard let chosenMonth = cron.months.next(atLeast: month) else {
                (year, month, day, hour, minute, second) = (year + 1, 1, 1, 0, 0, 0)
                continue
            }
            if chosenMonth != month { (month, day, hour, minute, second) = (chosenMonth, 1, 0, 0, 0) }
            if day > CivilTime.daysInMonth(year: year, month: month) {
                (month, day, hour, minute, second) = (month + 1, 1, 0, 0, 0)
                continue
            }
            if !cron.matchesDay(year: year, month: month, day: day) {
                (day, hour, minute, second) = (day + 1, 0, 0, 0)
                continue
            }
            guard let chosenHour = cron.hours.next(atLeast: hour) else {
                (day, hour, minute, second) = (day + 1, 0, 0, 0)
                continue
            }
            if chosenHour != hour { (hour, minute, second) = (chosenHour, 0, 0) }
            guard let chosenMinute = cron.minutes.next(atLeast: minute) else {
                (hour, minute, second) = (hour + 1, 0, 0)
                continue
            }
            if chosenMinute != minute { (minute, second) = (chosenMinute, 0) }
            guard let chosenSecond = cron.seconds.next(atLeast: second) else {
                (minute, second) = (minute + 1, 0)
                continue
            }
            return CivilTime.days(year: year, month: month, day: day) * CivilTime.secondsPerDay
                + hour * 3600 + minute * 60 + chosenSecond
        }
        return nil
    }

    private func previousLocal(atOrBefore local: Int64) -> Int64? {
        let days = CivilTime.floorDiv(local, CivilTime.secondsPerDay)
        var (year, month, day) = CivilTime.date(days: days)
        let secondOfDay = local - days * CivilTime.secondsPerDay
        var (hour, minute, second) = (secondOfDay / 3600, secondOfDay % 3600 / 60, secondOfDay % 60)
        let firstYear = year - Self.searchYears
        let cron = expression
        while year >= firstYear {
            guard let chosenMonth = cron.months.previous(atMost: month) else {
                (year, month, day, hour, minute, second) = (year - 1, 12, 31, 23, 59, 59)
                continue
            }
            if chosenMonth != month { (month, day, hour, minute, second) = (chosenMonth, 31, 23, 59, 59) }
            day = min(day, CivilTime.daysInMonth(year: year, month: month))
            if day < 1 {
                (month, day, hour, minute, second) = (month - 1, 31, 23, 59, 59)
                continue
            }
            if !cron.matchesDay(year: year, month: month, day: day) {
                (day, hour, minute, second) = (day - 1, 23, 59, 59)
                continue
            }
            guard let chosenHour = cron.hours.previous(atMost: hour) else {
                (day, hour, minute, second) = (day - 1, 23, 59, 59)
                continue
            }
            if chosenHour != hour { (hour, minute, second) = (chosenHour, 59, 59) }
            guard let chosenMinute = cron.minutes.previous(atMost: minute) else {
                (hour, minute, second) = (hour - 1, 59, 59)
                continue
            }
            if chosenMinute != minute { (minute, second) = (chosenMinute, 59) }
            guard let chosenSecond = cron.seconds.previous(atMost: second) else {
                (minute, second) = (minute - 1, 59)
                continue
            }
            return CivilTime.days(year: year, month: month, day: day) * CivilTime.secondsPerDay
                + hour * 3600 + minute * 60 + chosenSecond
        }
        return nil
    }
}
