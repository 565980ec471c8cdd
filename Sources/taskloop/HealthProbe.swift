import Glibc

/// `taskloop --health-check`: asks a running server's `/healthz` and exits 0 only on a 200.
/// For container HEALTHCHECKs, so the image needs no curl. Blocking is fine: it is its own
/// short-lived process.
enum HealthProbe {
    /// Connects to `host:port` (a wildcard listen address means this machine), sends
    /// `GET /healthz`, and reports whether the status line says 200, within `timeoutSeconds`.
    static func check(host: String, port: Int, timeoutSeconds: Int = 3) -> Bool {
        let target = ["0.0.0.0", "::", ""].contains(host) ? "127.0.0.1" : host
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var results: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(target, String(port), &hints, &results) == 0, let first = results else { return false }
        defer { freeaddrinfo(results) }
        var candidate: UnsafeMutablePointer<addrinfo>? = first
        while let address = candidate {
            candidate = address.pointee.ai_next
            let fd = socket(address.pointee.ai_family, address.pointee.ai_socktype, address.pointee.ai_protocol)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            guard connect(fd, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0 else { continue }
            let request = Array("GET /healthz HTTP/1.1\r\nHost: \(target)\r\nConnection: close\r\n\r\n".utf8)
            guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count else {
                continue
            }
            var reply = [UInt8](repeating: 0, count: 64)
            var received = 0
            while received < 12 {
                let count = reply.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + received, $0.count - received, 0) }
                guard count > 0 else { break }
                received += count
            }
            let statusLine = String(decoding: reply[..<received], as: UTF8.self)
            return statusLine.hasPrefix("HTTP/1.1 200") || statusLine.hasPrefix("HTTP/1.0 200")
        }
        return false
    }
}
