import CCurl
import Crypto
import Glibc
import TaskloopLoop

/// One request and its redirects on one curl easy handle. Created and driven by `HTTPClient`;
/// loop thread only. Redirects are followed here, not by curl, so that every hop is checked
/// against the host policy before it is connected to and the caller's headers stay with their
/// origin. The final response's body is kept (up to `maxKeptBodyBytes`) or, for a streamed
/// request, handed to its `HTTPBodyStream` piece by piece.
public final class HTTPTransfer {
    private unowned let client: HTTPClient
    let easy: UnsafeMutableRawPointer
    private var request: HTTPClientRequest
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private let errorBuffer: UnsafeMutablePointer<CChar>
    private var onProgress: ((Int64, Int64?) -> Void)?
    private var onComplete: ((Result<HTTPClientResponse, HTTPClientError>) -> Void)?
    private var bodyStream: HTTPBodyStream?
    private let started: UInt64
    private var redirects = 0
    /// This hop's addresses the policy refused, and why.
    private var refusedAddresses: [(host: String, scope: HostPolicy.AddressScope)] = []
    private var cancelled = false

    // The current hop's response; `status` is curl's, read when its header block ends.
    private var status = 0
    private var headers: [HTTPHeaderField] = []
    private var kept: [UInt8] = []
    private var received: Int64 = 0
    private var expected: Int64?
    private var digest = SHA256()
    /// This hop's response is the final one (not a redirect about to be followed): its body
    /// counts for progress and goes to the stream.
    private var reportsProgress = true

    private static let redirectStatuses: Set<Int> = [301, 302, 303, 307, 308]
    private static let maxHeaderFields = 512

    init(
        client: HTTPClient, request: HTTPClientRequest,
        onProgress: @escaping (Int64, Int64?) -> Void,
        bodyStream: HTTPBodyStream? = nil,
        onComplete: @escaping (Result<HTTPClientResponse, HTTPClientError>) -> Void
    ) throws(HTTPClientError) {
        guard let easy = curl_easy_init() else { throw HTTPClientError(.clientFailed, "curl_easy_init failed.") }
        self.client = client
        self.easy = easy
        self.request = request
        self.onProgress = onProgress
        self.onComplete = onComplete
        self.bodyStream = bodyStream
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorBuffer.initialize(to: 0)
        started = client.loop.now
        do {
            try configure()
            try applyHop()
        } catch {
            throw HTTPClientError(.clientFailed, "\(error)")
        }
    }

    deinit {
        curl_easy_cleanup(easy)
        curl_slist_free_all(headerList)
        errorBuffer.deallocate()
    }

    /// Stops the transfer; its connection is closed and no callback follows.
    public func cancel() {
        guard !cancelled else { return }
        cancelled = true
        onProgress = nil
        onComplete = nil
        bodyStream = nil
        client.cancel(self)
    }

    static func owner(of easy: UnsafeMutableRawPointer) -> HTTPTransfer? {
        var pointer: UnsafeMutableRawPointer?
        guard taskloop_easy_getinfo_pointer(easy, CURLINFO_PRIVATE, &pointer) == CURLE_OK, let pointer else { return nil }
        return Unmanaged<HTTPTransfer>.fromOpaque(pointer).takeUnretainedValue()
    }

    /// Options that hold for every hop.
    private func configure() throws(CurlError) {
        let me = Unmanaged.passUnretained(self).toOpaque()
        try Curl.set(easy, CURLOPT_PRIVATE, pointer: me)
        try Curl.set(easy, CURLOPT_NOSIGNAL, 1)
        // A transfer cancelled while its name is being resolved leaves the resolver thread to
        // finish by itself; without this curl joins it, blocking the loop for as long as the
        // DNS lookup takes (10 s against an unanswering resolver).
        try Curl.set(easy, CURLOPT_QUICK_EXIT, 1)
        try Curl.set(easy, CURLOPT_PROTOCOLS_STR, "http,https")
        try Curl.set(easy, CURLOPT_FOLLOWLOCATION, 0)
        try Curl.set(easy, CURLOPT_CONNECTTIMEOUT_MS, Int(request.connectTimeoutMilliseconds))
        if let timeout = request.timeoutMilliseconds { try Curl.set(easy, CURLOPT_TIMEOUT_MS, Int(timeout)) }
        try Curl.set(easy, CURLOPT_ERRORBUFFER, pointer: errorBuffer)
        try Curl.set(easy, CURLOPT_USERAGENT, "taskloop")
        try Curl.check(taskloop_easy_setopt_write_callback(easy, CURLOPT_WRITEFUNCTION, bodyReceived), CURLOPT_WRITEFUNCTION)
        try Curl.set(easy, CURLOPT_WRITEDATA, pointer: me)
        try Curl.check(taskloop_easy_setopt_write_callback(easy, CURLOPT_HEADERFUNCTION, headerReceived), CURLOPT_HEADERFUNCTION)
        try Curl.set(easy, CURLOPT_HEADERDATA, pointer: me)
        try Curl.check(taskloop_easy_setopt_opensocket_callback(easy, openSocket), CURLOPT_OPENSOCKETFUNCTION)
        try Curl.set(easy, CURLOPT_OPENSOCKETDATA, pointer: me)
        // Through a proxy the checks would see the proxy, not the destination.
        if client.policy.isRestricted { try Curl.set(easy, CURLOPT_PROXY, "") }
    }

    /// URL, method, body and header fields of the current hop.
    private func applyHop() throws(CurlError) {
        try Curl.set(easy, CURLOPT_URL, request.url.text)
        try Curl.set(easy, CURLOPT_HTTPGET, 1)
        try Curl.set(easy, CURLOPT_CUSTOMREQUEST, pointer: nil)
        if request.method == "HEAD" {
            try Curl.set(easy, CURLOPT_NOBODY, 1)
        } else if let body = request.body ?? (request.method == "POST" ? [] : nil) {
            try Curl.check(taskloop_easy_setopt_off_t(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)),
                           CURLOPT_POSTFIELDSIZE_LARGE)
            // COPYPOSTFIELDS copies exactly POSTFIELDSIZE bytes, so an empty body needs any valid pointer.
            let status = body.isEmpty ? taskloop_easy_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, "")
                : body.withUnsafeBytes { taskloop_easy_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, $0.baseAddress) }
            try Curl.check(status, CURLOPT_COPYPOSTFIELDS)
            if request.method != "POST" { try Curl.set(easy, CURLOPT_CUSTOMREQUEST, request.method) }
        } else if request.method != "GET" {
            try Curl.set(easy, CURLOPT_CUSTOMREQUEST, request.method)
        }
        curl_slist_free_all(headerList)
        headerList = nil
        // curl drops "Name:" (it removes a field of its own so); "Name;" is the field, empty.
        // "Expect:" keeps curl from waiting for 100-continue before sending a body.
        let lines = request.headers.map { $0.value.isEmpty ? "\($0.name);" : "\($0.name): \($0.value)" }
            + request.omittedFields.map { "\($0):" } + ["Expect:"]
        for line in lines {
            headerList = curl_slist_append(headerList, line)
        }
        try Curl.set(easy, CURLOPT_HTTPHEADER, pointer: headerList)
    }

    private func resetResponse() {
        status = 0
        headers.removeAll()
        kept.removeAll()
        received = 0
        expected = nil
        digest = SHA256()
        reportsProgress = true
        refusedAddresses.removeAll()
        errorBuffer.pointee = 0
    }

    // MARK: curl callbacks (inside curl: no multi calls here)

    /// One header line as curl delivers it (status line, field, continuation, or the blank
    /// line ending a block), parsed at the byte level: this runs for every field of every
    /// response.
    fileprivate func header(_ line: UnsafeRawBufferPointer) -> Int {
        guard !cancelled else { return 0 }
        let content = Self.trimmed(line[...])
        if content.isEmpty {
            // curl has parsed this block's status line by now; an interim 1xx block is skipped.
            status = Curl.longInfo(easy, CURLINFO_RESPONSE_CODE)
            guard status >= 200 else { return line.count }
            let length = Curl.offsetInfo(easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T)
            expected = length >= 0 ? length : nil
            reportsProgress = !(request.followRedirects && Self.redirectStatuses.contains(status)
                && headers.contains { $0.name == "location" })
            if reportsProgress {
                onProgress?(0, expected)
                if let bodyStream {
                    bodyStream.onHead(status, headers)
                    // Cancelled from the callback: curl stops at once.
                    if cancelled { return 0 }
                }
            }
        } else if content.starts(with: "HTTP/".utf8) {
            headers.removeAll()
        } else if line[0] == UInt8(ascii: " ") || line[0] == UInt8(ascii: "\t") {
            if !headers.isEmpty { headers[headers.count - 1].value += " " + String(decoding: content, as: UTF8.self) }
        } else if let colon = content.firstIndex(of: UInt8(ascii: ":")), headers.count < Self.maxHeaderFields {
            let name = String(decoding: content[..<colon].map { (0x41...0x5a).contains($0) ? $0 | 0x20 : $0 }, as: UTF8.self)
            let value = String(decoding: Self.trimmed(content[(colon + 1)...]), as: UTF8.self)
            headers.append(HTTPHeaderField(name, value))
        }
        return line.count
    }

    /// Without surrounding spaces, tabs and line ends.
    private static func trimmed(_ bytes: Slice<UnsafeRawBufferPointer>) -> Slice<UnsafeRawBufferPointer> {
        func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 || byte == 0x0d || byte == 0x0a }
        var start = bytes.startIndex
        var end = bytes.endIndex
        while start < end, isSpace(bytes[start]) { start += 1 }
        while end > start, isSpace(bytes[end - 1]) { end -= 1 }
        return bytes[start..<end]
    }

    fileprivate func body(_ chunk: UnsafeRawBufferPointer) -> Int {
        guard !cancelled else { return 0 }
        received += Int64(chunk.count)
        digest.update(bufferPointer: chunk)
        if let bodyStream {
            if reportsProgress {
                bodyStream.onChunk(chunk)
                if cancelled { return 0 }
            }
        } else {
            let room = request.maxKeptBodyBytes - kept.count
            if room > 0 { kept.append(contentsOf: chunk.prefix(room)) }
        }
        if reportsProgress { onProgress?(received, expected) }
        return chunk.count
    }

    fileprivate func open(_ address: UnsafeMutablePointer<curl_sockaddr>) -> curl_socket_t {
        let family = address.pointee.family
        if client.policy.isRestricted {
            let raw = UnsafeRawPointer(address) + MemoryLayout<curl_sockaddr>.offset(of: \curl_sockaddr.addr)!
            let peer = SocketAddress(copying: raw, length: Int(address.pointee.addrlen))
            if !(peer.map(client.policy.permits) ?? false) {
                let refused = (host: peer?.host ?? "address family \(family)", scope: peer.map(HostPolicy.scope) ?? .linkLocal)
                if !refusedAddresses.contains(where: { $0.host == refused.host }) { refusedAddresses.append(refused) }
                return CURL_SOCKET_BAD
            }
        }
        // Close-on-exec: programs started by `exec` tasks must not inherit these sockets.
        return socket(family, address.pointee.socktype | Int32(SOCK_CLOEXEC.rawValue), address.pointee.protocol)
    }

    // MARK: completion (outside curl)

    /// The easy handle is off the multi handle; either follow a redirect or report.
    func finished(_ code: CURLcode) {
        guard code == CURLE_OK else { return complete(.failure(error(for: code))) }
        if request.followRedirects, Self.redirectStatuses.contains(status), let location = Curl.stringInfo(easy, CURLINFO_REDIRECT_URL) {
            return follow(location)
        }
        let response = HTTPClientResponse(
            status: status, headers: headers, body: kept, bytes: received, sha256: Array(digest.finalize()),
            url: request.url, redirects: redirects, durationMilliseconds: client.loop.now - started, streamed: bodyStream != nil)
        complete(.success(response))
    }

    private func follow(_ location: String) {
        redirects += 1
        guard redirects <= request.maxRedirects else {
            return complete(.failure(HTTPClientError(.tooManyRedirects, "More than \(request.maxRedirects) redirects (last to \(location)).")))
        }
        let next: HTTPURL
        do {
            next = try HTTPURL(location)
        } catch {
            return complete(.failure(HTTPClientError(.invalidRedirect, "Redirect to \(location): the location \(error.message)")))
        }
        guard client.policy.allows(next) else {
            return complete(.failure(HTTPClientError(.hostNotAllowed, "Redirect to \(next.host), which is not in the allowed hosts.")))
        }
        if (status == 303 && request.method != "HEAD") || ((status == 301 || status == 302) && request.method == "POST") {
            request.method = "GET"
            request.body = nil
            request.headers.removeAll { ["content-type", "content-length"].contains($0.name.lowercased()) }
        }
        if !next.sameOrigin(as: request.url) {
            // The caller's headers were meant for the origin it named (API keys travel in any of
            // them, not only Authorization); another origin gets none, only the type of a body
            // that 307 and 308 send on.
            let sendsBody = request.body != nil
            request.headers.removeAll { !sendsBody || $0.name.lowercased() != "content-type" }
        }
        request.url = next
        resetResponse()
        do {
            try applyHop()
            try client.add(self)
        } catch let error as HTTPClientError {
            complete(.failure(error))
        } catch {
            complete(.failure(HTTPClientError(.clientFailed, "\(error)")))
        }
    }

    func complete(_ result: Result<HTTPClientResponse, HTTPClientError>) {
        let onComplete = self.onComplete
        self.onComplete = nil
        onProgress = nil
        bodyStream = nil
        onComplete?(result)
    }

    private func error(for code: CURLcode) -> HTTPClientError {
        let detail = errorBuffer.pointee == 0 ? Curl.describe(code) : String(cString: errorBuffer)
        let target = "\(request.url.host):\(request.url.port)"
        switch code {
        case CURLE_COULDNT_CONNECT where !refusedAddresses.isEmpty:
            let hosts = refusedAddresses.map(\.host).joined(separator: " and ")
            let reason = refusedAddresses.contains { $0.scope == .linkLocal }
                ? "link-local or cloud metadata addresses this server connects to only when --http-allow-hosts names the address"
                : "internal addresses this server refuses to connect to (--http-deny-private)"
            return HTTPClientError(.addressRefused, "\(request.url.host) resolved to \(hosts), \(reason).")
        case CURLE_COULDNT_RESOLVE_HOST:
            return HTTPClientError(.dnsFailed, "Could not resolve \(request.url.host): \(detail)")
        case CURLE_COULDNT_CONNECT:
            return HTTPClientError(.connectFailed, "Could not connect to \(target): \(detail)")
        case CURLE_OPERATION_TIMEDOUT where request.timeoutMilliseconds != nil:
            return HTTPClientError(.timedOut, "The request to \(target) timed out: \(detail)")
        case CURLE_OPERATION_TIMEDOUT:
            return HTTPClientError(.connectTimeout, "Connecting to \(target) timed out after \(request.connectTimeoutMilliseconds) ms.")
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
             CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS:
            return HTTPClientError(.tlsFailed, "TLS with \(target) failed: \(detail)")
        default:
            return HTTPClientError(.transferFailed, "The transfer from \(target) failed: \(detail)")
        }
    }
}

private let bodyReceived: curl_write_callback = { data, size, count, transfer in
    let bytes = UnsafeRawBufferPointer(start: data, count: size * count)
    return Unmanaged<HTTPTransfer>.fromOpaque(transfer!).takeUnretainedValue().body(bytes)
}

private let headerReceived: curl_write_callback = { data, size, count, transfer in
    let bytes = UnsafeRawBufferPointer(start: data, count: size * count)
    return Unmanaged<HTTPTransfer>.fromOpaque(transfer!).takeUnretainedValue().header(bytes)
}

private let openSocket: curl_opensocket_callback = { transfer, _, address in
    Unmanaged<HTTPTransfer>.fromOpaque(transfer!).takeUnretainedValue().open(address!)
}
