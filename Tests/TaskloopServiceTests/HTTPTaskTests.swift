import Crypto
import Foundation
import Testing
import TaskloopHTTPClient
import TaskloopTestSupport
@testable import TaskloopService

/// `http` tasks end to end: the service fetches from a scripted origin on 127.0.0.1 over real
/// sockets; progress, results, redirects, status checks, cancellation, timeouts and the host
/// policy are observed through the API and on the origin's side of the connection.
@Suite(.serialized) struct HTTPTaskTests {
    static func json(_ value: Any) -> String {
        String(decoding: try! JSONSerialization.data(withJSONObject: value), as: UTF8.self)
    }

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    static func sha256(_ bytes: [UInt8]) -> String {
        hex(Array(SHA256.hash(data: bytes)))
    }

    func submit(_ client: APIClient, _ params: [String: Any], extra: [String: Any] = [:]) throws -> String {
        var body: [String: Any] = ["kind": "http", "params": params]
        body.merge(extra) { $1 }
        return try #require(try client.submit(Self.json(body))["id"] as? String)
    }

    func result(_ task: [String: Any]) throws -> [String: Any] { try #require(task["result"] as? [String: Any]) }
    func error(_ task: [String: Any]) throws -> [String: Any] { try #require(task["error"] as? [String: Any]) }

    /// Polls the task until its progress satisfies `condition`.
    func waitForProgress(_ client: APIClient, _ id: String, _ what: String,
                         _ condition: ([String: Any]) -> Bool) throws -> [String: Any] {
        var progress: [String: Any] = [:]
        try pollUntil(what) {
            progress = try client.task(id)["progress"] as? [String: Any] ?? [:]
            return condition(progress)
        }
        return progress
    }

    @Test func resultCarriesBodyDigestAndHeaders() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()

        let text = try result(try client.waitForState(try submit(client, ["url": origin.url("/text/2000")]), "succeeded"))
        #expect(text["status"] as? Int == 200)
        #expect(text["body"] as? String == String(decoding: OriginServer.text(2000), as: UTF8.self))
        #expect(text["body_encoding"] as? String == "utf8")
        #expect(text["bytes"] as? Int == 2000 && text["truncated"] as? Bool == false)
        #expect(text["sha256"] as? String == Self.sha256(OriginServer.text(2000)))
        #expect((text["headers"] as? [String: Any])?["content-length"] as? String == "2000")
        #expect(text["duration_ms"] is Int)

        let binary = try result(try client.waitForState(try submit(client, ["url": origin.url("/bytes/300")]), "succeeded"))
        #expect(binary["body_encoding"] as? String == "base64")
        #expect(binary["body"] as? String == Data(OriginServer.bytes(300)).base64EncodedString())

        let cut = try result(try client.waitForState(
            try submit(client, ["url": origin.url("/text/5000"), "max_response_bytes": 100]), "succeeded"))
        #expect((cut["body"] as? String)?.utf8.count == 100 && cut["truncated"] as? Bool == true)
        #expect(cut["bytes"] as? Int == 5000 && cut["sha256"] as? String == Self.sha256(OriginServer.text(5000)))
        try service.stop()
    }

    @Test func progressRisesWithTheBytesReceived() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try submit(client, ["url": origin.url("/gated/400000/4")])
        var seen: [Double] = []
        for quarter in 1...3 {
            let progress = try waitForProgress(client, id, "progress \(quarter)/4") {
                ($0["fraction"] as? Double ?? 0) >= Double(quarter) / 4
            }
            seen.append(progress["fraction"] as? Double ?? 0)
            if quarter == 1 {
                #expect(progress["message"] as? String == "100.0 kB of 400.0 kB")
                #expect((progress["details"] as? [String: Any])?["bytes_total"] as? Int == 400_000)
            }
            #expect(try client.task(id)["state"] as? String == "running")
            origin.release()
        }
        let done = try client.waitForState(id, "succeeded")
        #expect(seen == seen.sorted() && seen.last! < 1)
        #expect((done["progress"] as? [String: Any])?["fraction"] as? Double == 1)
        #expect(try result(done)["bytes"] as? Int == 400_000)
        try service.stop()
    }

    @Test func unknownLengthReportsBytesWithoutAFraction() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try submit(client, ["url": origin.url("/gated-unknown/30000/3")])
        let progress = try waitForProgress(client, id, "the first piece") {
            (($0["details"] as? [String: Any])?["bytes_received"] as? Int ?? 0) >= 10_000
        }
        #expect(progress["fraction"] is NSNull)
        #expect(progress["message"] as? String == "10.0 kB received")
        #expect((progress["details"] as? [String: Any])?["bytes_total"] is NSNull)
        origin.release(2)
        let done = try result(try client.waitForState(id, "succeeded"))
        #expect(done["bytes"] as? Int == 30_000 && done["sha256"] as? String == Self.sha256(OriginServer.text(30_000)))
        try service.stop()
    }

    @Test func redirectsAreFollowedUpToFive() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let followed = try result(try client.waitForState(try submit(client, ["url": origin.url("/redirect/5")]), "succeeded"))
        #expect(followed["redirects"] as? Int == 5 && followed["body"] as? String == "arrived")
        #expect(followed["url"] as? String == origin.url("/redirect/0"))

        let tooMany = try error(try client.waitForState(try submit(client, ["url": origin.url("/redirect/6")]), "failed"))
        #expect(tooMany["code"] as? String == "too_many_redirects")

        let unfollowed = try submit(client, ["url": origin.url("/redirect/1"), "follow_redirects": false, "expect_status": [302]])
        #expect(try result(try client.waitForState(unfollowed, "succeeded"))["status"] as? Int == 302)

        // 303 turns a POST into a GET without its body.
        let seeOther = try result(try client.waitForState(
            try submit(client, ["url": origin.url("/see-other"), "method": "POST", "body": "payload"]), "succeeded"))
        #expect((seeOther["body"] as? String)?.hasPrefix("GET /echo\n") == true)
        try service.stop()
    }

    @Test func statusOutsideExpectStatusFailsAndIsRetried() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let failing = try submit(client, ["url": origin.url("/status/503")], extra: ["retry": ["max_attempts": 2, "backoff_ms": 1]])
        let failed = try client.waitForState(failing, "failed")
        let failure = try error(failed)
        #expect(failure["code"] as? String == "http_status")
        #expect(failure["status"] as? Int == 503 && failure["body"] as? String == "status 503")
        #expect(failed["attempt"] as? Int == 2)
        #expect(origin.requests.value.filter { $0.path == "/status/503" }.count == 2)

        let accepted = try submit(client, ["url": origin.url("/status/503"), "expect_status": [404, "5xx"]])
        #expect(try result(try client.waitForState(accepted, "succeeded"))["status"] as? Int == 503)
        let ranged = try submit(client, ["url": origin.url("/status/404"), "expect_status": ["200-299", "500-599"]])
        #expect(try error(try client.waitForState(ranged, "failed"))["status"] as? Int == 404)
        try service.stop()
    }

    @Test func methodHeadersAndBodyAreSent() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let posted = try submit(client, ["url": origin.url("/echo"), "method": "POST", "headers": ["X-Token": "t1"],
                                         "body": ["name": "x", "n": 1]])
        _ = try client.waitForState(posted, "succeeded")
        let put = try submit(client, ["url": origin.url("/echo"), "method": "PUT", "body": "plain text",
                                      "headers": ["Content-Type": "text/csv"]])
        _ = try client.waitForState(put, "succeeded")
        let head = try submit(client, ["url": origin.url("/text/10"), "method": "HEAD"])
        #expect(try result(try client.waitForState(head, "succeeded"))["bytes"] as? Int == 0)

        let requests = origin.requests.value
        let post = try #require(requests.first { $0.method == "POST" })
        #expect(post.headers["x-token"] == "t1" && post.headers["content-type"] == "application/json")
        #expect(try JSONSerialization.jsonObject(with: Data(post.body)) as? NSDictionary == ["name": "x", "n": 1])
        #expect(post.headers["expect"] == nil)
        let sentPut = try #require(requests.first { $0.method == "PUT" })
        #expect(sentPut.body == Array("plain text".utf8) && sentPut.headers["content-type"] == "text/csv")
        #expect(requests.contains { $0.method == "HEAD" && $0.path == "/text/10" })
        try service.stop()
    }

    @Test func cancelMidTransferClosesTheConnection() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try submit(client, ["url": origin.url("/stall/200000")])
        _ = try waitForProgress(client, id, "the first half") { ($0["fraction"] as? Double ?? 0) >= 0.5 }
        #expect(try service.metric("taskloop_http_task_transfers") == 1)
        // The transfer stops inside the request, so the task is already cancelled in the answer.
        try client.expectCancelled(client.call("DELETE", "/tasks/\(id)"), id)
        try pollUntil("the origin to see the connection closed") { origin.hangUps.value == ["/stall/200000"] }
        #expect(try service.metric("taskloop_http_task_transfers") == 0)
        try service.stop()
    }

    @Test func timeoutFailsTheTaskAndHangsUp() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try submit(client, ["url": origin.url("/hang")], extra: ["timeout_ms": 300])
        #expect(try error(try client.waitForState(id, "failed"))["code"] as? String == "timeout")
        try pollUntil("the origin to see the connection closed") { origin.hangUps.value == ["/hang"] }
        try service.stop()
    }

    @Test func shutdownEndsRunningTransfersAndClosesClean() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try submit(client, ["url": origin.url("/hang")])
        try pollUntil("the request to arrive") { origin.requests.value.count == 1 }
        #expect(try client.task(id)["state"] as? String == "running")
        try service.stop()
        // Through replicas, the task's cell may move to a replica that stops later, which starts
        // the task again: every request the origin saw must have been hung up, none left open.
        try pollUntil("the origin to see every connection closed") {
            let hangUps = origin.hangUps.value
            return hangUps.count == origin.requests.value.count && hangUps.allSatisfy { $0 == "/hang" }
        }
    }

    /// Beyond the per-host cap a request waits for a connection, however long the one ahead
    /// takes: the wait is not a connect timeout.
    @Test func requestsBeyondTheHostCapWaitForAConnection() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        // One server: the cap is per process.
        let service = try ServiceHarness(replicas: 1) { $0.httpMaxHostConnections = 1 }
        let client = try service.client()
        let first = try submit(client, ["url": origin.url("/gated/2000/2"), "connect_timeout_ms": 100])
        try pollUntil("the first request") { origin.requests.value.count == 1 }
        let second = try submit(client, ["url": origin.url("/text/10"), "connect_timeout_ms": 100])
        // Let the server's own clock pass the second task's connect timeout several times over:
        // the loop runs its timers in deadline order, so once a 400 ms sleep task (in a queue of
        // its own: the transfers fill the default one) has finished there, curl's 100 ms timer
        // for the waiting transfer has fired too.
        let clock = try #require(try client.submit(Self.json(["kind": "sleep", "queue": "clock", "params": ["duration_ms": 400, "steps": 1]]))["id"] as? String)
        _ = try client.waitForState(clock, "succeeded")
        #expect(origin.requests.value.count == 1)
        #expect(try client.task(second)["state"] as? String == "running")
        origin.release()
        #expect(try result(try client.waitForState(first, "succeeded"))["bytes"] as? Int == 2_000)
        #expect(try result(try client.waitForState(second, "succeeded"))["body"] as? String == "abcdefghij")
        try service.stop()
    }

    @Test func connectionFailuresFailTheTask() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let closed = try submit(client, ["url": "http://127.0.0.1:1/"])
        #expect(try error(try client.waitForState(closed, "failed"))["code"] as? String == "connect_failed")
        let unresolvable = try submit(client, ["url": "http://no-such-host.invalid/"])
        #expect(try error(try client.waitForState(unresolvable, "failed"))["code"] as? String == "dns_failed")
        try service.stop()
    }

    /// HTTPS goes through TLS with certificate verification: a self-signed server is refused.
    @Test func httpsVerifiesTheServerCertificate() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func openssl(_ arguments: [String]) throws -> Process {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            process.arguments = arguments
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            return process
        }
        let request = try openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-days", "1",
                                   "-keyout", "\(directory)/key.pem", "-out", "\(directory)/cert.pem"])
        try #require(try request.waitForExit("openssl req", timeout: 60) == 0)
        let port = try OriginServer.freePort()
        let server = try openssl(["s_server", "-accept", "127.0.0.1:\(port)", "-cert", "\(directory)/cert.pem",
                                  "-key", "\(directory)/key.pem", "-www", "-quiet"])
        defer { server.terminate() }
        try pollUntil("openssl s_server to listen", every: 5_000) { (try? RawClient(port: port)) != nil }
        let service = try ServiceHarness()
        let client = try service.client()
        let refused = try error(try client.waitForState(try submit(client, ["url": "https://127.0.0.1:\(port)/"]), "failed"))
        #expect(refused["code"] as? String == "tls_failed")
        #expect((refused["message"] as? String)?.contains("certificate") == true, "\(refused)")
        try service.stop()
    }

    @Test func denyPrivateRefusesLoopbackAfterResolution() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness { $0.httpPolicy = HostPolicy(denyPrivateAddresses: true) }
        let client = try service.client()
        for url in [origin.url("/text/10"), "http://localhost:\(origin.port)/text/10"] {
            let refused = try error(try client.waitForState(try submit(client, ["url": url]), "failed"))
            #expect(refused["code"] as? String == "address_refused")
            #expect((refused["message"] as? String)?.contains("127.0.0.1") == true)
        }
        #expect(origin.requests.value.isEmpty)
        try service.stop()
    }

    @Test func allowHostsRefusesOtherHostsAndRedirectsToThem() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let service = try ServiceHarness { $0.httpPolicy = HostPolicy(allowedHosts: [HostPattern("127.0.0.1")!]) }
        let client = try service.client()
        let refused = try client.call("POST", "/tasks", json: Self.json(["kind": "http", "params": ["url": "http://localhost:\(origin.port)/"]]))
        #expect(refused.status == 422 && refused.text.contains("params.url"))
        #expect(try result(try client.waitForState(try submit(client, ["url": origin.url("/text/3")]), "succeeded"))["body"] as? String == "abc")
        let away = try submit(client, ["url": origin.url("/redirect-to/http://localhost:\(origin.port)/text/3")])
        #expect(try error(try client.waitForState(away, "failed"))["code"] as? String == "host_not_allowed")
        #expect(!origin.requests.value.contains { $0.headers["host"]?.hasPrefix("localhost") == true })
        try service.stop()
    }

    @Test func badParamsAreRefusedWithTheirField() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let cases: [([String: Any], String)] = [
            ([:], "params.url"),
            (["url": "ftp://example.com/"], "params.url"),
            (["url": "not a url"], "params.url"),
            (["url": "http://example.com/", "method": "BREW"], "params.method"),
            (["url": "http://example.com/", "headers": ["X-A": "a\r\nInjected: 1"]], "params.headers.X-A"),
            (["url": "http://example.com/", "headers": ["Content-Length": "3"]], "params.headers.Content-Length"),
            (["url": "http://example.com/", "expect_status": []], "params.expect_status"),
            (["url": "http://example.com/", "expect_status": [200, "6xx"]], "params.expect_status[1]"),
            (["url": "http://example.com/", "max_response_bytes": -1], "params.max_response_bytes"),
            (["url": "http://example.com/", "follow_redirects": "yes"], "params.follow_redirects"),
            (["url": "http://example.com/", "connect_timeout_ms": 0], "params.connect_timeout_ms"),
            (["url": "http://example.com/", "method": "HEAD", "body": "x"], "params.body"),
            (["url": "http://example.com/", "proxy": "x"], "params.proxy"),
            // The URL pattern openapi.yaml documents, which every URL libcurl accepts here matches.
            (["url": "http://user:secret@example.com/"], "params.url"),
            (["url": "http://example.com:65536/"], "params.url"),
            (["url": "http://[1]/"], "params.url"),
            (["url": "http://[::ffff:1.2.3.4]/"], "params.url"),
            (["url": "http://example.com/\u{e9}"], "params.url"),
            (["url": "http://example.com/\n"], "params.url"),
            (["url": "http://ex!ample.com/"], "params.url"),
            (["url": "http://example.com/", "method": "get"], "params.method"),
            (["url": "http://example.com/", "expect_status": ["2000-2004"]], "params.expect_status[0]"),
        ]
        for (params, field) in cases {
            let response = try client.call("POST", "/tasks", json: Self.json(["kind": "http", "params": params]))
            #expect(response.status == 422, "\(params)")
            let errors = response.json["errors"] as? [[String: Any]] ?? []
            #expect(errors.first?["field"] as? String == field, "\(params): \(response.text)")
        }
        #expect((try client.call("GET", "/tasks").json["tasks"] as? [Any])?.isEmpty == true)
        for url in ["HTTP://Example.INVALID", "https://[::1]:8080/a?b#c", "http://a_b.c-d~e.invalid:0/%zz", "http://127.0.0.1:65535/x y".replacingOccurrences(of: " ", with: "%20")] {
            #expect(try client.call("POST", "/tasks", json: Self.json(["kind": "http", "params": ["url": url]])).status == 201, "\(url)")
        }
        let reversed = try client.call("POST", "/tasks", json: Self.json(["kind": "http", "params": ["url": "http://a.invalid/", "expect_status": ["204-200"]]]))
        #expect(reversed.status == 201, "a range names two statuses in either order: \(reversed.text)")
        try service.stop()
    }
}
