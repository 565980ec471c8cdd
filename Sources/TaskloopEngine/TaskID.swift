/// A task (or workflow) id: 128 bits, a 48-bit millisecond timestamp then 80 bits that are
/// random for the first id of a millisecond and incremented after it (ULID). The text form is
/// 26 characters of Crockford base32: URL-safe, and sorting as text sorts by creation.
public struct TaskID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let high: UInt64
    public let low: UInt64

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// The low half alone: it is random per millisecond and counts up within one, so it
    /// spreads well, and hashing one word instead of two is measurably cheaper.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(low)
    }

    public static func < (lhs: TaskID, rhs: TaskID) -> Bool {
        (lhs.high, lhs.low) < (rhs.high, rhs.low)
    }

    /// Milliseconds since the Unix epoch at creation.
    public var timestamp: Int64 { Int64(high >> 16) }

    public var description: String {
        var characters = [UInt8](repeating: 0, count: 26)
        // 130 bits of output for 128 bits of id: the first character carries the top 3 bits.
        var high = high, low = low
        for index in stride(from: 25, through: 0, by: -1) {
            characters[index] = crockfordAlphabet[Int(low & 31)]
            low = (low >> 5) | ((high & 31) << 59)
            high >>= 5
        }
        return String(decoding: characters, as: UTF8.self)
    }

    /// Parses the 26-character text form; case-insensitive. Nil for anything else.
    public init?(_ text: String) {
        let utf8 = text.utf8
        guard utf8.count == 26 else { return nil }
        var high: UInt64 = 0, low: UInt64 = 0
        for (index, byte) in utf8.enumerated() {
            guard let value = crockfordValue(byte), index > 0 || value < 8 else { return nil }
            high = (high << 5) | (low >> 59)
            low = (low << 5) | UInt64(value)
        }
        self.init(high: high, low: low)
    }
}

private let crockfordAlphabet: [UInt8] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)

private func crockfordValue(_ byte: UInt8) -> UInt8? {
    let upper = byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z") ? byte - 32 : byte
    guard let index = crockfordAlphabet.firstIndex(of: upper) else { return nil }
    return UInt8(index)
}

/// Makes ids that increase strictly, even within one millisecond or when the wall clock steps
/// back. Engine thread only.
public struct TaskIDGenerator {
    private var last = TaskID(high: 0, low: 0)
    private var random: any RandomNumberGenerator

    public init(random: any RandomNumberGenerator = SystemRandomNumberGenerator()) {
        self.random = random
    }

    public mutating func next(wallClockMilliseconds: Int64) -> TaskID {
        let stamp = UInt64(max(0, wallClockMilliseconds)) & 0xFFFF_FFFF_FFFF
        let next: TaskID
        if stamp > last.high >> 16 {
            let randomBits = random.next()
            next = TaskID(high: stamp << 16 | (randomBits >> 48), low: random.next())
        } else {
            // Same (or an earlier) millisecond: count up from the last id.
            let (low, carry) = last.low.addingReportingOverflow(1)
            next = TaskID(high: last.high &+ (carry ? 1 : 0), low: low)
        }
        last = next
        return next
    }
}
