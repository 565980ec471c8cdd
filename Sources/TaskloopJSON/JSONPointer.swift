/// Why a string is not a JSON Pointer, with the byte offset where reading stopped.
public struct JSONPointerError: Error, Equatable, Sendable, CustomStringConvertible {
    public let offset: Int
    public let reason: String
    public var description: String { "\(reason) at byte \(offset)" }
}

/// A JSON Pointer (RFC 6901): the path to one value inside a document, as its reference tokens
/// unescaped. Whether a token names an object member or an array element is decided by the
/// value it meets, so parsing needs no document.
public struct JSONPointer: Sendable, Equatable, CustomStringConvertible {
    /// Pointers are written by hand into params, not generated from data: a kilobyte is ample,
    /// and a limit keeps a hostile one from costing more than its body's share.
    public static let maxLength = 1024
    /// A pointer with more tokens than the parser allows levels could resolve in no document
    /// the API accepts.
    public static let maxTokens = JSONParser.defaultMaxDepth

    public static let wholeDocument = JSONPointer(tokens: [])

    public let tokens: [String]

    public init(tokens: [String]) { self.tokens = tokens }

    public init(_ text: String) throws(JSONPointerError) {
        let utf8 = text.utf8
        guard utf8.count <= Self.maxLength else {
            throw JSONPointerError(offset: Self.maxLength, reason: "pointer longer than \(Self.maxLength) bytes")
        }
        guard let first = utf8.first else {
            tokens = []
            return
        }
        guard first == UInt8(ascii: "/") else { throw JSONPointerError(offset: 0, reason: "pointer must be empty or start with '/'") }
        var tokens: [String] = []
        var offset = 0
        for piece in utf8.dropFirst().split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false) {
            offset += 1  // the '/' before the token
            guard tokens.count < Self.maxTokens else {
                throw JSONPointerError(offset: offset - 1, reason: "pointer with more than \(Self.maxTokens) tokens")
            }
            tokens.append(try Self.unescape(piece, at: offset))
            offset += piece.count
        }
        self.tokens = tokens
    }

    /// `~1` is `/` and `~0` is `~`, read left to right so `~01` is `~1`, never `/`.
    private static func unescape(_ piece: Substring.UTF8View, at offset: Int) throws(JSONPointerError) -> String {
        guard piece.contains(UInt8(ascii: "~")) else { return String(Substring(piece)) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(piece.count)
        var escaping = false
        for (position, byte) in piece.enumerated() {
            if escaping {
                switch byte {
                case UInt8(ascii: "0"): bytes.append(UInt8(ascii: "~"))
                case UInt8(ascii: "1"): bytes.append(UInt8(ascii: "/"))
                default: throw JSONPointerError(offset: offset + position - 1, reason: "'~' must be followed by 0 or 1")
                }
                escaping = false
            } else if byte == UInt8(ascii: "~") {
                escaping = true
            } else {
                bytes.append(byte)
            }
        }
        guard !escaping else { throw JSONPointerError(offset: offset + piece.count - 1, reason: "'~' must be followed by 0 or 1") }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The value the pointer names, or nil when there is none: a member absent, an index out of
    /// range or not written as RFC 6901 allows (digits without a leading zero), `-` (the element
    /// after the last, which exists only to append), or a token meeting a scalar.
    public func resolve(in document: JSONValue) -> JSONValue? {
        var value = document
        for token in tokens {
            switch value {
            case .object(let object):
                guard let member = object[token] else { return nil }
                value = member
            case .array(let elements):
                guard let index = Self.arrayIndex(token), index < elements.count else { return nil }
                value = elements[index]
            default:
                return nil
            }
        }
        return value
    }

    private static func arrayIndex(_ token: String) -> Int? {
        let utf8 = token.utf8
        guard let first = utf8.first, first != UInt8(ascii: "0") || utf8.count == 1 else { return nil }
        var index = 0
        for byte in utf8 {
            let digit = byte &- UInt8(ascii: "0")
            guard digit < 10 else { return nil }
            let (shifted, overflowed) = index.multipliedReportingOverflow(by: 10)
            let (sum, overflowedAgain) = shifted.addingReportingOverflow(Int(digit))
            guard !overflowed, !overflowedAgain else { return nil }
            index = sum
        }
        return index
    }

    /// The pointer as written, each token escaped again.
    public var description: String {
        var text = ""
        for token in tokens {
            text += "/"
            for scalar in token.unicodeScalars {
                switch scalar {
                case "~": text += "~0"
                case "/": text += "~1"
                default: text.unicodeScalars.append(scalar)
                }
            }
        }
        return text
    }
}
