/// Header fields in arrival order. Names compare ASCII case-insensitively; repeated fields are
/// all kept (`values(for:)`), and `subscript` returns the first.
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

    private var fields: [Field]

    public init() { fields = [] }

    public init(_ fields: [Field]) { self.fields = fields }

    public init(dictionaryLiteral elements: (String, String)...) {
        fields = elements.map { Field(name: $0.0, value: $0.1) }
    }

    public var count: Int { fields.count }
    public var isEmpty: Bool { fields.isEmpty }

    public subscript(name: String) -> String? {
        for field in fields where field.name.equalsIgnoringASCIICase(name) { return field.value }
        return nil
    }

    public func values(for name: String) -> [String] {
        fields.filter { $0.name.equalsIgnoringASCIICase(name) }.map(\.value)
    }

    public func contains(_ name: String) -> Bool { self[name] != nil }

    /// Whether any field `name` lists `token` among its comma-separated values
    /// (e.g. `Connection: keep-alive, Upgrade` contains `upgrade`).
    public func containsToken(_ token: String, in name: String) -> Bool {
        for field in fields where field.name.equalsIgnoringASCIICase(name) {
            for item in field.value.split(separator: ",") {
                if item.trimmingASCIISpaces().equalsIgnoringASCIICase(token) { return true }
            }
        }
        return false
    }

    public mutating func add(_ name: String, _ value: String) {
        fields.append(Field(name: name, value: value))
    }

    /// Replaces every field `name` with one field, or adds it.
    public mutating func set(_ name: String, _ value: String) {
        remove(name)
        fields.append(Field(name: name, value: value))
    }

    public mutating func remove(_ name: String) {
        fields.removeAll { $0.name.equalsIgnoringASCIICase(name) }
    }

    public mutating func reserveCapacity(_ capacity: Int) { fields.reserveCapacity(capacity) }

    public func makeIterator() -> IndexingIterator<[Field]> { fields.makeIterator() }

    public var description: String {
        fields.map { "\($0.name): \($0.value)" }.joined(separator: "\n")
    }
}

extension String {
    /// On contiguous bytes: the generic walk over two UTF8Views cost ~20 instructions a byte,
    /// and every header lookup does this.
    func equalsIgnoringASCIICase(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        var lhs = self, rhs = other
        return lhs.withUTF8 { left in
            rhs.withUTF8 { right in
                for index in 0..<left.count where asciiLowercased(left[index]) != asciiLowercased(right[index]) { return false }
                return true
            }
        }
    }
}

extension StringProtocol {
    func equalsIgnoringASCIICase<Other: StringProtocol>(_ other: Other) -> Bool {
        let lhs = utf8, rhs = other.utf8
        guard lhs.count == rhs.count else { return false }
        return zip(lhs, rhs).allSatisfy { asciiLowercased($0) == asciiLowercased($1) }
    }

    func trimmingASCIISpaces() -> SubSequence {
        var start = startIndex, end = endIndex
        while start < end, self[start] == " " || self[start] == "\t" { start = index(after: start) }
        while end > start {
            let before = index(before: end)
            guard self[before] == " " || self[before] == "\t" else { break }
            end = before
        }
        return self[start..<end]
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
