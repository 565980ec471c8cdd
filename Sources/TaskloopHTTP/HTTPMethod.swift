import CHTTPParser

/// A request method: one http_parser knows by number, or another token it cannot parse
/// (`QUERY`, `BREW`), which the request parser reads itself (see `HTTPRequestParser`).
public struct HTTPMethod: Hashable, Sendable, CustomStringConvertible {
    /// http_parser's number for the method, or `unparsedCode` for a token it does not know.
    public let code: UInt32
    /// The token of a method http_parser does not know; nil for the others.
    private let token: String?

    private static let unparsedCode = UInt32.max

    init(_ method: http_method) {
        code = method.rawValue
        token = nil
    }

    init(code: UInt32) {
        self.code = code
        token = nil
    }

    /// A method http_parser does not know, by its token.
    public init(token: String) {
        code = Self.unparsedCode
        self.token = token
    }

    public static let DELETE = HTTPMethod(HTTP_DELETE)
    public static let GET = HTTPMethod(HTTP_GET)
    public static let HEAD = HTTPMethod(HTTP_HEAD)
    public static let POST = HTTPMethod(HTTP_POST)
    public static let PUT = HTTPMethod(HTTP_PUT)
    public static let OPTIONS = HTTPMethod(HTTP_OPTIONS)
    public static let PATCH = HTTPMethod(HTTP_PATCH)
    public static let TRACE = HTTPMethod(HTTP_TRACE)
    public static let CONNECT = HTTPMethod(HTTP_CONNECT)
    public static let QUERY = HTTPMethod(token: "QUERY")

    /// The general-purpose methods any resource may be asked for (RFC 9110's, PATCH and QUERY).
    /// On a known path, one its routes do not take is 405 with `Allow`; every other method
    /// (CONNECT, WebDAV's, made-up tokens) is implemented nowhere here: 501.
    public var isGeneralPurpose: Bool {
        switch self {
        case .GET, .HEAD, .POST, .PUT, .DELETE, .OPTIONS, .TRACE, .PATCH, .QUERY: true
        default: false
        }
    }

    public var description: String {
        token ?? String(cString: http_method_str(http_method(rawValue: code)))
    }
}

public struct HTTPVersion: Hashable, Sendable, CustomStringConvertible {
    public let major: UInt16
    public let minor: UInt16

    public static let http1_1 = HTTPVersion(major: 1, minor: 1)

    public var description: String { "HTTP/\(major).\(minor)" }
}
