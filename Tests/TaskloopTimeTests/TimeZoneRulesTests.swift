import Foundation
import Testing
@testable import TaskloopTime

@Suite struct TimeZoneRulesTests {
    static let oracleZones = [
        "America/New_York", "America/Los_Angeles", "America/Sao_Paulo", "America/Santiago", "America/St_Johns", "America/Nuuk",
        "America/Havana", "Europe/Berlin", "Europe/London", "Europe/Dublin", "Europe/Moscow", "Africa/Casablanca", "Africa/Cairo",
        "Asia/Tehran", "Asia/Kolkata", "Asia/Kathmandu", "Asia/Gaza", "Australia/Lord_Howe", "Australia/Adelaide",
        "Pacific/Chatham", "Pacific/Apia", "Pacific/Kiritimati",
    ]

    /// Foundation reads the same tzdata: its offsets must be ours on a sweep from 1970 to 2100
    /// and on both sides of every change we know of.
    @Test(arguments: oracleZones)
    func offsetsAgreeWithFoundation(zoneName: String) throws {
        let zone = try TimeZoneRules.load(named: zoneName)
        let oracle = try #require(TimeZone(identifier: zoneName))
        func expectAgreement(_ instant: Int64) {
            let expected = oracle.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(instant)))
            #expect(zone.offset(at: instant) == Int64(expected), "\(zoneName) at \(Date(timeIntervalSince1970: TimeInterval(instant)))")
        }
        let end = at("2100-12-31T00:00:00Z")
        var instant = at("1970-01-01T00:00:00Z")
        while instant < end {
            expectAgreement(instant)
            instant += 3 * 86_400 + 7 * 3600 + 11
        }
        var change = zone.transition(after: at("1970-01-01T00:00:00Z"))
        while let current = change, current < end {
            expectAgreement(current - 1)
            expectAgreement(current)
            change = zone.transition(after: current)
        }
    }

    @Test func resolvesWallTimesToNoneOneOrTwoInstants() throws {
        let newYork = try TimeZoneRules.load(named: "America/New_York")
        let local = { (text: String) in at(text + "Z") }
        #expect(newYork.resolve(localTime: local("2026-07-01T12:00:00")) == .unique(at("2026-07-01T12:00:00-04:00")))
        #expect(newYork.resolve(localTime: local("2026-03-08T02:30:00")) == .skipped(gapEnd: at("2026-03-08T03:00:00-04:00")))
        #expect(newYork.resolve(localTime: local("2026-03-08T02:30:00")).instants.isEmpty)
        #expect(newYork.resolve(localTime: local("2026-11-01T01:30:00"))
            == .repeated(first: at("2026-11-01T01:30:00-04:00"), second: at("2026-11-01T01:30:00-05:00")))
        let lordHowe = try TimeZoneRules.load(named: "Australia/Lord_Howe")
        #expect(lordHowe.resolve(localTime: local("2100-10-03T02:10:00")) == .skipped(gapEnd: at("2100-10-03T02:30:00+11:00")))
        #expect(lordHowe.resolve(localTime: local("2100-04-04T01:40:00")).instants
            == [at("2100-04-04T01:40:00+11:00"), at("2100-04-04T01:40:00+10:30")])
        #expect(lordHowe.localTime(at: at("2100-01-01T00:00:00+11:00")) == local("2100-01-01T00:00:00"))
    }

    /// The name is judged before any path is built from it: each of these would reach a real
    /// zone file planted outside the zone directory.
    @Test(arguments: ["../outside", "../../outside", "zones/../../outside", "/outside", "a//b", "Europe/", "Europe/Berlin\u{0}",
                      "Europe Berlin", "Europe/Berlin.tzif", "~/outside", String(repeating: "A", count: 65), ""])
    func refusesNamesThatAreNotZoneNamesBeforeOpeningAnything(name: String) throws {
        let root = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: root) }
        let zones = root.appendingPathComponent("zones")
        try FileManager.default.createDirectory(at: zones, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: "/usr/share/zoneinfo/Europe/Berlin", toPath: root.appendingPathComponent("outside").path)
        #expect(throws: TimeZoneError.invalidName(name)) { try TimeZoneRules.load(named: name, directory: zones.path) }
        #expect(throws: TimeZoneError.invalidName("../../etc/passwd")) { try TimeZoneRules.load(named: "../../etc/passwd") }
    }

    @Test func loadsZonesFromTheGivenDirectoryOnceAndUTCFromNone() throws {
        let root = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: root) }
        try FileManager.default.createDirectory(at: root.appendingPathComponent("Test"), withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: "/usr/share/zoneinfo/Asia/Kolkata", toPath: root.appendingPathComponent("Test/Zone_1+2").path)
        // Loaded once: the catalog keeps the zone, and its file is not read again.
        let catalog = TimeZoneCatalog { name throws(TimeZoneError) in try TimeZoneRules.load(named: name, directory: root.path) }
        let first = try catalog.load(named: "Test/Zone_1+2")
        #expect(first.offset(at: at("2026-01-01T00:00:00Z")) == 19_800)
        try FileManager.default.removeItem(at: root.appendingPathComponent("Test/Zone_1+2"))
        #expect(try catalog.load(named: "Test/Zone_1+2") === first)
        #expect(throws: TimeZoneError.unknownZone("Test/Missing")) { try TimeZoneRules.load(named: "Test/Missing", directory: root.path) }
        #expect(throws: TimeZoneError.unknownZone("Test")) { try TimeZoneRules.load(named: "Test", directory: root.path) }
        let utc = try TimeZoneRules.load(named: "UTC", directory: root.appendingPathComponent("nowhere").path)
        #expect(utc.offset(at: at("2100-07-01T00:00:00Z")) == 0)
        #expect(utc.transition(after: 0) == nil)
    }

    @Test func refusesFilesThatAreNotZones() throws {
        let root = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: root) }
        let berlin = try Data(contentsOf: URL(fileURLWithPath: "/usr/share/zoneinfo/Europe/Berlin"))
        let files: [(String, Data, String)] = [
            ("Text", Data("not a zone at all, but long enough to hold a header of forty-four bytes".utf8), "no TZif header"),
            ("Short", berlin.prefix(100), "truncated"),
            ("Large", Data(repeating: 0, count: TimeZoneRules.maximumFileSize + 1), "larger than"),
            ("Leaps", tzif(leapCount: 1), "leap-second"),
            ("Footer", tzifFooterReplaced(berlin, with: "CET-1CEST,M3.5.0"), "footer"),
        ]
        for (name, bytes, reason) in files {
            try bytes.write(to: root.appendingPathComponent(name))
            do {
                _ = try TimeZoneRules.load(named: name, directory: root.path)
                Issue.record("loaded \(name)")
            } catch {
                guard case .malformed(name, let found) = error else { Issue.record("\(name): \(error)"); continue }
                #expect(found.contains(reason), "\(name): \(found)")
            }
        }
    }

    /// Version 1 files have 32-bit times and no footer: the last type holds for ever after.
    @Test func readsVersionOneFiles() throws {
        let rules = try TimeZoneRules.parse([UInt8](tzif(leapCount: 0)), name: "V1")
        #expect(rules.offset(at: 999_999_999) == 3600)
        #expect(rules.offset(at: 1_000_000_000) == 7200)
        #expect(rules.offset(at: at("2200-01-01T00:00:00Z")) == 7200)
        #expect(rules.transition(after: 0) == 1_000_000_000)
        #expect(rules.transition(after: 1_000_000_000) == nil)
    }

    @Test func readsPOSIXRulesWithVersionThreeExtensions() throws {
        let newYork = try #require(PosixTimeZone("EST5EDT,M3.2.0,M11.1.0"))
        #expect(newYork.offset(at: at("2100-03-14T06:59:59Z")) == -18_000)
        #expect(newYork.offset(at: at("2100-03-14T07:00:00Z")) == -14_400)
        #expect(newYork.offset(at: at("2100-11-07T05:59:59Z")) == -14_400)
        #expect(newYork.offset(at: at("2100-11-07T06:00:00Z")) == -18_000)
        let lordHowe = try #require(PosixTimeZone("<+1030>-10:30<+11>-11,M10.1.0,M4.1.0"))
        #expect(lordHowe.offset(at: at("2100-01-15T00:00:00Z")) == 39_600)
        #expect(lordHowe.offset(at: at("2100-07-15T00:00:00Z")) == 37_800)
        // Daylight time all year (a version 3 rule past 24:00).
        let always = try #require(PosixTimeZone("EST5EDT4,0/0,J365/25"))
        for instant in ["2100-01-01T04:30:00Z", "2100-06-30T00:00:00Z", "2100-12-31T23:59:59Z"].map(at) {
            #expect(always.offset(at: instant) == -14_400)
        }
        // Negative rule times: Nuuk's daylight time starts at -1:00 on the last Sunday of March,
        // 23:00 on the Saturday.
        let nuuk = try #require(PosixTimeZone("<-02>2<-01>,M3.5.0/-1,M10.5.0/0"))
        #expect(nuuk.offset(at: at("2100-03-27T22:59:59-02:00")) == -7200)
        #expect(nuuk.offset(at: at("2100-03-27T23:00:00-02:00")) == -3600)
        #expect(PosixTimeZone("JST-9")?.offset(at: 0) == 32_400)
        #expect(PosixTimeZone("EST5EDT")?.offset(at: at("2100-07-01T00:00:00Z")) == -14_400)
        for bad in ["", "E5", "EST", "EST5EDT,M3.2.0", "EST5EDT,M13.1.0,M11.1.0", "EST5EDT,M3.6.0,M11.1.0", "<+10", "EST25",
                    "EST5EDT,J0,J365", "EST5EDT,M3.2.0/168,M11.1.0", "EST5EDT,M3.2.0,M11.1.0x"] {
            #expect(PosixTimeZone(bad) == nil, "\(bad)")
        }
    }
}

/// A version 1 file: one transition at 1,000,000,000 from +01:00 to +02:00.
private func tzif(leapCount: Int32) -> Data {
    var data = Data("TZif".utf8) + Data([0]) + Data(count: 15)
    func int32(_ value: Int32) { withUnsafeBytes(of: value.bigEndian) { data.append(contentsOf: $0) } }
    for count in [0, 0, leapCount, 1, 2, 4] as [Int32] { int32(count) }
    int32(1_000_000_000)
    data.append(1)
    int32(3600); data.append(contentsOf: [0, 0])
    int32(7200); data.append(contentsOf: [1, 0])
    data.append(contentsOf: Array("AB\0\0".utf8))
    for _ in 0..<leapCount { int32(0); int32(0) }
    return data
}

/// The file with its footer's TZ string replaced.
private func tzifFooterReplaced(_ file: Data, with footer: String) -> Data {
    let bytes = [UInt8](file)
    let start = bytes.dropLast().lastIndex(of: UInt8(ascii: "\n"))!
    return Data(bytes[...start]) + Data((footer + "\n").utf8)
}
