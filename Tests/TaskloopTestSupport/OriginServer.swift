import Foundation

/// A scripted HTTP/1.1 origin on 127.0.0.1 for `http` tasks to fetch from: blocking sockets, a
/// thread per connection, keep-alive. Paths:
/// - `/text/N`: N bytes of text; `/bytes/N`: N bytes 0, 1, ... 250, 0, ... (not UTF-8).
/// - `/gated/N/K`, `/gated-unknown/N/K`: N bytes in K pieces with Content-Length (or chunked);
///   each piece after the first waits for `release()`, so a test can look at progress between.
/// - `/stall/N`: the first half of N bytes, then nothing; `/hang`: no answer at all. Both wait
///   for the client to hang up and record it in `hangUps`.
/// - `/redirect/N`: a chain of N relative 302s; `/redirect-to/<absolute URL>` (302),
///   `/redirect-307-to/<absolute URL>`; `/see-other`: 303 to `/echo`; `/status/C`: status C.
/// - `/echo`: the request line, header fields and body as text.
public final class OriginServer: @unchecked Sendable {
    public struct Request: Sendable {
        public let method: String
        public let path: String
        public let headers: [String: String]
        public let body: [UInt8]
    }

    public let port: Int
    public let requests = Locked<[Request]>([])
    /// Paths of `/stall` and `/hang` requests whose client closed the connection.
    public let hangUps = Locked<[String]>([])
    private let listener: Int32
    private let gate = DispatchSemaphore(value: 0)
    private let connections = Locked<Set<Int32>>([])
    private let stopped = Locked(false)

    public init() throws {
        (listener, port) = try loopbackListener(backlog: 1_024, reuseAddress: true)
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "origin-accept"
        thread.start()
    }

    /// A port nothing listens on right now (for a server started by another program).
    public static func freePort() throws -> Int {
        let probe = try OriginServer()
        probe.stop()
        return probe.port
    }

    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Lets `count` gated pieces go.
    public func release(_ count: Int = 1) {
        for _ in 0..<count { gate.signal() }
    }

    public func stop() {
        stopped.withLock { $0 = true }
        shutdown(listener, Int32(SHUT_RDWR))
        for fd in connections.value { shutdown(fd, Int32(SHUT_RDWR)) }
        release(1_000)
    }

    private func acceptLoop() {
        while true {
            let fd = accept(listener, nil, nil)
            guard fd >= 0, !stopped.value else {
                if fd >= 0 { close(fd) }
                close(listener)
                return
            }
            var timeout = timeval(tv_sec: 20, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            connections.withLock { _ = $0.insert(fd) }
            let thread = Thread { [self] in
                serve(fd)
                connections.withLock { _ = $0.remove(fd) }
                close(fd)
            }
            thread.name = "origin-connection"
            thread.start()
        }
    }

    private func serve(_ fd: Int32) {
        var buffer: [UInt8] = []
        while let request = readRequest(fd, &buffer) {
            requests.withLock { $0.append(request) }
            guard answer(request, fd) else { return }
        }
    }

    private func readRequest(_ fd: Int32, _ buffer: inout [UInt8]) -> Request? {
        let end: Int
        while true {
            if let found = buffer.firstRange(of: Array("\r\n\r\n".utf8)) {
                end = found.upperBound
                break
            }
            guard receive(fd, &buffer) else { return nil }
        }
        let head = String(decoding: buffer[..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let line = head[0].split(separator: " ")
        guard line.count == 3 else { return nil }
        var headers: [String: String] = [:]
        for field in head.dropFirst() where !field.isEmpty {
            guard let colon = field.firstIndex(of: ":") else { continue }
            headers[field[..<colon].lowercased()] = field[field.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while buffer.count < end + length {
            guard receive(fd, &buffer) else { return nil }
        }
        let body = Array(buffer[end..<end + length])
        buffer.removeFirst(end + length)
        return Request(method: String(line[0]), path: String(line[1]), headers: headers, body: body)
    }

    private func receive(_ fd: Int32, _ buffer: inout [UInt8]) -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16_384)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return false }
        buffer.append(contentsOf: chunk[0..<count])
        return true
    }

    /// Answers; false when the connection is finished.
    private func answer(_ request: Request, _ fd: Int32) -> Bool {
        let parts = request.path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        let route = parts.count > 1 ? parts[1] : ""
        let number = parts.count > 2 ? Int(parts[2]) ?? 0 : 0
        switch route {
        case "text":
            return send(fd, status: 200, body: Self.text(number))
        case "bytes":
            return send(fd, status: 200, body: Self.bytes(number), contentType: "application/octet-stream")
        case "gated", "gated-unknown":
            let pieces = max(1, parts.count > 3 ? Int(parts[3]) ?? 1 : 1)
            return sendGated(fd, body: Self.text(number), pieces: pieces, chunked: route == "gated-unknown")
        case "stall":
            let body = Self.text(number)
            _ = write(fd, "HTTP/1.1 200 OK\r\nContent-Length: \(body.count)\r\n\r\n".utf8 + body.prefix(body.count / 2))
            waitForHangUp(fd, request.path)
            return false
        case "hang":
            waitForHangUp(fd, request.path)
            return false
        case "redirect":
            if number == 0 { return send(fd, status: 200, body: Array("arrived".utf8)) }
            return send(fd, status: 302, body: [], extra: "Location: /redirect/\(number - 1)\r\n")
        case "redirect-to", "redirect-307-to":
            let target = request.path.dropFirst("/\(route)/".count)
            return send(fd, status: route == "redirect-to" ? 302 : 307, body: [], extra: "Location: \(target)\r\n")
        case "see-other":
            return send(fd, status: 303, body: [], extra: "Location: /echo\r\n")
        case "status":
            return send(fd, status: number, body: Array("status \(number)".utf8))
        case "echo":
            var text = "\(request.method) \(request.path)\n"
            for (name, value) in request.headers.sorted(by: { $0.key < $1.key }) { text += "\(name): \(value)\n" }
            return send(fd, status: 200, body: Array((text + "\n").utf8) + request.body)
        default:
            return send(fd, status: 404, body: Array("no route".utf8))
        }
    }

    public static func text(_ count: Int) -> [UInt8] {
        (0..<count).map { UInt8(ascii: "a") + UInt8($0 % 26) }
    }

    public static func bytes(_ count: Int) -> [UInt8] {
        (0..<count).map { UInt8($0 % 251) }
    }

    private func send(_ fd: Int32, status: Int, body: [UInt8], contentType: String = "text/plain", extra: String = "") -> Bool {
        let head = "HTTP/1.1 \(status) Scripted\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.count)\r\n\(extra)\r\n"
        return write(fd, Array(head.utf8) + body)
    }

    private func sendGated(_ fd: Int32, body: [UInt8], pieces: Int, chunked: Bool) -> Bool {
        let head = chunked ? "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" : "HTTP/1.1 200 OK\r\nContent-Length: \(body.count)\r\n\r\n"
        guard write(fd, Array(head.utf8)) else { return false }
        let size = (body.count + pieces - 1) / pieces
        for (index, start) in stride(from: 0, to: body.count, by: size).enumerated() {
            if index > 0 {
                guard gate.wait(timeout: .now() + 20) == .success, !stopped.value else { return false }
            }
            let piece = Array(body[start..<min(start + size, body.count)])
            let bytes = chunked ? Array("\(String(piece.count, radix: 16))\r\n".utf8) + piece + Array("\r\n".utf8) : piece
            guard write(fd, bytes) else { return false }
        }
        return chunked ? write(fd, Array("0\r\n\r\n".utf8)) : true
    }

    private func waitForHangUp(_ fd: Int32, _ path: String) {
        var byte: UInt8 = 0
        while true {
            let count = recv(fd, &byte, 1, 0)
            if count == 0 || (count < 0 && errno != EINTR) { break }
        }
        if !stopped.value { hangUps.withLock { $0.append(path) } }
    }

    private func write(_ fd: Int32, _ bytes: some Collection<UInt8>) -> Bool {
        sendAll(fd, Array(bytes))
    }
}
