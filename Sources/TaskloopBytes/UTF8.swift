extension String {
    /// The bytes as a String if they are valid UTF-8, else nil. Plain ASCII, the common case,
    /// skips the standard library's generic validator, which costs thousands of instructions
    /// per call in runtime type look-ups.
    public init?(utf8Bytes bytes: UnsafeBufferPointer<UInt8>) {
        if bytes.allSatisfy({ $0 < 0x80 }) {
            self = String(decoding: bytes, as: UTF8.self)
        } else if let validated = String(validating: bytes, as: UTF8.self) {
            self = validated
        } else {
            return nil
        }
    }

    public init?(utf8Bytes bytes: [UInt8]) {
        guard let string = bytes.withUnsafeBufferPointer({ String(utf8Bytes: $0) }) else { return nil }
        self = string
    }
}
