import TaskloopHTTP
import TaskloopHTTPClient
import TaskloopLoop

/// Sends a request for a cell another replica owns to that replica, over keep-alive HTTP, and
/// brings its answer back. The request arrives as the client sent it, but for the header
/// fields: only the end-to-end ones the API reads go on (a client's other fields, hop-by-hop
/// ones among them, stay here), and `Taskloop-Forwarded-By` names this replica, so the owner
/// answers itself and never forwards again. The owner's status, body and end-to-end fields
/// come back.
///
/// It never hangs and never guesses: an owner that cannot be reached (nothing was sent) is 503
/// `owner_unreachable`, to retry; one that does not answer in time is 504 `owner_timeout`; an
/// exchange that broke after the request went out, or an answer over the size limit, is 502,
/// since the change may have been made.
///
/// Lifecycle: `close()` answers the forwards in flight with 503 and frees the client; the loop
/// can finish after that.
///
/// Threading: the loop's thread only, completions included.
public final class ClusterForwarder {
    public struct Settings: Sendable {
        /// Longest one forwarded exchange may take: past the longest wait the API lets a
        /// request ask for (`GET /tasks/{id}?wait=` and a lease call's `wait_s`, 60 s each) and
        /// the owner's own time to answer.
        public var requestTimeoutMilliseconds: UInt64 = 75_000
        /// Short: members are near, and a client should learn soon that an owner is gone.
        public var connectTimeoutMilliseconds: UInt64 = 1_000
        /// The longest answer brought back, held whole in memory. The service bounds its
        /// answers by `--max-response-bytes` (64 MiB), which a page of `GET /tasks` passes by
        /// up to one task: give this the service's bound with room for that.
        public var maxResponseBytes = 128 << 20
        /// Connections open to one member at once; further forwards wait for one of them.
        /// Each long poll holds one for as long as it waits.
        public var maxConnectionsPerMember = 256

        public init() {}
    }

    /// The field naming the replica that forwarded a request: its owner answers it itself.
    public static let forwardedByField = "Taskloop-Forwarded-By"

    public let settings: Settings
    private let replica: String
    private let client: HTTPClient
    private var isClosed = false

    /// The request fields the API reads, and only those: a client's others, hop-by-hop
    /// (`Connection`, `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
    /// `Proxy-*`) or not, stay here, and framing is the client's own. `Host` goes on as the
    /// client sent it, not as the member's address: the owner judges it (`--allowed-hosts`)
    /// and compares `Origin` with it (cross-site requests) as this replica did, so a request
    /// is admitted or refused alike wherever its cell lives.
    static let requestFields = [
        "Host", "Authorization", "Content-Type", "Accept", "User-Agent", "Idempotency-Key", "Origin", "Sec-Fetch-Site",
        "Last-Event-ID", "If-None-Match", "Taskloop-Batch-Indices",
    ]
    /// Fields curl would write itself when the request has none; an empty one keeps it from
    /// inventing them (a bodiless POST would go out as a form, which the owner refuses).
    private static let fieldsCurlWrites: Set<String> = ["Content-Type", "Accept", "User-Agent"]
    /// The answer fields the API sets. Not the CORS fields (`Access-Control-*`, `Vary`): this
    /// replica's connection adds its own, and a second copy makes browsers refuse the answer.
    /// Framing, `Date` and `Connection` are this replica's server's.
    static let answerFields: [String: String] = Dictionary(uniqueKeysWithValues: [
        "Content-Type", "Location", "Retry-After", "Idempotent-Replayed", "Event-Seq", "ETag", "Cache-Control",
        "WWW-Authenticate", "Allow",
    ].map { ($0.lowercased(), $0) })

    /// `replica` is this replica's name, which the owner sees in `Taskloop-Forwarded-By`.
    public init(loop: EventLoop, replica: String, settings: Settings = Settings()) throws(HTTPClientError) {
        self.replica = replica
        self.settings = settings
        // Members advertise internal addresses (loopback, private networks), which the policy
        // for tasks may refuse (`--http-deny-private`); this client may reach them, and that is
        // safe because its addresses come only from the cluster's own members table, never
        // from a request: a client chooses the path, not the destination. Link-local and
        // metadata addresses, which no member advertises, stay refused. A restricted policy
        // also keeps curl off any proxy the environment names: the cluster's requests, tokens
        // and all, go straight to the member.
        client = try HTTPClient(loop: loop, policy: HostPolicy(denyPrivateAddresses: false, denyLinkLocalAddresses: true),
                                maxHostConnections: settings.maxConnectionsPerMember)
    }

    /// Sends `request` to the member at `address` (as the member advertises it: "host:port",
    /// or a base URL, "http://host:port") and calls `completion` once with the owner's answer
    /// or a problem, never from inside curl. When nothing can be sent (the forwarder is closed,
    /// `address` is malformed, the request's target cannot be written as a URL) `completion`
    /// is called before this returns.
    ///
    /// With `whenUnreachable`, an owner that cannot be reached (nothing was sent: a refused or
    /// timed-out connect) calls it instead of answering 503: the caller may look for the cell's
    /// owner again, as it does while a cell moves.
    ///
    /// Cancelling what it returns (the client went away) drops the exchange and its connection,
    /// so the owner sees the client leave too: a long poll or lease call waiting there ends.
    @discardableResult
    public func forward(_ request: HTTPRequest, to address: String, whenUnreachable: (() -> Void)? = nil,
                        completion: @escaping (HTTPResponse) -> Void) -> ForwardedRequest {
        let forwarded = ForwardedRequest()
        guard !isClosed else {
            completion(Self.closedProblem)
            return forwarded
        }
        var base = address.contains("://") ? address : "http://" + address
        if base.hasSuffix("/") { base.removeLast() }
        guard (try? HTTPURL(base + "/")) != nil else {
            completion(Self.unreachable("The address of the replica that serves this request is malformed."))
            return forwarded
        }
        let url: HTTPURL
        do {
            url = try HTTPURL(base + request.rawPath + Self.query(request.queryItems))
        } catch {
            completion(HTTPProblem(.badRequest, detail: "The request's target cannot be forwarded: it \(error.message)").response())
            return forwarded
        }
        var outbound = HTTPClientRequest(method: request.method.description, url: url, headers: fields(of: request),
                                         body: request.body.isEmpty ? nil : request.body)
        outbound.followRedirects = false
        // What the client did not send, curl must not make up.
        outbound.omittedFields = Self.fieldsCurlWrites.filter { Self.values(of: $0, in: request).isEmpty }.sorted()
        outbound.connectTimeoutMilliseconds = settings.connectTimeoutMilliseconds
        outbound.timeoutMilliseconds = settings.requestTimeoutMilliseconds
        let exchange = Exchange(loop: client.loop, limit: settings.maxResponseBytes, completion: completion)
        exchange.unreachable = whenUnreachable
        do {
            exchange.transfer = try client.start(outbound, streamingTo: exchange.stream) { [unowned self] result in
                exchange.finish(result, closed: isClosed, timeout: settings.requestTimeoutMilliseconds)
            }
        } catch {
            exchange.finish(.failure(error), closed: isClosed, timeout: settings.requestTimeoutMilliseconds)
        }
        forwarded.exchange = exchange
        return forwarded
    }

    /// A request on its way to its owner, which the caller may give up.
    public final class ForwardedRequest {
        fileprivate weak var exchange: Exchange?

        /// Nothing more is called back; the transfer and its connection end.
        public func cancel() {
            exchange?.cancel()
        }
    }

    /// Answers the forwards in flight with 503 and frees the client and its connections.
    public func close() {
        guard !isClosed else { return }
        isClosed = true
        client.close()
    }

    /// The values of field `name` that are forwarded: a line break in a value would start a
    /// field of the client's making.
    private static func values(of name: String, in request: HTTPRequest) -> [String] {
        request.headers.values(for: name).filter { !$0.utf8.contains { $0 == 0x0d || $0 == 0x0a || $0 == 0 } }
    }

    private func fields(of request: HTTPRequest) -> [HTTPHeaderField] {
        var fields: [HTTPHeaderField] = []
        for name in Self.requestFields {
            for value in Self.values(of: name, in: request) { fields.append(HTTPHeaderField(name, value)) }
        }
        fields.append(HTTPHeaderField(Self.forwardedByField, (Self.forwardedBy(request) + [replica]).joined(separator: ", ")))
        return fields
    }

    /// The replicas a request came through, in order (`Taskloop-Forwarded-By`). A replica
    /// forwards only a request that has not come through it: a cell that moves while its
    /// request is on the way is followed, and no request goes round in a loop. A client may
    /// name replicas too; the worst it can do is keep its own request from being forwarded.
    public static func forwardedBy(_ request: HTTPRequest) -> [String] {
        request.headers.values(for: forwardedByField).flatMap { $0.split(separator: ",") }
            .map { String($0.filter { $0 != " " && $0 != "\t" }) }
            .filter { name in !name.isEmpty && name.utf8.allSatisfy { (0x21...0x7E).contains($0) } }
    }

    /// The query as `?name=value&...`, each part percent-encoded anew: the request keeps its
    /// items decoded, and the owner decodes these to the same items.
    static func query(_ items: [HTTPRequest.QueryItem]) -> String {
        guard !items.isEmpty else { return "" }
        return "?" + items.map { percentEncoded($0.name) + "=" + percentEncoded($0.value) }.joined(separator: "&")
    }

    private static func percentEncoded(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                bytes.append(byte)
            default:
                bytes.append(UInt8(ascii: "%"))
                bytes.append(hex[Int(byte >> 4)])
                bytes.append(hex[Int(byte & 0xF)])
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func unreachable(_ detail: String) -> HTTPResponse {
        HTTPProblem(.serviceUnavailable, detail: detail, code: "owner_unreachable", headers: ["Retry-After": "1"]).response()
    }

    static let closedProblem = HTTPProblem(.serviceUnavailable, detail: "This replica is shutting down; try again.",
                                           headers: ["Retry-After": "1"]).response()

    /// One forward: the answer's body as it arrives, and the completion, called once.
    fileprivate final class Exchange {
        private let loop: EventLoop
        private let limit: Int
        private var completion: ((HTTPResponse) -> Void)?
        var unreachable: (() -> Void)?
        var transfer: HTTPTransfer?
        private var body: [UInt8] = []

        init(loop: EventLoop, limit: Int, completion: @escaping (HTTPResponse) -> Void) {
            self.loop = loop
            self.limit = limit
            self.completion = completion
        }

        var stream: HTTPBodyStream {
            HTTPBodyStream(onHead: { [unowned self] _, headers in received(headers) }, onChunk: { [unowned self] in received($0) })
        }

        private func received(_ headers: [HTTPHeaderField]) {
            if let length = headers.first(where: { $0.name == "content-length" }).flatMap({ Int($0.value) }) {
                body.reserveCapacity(min(length, limit))
            }
        }

        private func received(_ bytes: UnsafeRawBufferPointer) {
            guard body.count + bytes.count <= limit else {
                // A cancelled transfer calls nothing back, so the answer is given here, once
                // curl has returned: a completion may do anything, close the forwarder too.
                transfer?.cancel()
                transfer = nil
                body = []
                let problem = HTTPProblem(HTTPStatus(code: 502), detail: "The answer of the replica that serves this request is "
                    + "larger than \(limit) bytes.", code: "owner_answer_too_large").response()
                let me = LoopBound(self, loop: loop)
                if !loop.execute({ me.value.answer(problem) }) { answer(problem) }
                return
            }
            body.append(contentsOf: bytes)
        }

        func finish(_ result: Result<HTTPClientResponse, HTTPClientError>, closed: Bool, timeout: UInt64) {
            switch result {
            case .success(let response):
                var headers = HTTPHeaders()
                for field in response.headers {
                    if let name = ClusterForwarder.answerFields[field.name] { headers.add(name, field.value) }
                }
                answer(HTTPResponse(status: HTTPStatus(code: response.status), headers: headers, body: body))
            case .failure where closed:
                answer(ClusterForwarder.closedProblem)
            case .failure(let error):
                switch error.code {
                case .timedOut:
                    answer(HTTPProblem(HTTPStatus(code: 504), detail: "The replica that serves this request did not answer within \(timeout) ms.",
                                       code: "owner_timeout").response())
                case .transferFailed:
                    answer(HTTPProblem(HTTPStatus(code: 502), detail: "The connection to the replica that serves this request broke "
                        + "before its answer was complete; the request may have taken effect.", code: "owner_failed").response())
                default:
                    if let unreachable {
                        self.unreachable = nil
                        completion = nil
                        transfer = nil
                        unreachable()
                    } else {
                        answer(ClusterForwarder.unreachable("The replica that serves this request cannot be reached; try again."))
                    }
                }
            }
        }

        func cancel() {
            transfer?.cancel()
            transfer = nil
            completion = nil
            unreachable = nil
        }

        private func answer(_ response: HTTPResponse) {
            let completion = self.completion
            self.completion = nil
            transfer = nil
            completion?(response)
        }
    }
}
