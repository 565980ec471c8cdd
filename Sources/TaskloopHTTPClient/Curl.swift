import CCurl

/// The libcurl shim: global initialisation, option setting with its return code checked, and
/// URL parsing with curl's own parser (so what we check is what curl will fetch). Every curl
/// return code is turned into a Swift error here, once.
enum Curl {
    /// `curl_global_init` once per process; libcurl 7.84+ makes it thread-safe, this makes it once.
    static let initialized: Bool = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK

    static func set(_ easy: UnsafeMutableRawPointer, _ option: CURLoption, _ value: Int) throws(CurlError) {
        try check(taskloop_easy_setopt_long(easy, option, value), option)
    }

    static func set(_ easy: UnsafeMutableRawPointer, _ option: CURLoption, _ value: String) throws(CurlError) {
        try check(value.withCString { taskloop_easy_setopt_pointer(easy, option, $0) }, option)
    }

    static func set(_ easy: UnsafeMutableRawPointer, _ option: CURLoption, pointer: UnsafeRawPointer?) throws(CurlError) {
        try check(taskloop_easy_setopt_pointer(easy, option, pointer), option)
    }

    static func check(_ code: CURLcode, _ option: CURLoption) throws(CurlError) {
        guard code == CURLE_OK else { throw CurlError(code: code, option: option) }
    }

    static func longInfo(_ easy: UnsafeMutableRawPointer, _ item: CURLINFO) -> Int {
        var value = 0
        return taskloop_easy_getinfo_long(easy, item, &value) == CURLE_OK ? value : 0
    }

    static func offsetInfo(_ easy: UnsafeMutableRawPointer, _ item: CURLINFO) -> Int64 {
        var value: curl_off_t = -1
        return taskloop_easy_getinfo_off_t(easy, item, &value) == CURLE_OK ? Int64(value) : -1
    }

    static func stringInfo(_ easy: UnsafeMutableRawPointer, _ item: CURLINFO) -> String? {
        var value: UnsafeMutablePointer<CChar>?
        guard taskloop_easy_getinfo_pointer(easy, item, &value) == CURLE_OK, let value else { return nil }
        return String(cString: value)
    }

    static func describe(_ code: CURLcode) -> String { String(cString: curl_easy_strerror(code)) }
}

/// A refused libcurl option: the linked libcurl lacks something this build relies on.
struct CurlError: Error, CustomStringConvertible {
    let code: CURLcode
    let option: CURLoption

    var description: String { "curl_easy_setopt(\(option.rawValue)) failed: \(Curl.describe(code))" }
}

/// An absolute http or https URL as libcurl parses it.
public struct HTTPURL: Sendable, Equatable, CustomStringConvertible {
    public let text: String
    public let scheme: String
    /// Lower-cased; an IPv6 literal without its brackets.
    public let host: String
    public let port: Int

    public var description: String { text }

    /// Parses `text`; throws a message fit for a client when it is not an http(s) URL.
    public init(_ text: String) throws(HTTPURLError) {
        guard !text.isEmpty, text.utf8.count <= 8_192 else { throw HTTPURLError("must be an http or https URL of at most 8192 bytes.") }
        guard Curl.initialized, let handle = curl_url() else { throw HTTPURLError("cannot be parsed: libcurl is unavailable.") }
        defer { curl_url_cleanup(handle) }
        let status = curl_url_set(handle, CURLUPART_URL, text, 0)
        guard status == CURLUE_OK else {
            throw HTTPURLError("is not a valid absolute URL (\(String(cString: curl_url_strerror(status)))).")
        }
        func part(_ which: CURLUPart, _ flags: UInt32 = 0) -> String? {
            var value: UnsafeMutablePointer<CChar>?
            guard curl_url_get(handle, which, &value, flags) == CURLUE_OK, let value else { return nil }
            defer { curl_free(value) }
            return String(cString: value)
        }
        guard let scheme = part(CURLUPART_SCHEME)?.lowercased(), scheme == "http" || scheme == "https" else {
            throw HTTPURLError("must use http or https.")
        }
        guard var host = part(CURLUPART_HOST), !host.isEmpty,
              let port = part(CURLUPART_PORT, UInt32(CURLU_DEFAULT_PORT)).flatMap({ Int($0) }) else {
            throw HTTPURLError("must name a host.")
        }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.text = text
        self.scheme = scheme
        self.host = host.lowercased()
        self.port = port
    }

    /// Same scheme, host and port: the caller's headers follow a redirect only within one origin.
    func sameOrigin(as other: HTTPURL) -> Bool {
        scheme == other.scheme && host == other.host && port == other.port
    }
}

public struct HTTPURLError: Error, Sendable {
    /// Completes a sentence that starts with the field's name, e.g. "url must use http or https."
    public let message: String
    init(_ message: String) { self.message = message }
}
