/// One parsed request. The target is split into a percent-decoded `path` and decoded
/// `queryItems`; `rawPath` keeps the encoded form so the router can split before decoding.
public struct HTTPRequest: Sendable {
    public var method: HTTPMethod
    public var version: HTTPVersion
    /// The request target exactly as sent.
    public var target: String
    /// The path, still percent-encoded.
    public var rawPath: Substring
    /// The path, percent-decoded.
    public var path: String
    public var queryItems: [QueryItem]
    public var headers: HTTPHeaders
    public var body: [UInt8]
    /// Values of `{name}` segments of the matched route; filled by the router.
    public var parameters: PathParameters = PathParameters()

    public struct QueryItem: Sendable, Equatable {
        public var name: String
        public var value: String
    }

    public init(
        method: HTTPMethod, target: String, version: HTTPVersion = .http1_1,
        headers: HTTPHeaders = [:], body: [UInt8] = []
    ) throws(RequestTargetError) {
        let parts = try RequestTarget(target)
        self.method = method
        self.version = version
        self.target = target
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
    private var storage: [(name: String, value: String)] = []

    public subscript(name: String) -> String? {
        storage.first { $0.name == name }?.value
    }

    mutating func append(_ name: String, _ value: String) {
        storage.append((name, value))
    }

    public var isEmpty: Bool { storage.isEmpty }
}

public struct RequestTargetError: Error, Equatable {
    public let detail: String
}

/// Splits a request target (origin-form `/p?q`, absolute-form `http://h/p?q`, or `*`).
struct RequestTarget {
    let rawPath: Substring
    let path: String
    let queryItems: [HTTPRequest.QueryItem]

    init(_ target: String) throws(RequestTargetError) {
        var rest = Substring(target)
        if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
        if !rest.hasPrefix("/") && rest != "*" {
            // absolute-form: skip "scheme://authority"
            guard let colon = rest.firstIndex(of: ":"), rest[colon...].hasPrefix("://") else {
                throw RequestTargetError(detail: "The request target is neither a path nor an absolute URL.")
            }
            let afterAuthority = rest[rest.index(colon, offsetBy: 3)...]
            rest = afterAuthority.firstIndex(where: { $0 == "/" || $0 == "?" }).map { afterAuthority[$0...] } ?? "/"
            if rest.hasPrefix("?") { rest = "/" + rest }
        }
        var rawQuery: Substring = ""
        if let question = rest.firstIndex(of: "?") {
            rawQuery = rest[rest.index(after: question)...]
            rest = rest[..<question]
        }
        guard let path = percentDecode(rest, plusIsSpace: false) else {
            throw RequestTargetError(detail: "The path has a malformed percent-encoding.")
        }
        rawPath = rest
        self.path = path
        var items: [HTTPRequest.QueryItem] = []
        if !rawQuery.isEmpty {
            for pair in rawQuery.split(separator: "&", omittingEmptySubsequences: true) {
                let equals = pair.firstIndex(of: "=")
                let rawName = equals.map { pair[..<$0] } ?? pair
                let rawValue = equals.map { pair[pair.index(after: $0)...] } ?? ""
                guard let name = percentDecode(rawName, plusIsSpace: true),
                      let value = percentDecode(rawValue, plusIsSpace: true) else {
                    throw RequestTargetError(detail: "The query has a malformed percent-encoding.")
                }
                items.append(.init(name: name, value: value))
            }
        }
        queryItems = items
    }
}

/// Decodes `%XX` escapes (and `+` as space in queries). Nil for a malformed escape or for bytes
/// that are not UTF-8.
func percentDecode(_ text: Substring, plusIsSpace: Bool) -> String? {
    let utf8 = text.utf8
    if !utf8.contains(where: { $0 == UInt8(ascii: "%") || (plusIsSpace && $0 == UInt8(ascii: "+")) }) {
        return String(text)
    }
    var bytes: [UInt8] = []
    bytes.reserveCapacity(utf8.count)
    var iterator = utf8.makeIterator()
    while let byte = iterator.next() {
        switch byte {
        case UInt8(ascii: "%"):
            guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else {
                return nil
            }
            bytes.append(high << 4 | low)
        case UInt8(ascii: "+") where plusIsSpace:
            bytes.append(UInt8(ascii: " "))
        default:
            bytes.append(byte)
        }
    }
    return String(validating: bytes, as: UTF8.self)
}

private func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
    default: nil
    }
}
