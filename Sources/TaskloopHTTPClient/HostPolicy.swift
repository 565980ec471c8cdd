import Glibc
import TaskloopLoop

/// Where `http` tasks and webhooks may go: deployments that must not become an open proxy
/// restrict the hosts by name (`--http-allow-hosts`) and refuse internal addresses after DNS
/// resolution (`--http-deny-private`). Link-local and cloud metadata addresses are refused
/// whatever `--http-deny-private` says: reaching them from a task hands out the machine's own
/// credentials. Checked before every request and on every address connected to, redirects
/// included.
public struct HostPolicy: Sendable, Equatable {
    /// Empty: any host.
    public var allowedHosts: [HostPattern]
    public var denyPrivateAddresses: Bool
    /// Off only for a client that talks to a server the user named on its command line (the
    /// CLI, a worker's own server), never for an address a task or webhook brings.
    public var denyLinkLocalAddresses: Bool

    public init(allowedHosts: [HostPattern] = [], denyPrivateAddresses: Bool = false, denyLinkLocalAddresses: Bool = true) {
        self.allowedHosts = allowedHosts
        self.denyPrivateAddresses = denyPrivateAddresses
        self.denyLinkLocalAddresses = denyLinkLocalAddresses
    }

    /// For a client of a server the user named: any host, any address, proxies obeyed.
    public static let unrestricted = HostPolicy(denyLinkLocalAddresses: false)

    public var isRestricted: Bool { !allowedHosts.isEmpty || denyPrivateAddresses || denyLinkLocalAddresses }

    public func allows(_ url: HTTPURL) -> Bool {
        allowedHosts.isEmpty || allowedHosts.contains { $0.matches(url) }
    }

    /// Whether a connection to `address`, which a host name resolved to, may be opened. An
    /// `--http-allow-hosts` entry that is this very IP address lifts both bans: naming the
    /// address is as explicit as a user can be; a host name or wildcard is not, since whoever
    /// runs its DNS decides where it points.
    public func permits(_ address: SocketAddress) -> Bool {
        switch Self.scope(of: address) {
        case .global: true
        case .privateNetwork: !denyPrivateAddresses || names(address)
        case .linkLocal: !denyLinkLocalAddresses || names(address)
        }
    }

    private func names(_ address: SocketAddress) -> Bool {
        let bytes = address.addressBytes
        return allowedHosts.contains { $0.address == bytes && ($0.port == nil || $0.port == address.port) }
    }

    /// How far an address reaches, as the policy sees it; ordered from the least to the most
    /// guarded.
    public enum AddressScope: Int, Sendable, Comparable {
        case global
        /// Loopback, private, shared, reserved, documentation, multicast and every IPv6 address
        /// outside 2000::/3: refused with `--http-deny-private`.
        case privateNetwork
        /// Link-local and cloud metadata addresses: always refused.
        case linkLocal

        public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
    }

    public static func scope(of address: SocketAddress) -> AddressScope {
        let bytes = address.addressBytes
        return bytes.count == 4 ? scope(ipv4: bytes[0], bytes[1], bytes[2], bytes[3]) : scope(ipv6: bytes)
    }

    /// This network, private, loopback, shared (carrier-grade NAT), IETF protocol assignments
    /// (192.0.0.0/24), documentation, benchmarking, multicast and reserved: the IANA
    /// special-purpose blocks that are not globally reachable; 169.254.0.0/16 is link-local.
    public static func scope(ipv4 a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> AddressScope {
        switch (a, b) {
        case (169, 254): .linkLocal
        case (0, _), (10, _), (127, _): .privateNetwork
        case (100, 64...127): .privateNetwork
        case (172, 16...31): .privateNetwork
        case (192, 168): .privateNetwork
        case (192, 0) where c == 0 || c == 2: .privateNetwork
        case (198, 18...19): .privateNetwork
        case (198, 51) where c == 100: .privateNetwork
        case (203, 0) where c == 113: .privateNetwork
        case (224...255, _): .privateNetwork
        default: .global
        }
    }

    /// Only 2000::/3 is global unicast; inside it, the IANA special-purpose blocks that are not
    /// globally reachable are private. Where an IPv4 address is embedded (mapped, compatible,
    /// 6to4, NAT64, Teredo), the packets end up at that IPv4 address, so it is judged instead.
    public static func scope(ipv6 bytes: [UInt8]) -> AddressScope {
        precondition(bytes.count == 16)
        func ipv4(_ i: Int, _ j: Int, _ k: Int, _ l: Int, flipped: UInt8 = 0) -> AddressScope {
            scope(ipv4: bytes[i] ^ flipped, bytes[j] ^ flipped, bytes[k] ^ flipped, bytes[l] ^ flipped)
        }
        func starts(_ prefix: [UInt8]) -> Bool { bytes.starts(with: prefix) }
        let zeros = [UInt8](repeating: 0, count: 10)
        if starts(zeros + [0xff, 0xff]) || starts(zeros + [0, 0]) { return ipv4(12, 13, 14, 15) }  // ::ffff:0:0/96, ::/96
        if starts([0x00, 0x64, 0xff, 0x9b] + [UInt8](repeating: 0, count: 8)) { return ipv4(12, 13, 14, 15) }  // 64:ff9b::/96
        if starts([0x00, 0x64, 0xff, 0x9b, 0x00, 0x01]) {
            // 64:ff9b:1::/48 is for local use: the address does not say which RFC 6052 prefix
            // length the network chose. It is judged at the /48 layout, and refused as
            // link-local if any other layout holds a link-local address.
            let otherLayouts = [ipv4(7, 9, 10, 11), ipv4(9, 10, 11, 12), ipv4(12, 13, 14, 15)]
            return otherLayouts.contains(.linkLocal) ? .linkLocal : ipv4(6, 7, 9, 10)
        }
        if bytes == [0xfd, 0x00, 0x0e, 0xc2] + [UInt8](repeating: 0, count: 10) + [0x02, 0x54] {
            return .linkLocal  // fd00:ec2::254, the EC2 metadata service
        }
        if bytes[0] == 0xfe && bytes[1] & 0xc0 == 0x80 { return .linkLocal }  // fe80::/10
        if bytes[0] & 0xe0 != 0x20 { return .privateNetwork }  // outside 2000::/3
        if starts([0x20, 0x02]) { return ipv4(2, 3, 4, 5) }  // 6to4
        if starts([0x20, 0x01, 0x00, 0x00]) {
            // Teredo: the relay's IPv4 address, then the client's (inverted), where it ends up.
            return max(ipv4(4, 5, 6, 7), ipv4(12, 13, 14, 15, flipped: 0xff))
        }
        if starts([0x20, 0x01]) && bytes[2] & 0xfe == 0 {
            return isGloballyReachableProtocolAssignment(bytes) ? .global : .privateNetwork  // 2001::/23
        }
        if starts([0x20, 0x01, 0x0d, 0xb8]) || (starts([0x3f, 0xff]) && bytes[2] & 0xf0 == 0) {
            return .privateNetwork  // documentation: 2001:db8::/32, 3fff::/20
        }
        return .global
    }

    /// The exceptions the IANA registry lists inside 2001::/23: anycast services, AMT, AS112
    /// and DRIP. ORCHIDv2 (2001:20::/28), though listed, holds identifiers that are not routed.
    private static func isGloballyReachableProtocolAssignment(_ bytes: [UInt8]) -> Bool {
        let anycast = bytes[2...3] == [0x00, 0x01] && bytes[4..<15].allSatisfy { $0 == 0 } && (1...3).contains(bytes[15])
        let amt = bytes[2...3] == [0x00, 0x03]
        let as112 = bytes[2...5] == [0x00, 0x04, 0x01, 0x12]
        let drip = bytes[2] == 0 && bytes[3] & 0xf0 == 0x30
        return anycast || amt || as112 || drip
    }
}

/// One `--http-allow-hosts` entry: `api.example.com`, `*.example.com` (any subdomain, not the
/// domain itself), an IP address (`10.0.0.7`, `[fd00::1]`), each optionally with `:port`.
public struct HostPattern: Sendable, Equatable, CustomStringConvertible {
    public let host: String
    public let subdomains: Bool
    public let port: Int?
    /// The IP address the pattern is (4 or 16 bytes in network order), nil for a name.
    public let address: [UInt8]?
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
        address = subdomains ? nil : Self.parseAddress(host)
        self.port = port
    }

    /// An address pattern matches the same address written any way (`[fd00:0::1]`, `[fd00::1]`).
    public func matches(_ url: HTTPURL) -> Bool {
        if let port, port != url.port { return false }
        if let address { return Self.parseAddress(url.host) == address }
        return subdomains ? url.host.hasSuffix("." + host) : url.host == host
    }

    private static func parseAddress(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 { return withUnsafeBytes(of: v6) { Array($0) } }
        return nil
    }
}
