import TaskloopBytes

/// Writes JSON straight into bytes, in order, with RFC 8259 string escaping. Used for every
/// response body the service composes, so it avoids intermediate values.
///
/// It owns a plain byte buffer rather than an `[UInt8]`: an array append re-checks uniqueness
/// and capacity through several calls, and a task's JSON is ~60 appends; here an append is a
/// compare and a store. Non-copyable, so the buffer has exactly one owner. The small methods are
/// `@inlinable` so callers in other modules get them inlined.
public struct JSONWriter: ~Copyable {
    @usableFromInline var base: UnsafeMutablePointer<UInt8>
    @usableFromInline var count = 0
    @usableFromInline var capacity: Int
    @usableFromInline var needsComma = false

    public init(capacity: Int = 256) {
        self.capacity = max(16, capacity)
        base = .allocate(capacity: self.capacity)
    }

    deinit { base.deallocate() }

    /// How many bytes have been written so far.
    public var byteCount: Int { count }

    /// What has been written so far.
    public var bytes: [UInt8] { Array(UnsafeBufferPointer(start: base, count: count)) }

    @inlinable public mutating func beginObject() { separate(); append(UInt8(ascii: "{")); needsComma = false }
    @inlinable public mutating func endObject() { append(UInt8(ascii: "}")); needsComma = true }
    @inlinable public mutating func beginArray() { separate(); append(UInt8(ascii: "[")); needsComma = false }
    @inlinable public mutating func endArray() { append(UInt8(ascii: "]")); needsComma = true }

    public mutating func key(_ name: String) {
        separate()
        appendString(name)
        append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// A key known when compiling: copied as is, so it must not need escaping. Most keys are
    /// these, and skipping the escape scan and String access measurably speeds up responses.
    /// Always inlined: a task's JSON has 25 of them, and the call cost as much as the copy.
    @inlinable @inline(__always) public mutating func key(static name: StaticString) {
        reserve(name.utf8CodeUnitCount + 4)
        if needsComma { store(UInt8(ascii: ",")) }
        store(UInt8(ascii: "\""))
        (base + count).update(from: name.utf8Start, count: name.utf8CodeUnitCount)
        count += name.utf8CodeUnitCount
        store(UInt8(ascii: "\""))
        store(UInt8(ascii: ":"))
        needsComma = false
    }

    public mutating func string(_ value: String) { separate(); appendString(value); needsComma = true }

    /// A string known when compiling, which must need no escaping (an enum's name).
    @inlinable @inline(__always) public mutating func string(static text: StaticString) {
        separate()
        reserve(text.utf8CodeUnitCount + 2)
        store(UInt8(ascii: "\""))
        (base + count).update(from: text.utf8Start, count: text.utf8CodeUnitCount)
        count += text.utf8CodeUnitCount
        store(UInt8(ascii: "\""))
        needsComma = true
    }

    /// A string that `write` puts straight into the buffer: at most `maxLength` bytes, which
    /// must need no escaping (timestamps, ids). Returns how many it wrote. Inlined, so the
    /// closure is too.
    @inlinable @inline(__always)
    public mutating func asciiString(maxLength: Int, _ write: (UnsafeMutablePointer<UInt8>) -> Int) {
        separate()
        reserve(maxLength + 2)
        store(UInt8(ascii: "\""))
        count += write(base + count)
        store(UInt8(ascii: "\""))
        needsComma = true
    }

    @inlinable public mutating func int(_ value: Int) { int(Int64(value)) }

    public mutating func int(_ value: Int64) {
        separate()
        reserve(20)
        count += writeDecimal(value, to: base + count)
        needsComma = true
    }

    /// Finite doubles only (JSON has no NaN or infinity); integral values print without ".0".
    public mutating func double(_ value: Double) {
        precondition(value.isFinite, "JSON numbers must be finite")
        if value.rounded() == value && abs(value) < 1e15 {
            int(Int64(value))
        } else {
            separate()
            var text = value.description
            text.withUTF8 { append($0) }
            needsComma = true
        }
    }

    @inlinable public mutating func bool(_ value: Bool) {
        separate()
        value ? append("true") : append("false")
        needsComma = true
    }

    @inlinable public mutating func null() {
        separate()
        append("null")
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

    /// A value encoded already (another answer's body), written as it is.
    public mutating func encoded(_ value: [UInt8]) {
        separate()
        value.withUnsafeBufferPointer { append($0) }
        needsComma = true
    }

    /// Members known when compiling, written as one run (`"a":null,"b":null`), which must need
    /// no escaping: fields that are null on most values cost one copy together.
    @inlinable public mutating func members(static text: StaticString) {
        separate()
        append(text)
        needsComma = true
    }

    @inlinable public mutating func field(_ name: StaticString, _ value: String) { key(static: name); string(value) }
    @inlinable public mutating func field(_ name: StaticString, _ value: Int) { key(static: name); int(value) }
    @inlinable public mutating func field(_ name: StaticString, _ value: Bool) { key(static: name); bool(value) }
    @inlinable public mutating func field(_ name: StaticString, _ value: JSONValue) { key(static: name); self.value(value) }

    /// A string or null.
    @inlinable public mutating func field(_ name: StaticString, _ value: String?) {
        key(static: name)
        if let value { string(value) } else { null() }
    }

    // MARK: the buffer

    @inlinable mutating func separate() {
        if needsComma { append(UInt8(ascii: ",")) }
    }

    @inlinable mutating func reserve(_ extra: Int) {
        if count + extra > capacity { grow(toHold: count + extra) }
    }

    @usableFromInline mutating func grow(toHold needed: Int) {
        let newCapacity = max(capacity * 2, needed)
        let newBase = UnsafeMutablePointer<UInt8>.allocate(capacity: newCapacity)
        newBase.moveInitialize(from: base, count: count)
        base.deallocate()
        base = newBase
        capacity = newCapacity
    }

    /// Appends without a capacity check; callers reserve first.
    @inlinable mutating func store(_ byte: UInt8) {
        base[count] = byte
        count += 1
    }

    @inlinable mutating func append(_ byte: UInt8) {
        reserve(1)
        store(byte)
    }

    @inlinable mutating func append(_ text: StaticString) {
        reserve(text.utf8CodeUnitCount)
        (base + count).update(from: text.utf8Start, count: text.utf8CodeUnitCount)
        count += text.utf8CodeUnitCount
    }

    @usableFromInline mutating func append(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard let source = bytes.baseAddress, !bytes.isEmpty else { return }
        reserve(bytes.count)
        (base + count).update(from: source, count: bytes.count)
        count += bytes.count
    }

    private mutating func appendString(_ string: String) {
        var string = string
        string.withUTF8 { appendString(utf8: $0) }
    }

    /// Scans contiguous bytes: iterating `String.UTF8View` generically costs ~50 instructions
    /// a byte. Most strings need no escaping and go in with one copy.
    private mutating func appendString(utf8: UnsafeBufferPointer<UInt8>) {
        append(UInt8(ascii: "\""))
        guard let first = utf8.firstIndex(where: { $0 < 0x20 || $0 == 0x22 || $0 == 0x5C }) else {
            append(utf8)
            append(UInt8(ascii: "\""))
            return
        }
        append(UnsafeBufferPointer(rebasing: utf8[..<first]))
        for byte in utf8[first...] {
            if byte < 0x20 || byte == 0x22 || byte == 0x5C {
                appendEscape(byte)
            } else {
                append(byte)
            }
        }
        append(UInt8(ascii: "\""))
    }

    private mutating func appendEscape(_ byte: UInt8) {
        append(UInt8(ascii: "\\"))
        switch byte {
        case 0x22: append(0x22)
        case 0x5C: append(0x5C)
        case 0x0A: append(UInt8(ascii: "n"))
        case 0x0D: append(UInt8(ascii: "r"))
        case 0x09: append(UInt8(ascii: "t"))
        default:
            append("u00")
            append(hexDigit(byte >> 4))
            append(hexDigit(byte & 0xF))
        }
    }

    private func hexDigit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") + nibble - 10
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
