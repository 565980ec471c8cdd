import Testing
import TaskloopHTTPClient

@Suite struct SHA256Tests {
    static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }

    @Test func knownDigests() {
        #expect(Self.hex(SHA256().finalize()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        var abc = SHA256()
        abc.update(Array("abc".utf8))
        #expect(Self.hex(abc.finalize()) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        var two = SHA256()
        two.update(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8))
        #expect(Self.hex(two.finalize()) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    }

    /// A million 'a's fed in uneven pieces equals the published digest, so block carry-over works.
    @Test func incrementalMillionA() {
        var hasher = SHA256()
        let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 1_000)
        var left = 1_000_000
        var size = 1
        while left > 0 {
            let take = min(size, left, chunk.count)
            hasher.update(Array(chunk[0..<take]))
            left -= take
            size = size * 7 % 997 + 1
        }
        #expect(Self.hex(hasher.finalize()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }
}
