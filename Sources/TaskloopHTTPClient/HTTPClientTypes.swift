/// What to fetch. Header names and values are sent as given (the caller validates them).
public struct HTTPClientRequest: Sendable {
    public var method: String
    public var url: HTTPURL
    public var headers: [HTTPHeaderField]
    public var body: [UInt8]?
    public var followRedirects = true
    public var maxRedirects = 5
    public var connectTimeoutMilliseconds: UInt64 = 30_000
    /// Longest the whole exchange may take, each redirect hop anew; nil: no limit (an `http`
    /// task is bounded by its own `timeout_ms`, an event stream stays open as long as it lasts).
    public var timeoutMilliseconds: UInt64?
    /// Body bytes kept in the response; the rest is counted and hashed, not stored.
    public var maxKeptBodyBytes = 1 << 20
    /// Fields libcurl writes on its own (`Accept`, `User-Agent`, `Content-Type`) that this
    /// request goes without. A field of `headers` with an empty value is sent, empty.
    public var omittedFields: [String] = []

    public init(method: String, url: HTTPURL, headers: [HTTPHeaderField] = [], body: [UInt8]? = nil) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
    }
}

public struct HTTPHeaderField: Sendable, Equatable {
    public var name: String
    public var value: String

    public init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }
}

/// Where a streamed request's body goes instead of being kept: `onHead` once the final
/// response's head is in (after redirects, before any of its body), then `onChunk` with each
/// piece of the body as it arrives. Both are called from inside curl: they may cancel the
/// transfer and start other requests (those join once curl returns), and must not keep the
/// chunk's memory beyond the call.
public struct HTTPBodyStream {
    public var onHead: (_ status: Int, _ headers: [HTTPHeaderField]) -> Void
    public var onChunk: (_ bytes: UnsafeRawBufferPointer) -> Void

    public init(onHead: @escaping (_ status: Int, _ headers: [HTTPHeaderField]) -> Void,
                onChunk: @escaping (_ bytes: UnsafeRawBufferPointer) -> Void) {
        self.onHead = onHead
        self.onChunk = onChunk
    }
}

/// The final response (after redirects).
public struct HTTPClientResponse: Sendable {
    public var status: Int
    /// Names lower-cased, in the order received.
    public var headers: [HTTPHeaderField]
    /// The first `maxKeptBodyBytes` bytes; empty for a streamed body (`HTTPBodyStream`).
    public var body: [UInt8]
    /// Bytes of the whole body.
    public var bytes: Int64
    /// Of the whole body.
    public var sha256: [UInt8]
    public var url: HTTPURL
    public var redirects: Int
    public var durationMilliseconds: UInt64
    /// The body went to an `HTTPBodyStream`, none of it kept here.
    public var streamed = false

    /// Body bytes were received beyond those kept (never for a streamed body, which keeps none
    /// by design).
    public var truncated: Bool { !streamed && bytes > Int64(body.count) }
}

/// Why a request produced no response.
public struct HTTPClientError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case dnsFailed = "dns_failed"
        case connectFailed = "connect_failed"
        case connectTimeout = "connect_timeout"
        /// The request's own `timeoutMilliseconds` passed (connecting included).
        case timedOut = "timed_out"
        case tlsFailed = "tls_failed"
        /// The host policy refused the resolved address: an internal one under
        /// `--http-deny-private`, or a link-local or metadata one.
        case addressRefused = "address_refused"
        /// `--http-allow-hosts` does not list the host (of the URL or a redirect).
        case hostNotAllowed = "host_not_allowed"
        case tooManyRedirects = "too_many_redirects"
        case invalidRedirect = "invalid_redirect"
        case transferFailed = "transfer_failed"
        /// The client itself: shut down, or libcurl refused an option.
        case clientFailed = "client_failed"
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code.rawValue): \(message)" }
}
