import Testing
import TaskloopTime

@Suite struct CronExpressionTests {
    /// 2026-01-01 is a Thursday; every case starts just after its midnight, in UTC.
    @Test(arguments: [
        ("*/15 * * * *", ["2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z", "2026-01-01T00:45:00Z", "2026-01-01T01:00:00Z"]),
        ("10-50/20 * * * *", ["2026-01-01T00:10:00Z", "2026-01-01T00:30:00Z", "2026-01-01T00:50:00Z", "2026-01-01T01:10:00Z"]),
        ("5/20 * * * *", ["2026-01-01T00:05:00Z", "2026-01-01T00:25:00Z", "2026-01-01T00:45:00Z", "2026-01-01T01:05:00Z"]),
        ("0 1-3,22 * * *", ["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z", "2026-01-01T03:00:00Z", "2026-01-01T22:00:00Z"]),
        ("0 9 * * MON-fri", ["2026-01-01T09:00:00Z", "2026-01-02T09:00:00Z", "2026-01-05T09:00:00Z", "2026-01-06T09:00:00Z"]),
        ("0 12 * * 7", ["2026-01-04T12:00:00Z", "2026-01-11T12:00:00Z", "2026-01-18T12:00:00Z", "2026-01-25T12:00:00Z"]),
        ("0 12 * * 0", ["2026-01-04T12:00:00Z", "2026-01-11T12:00:00Z", "2026-01-18T12:00:00Z", "2026-01-25T12:00:00Z"]),
        ("0 12 * * Sun", ["2026-01-04T12:00:00Z", "2026-01-11T12:00:00Z", "2026-01-18T12:00:00Z", "2026-01-25T12:00:00Z"]),
        ("0 0 * * 5-7", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z", "2026-01-09T00:00:00Z"]),
        ("0 0 1 jan,Jul *", ["2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-07-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
        ("0 0 1 FEB-APR/2 *", ["2026-02-01T00:00:00Z", "2026-04-01T00:00:00Z", "2027-02-01T00:00:00Z", "2027-04-01T00:00:00Z"]),
        // Both day fields restricted: a day matches if either does (Fridays, and the 13th, a Tuesday).
        ("0 0 13 * FRI", ["2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z", "2026-01-13T00:00:00Z", "2026-01-16T00:00:00Z"]),
        // Only one restricted: that one decides (the 13th that is a Friday, not every Friday).
        ("0 0 13 * *", ["2026-01-13T00:00:00Z", "2026-02-13T00:00:00Z", "2026-03-13T00:00:00Z", "2026-04-13T00:00:00Z"]),
        ("  0\t12   * * *  ", ["2026-01-01T12:00:00Z", "2026-01-02T12:00:00Z", "2026-01-03T12:00:00Z", "2026-01-04T12:00:00Z"]),
        ("*/20 * * * * *", ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z", "2026-01-01T00:01:00Z", "2026-01-01T00:01:20Z"]),
        ("30 0 0 1 1 *", ["2026-01-01T00:00:30Z", "2027-01-01T00:00:30Z", "2028-01-01T00:00:30Z", "2029-01-01T00:00:30Z"]),
        ("@yearly", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z", "2030-01-01T00:00:00Z"]),
        ("@annually", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z", "2030-01-01T00:00:00Z"]),
        ("@monthly", ["2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z"]),
        ("@weekly", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z", "2026-01-18T00:00:00Z", "2026-01-25T00:00:00Z"]),
        ("@daily", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z", "2026-01-05T00:00:00Z"]),
        ("@midnight", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z", "2026-01-05T00:00:00Z"]),
        ("@HOURLY", ["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z", "2026-01-01T03:00:00Z", "2026-01-01T04:00:00Z"]),
        // Possible only because either day field may match: Mondays of February.
        ("0 0 30 2 MON", ["2026-02-02T00:00:00Z", "2026-02-09T00:00:00Z", "2026-02-16T00:00:00Z", "2026-02-23T00:00:00Z"]),
    ])
    func firesAtTheTimesItsSyntaxMeans(cron: String, expected: [String]) throws {
        let slots = try schedule(cron).next(count: 4, after: at("2026-01-01T00:00:00Z"))
        #expect(slots == expected.map(at), "\(cron)")
    }

    @Test(arguments: [
        ("", "cron", "has 0 fields"),
        ("* * * *", "cron", "has 4 fields"),
        ("* * * * * * *", "cron", "has 7 fields"),
        ("@reboot", "cron", "@reboot is not one of"),
        (String(repeating: "1,", count: 130) + "1 * * * *", "cron", "longer than 256"),
        ("60 * * * *", "minute", "60 is outside 0-59"),
        ("0 25 * * *", "hour", "25 is outside 0-23"),
        ("0 0 0 * *", "day_of_month", "0 is outside 1-31"),
        ("0 0 32 * *", "day_of_month", "32 is outside 1-31"),
        ("0 0 * 13 *", "month", "13 is outside 1-12"),
        ("0 0 * * 8", "day_of_week", "8 is outside 0-7"),
        ("61 * * * * *", "second", "61 is outside 0-59"),
        ("0 0 * FOO *", "month", "FOO is not a number or a name (JAN-DEC)"),
        ("0 0 * * MON-", "day_of_week", "an empty value is not a number"),
        ("0 0 * * -1", "day_of_week", "an empty value"),
        ("x * * * *", "minute", "x is not a number"),
        ("1.5 * * * *", "minute", "1.5 is not a number"),
        ("99999999999999999999 * * * *", "minute", "is not a number"),
        ("*/0 * * * *", "minute", "step 0 is not a number from 1 to 60"),
        ("*/61 * * * *", "minute", "step 61"),
        ("*/x * * * *", "minute", "step x"),
        ("5-1 * * * *", "minute", "range 5-1 runs backwards"),
        ("1,,2 * * * *", "minute", "empty list item"),
        ("1/2/3 * * * *", "minute", "more than one /"),
        ("0 0 30 2 *", "day_of_month", "never fires"),
        ("0 0 31 4,6,9,11 *", "day_of_month", "never fires"),
        ("0 0 30,31 FEB *", "day_of_month", "never fires"),
    ])
    func refusesWhatCannotBeParsedNamingTheField(cron: String, field: String, message: String) {
        do {
            let parsed = try CronExpression(cron)
            Issue.record("accepted \(cron.debugDescription) as \(parsed)")
        } catch {
            #expect(error.field == field, "\(cron.debugDescription): \(error)")
            #expect(error.message.contains(message), "\(cron.debugDescription): \(error)")
        }
    }

    @Test func leapDaysFireOnlyInLeapYears() throws {
        let leapDay = try schedule("0 0 29 2 *")
        #expect(leapDay.next(count: 2, after: at("2024-03-01T00:00:00Z")) == [at("2028-02-29T00:00:00Z"), at("2032-02-29T00:00:00Z")])
        // 2100 is not a leap year: eight years to the next leap day.
        #expect(leapDay.next(after: at("2097-03-01T00:00:00Z")) == at("2104-02-29T00:00:00Z"))
        #expect(leapDay.previous(atOrBefore: at("2104-02-28T00:00:00Z")) == at("2096-02-29T00:00:00Z"))
        #expect(try schedule("0 0 31 * *").next(count: 3, after: at("2026-01-31T00:00:00Z"))
            == [at("2026-03-31T00:00:00Z"), at("2026-05-31T00:00:00Z"), at("2026-07-31T00:00:00Z")])
    }

    @Test func describesItselfAsGiven() throws {
        #expect(try CronExpression("  */5   *  * * MON ").description == "*/5 * * * MON")
        #expect(try CronExpression("@daily").description == "@daily")
    }
}
