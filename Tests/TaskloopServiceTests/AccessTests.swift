import Foundation
import Testing
import TaskloopHTTP
@testable import TaskloopService
import TaskloopTestSupport

/// Contract v3 "Safe by default", the ways in: tokens and roles, the token decided on the head
/// before any body, Host checks against DNS rebinding, other sites' pages and forms, CORS for
/// named origins. Each attacks the running service the way the reports did.
@Suite struct AccessTests {
    static let admin = "admin-token-0123456789"
    static let reader = "read-token-0123456789"
    static let workerToken = "worker-token-0123456789"

    /// A token file with one token of each role, and a service reading it.
    static func serviceWithRoles() throws -> (ServiceHarness, String) {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID())").path
        try "# comment\n\(admin)\n\(reader) read\n\n\(workerToken)   worker\n".write(toFile: file, atomically: true, encoding: .utf8)
        let service = try ServiceHarness { $0.authTokenFile = file }
        return (service, file)
    }

    static func bearer(_ token: String) -> [String: String] { ["Authorization": "Bearer \(token)"] }

    @Test func rolesDecideWhatATokenMayDo() throws {
        let (service, file) = try Self.serviceWithRoles()
        defer { try? FileManager.default.removeItem(atPath: file) }
        let client = try service.client()
        let task = try client.call("POST", "/tasks", json: #"{"kind":"external"}"#, headers: Self.bearer(Self.admin))
        #expect(task.status == 201)
        let id = try #require(task.json["id"] as? String)

        // read: every GET, nothing else.
        #expect(try client.call("GET", "/tasks/\(id)", headers: Self.bearer(Self.reader)).status == 200)
        #expect(try client.call("GET", "/metrics", headers: Self.bearer(Self.reader)).status == 200)
        let refused = try client.call("DELETE", "/tasks/\(id)", headers: Self.bearer(Self.reader))
        #expect(refused.status == 403 && refused.json["code"] as? String == "forbidden_for_role")
        #expect(try client.call("POST", "/tasks/\(id)/progress", json: #"{"fraction":0.5}"#, headers: Self.bearer(Self.reader)).status == 403)

        // worker: reports and leases, not submissions or cancels.
        #expect(try client.call("POST", "/tasks/\(id)/progress", json: #"{"fraction":0.5}"#, headers: Self.bearer(Self.workerToken)).status == 200)
        #expect(try client.call("POST", "/queues/default/lease", json: #"{"worker":"w"}"#, headers: Self.bearer(Self.workerToken)).status == 409)
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#, headers: Self.bearer(Self.workerToken)).status == 403)
        #expect(try client.call("PATCH", "/queues/default", json: #"{"paused":true}"#, headers: Self.bearer(Self.workerToken)).status == 403)
        #expect(try client.call("GET", "/tasks/\(id)", headers: Self.bearer(Self.workerToken)).json["state"] as? String == "running")

        for (token, role) in [(Self.admin, "admin"), (Self.reader, "read"), (Self.workerToken, "worker")] {
            let whoami = try client.call("GET", "/whoami", headers: Self.bearer(token)).json
            #expect(whoami["role"] as? String == role && whoami["token_required"] as? Bool == true)
        }
        #expect(try client.call("GET", "/whoami").status == 401)

        // Nothing a refused call asked for happened.
        let queue = try client.call("GET", "/queues/default", headers: Self.bearer(Self.admin)).json
        #expect(queue["paused"] as? Bool == false)
        #expect(try client.call("DELETE", "/tasks/\(id)", headers: Self.bearer(Self.admin)).status == 202)
        try service.stop()
    }

    @Test func shortTokensAndBadTokenFilesAreRefusedAtStart() throws {
        #expect(throws: AccessError.self) { _ = try AccessToken("short-token") }
        #expect(throws: AccessError.self) { _ = try AccessToken.parseFile("\(Self.admin) owner\n") }
        #expect(throws: AccessError.self) { _ = try AccessToken.parseFile("tooshort read\n") }
        let parsed = try AccessToken.parseFile("\(Self.admin)\r\n\(Self.reader) read\r\n")
        #expect(parsed.map(\.role) == [.admin, .read])
        // The error names the line, never the token.
        do {
            _ = try AccessToken.parseFile("\(Self.admin)\nabc-secret-xyz read\n")
            Issue.record("a 14-character token was accepted")
        } catch {
            #expect(error.reason.contains("line 2") && !error.reason.contains("abc-secret-xyz"))
        }
        #expect(throws: (any Error).self) { _ = try ServiceHarness { $0.authToken = "s3cret" } }
    }

    /// The head decides: no `100 Continue`, no waiting for (or buffering) a body, and the
    /// connection is closed.
    @Test func aRequestWithoutTheTokenIsRefusedOnItsHead() throws {
        let service = try ServiceHarness { $0.authToken = Self.admin; $0.http.parserLimits.maxBodyBytes = 64 << 20 }
        for expect in [true, false] {
            let raw = try RawClient(port: service.port)
            try raw.send("POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                + "Content-Length: 50000000\r\n\(expect ? "Expect: 100-continue\r\n" : "")\r\n")
            let response = try raw.readResponse(timeout: 5)
            #expect(response.status == 401, "expect: \(expect)")
            #expect(response.header("Connection") == "close")
            #expect(try raw.readUntilClosed(timeout: 5).isEmpty)
        }
        // A wrong token too; and a known token of a lesser role.
        let raw = try RawClient(port: service.port)
        try raw.send("POST /tasks HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(Self.admin)x\r\nContent-Length: 900\r\n\r\n")
        #expect(try raw.readResponse(timeout: 5).status == 401)
        // With the token, the same head is served once its body arrives.
        let served = try RawClient(port: service.port)
        let body = #"{"kind":"noop"}"#
        try served.send("POST /tasks HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(Self.admin)\r\n"
            + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nExpect: 100-continue\r\n\r\n")
        #expect(try served.readResponse(timeout: 5).status == 100)
        try served.send(body)
        #expect(try served.readResponse(timeout: 5).status == 201)
        try service.stop()
    }

    @Test func withoutATokenOnlyLoopbackHostsAreAnswered() throws {
        let service = try ServiceHarness { $0.allowedHosts = ["taskloop.internal", "*.example.org", "api.example.com:8443"] }
        let client = try service.client()
        for host in ["localhost", "localhost:\(service.port)", "127.0.0.1", "127.0.0.1:9", "[::1]", "[::1]:8080", "LocalHost",
                     "taskloop.internal", "taskloop.internal:80", "a.example.org", "api.example.com:8443"] {
            #expect(try client.call("GET", "/healthz", headers: ["Host": host]).status == 200, "\(host)")
        }
        // A rebinding page's requests carry its own name: refused, /healthz and the API alike.
        for host in ["attacker.example", "attacker.example:\(service.port)", "localhost.attacker.example", "127.0.0.1.nip.io",
                     "example.org", "api.example.com", "api.example.com:443", "10.0.0.5"] {
            let refused = try client.call("GET", "/tasks", headers: ["Host": host])
            #expect(refused.status == 421 && refused.json["code"] as? String == "host_not_allowed", "\(host)")
            #expect(try client.call("GET", "/healthz", headers: ["Host": host]).status == 421, "\(host)")
            #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#, headers: ["Host": host]).status == 421)
        }
        #expect((try client.call("GET", "/tasks").json["tasks"] as? [Any])?.isEmpty == true, "a refused submission created nothing")
        try service.stop()
    }

    @Test func withATokenAnyHostIsAnswered() throws {
        let service = try ServiceHarness { $0.authToken = Self.admin }
        let client = try service.client()
        let answer = try client.call("GET", "/tasks", headers: ["Host": "taskloop.example.com"].merging(Self.bearer(Self.admin)) { $1 })
        #expect(answer.status == 200)
        try service.stop()
    }

    /// Every state-changing route, asked from another site's page: refused with 403 whatever
    /// the token, and nothing changes.
    @Test(arguments: [nil, admin])
    func otherSitesCannotChangeAnything(token: String?) throws {
        let service = try ServiceHarness { $0.authToken = token }
        let client = try service.client()
        let auth = token.map(Self.bearer) ?? [:]
        let task = try client.call("POST", "/tasks", json: #"{"kind":"sleep","params":{"duration_ms":60000}}"#, headers: auth)
        let id = try #require(task.json["id"] as? String)
        let routes = service.onLoop { application in application.routeTable.filter { $0.method.changesState }.map { ($0.method, $0.pattern) } }
        #expect(routes.count >= 15)
        let attacks: [[String: String]] = [
            ["Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"],
            ["Origin": "http://evil.example"],
            ["Origin": "null"],
            ["Sec-Fetch-Site": "cross-site"],
            ["Origin": "http://sub.localhost:\(service.port)", "Sec-Fetch-Site": "same-site"],
            ["Origin": "http://localhost:1"],
        ]
        for (method, pattern) in routes {
            let path = pattern.replacingOccurrences(of: "{id}", with: id).replacingOccurrences(of: "{name}", with: "default")
            for attack in attacks {
                for contentType in ["application/json", "text/plain"] {
                    let refused = try client.call(method.description, path, json: "{}", contentType: contentType,
                                                  headers: attack.merging(auth) { $1 })
                    #expect(refused.status == 403 && refused.json["code"] as? String == "cross_origin",
                            "\(method) \(path) \(attack) answered \(refused.status)")
                }
            }
        }
        // A plain HTML form needs no body and no JSON: POST /queues/default/cancel.
        let form = try client.call("POST", "/queues/default/cancel", json: "", contentType: "application/x-www-form-urlencoded",
                                   headers: auth)
        #expect(form.status == 415)
        for type in ["multipart/form-data; boundary=x", "text/plain;charset=UTF-8", "Application/X-WWW-Form-Urlencoded"] {
            #expect(try client.call("POST", "/tasks", json: "", contentType: type, headers: auth).status == 415, "\(type)")
        }
        #expect(try client.call("GET", "/tasks/\(id)", headers: auth).json["state"] as? String == "running")
        #expect(try client.call("GET", "/queues/default", headers: auth).json["paused"] as? Bool == false)

        // The server's own page, and clients that are no browser, go through.
        let own = try client.call("PATCH", "/queues/default", json: #"{"max_concurrency":3}"#, headers: [
            "Host": "localhost:8080", "Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-origin",
        ].merging(auth) { $1 })
        #expect(own.status == 200)
        #expect(try client.call("POST", "/queues/default/cancel", headers: auth).json["cancelled"] as? Int == 1)
        try service.stop()
    }

    @Test func namedOriginsGetRealCORS() throws {
        let origin = "https://app.example.com"
        let service = try ServiceHarness { $0.authToken = Self.admin; $0.allowedOrigins = [origin] }
        let client = try service.client()
        // The preflight carries no token.
        let preflight = try client.call("OPTIONS", "/tasks", headers: [
            "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type",
        ])
        #expect(preflight.status == 204)
        #expect(preflight.header("Access-Control-Allow-Origin") == origin)
        #expect(preflight.header("Access-Control-Allow-Headers")?.contains("Authorization") == true)
        #expect(preflight.header("Access-Control-Allow-Methods")?.contains("POST") == true)
        let created = try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#,
                                      headers: ["Origin": origin, "Sec-Fetch-Site": "cross-site"].merging(Self.bearer(Self.admin)) { $1 })
        #expect(created.status == 201 && created.header("Access-Control-Allow-Origin") == origin)
        #expect(created.header("Vary") == "Origin" && created.header("Access-Control-Expose-Headers")?.contains("Location") == true)
        // Errors carry it too, so the page can read why.
        let missing = try client.call("GET", "/tasks/nope", headers: ["Origin": origin].merging(Self.bearer(Self.admin)) { $1 })
        #expect(missing.status == 404 && missing.header("Access-Control-Allow-Origin") == origin)

        // Any other origin: no CORS, and no change.
        let other = try client.call("OPTIONS", "/tasks", headers: ["Origin": "https://evil.example", "Access-Control-Request-Method": "POST"])
        #expect(other.status == 401 && other.header("Access-Control-Allow-Origin") == nil)
        let refused = try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#,
                                      headers: ["Origin": "https://evil.example"].merging(Self.bearer(Self.admin)) { $1 })
        #expect(refused.status == 403 && refused.header("Access-Control-Allow-Origin") == nil)
        try service.stop()
    }

    @Test func theStreamOfAnAllowedOriginCarriesCORS() throws {
        let origin = "http://dashboard.example:3000"
        let service = try ServiceHarness { $0.allowedOrigins = [origin] }
        let raw = try RawClient(port: service.port)
        try raw.send("GET /events HTTP/1.1\r\nHost: localhost\r\nOrigin: \(origin)\r\n\r\n")
        let head = try raw.readUntil { String(decoding: $0, as: UTF8.self).contains("\r\n\r\n") }
        let text = String(decoding: head, as: UTF8.self)
        #expect(text.hasPrefix("HTTP/1.1 200") && text.contains("Access-Control-Allow-Origin: \(origin)\r\n"))
        try service.stop()
    }

    @Test func databaseURLsAreLoggedWithoutTheirPassword() {
        let forms = [
            ("postgres://app:pw-1@db.example:5432/taskloop", "postgres://app:***@db.example:5432/taskloop"),
            ("postgresql://app:p%40w@db/t?sslmode=require", "postgresql://app:***@db/t?sslmode=require"),
            ("postgres://app@db/t?password=pw-2&sslmode=require", "postgres://app@db/t?password=***&sslmode=require"),
            ("host=db user=app password=pw-3 dbname=t", "host=db user=app password=*** dbname=t"),
            ("host=db PASSWORD = 'p w \\' 4' dbname=t", "host=db password=*** dbname=t"),
            ("postgres:///t?host=/run/postgresql", "postgres:///t?host=/run/postgresql"),
        ]
        for (url, logged) in forms {
            #expect(TaskloopApplication.redacted(url) == logged, "\(url)")
        }
    }
}
