import Foundation
import Testing
import TaskloopHTTP
import TaskloopJSON
import TaskloopLoop
import TaskloopLoopTestSupport
import TaskloopTestSupport
@testable import TaskloopCluster

/// ClusterForwarder against a real HTTPServer on 127.0.0.1 as the owner, each on a loop thread
/// of its own: what goes to the owner, what comes back, and the answers when the owner cannot
/// give one.
@Suite struct ClusterForwarderTests {
    /// The owner: a server whose handler the test gives, and the requests it received.
    final class Owner: Sendable {
        let port: Int
        let received: Locked<[HTTPRequest]>
        private let server: LoopBound<HTTPServer>
        private let thread: LoopThread

        init(_ answer: @escaping (HTTPRequest, HTTPResponder) -> Void) throws {
            let loop = try EventLoop()
            var configuration = HTTPServerConfiguration()
            configuration.host = "127.0.0.1"
            configuration.port = 0
            let received = Locked<[HTTPRequest]>([])
            self.received = received
            let server = HTTPServer(loop: loop, configuration: configuration) { request, responder in
                received.withLock { $0.append(request) }
                answer(request, responder)
            }
            port = try server.start().port
            self.server = LoopBound(server, loop: loop)
            thread = LoopThread(loop, name: "owner-loop")
        }

        var address: String { "127.0.0.1:\(port)" }

        var connectionsAccepted: Int {
            let server = self.server
            return thread.run { server.value.statistics.connectionsAccepted }
        }

        func stop() throws {
            let server = self.server
            thread.run { server.value.shutdown(gracePeriodMilliseconds: 100) { server.loop.finish() } }
            try thread.waitForExit(timeout: 10)
        }
    }

    /// The forwarder on a loop of its own; `close()` closes both and checks the loop closed clean.
    final class Forwarder: Sendable {
        let thread: LoopThread
        let forwarder: LoopBound<ClusterForwarder>

        init(_ configure: @Sendable (inout ClusterForwarder.Settings) -> Void = { _ in }) throws {
            var settings = ClusterForwarder.Settings()
            configure(&settings)
            let loop = try EventLoop()
            thread = LoopThread(loop, name: "forwarder-loop")
            forwarder = thread.run { [settings] in
                LoopBound(try! ClusterForwarder(loop: loop, replica: "replica-a", settings: settings), loop: loop)
            }
        }

        /// Starts a forward; its answer lands in the returned box.
        func start(_ request: HTTPRequest, to address: String) -> Locked<HTTPResponse?> {
            startCancellable(request, to: address).answer
        }

        /// Starts a forward; its answer lands in the box, and `cancel` gives it up.
        func startCancellable(_ request: HTTPRequest, to address: String)
            -> (answer: Locked<HTTPResponse?>, cancel: @Sendable () -> Void) {
            let answer = Locked<HTTPResponse?>(nil)
            let forwarder = self.forwarder
            let forwarded = thread.run {
                LoopBound(forwarder.value.forward(request, to: address) { response in
                    answer.withLock {
                        precondition($0 == nil, "a forward was answered twice")
                        $0 = response
                    }
                }, loop: forwarder.loop)
            }
            return (answer, { [thread] in thread.run { forwarded.value.cancel() } })
        }

        /// Forwards and waits for the answer.
        func forward(_ request: HTTPRequest, to address: String, timeout: Double = 10) throws -> HTTPResponse {
            let answer = start(request, to: address)
            try pollUntil("the forward's answer", timeout: timeout) { answer.value != nil }
            return answer.value!
        }

        func close() throws {
            let forwarder = self.forwarder
            thread.run {
                forwarder.value.close()
                forwarder.loop.finish()
            }
            try thread.waitForExit(timeout: 5)
        }
    }

    static func problemCode(_ response: HTTPResponse) -> String? {
        guard response.headers["Content-Type"] == "application/problem+json",
              let problem = try? JSONParser.parse(response.body).objectValue,
              problem["status"]?.intValue == Int64(response.status.code) else { return nil }
        return problem["code"]?.stringValue
    }

    /// The method, the raw path, the query's items, the body and the end-to-end fields the API
    /// reads arrive as the client sent them, Host included, with the marker naming this
    /// replica; hop-by-hop fields, others the API does not read and a client's own marker do not.
    @Test func theRequestArrivesWithItsEndToEndFieldsOnly() throws {
        let owner = try Owner { _, responder in responder.respond(HTTPResponse(status: .noContent)) }
        let forwarder = try Forwarder()
        let sent: HTTPHeaders = [
            "Host": "taskloop.example.com", "Authorization": "Bearer secret", "Content-Type": "application/json",
            "Accept": "application/json", "User-Agent": "test-client/1", "Idempotency-Key": "key-1",
            "Origin": "https://taskloop.example.com", "Sec-Fetch-Site": "same-origin", "Last-Event-ID": "17",
            "If-None-Match": "\"v1\"",
            "Connection": "keep-alive, X-Hop", "Keep-Alive": "timeout=5", "TE": "trailers", "Trailer": "X-Checksum",
            "Upgrade": "websocket", "Proxy-Authorization": "Basic cHJveHk=", "X-Hop": "1", "Cookie": "session=1",
            "X-Unknown": "2", "Forwarded": "for=192.0.2.1", "Taskloop-Forwarded-By": "someone-else",
        ]
        let body = Array(#"{"reason":"a b & c"}"#.utf8)
        let request = try HTTPRequest(method: .POST, target: "/tasks/ab%2Fc/cancel?wait=1.5&name=a%20b%26c&plus=x+y&empty=",
                                      headers: sent, body: body)
        let answer = try forwarder.forward(request, to: owner.address)
        #expect(answer.status == .noContent)

        let arrived = try #require(owner.received.value.first)
        #expect(arrived.method == .POST)
        #expect(arrived.rawPath == "/tasks/ab%2Fc/cancel")
        #expect(arrived.queryItems == request.queryItems)
        #expect(arrived.body == body)
        for name in ["Host", "Authorization", "Content-Type", "Accept", "User-Agent", "Idempotency-Key", "Origin", "Sec-Fetch-Site",
                     "Last-Event-ID", "If-None-Match"] {
            #expect(arrived.headers.values(for: name) == sent.values(for: name), "\(name)")
        }
        // The replicas it came through, this one last: a replica it came through never takes it again.
        #expect(arrived.headers.values(for: "Taskloop-Forwarded-By") == ["someone-else, replica-a"])
        let names = Set(arrived.headers.map { $0.name.lowercased() })
        #expect(names == ["host", "authorization", "content-type", "accept", "user-agent", "idempotency-key", "origin",
                          "sec-fetch-site", "last-event-id", "if-none-match", "taskloop-forwarded-by", "content-length"])
        try forwarder.close()
        try owner.stop()
    }

    /// A bodiless POST without the fields curl writes by itself goes without them (a form's
    /// Content-Type would make the owner refuse it); without a Host, the member's address is
    /// the Host; a value with a line break does not smuggle a field of its own in.
    @Test func fieldsTheClientDidNotSendAreNotInvented() throws {
        let owner = try Owner { _, responder in responder.respond(HTTPResponse(status: .accepted)) }
        let forwarder = try Forwarder()
        let request = try HTTPRequest(method: .POST, target: "/tasks/abc/retry", headers: ["User-Agent": "x\r\nX-Injected: 1"])
        #expect(try forwarder.forward(request, to: owner.address).status == .accepted)

        let arrived = try #require(owner.received.value.first)
        #expect(arrived.body.isEmpty)
        #expect(arrived.headers["Host"] == owner.address)
        #expect(Set(arrived.headers.map { $0.name.lowercased() }) == ["host", "taskloop-forwarded-by", "content-length"])
        try forwarder.close()
        try owner.stop()
    }

    /// A field the client sent empty arrives empty, not dropped: the owner refuses an empty
    /// Idempotency-Key as malformed, where without it a retry would create a second task.
    @Test func anEmptyFieldArrivesEmpty() throws {
        let owner = try Owner { _, responder in responder.respond(HTTPResponse(status: .noContent)) }
        let forwarder = try Forwarder()
        var request = try HTTPRequest(method: .POST, target: "/tasks")
        request.headers = ["Idempotency-Key": "", "Content-Type": "", "Host": "taskloop.example.com"]
        _ = try forwarder.forward(request, to: owner.address)
        let arrived = try #require(owner.received.value.first)
        #expect(arrived.headers.values(for: "Idempotency-Key") == [""])
        #expect(arrived.headers.values(for: "Content-Type") == [""])
        #expect(arrived.headers.values(for: "User-Agent").isEmpty && arrived.headers.values(for: "Accept").isEmpty)
        try forwarder.close()
        try owner.stop()
    }

    /// The owner's status, body and end-to-end fields come back; its CORS fields (this replica
    /// adds its own), its framing and its other fields do not; a redirect comes back as it is,
    /// not followed.
    @Test func theOwnersAnswerComesBack() throws {
        let owner = try Owner { request, responder in
            if request.rawPath == "/moved" {
                return responder.respond(HTTPResponse(status: HTTPStatus(code: 303), headers: ["Location": "/tasks/elsewhere"]))
            }
            let headers: HTTPHeaders = [
                "Content-Type": "application/json", "Location": "/tasks/abc", "Retry-After": "3", "Idempotent-Replayed": "true",
                "Event-Seq": "42", "ETag": "\"v2\"", "Cache-Control": "no-cache", "WWW-Authenticate": "Bearer", "Allow": "GET, POST",
                "Access-Control-Allow-Origin": "https://app.example.com", "Vary": "Origin", "X-Internal": "1", "Set-Cookie": "a=b",
            ]
            responder.respond(HTTPResponse(status: .created, headers: headers, body: Array(#"{"id":"abc"}"#.utf8)))
        }
        let forwarder = try Forwarder()
        let answer = try forwarder.forward(try HTTPRequest(method: .POST, target: "/tasks", body: Array("{}".utf8)), to: owner.address)
        #expect(answer.status == .created)
        #expect(answer.body == Array(#"{"id":"abc"}"#.utf8))
        let fields = answer.headers.map { "\($0.name): \($0.value)" }
        #expect(fields == ["Content-Type: application/json", "Location: /tasks/abc", "Retry-After: 3", "Idempotent-Replayed: true",
                           "Event-Seq: 42", "ETag: \"v2\"", "Cache-Control: no-cache", "WWW-Authenticate: Bearer", "Allow: GET, POST"])

        let moved = try forwarder.forward(try HTTPRequest(method: .GET, target: "/moved"), to: owner.address)
        #expect(moved.status.code == 303)
        #expect(moved.headers["Location"] == "/tasks/elsewhere")
        #expect(owner.received.value.map(\.rawPath) == ["/tasks", "/moved"])
        try forwarder.close()
        try owner.stop()
    }

    /// Forwards to one member, one after another, go over one kept-alive connection, whichever
    /// way its address is written.
    @Test func forwardsToOneMemberReuseOneConnection() throws {
        let owner = try Owner { request, responder in responder.respond(HTTPResponse(status: .ok, body: Array(request.rawPath.utf8))) }
        let forwarder = try Forwarder()
        for index in 0..<6 {
            let address = index.isMultiple(of: 2) ? owner.address : "http://\(owner.address)/"
            let answer = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks/\(index)"), to: address)
            #expect(answer.status == .ok && answer.body == Array("/tasks/\(index)".utf8))
        }
        #expect(owner.connectionsAccepted == 1)
        try forwarder.close()
        try owner.stop()
    }

    /// A port nobody listens on is 503 owner_unreachable with Retry-After at once, well before
    /// the connect timeout; a malformed address is the same, and a target curl cannot send is 400.
    @Test func aMemberThatRefusesIsUnreachableAtOnce() throws {
        let (listener, port) = try loopbackListener(backlog: 1)
        close(listener)
        let forwarder = try Forwarder { $0.connectTimeoutMilliseconds = 5_000 }
        let started = Date()
        let answer = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks/abc"), to: "127.0.0.1:\(port)")
        #expect(Date().timeIntervalSince(started) < 4)
        #expect(answer.status == .serviceUnavailable)
        #expect(Self.problemCode(answer) == "owner_unreachable")
        #expect(answer.headers["Retry-After"] == "1")

        let malformed = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks/abc"), to: "127.0.0.1:port")
        #expect(malformed.status == .serviceUnavailable && Self.problemCode(malformed) == "owner_unreachable")
        let unsendable = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks/\u{1}"), to: "127.0.0.1:\(port)")
        #expect(unsendable.status == .badRequest)
        try forwarder.close()
    }

    /// An owner that takes the request and never answers is 504 owner_timeout once the request
    /// timeout has passed, not before and not much later.
    @Test func anOwnerThatNeverAnswersTimesOut() throws {
        let owner = try Owner { _, _ in }
        let forwarder = try Forwarder { $0.requestTimeoutMilliseconds = 300 }
        let started = Date()
        let answer = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks/abc?wait=60"), to: owner.address)
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 0.3 && elapsed < 5, "\(elapsed) s")
        #expect(answer.status.code == 504)
        #expect(Self.problemCode(answer) == "owner_timeout")
        #expect(owner.received.value.count == 1)
        try forwarder.close()
        try owner.stop()
    }

    /// A forward the caller gives up (its client left) ends its connection: the owner sees the
    /// client leave, as a long poll or lease call waiting there must, and nothing is answered.
    @Test func aCancelledForwardEndsItsConnectionAtTheOwner() throws {
        let ended = Locked(false)
        let owner = try Owner { _, responder in responder.onPeerEnded { ended.withLock { $0 = true } } }
        let forwarder = try Forwarder()
        let (answer, cancel) = forwarder.startCancellable(try HTTPRequest(method: .GET, target: "/tasks/abc?wait=60"), to: owner.address)
        try pollUntil("the owner to hold the request") { owner.received.value.count == 1 }
        #expect(!ended.value)
        cancel()
        try pollUntil("the owner to see the client leave") { ended.value }
        #expect(answer.value == nil, "a cancelled forward answers nothing")
        try forwarder.close()
        try owner.stop()
    }

    /// An owner that took the request and broke the connection in the middle of its answer may
    /// have made the change: 502 owner_failed, not the 503 that invites a retry.
    @Test func anExchangeThatBreaksIsABadGateway() throws {
        let owner = try Owner { _, responder in
            _ = responder.startStream(headers: ["Content-Type": "application/json"])
            responder.write(Array(#"{"id":"#.utf8))
            responder.abort()
        }
        let forwarder = try Forwarder()
        let answer = try forwarder.forward(try HTTPRequest(method: .POST, target: "/tasks", body: Array("{}".utf8)), to: owner.address)
        #expect(answer.status.code == 502)
        #expect(Self.problemCode(answer) == "owner_failed")
        #expect(answer.headers["Retry-After"] == nil)
        try forwarder.close()
        try owner.stop()
    }

    /// An answer up to the limit comes back whole; one past it is 502 owner_answer_too_large,
    /// and the forwarder goes on serving.
    @Test func anAnswerOverTheLimitIsRefused() throws {
        let owner = try Owner { request, responder in
            let size = Int(request.query("size") ?? "0")!
            responder.respond(HTTPResponse(status: .ok, body: [UInt8](repeating: UInt8(ascii: "x"), count: size)))
        }
        let forwarder = try Forwarder { $0.maxResponseBytes = 100_000 }
        let fits = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks?size=100000"), to: owner.address)
        #expect(fits.status == .ok && fits.body.count == 100_000)
        let tooLarge = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks?size=100001"), to: owner.address)
        #expect(tooLarge.status.code == 502)
        #expect(Self.problemCode(tooLarge) == "owner_answer_too_large")
        let after = try forwarder.forward(try HTTPRequest(method: .GET, target: "/tasks?size=10"), to: owner.address)
        #expect(after.status == .ok && after.body.count == 10)
        try forwarder.close()
        try owner.stop()
    }

    /// close() answers a forward still waiting for its owner with 503 and a later one at once,
    /// and the forwarder's loop then ends clean.
    @Test func closeAnswersForwardsInFlightAndTheLoopEndsClean() throws {
        let owner = try Owner { _, _ in }
        let forwarder = try Forwarder()
        let inFlight = forwarder.start(try HTTPRequest(method: .GET, target: "/tasks/abc?wait=60"), to: owner.address)
        try pollUntil("the owner to receive the request") { owner.received.value.count == 1 }
        #expect(inFlight.value == nil)

        let afterClose = Locked<HTTPResponse?>(nil)
        let bound = forwarder.forwarder
        let request = try HTTPRequest(method: .GET, target: "/tasks/abc")
        forwarder.thread.run {
            bound.value.close()
            bound.value.forward(request, to: owner.address) { response in afterClose.withLock { $0 = response } }
        }
        let answer = try #require(inFlight.value)
        #expect(answer.status == .serviceUnavailable && answer.headers["Retry-After"] == "1")
        #expect(Self.problemCode(answer) == "unavailable")
        #expect(afterClose.value?.status == .serviceUnavailable)
        try forwarder.close()
        try owner.stop()
    }
}
