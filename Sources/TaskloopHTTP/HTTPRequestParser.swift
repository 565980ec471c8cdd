import CHTTPParser

/// Request-size limits enforced while parsing, before anything is buffered past them.
public struct HTTPParserLimits: Sendable {
    public var maxURLBytes: Int
    public var maxHeaderBytes: Int
    public var maxBodyBytes: Int

    public init(maxURLBytes: Int = 8 * 1024, maxHeaderBytes: Int = 16 * 1024, maxBodyBytes: Int = 1024 * 1024) {
        self.maxURLBytes = maxURLBytes
        self.maxHeaderBytes = maxHeaderBytes
        self.maxBodyBytes = maxBodyBytes
    }
}

/// Node's http_parser behind a small event interface: bytes in, events out.
///
/// `parse` stops after a request head, which is then a request without its body (`withHead`), so
/// the caller can decide on it (a token, a Host) and refuse before a byte of the body is read or
/// buffered, or answer `Expect: 100-continue`; and it stops after each complete request (so pipelined requests are handled
/// strictly one at a time). Unconsumed bytes are the caller's to offer again. After `.failure`
/// the parser is finished: the connection answers the status and closes.
///
/// Strict where http_parser is lenient (Debian builds it with HTTP_PARSER_STRICT=0), per RFC 9112
/// and its request-smuggling advice: whitespace between a field name and its colon, obsolete
/// line folding, a missing or repeated `Host` in HTTP/1.1 and a repeated `Authorization` are
/// 400; http_parser itself refuses `Content-Length` with `Transfer-Encoding`, repeated lengths
/// and transfer codings other than a final `chunked`. The head (request line and fields with
/// their line ends) may be at most `maxHeaderBytes`, counted by http_parser byte for byte.
///
/// A method token http_parser does not know (`QUERY`, `BREW`) is read here: the token is set
/// aside, and http_parser parses the rest of the request behind a stand-in `GET`, so such a
/// request is framed like any other and the router can answer 405 or 501 for it.
///
/// Threading: owned by one connection, used on its loop thread only.
final class HTTPRequestParser {
    enum Event {
        /// Every offered byte was consumed; more are needed.
        case needMoreData
        /// A request head is complete; the caller may answer `100 Continue` before the body.
        case head(expectsContinue: Bool)
        /// A request is complete; take it with `takeRequest()`.
        case request(keepAlive: Bool)
        case failure(HTTPStatus, detail: String)
    }

    let limits: HTTPParserLimits
    private let parser: UnsafeMutablePointer<http_parser>
    private var url: [UInt8] = []
    /// Whether a header field is being read (its name, or its value once `readingValue`).
    private var readingField = false
    private var readingValue = false
    private var headers = HTTPHeaders()
    private var hostFields = 0
    private var authorizationFields = 0
    /// The request's `Expect` field: none, `100-continue`, or something else.
    private var expect: Expectation = .none

    private enum Expectation { case none, continueFirst, other }
    private var body: [UInt8] = []
    /// The head's `Content-Length`, reserved once the first body bytes arrive (not before: a
    /// head that is refused must cost nothing).
    private var declaredBodyLength = 0
    private var pending: Event?
    private var completed: HTTPRequest?
    private var limitFailure: (HTTPStatus, String)?
    private(set) var isFinished = false
    /// Between the request's first byte and its head being complete.
    private var readingHead = false
    /// The bytes of the `http_parser_execute` call in progress, to tell a header value split
    /// across reads from one folded across lines.
    private var input: (start: UnsafeRawPointer, end: UnsafeRawPointer)?
    private var valuePieceEndedWithInput = false
    /// While a method token http_parser does not know is being read: its bytes so far.
    private var unknownMethodToken: [UInt8]?
    /// Such a method, for the request being parsed behind the stand-in `GET`.
    private var unknownMethod: HTTPMethod?

    init(limits: HTTPParserLimits) {
        self.limits = limits
        parser = .allocate(capacity: 1)
        http_parser_init(parser, HTTP_REQUEST)
        precondition(parser.pointee.lenient_http_headers == 0 && parser.pointee.allow_chunked_length == 0,
                     "http_parser's lenient modes must stay off")
        parser.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        url.reserveCapacity(64)
    }

    deinit {
        parser.deallocate()
    }

    /// Parses from the start of `bytes` up to the next event.
    func parse(_ bytes: UnsafeRawBufferPointer) -> (consumed: Int, event: Event) {
        precondition(!isFinished, "parse after failure")
        guard let base = bytes.baseAddress, bytes.count > 0 else { return (0, .needMoreData) }
        if unknownMethodToken != nil { return readUnknownMethod(bytes) }
        input = (base, base + bytes.count)
        let consumed = base.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
            http_parser_execute(parser, requestParserSettings, $0, bytes.count)
        }
        input = nil
        let errno = http_errno(rawValue: parser.pointee.http_errno)
        if errno == HPE_PAUSED, let event = pending {
            http_parser_pause(parser, 0)
            pending = nil
            switch event {
            case .head where Int(parser.pointee.nread) > limits.maxHeaderBytes:
                isFinished = true
                return (consumed, .failure(.requestHeaderFieldsTooLarge, detail: headTooLarge))
            case .request:
                // http_parser counts head bytes from its last reset, which a chunked body's
                // trailer section can leave behind; each request's head counts from zero.
                parser.pointee.nread = 0
            default:
                break
            }
            return (consumed, event)
        }
        if errno == HPE_INVALID_METHOD && limitFailure == nil {
            return beginUnknownMethod(bytes, failedAt: consumed)
        }
        if errno != HPE_OK {
            isFinished = true
            return (consumed, failureEvent(for: errno))
        }
        if readingHead && Int(parser.pointee.nread) > limits.maxHeaderBytes {
            isFinished = true
            return (consumed, .failure(.requestHeaderFieldsTooLarge, detail: headTooLarge))
        }
        return (consumed, .needMoreData)
    }

    private func failureEvent(for errno: http_errno) -> Event {
        if let (status, detail) = limitFailure { return .failure(status, detail: detail) }
        if errno == HPE_HEADER_OVERFLOW {
            return .failure(.requestHeaderFieldsTooLarge, detail: headTooLarge)
        }
        let description = String(cString: http_errno_description(errno))
        return .failure(.badRequest, detail: "Malformed HTTP request: \(description).")
    }

    private var headTooLarge: String {
        "The request head (request line and header fields) is larger than \(limits.maxHeaderBytes) bytes."
    }

    /// The request announced by `.head`, its body still to come: for checks of the head alone.
    func withHead<Result>(_ inspect: (inout HTTPRequest) -> Result) -> Result {
        inspect(&completed!)
    }

    /// Moves out the request announced by `.request`, without copying it.
    func takeRequest() -> HTTPRequest {
        defer { completed = nil }
        return completed.take()!
    }

    // MARK: methods http_parser does not know

    /// http_parser stopped at `failedAt` inside the method token. What it matched before that is
    /// the start of the method it was guessing (`PO` of POST for `POX`); nothing, when the very
    /// first byte was refused.
    private func beginUnknownMethod(_ bytes: UnsafeRawBufferPointer, failedAt position: Int) -> (consumed: Int, event: Event) {
        var token: [UInt8] = []
        if readingHead {
            let guess = http_method_str(http_method(rawValue: parser.pointee.method))!
            token = (0..<Int(parser.pointee.index)).map { UInt8(bitPattern: guess[$0]) }
        }
        unknownMethodToken = token
        let (consumed, event) = readUnknownMethod(UnsafeRawBufferPointer(rebasing: bytes[position...]))
        return (position + consumed, event)
    }

    /// Reads the rest of an unknown method's token up to its space, then hands the request line
    /// from there on to a fresh http_parser behind a stand-in `GET `.
    private func readUnknownMethod(_ bytes: UnsafeRawBufferPointer) -> (consumed: Int, event: Event) {
        for (offset, byte) in bytes.enumerated() {
            if byte == UInt8(ascii: " "), let token = unknownMethodToken, !token.isEmpty {
                unknownMethodToken = nil
                http_parser_init(parser, HTTP_REQUEST)
                parser.pointee.data = Unmanaged.passUnretained(self).toOpaque()
                _ = standInMethod.withUnsafeBufferPointer { stand in
                    stand.withMemoryRebound(to: CChar.self) { http_parser_execute(parser, requestParserSettings, $0.baseAddress, $0.count) }
                }
                // The head so far is the token and its space, not the stand-in's four bytes.
                parser.pointee.nread = UInt32(token.count + 1)
                unknownMethod = HTTPMethod(token: String(decoding: token, as: UTF8.self))
                let (consumed, event) = parse(UnsafeRawBufferPointer(rebasing: bytes[(offset + 1)...]))
                return (offset + 1 + consumed, event)
            }
            guard isTokenCharacter(byte), unknownMethodToken!.count < 64 else {
                isFinished = true
                unknownMethodToken = nil
                return (offset, .failure(.badRequest, detail: "Malformed HTTP request: invalid HTTP method."))
            }
            unknownMethodToken!.append(byte)
        }
        return (bytes.count, .needMoreData)
    }

    // MARK: callbacks from http_parser

    fileprivate func messageBegin() -> Int32 {
        readingHead = true
        // Emptied after the last request already, but for one that failed part-way.
        if !url.isEmpty { url.removeAll(keepingCapacity: true) }
        readingField = false
        headers = HTTPHeaders()
        headers.reserveCapacity(8)
        hostFields = 0
        authorizationFields = 0
        expect = .none
        readingValue = false
        body = []
        declaredBodyLength = 0
        completed = nil
        return 0
    }

    fileprivate func urlData(_ data: UnsafeBufferPointer<UInt8>) -> Int32 {
        guard url.count + data.count <= limits.maxURLBytes else {
            return fail(.uriTooLong, "The request target is longer than \(limits.maxURLBytes) bytes.")
        }
        url.append(contentsOf: data)
        return 0
    }

    fileprivate func headerFieldData(_ data: UnsafeBufferPointer<UInt8>) -> Int32 {
        if readingValue { finishHeaderField() }
        // http_parser built lenient takes a space as part of a name, and then honours
        // `Transfer-Encoding : chunked`; RFC 9112 section 5.1 says 400.
        if data.contains(UInt8(ascii: " ")) {
            return fail(.badRequest, "Malformed HTTP request: whitespace between a header field name and its colon.")
        }
        readingField = true
        headers.appendToName(data)
        return 0
    }

    fileprivate func headerValueData(_ data: UnsafeBufferPointer<UInt8>) -> Int32 {
        // One value arrives in one piece per `http_parser_execute`; a second piece is a
        // continuation only if the first ended with the input and this one starts the next.
        // Anything else is obsolete line folding, which RFC 9112 section 5.2 lets a server refuse.
        if readingValue && !(valuePieceEndedWithInput && UnsafeRawPointer(data.baseAddress) == input?.start) {
            return fail(.badRequest, "Malformed HTTP request: a header field value is folded across lines (obs-fold).")
        }
        readingValue = true
        valuePieceEndedWithInput = data.baseAddress.map { UnsafeRawPointer($0 + data.count) == input?.end } ?? false
        readingField = true
        headers.appendToValue(data)
        return 0
    }

    private func finishHeaderField() {
        readingField = false
        readingValue = false
        headers.endField { name, value in
            func named(_ lowercase: StaticString) -> Bool {
                equalsIgnoringASCIICase(name, UnsafeBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount))
            }
            switch name.count {
            case 4 where named("host"): hostFields += 1
            case 13 where named("authorization"): authorizationFields += 1
            case 6 where named("expect") && expect == .none:
                let continueFirst: StaticString = "100-continue"
                expect = equalsIgnoringASCIICase(value, UnsafeBufferPointer(start: continueFirst.utf8Start, count: continueFirst.utf8CodeUnitCount))
                    ? .continueFirst : .other
            default: break
            }
        }
    }

    fileprivate func headersComplete() -> Int32 {
        if readingField { finishHeaderField() }
        readingHead = false
        if parser.pointee.http_major != 1 {
            return fail(.httpVersionNotSupported, "Only HTTP/1.0 and HTTP/1.1 are served.")
        }
        if hostFields > 1 || (hostFields == 0 && parser.pointee.http_minor == 1) {
            return fail(.badRequest, "Malformed HTTP request: an HTTP/1.1 request needs exactly one Host header field.")
        }
        if authorizationFields > 1 {
            return fail(.badRequest, "Malformed HTTP request: more than one Authorization header field.")
        }
        let declaredLength = parser.pointee.content_length
        let isChunked = parser.pointee.flags & UInt32(F_CHUNKED.rawValue) != 0
        if declaredLength != UInt64.max && declaredLength > UInt64(limits.maxBodyBytes) {
            return fail(.contentTooLarge, "The request body is larger than \(limits.maxBodyBytes) bytes.")
        }
        var expectsContinue = false
        if expect != .none {
            guard expect == .continueFirst else {
                return fail(.expectationFailed, "Only 'Expect: 100-continue' is supported.")
            }
            let hasBody = isChunked || (declaredLength != UInt64.max && declaredLength > 0)
            expectsContinue = hasBody && parser.pointee.http_minor >= 1
        }
        if declaredLength != UInt64.max { declaredBodyLength = Int(declaredLength) }
        let method = unknownMethod ?? HTTPMethod(code: parser.pointee.method)
        unknownMethod = nil
        if method == .CONNECT {
            return fail(.notImplemented, "CONNECT is not implemented: this server is not a proxy.")
        }
        let version = HTTPVersion(major: parser.pointee.http_major, minor: parser.pointee.http_minor)
        do {
            let parts = try url.withUnsafeBufferPointer { bytes throws(RequestTargetError) in
                try RequestTarget(bytes: bytes)
            }
            completed = HTTPRequest(method: method, parts: parts, version: version, headers: headers, body: [])
            url.removeAll(keepingCapacity: true)
            // A chunked body's trailer fields are read into a section of their own, not the
            // request's (which would copy it), and are dropped: nothing here reads trailers.
            headers = HTTPHeaders()
        } catch {
            return fail(.badRequest, error.detail)
        }
        return pause(with: .head(expectsContinue: expectsContinue))
    }

    fileprivate func bodyData(_ data: UnsafeBufferPointer<UInt8>) -> Int32 {
        guard body.count + data.count <= limits.maxBodyBytes else {
            return fail(.contentTooLarge, "The request body is larger than \(limits.maxBodyBytes) bytes.")
        }
        if body.isEmpty && declaredBodyLength > data.count { body.reserveCapacity(declaredBodyLength) }
        body.append(contentsOf: data)
        return 0
    }

    fileprivate func messageComplete() -> Int32 {
        let keepAlive = http_should_keep_alive(parser) != 0 && parser.pointee.upgrade == 0
        completed!.body = body
        body = []
        return pause(with: .request(keepAlive: keepAlive))
    }

    private func pause(with event: Event) -> Int32 {
        pending = event
        http_parser_pause(parser, 1)
        return 0
    }

    /// Records why parsing stops; -1 is an error for every callback (for on_headers_complete,
    /// 1 and 2 would mean "skip the body" instead).
    private func fail(_ status: HTTPStatus, _ detail: String) -> Int32 {
        limitFailure = (status, detail)
        return -1
    }

    fileprivate static func from(_ parser: UnsafeMutablePointer<http_parser>?) -> HTTPRequestParser {
        Unmanaged<HTTPRequestParser>.fromOpaque(parser!.pointee.data).takeUnretainedValue()
    }
}

private let standInMethod: [UInt8] = Array("GET ".utf8)

/// RFC 9110 `tchar`: what a method token (and a field name) is made of.
private func isTokenCharacter(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"):
        true
    default:
        "!#$%&'*+-.^_`|~".utf8.contains(byte)
    }
}

private func bytes(_ data: UnsafePointer<CChar>?, _ length: Int) -> UnsafeBufferPointer<UInt8> {
    UnsafeBufferPointer(start: UnsafeRawPointer(data)?.assumingMemoryBound(to: UInt8.self), count: length)
}

/// One settings table for every parser; http_parser only reads it.
nonisolated(unsafe) private let requestParserSettings: UnsafeMutablePointer<http_parser_settings> = {
    let settings = UnsafeMutablePointer<http_parser_settings>.allocate(capacity: 1)
    settings.initialize(to: http_parser_settings())
    settings.pointee.on_message_begin = { HTTPRequestParser.from($0).messageBegin() }
    settings.pointee.on_url = { HTTPRequestParser.from($0).urlData(bytes($1, $2)) }
    settings.pointee.on_header_field = { HTTPRequestParser.from($0).headerFieldData(bytes($1, $2)) }
    settings.pointee.on_header_value = { HTTPRequestParser.from($0).headerValueData(bytes($1, $2)) }
    settings.pointee.on_headers_complete = { HTTPRequestParser.from($0).headersComplete() }
    settings.pointee.on_body = { HTTPRequestParser.from($0).bodyData(bytes($1, $2)) }
    settings.pointee.on_message_complete = { HTTPRequestParser.from($0).messageComplete() }
    return settings
}()
