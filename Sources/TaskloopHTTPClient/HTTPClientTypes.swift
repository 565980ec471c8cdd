/// What to fetch. Header names and values are sent as given (the caller validates them).
public struct HTTPClientRequest: Sendable {
    public var method: String
    public var url: HTTPURL
    public var headers: [HTTPHeaderField]
    public var body: [UInt8]?
    public var followRedirects = true
    public var maxRedirects = 5
    public var connectTimeoutMilliseconds: UInt64 = 30_000
    /// Body bytes kept in the response; the rest is counted and hashed, not stored.
    public var maxKeptBodyBytes = 1 << 20

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

/// The final response (after redirects).
public struct HTTPClientResponse: Sendable {
    public var status: Int
    /// Names lower-cased, in the order received.
    public var headers: [HTTPHeaderField]
    /// The first `maxKeptBodyBytes` bytes.
    public var body: [UInt8]
    /// Bytes of the whole body.
    public var bytes: Int64
    /// Of the whole body.
    public var sha256: [UInt8]
    public var url: HTTPURL
    public var redirects: Int
    public var durationMilliseconds: UInt64

    public var truncated: Bool { bytes > Int64(body.count) }
}

/// Why a request produced no response.
public struct HTTPClientError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case dnsFailed = "dns_failed"
        case connectFailed = "connect_failed"
        case connectTimeout = "connect_timeout"
        case tlsFailed = "tls_failed"
        /// `--http-deny-private` refused the resolved address.
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
