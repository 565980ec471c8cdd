import TaskloopLoop

/// Where `http` tasks may go: deployments that must not become an open proxy restrict the hosts
/// by name (`--http-allow-hosts`) and refuse internal addresses after DNS resolution
/// (`--http-deny-private`). Checked before every request, redirects included.
public struct HostPolicy: Sendable, Equatable {
    /// Empty: any host.
    public var allowedHosts: [HostPattern]
    public var denyPrivateAddresses: Bool

    public init(allowedHosts: [HostPattern] = [], denyPrivateAddresses: Bool = false) {
        self.allowedHosts = allowedHosts
        self.denyPrivateAddresses = denyPrivateAddresses
    }

    public var isRestricted: Bool { !allowedHosts.isEmpty || denyPrivateAddresses }

    public func allows(_ url: HTTPURL) -> Bool {
        allowedHosts.isEmpty || allowedHosts.contains { $0.matches(url) }
    }

    /// Loopback, private (RFC 1918, unique local), carrier-grade NAT, link-local (which holds the
    /// cloud metadata address 169.254.169.254), unspecified, multicast and reserved addresses,
    /// including IPv4 addresses mapped into IPv6 or NAT64.
    public static func isInternal(ipv4 a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> Bool {
        switch (a, b) {
        case (0, _), (10, _), (127, _): true
        case (100, 64...127): true
        case (169, 254): true
        case (172, 16...31): true
        case (192, 168): true
        case (192, 0): c == 0 || c == 2
        case (198, 18...19): true
        case (198, 51): c == 100
        case (203, 0): c == 113
        case (224...255, _): true
        default: false
        }
    }

    public static func isInternal(ipv6 bytes: [UInt8]) -> Bool {
        precondition(bytes.count == 16)
        let prefixZero = bytes[0..<10].allSatisfy { $0 == 0 }
        if prefixZero && bytes[10] == 0xff && bytes[11] == 0xff {
            return isInternal(ipv4: bytes[12], bytes[13], bytes[14], bytes[15])
        }
        if bytes[0..<12] == [0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0][...] {
            return isInternal(ipv4: bytes[12], bytes[13], bytes[14], bytes[15])
        }
        if prefixZero && bytes[10] == 0 && bytes[11] == 0 && bytes[12..<15].allSatisfy({ $0 == 0 }) && bytes[15] <= 1 {
            return true  // :: and ::1
        }
        if bytes[0] & 0xfe == 0xfc { return true }  // fc00::/7 unique local (and fd00:ec2::254)
        if bytes[0] == 0xfe && bytes[1] & 0xc0 == 0x80 { return true }  // fe80::/10 link-local
        if bytes[0] == 0xff { return true }  // multicast
        if bytes[0] == 0x20 && bytes[1] == 0x01 && bytes[2] == 0x0d && bytes[3] == 0xb8 { return true }  // documentation
        return false
    }

    public static func isInternal(_ address: SocketAddress) -> Bool {
        let bytes = address.addressBytes
        return bytes.count == 4 ? isInternal(ipv4: bytes[0], bytes[1], bytes[2], bytes[3]) : isInternal(ipv6: bytes)
    }
}

/// One `--http-allow-hosts` entry: `api.example.com`, `*.example.com` (any subdomain, not the
/// domain itself), an IP address (`10.0.0.7`, `[fd00::1]`), each optionally with `:port`.
public struct HostPattern: Sendable, Equatable, CustomStringConvertible {
    public let host: String
    public let subdomains: Bool
    public let port: Int?
    public let description: String

    public init?(_ text: String) {
        var rest = Substring(text.lowercased())
        guard !rest.isEmpty, rest.utf8.count <= 260 else { return nil }
        description = String(rest)
        var port: Int?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return nil }
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let number = Int(after.dropFirst()), (1...65_535).contains(number) else { return nil }
                port = number
            }
            rest = rest[rest.index(after: rest.startIndex)..<close]
        } else if let colon = rest.lastIndex(of: ":") {
            guard let number = Int(rest[rest.index(after: colon)...]), (1...65_535).contains(number) else { return nil }
            port = number
            rest = rest[..<colon]
        }
        subdomains = rest.hasPrefix("*.")
        if subdomains { rest = rest.dropFirst(2) }
        guard !rest.isEmpty, rest.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "." || $0 == "-" || $0 == ":" }) else { return nil }
        host = String(rest)
        self.port = port
    }

    public func matches(_ url: HTTPURL) -> Bool {
        if let port, port != url.port { return false }
        return subdomains ? url.host.hasSuffix("." + host) : url.host == host
    }
}
