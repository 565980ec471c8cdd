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
        String(unsafeUninitializedCapacity: 26) { write(to: $0.baseAddress!) }
    }

    /// Writes the 26 characters of the text form at `output`; returns 26.
    public func write(to output: UnsafeMutablePointer<UInt8>) -> Int {
        // 130 bits of output for 128 bits of id: the first character carries the top 3 bits.
        var high = high, low = low
        crockfordAlphabet.withUnsafeBufferPointer { alphabet in
            for index in stride(from: 25, through: 0, by: -1) {
                output[index] = alphabet[Int(low & 31)]
                low = (low >> 5) | ((high & 31) << 59)
                high >>= 5
            }
        }
        return 26
    }

    /// Parses the 26-character text form; case-insensitive. Nil for anything else.
    public init?(_ text: String) {
        var text = text
        guard let (high, low) = text.withUTF8({ Self.parse($0) }) else { return nil }
        self.init(high: high, low: low)
    }

    private static func parse(_ utf8: UnsafeBufferPointer<UInt8>) -> (UInt64, UInt64)? {
        guard utf8.count == 26 else { return nil }
        // The table through one pointer: each access to the global would check its lazy
        // initialisation again.
        return crockfordValues.withUnsafeBufferPointer { values -> (UInt64, UInt64)? in
            var high: UInt64 = 0, low: UInt64 = 0
            for index in 0..<26 {
                let value = values[Int(utf8[index])]
                guard value < 32, index > 0 || value < 8 else { return nil }
                high = (high << 5) | (low >> 59)
                low = (low << 5) | UInt64(value)
            }
            return (high, low)
        }
    }
}

private let crockfordAlphabet: [UInt8] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)

/// Each byte's value in Crockford base32 (either case), or 0xFF.
private let crockfordValues: [UInt8] = {
    var table = [UInt8](repeating: 0xFF, count: 256)
    for (value, character) in crockfordAlphabet.enumerated() {
        table[Int(character)] = UInt8(value)
        if character >= UInt8(ascii: "A") { table[Int(character) + 32] = UInt8(value) }
    }
    return table
}()

/// Makes ids that increase strictly, even within one millisecond or when the wall clock steps
/// back. In a cluster (`cell` set), every id carries its cell in the 16 bits below the time, so
/// any replica knows from an id alone which cell, hence which owner, holds the task; the rest
/// stays random per millisecond and counts up within one. Engine thread only.
public struct TaskIDGenerator {
    private var last = TaskID(high: 0, low: 0)
    private var random: any RandomNumberGenerator
    /// The cell every id made carries, or nil (a single server: those bits are random too).
    public let cell: UInt16?

    public init(random: any RandomNumberGenerator = SystemRandomNumberGenerator(), cell: UInt16? = nil) {
        self.random = random
        self.cell = cell
    }

    /// Makes every later id sort after `id` (one restored from a store), whatever the clock
    /// says after a restart.
    public mutating func continueAfter(_ id: TaskID) {
        if id > last { last = id }
    }

    public mutating func next(wallClockMilliseconds: Int64) -> TaskID {
        let stamp = UInt64(max(0, wallClockMilliseconds)) & 0xFFFF_FFFF_FFFF
        let next: TaskID
        if stamp > last.high >> 16 {
            next = TaskID(high: stamp << 16 | lowBitsOfHigh(), low: random.next())
        } else {
            // Same (or an earlier) millisecond: count up from the last id.
            let (low, carry) = last.low.addingReportingOverflow(1)
            if !carry && (cell == nil || last.cell == cell) {
                next = TaskID(high: last.high, low: low)
            } else if cell != nil {
                // The cell's bits must not change (and the last id may be another cell's, one
                // restored): the next millisecond instead.
                next = TaskID(high: ((last.high >> 16) + 1) << 16 | lowBitsOfHigh(), low: random.next())
            } else {
                next = TaskID(high: last.high &+ 1, low: low)
            }
        }
        last = next
        return next
    }

    /// Makes every later id fall in a later millisecond than `id`: one another cell's generator
    /// made for this cell (`next(wallClockMilliseconds:carrying:)`), whose low word that
    /// generator goes on counting from, so counting on from it here could meet its next ones.
    public mutating func continueAfterMillisecond(of id: TaskID) {
        continueAfter(TaskID(high: id.high, low: .max))
    }

    /// An id for a task of another cell made here (a member of a workflow across cells, made
    /// by the workflow's home cell, Engine+Workflows): this generator's next id carrying
    /// `cell`. Unique: the ids this generator makes differ in their time or low word, which
    /// the swap keeps, and `cell`'s own ids have a low word of their own, random per millisecond.
    public mutating func next(wallClockMilliseconds: Int64, carrying cell: UInt16) -> TaskID {
        let id = next(wallClockMilliseconds: wallClockMilliseconds)
        return TaskID(high: id.high & ~0xFFFF | UInt64(cell), low: id.low)
    }

    private mutating func lowBitsOfHigh() -> UInt64 {
        cell.map(UInt64.init) ?? random.next() >> 48
    }
}

extension TaskID {
    /// The cell an id made in a cluster carries (see `TaskIDGenerator`); meaningless otherwise.
    public var cell: UInt16 { UInt16(truncatingIfNeeded: high) }
}
