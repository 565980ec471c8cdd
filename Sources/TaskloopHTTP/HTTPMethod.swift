import CHTTPParser

/// A request method, as numbered by http_parser.
public struct HTTPMethod: Hashable, Sendable, CustomStringConvertible {
    public let code: UInt32

    init(_ method: http_method) { code = method.rawValue }
    init(code: UInt32) { self.code = code }

    public static let DELETE = HTTPMethod(HTTP_DELETE)
    public static let GET = HTTPMethod(HTTP_GET)
    public static let HEAD = HTTPMethod(HTTP_HEAD)
    public static let POST = HTTPMethod(HTTP_POST)
    public static let PUT = HTTPMethod(HTTP_PUT)
    public static let OPTIONS = HTTPMethod(HTTP_OPTIONS)
    public static let PATCH = HTTPMethod(HTTP_PATCH)

    public var description: String {
        String(cString: http_method_str(http_method(rawValue: code)))
    }
}

public struct HTTPVersion: Hashable, Sendable, CustomStringConvertible {
    public let major: UInt16
    public let minor: UInt16

    public static let http1_0 = HTTPVersion(major: 1, minor: 0)
    public static let http1_1 = HTTPVersion(major: 1, minor: 1)

    public var description: String { "HTTP/\(major).\(minor)" }
}
