/// Writes JSON straight into bytes, in order, with RFC 8259 string escaping. Used for every
/// response body the service composes, so it avoids intermediate values.
public struct JSONWriter {
    public private(set) var bytes: [UInt8] = []
    private var needsComma = false

    public init(capacity: Int = 256) { bytes.reserveCapacity(capacity) }

    public mutating func beginObject() { separate(); bytes.append(UInt8(ascii: "{")); needsComma = false }
    public mutating func endObject() { bytes.append(UInt8(ascii: "}")); needsComma = true }
    public mutating func beginArray() { separate(); bytes.append(UInt8(ascii: "[")); needsComma = false }
    public mutating func endArray() { bytes.append(UInt8(ascii: "]")); needsComma = true }

    public mutating func key(_ name: String) {
        separate()
        appendString(name)
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    public mutating func string(_ value: String) { separate(); appendString(value); needsComma = true }

    public mutating func int(_ value: Int) { int(Int64(value)) }

    public mutating func int(_ value: Int64) {
        separate()
        bytes.appendDecimal(value)
        needsComma = true
    }

    /// Finite doubles only (JSON has no NaN or infinity); integral values print without ".0".
    public mutating func double(_ value: Double) {
        precondition(value.isFinite, "JSON numbers must be finite")
        if value.rounded() == value && abs(value) < 1e15 {
            int(Int64(value))
        } else {
            separate()
            bytes.append(contentsOf: value.description.utf8)
            needsComma = true
        }
    }

    public mutating func bool(_ value: Bool) {
        separate()
        bytes.append(contentsOf: value ? trueBytes : falseBytes)
        needsComma = true
    }

    public mutating func null() {
        separate()
        bytes.append(contentsOf: nullBytes)
        needsComma = true
    }

    public mutating func value(_ value: JSONValue) {
        switch value {
        case .null: null()
        case .bool(let flag): bool(flag)
        case .int(let number): int(number)
        case .double(let number): double(number)
        case .string(let text): string(text)
        case .array(let elements):
            beginArray()
            for element in elements { self.value(element) }
            endArray()
        case .object(let object):
            beginObject()
            for member in object {
                key(member.key)
                self.value(member.value)
            }
            endObject()
        }
    }

    public mutating func field(_ name: String, _ value: String) { key(name); string(value) }
    public mutating func field(_ name: String, _ value: Int) { key(name); int(value) }
    public mutating func field(_ name: String, _ value: Bool) { key(name); bool(value) }
    public mutating func field(_ name: String, _ value: JSONValue) { key(name); self.value(value) }

    /// A string or null.
    public mutating func field(_ name: String, _ value: String?) {
        key(name)
        if let value { string(value) } else { null() }
    }

    private mutating func separate() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
    }

    private mutating func appendString(_ string: String) {
        var string = string
        string.withUTF8 { appendString(utf8: $0) }
    }

    /// Scans contiguous bytes: iterating `String.UTF8View` generically costs ~50 instructions
    /// a byte. Most strings need no escaping and go in with one copy.
    private mutating func appendString(utf8: UnsafeBufferPointer<UInt8>) {
        bytes.append(UInt8(ascii: "\""))
        guard let first = utf8.firstIndex(where: { $0 < 0x20 || $0 == 0x22 || $0 == 0x5C }) else {
            bytes.append(contentsOf: utf8)
            bytes.append(UInt8(ascii: "\""))
            return
        }
        bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[..<first]))
        for byte in utf8[first...] {
            if byte < 0x20 || byte == 0x22 || byte == 0x5C {
                appendEscape(byte)
            } else {
                bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    private mutating func appendEscape(_ byte: UInt8) {
        bytes.append(UInt8(ascii: "\\"))
        switch byte {
        case 0x22: bytes.append(0x22)
        case 0x5C: bytes.append(0x5C)
        case 0x0A: bytes.append(UInt8(ascii: "n"))
        case 0x0D: bytes.append(UInt8(ascii: "r"))
        case 0x09: bytes.append(UInt8(ascii: "t"))
        default:
            let hex = hexDigits
            bytes.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"),
                                      hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
        }
    }
}

extension JSONValue {
    /// The value as compact JSON bytes.
    public var encoded: [UInt8] {
        var writer = JSONWriter()
        writer.value(self)
        return writer.bytes
    }
}

private let trueBytes: [UInt8] = Array("true".utf8)
private let falseBytes: [UInt8] = Array("false".utf8)
private let nullBytes: [UInt8] = Array("null".utf8)
private let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

extension Array where Element == UInt8 {
    /// Appends the decimal digits of `value`, without going through `String`.
    public mutating func appendDecimal(_ value: Int64) {
        if value < 0 {
            append(UInt8(ascii: "-"))
            if value == .min {
                append(contentsOf: "9223372036854775808".utf8)
                return
            }
        }
        var rest = value.magnitude
        if rest < 10 {
            append(UInt8(ascii: "0") + UInt8(rest))
            return
        }
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes of scratch, no allocation
        Swift.withUnsafeMutableBytes(of: &digits) { buffer in
            var position = buffer.count
            while rest > 0 {
                position -= 1
                buffer[position] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
            }
            append(contentsOf: buffer[position...])
        }
    }
}
