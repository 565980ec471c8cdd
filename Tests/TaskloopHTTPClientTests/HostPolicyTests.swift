import Testing
import TaskloopHTTPClient
import TaskloopLoop

@Suite struct HostPolicyTests {
    @Test func urlsAreParsedByCurl() throws {
        let url = try HTTPURL("HTTPS://API.Example.com/v1?q=1")
        #expect(url.scheme == "https" && url.host == "api.example.com" && url.port == 443)
        #expect(try HTTPURL("http://[::1]:8080/").host == "::1")
        #expect(try HTTPURL("http://127.0.0.1:9/").port == 9)
        for bad in ["", "ftp://example.com/", "file:///etc/passwd", "example.com/path", "http://exa mple.com/", "gopher://x/"] {
            #expect(throws: HTTPURLError.self, "\(bad)") { try HTTPURL(bad) }
        }
    }

    @Test func patternsMatchHostsSubdomainsAndPorts() throws {
        let exact = try #require(HostPattern("API.example.com"))
        let wildcard = try #require(HostPattern("*.example.com"))
        let withPort = try #require(HostPattern("10.0.0.7:8443"))
        let ipv6 = try #require(HostPattern("[fd00::1]"))
        #expect(exact.matches(try HTTPURL("http://api.example.com/")))
        #expect(!exact.matches(try HTTPURL("http://api.example.com.evil.net/")))
        #expect(wildcard.matches(try HTTPURL("https://a.b.example.com/")))
        #expect(!wildcard.matches(try HTTPURL("https://example.com/")))
        #expect(!wildcard.matches(try HTTPURL("https://badexample.com/")))
        #expect(withPort.matches(try HTTPURL("https://10.0.0.7:8443/")))
        #expect(!withPort.matches(try HTTPURL("https://10.0.0.7/")))
        #expect(ipv6.matches(try HTTPURL("http://[fd00::1]:81/")))
        for bad in ["", "*", "host:0", "host:99999", "a b", "[::1", "host/path"] {
            #expect(HostPattern(bad) == nil, "\(bad)")
        }
        let policy = HostPolicy(allowedHosts: [exact, wildcard])
        #expect(policy.allows(try HTTPURL("http://x.example.com/")))
        #expect(!policy.allows(try HTTPURL("http://other.org/")))
        #expect(HostPolicy().allows(try HTTPURL("http://other.org/")))
    }

    /// Both sides of every boundary, written as users and resolvers write them.
    static let scopes: [(String, HostPolicy.AddressScope)] = [
        ("0.0.0.0", .privateNetwork), ("0.255.255.255", .privateNetwork), ("1.0.0.0", .global),
        ("9.255.255.255", .global), ("10.0.0.0", .privateNetwork), ("10.255.255.255", .privateNetwork), ("11.0.0.0", .global),
        ("100.63.255.255", .global), ("100.64.0.0", .privateNetwork), ("100.127.255.255", .privateNetwork), ("100.128.0.0", .global),
        ("126.255.255.255", .global), ("127.0.0.1", .privateNetwork), ("127.255.255.255", .privateNetwork), ("128.0.0.0", .global),
        ("169.253.255.255", .global), ("169.254.0.0", .linkLocal), ("169.254.169.254", .linkLocal),
        ("169.254.255.255", .linkLocal), ("169.255.0.0", .global),
        ("172.15.255.255", .global), ("172.16.0.0", .privateNetwork), ("172.31.255.255", .privateNetwork), ("172.32.0.0", .global),
        ("191.255.255.255", .global), ("192.0.0.0", .privateNetwork), ("192.0.0.255", .privateNetwork), ("192.0.1.0", .global),
        ("192.0.1.255", .global), ("192.0.2.0", .privateNetwork), ("192.0.2.255", .privateNetwork), ("192.0.3.0", .global),
        ("192.167.255.255", .global), ("192.168.0.0", .privateNetwork), ("192.168.255.255", .privateNetwork), ("192.169.0.0", .global),
        ("198.17.255.255", .global), ("198.18.0.0", .privateNetwork), ("198.19.255.255", .privateNetwork), ("198.20.0.0", .global),
        ("198.51.99.255", .global), ("198.51.100.0", .privateNetwork), ("198.51.100.255", .privateNetwork), ("198.51.101.0", .global),
        ("203.0.112.255", .global), ("203.0.113.0", .privateNetwork), ("203.0.113.255", .privateNetwork), ("203.0.114.0", .global),
        ("223.255.255.255", .global), ("224.0.0.0", .privateNetwork), ("240.0.0.0", .privateNetwork),
        ("255.255.255.255", .privateNetwork), ("8.8.8.8", .global), ("93.184.216.34", .global),

        // Outside 2000::/3: loopback, unspecified, discard, site-local, unique local, multicast...
        ("::", .privateNetwork), ("::1", .privateNetwork), ("100::1", .privateNetwork), ("5f00::1", .privateNetwork),
        ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", .privateNetwork), ("2000::", .global),
        ("3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", .global), ("4000::", .privateNetwork),
        ("fc00::1", .privateNetwork), ("fd00:ec2::253", .privateNetwork), ("fd00:ec2::254", .linkLocal),
        ("fd00:ec2::255", .privateNetwork), ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", .privateNetwork), ("fe80::", .linkLocal),
        ("fe80::1", .linkLocal), ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", .linkLocal), ("fec0::", .privateNetwork),
        ("fec0::1", .privateNetwork), ("ff02::1", .privateNetwork),
        // IPv4-mapped and IPv4-compatible: the IPv4 address decides; next to them, nothing does.
        ("::ffff:169.254.169.254", .linkLocal), ("::ffff:10.1.2.3", .privateNetwork), ("::ffff:8.8.8.8", .global),
        ("::fffe:808:808", .privateNetwork), ("::1:ffff:808:808", .privateNetwork),
        ("::169.254.169.254", .linkLocal), ("::10.1.2.3", .privateNetwork), ("::8.8.8.8", .global), ("::1:808:808", .privateNetwork),
        // NAT64, the well-known /96 and the local-use /48 (the IPv4 address at bytes 6, 7, 9, 10).
        ("64:ff9b::8.8.8.8", .global), ("64:ff9b::169.254.169.254", .linkLocal), ("64:ff9b::10.1.2.3", .privateNetwork),
        ("64:ff9b::1:808:808", .privateNetwork), ("64:ff9a:ffff:ffff:ffff:ffff:808:808", .privateNetwork),
        ("64:ff9b:1:808:8:800::", .global), ("64:ff9b:1:a01:2:300::", .privateNetwork),
        ("64:ff9b:1:a9fe:a9:fe00::", .linkLocal), ("64:ff9b:1::a9fe:a9fe", .linkLocal), ("64:ff9b:1:ff:a9:fea9:fe00::", .linkLocal),
        ("64:ff9b:1::808:808", .privateNetwork), ("64:ff9b:2::808:808", .privateNetwork),
        // 6to4: the IPv4 address in bytes 2 to 5.
        ("2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", .global), ("2002:808:808::1", .global), ("2002:a9fe:a9fe::1", .linkLocal),
        ("2002:a01:203::1", .privateNetwork), ("2002:7f00:1::", .privateNetwork), ("2003::", .global),
        // Teredo: the relay's IPv4 address and the client's (inverted); the worse decides.
        ("2001:0:808:808::fefd:fcfb", .global), ("2001:0:808:808::5601:5601", .linkLocal),
        ("2001:0:a01:203::fefd:fcfb", .privateNetwork), ("2001:0:808:808::f5fe:fdfc", .privateNetwork),
        // 2001::/23, IETF protocol assignments: not global but for the registry's exceptions.
        ("2001:1::", .privateNetwork), ("2001:1::1", .global), ("2001:1::3", .global), ("2001:1::4", .privateNetwork),
        ("2001:2::1", .privateNetwork), ("2001:2:0:ffff::", .privateNetwork), ("2001:2:1::", .privateNetwork),
        ("2001:2:ffff::", .privateNetwork), ("2001:3::1", .global), ("2001:3:ffff:ffff::", .global),
        ("2001:4:111:ffff::", .privateNetwork), ("2001:4:112::1", .global), ("2001:4:113::", .privateNetwork),
        ("2001:f:ffff::", .privateNetwork), ("2001:10::1", .privateNetwork), ("2001:1f:ffff::", .privateNetwork),
        ("2001:20::1", .privateNetwork), ("2001:2f:ffff::", .privateNetwork), ("2001:30::1", .global),
        ("2001:3f:ffff:ffff::", .global), ("2001:40::", .privateNetwork), ("2001:1ff:ffff:ffff::", .privateNetwork),
        ("2001:200::", .global),
        // Documentation: 2001:db8::/32 and 3fff::/20.
        ("2001:db7:ffff:ffff::", .global), ("2001:db8::", .privateNetwork), ("2001:db8:ffff:ffff::", .privateNetwork),
        ("2001:db9::", .global), ("3ffe:ffff:ffff:ffff::", .global), ("3fff::", .privateNetwork),
        ("3fff:fff:ffff:ffff::", .privateNetwork), ("3fff:1000::", .global),
        ("2606:2800:220:1:248:1893:25c8:1946", .global), ("2a00:1450::1", .global),
    ]

    @Test(arguments: scopes) func addressesAreJudgedByTheirScope(address: String, scope: HostPolicy.AddressScope) throws {
        #expect(HostPolicy.scope(of: try Self.address(address)) == scope)
    }

    /// Link-local and metadata addresses are refused by default; an allow-hosts entry lifts a
    /// refusal only when it is that very address (and port, if it names one).
    @Test func policiesPermitAddressesByScopeAndExplicitAddressPatterns() throws {
        func permits(_ policy: HostPolicy, _ address: String, port: Int = 80) throws -> Bool {
            policy.permits(try Self.address(address, port: port))
        }
        func patterns(_ texts: String...) throws -> [HostPattern] { try texts.map { try #require(HostPattern($0)) } }

        let byDefault = HostPolicy()
        for refused in ["169.254.169.254", "fd00:ec2::254", "fe80::1", "::ffff:169.254.169.254", "2002:a9fe:a9fe::"] {
            #expect(try !permits(byDefault, refused), "\(refused)")
        }
        for permitted in ["127.0.0.1", "10.1.2.3", "fec0::1", "8.8.8.8", "2606:2800::1"] {
            #expect(try permits(byDefault, permitted), "\(permitted)")
        }
        #expect(try permits(.unrestricted, "169.254.169.254"))

        let denyPrivate = HostPolicy(denyPrivateAddresses: true)
        for refused in ["127.0.0.1", "::1", "10.1.2.3", "fec0::1", "100::1", "2002:a01:203::1", "64:ff9b::a01:203", "169.254.169.254"] {
            #expect(try !permits(denyPrivate, refused), "\(refused)")
        }
        #expect(try permits(denyPrivate, "8.8.8.8") && permits(denyPrivate, "2606:2800::1"))

        let metadata = HostPolicy(allowedHosts: try patterns("169.254.169.254", "[fd00:ec2:0::254]"))
        #expect(try permits(metadata, "169.254.169.254") && permits(metadata, "fd00:ec2::254"))
        #expect(try !permits(metadata, "169.254.169.253") && !permits(metadata, "fe80::1"))
        let onePort = HostPolicy(allowedHosts: try patterns("169.254.169.254:8080"))
        #expect(try permits(onePort, "169.254.169.254", port: 8080) && !permits(onePort, "169.254.169.254"))
        let names = HostPolicy(allowedHosts: try patterns("*.internal", "metadata.google.internal", "*.254"))
        #expect(try !permits(names, "169.254.169.254"))
        let named = HostPolicy(allowedHosts: try patterns("10.1.2.3", "[fec0::1]"), denyPrivateAddresses: true)
        #expect(try permits(named, "10.1.2.3") && permits(named, "fec0::1"))
        #expect(try !permits(named, "10.1.2.4") && !permits(named, "fec0::2"))
    }

    @Test func addressPatternsMatchTheAddressHoweverItIsWritten() throws {
        let pattern = try #require(HostPattern("[FD00:0EC2:0::254]"))
        #expect(pattern.address?.count == 16)
        #expect(pattern.matches(try HTTPURL("http://[fd00:ec2::254]/")))
        #expect(!pattern.matches(try HTTPURL("http://[fd00:ec2::255]/")))
        #expect(try #require(HostPattern("*.example.com")).address == nil)
        #expect(try #require(HostPattern("10.0.0.7")).address == [10, 0, 0, 7])
    }

    static func address(_ text: String, port: Int = 80) throws -> SocketAddress {
        try SocketAddress.resolve(host: text, port: port)
    }
}
