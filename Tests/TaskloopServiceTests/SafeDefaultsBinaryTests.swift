import Foundation
import Testing
import TaskloopTestSupport

/// Contract v3 "Safe by default" through the built binary, as an operator meets it: what it
/// refuses to start with, tokens re-read on SIGHUP, memory under clients that declare huge
/// bodies without a token, and a deploy (SIGTERM) that leaves outside work alone.
@Suite(.serialized, .inTheDefaultStageOnly) struct SafeDefaultsBinaryTests {
    typealias RunningBinary = BinaryTests.RunningBinary
    static let token = "binary-admin-token-0123456789"

    static func start(_ arguments: [String], environment: [String: String] = [:]) throws -> (RunningBinary, Int) {
        let binary = try RunningBinary(arguments: ["--port", "0"] + arguments, environment: environment)
        let line = try binary.waitForLine(containing: "listening on http://")
        return (binary, try #require(BinaryTests.port(from: line)))
    }

    @Test func aNonLoopbackAddressWithoutATokenIsRefused() throws {
        let refused = try RunningBinary(arguments: ["--host", "0.0.0.0", "--port", "0", "--durability", "memory"])
        #expect(try refused.waitForExit() == 64)
        for flag in ["--auth-token", "--auth-token-file", "--insecure-no-auth"] {
            #expect(refused.printed.contains(flag), "the refusal names \(flag): \(refused.printed)")
        }
        // A short token is no token.
        let short = try RunningBinary(arguments: ["--host", "0.0.0.0", "--port", "0", "--durability", "memory", "--auth-token", "abc"])
        #expect(try short.waitForExit() == 64)
        #expect(short.printed.contains("at least 16"))

        // On purpose, it starts, and says what it means.
        let (open, _) = try Self.start(["--host", "0.0.0.0", "--durability", "memory", "--insecure-no-auth"])
        _ = try open.waitForLine(containing: "without a token")
        #expect(try open.stop() == 0)
    }

    /// A server others can reach refuses `http` tasks into private addresses unless told
    /// otherwise; on loopback the default stays open (a laptop's own services).
    @Test func listeningBeyondLoopbackDeniesPrivateAddressesByDefault() throws {
        let target = "http://127.0.0.1:9/never"
        let (reachable, port) = try Self.start(["--host", "0.0.0.0", "--durability", "memory", "--auth-token", Self.token])
        let client = try APIClient(port: port)
        let auth = ["Authorization": "Bearer \(Self.token)"]
        let id = try #require(try client.call("POST", "/tasks", json: #"{"kind":"http","params":{"url":"\#(target)"}}"#, headers: auth)
            .json["id"] as? String)
        let ended = try client.call("GET", "/tasks/\(id)?wait=10", headers: auth).json
        let error = ended["error"] as? [String: Any]
        #expect(ended["state"] as? String == "failed")
        #expect(error?["code"] as? String == "address_refused", "refused by the policy, not by the closed port: \(String(describing: error))")
        #expect(try reachable.stop() == 0)

        let (local, localPort) = try Self.start(["--durability", "memory"])
        let localClient = try APIClient(port: localPort)
        let localID = try #require(try localClient.submit(#"{"kind":"http","params":{"url":"\#(target)"}}"#)["id"] as? String)
        let localEnded = try localClient.call("GET", "/tasks/\(localID)?wait=10").json
        #expect((localEnded["error"] as? [String: Any])?["code"] as? String == "connect_failed", "\(localEnded)")
        #expect(try local.stop() == 0)
    }

    @Test func theTokenFileIsReadAgainOnSIGHUP() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let first = "first-token-0123456789", second = "second-token-0123456789"
        try "\(first)\n".write(toFile: file, atomically: true, encoding: .utf8)
        let (binary, port) = try Self.start(["--durability", "memory", "--auth-token-file", file])
        let client = try APIClient(port: port)
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearer \(first)"]).status == 200)
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearer \(second)"]).status == 401)

        try "\(second) read\n".write(toFile: file, atomically: true, encoding: .utf8)
        kill(binary.process.processIdentifier, SIGHUP)
        try pollUntil("the second token to be taken") {
            try client.call("GET", "/tasks", headers: ["Authorization": "Bearer \(second)"]).status == 200
        }
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearer \(first)"]).status == 401)
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#, headers: ["Authorization": "Bearer \(second)"]).status == 403)

        // A broken file changes nothing: the tokens in use stay.
        try "too-short read\n".write(toFile: file, atomically: true, encoding: .utf8)
        kill(binary.process.processIdentifier, SIGHUP)
        _ = try binary.waitForLine(containing: "auth tokens not re-read")
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearer \(second)"]).status == 200)
        // Neither the log nor the answers ever show a token.
        #expect(!binary.printed.contains(first) && !binary.printed.contains(second) && !binary.printed.contains("too-short"))
        #expect(try binary.stop() == 0)
    }

    /// Fifty clients without the token each declare a 100 MB body and start sending it: the
    /// server answers each head with 401 and holds none of it.
    @Test func bodiesOfClientsWithoutTheTokenAreNeverBuffered() throws {
        let (binary, port) = try Self.start(["--durability", "memory", "--auth-token", Self.token,
                                             "--max-body-bytes", "200000000", "--max-connections", "1000"])
        let pid = binary.process.processIdentifier
        let before = try Self.residentBytes(of: pid)
        let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 1 << 20)
        var clients: [RawClient] = []
        for _ in 0..<50 {
            let client = try RawClient(port: port)
            try client.send("POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
            // Up to 4 MB of body each, for as long as the server takes it.
            for _ in 0..<4 { if (try? client.send(chunk)) == nil { break } }
            clients.append(client)
        }
        for client in clients {
            #expect(try client.readResponse(timeout: 10).status == 401)
        }
        let after = try Self.residentBytes(of: pid)
        #expect(after - before < 40 << 20, "resident memory grew by \((after - before) >> 20) MiB")
        #expect(try binary.stop() == 0)
    }

    /// A deploy does not wait for an `external` task's worker, nor take its work back: after the
    /// restart the task is still running with the progress the worker reported.
    @Test func sigtermLeavesExternalWorkRunning() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("external-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (first, port) = try Self.start(["--data-dir", directory, "--shutdown-grace-seconds", "30"])
        let client = try APIClient(port: port)
        let id = try #require(try client.submit(#"{"kind":"external"}"#)["id"] as? String)
        #expect(try client.call("POST", "/tasks/\(id)/progress", json: #"{"fraction":0.25,"message":"a quarter"}"#).status == 200)
        kill(first.process.processIdentifier, SIGTERM)
        // Well inside the 30 s grace: nothing in the process was running.
        #expect(try first.waitForExit(timeout: 8) == 0)

        let (second, secondPort) = try Self.start(["--data-dir", directory])
        let again = try APIClient(port: secondPort)
        let task = try again.task(id)
        #expect(task["state"] as? String == "running" && task["attempt"] as? Int == 1)
        let progress = task["progress"] as? [String: Any]
        #expect(progress?["fraction"] as? Double == 0.25 && progress?["message"] as? String == "a quarter")
        #expect(try again.call("POST", "/tasks/\(id)/complete", json: #"{"result":{"ok":true}}"#).json["state"] as? String == "succeeded")
        #expect(try second.stop() == 0)
    }

    static func residentBytes(of pid: Int32) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") })
        return try #require(Int(line.split(separator: " ")[1])) * 1024
    }
}
