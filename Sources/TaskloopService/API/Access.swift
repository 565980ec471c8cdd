import Glibc
import TaskloopHTTP

/// What a token may do. Each role includes the ones before it.
public enum AccessRole: String, Sendable, Comparable, CaseIterable {
    /// GET and HEAD, event streams included.
    case read
    /// Reads, and what a worker reports: lease, heartbeat, release, progress, complete, fail.
    case worker
    /// Everything.
    case admin

    private var rank: Int {
        switch self {
        case .read: 0
        case .worker: 1
        case .admin: 2
        }
    }

    public static func < (lhs: AccessRole, rhs: AccessRole) -> Bool { lhs.rank < rhs.rank }
}

/// One bearer token and what it may do.
public struct AccessToken: Sendable, Equatable {
    public let secret: [UInt8]
    public let role: AccessRole

    /// Shorter tokens are refused at start: a guessable token is no door at all.
    public static let minimumLength = 16

    public init(_ secret: String, role: AccessRole = .admin) throws(AccessError) {
        let bytes = Array(secret.utf8)
        guard !bytes.contains(where: { $0 < 0x21 || $0 > 0x7E }) else {
            throw AccessError("a token must be printable ASCII without spaces")
        }
        guard bytes.count >= Self.minimumLength else {
            throw AccessError("a token must be at least \(Self.minimumLength) characters long (this one has \(bytes.count))")
        }
        self.secret = bytes
        self.role = role
    }

    /// `--auth-token-file`: one token per line, optionally followed by its role (`admin`, the
    /// default, `read` or `worker`); blank lines and lines starting with `#` are skipped. Errors
    /// name the line, never the token.
    public static func parseFile(_ text: String) throws(AccessError) -> [AccessToken] {
        var tokens: [AccessToken] = []
        for (index, line) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard let first = words.first, !first.hasPrefix("#") else { continue }
            guard words.count <= 2 else {
                throw AccessError("line \(index + 1): expected a token and at most one role")
            }
            var role = AccessRole.admin
            if words.count == 2 {
                guard let named = AccessRole(rawValue: String(words[1])) else {
                    throw AccessError("line \(index + 1): the role must be admin, read or worker")
                }
                role = named
            }
            do {
                tokens.append(try AccessToken(String(first), role: role))
            } catch {
                throw AccessError("line \(index + 1): \(error.reason)")
            }
        }
        return tokens
    }

    /// Reads and parses the token file; it must hold at least one token.
    public static func readFile(_ path: String) throws(AccessError) -> [AccessToken] {
        guard let handle = fopen(path, "r") else {
            throw AccessError("cannot read the token file \(path): \(String(cString: strerror(errno)))")
        }
        defer { fclose(handle) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4_096)
        while true {
            let count = fread(&chunk, 1, chunk.count, handle)
            bytes.append(contentsOf: chunk[..<count])
            guard bytes.count <= 1 << 20 else { throw AccessError("the token file \(path) is larger than 1 MiB") }
            if count < chunk.count { break }
        }
        guard ferror(handle) == 0 else { throw AccessError("cannot read the token file \(path)") }
        let tokens: [AccessToken]
        do {
            tokens = try parseFile(String(decoding: bytes, as: UTF8.self))
        } catch {
            throw AccessError("the token file \(path), \(error.reason)")
        }
        guard !tokens.isEmpty else { throw AccessError("the token file \(path) holds no token") }
        return tokens
    }
}

public struct AccessError: Error, CustomStringConvertible, Sendable {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// Who may ask what, decided on a request's head before its body is read (contract v3, "Safe by
/// default"): the Host a browser was sent to (against DNS rebinding), where a state-changing
/// request comes from (against other sites' pages and forms), the bearer token and its role,
/// and CORS for the origins an operator named.
///
/// Threading: loop thread only; `tokens` changes there too (a SIGHUP's re-read hops to the loop).
struct AccessPolicy {
    /// Empty: no token is asked for, and only loopback Host names are answered.
    var tokens: [AccessToken]
    /// `--allowed-hosts`, lowercased: `name`, `name:port` or `*.domain`.
    let allowedHosts: [String]
    /// `--allowed-origins`, lowercased, as browsers send them (`https://app.example.com`).
    let allowedOrigins: [String]

    var requiresToken: Bool { !tokens.isEmpty }

    /// The verdict on one request head, before routing (`route` is what the router found, if
    /// anything). Nil: admitted.
    func refusal(of request: HTTPRequest, route: Route?) -> APIProblem? {
        let headers = request.headers
        if !requiresToken || !allowedHosts.isEmpty, headers.firstValue(of: "Host", satisfies: Self.isLoopbackHost) == false,
           let host = headers["Host"], !isAllowedHost(host) {
            return APIProblem(.misdirectedRequest, detail: "This server does not answer for the host \(host); "
                + "name it in --allowed-hosts to serve it.", code: "host_not_allowed")
        }
        if request.method.changesState {
            if let origin = crossOrigin(of: request), !allowedOrigins.contains(origin.lowercased()) {
                return APIProblem(.forbidden, detail: "A request from the web page at \(origin) may not change anything here; "
                    + "list that origin in --allowed-origins to let it.", code: "cross_origin")
            }
            if request.method == .POST, headers.firstValue(of: "Content-Type", satisfies: BodyReader.isJSON) == false,
               let type = headers["Content-Type"], Self.isFormType(type) {
                return APIProblem(.unsupportedMediaType, detail: "Send the body as application/json, not \(type).")
            }
        }
        guard requiresToken, route?.isPublic != true, !isPreflight(request) else { return nil }
        guard let given = headers["Authorization"].flatMap(Self.bearerCredentials), let token = token(matching: given) else {
            return APIProblem(.unauthorized, detail: "This server requires a bearer token.", headers: ["WWW-Authenticate": "Bearer"])
        }
        let needed = route?.role ?? .read
        guard token.role >= needed else {
            return APIProblem(.forbidden, detail: "A \(token.role.rawValue) token may not do this; it needs the \(needed.rawValue) role.",
                              code: "forbidden_for_role")
        }
        return nil
    }

    /// What the caller of an admitted request may do: its token's role, or everything when
    /// no token is asked for.
    func role(of request: HTTPRequest) -> AccessRole {
        guard requiresToken else { return .admin }
        return request.headers["Authorization"].flatMap(Self.bearerCredentials).flatMap(token(matching:))?.role ?? .read
    }

    /// The fields every answer to an allowed origin carries, so its page may read them.
    func corsFields(for request: HTTPRequest) -> HTTPHeaders? {
        guard !allowedOrigins.isEmpty, let origin = request.headers["Origin"],
              allowedOrigins.contains(origin.lowercased()) else { return nil }
        return ["Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Expose-Headers": "Location, Event-Seq, Idempotent-Replayed, Retry-After, WWW-Authenticate"]
    }

    /// A CORS preflight from an allowed origin: answered without a token.
    func isPreflight(_ request: HTTPRequest) -> Bool {
        request.method == .OPTIONS && request.headers.contains("Access-Control-Request-Method")
            && corsFields(for: request) != nil
    }

    static func preflightAnswer() -> HTTPResponse {
        HTTPResponse(status: .noContent, headers: [
            "Access-Control-Allow-Methods": "GET, HEAD, POST, PATCH, DELETE",
            "Access-Control-Allow-Headers": "Authorization, Content-Type, Idempotency-Key, Last-Event-ID",
            "Access-Control-Max-Age": "600",
        ])
    }

    /// One of `--allowed-hosts` (the loopback names, which every host admits, are matched on
    /// the header's bytes before this is asked).
    func isAllowedHost(_ host: String) -> Bool {
        let value = host.lowercased()
        let (name, port) = Self.splitHost(value)
        return allowedHosts.contains { pattern in
            if pattern.hasPrefix("*.") { return name.hasSuffix(pattern.dropFirst()) }
            return pattern == name || (port != nil && pattern == value)
        }
    }

    /// `localhost`, `127.0.0.1` or `[::1]`, any case, with or without a port.
    static func isLoopbackHost(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        var end = bytes.count
        if let colon = bytes.lastIndex(of: UInt8(ascii: ":")), bytes.first != UInt8(ascii: "[") || bytes[colon - 1] == UInt8(ascii: "]") {
            end = colon
        }
        let name = UnsafeBufferPointer(rebasing: bytes[..<end])
        let localhost = name.count == 9 && zip(name, "localhost".utf8).allSatisfy { ($0 &- 65 < 26 ? $0 | 0x20 : $0) == $1 }
        return localhost || name.elementsEqual("127.0.0.1".utf8) || name.elementsEqual("[::1]".utf8)
    }

    /// `name` and `port` of a Host value; an IPv6 literal keeps its brackets.
    static func splitHost(_ value: String) -> (name: Substring, port: Substring?) {
        let start = value.startIndex
        let searchFrom = value.hasPrefix("[") ? (value.firstIndex(of: "]") ?? start) : start
        guard let colon = value[searchFrom...].lastIndex(of: ":") else { return (value[...], nil) }
        return (value[..<colon], value[value.index(after: colon)...])
    }

    /// The origin of a browser's request from another site, or nil when it is the server's own
    /// page (or no browser at all: curl sends neither field). `Sec-Fetch-Site` says it outright;
    /// else an `Origin` whose host and port are not the request's `Host`.
    func crossOrigin(of request: HTTPRequest) -> String? {
        let origin = request.headers["Origin"]
        if let site = request.headers["Sec-Fetch-Site"]?.lowercased(), site == "cross-site" || site == "same-site" {
            return origin ?? site
        }
        guard let origin else { return nil }
        let value = origin.lowercased()
        guard let host = request.headers["Host"]?.lowercased(), let colon = value.firstIndex(of: ":"),
              value[colon...].hasPrefix("://") else { return origin }
        let scheme = value[..<colon]
        let authority = value[value.index(colon, offsetBy: 3)...]
        if authority == host { return nil }
        // `Host: example.com` and `Origin: https://example.com:443` name the same place.
        let defaultPort = scheme == "https" ? ":443" : scheme == "http" ? ":80" : nil
        if let defaultPort, authority == host + defaultPort || authority + defaultPort == host { return nil }
        return origin
    }

    /// What an HTML form can send without CORS's consent.
    static func isFormType(_ contentType: String) -> Bool {
        let mediaType = String(contentType.lowercased().prefix { $0 != ";" }.filter { $0 != " " && $0 != "\t" })
        return mediaType == "application/x-www-form-urlencoded" || mediaType == "multipart/form-data" || mediaType == "text/plain"
    }

    /// The token among the known ones that `given` is; every one is compared in full, so the
    /// time taken says nothing about how much of which token was right.
    func token(matching given: [UInt8]) -> AccessToken? {
        var found: AccessToken?
        for token in tokens where Self.constantTimeEqual(given, token.secret) { found = token }
        return found
    }

    /// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
    /// (RFC 9110 section 11.1), and one or more spaces may follow it.
    static func bearerCredentials(_ value: String) -> [UInt8]? {
        let bytes = Array(value.utf8)
        guard bytes.count > 7, Array(bytes[..<6]).equalsIgnoringASCIICase("bearer"), bytes[6] == UInt8(ascii: " ") else {
            return nil
        }
        let token = bytes[7...].drop { $0 == UInt8(ascii: " ") }
        return token.isEmpty ? nil : Array(token)
    }

    /// Compares without an early exit, so the time taken says nothing about the token.
    static func constantTimeEqual(_ given: [UInt8], _ expected: [UInt8]) -> Bool {
        var difference = UInt8(given.count == expected.count ? 0 : 1)
        for index in expected.indices {
            difference |= expected[index] ^ (index < given.count ? given[index] : 0)
        }
        return difference == 0
    }
}

extension HTTPMethod {
    /// The methods a browser's page must not use across sites (RFC 9110's unsafe methods that
    /// this API serves).
    var changesState: Bool {
        self == .POST || self == .PUT || self == .PATCH || self == .DELETE
    }
}
