/// Base64 with the standard alphabet and padding (RFC 4648 section 4): `http` task bodies that
/// are not text, and webhook secrets and signatures.
public enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, byte) in alphabet.enumerated() { table[Int(byte)] = UInt8(index) }
        return table
    }()

    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        let bytes = Array(bytes)
        var output: [UInt8] = []
        output.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = 0
        while index < bytes.count {
            let chunk = bytes[index..<min(index + 3, bytes.count)]
            let value = chunk.enumerated().reduce(UInt32(0)) { $0 | UInt32($1.element) << (16 - 8 * UInt32($1.offset)) }
            for position in 0..<4 {
                output.append(position <= chunk.count ? alphabet[Int(value >> (18 - 6 * UInt32(position)) & 63)] : UInt8(ascii: "="))
            }
            index += 3
        }
        return String(decoding: output, as: UTF8.self)
    }

    /// Nil unless `text` is padded base64 of the standard alphabet, with nothing else in it.
    public static func decode(_ text: String) -> [UInt8]? {
        let input = Array(text.utf8)
        guard input.count % 4 == 0 else { return nil }
        var output: [UInt8] = []
        output.reserveCapacity(input.count / 4 * 3)
        var index = 0
        while index < input.count {
            let isLast = index + 4 == input.count
            let padding = isLast ? input[index...].reversed().prefix { $0 == UInt8(ascii: "=") }.count : 0
            guard padding <= 2 else { return nil }
            var value: UInt32 = 0
            for position in 0..<4 {
                let byte = input[index + position]
                let digit: UInt8
                if position >= 4 - padding { digit = 0 } else {
                    digit = values[Int(byte)]
                    guard digit != 0xFF else { return nil }
                }
                value = value << 6 | UInt32(digit)
            }
            for position in 0..<(3 - padding) { output.append(UInt8(truncatingIfNeeded: value >> (16 - 8 * UInt32(position)))) }
            index += 4
        }
        return output
    }
}

/// Lower-case hexadecimal: digests, lease tokens and random ids.
public enum Hex {
    @usableFromInline static let digits = Array("0123456789abcdef".utf8)

    /// Inlinable, so a lease token's 16 bytes are encoded by code specialised for them.
    @inlinable public static func encode(_ bytes: some Collection<UInt8>) -> String {
        String(unsafeUninitializedCapacity: bytes.count * 2) { text in
            for (index, byte) in bytes.enumerated() {
                text[2 * index] = digits[Int(byte >> 4)]
                text[2 * index + 1] = digits[Int(byte & 0xf)]
            }
            return bytes.count * 2
        }
    }
}
