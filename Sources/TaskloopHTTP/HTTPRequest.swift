import TaskloopBytes

/// One parsed request. The target is split into a percent-decoded `path` and decoded
/// `queryItems`; `rawPath` keeps the encoded form so the router can split before decoding.
public struct HTTPRequest: Sendable {
    public var method: HTTPMethod
    public var version: HTTPVersion
    /// The path, still percent-encoded.
    public var rawPath: String
    /// The path, percent-decoded.
    public var path: String
    public var queryItems: [QueryItem]
    public var headers: HTTPHeaders
    public var body: [UInt8]
    /// Values of `{name}` segments of the matched route; filled by the router.
    public var parameters: PathParameters = PathParameters()
    /// The route an admission check already found for this request, in its owner's numbering
    /// (so the handler need not match it again); -1 when none did.
    public var matchedRoute = -1

    public struct QueryItem: Sendable, Equatable {
        public var name: String
        public var value: String
    }

    public init(
        method: HTTPMethod, target: String, version: HTTPVersion = .http1_1,
        headers: HTTPHeaders = [:], body: [UInt8] = []
    ) throws(RequestTargetError) {
        try self.init(method: method, parts: RequestTarget(target), version: version, headers: headers, body: body)
    }

    init(method: HTTPMethod, parts: RequestTarget, version: HTTPVersion, headers: HTTPHeaders, body: [UInt8]) {
        self.method = method
        self.version = version
        self.rawPath = parts.rawPath
        self.path = parts.path
        self.queryItems = parts.queryItems
        self.headers = headers
        self.body = body
    }

    /// The first value of query parameter `name`.
    public func query(_ name: String) -> String? {
        queryItems.first { $0.name == name }?.value
    }
}

public struct PathParameters: Sendable {
    private var storage: [HTTPHeaders.Field] = []

    public subscript(name: String) -> String? {
        storage.first { $0.name == name }?.value
    }

    mutating func append(_ name: String, _ value: String) {
        storage.append(HTTPHeaders.Field(name: name, value: value))
    }

    mutating func removeLast() {
        storage.removeLast()
    }

    public var isEmpty: Bool { storage.isEmpty }
}

public struct RequestTargetError: Error, Equatable {
    public let detail: String
}

/// Splits a request target (origin-form `/p?q`, absolute-form `http://h/p?q`, or `*`), working
/// on bytes: this runs for every request.
struct RequestTarget {
    let rawPath: String
    let path: String
    let queryItems: [HTTPRequest.QueryItem]

    init(_ target: String) throws(RequestTargetError) {
        self = try Array(target.utf8).withUnsafeBufferPointer { bytes throws(RequestTargetError) in
            try Self(bytes: bytes)
        }
    }

    init(bytes target: UnsafeBufferPointer<UInt8>) throws(RequestTargetError) {
        var end = target.firstIndex(of: UInt8(ascii: "#")) ?? target.count
        var start = 0
        let isOriginForm = end > 0 && target[0] == UInt8(ascii: "/")
        if !isOriginForm && !(end == 1 && target[0] == UInt8(ascii: "*")) {
            guard let authority = Self.authorityStart(target, end: end) else {
                throw RequestTargetError(detail: "The request target is neither a path nor an absolute URL.")
            }
            start = authority
            while start < end && target[start] != UInt8(ascii: "/") && target[start] != UInt8(ascii: "?") { start += 1 }
        }
        var queryStart = end
        if let question = target[start..<end].firstIndex(of: UInt8(ascii: "?")) {
            queryStart = question + 1
            end = question
        } else {
            queryStart = end
        }
        let fragmentEnd = target.firstIndex(of: UInt8(ascii: "#")) ?? target.count
        let pathBytes = UnsafeBufferPointer(rebasing: target[start..<end])
        if pathBytes.isEmpty {
            rawPath = "/"
            path = "/"
        } else if !pathBytes.contains(UInt8(ascii: "%")) {
            // Nothing to decode (the common case): one string serves as both.
            guard let text = String(utf8Bytes: pathBytes) else {
                throw RequestTargetError(detail: "The path is not UTF-8.")
            }
            rawPath = text
            path = text
        } else {
            rawPath = String(decoding: pathBytes, as: UTF8.self)
            guard let decoded = percentDecode(pathBytes, plusIsSpace: false) else {
                throw RequestTargetError(detail: "The path has a malformed percent-encoding.")
            }
            path = decoded
        }
        var items: [HTTPRequest.QueryItem] = []
        var index = queryStart
        while index < fragmentEnd {
            var pairEnd = index
            while pairEnd < fragmentEnd && target[pairEnd] != UInt8(ascii: "&") { pairEnd += 1 }
            if pairEnd > index {
                let pair = target[index..<pairEnd]
                let equals = pair.firstIndex(of: UInt8(ascii: "=")) ?? pairEnd
                let valueStart = min(equals + 1, pairEnd)
                guard let name = percentDecode(UnsafeBufferPointer(rebasing: target[index..<equals]), plusIsSpace: true),
                      let value = percentDecode(UnsafeBufferPointer(rebasing: target[valueStart..<pairEnd]), plusIsSpace: true)
                else {
                    throw RequestTargetError(detail: "The query has a malformed percent-encoding.")
                }
                items.append(.init(name: name, value: value))
            }
            index = pairEnd + 1
        }
        queryItems = items
    }

    /// For `scheme://authority...`, the index just past `://`.
    private static func authorityStart(_ target: UnsafeBufferPointer<UInt8>, end: Int) -> Int? {
        guard let colon = target[..<end].firstIndex(of: UInt8(ascii: ":")), colon > 0,
              colon + 2 < end, target[colon + 1] == UInt8(ascii: "/"), target[colon + 2] == UInt8(ascii: "/") else {
            return nil
        }
        return colon + 3
    }
}

/// Decodes `%XX` escapes (and `+` as space in queries). Nil for a malformed escape or for bytes
/// that are not UTF-8.
func percentDecode(_ text: UnsafeBufferPointer<UInt8>, plusIsSpace: Bool) -> String? {
    if !text.contains(where: { $0 == UInt8(ascii: "%") || (plusIsSpace && $0 == UInt8(ascii: "+")) }) {
        return String(utf8Bytes: text)
    }
    var bytes: [UInt8] = []
    bytes.reserveCapacity(text.count)
    var index = 0
    while index < text.count {
        let byte = text[index]
        index += 1
        switch byte {
        case UInt8(ascii: "%"):
            guard index + 1 < text.count, let high = hexValue(text[index]), let low = hexValue(text[index + 1]) else {
                return nil
            }
            bytes.append(high << 4 | low)
            index += 2
        case UInt8(ascii: "+") where plusIsSpace:
            bytes.append(UInt8(ascii: " "))
        default:
            bytes.append(byte)
        }
    }
    return String(utf8Bytes: bytes)
}

private func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
    default: nil
    }
}
