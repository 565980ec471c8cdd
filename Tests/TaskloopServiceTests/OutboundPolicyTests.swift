import Foundation
import Testing
import TaskloopTestSupport

/// The outbound address policy of `http` tasks and webhooks, for real: the built server runs in
/// a network namespace of the test's own, whose `lo` carries the addresses under test
/// (169.254.169.254, fd00:ec2::254, 10.1.2.3, ...) with an origin listening on each, and whose
/// /etc/hosts names some of them, so refusals are checked after a real resolution and a real
/// connection would arrive, yet no packet leaves this machine. The redirect rules need no
/// namespace: two origins on 127.0.0.1 are two origins.
@Suite(.serialized) struct OutboundPolicyTests {
    static let namespaceTrait = Testing.ConditionTrait.enabled(
        if: NetworkNamespace.isAvailable,
        "needs root, unshare, nsenter and ip: the address policy is tested in a network namespace of its own")

    static func json(_ value: Any) -> String {
        String(decoding: try! JSONSerialization.data(withJSONObject: value), as: UTF8.self)
    }

    @Test(namespaceTrait) func linkLocalAndMetadataAddressesAreRefusedWithoutAnyFlag() throws {
        let namespace = try NetworkNamespace(
            addresses: ["169.254.169.254/32", "fd00:ec2::254/128", "64:ff9b::a9fe:a9fe/128", "2002:a9fe:a9fe::1/128",
                        "10.1.2.3/32", "fec0::1/128"],
            hosts: ["metadata.test": "169.254.169.254", "metadata6.test": "fd00:ec2::254"])
        let origin = try namespace.origin(on: ["169.254.169.254", "fd00:ec2::254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1",
                                               "10.1.2.3", "fec0::1"])
        let server = try namespace.server([])
        let refused = [
            "http://169.254.169.254/literal", "http://metadata.test/by-name", "http://[::ffff:a9fe:a9fe]/mapped",
            "http://[fd00:ec2::254]/metadata6", "http://metadata6.test/metadata6-by-name", "http://[64:ff9b::a9fe:a9fe]/nat64",
            "http://[2002:a9fe:a9fe::1]/6to4", "http://10.1.2.3/redirect-to/http://169.254.169.254/after-redirect",
        ]
        for url in refused {
            let task = try server.run(url)
            let error = task["error"] as? [String: Any] ?? [:]
            #expect(task["state"] as? String == "failed" && error["code"] as? String == "address_refused", "\(url): \(task)")
            #expect((error["message"] as? String)?.contains("link-local") == true, "\(url): \(error)")
        }
        // Without --http-deny-private, private and site-local addresses are reachable: the
        // origin answers, and would have seen the refused requests.
        for url in ["http://10.1.2.3/private", "http://[fec0::1]/site-local"] {
            #expect(try server.run(url)["state"] as? String == "succeeded", "\(url)")
        }
        let paths = origin.requests.map { $0["path"] as? String ?? "" }
        #expect(paths.contains("/private") && paths.contains("/site-local"), "\(paths)")
        #expect(paths.contains("/redirect-to/http://169.254.169.254/after-redirect"), "\(paths)")
        for refusedPath in refused.map({ URL(string: $0)!.path }).filter({ !$0.hasPrefix("/redirect-to") }) + ["/after-redirect"] {
            #expect(!paths.contains(refusedPath), "\(refusedPath) reached the origin")
        }
    }

    @Test(namespaceTrait) func denyPrivateRefusesEveryInternalFormAfterResolution() throws {
        let namespace = try NetworkNamespace(
            addresses: ["10.1.2.3/32", "fec0::1/128", "2002:a01:203::1/128", "64:ff9b::a01:203/128", "100::1/128",
                        "192.0.3.1/32", "2606:2800::1/128"],
            hosts: ["internal.test": "10.1.2.3"])
        let origin = try namespace.origin(on: ["10.1.2.3", "fec0::1", "2002:a01:203::1", "64:ff9b::a01:203", "100::1",
                                               "192.0.3.1", "2606:2800::1"])
        let server = try namespace.server(["--http-deny-private"])
        let refused = [
            "http://10.1.2.3/literal", "http://internal.test/by-name", "http://[::ffff:a01:203]/mapped", "http://[fec0::1]/site-local",
            "http://[2002:a01:203::1]/6to4", "http://[64:ff9b::a01:203]/nat64", "http://[100::1]/discard",
        ]
        for url in refused {
            let task = try server.run(url)
            let error = task["error"] as? [String: Any] ?? [:]
            #expect(task["state"] as? String == "failed" && error["code"] as? String == "address_refused", "\(url): \(task)")
            #expect((error["message"] as? String)?.contains("--http-deny-private") == true, "\(url): \(error)")
        }
        for url in ["http://192.0.3.1/global", "http://[2606:2800::1]/global6"] {
            #expect(try server.run(url)["state"] as? String == "succeeded", "\(url)")
        }
        let paths = origin.requests.map { $0["path"] as? String ?? "" }
        #expect(paths.sorted() == ["/global", "/global6"], "\(paths)")
    }

    /// An entry that is the address itself lifts its refusal, whatever name led there; a name
    /// or wildcard entry lifts none, since whoever runs the name's DNS decides where it points.
    @Test(namespaceTrait) func allowHostsLiftsTheBanOnlyForTheAddressesItNames() throws {
        let namespace = try NetworkNamespace(addresses: ["169.254.169.254/32", "fd00:ec2::254/128", "10.1.2.3/32"],
                                             hosts: ["metadata.test": "169.254.169.254", "internal.test": "10.1.2.3"])
        let origin = try namespace.origin(on: ["169.254.169.254", "fd00:ec2::254", "10.1.2.3"])

        let named = try namespace.server(["--http-allow-hosts", "169.254.169.254,[fd00:0ec2:0::254]"])
        for url in ["http://169.254.169.254/named", "http://[fd00:ec2::254]/named6"] {
            #expect(try named.run(url)["state"] as? String == "succeeded", "\(url)")
        }

        let wildcard = try namespace.server(["--http-allow-hosts", "*.test,10.1.2.3", "--http-deny-private"])
        let byName = try wildcard.run("http://metadata.test/wildcard")
        #expect((byName["error"] as? [String: Any])?["code"] as? String == "address_refused", "\(byName)")
        // The named private address is reachable under --http-deny-private, by a name too.
        for url in ["http://10.1.2.3/named-private", "http://internal.test/named-private-by-name"] {
            #expect(try wildcard.run(url)["state"] as? String == "succeeded", "\(url)")
        }

        let paths = origin.requests.map { $0["path"] as? String ?? "" }
        #expect(paths.sorted() == ["/named", "/named-private", "/named-private-by-name", "/named6"], "\(paths)")
    }

    @Test(namespaceTrait) func webhooksToLinkLocalAddressesAreNeverDelivered() throws {
        let namespace = try NetworkNamespace(addresses: ["169.254.169.254/32", "10.1.2.3/32"])
        let origin = try namespace.origin(on: ["169.254.169.254", "10.1.2.3"])
        let server = try namespace.server([])
        func create(_ url: String) throws -> String {
            let created = try server.call("POST", "/webhooks", json: Self.json(["url": url, "events": ["task.created"]]))
            #expect(created.status == 201, "\(created.json)")
            return try #require(created.json["id"] as? String)
        }
        let metadata = try create("http://169.254.169.254/hook-metadata")
        let reachable = try create("http://10.1.2.3/hook-private")
        #expect(try server.call("POST", "/tasks", json: #"{"kind":"noop"}"#).status == 201)

        func firstDelivery(_ webhook: String) throws -> [String: Any]? {
            (try server.call("GET", "/webhooks/\(webhook)/deliveries").json["deliveries"] as? [[String: Any]])?.last
        }
        var refused: [String: Any]?
        try pollUntil("the metadata webhook's first attempt logged", timeout: 20, every: 20_000) {
            refused = try firstDelivery(metadata)
            return refused?["attempt"] as? Int == 1
        }
        #expect((refused?["error"] as? String)?.hasPrefix("address_refused") == true, "\(refused ?? [:])")
        try pollUntil("the private webhook's delivery", timeout: 20, every: 20_000) {
            try firstDelivery(reachable)?["state"] as? String == "delivered"
        }
        let paths = origin.requests.map { $0["path"] as? String ?? "" }
        #expect(paths == ["/hook-private"], "\(paths)")
    }

    /// Every header the task set is meant for the origin it named: a redirect elsewhere
    /// (another port, host or scheme) drops them all for that hop and the later ones, even one
    /// back to the first origin; a same-origin redirect keeps them.
    @Test func crossOriginRedirectsDropEveryHeaderTheTaskSet() throws {
        let first = try OriginServer()
        defer { first.stop() }
        let second = try OriginServer()
        defer { second.stop() }
        let service = try ServiceHarness()
        defer { try? service.stop() }
        let client = try service.client()
        let headers = ["X-Api-Key": "k", "Authorization": "Bearer t", "Cookie": "c=1", "Accept": "text/plain"]
        func fetch(_ url: String, method: String = "GET", body: Any? = nil) throws {
            var params: [String: Any] = ["url": url, "method": method, "headers": headers]
            params["body"] = body
            let id = try #require(try client.submit(Self.json(["kind": "http", "params": params]))["id"] as? String)
            _ = try client.waitForState(id, "succeeded")
        }
        func arrived(at origin: OriginServer, _ path: String) throws -> OriginServer.Request {
            try #require(origin.requests.value.last { $0.path == path }, "\(path) did not arrive")
        }
        func carriesNoneOfTheTasksHeaders(_ request: OriginServer.Request) -> Bool {
            request.headers["x-api-key"] == nil && request.headers["authorization"] == nil && request.headers["cookie"] == nil
                && request.headers["accept"] != "text/plain"
        }

        try fetch(first.url("/redirect-to/" + first.url("/echo/same")))
        let same = try arrived(at: first, "/echo/same")
        #expect(same.headers["x-api-key"] == "k" && same.headers["authorization"] == "Bearer t" && same.headers["accept"] == "text/plain")

        try fetch(first.url("/redirect-to/" + second.url("/echo/port")))
        #expect(first.requests.value.contains { $0.path.hasSuffix("/echo/port") && $0.headers["x-api-key"] == "k" })
        #expect(carriesNoneOfTheTasksHeaders(try arrived(at: second, "/echo/port")))

        try fetch(first.url("/redirect-to/http://localhost:\(first.port)/echo/host"))
        #expect(carriesNoneOfTheTasksHeaders(try arrived(at: first, "/echo/host")))

        try fetch(first.url("/redirect-to/" + second.url("/redirect-to/" + first.url("/echo/back"))))
        #expect(carriesNoneOfTheTasksHeaders(try arrived(at: first, "/echo/back")))

        // 307 sends the body on, and with it its type, which is not the task's to keep.
        try fetch(first.url("/redirect-307-to/" + second.url("/echo/body")), method: "POST", body: ["a": 1])
        let posted = try arrived(at: second, "/echo/body")
        #expect(carriesNoneOfTheTasksHeaders(posted))
        #expect(posted.method == "POST" && posted.body == Array(#"{"a":1}"#.utf8) && posted.headers["content-type"] == "application/json")
    }
}

/// A program's output, read all along by a thread of its own (a pipe nobody drains fills up).
final class ObservedProcess: @unchecked Sendable {
    let process = Process()
    private let printed = Locked("")
    private let input = Pipe()

    /// Started with its stdin open: a program that reads it to its end exits with the test.
    init(_ command: [String]) throws {
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        process.standardInput = input
        try process.run()
        let handle = output.fileHandleForReading
        Thread { [printed] in
            while case let chunk = handle.availableData, !chunk.isEmpty {
                printed.withLock { $0 += String(decoding: chunk, as: UTF8.self) }
            }
        }.start()
    }

    var lines: [String] { printed.value.split(separator: "\n").map(String.init) }

    func waitForLine(_ line: String, timeout: Double = 10) throws {
        do {
            try pollUntil("\(line.debugDescription) from \(process.arguments ?? [])", timeout: timeout, every: 5_000) {
                if lines.contains(line) { return true }
                guard process.exitStatus == nil else { throw ClientError.malformed("it exited: \(printed.value)") }
                return false
            }
        } catch let timeout as TestTimeout {
            throw TestTimeout(what: "\(timeout.what); it printed \(printed.value.debugDescription)")
        }
    }

    deinit {
        try? input.fileHandleForWriting.close()
        if process.exitStatus == nil { kill(process.processIdentifier, SIGKILL) }
    }
}

/// A network namespace of a test's own, with only `lo` (up, carrying the addresses under
/// test), and a mount namespace in which /etc/hosts is the test's. Programs join both through
/// `nsenter`. It lives as long as its holder, a shell waiting for its stdin to close.
final class NetworkNamespace {
    /// Root, `unshare`, `nsenter` and `ip`: tried once.
    static let isAvailable: Bool = {
        let probe = Process()
        probe.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        probe.arguments = ["--net", "--mount", "--", "/bin/sh", "-ec", "ip link set lo up; test -x /usr/bin/nsenter"]
        probe.standardOutput = FileHandle.nullDevice
        probe.standardError = FileHandle.nullDevice
        guard getuid() == 0, (try? probe.run()) != nil else { return false }
        return (try? probe.waitForExit("the namespace probe", timeout: 30)) == 0
    }()

    static let originScript = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Fixtures/namespace_origin.py").path

    private let holder: ObservedProcess
    private let hostsFile: URL
    /// Runs a program inside.
    let launcher: [String]

    /// `addresses` as `ip addr add` takes them (`169.254.169.254/32`); `hosts` maps names to
    /// addresses for the namespace's /etc/hosts.
    init(addresses: [String], hosts: [String: String] = [:]) throws {
        hostsFile = FileManager.default.temporaryDirectory.appendingPathComponent("namespace-hosts-\(UUID())")
        let entries = ["127.0.0.1 localhost", "::1 localhost"] + hosts.map { "\($0.value) \($0.key)" }
        try (entries.joined(separator: "\n") + "\n").write(to: hostsFile, atomically: true, encoding: .utf8)
        let setup = ["ip link set lo up"] + addresses.map { "ip addr add \($0) dev lo" }
            + ["mount --bind \(hostsFile.path) /etc/hosts", "echo ready", "exec cat >/dev/null"]
        holder = try ObservedProcess(["/usr/bin/unshare", "--net", "--mount", "--", "/bin/sh", "-ec", setup.joined(separator: "\n")])
        launcher = ["/usr/bin/nsenter", "--target", String(holder.process.processIdentifier), "--net", "--mount", "--"]
        try holder.waitForLine("ready")
    }

    deinit {
        try? FileManager.default.removeItem(at: hostsFile)
    }

    /// The scripted origin (Fixtures/namespace_origin.py) on port 80 of each address.
    func origin(on addresses: [String]) throws -> NamespaceOrigin {
        let origin = NamespaceOrigin(try ObservedProcess(launcher + ["/usr/bin/env", "python3", Self.originScript] + addresses))
        try origin.process.waitForLine("listening")
        return origin
    }

    /// The built `taskloop`, in memory, on a port of its own choosing.
    func server(_ arguments: [String]) throws -> NamespaceServer {
        let binary = try BinaryTests.RunningBinary(arguments: ["--durability", "memory", "--port", "0"] + arguments, launcher: launcher)
        let line = try binary.waitForLine(containing: "listening on http://127.0.0.1:")
        return NamespaceServer(namespace: self, binary: binary, port: try #require(BinaryTests.port(from: line)))
    }
}

struct NamespaceOrigin {
    let process: ObservedProcess

    init(_ process: ObservedProcess) { self.process = process }

    /// What it has been asked so far: {address, method, path, headers}.
    var requests: [[String: Any]] {
        process.lines.filter { $0.hasPrefix("{") }.compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }
}

/// The API of a server inside a namespace, called with curl from inside.
struct NamespaceServer {
    let namespace: NetworkNamespace
    let binary: BinaryTests.RunningBinary
    let port: Int

    func call(_ method: String, _ path: String, json: String? = nil) throws -> (status: Int, json: [String: Any]) {
        var command = namespace.launcher + ["/usr/bin/curl", "-sS", "--max-time", "20", "-X", method, "-w", "\n%{http_code}"]
        if let json { command += ["-H", "Content-Type: application/json", "--data-binary", json] }
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: command[0])
        curl.arguments = Array(command.dropFirst()) + ["http://127.0.0.1:\(port)\(path)"]
        // Into a file, not a pipe: a process another test starts at the same moment can inherit
        // a pipe's write end and hold its end of file back for as long as it lives.
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("curl-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        FileManager.default.createFile(atPath: file, contents: nil)
        let output = try FileHandle(forWritingTo: URL(fileURLWithPath: file))
        curl.standardOutput = output
        try curl.run()
        try output.close()
        // Ends within its --max-time.
        _ = try curl.waitForExit("curl \(method) \(path)", timeout: 60)
        let printed = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
        guard let newline = printed.lastIndex(of: "\n"), let status = Int(printed[printed.index(after: newline)...]),
              let body = try? JSONSerialization.jsonObject(with: Data(printed[..<newline].utf8)) as? [String: Any] else {
            throw ClientError.malformed("\(method) \(path) answered \(printed.debugDescription)")
        }
        return (status, body)
    }

    /// Submits an `http` task fetching `url` and returns it once it has ended.
    func run(_ url: String) throws -> [String: Any] {
        let submitted = try call("POST", "/tasks", json: OutboundPolicyTests.json(["kind": "http", "params": ["url": url]]))
        let id = try #require(submitted.json["id"] as? String, "\(submitted.json)")
        var task: [String: Any] = [:]
        // The server holds each poll until the task ends (`?wait=`).
        try pollUntil("task \(id) (\(url)) to end", timeout: 20, every: 0) {
            task = try call("GET", "/tasks/\(id)?wait=5").json
            return ["succeeded", "failed", "cancelled"].contains(task["state"] as? String ?? "")
        }
        return task
    }
}
