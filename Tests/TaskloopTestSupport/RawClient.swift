import Foundation

/// A blocking TCP client that writes exact bytes and reads exact bytes, every read bounded by a
/// deadline. It parses responses itself (Content-Length, chunked, or until close) so tests see
/// precisely what the server sent.
public final class RawClient {
    private let fd: Int32
    private var buffer: [UInt8] = []
    public private(set) var sawEOF = false

    /// `narrow`: a connection that holds little in flight, set up before it connects: a 4 KiB
    /// receive buffer and 1,000-byte segments. Over loopback a segment is 64 KiB, and the
    /// server's kernel then takes megabytes for a reader that has stopped before the server's
    /// own queue holds anything; with these it takes about 50 KB.
    public init(port: Int, host: String = "127.0.0.1", narrow: Bool = false) throws {
        let ipv6 = host.contains(":")
        fd = socket(ipv6 ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ClientError.system("socket", errno) }
        if narrow {
            var receiveBuffer: Int32 = 4_096
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, socklen_t(MemoryLayout<Int32>.size))
            var segment: Int32 = 1_000
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_MAXSEG, &segment, socklen_t(MemoryLayout<Int32>.size))
        }
        let status: Int32
        if ipv6 {
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = UInt16(port).bigEndian
            status = Self.connect(fd, to: address, host: host, family: AF_INET6, hostField: \.sin6_addr)
        } else {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = UInt16(port).bigEndian
            status = Self.connect(fd, to: address, host: host, family: AF_INET, hostField: \.sin_addr)
        }
        guard status == 0 else {
            let error = errno
            Glibc.close(fd)
            throw ClientError.system("connect", error)
        }
    }

    /// Writes `host` into `hostField` of `address` and connects to it.
    private static func connect<Address>(
        _ fd: Int32, to address: Address, host: String, family: Int32, hostField: PartialKeyPath<Address>
    ) -> Int32 {
        var address = address
        return withUnsafeMutableBytes(of: &address) { raw in
            inet_pton(family, host, raw.baseAddress! + MemoryLayout<Address>.offset(of: hostField)!)
            return Glibc.connect(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
    }

    deinit { Glibc.close(fd) }

    public func send(_ text: String) throws { try send(Array(text.utf8)) }

    public func send(_ bytes: [UInt8]) throws {
        guard sendAll(fd, bytes) else { throw ClientError.system("send", errno) }
    }

    /// Half-closes: the server sees end of input.
    public func shutdownWrite() { shutdown(fd, Int32(SHUT_WR)) }

    /// Makes closing this client reset the connection (SO_LINGER 0: RST, no FIN), as a peer
    /// that crashed or gave up does.
    public func resetOnClose() {
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    }

    /// Shrinks the kernel receive buffer, so a client that stops reading pushes back quickly.
    public func setReceiveBuffer(_ bytes: Int32) {
        var size = bytes
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    }

    /// Reads at least one more chunk of bytes into the buffer; false at EOF.
    private func fill(deadline: Date) throws -> Bool {
        if sawEOF { return false }
        let remaining = deadline.timeIntervalSinceNow
        guard remaining > 0 else { throw ClientError.timeout }
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&poller, 1, Int32(remaining * 1000) + 1)
        guard ready > 0 else {
            if ready == 0 { throw ClientError.timeout }
            throw ClientError.system("poll", errno)
        }
        var chunk = [UInt8](repeating: 0, count: 65536)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count > 0 {
            buffer.append(contentsOf: chunk[..<count])
            return true
        }
        if count == 0 || errno == ECONNRESET {
            sawEOF = true
            return false
        }
        throw ClientError.system("recv", errno)
    }

    /// Reads one response. `head`: the request was HEAD, so no body follows the headers.
    public func readResponse(timeout: Double = 5, head: Bool = false) throws -> RawResponse {
        let deadline = Date().addingTimeInterval(timeout)
        var headEnd: Int?
        while true {
            if let range = findHeadEnd() { headEnd = range; break }
            guard try fill(deadline: deadline) else { throw ClientError.closed(partial: buffer) }
        }
        let headText = String(decoding: buffer[..<headEnd!], as: UTF8.self)
        buffer.removeFirst(headEnd! + 4)
        var lines = headText.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst()
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, let status = Int(parts[1]) else { throw ClientError.malformed(statusLine) }
        let headers = lines.map { line -> (String, String) in
            let colon = line.firstIndex(of: ":")!
            return (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        var response = RawResponse(
            statusLine: statusLine, status: status, headers: headers, body: [])
        if head || status < 200 || status == 204 || status == 304 { return response }
        if let length = response.header("Content-Length").flatMap(Int.init) {
            while buffer.count < length {
                guard try fill(deadline: deadline) else { throw ClientError.closed(partial: buffer) }
            }
            response.body = Array(buffer[..<length])
            buffer.removeFirst(length)
        } else if response.header("Transfer-Encoding")?.lowercased() == "chunked" {
            response.body = try readChunkedBody(deadline: deadline, chunks: &response.chunks)
        } else {
            while try fill(deadline: deadline) {}
            response.body = buffer
            buffer = []
        }
        return response
    }

    private func readChunkedBody(deadline: Date, chunks: inout [[UInt8]]) throws -> [UInt8] {
        var body: [UInt8] = []
        while true {
            var lineEnd: Int?
            while lineEnd == nil {
                lineEnd = indexOfCRLF(from: 0)
                if lineEnd == nil { guard try fill(deadline: deadline) else { throw ClientError.closed(partial: buffer) } }
            }
            let sizeText = String(decoding: buffer[..<lineEnd!], as: UTF8.self)
            guard let size = Int(sizeText.split(separator: ";")[0], radix: 16) else { throw ClientError.malformed(sizeText) }
            buffer.removeFirst(lineEnd! + 2)
            while buffer.count < size + 2 {
                guard try fill(deadline: deadline) else { throw ClientError.closed(partial: buffer) }
            }
            if size == 0 {
                buffer.removeFirst(2)
                return body
            }
            chunks.append(Array(buffer[..<size]))
            body.append(contentsOf: buffer[..<size])
            buffer.removeFirst(size + 2)
        }
    }

    /// Waits for the first bytes to arrive, then takes at most `count` of them from the kernel
    /// (one recv), leaving the rest unread there.
    public func receiveSome(upTo count: Int, timeout: Double = 5) {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, Int32(timeout * 1000)) > 0 else { return }
        var chunk = [UInt8](repeating: 0, count: count)
        _ = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
    }

    /// Reads until `done` holds for everything received so far (kept for the next call), or
    /// throws at the deadline; returns all of it. For streams, which never end by themselves.
    @discardableResult
    public func readUntil(timeout: Double = 5, _ done: ([UInt8]) -> Bool) throws -> [UInt8] {
        let deadline = Date().addingTimeInterval(timeout)
        while !done(buffer) {
            guard try fill(deadline: deadline) else { throw ClientError.closed(partial: buffer) }
        }
        return buffer
    }

    /// Waits for the server to close the connection, discarding anything it still sends.
    /// Returns the bytes that arrived meanwhile.
    @discardableResult
    public func readUntilClosed(timeout: Double = 5) throws -> [UInt8] {
        let deadline = Date().addingTimeInterval(timeout)
        while try fill(deadline: deadline) {}
        defer { buffer = [] }
        return buffer
    }

    /// True if nothing arrives and the connection stays open for `seconds`.
    public func staysSilent(for seconds: Double) throws -> Bool {
        do {
            _ = try fill(deadline: Date().addingTimeInterval(seconds))
            return false
        } catch ClientError.timeout {
            return true
        }
    }

    private func findHeadEnd() -> Int? {
        guard buffer.count >= 4 else { return nil }
        for index in 0...(buffer.count - 4)
        where buffer[index] == 13 && buffer[index + 1] == 10 && buffer[index + 2] == 13 && buffer[index + 3] == 10 {
            return index
        }
        return nil
    }

    private func indexOfCRLF(from start: Int) -> Int? {
        guard buffer.count >= start + 2 else { return nil }
        for index in start...(buffer.count - 2) where buffer[index] == 13 && buffer[index + 1] == 10 {
            return index
        }
        return nil
    }
}

public struct RawResponse {
    public var statusLine: String
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// The chunks as framed, for chunked responses.
    public var chunks: [[UInt8]] = []

    public func header(_ name: String) -> String? {
        headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }

    public var text: String { String(decoding: body, as: UTF8.self) }

    /// The body as a JSON object.
    public var json: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
    }
}

public enum ClientError: Error, CustomStringConvertible {
    case system(String, Int32)
    case timeout
    case closed(partial: [UInt8])
    case malformed(String)

    /// The peer ended the connection before a byte of the answer: a reset, a broken pipe, or a
    /// close with nothing sent.
    public var endedUnanswered: Bool {
        switch self {
        case .closed(let partial): partial.isEmpty
        case .system(_, let code): code == ECONNRESET || code == EPIPE
        case .timeout, .malformed: false
        }
    }

    public var description: String {
        switch self {
        case .system(let call, let code): "\(call): \(String(cString: strerror(code)))"
        case .timeout: "timed out"
        case .closed(let partial): "connection closed after \(partial.count) bytes: \(String(decoding: partial, as: UTF8.self))"
        case .malformed(let text): "malformed response: \(text)"
        }
    }
}

/// Writes all of `bytes` to a blocking socket; false once the peer is gone (errno says why).
func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    var offset = 0
    while offset < bytes.count {
        let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard sent > 0 else { return false }
        offset += sent
    }
    return true
}
