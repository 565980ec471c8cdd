import CLibUV
import Glibc

/// An IPv4 or IPv6 socket address.
public struct SocketAddress: Sendable, CustomStringConvertible {
    private var storage: sockaddr_storage

    public var isIPv6: Bool { storage.ss_family == sa_family_t(AF_INET6) }

    public var port: Int {
        withSockAddr { address in
            if isIPv6 {
                return address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { Int(UInt16(bigEndian: $0.pointee.sin6_port)) }
            }
            return address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { Int(UInt16(bigEndian: $0.pointee.sin_port)) }
        }
    }

    /// The numeric host, e.g. `127.0.0.1` or `::1`.
    public var host: String {
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        withSockAddr { address in
            if isIPv6 {
                _ = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { uv_ip6_name($0, &text, text.count) }
            } else {
                _ = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { uv_ip4_name($0, &text, text.count) }
            }
        }
        return String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The IP address in network order: 4 bytes, or 16 for IPv6.
    /// 127.0.0.0/8, ::1, or an IPv4 loopback address mapped into IPv6: reachable from this
    /// machine only.
    package var isLoopback: Bool {
        let bytes = addressBytes
        if bytes.count == 4 { return bytes[0] == 127 }
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xff && bytes[11] == 0xff { return bytes[12] == 127 }
        return bytes[0..<15].allSatisfy { $0 == 0 } && bytes[15] == 1
    }

    package var addressBytes: [UInt8] {
        withSockAddr { address in
            if isIPv6 {
                return address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { withUnsafeBytes(of: $0.pointee.sin6_addr) { Array($0) } }
            }
            return address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { withUnsafeBytes(of: $0.pointee.sin_addr) { Array($0) } }
        }
    }

    /// `host:port`, with IPv6 hosts in brackets, as it appears in a URL.
    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }

    package func withSockAddr<Result, Failure: Error>(
        _ body: (UnsafePointer<sockaddr>) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        var copy = storage
        return try withUnsafePointer(to: &copy) { pointer throws(Failure) in
            try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address throws(Failure) in try body(address) }
        }
    }

    /// Resolves a numeric address, or a name through the system resolver. Called once at start,
    /// before the loop serves anyone, so the blocking look-up stalls nothing.
    package static func resolve(host: String, port: Int) throws(AddressResolutionError) -> SocketAddress {
        guard (0...65535).contains(port) else { throw AddressResolutionError(host: host, reason: "port \(port) is out of range") }
        var name = host
        if name.hasPrefix("[") && name.hasSuffix("]") { name = String(name.dropFirst().dropLast()) }
        var storage = sockaddr_storage()
        let parsed = withUnsafeMutablePointer(to: &storage) { pointer -> Bool in
            if pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1, { uv_ip4_addr(name, Int32(port), $0) }) == 0 {
                return true
            }
            return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1, { uv_ip6_addr(name, Int32(port), $0) }) == 0
        }
        if parsed { return SocketAddress(storage: storage) }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var results: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(name, String(port), &hints, &results)
        guard status == 0, let first = results else {
            throw AddressResolutionError(host: host, reason: String(cString: gai_strerror(status)))
        }
        defer { freeaddrinfo(results) }
        guard let address = SocketAddress(copying: first.pointee.ai_addr, length: Int(first.pointee.ai_addrlen)) else {
            throw AddressResolutionError(host: host, reason: "no IPv4 or IPv6 address")
        }
        return address
    }

    package static func local(of handle: UnsafeMutablePointer<uv_tcp_t>) throws(UVError) -> SocketAddress {
        var storage = sockaddr_storage()
        var length = Int32(MemoryLayout<sockaddr_storage>.size)
        let status = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { uv_tcp_getsockname(handle, $0, &length) }
        }
        try UVError.check(status, "uv_tcp_getsockname")
        return SocketAddress(storage: storage)
    }
}

extension SocketAddress {
    /// Copies an address a C API handed over; nil unless it is IPv4 or IPv6.
    package init?(copying address: UnsafeRawPointer, length: Int) {
        let family = Int32(address.loadUnaligned(as: sockaddr.self).sa_family)
        guard family == AF_INET || family == AF_INET6, length <= MemoryLayout<sockaddr_storage>.size else { return nil }
        var storage = sockaddr_storage()
        withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: UnsafeRawBufferPointer(start: address, count: length)) }
        self.init(storage: storage)
    }
}

/// A host name or address that cannot be turned into a socket address.
public struct AddressResolutionError: Error, Equatable, CustomStringConvertible {
    public let host: String
    public let reason: String
    public var description: String { "cannot resolve host \(host): \(reason)" }
}
