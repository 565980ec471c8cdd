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
/// `parse` stops after a request head (so the caller can answer `Expect: 100-continue` or refuse
/// before the body is read) and after each complete request (so pipelined requests are handled
/// strictly one at a time). Unconsumed bytes are the caller's to offer again. After `.failure`
/// the parser is finished: the connection answers the status and closes.
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
    private var field: [UInt8] = []
    private var value: [UInt8] = []
    private var readingValue = false
    private var headers = HTTPHeaders()
    private var headerBytes = 0
    private var body: [UInt8] = []
    private var pending: Event?
    private var completed: HTTPRequest?
    private var limitFailure: (HTTPStatus, String)?
    private(set) var isFinished = false
    /// True between the first byte of a request and its completion.
    private(set) var isInsideRequest = false

    init(limits: HTTPParserLimits) {
        self.limits = limits
        parser = .allocate(capacity: 1)
        http_parser_init(parser, HTTP_REQUEST)
        parser.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        url.reserveCapacity(64)
        field.reserveCapacity(32)
        value.reserveCapacity(64)
    }

    deinit {
        parser.deallocate()
    }

    /// Parses from the start of `bytes` up to the next event.
    func parse(_ bytes: UnsafeRawBufferPointer) -> (consumed: Int, event: Event) {
        precondition(!isFinished, "parse after failure")
        guard let base = bytes.baseAddress, bytes.count > 0 else { return (0, .needMoreData) }
        let consumed = base.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
            http_parser_execute(parser, requestParserSettings, $0, bytes.count)
        }
        let errno = http_errno(rawValue: parser.pointee.http_errno)
        if errno == HPE_PAUSED, let event = pending {
            http_parser_pause(parser, 0)
            pending = nil
            return (consumed, event)
        }
        if errno != HPE_OK {
            isFinished = true
            return (consumed, failureEvent(for: errno))
        }
        return (consumed, .needMoreData)
    }

    private func failureEvent(for errno: http_errno) -> Event {
        if let (status, detail) = limitFailure { return .failure(status, detail: detail) }
        if errno == HPE_HEADER_OVERFLOW {
            return .failure(.requestHeaderFieldsTooLarge, detail: "The request header section is too large.")
        }
        let description = String(cString: http_errno_description(errno))
        return .failure(.badRequest, detail: "Malformed HTTP request: \(description).")
    }

    /// Moves out the request announced by `.request`, without copying it.
    func takeRequest() -> HTTPRequest {
        defer { completed = nil }
        return completed.take()!
    }

    // MARK: callbacks from http_parser

    fileprivate func messageBegin() -> Int32 {
        isInsideRequest = true
        url.removeAll(keepingCapacity: true)
        headers = HTTPHeaders()
        headers.reserveCapacity(8)
        headerBytes = 0
        readingValue = false
        field.removeAll(keepingCapacity: true)
        value.removeAll(keepingCapacity: true)
        body = []
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
        return appendHeaderBytes(data, to: &field)
    }

    fileprivate func headerValueData(_ data: UnsafeBufferPointer<UInt8>) -> Int32 {
        readingValue = true
        return appendHeaderBytes(data, to: &value)
    }

    private func appendHeaderBytes(_ data: UnsafeBufferPointer<UInt8>, to buffer: inout [UInt8]) -> Int32 {
        headerBytes += data.count
        guard headerBytes <= limits.maxHeaderBytes else {
            return fail(.requestHeaderFieldsTooLarge,
                        "The request header section is larger than \(limits.maxHeaderBytes) bytes.")
        }
        buffer.append(contentsOf: data)
        return 0
    }

    private func finishHeaderField() {
        headers.add(String(decoding: field, as: UTF8.self), String(decoding: value, as: UTF8.self))
        // ": " and CRLF count toward the header section too.
        headerBytes += 4
        field.removeAll(keepingCapacity: true)
        value.removeAll(keepingCapacity: true)
        readingValue = false
    }

    fileprivate func headersComplete() -> Int32 {
        if readingValue || !field.isEmpty { finishHeaderField() }
        guard headerBytes <= limits.maxHeaderBytes else {
            return fail(.requestHeaderFieldsTooLarge,
                        "The request header section is larger than \(limits.maxHeaderBytes) bytes.")
        }
        if parser.pointee.http_major != 1 {
            return fail(.httpVersionNotSupported, "Only HTTP/1.0 and HTTP/1.1 are served.")
        }
        let declaredLength = parser.pointee.content_length
        let isChunked = parser.pointee.flags & UInt32(F_CHUNKED.rawValue) != 0
        if declaredLength != UInt64.max && declaredLength > UInt64(limits.maxBodyBytes) {
            return fail(.contentTooLarge, "The request body is larger than \(limits.maxBodyBytes) bytes.")
        }
        var expectsContinue = false
        if let expect = headers["Expect"] {
            guard expect.equalsIgnoringASCIICase("100-continue") else {
                return fail(.expectationFailed, "Only 'Expect: 100-continue' is supported.")
            }
            let hasBody = isChunked || (declaredLength != UInt64.max && declaredLength > 0)
            expectsContinue = hasBody && parser.pointee.http_minor >= 1
        }
        if declaredLength != UInt64.max { body.reserveCapacity(Int(declaredLength)) }
        return pause(with: .head(expectsContinue: expectsContinue))
    }

    fileprivate func bodyData(_ data: UnsafeBufferPointer<UInt8>) -> Int32 {
        guard body.count + data.count <= limits.maxBodyBytes else {
            return fail(.contentTooLarge, "The request body is larger than \(limits.maxBodyBytes) bytes.")
        }
        body.append(contentsOf: data)
        return 0
    }

    fileprivate func messageComplete() -> Int32 {
        isInsideRequest = false
        let method = HTTPMethod(code: parser.pointee.method)
        let version = HTTPVersion(major: parser.pointee.http_major, minor: parser.pointee.http_minor)
        let keepAlive = http_should_keep_alive(parser) != 0 && parser.pointee.upgrade == 0
        do {
            let parts = try url.withUnsafeBufferPointer { bytes throws(RequestTargetError) in
                try RequestTarget(bytes: bytes)
            }
            completed = HTTPRequest(
                method: method, target: String(decoding: url, as: UTF8.self), parts: parts, version: version,
                headers: headers, body: body)
            body = []
            return pause(with: .request(keepAlive: keepAlive))
        } catch {
            return fail(.badRequest, error.detail)
        }
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
