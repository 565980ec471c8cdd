import Foundation
import Testing
import TaskloopTestSupport
@testable import TaskloopService

/// The dashboard's files as the server serves them, and the API calls only the dashboard needed
/// (task filters by kind, name and dependency; queue throughput). The page itself is tested in
/// a real browser by scripts/check-ui.sh.
@Suite struct DashboardTests {
    @Test func thePageAndItsFilesAreServedWithTypesAndValidators() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let page = try client.call("GET", "/ui")
        #expect(page.status == 200 && page.header("Content-Type") == "text/html; charset=utf-8")
        #expect(page.text.contains(#"<script type="module" src="/ui/app.js"></script>"#))
        let policy = try #require(page.header("Content-Security-Policy"))
        #expect(policy.contains("default-src 'self'") && !policy.contains("unsafe-inline"), "nothing from elsewhere, nothing inline")
        for (name, type) in [("app.js", "text/javascript; charset=utf-8"), ("style.css", "text/css; charset=utf-8"),
                             ("icon.svg", "image/svg+xml"), ("index.html", "text/html; charset=utf-8")] {
            let file = try client.call("GET", "/ui/\(name)")
            #expect(file.status == 200 && file.header("Content-Type") == type, "\(name)")
            #expect(file.header("Cache-Control") == "no-cache" && file.header("X-Content-Type-Options") == "nosniff")
            let etag = try #require(file.header("ETag"))
            #expect(etag.hasPrefix("\"") && etag.count == 34)
            // Revalidation: the same ETag (alone, weak, in a list, or *) gets a bodiless 304.
            for condition in [etag, "W/\(etag)", "\"other\", \(etag)", "*"] {
                let again = try client.call("GET", "/ui/\(name)", headers: ["If-None-Match": condition])
                #expect(again.status == 304 && again.body.isEmpty && again.header("ETag") == etag, "\(name) \(condition)")
            }
            let changed = try client.call("GET", "/ui/\(name)", headers: ["If-None-Match": "\"stale\""])
            #expect(changed.status == 200 && changed.body == file.body)
            let head = try client.call("HEAD", "/ui/\(name)")
            #expect(head.status == 200 && head.body.isEmpty && head.header("ETag") == etag)
        }
        let missing = try client.call("GET", "/ui/nothing.js")
        #expect(missing.status == 404 && missing.header("Content-Type") == "application/problem+json")
    }

    @Test func everyModuleThePageImportsIsServed() throws {
        // A file added to Resources/ui but not to Package.swift and Dashboard.files would be a
        // 404 in the browser only; here it fails the build's tests instead.
        var referenced: Set<String> = []
        for file in Dashboard.files.values {
            let text = String(decoding: file.body, as: UTF8.self)
            for pattern in [#"from '\./([a-z]+\.js)'"#, #"import\('\./([a-z]+\.js)'\)"#, #""/ui/([a-z]+\.[a-z]+)""#] {
                let expression = try NSRegularExpression(pattern: pattern)
                for match in expression.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                    referenced.insert(String(text[Range(match.range(at: 1), in: text)!]))
                }
            }
        }
        #expect(referenced.count >= 10)
        #expect(referenced.subtracting(Dashboard.files.keys).isEmpty, "\(referenced.subtracting(Dashboard.files.keys))")
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../Sources/TaskloopService/Resources/ui").standardized
        let onDisk = Set(try FileManager.default.contentsOfDirectory(atPath: directory.path))
        #expect(onDisk == Set(Dashboard.files.keys), "every file in Resources/ui is served, and only those")
    }

    @Test func thePageNeedsNoTokenButTheAPIStillDoes() throws {
        let service = try ServiceHarness { $0.authToken = "s3cret-0123456789" }
        defer { try? service.stop() }
        let client = try service.client()
        #expect(try client.call("GET", "/ui").status == 200)
        #expect(try client.call("GET", "/ui/api.js").status == 200)
        let refused = try client.call("GET", "/tasks")
        #expect(refused.status == 401 && refused.header("WWW-Authenticate") == "Bearer")
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearer s3cret-0123456789"]).status == 200)
    }

    @Test func tasksFilterByKindNameAndDependency() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        _ = try client.call("PATCH", "/queues/held", json: #"{"paused":true}"#)
        let first = try client.submit(#"{"kind":"noop","name":"Nightly Report","queue":"held"}"#)["id"] as! String
        let second = try client.submit(#"{"kind":"sleep","params":{"duration_ms":1},"name":"report backup","queue":"held"}"#)["id"] as! String
        let third = try client.submit(#"{"kind":"noop","queue":"held","dependencies":["\#(first)","\#(second)"]}"#)["id"] as! String
        let fourth = try client.submit(#"{"kind":"noop","name":"other","queue":"held","dependencies":["\#(first)"]}"#)["id"] as! String
        func ids(_ query: String) throws -> [String] {
            let response = try client.call("GET", "/tasks?\(query)")
            #expect(response.status == 200, "\(query): \(response.text)")
            return (response.json["tasks"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        }
        #expect(try ids("kind=noop") == [fourth, third, first])
        #expect(try ids("kind=sleep") == [second])
        #expect(try ids("kind=teleport").isEmpty)
        #expect(try ids("name=REPORT") == [second, first], "case-insensitive text in the name")
        #expect(try ids("name=report&kind=noop") == [first])
        #expect(try ids("name=").count == 4, "an empty text matches every task")
        #expect(try ids("depends_on=\(first)") == [fourth, third])
        #expect(try ids("depends_on=\(second)") == [third])
        #expect(try ids("depends_on=\(third)").isEmpty)
        #expect(try ids("depends_on=not-an-id").isEmpty)
        // Paging keeps the filter: two pages of one.
        let page = try client.call("GET", "/tasks?depends_on=\(first)&limit=1").json
        let next = try #require(page["next"] as? String)
        #expect(try ids("depends_on=\(first)&limit=1&after=\(next)") == [third])
    }

    /// The Schedules view lists, then follows `schedule.updated` from the list's Event-Seq: the
    /// stream from there holds what came after the list (a deletion) and, on one server, not
    /// what it already showed (the schedule's creation). With replicas the position is opaque,
    /// used as given, and may come just before events the list already shows: a cluster
    /// position only passes a transaction once every older one has ended (`ClusterEvents`), so
    /// another cell's commit still running when the list was read leaves the creation after it.
    /// Never a gap: the deletion always comes, after anything repeated.
    @Test func schedulesListSaysWhereItsEventsResume() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let id = try #require(try client.call("POST", "/schedules", json: #"""
            {"name":"listed","cron":"0 0 1 1 *","task":{"kind":"noop"}}
            """#).json["id"] as? String)
        let list = try client.call("GET", "/schedules")
        let position = try #require(list.header("Event-Seq"))
        #expect((list.json["schedules"] as? [[String: Any]])?.map { $0["id"] as? String } == [id])
        #expect(try client.call("DELETE", "/schedules/\(id)").status == 200)
        let stream = try EventStreamTests.Stream(port: service.port, "/events?types=schedule.updated&since=\(position)")
        let events = try stream.waitUntil { $0.contains { ($0.data["schedule"] as? [String: Any])?["deleted"] as? Bool == true } }
        let schedules = events.compactMap { $0.data["schedule"] as? [String: Any] }
        #expect(schedules.count == events.count && schedules.allSatisfy { $0["id"] as? String == id })
        #expect(schedules.last?["deleted"] as? Bool == true)
        let repeated = schedules.dropLast()
        if ServiceHarness.replicaCount > 1 {
            #expect(repeated.count <= 1 && repeated.allSatisfy { $0["deleted"] == nil }, "\(events.map(\.data))")
        } else {
            #expect(repeated.isEmpty, "\(events.map(\.data))")
        }
    }

    @Test func queuesShowHowManyTasksFinishedLately() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let before = try client.call("GET", "/queues/default").json
        let throughput = try #require(before["throughput"] as? [String: Any])
        #expect(throughput["interval_seconds"] as? Int == 10)
        #expect((throughput["finished"] as? [Int]) == Array(repeating: 0, count: 30))
        var last = ""
        for index in 0..<5 { last = try client.submit(#"{"kind":"noop","name":"n\#(index)"}"#)["id"] as! String }
        _ = try client.waitForState(last, "succeeded")
        var finished: [Int] = []
        // Five finishes land in the newest interval or, at an interval's edge, the one before.
        try pollUntil("five finishes counted", timeout: 5, every: 10_000) {
            let queues = try client.call("GET", "/queues").json["queues"] as? [[String: Any]] ?? []
            finished = (queues.first { $0["name"] as? String == "default" }?["throughput"] as? [String: Any])?["finished"] as? [Int] ?? []
            return finished.reduce(0, +) == 5
        }
        #expect(finished.count == 30 && finished.dropLast(2).allSatisfy { $0 == 0 })
    }
}
