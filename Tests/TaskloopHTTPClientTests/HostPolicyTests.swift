import Testing
import TaskloopHTTPClient

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

    @Test func internalAddressesAreRecognised() {
        let internalV4: [(UInt8, UInt8, UInt8, UInt8)] = [
            (127, 0, 0, 1), (10, 1, 2, 3), (172, 16, 0, 1), (172, 31, 255, 255), (192, 168, 1, 1),
            (169, 254, 169, 254), (100, 64, 0, 1), (0, 0, 0, 0), (224, 0, 0, 1), (255, 255, 255, 255),
        ]
        for (a, b, c, d) in internalV4 { #expect(HostPolicy.isInternal(ipv4: a, b, c, d), "\(a).\(b).\(c).\(d)") }
        let publicV4: [(UInt8, UInt8, UInt8, UInt8)] = [(93, 184, 216, 34), (8, 8, 8, 8), (172, 32, 0, 1), (100, 128, 0, 1)]
        for (a, b, c, d) in publicV4 { #expect(!HostPolicy.isInternal(ipv4: a, b, c, d), "\(a).\(b).\(c).\(d)") }

        func v6(_ head: [UInt8], tail: [UInt8] = []) -> [UInt8] { head + [UInt8](repeating: 0, count: 16 - head.count - tail.count) + tail }
        #expect(HostPolicy.isInternal(ipv6: v6([], tail: [1])))  // ::1
        #expect(HostPolicy.isInternal(ipv6: v6([])))  // ::
        #expect(HostPolicy.isInternal(ipv6: v6([0xfe, 0x80], tail: [1])))  // fe80::1
        #expect(HostPolicy.isInternal(ipv6: v6([0xfd, 0x00, 0x0e, 0xc2], tail: [0x02, 0x54])))  // fd00:ec2::254
        #expect(HostPolicy.isInternal(ipv6: v6([], tail: [0xff, 0xff, 127, 0, 0, 1])))  // ::ffff:127.0.0.1
        #expect(HostPolicy.isInternal(ipv6: v6([0x00, 0x64, 0xff, 0x9b], tail: [10, 0, 0, 1])))  // 64:ff9b::10.0.0.1
        #expect(!HostPolicy.isInternal(ipv6: v6([0x26, 0x06, 0x28, 0x00], tail: [1])))  // 2606:2800::1
        #expect(!HostPolicy.isInternal(ipv6: v6([], tail: [0xff, 0xff, 8, 8, 8, 8])))  // ::ffff:8.8.8.8
    }
}
