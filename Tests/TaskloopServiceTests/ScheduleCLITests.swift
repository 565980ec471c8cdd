import Foundation
import Testing
import TaskloopTestSupport

/// `taskloop schedule create|ls|pause|resume|trigger|rm` as users run them: the built binary
/// against a real server, their output and exit statuses.
@Suite(.serialized)
struct ScheduleCLITests {
    @Test func createListPauseResumeTriggerAndRemove() throws {
        let setup = try CLITests.Setup()
        let created = try setup.taskloop(["schedule", "create", "--name", "nightly", "--cron", "0 2 * * *", "--timezone", "Europe/Berlin",
                                          "--kind", "external", "--queue", "night", "--overlap", "allow", "--jitter", "30s"])
        #expect(created.status == 0, "\(created)")
        let id = try #require(created.lines.first)
        #expect(id.range(of: "^\(CLITests.idPattern)$", options: .regularExpression) != nil)
        let schedule = try setup.api.call("GET", "/schedules/\(id)").json
        #expect(schedule["timezone"] as? String == "Europe/Berlin" && schedule["jitter_ms"] as? Int == 30_000)
        #expect((schedule["task"] as? [String: Any])?["queue"] as? String == "night" && schedule["overlap"] as? String == "allow")

        let listed = try setup.taskloop(["schedule", "ls"])
        #expect(listed.status == 0 && listed.lines.count == 1, "\(listed)")
        let line = try JSONSerialization.jsonObject(with: Data(listed.lines[0].utf8)) as? [String: Any]
        #expect(line?["id"] as? String == id)

        let paused = try setup.taskloop(["schedule", "pause", id])
        #expect(paused.status == 0 && paused.json["paused"] as? Bool == true, "\(paused)")
        let resumed = try setup.taskloop(["schedule", "resume", id])
        #expect(resumed.status == 0 && resumed.json["paused"] as? Bool == false)

        let triggered = try setup.taskloop(["schedule", "trigger", id])
        #expect(triggered.status == 0, "\(triggered)")
        let task = try #require(triggered.lines.first)
        let run = try setup.api.call("GET", "/tasks/\(task)").json
        #expect((run["schedule"] as? [String: Any])?["id"] as? String == id && run["queue"] as? String == "night")

        let removed = try setup.taskloop(["schedule", "rm", id])
        #expect(removed.status == 0 && removed.json["id"] as? String == id)
        let gone = try setup.taskloop(["schedule", "rm", id])
        #expect(gone.status != 0 && gone.stderr.contains("no schedule \(id)"), "\(gone)")
        #expect(try setup.api.call("GET", "/tasks/\(task)").status == 200, "its run is left alone")
    }

    @Test func aBadScheduleIsRefusedWithTheServersWordsOrBeforeAnyCall() throws {
        let setup = try CLITests.Setup()
        let badCron = try setup.taskloop(["schedule", "create", "--name", "x", "--cron", "61 * * * *", "--kind", "noop"])
        #expect(badCron.status != 0 && badCron.stderr.contains("cron"), "\(badCron)")
        let both = try setup.taskloop(["schedule", "create", "--name", "x", "--cron", "@daily"])
        #expect(both.status != 0 && both.stderr.contains("--kind"), "\(both)")
        let jitter = try setup.taskloop(["schedule", "create", "--name", "x", "--cron", "@daily", "--kind", "noop", "--jitter", "soon"])
        #expect(jitter.status != 0 && jitter.stderr.contains("--jitter"), "\(jitter)")
        #expect((try setup.api.call("GET", "/schedules").json["schedules"] as? [Any])?.isEmpty == true)
    }
}
