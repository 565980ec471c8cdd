import Testing
@testable import TaskloopTime

@Suite struct CronScheduleTests {
    @Test func aSkippedWallTimeRunsWhenTheGapEnds() throws {
        // New York jumps 02:00 -> 03:00 on 2026-03-08; Berlin on 2026-03-29; Lord Howe 02:00 -> 02:30
        // on 2026-10-04.
        #expect(try schedule("30 2 * * *", "America/New_York").next(count: 3, after: at("2026-03-07T00:00:00-05:00"))
            == ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"].map(at))
        #expect(try schedule("0 30 2 * * *", "America/New_York").next(count: 2, after: at("2026-03-08T00:00:00-05:00"))
            == ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"].map(at))
        #expect(try schedule("30 2 * * *", "Europe/Berlin").next(count: 2, after: at("2026-03-28T12:00:00+01:00"))
            == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"].map(at))
        #expect(try schedule("15 2 * * *", "Australia/Lord_Howe").next(count: 2, after: at("2026-10-03T12:00:00+10:30"))
            == ["2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"].map(at))
    }

    @Test func wallTimesInOneGapAreOneSlotAtItsEnd() throws {
        // 02:00 and 02:30 do not exist and 03:00 is the end of the gap: one run at 03:00, not three.
        #expect(try schedule("*/30 * * * *", "America/New_York").next(count: 4, after: at("2026-03-08T01:15:00-05:00"))
            == ["2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00", "2026-03-08T04:00:00-04:00"].map(at))
        #expect(try schedule("*/20 * * * * *", "Europe/Berlin").next(count: 3, after: at("2026-03-29T01:59:30+01:00"))
            == ["2026-03-29T01:59:40+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:00:20+02:00"].map(at))
    }

    @Test func aRepeatedWallTimeRunsOnceAtItsFirstOccurrence() throws {
        // New York sets 02:00 back to 01:00 on 2026-11-01; Berlin 03:00 to 02:00 on 2026-10-25; Lord
        // Howe 02:00 to 01:30 on 2026-04-05.
        #expect(try schedule("30 1 * * *", "America/New_York").next(count: 2, after: at("2026-10-31T12:00:00-04:00"))
            == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"].map(at))
        #expect(try schedule("30 2 * * *", "Europe/Berlin").next(count: 2, after: at("2026-10-24T12:00:00+02:00"))
            == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"].map(at))
        #expect(try schedule("45 1 * * *", "Australia/Lord_Howe").next(count: 2, after: at("2026-04-04T12:00:00+11:00"))
            == ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"].map(at))
        // The repeated hour's wall times run in its first pass; its second pass runs none of them.
        #expect(try schedule("*/30 * * * *", "America/New_York").next(count: 4, after: at("2026-11-01T00:45:00-04:00"))
            == ["2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T02:00:00-05:00", "2026-11-01T02:30:00-05:00"].map(at))
    }

    @Test func fromInsideTheSecondPassTheNextSlotComesAfterIt() throws {
        let halfHourly = try schedule("*/30 * * * *", "America/New_York")
        #expect(halfHourly.next(after: at("2026-11-01T01:10:00-05:00")) == at("2026-11-01T02:00:00-05:00"))
        #expect(try schedule("30 1 * * *", "America/New_York").next(after: at("2026-11-01T01:10:00-05:00"))
            == at("2026-11-02T01:30:00-05:00"))
        // And the last slot at or before it is the first pass's 01:30, though 01:30 is later on the wall.
        #expect(halfHourly.previous(atOrBefore: at("2026-11-01T01:10:00-05:00")) == at("2026-11-01T01:30:00-04:00"))
    }

    @Test func theFooterRuleGovernsTheFarFuture() throws {
        // 2100: New York's DST starts on March 14 and Berlin's ends on October 31, from the TZif
        // footer's rules (the table stops at 2037 at the latest).
        #expect(try schedule("30 2 * * *", "America/New_York").next(count: 2, after: at("2100-03-13T12:00:00-05:00"))
            == ["2100-03-14T03:00:00-04:00", "2100-03-15T02:30:00-04:00"].map(at))
        #expect(try schedule("30 2 * * *", "Europe/Berlin").next(count: 2, after: at("2100-10-30T12:00:00+02:00"))
            == ["2100-10-31T02:30:00+02:00", "2100-11-01T02:30:00+01:00"].map(at))
        #expect(try schedule("15 2 * * *", "Australia/Lord_Howe").next(after: at("2100-10-02T12:00:00+10:30"))
            == at("2100-10-03T02:30:00+11:00"))
    }

    @Test func missedSlotsAreTheNewestOnesOldestFirstAndBounded() throws {
        let hourly = try schedule("0 * * * *")
        let start = at("2026-01-01T00:00:00Z")
        #expect(hourly.slots(after: start, through: at("2026-01-01T05:30:00Z"), limit: 3)
            == ["2026-01-01T03:00:00Z", "2026-01-01T04:00:00Z", "2026-01-01T05:00:00Z"].map(at))
        // `after` is excluded and `through` included.
        #expect(hourly.slots(after: start, through: at("2026-01-01T03:00:00Z"), limit: 10)
            == ["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z", "2026-01-01T03:00:00Z"].map(at))
        #expect(hourly.slots(after: start, through: start + 3599, limit: 10).isEmpty)
        #expect(hourly.slots(after: start, through: at("2026-01-01T05:30:00Z"), limit: 0).isEmpty)
        // Ten years of every second, and only the newest two are looked at.
        #expect(try schedule("* * * * * *").slots(after: start, through: at("2036-01-01T00:00:00Z"), limit: 2)
            == [at("2035-12-31T23:59:59Z"), at("2036-01-01T00:00:00Z")])
        #expect(try schedule("30 2 * * *", "America/New_York").slots(
            after: at("2026-03-06T12:00:00-05:00"), through: at("2026-03-09T12:00:00-04:00"), limit: 10)
            == ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"].map(at))
        #expect(try schedule("*/30 * * * *", "America/New_York").slots(
            after: at("2026-11-01T00:45:00-04:00"), through: at("2026-11-01T02:40:00-05:00"), limit: 10)
            == ["2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T02:00:00-05:00", "2026-11-01T02:30:00-05:00"].map(at))
    }

    @Test func instantsBeyondYearsOneTo9999HaveNoSlots() throws {
        let everySecond = try schedule("* * * * * *", "Europe/Berlin")
        #expect(everySecond.next(after: .max) == nil)
        #expect(everySecond.previous(atOrBefore: .min) == nil)
        #expect(everySecond.slots(after: .min, through: .max, limit: 5).isEmpty)
        #expect(everySecond.next(after: at("9999-12-31T23:59:58Z")) == at("9999-12-31T23:59:59Z"))
    }

    /// Against a scan of every wall-clock minute around each zone's changes of 2026 and 2100: the
    /// slots are the distinct instants the matching minutes resolve to (first occurrence, or the
    /// gap's end), and `next` and `previous` walk exactly them, forwards and backwards.
    @Test(arguments: ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Pacific/Chatham", "America/Nuuk"])
    func nextAndPreviousAgreeWithAScanOfEveryMinute(zoneName: String) throws {
        let zone = try TimeZoneRules.load(named: zoneName)
        let crons = ["*/30 * * * *", "15,45 1-3 * * *", "0 2 * * *", "*/7 * * * *", "59 * * * *", "0 0 * * *", "30 2 * * SUN"]
        for year in [Int64(2026), 2100] {
            var change = zone.transition(after: CivilTime.days(year: year, month: 1, day: 1) * 86_400)!
            while change < CivilTime.days(year: year + 1, month: 1, day: 1) * 86_400 {
                for cron in crons {
                    let expression = try CronExpression(cron)
                    let schedule = CronSchedule(expression: expression, zone: zone)
                    let from = change - 2 * 86_400
                    let to = change + 2 * 86_400
                    var expected: [Int64] = []
                    var local = CivilTime.floorDiv(zone.localTime(at: from), 60) * 60 - 4 * 3600
                    while local < zone.localTime(at: to) + 4 * 3600 {
                        let days = CivilTime.floorDiv(local, 86_400)
                        let (y, m, d) = CivilTime.date(days: days)
                        let minuteOfDay = (local - days * 86_400) / 60
                        if expression.months.contains(m), expression.matchesDay(year: y, month: m, day: d),
                           expression.hours.contains(minuteOfDay / 60), expression.minutes.contains(minuteOfDay % 60) {
                            let instant = zone.resolve(localTime: local).firstInstant
                            if instant > from && instant <= to && expected.last.map({ $0 < instant }) != false {
                                expected.append(instant)
                            }
                        }
                        local += 60
                    }
                    let forwards = schedule.next(count: expected.count, after: from)
                    #expect(forwards == expected, "\(zoneName) \(cron) around \(change)")
                    #expect(schedule.slots(after: from, through: to, limit: expected.count + 5) == expected,
                            "\(zoneName) \(cron) around \(change), backwards")
                }
                change = zone.transition(after: change)!
            }
        }
    }
}
