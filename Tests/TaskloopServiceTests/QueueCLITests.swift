import Foundation
import Testing
import TaskloopTestSupport

/// `taskloop queue ls|show|set` as users run them: the built binary against a real server,
/// their output and exit statuses, and the queue as the server then shows it.
@Suite(.serialized)
struct QueueCLITests {
    @Test func setShowAndListAQueuesSettings() throws {
        let setup = try CLITests.Setup()
        let set = try setup.taskloop(["queue", "set", "emails", "--rate", "10/s", "--burst", "5", "--key-concurrency", "2",
                                      "--max-concurrency", "3", "--pause"])
        #expect(set.status == 0, "\(set)")
        #expect(set.json["name"] as? String == "emails" && set.json["max_concurrency"] as? Int == 3)
        #expect(set.json["paused"] as? Bool == true && set.json["key_concurrency"] as? Int == 2)
        let limit = try #require(set.json["rate_limit"] as? [String: Any], "\(set)")
        #expect(limit["per_second"] as? Double == 10 && limit["burst"] as? Int == 5)
        let kept = try setup.api.call("GET", "/queues/emails").json
        #expect((kept["rate_limit"] as? [String: Any])?["burst"] as? Int == 5 && kept["paused"] as? Bool == true)

        // Per minute is sent per second; the settings not given stay as they were.
        let slower = try setup.taskloop(["queue", "set", "emails", "--rate", "30/m", "--burst", "1", "--resume"])
        #expect(slower.status == 0 && (slower.json["rate_limit"] as? [String: Any])?["per_second"] as? Double == 0.5, "\(slower)")
        #expect(slower.json["paused"] as? Bool == false && slower.json["key_concurrency"] as? Int == 2)

        let lifted = try setup.taskloop(["queue", "set", "emails", "--no-rate-limit", "--no-key-concurrency", "--dispatch", "workers"])
        #expect(lifted.status == 0 && lifted.json["rate_limit"] is NSNull && lifted.json["key_concurrency"] is NSNull, "\(lifted)")
        #expect(lifted.json["dispatch"] as? String == "workers" && lifted.json["max_concurrency"] as? Int == 3)

        let shown = try setup.taskloop(["queue", "show", "emails"])
        #expect(shown.status == 0 && shown.json["dispatch"] as? String == "workers", "\(shown)")
        let listed = try setup.taskloop(["queue", "ls"])
        #expect(listed.status == 0, "\(listed)")
        let names = listed.lines.compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["name"] as? String
        }
        #expect(names.contains("emails") && names.count == listed.lines.count, "\(listed)")
    }

    @Test func aBadSettingIsRefusedWithTheServersWordsOrBeforeAnyCall() throws {
        let setup = try CLITests.Setup()
        let tooFast = try setup.taskloop(["queue", "set", "q", "--rate", "0/s", "--burst", "0"])
        #expect(tooFast.status != 0 && tooFast.stderr.contains("rate_limit.per_second")
                    && tooFast.stderr.contains("rate_limit.burst"), "\(tooFast)")
        let unit = try setup.taskloop(["queue", "set", "q", "--rate", "10/week", "--burst", "1"])
        #expect(unit.status != 0 && unit.stderr.contains("--rate"), "\(unit)")
        let alone = try setup.taskloop(["queue", "set", "q", "--rate", "10/s"])
        #expect(alone.status != 0 && alone.stderr.contains("--burst"), "\(alone)")
        let both = try setup.taskloop(["queue", "set", "q", "--pause", "--resume"])
        #expect(both.status != 0 && both.stderr.contains("--pause"), "\(both)")
        let nothing = try setup.taskloop(["queue", "set", "q"])
        #expect(nothing.status != 0 && nothing.stderr.contains("at least one setting"), "\(nothing)")
        let unknown = try setup.taskloop(["queue", "show", "never-used"])
        #expect(unknown.status == 3 && unknown.stderr.contains("no queue never-used"), "\(unknown)")
        #expect(try setup.api.call("GET", "/queues/q").status == 404, "nothing was made")
    }
}
