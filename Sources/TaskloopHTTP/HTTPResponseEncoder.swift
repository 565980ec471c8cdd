import TaskloopBytes

/// Writes response heads and bodies as HTTP/1.1 bytes into a connection's output buffer.
enum HTTPResponseEncoder {
    /// `HTTP/1.1 <code> <reason>\r\n` for every known code, built once.
    private static let statusLines: [[UInt8]] = (0..<600).map { code in
        Array("HTTP/1.1 \(code) \(HTTPStatus.reasons[code] ?? "Unknown")\r\n".utf8)
    }

    static func appendStatusLine(_ status: HTTPStatus, to output: inout [UInt8]) {
        if (100..<600).contains(status.code), HTTPStatus.reasons[status.code] == status.reason {
            output.append(contentsOf: statusLines[status.code])
        } else {
            output.append(contentsOf: "HTTP/1.1 \(status.code) \(status.reason)\r\n".utf8)
        }
    }

    /// Appends status line and headers. The handler's framing and connection headers are
    /// replaced by the server's own.
    /// `contentLength` nil: a stream, chunked for an HTTP/1.1 client, else ended by closing.
    static func appendHead(
        status: HTTPStatus, headers: HTTPHeaders, contentLength: Int?, keepAlive: Bool,
        http10Client: Bool, dateLine: [UInt8], to output: inout [UInt8]
    ) {
        appendStatusLine(status, to: &output)
        headers.forEachField { name, value in
            guard !isServerOwned(name) else { return true }
            output.append(contentsOf: name)
            output.append(UInt8(ascii: ":"))
            output.append(UInt8(ascii: " "))
            output.append(contentsOf: value)
            output.append(UInt8(ascii: "\r"))
            output.append(UInt8(ascii: "\n"))
            return true
        }
        if status.code >= 200 && status.code != 204 && status.code != 304 {
            if let contentLength {
                output.append(contentsOf: contentLengthPrefix)
                output.appendDecimal(Int64(contentLength))
                output.append(UInt8(ascii: "\r"))
                output.append(UInt8(ascii: "\n"))
            } else if !http10Client {
                output.append(contentsOf: chunkedLine)
            }
        }
        output.append(contentsOf: dateLine)
        if !keepAlive {
            output.append(contentsOf: closeLine)
        } else if http10Client {
            output.append(contentsOf: keepAliveLine)
        }
        output.append(UInt8(ascii: "\r"))
        output.append(UInt8(ascii: "\n"))
    }

    static let continueResponse: [UInt8] = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)
    private static let chunkedLine: [UInt8] = Array("Transfer-Encoding: chunked\r\n".utf8)
    static let lastChunk: [UInt8] = Array("0\r\n\r\n".utf8)

    /// One chunk of a chunked body: its size in hex, the bytes, CRLF.
    static func appendChunk(_ bytes: UnsafeRawBufferPointer, to output: inout [UInt8]) {
        guard !bytes.isEmpty else { return }
        let digits = Array(String(bytes.count, radix: 16).utf8)
        output.append(contentsOf: digits)
        output.append(UInt8(ascii: "\r"))
        output.append(UInt8(ascii: "\n"))
        output.append(contentsOf: bytes)
        output.append(UInt8(ascii: "\r"))
        output.append(UInt8(ascii: "\n"))
    }
    /// A chunk's size line and its end, for a chunk of `count` bytes written from elsewhere.
    static func withChunkFraming<Result>(of count: Int, _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Result) -> Result {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 2 * MemoryLayout<Int>.size + 2) { line in
            var length = 0
            var shift = (Int.bitWidth - count.leadingZeroBitCount + 3) / 4 * 4
            repeat {
                shift = max(0, shift - 4)
                line[length] = hexDigits[(count >> shift) & 0xF]
                length += 1
            } while shift > 0
            line[length] = UInt8(ascii: "\r")
            line[length + 1] = UInt8(ascii: "\n")
            return chunkEnd.withUnsafeBytes { tail in
                body(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(line)[..<(length + 2)]), tail)
            }
        }
    }
    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)
    private static let chunkEnd: [UInt8] = [UInt8(ascii: "\r"), UInt8(ascii: "\n")]
    private static let contentLengthPrefix: [UInt8] = Array("Content-Length: ".utf8)
    private static let closeLine: [UInt8] = Array("Connection: close\r\n".utf8)
    private static let keepAliveLine: [UInt8] = Array("Connection: keep-alive\r\n".utf8)

    private static func isServerOwned(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        func named(_ lowercase: StaticString) -> Bool {
            equalsIgnoringASCIICase(name, UnsafeBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount))
        }
        switch name.count {
        case 4: return named("date")
        case 10: return named("connection")
        case 14: return named("content-length")
        case 17: return named("transfer-encoding")
        default: return false
        }
    }
}
