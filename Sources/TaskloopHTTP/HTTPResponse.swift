/// A complete response. The server adds `Content-Length`, `Date` and `Connection` itself; a
/// handler's own framing headers (`Content-Length`, `Transfer-Encoding`) are ignored.
public struct HTTPResponse: Sendable {
    public var status: HTTPStatus
    public var headers: HTTPHeaders
    public var body: [UInt8]

    public init(status: HTTPStatus = .ok, headers: HTTPHeaders = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A response whose body is already-encoded JSON.
    public static func json(_ status: HTTPStatus = .ok, _ body: [UInt8], headers: HTTPHeaders = [:]) -> HTTPResponse {
        guard !headers.isEmpty else { return HTTPResponse(status: status, headers: jsonHeaders, body: body) }
        var headers = headers
        headers.add("Content-Type", "application/json")
        return HTTPResponse(status: status, headers: headers, body: body)
    }

    /// A 201's answer: JSON, and where the new resource is.
    public static func json(_ status: HTTPStatus, _ body: [UInt8], location: String) -> HTTPResponse {
        var headers = jsonHeaders
        headers.add("Location", location)
        return HTTPResponse(status: status, headers: headers, body: body)
    }

    /// Shared storage: most answers carry exactly this header, and sharing saves an allocation.
    private static let jsonHeaders: HTTPHeaders = ["Content-Type": "application/json"]
}

/// An error that knows the response it becomes. Handlers throw these; any other error becomes
/// a 500 problem response.
public protocol HTTPResponseError: Error {
    func response() -> HTTPResponse
}

/// The answer for an error a handler threw: its own response if it knows one, else a 500.
public func errorResponse(for error: any Error) -> HTTPResponse {
    (error as? HTTPResponseError)?.response()
        ?? HTTPProblem(.internalServerError, detail: "The server failed to answer.").response()
}

/// An RFC 9457 problem: the body of every error response. Besides RFC 9457's members it always
/// carries `code`, a snake_case word for programs (`not_found`, `cycle`, `lease_lost`). The
/// server writes the five members itself (it knows no JSON library); an application adds its
/// own members, already encoded, with `response(extraMembers:)`.
public struct HTTPProblem: HTTPResponseError, Equatable {
    public var status: HTTPStatus
    public var detail: String
    public var type: String
    public var code: String
    public var headers: HTTPHeaders

    /// `code` defaults to the status's own word (`Self.code(for:)`).
    public init(_ status: HTTPStatus, detail: String, type: String = "about:blank", code: String? = nil,
                headers: HTTPHeaders = [:]) {
        self.status = status
        self.detail = detail
        self.type = type
        self.code = code ?? Self.code(for: status)
        self.headers = headers
    }

    /// The code of a problem that has no more specific one.
    public static func code(for status: HTTPStatus) -> String {
        switch status.code {
        case 400: "malformed_request"
        case 401: "unauthorized"
        case 403: "forbidden"
        case 404: "not_found"
        case 405: "method_not_allowed"
        case 408: "request_timeout"
        case 409: "conflict"
        case 413: "body_too_large"
        case 414: "target_too_long"
        case 415: "unsupported_media_type"
        case 417: "expectation_failed"
        case 421: "misdirected_request"
        case 422: "invalid"
        case 429: "too_many_requests"
        case 431: "headers_too_large"
        case 501: "not_implemented"
        case 503: "unavailable"
        case 505: "http_version_not_supported"
        case 500...599: "internal_error"
        default: "error"
        }
    }

    public func response() -> HTTPResponse { response(extraMembers: []) }

    /// Equal when the answers' problem objects are; headers are not compared.
    public static func == (lhs: HTTPProblem, rhs: HTTPProblem) -> Bool {
        lhs.status == rhs.status && lhs.detail == rhs.detail && lhs.type == rhs.type && lhs.code == rhs.code
    }

    /// The problem+json answer. `extraMembers` are further members of the object (RFC 9457
    /// extensions) as encoded JSON, `"name":value` pairs joined by commas.
    public func response(extraMembers: [UInt8]) -> HTTPResponse {
        var body: [UInt8] = []
        body.reserveCapacity(128 + detail.utf8.count + extraMembers.count)
        body.append(contentsOf: #"{"type":"#.utf8)
        Self.appendQuoted(type, to: &body)
        body.append(contentsOf: #","title":"#.utf8)
        Self.appendQuoted(status.reason, to: &body)
        body.append(contentsOf: #","status":\#(status.code),"detail":"#.utf8)
        Self.appendQuoted(detail, to: &body)
        body.append(contentsOf: #","code":"#.utf8)
        Self.appendQuoted(code, to: &body)
        if !extraMembers.isEmpty {
            body.append(UInt8(ascii: ","))
            body.append(contentsOf: extraMembers)
        }
        body.append(UInt8(ascii: "}"))
        var headers = self.headers
        headers.add("Content-Type", "application/problem+json")
        return HTTPResponse(status: status, headers: headers, body: body)
    }

    /// A JSON string (RFC 8259): quotes, backslashes and control characters escaped.
    private static func appendQuoted(_ text: String, to body: inout [UInt8]) {
        let hex = Array("0123456789abcdef".utf8)
        body.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                body.append(UInt8(ascii: "\\"))
                body.append(byte)
            case UInt8(ascii: "\n"): body.append(contentsOf: #"\n"#.utf8)
            case UInt8(ascii: "\r"): body.append(contentsOf: #"\r"#.utf8)
            case UInt8(ascii: "\t"): body.append(contentsOf: #"\t"#.utf8)
            case 0..<0x20:
                body.append(contentsOf: #"\u00"#.utf8)
                body.append(hex[Int(byte >> 4)])
                body.append(hex[Int(byte & 0xF)])
            default: body.append(byte)
            }
        }
        body.append(UInt8(ascii: "\""))
    }
}
