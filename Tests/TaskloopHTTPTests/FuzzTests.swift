import Foundation
import Testing
import TaskloopTestSupport
@testable import TaskloopHTTP

/// A deterministic random-bytes driver over the request path. Each case is generated from its
/// own seed (printed on failure) so any finding replays exactly (`TASKLOOP_FUZZ_SEED`).
/// `TASKLOOP_FUZZ_SECONDS` sets the time budget (default 2 s; `make test` gives it more).
@Suite struct FuzzTests {
    static let budget = Double(ProcessInfo.processInfo.environment["TASKLOOP_FUZZ_SECONDS"] ?? "") ?? 2

    /// `TASKLOOP_FUZZ_SEED=<n>` replays one case and prints its input and output.
    static let replaySeed = ProcessInfo.processInfo.environment["TASKLOOP_FUZZ_SEED"].flatMap { UInt64($0) }

    @Test func connectionSurvivesArbitraryInput() throws {
        if let seed = Self.replaySeed {
            let failure = Self.runCase(seed: seed)
            #expect(failure == nil, "seed \(seed)")
            return
        }
        let deadline = Date().addingTimeInterval(Self.budget * 0.8)
        var seed: UInt64 = 0x7A5C_100F
        var cases = 0
        while Date() < deadline || cases < 2_000 {
            seed &+= 1
            cases += 1
            if let failure = Self.runCase(seed: seed) {
                Issue.record("fuzz case failed (replay with seed \(seed)): \(failure)")
                return
            }
        }
        print("fuzz: \(cases) connection cases, seeds 0x7A5C1010...\(String(seed, radix: 16))")
    }

    /// Random payloads over real sockets; afterwards the server must still answer and close clean.
    @Test func serverSurvivesArbitraryInputOverSockets() throws {
        let server = try TestServer(configure: {
            $0.parserLimits = HTTPParserLimits(maxURLBytes: 512, maxHeaderBytes: 2048, maxBodyBytes: 4096)
            $0.headerTimeoutMilliseconds = 200
            $0.lingerMilliseconds = 100
        }) { request, responder in
            responder.respond(HTTPResponse(body: Array(request.path.utf8) + request.body))
        }
        var random = SplitMix64(seed: 0xF00D)
        let deadline = Date().addingTimeInterval(Self.budget * 0.2)
        var cases = 0
        while Date() < deadline || cases < 100 {
            cases += 1
            let client = try RawClient(port: server.port)
            try? client.send(RequestMutator.make(&random))
            client.shutdownWrite()
            _ = try? client.readUntilClosed(timeout: 5)
        }
        let client = try RawClient(port: server.port)
        try client.send("GET /still-alive HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(try client.readResponse().text == "/still-alive")
        try server.waitUntil("fuzz connections to close") { $0.openConnections <= 1 }
        try server.stop()
        print("fuzz: \(cases) socket cases")
    }

    /// One generated conversation; returns a description of the broken invariant, if any.
    static func runCase(seed: UInt64) -> String? {
        var random = SplitMix64(seed: seed)
        let limits = HTTPParserLimits(
            maxURLBytes: 64 + random.below(512), maxHeaderBytes: 128 + random.below(2048),
            maxBodyBytes: random.below(4096))
        let highWater = 256 + random.below(8192)
        let harness = ConnectionHarness(limits: limits, highWater: highWater, maxPendingInput: 64 + random.below(4096))
        var parked: [HTTPResponder] = []
        var heads: [Bool] = []
        var largestAnswer = 0
        harness.handler = { request, responder in
            heads.append(request.method == .HEAD)
            switch random.below(5) {
            case 0:
                parked.append(responder)
            case 1:
                responder.respond(HTTPProblem(.conflict, detail: "no").response())
            default:
                let body = [UInt8](repeating: 0x62, count: random.below(3000))
                largestAnswer = max(largestAnswer, body.count + 200)
                responder.respond(HTTPResponse(body: body + request.body))
            }
        }
        let input = RequestMutator.make(&random)
        var offset = 0
        var steps = 0
        while offset < input.count && harness.transport.closeRequest == nil && steps < 10_000 {
            steps += 1
            // Like libuv after uv_read_stop, the peer's bytes wait while reading is off.
            if harness.transport.reading {
                let size = 1 + random.below(min(600, input.count - offset))
                harness.receive(Array(input[offset..<(offset + size)]))
                offset += size
            }
            switch random.below(8) {
            case 0: harness.transport.acceptsImmediately = random.below(3) == 0 ? 0 : .max
            case 1: harness.transport.drain()
            case 2:
                harness.now += UInt64(random.below(2_000))
                harness.connection.tick(now: harness.now)
            case 3:
                if !parked.isEmpty { parked.removeFirst().respond(HTTPResponse(status: .accepted)) }
            default: break
            }
            let bound = highWater + largestAnswer + limits.maxBodyBytes + 4096
            if harness.connection.queuedOutputBytes > bound, harness.transport.reading {
                return "still reading with \(harness.connection.queuedOutputBytes) bytes queued"
            }
            if harness.connection.pendingInputBytes > 64 + 4096 + 600 {
                return "pending input grew to \(harness.connection.pendingInputBytes)"
            }
        }
        if random.below(2) == 0 { harness.connection.peerClosed() }
        harness.transport.acceptsImmediately = .max
        harness.transport.drain()
        // Answering one request may start the next pipelined one, which may park again.
        while !parked.isEmpty { parked.removeFirst().respond(HTTPResponse(status: .accepted)) }
        if harness.transport.writesAfterClose > 0 { return "wrote after asking to close" }
        if replaySeed != nil {
            print("INPUT:", String(decoding: input, as: UTF8.self).debugDescription)
            print("OUTPUT:", harness.transport.sentText.debugDescription, "heads:", heads)
        }
        return ResponseStreamValidator.validate(harness.transport.sent, heads: heads)
    }
}

/// Valid requests, mutated: the inputs most likely to reach deep parser and connection states.
enum RequestMutator {
    static let templates: [String] = [
        "GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n",
        "HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n",
        "POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
        "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        "POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nxyz",
        "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "GET /close HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "DELETE /tasks/%41%zz HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET http://example.com/abs?q HTTP/1.1\r\nHost: t\r\n\r\n",
    ]

    static func make(_ random: inout SplitMix64) -> [UInt8] {
        if random.below(5) == 0 {
            return (0..<random.below(1500)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
        }
        var bytes: [UInt8] = []
        for _ in 0...random.below(6) {
            bytes += Array(templates[random.below(templates.count)].utf8)
        }
        for _ in 0..<random.below(6) {
            guard !bytes.isEmpty else { break }
            let at = random.below(bytes.count)
            switch random.below(6) {
            case 0: bytes[at] = UInt8(truncatingIfNeeded: random.next())
            case 1: bytes.insert(contentsOf: Array("\r\n".utf8), at: at)
            case 2: bytes.removeSubrange(at..<min(bytes.count, at + random.below(20)))
            case 3: bytes.insert(contentsOf: [UInt8](repeating: 0x41, count: random.below(3000)), at: at)
            case 4: bytes.insert(contentsOf: Array("X-H: v\r\n".utf8), at: at)
            default: bytes.insert(contentsOf: Array(": ".utf8), at: at)
            }
        }
        return bytes
    }
}

/// Checks that bytes a server sent are a well-formed sequence of HTTP/1.1 responses.
enum ResponseStreamValidator {
    static func validate(_ bytes: [UInt8], heads: [Bool]) -> String? {
        var heads = heads[...]
        var index = 0
        while index < bytes.count {
            guard let headEnd = find([13, 10, 13, 10], in: bytes, from: index) else {
                return "truncated head at \(index)"
            }
            let head = String(decoding: bytes[index..<headEnd], as: UTF8.self)
            let lines = head.components(separatedBy: "\r\n")
            guard lines[0].wholeMatch(of: /HTTP\/1\.1 [1-5]\d\d [A-Za-z \-]+/) != nil else {
                return "bad status line \(lines[0].debugDescription)"
            }
            index = headEnd + 4
            if lines[0].hasPrefix("HTTP/1.1 100 ") { continue }
            let isHead = heads.popFirst() ?? false
            let fields = lines.dropFirst().map { $0.split(separator: ":", maxSplits: 1).map(String.init) }
            guard fields.allSatisfy({ $0.count == 2 }) else { return "bad header in \(head.debugDescription)" }
            func field(_ name: String) -> String? {
                fields.first { $0[0].lowercased() == name }?[1].trimmingCharacters(in: .whitespaces)
            }
            if isHead { continue }
            if let length = field("content-length").flatMap(Int.init) {
                index += length
                if index > bytes.count { return "body shorter than Content-Length" }
            } else if field("transfer-encoding") == "chunked" {
                while true {
                    guard let lineEnd = find([13, 10], in: bytes, from: index),
                          let size = Int(String(decoding: bytes[index..<lineEnd], as: UTF8.self), radix: 16) else {
                        return "bad chunk size at \(index)"
                    }
                    index = lineEnd + 2 + size + 2
                    if index > bytes.count { return "truncated chunk" }
                    if size == 0 { break }
                }
            } else if field("connection") == "close" {
                return nil  // an HTTP/1.0 stream: the body runs until the connection closes
            } else {
                return "response without framing: \(head.debugDescription)"
            }
        }
        return nil
    }

    private static func find(_ needle: [UInt8], in bytes: [UInt8], from start: Int) -> Int? {
        guard bytes.count >= needle.count, start <= bytes.count - needle.count else { return nil }
        for index in start...(bytes.count - needle.count) where bytes[index..<(index + needle.count)].elementsEqual(needle) {
            return index
        }
        return nil
    }
}
