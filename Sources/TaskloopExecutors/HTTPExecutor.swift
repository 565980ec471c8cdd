import Glibc
import TaskloopBytes
import TaskloopEngine
import TaskloopHTTPClient
import TaskloopJSON

/// `http`: `{method = "GET", url, headers?, secret_headers?, body?, expect_status? = 2xx,
/// max_response_bytes? = 1 MiB, follow_redirects? = true, connect_timeout_ms? = 30000}`. Performs the request on the
/// loop through `HTTPClient`; progress is bytes received of Content-Length; the result carries
/// status, headers, the kept body (UTF-8 or base64), the byte count and SHA-256 of the whole
/// body. A status outside `expect_status` fails the attempt (so retries apply). Cancellation and
/// timeouts cancel the transfer at once, which closes its connection.
///
/// Threading: loop thread only.
public final class HTTPExecutor: TaskExecutor {
    private let client: HTTPClient
    private let scheduler: EngineScheduler

    public init(client: HTTPClient, scheduler: EngineScheduler) {
        self.client = client
        self.scheduler = scheduler
    }

    /// Header fields sent like `headers` whose values no answer, event, webhook or log shows
    /// (contract v3, Secrets in params): `Representation` masks them.
    public static let secretParameter = "secret_headers"

    static let methods: Set<String> = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    static let maxKeptBytes = 16 << 20

    struct Params {
        var request: HTTPClientRequest
        /// Accepted status codes; any one of the ranges.
        var expectStatus: [ClosedRange<Int>]
    }

    static func parse(_ params: JSONValue, policy: HostPolicy) throws(EngineError) -> Params {
        guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
        let known = ["method", "url", "headers", secretParameter, "body", "expect_status", "max_response_bytes", "follow_redirects",
                     "connect_timeout_ms"]
        for key in object.keys where !known.contains(key) {
            throw EngineError(.invalid, "Unknown parameter \(key); known: \(known.joined(separator: ", ")).", field: key)
        }
        var method = "GET"
        if let value = object.nonNull("method") {
            guard let text = value.stringValue, methods.contains(text) else {
                throw EngineError(.invalid, "method must be one of \(methods.sorted().joined(separator: ", ")).", field: "method")
            }
            method = text
        }
        guard let text = object["url"]?.stringValue else {
            throw EngineError(.invalid, "url is required: an absolute http or https URL.", field: "url")
        }
        let url: HTTPURL
        switch checkedURL(text, policy: policy) {
        case .success(let checked): url = checked
        case .failure(let problem): throw EngineError(.invalid, "url \(problem.message)", field: "url")
        }
        var request = HTTPClientRequest(method: method, url: url)
        let given = try headerFields(object, "headers")
        let secret = try headerFields(object, secretParameter)
        for field in secret where given.contains(where: { $0.name.lowercased() == field.name.lowercased() }) {
            let name = "\(secretParameter).\(field.name)"
            throw EngineError(.invalid, "\(name) is also in headers: give each header once.", field: name)
        }
        request.headers = given + secret
        let hasContentType = request.headers.contains { $0.name.lowercased() == "content-type" }
        if let value = object.nonNull("body") {
            guard method != "HEAD" else { throw EngineError(.invalid, "body cannot be sent with HEAD.", field: "body") }
            if let text = value.stringValue {
                request.body = Array(text.utf8)
                if !hasContentType { request.headers.append(HTTPHeaderField("Content-Type", "text/plain; charset=utf-8")) }
            } else {
                request.body = value.encoded
                if !hasContentType { request.headers.append(HTTPHeaderField("Content-Type", "application/json")) }
            }
        }
        var expectStatus = [200...299]
        if let value = object.nonNull("expect_status") {
            guard let list = value.arrayValue, (1...64).contains(list.count) else {
                throw EngineError(.invalid, "expect_status must be a list of 1 to 64 status codes or ranges (\"2xx\", \"200-204\").",
                                  field: "expect_status")
            }
            expectStatus = []
            for (index, element) in list.enumerated() {
                guard let range = statusRange(element) else {
                    throw EngineError(.invalid, "expect_status[\(index)] must be a status code from 100 to 599, \"2xx\" or \"200-204\".",
                                      field: "expect_status[\(index)]")
                }
                expectStatus.append(range)
            }
        }
        if let value = object.nonNull("max_response_bytes") {
            guard let bytes = value.intValue, (0...Int64(maxKeptBytes)).contains(bytes) else {
                throw EngineError(.invalid, "max_response_bytes must be an integer from 0 to \(maxKeptBytes).", field: "max_response_bytes")
            }
            request.maxKeptBodyBytes = Int(bytes)
        }
        if let value = object.nonNull("follow_redirects") {
            guard let follow = value.boolValue else {
                throw EngineError(.invalid, "follow_redirects must be true or false.", field: "follow_redirects")
            }
            request.followRedirects = follow
        }
        if let value = object.nonNull("connect_timeout_ms") {
            guard let milliseconds = value.intValue, (1...300_000).contains(milliseconds) else {
                throw EngineError(.invalid, "connect_timeout_ms must be an integer from 1 to 300000.", field: "connect_timeout_ms")
            }
            request.connectTimeoutMilliseconds = UInt64(milliseconds)
        }
        return Params(request: request, expectStatus: expectStatus)
    }

    /// `headers` or `secret_headers`: at most 100 fields, each an HTTP token naming a string
    /// without line breaks. Messages name the field, never its value (it may be a secret).
    private static func headerFields(_ object: JSONObject, _ parameter: String) throws(EngineError) -> [HTTPHeaderField] {
        guard let value = object.nonNull(parameter) else { return [] }
        guard let members = value.objectValue, members.count <= 100 else {
            throw EngineError(.invalid, "\(parameter) must be an object of at most 100 string values.", field: parameter)
        }
        var fields: [HTTPHeaderField] = []
        for member in members {
            let field = "\(parameter).\(member.key)"
            guard isToken(member.key) else { throw EngineError(.invalid, "\(field): the name must be an HTTP token.", field: field) }
            guard !["content-length", "transfer-encoding"].contains(member.key.lowercased()) else {
                throw EngineError(.invalid, "\(field) is set from the body, not given.", field: field)
            }
            guard let text = member.value.stringValue, text.utf8.count <= 8_192 || text.unicodeScalars.count <= 8_192,
                  !text.utf8.contains(where: { $0 == 0x0d || $0 == 0x0a || $0 == 0 }) else {
                throw EngineError(.invalid, "\(field) must be a string without line breaks, at most 8192 characters.", field: field)
            }
            fields.append(HTTPHeaderField(member.key, text))
        }
        return fields
    }

    public struct URLProblem: Error {
        /// Completes a sentence that starts with the field's name.
        public let message: String
    }

    /// An absolute http(s) URL that the host policy lets the server reach (webhook URLs obey
    /// the same rules).
    public static func checkedURL(_ text: String, policy: HostPolicy) -> Result<HTTPURL, URLProblem> {
        guard isDocumentedURL(text) else {
            return .failure(URLProblem(message: "must be an absolute http or https URL of at most 8192 characters, without user "
                + "information, with its path, query and fragment in printable ASCII (percent-encode the rest)."))
        }
        let url: HTTPURL
        do {
            url = try HTTPURL(text)
        } catch {
            return .failure(URLProblem(message: error.message))
        }
        guard policy.allows(url) else {
            return .failure(URLProblem(message: "is not allowed: this server only connects to its allowed hosts (--http-allow-hosts); "
                + "\(url.host) is not one."))
        }
        return .success(url)
    }

    private static func isToken(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 256 && name.utf8.allSatisfy { byte in
            (0x30...0x39).contains(byte) || (0x41...0x5a).contains(byte) || (0x61...0x7a).contains(byte)
                || "!#$%&'*+-.^_`|~".utf8.contains(byte)
        }
    }

    /// `404`, `"2xx"` or `"200-299"`.
    private static func statusRange(_ value: JSONValue) -> ClosedRange<Int>? {
        let valid = 100...599
        if let code = value.intValue {
            return valid.contains(Int(code)) ? Int(code)...Int(code) : nil
        }
        guard let text = value.stringValue?.lowercased() else { return nil }
        if text.count == 3, text.hasSuffix("xx"), let digit = Int(text.prefix(1)), (1...5).contains(digit) {
            return digit * 100...digit * 100 + 99
        }
        let bounds = text.split(separator: "-", omittingEmptySubsequences: false)
        guard bounds.count == 2, bounds.allSatisfy({ $0.utf8.count == 3 }), let low = Int(bounds[0]), let high = Int(bounds[1]),
              valid.contains(low), valid.contains(high) else { return nil }
        // The bounds in either order: a pattern can say "two statuses", not "the first is lower".
        return min(low, high)...max(low, high)
    }

    /// The URL pattern openapi.yaml documents, checked byte by byte: http or https, a host of
    /// `[A-Za-z0-9._~-]` or a bracketed IPv6 address (no embedded IPv4), a port up to 65535,
    /// then `/`, `?` or `#` and printable ASCII. Every such URL is one libcurl parses.
    static func isDocumentedURL(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard bytes.count <= 8_192 else { return false }
        var index = 0
        func take(_ prefix: String) -> Bool {
            let expected = Array(prefix.utf8)
            guard index + expected.count <= bytes.count,
                  zip(bytes[index..<index + expected.count], expected).allSatisfy({ ($0 &- 65 < 26 ? $0 | 0x20 : $0) == $1 }) else {
                return false
            }
            index += expected.count
            return true
        }
        guard take("https://") || take("http://") else { return false }
        if index < bytes.count && bytes[index] == UInt8(ascii: "[") {
            guard let close = bytes[index...].firstIndex(of: UInt8(ascii: "]")) else { return false }
            let literal = String(decoding: bytes[(index + 1)..<close], as: UTF8.self)
            var address = in6_addr()
            guard !literal.contains("."), !literal.isEmpty, inet_pton(AF_INET6, literal, &address) == 1 else { return false }
            index = close + 1
        } else {
            let start = index
            while index < bytes.count, isHostByte(bytes[index]) { index += 1 }
            guard index > start else { return false }
        }
        if index < bytes.count && bytes[index] == UInt8(ascii: ":") {
            index += 1
            let start = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            let digits = bytes[start..<index]
            guard (1...5).contains(digits.count) else { return false }
            if digits.count == 5 {
                guard digits.first != UInt8(ascii: "0"), let port = Int(String(decoding: digits, as: UTF8.self)), port <= 65_535 else {
                    return false
                }
            }
        }
        guard index < bytes.count else { return true }
        guard [UInt8(ascii: "/"), UInt8(ascii: "?"), UInt8(ascii: "#")].contains(bytes[index]) else { return false }
        return bytes[(index + 1)...].allSatisfy { (0x21...0x7E).contains($0) }
    }

    private static func isHostByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
        case UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "-"): true
        default: false
        }
    }

    public func validate(_ params: JSONValue) throws(EngineError) {
        _ = try Self.parse(params, policy: client.policy)
    }

    /// A request sent cannot be taken back.
    public var startHasEffects: Bool { true }

    public func start(_ run: TaskRun) {
        let params: Params
        do {
            params = try Self.parse(run.params, policy: client.policy)
        } catch {
            return run.fail(TaskError(code: "invalid_params", message: error.message))
        }
        HTTPAttempt(run: run, params: params, scheduler: scheduler).begin(on: client)
    }
}

/// One attempt of one http task: the transfer, throttled progress, the result.
private final class HTTPAttempt {
    private let run: TaskRun
    private let params: HTTPExecutor.Params
    private let scheduler: EngineScheduler
    private var latest: (received: Int64, expected: Int64?) = (0, nil)
    private var lastReport: (at: UInt64, fraction: Double)?
    /// A report of the latest count, due when the interval is over, so a stream that pauses
    /// right after a suppressed report still shows its true position.
    private var pendingReport: ScheduledAction?

    /// Progress goes out at most every 100 ms, or when a known length advanced by 1%.
    private static let reportInterval: UInt64 = 100

    init(run: TaskRun, params: HTTPExecutor.Params, scheduler: EngineScheduler) {
        self.run = run
        self.params = params
        self.scheduler = scheduler
    }

    func begin(on client: HTTPClient) {
        let url = params.request.url.text
        do {
            let transfer = try client.start(
                params.request,
                onProgress: { [self] received, expected in progressed(received, expected) },
                onComplete: { [self] result in completed(result) })
            run.onCancel = { [weak self, weak run] in
                self?.pendingReport?.cancel()
                transfer.cancel()
                run?.cancelled()
            }
        } catch {
            run.fail(TaskError(code: error.code.rawValue, message: error.message, details: ["url": .string(url)]))
        }
    }

    private func progressed(_ received: Int64, _ expected: Int64?) {
        latest = (received, expected)
        let elapsed = lastReport.map { scheduler.now - $0.at }
        if let lastReport, let elapsed, elapsed < Self.reportInterval,
           expected == nil || Self.fraction(received, expected) - lastReport.fraction < 0.01 {
            if pendingReport == nil {
                pendingReport = scheduler.schedule(after: Self.reportInterval - elapsed) { [weak self] in self?.report() }
            }
            return
        }
        report()
    }

    private func report() {
        pendingReport?.cancel()
        pendingReport = nil
        let (received, expected) = latest
        let fraction = Self.fraction(received, expected)
        lastReport = (scheduler.now, fraction)
        let message = expected.map { "\(Self.size(received)) of \(Self.size($0))" } ?? "\(Self.size(received)) received"
        run.progress(fraction: expected == nil ? nil : fraction, message: message, details: .object([
            "bytes_received": .int(received), "bytes_total": expected.map { .int($0) } ?? .null,
        ]))
    }

    private static func fraction(_ received: Int64, _ expected: Int64?) -> Double {
        guard let expected else { return 0 }
        return expected > 0 ? min(1, Double(received) / Double(expected)) : 1
    }

    private func completed(_ result: Result<HTTPClientResponse, HTTPClientError>) {
        pendingReport?.cancel()
        pendingReport = nil
        switch result {
        case .failure(let error):
            run.fail(TaskError(code: error.code.rawValue, message: error.message, details: ["url": .string(params.request.url.text)]))
        case .success(let response):
            let representation = Self.representation(response)
            if params.expectStatus.contains(where: { $0.contains(response.status) }) {
                if lastReport?.fraction != 1 {
                    run.progress(fraction: 1, message: "\(Self.size(response.bytes)) received",
                                 details: .object(["bytes_received": .int(response.bytes), "bytes_total": .int(response.bytes)]))
                }
                run.succeed(.object(representation))
            } else {
                run.fail(TaskError(code: "http_status", message: "The server answered \(response.status), which expect_status does not accept.",
                                   details: representation))
            }
        }
    }

    static func representation(_ response: HTTPClientResponse) -> JSONObject {
        var headers = JSONObject()
        for field in response.headers {
            if let existing = headers[field.name]?.stringValue {
                headers[field.name] = .string(existing + ", " + field.value)
            } else {
                headers[field.name] = .string(field.value)
            }
        }
        let (body, encoding) = text(response.body, truncated: response.truncated)
        return [
            "status": .int(Int64(response.status)), "headers": .object(headers),
            "body": .string(body), "body_encoding": .string(encoding),
            "bytes": .int(response.bytes), "sha256": .string(Hex.encode(response.sha256)), "truncated": .bool(response.truncated),
            "duration_ms": .int(Int64(response.durationMilliseconds)),
            "url": .string(response.url.text), "redirects": .int(Int64(response.redirects)),
        ]
    }

    /// UTF-8 text when the kept bytes are UTF-8 (a character cut by truncation is dropped),
    /// otherwise base64.
    static func text(_ bytes: [UInt8], truncated: Bool) -> (String, String) {
        for cut in 0...(truncated ? min(3, bytes.count) : 0) {
            if let text = String(validating: bytes[..<(bytes.count - cut)], as: UTF8.self) { return (text, "utf8") }
        }
        return (Base64.encode(bytes), "base64")
    }

    /// Decimal units, one decimal: "512 B", "1.2 MB".
    static func size(_ bytes: Int64) -> String {
        guard bytes >= 1_000 else { return "\(bytes) B" }
        let units = ["kB", "MB", "GB", "TB"]
        var value = Double(bytes) / 1_000
        var unit = 0
        while value >= 999.95 && unit < units.count - 1 {
            value /= 1_000
            unit += 1
        }
        let tenths = Int((value * 10).rounded())
        return "\(tenths / 10).\(tenths % 10) \(units[unit])"
    }
}
