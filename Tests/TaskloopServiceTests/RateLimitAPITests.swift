import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

/// `rate_limit` on `PATCH /queues/{name}` over real sockets: a limited queue starts its burst at
/// once and the rest no faster than the bucket allows (measured from the tasks' `started_at`),
/// removing the limit releases what waits, bad limits are 422 naming the field and change
/// nothing, and the limit is shown wherever queues are.
@Suite struct RateLimitAPITests {
    static func startTimes(_ client: APIClient, _ ids: [String]) throws -> [Double] {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return try ids.map { id in
            let started = try #require(try client.task(id)["started_at"] as? String)
            return try #require(formatter.date(from: started)).timeIntervalSince1970 * 1_000
        }.sorted()
    }

    static func rateLimit(_ queue: [String: Any]) -> (perSecond: Double?, burst: Int?)? {
        guard let limit = queue["rate_limit"] as? [String: Any] else { return nil }
        return (limit["per_second"] as? Double, limit["burst"] as? Int)
    }

    @Test func aLimitedQueueStartsItsBurstThenNoFasterThanTheRate() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let patched = try client.call("PATCH", "/queues/rl", json: #"{"max_concurrency":100,"rate_limit":{"per_second":5,"burst":5}}"#)
        #expect(patched.status == 200, "\(patched.text)")
        #expect(Self.rateLimit(patched.json).map { [$0.perSecond, $0.burst.map(Double.init)] } == [5, 5])
        let ids = try (0..<20).map { _ in try #require(try client.submit(#"{"kind":"noop","queue":"rl"}"#)["id"] as? String) }
        for id in ids { _ = try client.waitForState(id, "succeeded", timeout: 60) }
        let starts = try Self.startTimes(client, ids)
        // Never faster than the bucket: in any window of w ms, at most 5 + 5 w / 1000 starts.
        // (20 ms of slack: `started_at` is the wall clock, the bucket runs on the monotonic one.)
        for (first, from) in starts.enumerated() {
            for (last, to) in starts.enumerated() where last > first {
                let allowed = 5 + 5 * (to - from + 20) / 1_000
                #expect(Double(last - first + 1) <= allowed, "\(last - first + 1) starts in \(to - from) ms: \(starts)")
            }
        }
        #expect(starts.last! - starts.first! >= 3_000 - 20, "\(starts)")
        // Most of the fifteen after the burst waited for a token (submissions take time too).
        let delayed = try #require(try service.metric(#"taskloop_tasks_delayed_by_rate_limit_total{queue="rl"}"#))
        #expect(delayed >= 1 && delayed <= 15)
        let listed = try client.call("GET", "/queues").json["queues"] as? [[String: Any]]
        let shown = try #require(listed?.first { $0["name"] as? String == "rl" })
        #expect(Self.rateLimit(shown).map { [$0.perSecond, $0.burst.map(Double.init)] } == [5, 5])
        #expect(listed?.first { $0["name"] as? String == "default" }?["rate_limit"] is NSNull)
    }

    @Test func removingTheLimitReleasesTheWaitingTasksAtOnce() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        #expect(try client.call("PATCH", "/queues/slow", json: #"{"max_concurrency":100,"rate_limit":{"per_second":0.01,"burst":1}}"#).status == 200)
        let ids = try (0..<6).map { _ in try #require(try client.submit(#"{"kind":"noop","queue":"slow"}"#)["id"] as? String) }
        _ = try client.waitForState(ids[0], "succeeded")
        let queue = try client.call("GET", "/queues/slow").json
        #expect((queue["counts"] as? [String: Any])?["queued"] as? Int == 5)
        #expect(Self.rateLimit(queue)?.perSecond == 0.01)
        let removed = try client.call("PATCH", "/queues/slow", json: #"{"rate_limit":null}"#)
        #expect(removed.status == 200 && removed.json["rate_limit"] is NSNull)
        // At 0.01 a second the next one would start in 100 s.
        for id in ids { _ = try client.waitForState(id, "succeeded", timeout: 10) }
    }

    @Test func aBadLimitIs422NamingTheFieldAndChangesNothing() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        #expect(try client.call("PATCH", "/queues/bad", json: #"{"rate_limit":{"per_second":0.5,"burst":2}}"#).status == 200)
        let cases: [(body: String, field: String)] = [
            (#"{"rate_limit":"fast"}"#, "rate_limit"),
            (#"{"rate_limit":{"per_second":0,"burst":1}}"#, "rate_limit.per_second"),
            (#"{"rate_limit":{"per_second":"5","burst":1}}"#, "rate_limit.per_second"),
            (#"{"rate_limit":{"per_second":2000000,"burst":1}}"#, "rate_limit.per_second"),
            (#"{"rate_limit":{"burst":1}}"#, "rate_limit.per_second"),
            (#"{"rate_limit":{"per_second":1}}"#, "rate_limit.burst"),
            (#"{"rate_limit":{"per_second":1,"burst":0}}"#, "rate_limit.burst"),
            (#"{"rate_limit":{"per_second":1,"burst":1.5}}"#, "rate_limit.burst"),
            (#"{"rate_limit":{"per_second":1,"burst":1,"window":2}}"#, "rate_limit.window"),
            (#"{"paused":true,"rate_limit":{"per_second":-1,"burst":1}}"#, "rate_limit.per_second"),
        ]
        for (body, field) in cases {
            let response = try client.call("PATCH", "/queues/bad", json: body)
            #expect(response.status == 422, "\(body): \(response.text)")
            #expect(response.header("Content-Type") == "application/problem+json")
            let fields = (response.json["errors"] as? [[String: Any]])?.compactMap { $0["field"] as? String }
            #expect(fields == [field], "\(body): \(response.text)")
        }
        let queue = try client.call("GET", "/queues/bad").json
        #expect(Self.rateLimit(queue).map { [$0.perSecond, $0.burst.map(Double.init)] } == [0.5, 2])
        #expect(queue["paused"] as? Bool == false)
    }
}

/// The limit after a restart on the same data dir (SQLite) and after a cell moves to another
/// replica (PostgreSQL); the bucket starts full there.
@Suite(.serialized, .inTheDefaultStageOnly) struct RateLimitDurabilityTests {
    static let limit = #"{"rate_limit":{"per_second":0.05,"burst":3}}"#

    static func expectLimit(_ client: APIClient, queue: String) throws {
        let shown = RateLimitAPITests.rateLimit(try client.call("GET", "/queues/\(queue)").json)
        #expect(shown.map { [$0.perSecond, $0.burst.map(Double.init)] } == [0.05, 3])
        // A full bucket: three start at once, the fourth waits twenty seconds.
        let ids = try (0..<4).map { _ in try #require(try client.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String) }
        for id in ids.prefix(3) { _ = try client.waitForState(id, "succeeded") }
        #expect(try client.task(ids[3])["state"] as? String == "queued")
    }

    @Test func theLimitSurvivesARestart() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func start() throws -> ServiceHarness { try ServiceHarness.keepingState(in: directory) }
        var service = try start()
        #expect(try service.client().call("PATCH", "/queues/kept", json: Self.limit).status == 200)
        try service.stop()
        service = try start()
        defer { try? service.stop() }
        try Self.expectLimit(try service.client(), queue: "kept")
    }

    @Test func theLimitSurvivesItsCellMovingToAnotherReplica() throws {
        let (_, replicas) = try CellServiceTests.startCellReplicas("q0", "q1")
        let queue = "moved"
        let (owner, survivor) = try CellServiceTests.ownerOfQueue(queue, among: replicas)
        defer { try? survivor.stop() }
        #expect(try owner.client().call("PATCH", "/queues/\(queue)", json: Self.limit).status == 200)
        try owner.stop()
        try CellServiceTests.waitForEveryCell([survivor])
        try Self.expectLimit(try survivor.client(), queue: queue)
    }
}
