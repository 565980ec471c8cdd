/// Writes the decimal digits of `value` at `destination` (room for 20 bytes); returns how many.
@inlinable
public func writeDecimal(_ value: Int64, to destination: UnsafeMutablePointer<UInt8>) -> Int {
    // Most numbers in an answer are small (priorities, attempts, counts).
    if value >= 0 && value < 10 {
        destination[0] = UInt8(ascii: "0") + UInt8(value)
        return 1
    }
    var written = 0
    if value < 0 {
        destination[0] = UInt8(ascii: "-")
        written = 1
    }
    var rest = value.magnitude
    var digits = 1
    var probe = rest
    while probe >= 10 {
        probe /= 10
        digits += 1
    }
    var position = written + digits
    let end = position
    repeat {
        position -= 1
        destination[position] = UInt8(ascii: "0") + UInt8(rest % 10)
        rest /= 10
    } while rest > 0
    return end
}

extension Array where Element == UInt8 {
    /// Appends the decimal digits of `value`, without going through `String`.
    public mutating func appendDecimal(_ value: Int64) {
        var scratch: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes, no allocation
        Swift.withUnsafeMutableBytes(of: &scratch) { buffer in
            let count = writeDecimal(value, to: buffer.baseAddress!.assumingMemoryBound(to: UInt8.self))
            append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
    }
}
