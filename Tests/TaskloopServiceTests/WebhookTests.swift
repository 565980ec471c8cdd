import Foundation
import Testing
import TaskloopHTTPClient
import TaskloopStore
@testable import TaskloopService
import TaskloopTestSupport

/// A real receiver in Python (Fixtures/webhook_receiver.py) that checks every delivery's
/// Standard Webhooks signature with its own hmac, and answers per path as told.
final class WebhookReceiver: @unchecked Sendable {
    private let process = Process()
    private let lines = Locked<[String]>([])
    let port: Int
    private let control: APIClient

    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Fixtures/webhook_receiver.py").path

    /// Listens once `secret` and `answers` (as `configure` takes them) are in place.
    init(port: Int = 0, secret: String? = nil, answers: [String: [Int]] = [:]) throws {
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        // Signals back to their defaults (the test runner's mask would be inherited); the
        // receiver exits when its stdin closes, so it never outlives a test process that dies.
        process.arguments = ["--default-signal", "python3", Self.script, String(port), try Self.settings(secret, answers)]
        process.standardOutput = output
        process.standardInput = Pipe()
        try process.run()
        let lines = self.lines
        lines.collectLines(from: output.fileHandleForReading)
        var listening: String?
        try pollUntil("the receiver to listen", timeout: 10, every: 2_000) {
            listening = lines.value.first { $0.hasPrefix("listening on ") }
            return listening != nil
        }
        self.port = Int(listening!.dropFirst("listening on ".count))!
        control = try APIClient(port: self.port)
    }

    deinit { stop() }

    func stop() {
        guard process.exitStatus == nil else { return }
        kill(process.processIdentifier, SIGKILL)
        _ = try? process.waitForExit("the receiver to exit", timeout: 10)
    }

    func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Changes the settings of a receiver already listening: only for what cannot be known
    /// before (a webhook's secret needs its URL), and before anything can be delivered to it.
    func configure(secret: String? = nil, answers: [String: [Int]] = [:]) throws {
        #expect(try control.call("POST", "/control", json: try Self.settings(secret, answers)).status == 200)
    }

    private static func settings(_ secret: String?, _ answers: [String: [Int]]) throws -> String {
        var settings: [String: Any] = ["answers": answers]
        if let secret { settings["secret"] = secret }
        return String(decoding: try JSONSerialization.data(withJSONObject: settings), as: UTF8.self)
    }

    /// Every delivery so far, in arrival order.
    var deliveries: [[String: Any]] {
        lines.value.filter { $0.hasPrefix("{") }.compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Waits for a delivery to `path` that `matches`, and returns all to that path by then.
    @discardableResult
    func waitFor(_ what: String, path: String, timeout: Double = 10,
                 _ matches: @escaping ([String: Any]) -> Bool) throws -> [[String: Any]] {
        var found: [[String: Any]] = []
        try pollUntil("a delivery: \(what)", timeout: timeout, every: 2_000) {
            found = deliveries.filter { $0["path"] as? String == path }
            return found.contains(where: matches)
        }
        return found
    }
}

extension [String: Any] {
    /// A delivery's `body.data.task`.
    var deliveredTask: [String: Any]? { ((self["body"] as? [String: Any])?["data"] as? [String: Any])?["task"] as? [String: Any] }
}

@Suite struct WebhookTests {
    static func create(_ client: APIClient, _ body: String) throws -> [String: Any] {
        let response = try client.call("POST", "/webhooks", json: body)
        #expect(response.status == 201, "\(response.text)")
        return response.json
    }

    static func deliveries(_ client: APIClient, _ id: String) throws -> [[String: Any]] {
        try client.call("GET", "/webhooks/\(id)/deliveries").json["deliveries"] as? [[String: Any]] ?? []
    }

    /// The webhook's delivery log once its newest entry is in `state`.
    static func deliveries(_ client: APIClient, _ id: String, once state: String) throws -> [[String: Any]] {
        var log: [[String: Any]] = []
        try pollUntil("the delivery logged as \(state)", timeout: 5, every: 5_000) {
            log = try deliveries(client, id)
            return log.first?["state"] as? String == state
        }
        return log
    }

    @Test func deliveriesAreSignedAndFollowTheFilter() throws {
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let receiver = try WebhookReceiver()
        let client = try service.client()
        let webhook = try Self.create(client, #"{"url":"\#(receiver.url("/hook"))","events":["task.state"],"queue":"hooks"}"#)
        let id = try #require(webhook["id"] as? String)
        let secret = try #require(webhook["secret"] as? String)
        #expect(secret.hasPrefix("whsec_"))
        #expect(Data(base64Encoded: String(secret.dropFirst(6)))?.count == 32)
        #expect(webhook["enabled"] as? Bool == true && webhook["queue"] as? String == "hooks")
        let shown = try client.call("GET", "/webhooks/\(id)").json
        #expect(shown["secret"] == nil, "the secret is shown once")
        #expect((try client.call("GET", "/webhooks").json["webhooks"] as? [[String: Any]])?.count == 1)
        try receiver.configure(secret: secret)

        let elsewhere = try client.submit(#"{"kind":"noop"}"#)["id"] as! String
        _ = try client.waitForState(elsewhere, "succeeded")
        let task = try client.submit(#"{"kind":"noop","queue":"hooks"}"#)["id"] as! String
        let received = try receiver.waitFor("the task succeeded", path: "/hook") { $0.deliveredTask?["state"] as? String == "succeeded" }
        #expect(received.allSatisfy { $0["verified"] as? Bool == true }, "Python's hmac accepts every signature")
        #expect(received.allSatisfy { $0.deliveredTask?["id"] as? String == task }, "only the queue's task")
        #expect(received.allSatisfy { $0["content_type"] as? String == "application/json" })
        #expect(Set(received.compactMap { $0["id"] as? String }).count == received.count, "one webhook-id per event")
        let body = try #require(received.first?["body"] as? [String: Any])
        #expect(body["type"] as? String == "task.state")
        #expect((body["timestamp"] as? String)?.hasSuffix("Z") == true)

        // The log, newest first, holds exactly the matching events, each delivered at once.
        var log: [[String: Any]] = []
        try pollUntil("every delivery logged as delivered", timeout: 5, every: 5_000) {
            log = try Self.deliveries(client, id)
            return !log.isEmpty && log.allSatisfy { $0["state"] as? String == "delivered" }
        }
        // Deliveries go out side by side, so the `succeeded` one waited for above may have come
        // first; and the receiver answers before the test reads its line. Each logged one arrives.
        var arrived = received
        try pollUntil("the receiver to show every logged delivery", timeout: 5, every: 2_000) {
            arrived = receiver.deliveries.filter { $0["path"] as? String == "/hook" }
            return arrived.count >= log.count
        }
        #expect(log.count == arrived.count)
        let sequence = log.compactMap { $0["event_seq"] as? Int }
        #expect(sequence == sequence.sorted(by: >))
        #expect(log.allSatisfy { $0["attempt"] as? Int == 1 && $0["status_code"] as? Int == 200 })
        #expect(log.allSatisfy { $0["next_attempt_at"] is NSNull && $0["at"] is String && $0["duration_ms"] is Int })
        #expect(Set(log.compactMap { $0["id"] as? String }) == Set(arrived.compactMap { $0["id"] as? String }))
        #expect(try service.metric(#"taskloop_webhook_attempts_total{outcome="delivered"}"#) == Double(arrived.count))
        #expect(try service.metric("taskloop_webhook_deliveries_pending") == 0)

        #expect(try client.call("DELETE", "/webhooks/\(id)").status == 200)
        #expect(try client.call("GET", "/webhooks/\(id)").status == 404)
        #expect(try client.call("GET", "/webhooks/\(id)/deliveries").status == 404)
    }

    @Test func failedAttemptsFollowTheScheduleAndA410DisablesTheWebhook() throws {
        let service = try ServiceHarness { $0.webhooks.retrySchedule = [50, 100] }
        defer { try? service.stop() }
        let receiver = try WebhookReceiver()
        let client = try service.client()
        let flaky = try Self.create(client, #"{"url":"\#(receiver.url("/flaky"))","events":["task.created"]}"#)
        let sentinel = try Self.create(client, #"{"url":"\#(receiver.url("/sentinel"))","events":["task.created"]}"#)
        let flakyID = flaky["id"] as! String
        try receiver.configure(secret: flaky["secret"] as? String, answers: ["/flaky": [500, 503, 200]])

        // Two failures, then accepted: the same message, signed anew each time.
        _ = try client.submit(#"{"kind":"noop","name":"third time"}"#)
        let attempts = try receiver.waitFor("the third attempt", path: "/flaky") { $0["answered"] as? Int == 200 }
        #expect(attempts.map { $0["answered"] as? Int } == [500, 503, 200])
        #expect(Set(attempts.compactMap { $0["id"] as? String }).count == 1, "a retry keeps its webhook-id")
        #expect(attempts.allSatisfy { $0["verified"] as? Bool == true })
        var log = try Self.deliveries(client, flakyID, once: "delivered")
        // Every attempt is an entry, newest first.
        #expect(log.map { $0["attempt"] as? Int } == [3, 2, 1])
        #expect(log.map { $0["status_code"] as? Int } == [200, 503, 500])
        #expect(log.map { $0["state"] as? String } == ["delivered", "pending", "pending"])

        // Failing past the schedule: three attempts, then given up.
        try receiver.configure(answers: ["/flaky": [500]])
        _ = try client.submit(#"{"kind":"noop","name":"never"}"#)
        log = try Self.deliveries(client, flakyID, once: "failed")
        #expect(log.count == 6)
        #expect(log.first?["attempt"] as? Int == 3 && log.first?["status_code"] as? Int == 500)
        #expect(log.first?["next_attempt_at"] is NSNull)

        // 410 Gone: disabled, and later events are not even queued for it.
        try receiver.configure(answers: ["/flaky": [410]])
        _ = try client.submit(#"{"kind":"noop","name":"gone"}"#)
        try pollUntil("the webhook disabled", timeout: 5, every: 5_000) {
            try client.call("GET", "/webhooks/\(flakyID)").json["enabled"] as? Bool == false
        }
        let last = try client.submit(#"{"kind":"noop","name":"after"}"#)["id"] as! String
        try receiver.waitFor("the sentinel's copy", path: "/sentinel") { $0.deliveredTask?["id"] as? String == last }
        log = try Self.deliveries(client, flakyID)
        #expect(log.count == 7, "nothing queued for a disabled webhook")
        #expect(log.first?["status_code"] as? Int == 410 && log.first?["state"] as? String == "failed")
        #expect(try Self.deliveries(client, sentinel["id"] as! String).count == 4)
    }

    /// Each attempt is its own entry in the log, as Svix and Stripe show them: 500, 500, then
    /// 200 are three entries of one message, newest first, each with its status and duration,
    /// the earlier two with the retry they scheduled.
    @Test func everyAttemptIsAnEntryInTheLog() throws {
        let service = try ServiceHarness { $0.webhooks.retrySchedule = [50, 50] }
        defer { try? service.stop() }
        let receiver = try WebhookReceiver(answers: ["/hook": [500, 500, 200]])
        let client = try service.client()
        let id = try #require(try Self.create(client, #"{"url":"\#(receiver.url("/hook"))","events":["task.created"]}"#)["id"] as? String)
        _ = try client.submit(#"{"kind":"noop"}"#)
        let log = try Self.deliveries(client, id, once: "delivered")
        #expect(log.map { $0["attempt"] as? Int } == [3, 2, 1])
        #expect(log.map { $0["status_code"] as? Int } == [200, 500, 500])
        #expect(log.map { $0["state"] as? String } == ["delivered", "pending", "pending"])
        #expect(Set(log.compactMap { $0["id"] as? String }).count == 1, "one message")
        #expect(Set(log.compactMap { $0["event_seq"] as? Int }).count == 1)
        #expect(log.allSatisfy { $0["duration_ms"] is Int && $0["at"] is String && $0["error"] is NSNull })
        #expect(log[0]["next_attempt_at"] is NSNull)
        #expect(log[1]["next_attempt_at"] is String && log[2]["next_attempt_at"] is String)
        let times = log.compactMap { $0["at"] as? String }
        #expect(times == times.sorted(by: >), "newest first")
        #expect(try client.call("GET", "/webhooks/\(id)/deliveries?limit=2").json["deliveries"].map { ($0 as? [Any])?.count } == 2)
    }

    /// A log read from the cells' rows is bounded as a replica trims its own: a delivery pushed
    /// out (or attempts of it) but not yet deleted from its table is not shown; pending ones are.
    @Test func aLogReadFromTheTablesKeepsItsBound() {
        func delivery(_ id: String, _ seq: UInt64, _ state: DeliveryState, earlier: Int) -> DeliveryRecord {
            DeliveryRecord(id: id, webhook: "wh", eventSeq: seq, type: "task.created", body: [], attempt: earlier + 1, state: state,
                           earlierAttempts: (0..<earlier).map {
                               DeliveryAttempt(number: $0 + 1, statusCode: 500, error: nil, durationMilliseconds: 1, attemptedAt: 1,
                                               nextAttemptAt: 2)
                           })
        }
        let all = [delivery("new", 3, .delivered, earlier: 1), delivery("pending", 4, .pending, earlier: 3),
                   delivery("old", 1, .delivered, earlier: 1), delivery("middle", 2, .failed, earlier: 1)]
        let kept = Webhooks.bounded(all, finishedEntries: 3)
        #expect(kept.map(\.id) == ["pending", "middle", "new"])
        #expect(kept.map(\.logEntries) == [4, 1, 2], "the middle one's earlier attempt left first")
        #expect(Webhooks.bounded(all, finishedEntries: 6).count == 4)
    }

    /// `--webhook-delivery-log` bounds entries: the oldest delivery's earliest attempts leave
    /// first, then the delivery.
    @Test func theLogKeepsItsNumberOfEntries() throws {
        let service = try ServiceHarness {
            $0.webhooks.retrySchedule = [50]
            $0.webhooks.deliveryLog = 3
        }
        defer { try? service.stop() }
        let receiver = try WebhookReceiver(answers: ["/hook": [500, 200]])
        let client = try service.client()
        let id = try #require(try Self.create(client, #"{"url":"\#(receiver.url("/hook"))","events":["task.created"]}"#)["id"] as? String)
        var messages: [String] = []
        for index in 0..<3 {
            // Each event fails once and then gets through.
            if index > 0 { try receiver.configure(answers: ["/hook": [500, 200]]) }
            _ = try client.submit(#"{"kind":"noop","name":"n\#(index)"}"#)
            try pollUntil("delivery \(index) logged as delivered", timeout: 5, every: 5_000) {
                guard let newest = try Self.deliveries(client, id).first, let message = newest["id"] as? String,
                      !messages.contains(message), newest["state"] as? String == "delivered" else { return false }
                messages.append(message)
                return true
            }
        }
        let log = try Self.deliveries(client, id)
        #expect(log.map { $0["id"] as? String } == [messages[2], messages[2], messages[1]])
        #expect(log.map { $0["attempt"] as? Int } == [2, 1, 2])
    }

    @Test func aReceiverThatNeverAnswersHoldsUpNothingElse() throws {
        let service = try ServiceHarness {
            $0.webhooks.attemptTimeoutMilliseconds = 1_000
            $0.webhooks.maxInFlight = 2
        }
        defer { try? service.stop() }
        let receiver = try WebhookReceiver(answers: ["/stuck": [0]])
        let client = try service.client()
        let stuck = try Self.create(client, #"{"url":"\#(receiver.url("/stuck"))","events":["task.created"]}"#)
        _ = try Self.create(client, #"{"url":"\#(receiver.url("/fine"))","events":["task.created"]}"#)
        var ids: [String] = []
        for index in 0..<6 { ids.append(try client.submit(#"{"kind":"noop","name":"t\#(index)"}"#)["id"] as! String) }
        // Every one reaches the live receiver (a copy more would be allowed: at least once).
        try pollUntil("all six to the live receiver", timeout: 10, every: 2_000) {
            let fine = receiver.deliveries.filter { $0["path"] as? String == "/fine" }
            return Set(fine.compactMap { $0.deliveredTask?["id"] as? String }) == Set(ids)
        }
        // Two in flight per webhook on each replica (each attempts the events it numbered).
        #expect(receiver.deliveries.filter { $0["path"] as? String == "/stuck" }.count <= 2 * service.ports.count,
                "at most two in flight")
        // Each stuck attempt is cut at the timeout and logged, then retried on the schedule.
        try pollUntil("a timed-out attempt logged", timeout: 5, every: 10_000) {
            try Self.deliveries(client, stuck["id"] as! String).contains { ($0["error"] as? String)?.hasPrefix("timeout") == true }
        }
    }

    @Test func deliveriesObeyTheAddressPolicy() throws {
        let service = try ServiceHarness { $0.httpPolicy.denyPrivateAddresses = true }
        defer { try? service.stop() }
        let receiver = try WebhookReceiver()
        let client = try service.client()
        let webhook = try Self.create(client, #"{"url":"\#(receiver.url("/private"))","events":["task.created"]}"#)
        _ = try client.submit(#"{"kind":"noop"}"#)
        var log: [[String: Any]] = []
        try pollUntil("a refused attempt logged", timeout: 5, every: 5_000) {
            log = try Self.deliveries(client, webhook["id"] as! String)
            return log.first?["attempt"] as? Int == 1
        }
        #expect((log.first?["error"] as? String)?.hasPrefix("address_refused") == true, "\(log)")
        #expect(receiver.deliveries.isEmpty)
    }

    @Test func badRequestsAreRefusedAndChangeNothing() throws {
        let service = try ServiceHarness {
            $0.webhooks.maxWebhooks = 1
            $0.httpPolicy.allowedHosts = [HostPattern("hooks.example.com")!]
        }
        defer { try? service.stop() }
        let client = try service.client()
        let refused: [(String, Int, String)] = [
            ("{", 400, ""),
            (#"{"events":["task.state"]}"#, 422, "url"),
            (#"{"url":"https://hooks.example.com/x"}"#, 422, "events"),
            (#"{"url":"ftp://hooks.example.com/x","events":["task.state"]}"#, 422, "url"),
            (#"{"url":"https://elsewhere.example.com/x","events":["task.state"]}"#, 422, "url"),
            (#"{"url":"https://hooks.example.com/x","events":["task.done"]}"#, 422, "events[0]"),
            (#"{"url":"https://hooks.example.com/x","events":["task.state","task.state"]}"#, 422, "events[1]"),
            (#"{"url":"https://hooks.example.com/x","events":[]}"#, 422, "events"),
            (#"{"url":"https://hooks.example.com/x","events":["task.state"],"workflow":"nope"}"#, 422, "workflow"),
            (#"{"url":"https://hooks.example.com/x","events":["task.state"],"secret":"mine"}"#, 422, "secret"),
            (#"{"url":"https://hooks.example.com/x","events":["task.state"],"queue":"a b"}"#, 422, "queue"),
            (#"{"url":"https://hooks.example.com/x","events":["task.state"],"queue":null}"#, 422, "queue"),
        ]
        for (body, status, field) in refused {
            let response = try client.call("POST", "/webhooks", json: body)
            #expect(response.status == status, "\(body): \(response.text)")
            #expect(response.header("Content-Type") == "application/problem+json")
            if !field.isEmpty {
                let fields: [String] = (response.json["errors"] as? [[String: Any]])?.compactMap { $0["field"] as? String } ?? []
                #expect(fields.contains(field), "\(body): \(response.text)")
            }
        }
        #expect((try client.call("GET", "/webhooks").json["webhooks"] as? [Any])?.isEmpty == true)
        _ = try Self.create(client, #"{"url":"https://hooks.example.com/x","events":["task.state"]}"#)
        let over = try client.call("POST", "/webhooks", json: #"{"url":"https://hooks.example.com/y","events":["task.state"]}"#)
        #expect(over.status == 409 && over.json["code"] as? String == "too_many_webhooks")
        #expect(try client.call("GET", "/webhooks/wh_nope").status == 404)
        #expect(try client.call("DELETE", "/webhooks/wh_nope").status == 404)
        let id = (try client.call("GET", "/webhooks").json["webhooks"] as! [[String: Any]])[0]["id"] as! String
        #expect(try client.call("GET", "/webhooks/\(id)/deliveries?limit=0").status == 400)
    }

    @Test func retrySchedulesParse() {
        #expect(WebhookSettings.parseSchedule("5s,5m,30m,2h,5h,10h,10h") == [5_000, 300_000, 1_800_000, 7_200_000, 18_000_000,
                                                                             36_000_000, 36_000_000])
        #expect(WebhookSettings.parseSchedule("100ms") == [100])
        #expect(WebhookSettings.parseSchedule("") == [])
        for bad in ["5", "s", "5x", "5s,", ",5s", "-5s", "5 s", "8d", "169h", "99999999999999s"] {
            #expect(WebhookSettings.parseSchedule(bad) == nil, "\(bad)")
        }
    }
}

/// Pending deliveries are on disk with the change they announce: a server killed with -9
/// delivers them after the restart, under the same webhook-id.
@Suite(.serialized) struct WebhookRestartTests {
    @Test func pendingDeliveriesSurviveAKill() throws {
        let directory = try BinaryTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let receiverPort = try OriginServer.freePort()
        func start() throws -> (BinaryTests.RunningBinary, APIClient) {
            let binary = try BinaryTests.RunningBinary(arguments: [
                "--port", "0", "--durability", "full", "--data-dir", directory,
                "--webhook-retry-schedule", Array(repeating: "200ms", count: 50).joined(separator: ","),
            ])
            let port = try #require(BinaryTests.port(from: try binary.waitForLine(containing: "listening on")))
            return (binary, try APIClient(port: port))
        }
        var (binary, client) = try start()
        let webhook = try WebhookTests.create(
            client, #"{"url":"http://127.0.0.1:\#(receiverPort)/hook","events":["task.created"]}"#)
        let id = webhook["id"] as! String
        let task = try client.submit(#"{"kind":"noop"}"#)["id"] as! String
        var before: [[String: Any]] = []
        try pollUntil("a failed attempt logged (nobody listens yet)", timeout: 10, every: 5_000) {
            before = try WebhookTests.deliveries(client, id)
            return (before.first?["attempt"] as? Int ?? 0) >= 1
        }
        #expect(before.first?["state"] as? String == "pending" && before.first?["next_attempt_at"] is String)
        kill(binary.process.processIdentifier, SIGKILL)
        // Reaped once the kernel lets go of it: under load, a process killed during an fsync
        // can take seconds.
        _ = try binary.waitForExit(timeout: 30)

        (binary, client) = try start()
        #expect(try client.call("GET", "/webhooks/\(id)").status == 200, "the webhook survived")
        let receiver = try WebhookReceiver(port: receiverPort, secret: webhook["secret"] as? String)
        let received = try receiver.waitFor("the delivery after the restart", path: "/hook") { $0.deliveredTask?["id"] as? String == task }
        #expect(received.allSatisfy { $0["verified"] as? Bool == true })
        #expect(received.first?["id"] as? String == before.first?["id"] as? String, "the same message")
        let log = try WebhookTests.deliveries(client, id, once: "delivered")
        // The attempts made before the kill are in the log with those after it.
        #expect(log.count >= 2)
        #expect(log.map { $0["attempt"] as? Int } == Array((1...log.count).reversed()))
        #expect(log.dropFirst().allSatisfy { $0["state"] as? String == "pending" && $0["error"] is String })
        #expect(try binary.stop() == 0)
    }
}
