import TaskloopBytes

/// Header fields in arrival order. Names compare ASCII case-insensitively; repeated fields are
/// all kept (`values(for:)`), and `subscript` returns the first.
///
/// The fields live as bytes in one buffer (each a length prefix, the name, the value), and a
/// String is made only for a field that is asked for: a request carries a handful of fields
/// and reads one or two, and a String per name and value cost more than the rest of parsing
/// them. Responses write the bytes out as they are.
public struct HTTPHeaders: Sendable, Sequence, ExpressibleByDictionaryLiteral, CustomStringConvertible {
    /// A struct, not a tuple: arrays of tuples need runtime type metadata on every copy.
    public struct Field: Sendable, Equatable {
        public var name: String
        public var value: String
        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// Per field: the name's length and the value's (4 bytes each, little-endian), the name,
    /// the value.
    private var storage: [UInt8] = []
    public private(set) var count = 0
    /// While the parser builds a field in place: where its prefix and its value start.
    private var building: (field: Int, value: Int?)?

    private static let prefixBytes = 8

    public init() {}

    public init(_ fields: [Field]) {
        for field in fields { add(field.name, field.value) }
    }

    public init(dictionaryLiteral elements: (String, String)...) {
        for (name, value) in elements { add(name, value) }
    }

    public var isEmpty: Bool { count == 0 }

    // MARK: reading

    /// Calls `body` with each field's name and value bytes, in order, until it returns false.
    package func forEachField(_ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) -> Bool) {
        storage.withUnsafeBufferPointer { bytes in
            var offset = 0
            while offset < bytes.count {
                let nameLength = Self.length(bytes, at: offset)
                let valueLength = Self.length(bytes, at: offset + 4)
                let nameStart = offset + Self.prefixBytes
                let valueStart = nameStart + nameLength
                offset = valueStart + valueLength
                guard body(UnsafeBufferPointer(rebasing: bytes[nameStart..<valueStart]),
                           UnsafeBufferPointer(rebasing: bytes[valueStart..<offset])) else { return }
            }
        }
    }

    private static func length(_ bytes: UnsafeBufferPointer<UInt8>, at offset: Int) -> Int {
        Int(bytes[offset]) | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2]) << 16 | Int(bytes[offset + 3]) << 24
    }

    /// The values of every field named `name` (any case), as bytes, in order.
    private func forEachValue(of name: String, _ body: (UnsafeBufferPointer<UInt8>) -> Bool) {
        var name = name
        name.withUTF8 { wanted in
            forEachField { fieldName, value in
                guard equalsIgnoringASCIICase(fieldName, wanted) else { return true }
                return body(value)
            }
        }
    }

    public subscript(name: String) -> String? {
        var found: String?
        forEachValue(of: name) { value in
            found = Self.string(value)
            return false
        }
        return found
    }

    /// Whether the first field `name` has a value that `test` accepts, as bytes; nil when there
    /// is no such field. For checks that need no String (the few every request makes).
    public func firstValue(of name: String, satisfies test: (UnsafeBufferPointer<UInt8>) -> Bool) -> Bool? {
        var result: Bool?
        forEachValue(of: name) { value in
            result = test(value)
            return false
        }
        return result
    }

    public func values(for name: String) -> [String] {
        var values: [String] = []
        forEachValue(of: name) { value in
            values.append(Self.string(value))
            return true
        }
        return values
    }

    public func contains(_ name: String) -> Bool {
        var found = false
        forEachValue(of: name) { _ in
            found = true
            return false
        }
        return found
    }

    /// Whether any field `name` lists `token` among its comma-separated values
    /// (e.g. `Connection: keep-alive, Upgrade` contains `upgrade`).
    public func containsToken(_ token: String, in name: String) -> Bool {
        var token = token
        return token.withUTF8 { wanted in
            var found = false
            forEachValue(of: name) { value in
                var start = 0
                while start <= value.count {
                    var end = start
                    while end < value.count && value[end] != UInt8(ascii: ",") { end += 1 }
                    var low = start, high = end
                    while low < high && (value[low] == 0x20 || value[low] == 0x09) { low += 1 }
                    while high > low && (value[high - 1] == 0x20 || value[high - 1] == 0x09) { high -= 1 }
                    if equalsIgnoringASCIICase(UnsafeBufferPointer(rebasing: value[low..<high]), wanted) {
                        found = true
                        return false
                    }
                    start = end + 1
                }
                return true
            }
            return found
        }
    }

    /// Header bytes are ASCII nearly always: that skips the generic UTF-8 check.
    private static func string(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
        String(utf8Bytes: bytes) ?? String(decoding: bytes, as: UTF8.self)
    }

    // MARK: changing

    public mutating func add(_ name: String, _ value: String) {
        var name = name, value = value
        name.withUTF8 { nameBytes in value.withUTF8 { add(name: nameBytes, value: $0) } }
    }

    /// Adds a field from its bytes.
    package mutating func add(name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
        reserveBytes(Self.prefixBytes + name.count + value.count)
        appendLengths(name.count, value.count)
        storage.append(contentsOf: name)
        storage.append(contentsOf: value)
        count += 1
    }

    private mutating func appendLengths(_ name: Int, _ value: Int) {
        let lengths = (UInt32(truncatingIfNeeded: name).littleEndian, UInt32(truncatingIfNeeded: value).littleEndian)
        withUnsafeBytes(of: lengths) { storage.append(contentsOf: $0) }
    }

    /// Grows the buffer geometrically, so a run of small appends does not reallocate each time.
    private mutating func reserveBytes(_ extra: Int) {
        let needed = storage.count + extra
        if needed > storage.capacity { storage.reserveCapacity(Swift.max(needed, storage.capacity * 2, 64)) }
    }

    // MARK: building a field in place (the request parser: its bytes arrive in pieces)

    package mutating func appendToName(_ bytes: UnsafeBufferPointer<UInt8>) {
        if building == nil {
            building = (storage.count, nil)
            appendLengths(0, 0)
        }
        storage.append(contentsOf: bytes)
    }

    package mutating func appendToValue(_ bytes: UnsafeBufferPointer<UInt8>) {
        if building == nil { appendToName(UnsafeBufferPointer(start: nil, count: 0)) }
        if building!.value == nil { building!.value = storage.count }
        storage.append(contentsOf: bytes)
    }

    /// Ends the field being built, trailing whitespace dropped from its value (RFC 9110
    /// section 5.5), and hands its name and value to `inspect`.
    package mutating func endField(_ inspect: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) -> Void) {
        guard let (field, valueStart) = building else { return }
        building = nil
        let nameStart = field + Self.prefixBytes
        let value = valueStart ?? storage.count
        while storage.count > value, storage[storage.count - 1] == 0x20 || storage[storage.count - 1] == 0x09 {
            storage.removeLast()
        }
        let nameLength = value - nameStart, valueLength = storage.count - value
        storage.withUnsafeMutableBufferPointer { bytes in
            for shift in 0..<4 {
                bytes[field + shift] = UInt8(truncatingIfNeeded: nameLength >> (8 * shift))
                bytes[field + 4 + shift] = UInt8(truncatingIfNeeded: valueLength >> (8 * shift))
            }
            inspect(UnsafeBufferPointer(rebasing: bytes[nameStart..<value]), UnsafeBufferPointer(rebasing: bytes[value...]))
        }
        count += 1
    }

    /// Replaces every field `name` with one field, or adds it.
    public mutating func set(_ name: String, _ value: String) {
        remove(name)
        add(name, value)
    }

    public mutating func remove(_ name: String) {
        guard contains(name) else { return }
        var kept = HTTPHeaders()
        var name = name
        name.withUTF8 { unwanted in
            forEachField { fieldName, value in
                if !equalsIgnoringASCIICase(fieldName, unwanted) { kept.add(name: fieldName, value: value) }
                return true
            }
        }
        self = kept
    }

    /// Room for `capacity` fields of a usual size.
    public mutating func reserveCapacity(_ capacity: Int) { storage.reserveCapacity(capacity * 48) }

    // MARK: as a sequence of fields

    public func makeIterator() -> IndexingIterator<[Field]> {
        var fields: [Field] = []
        fields.reserveCapacity(count)
        forEachField { name, value in
            fields.append(Field(name: Self.string(name), value: Self.string(value)))
            return true
        }
        return fields.makeIterator()
    }

    public var description: String {
        map { "\($0.name): \($0.value)" }.joined(separator: "\n")
    }
}

/// Whether two byte strings are equal but for the case of ASCII letters.
func equalsIgnoringASCIICase(_ lhs: UnsafeBufferPointer<UInt8>, _ rhs: UnsafeBufferPointer<UInt8>) -> Bool {
    guard lhs.count == rhs.count else { return false }
    for index in 0..<lhs.count where asciiLowercased(lhs[index]) != asciiLowercased(rhs[index]) { return false }
    return true
}

extension String {
    /// On contiguous bytes: the generic walk over two UTF8Views cost ~20 instructions a byte.
    func equalsIgnoringASCIICase(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        var lhs = self, rhs = other
        return lhs.withUTF8 { left in rhs.withUTF8 { right in TaskloopHTTP.equalsIgnoringASCIICase(left, right) } }
    }
}

@inline(__always)
func asciiLowercased(_ byte: UInt8) -> UInt8 {
    byte &- 65 < 26 ? byte | 0x20 : byte
}

extension Array where Element == UInt8 {
    /// Whether these bytes spell `lowercase` in any ASCII case.
    package func equalsIgnoringASCIICase(_ lowercase: StaticString) -> Bool {
        guard count == lowercase.utf8CodeUnitCount else { return false }
        for index in indices where asciiLowercased(self[index]) != lowercase.utf8Start[index] { return false }
        return true
    }
}
