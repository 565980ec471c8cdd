import TaskloopHTTPClient
import TaskloopJSON
import TaskloopLoop

/// What a call to the server came to.
public enum ServerReply {
    /// The server answered, whatever the status. A stream's answer has an empty body when it
    /// was a 2xx (its body went to the stream's consumer).
    case answered(ServerResponse)
    /// No usable answer: no connection, an exchange that failed or timed out, or an answer
    /// larger than the client reads. Trying again later may help.
    case failed(String)
}

/// One answer of the server.
public struct ServerResponse {
    public let status: Int
    /// Names lower-cased, in the order received.
    public let headers: [HTTPHeaderField]
    public let body: [UInt8]
    /// The body parsed, when it is JSON (problems included).
    public let json: JSONValue?

    public init(status: Int, headers: [HTTPHeaderField], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
        json = body.isEmpty ? nil : try? JSONParser.parse(body)
    }

    public var isSuccess: Bool { (200...299).contains(status) }

    /// The first field named `name` (any case).
    public func header(_ name: String) -> String? {
        let lowered = name.lowercased()
        return headers.first { $0.name == lowered }?.value
    }

    /// What the server said went wrong (RFC 9457), for a status of 400 or more.
    public var problem: ServerProblem? {
        status >= 400 ? ServerProblem(status: status, document: json?.objectValue) : nil
    }
}

/// An `application/problem+json` answer as a client shows it. The members are the server's
/// words, so they are passed on rather than rephrased; an answer that is not a problem
/// document (a proxy's error page) still has its status.
public struct ServerProblem: CustomStringConvertible {
    public let status: Int
    public let title: String?
    public let detail: String?
    /// The server's word for programs (`not_found`, `lease_lost`, ...).
    public let code: String?
    /// `errors: [{field, message}]` of a validation problem.
    public let fieldErrors: [FieldError]

    public struct FieldError {
        public let field: String
        public let message: String
    }

    public init(status: Int, document: JSONObject?) {
        self.status = status
        title = document?["title"]?.stringValue
        detail = document?["detail"]?.stringValue
        code = document?["code"]?.stringValue
        fieldErrors = document?["errors"]?.arrayValue?.compactMap { error in
            guard let object = error.objectValue, let field = object["field"]?.stringValue,
                  let message = object["message"]?.stringValue else { return nil }
            return FieldError(field: field, message: message)
        } ?? []
    }

    /// The detail, else the title, else the status: one line for a log.
    public var summary: String { detail ?? title ?? "status \(status)" }

    /// `status title: detail`, then `field: message` for each invalid field.
    public var description: String {
        var text = "\(status)\(title.map { " \($0)" } ?? "")"
        if let detail { text += ": \(detail)" }
        for error in fieldErrors { text += "\n  \(error.field): \(error.message)" }
        return text
    }
}

/// One call in flight; `cancel()` ends it without its completion running. The transfer holds
/// it until then, so a caller need not. Loop thread only.
public final class ServerCall {
    fileprivate var transfer: HTTPTransfer?
    fileprivate var completion: ((ServerReply) -> Void)?

    public func cancel() {
        completion = nil
        transfer?.cancel()
        transfer = nil
    }

    fileprivate func finish(_ reply: ServerReply) {
        transfer = nil
        guard let completion else { return }
        self.completion = nil
        completion(reply)
    }
}

/// Calls to a Taskloop server's API over the libcurl client on the loop: a base URL (a path
/// prefix is kept), a bearer token, a time limit on every call, answers read up to a size and
/// parsed as JSON, and event streams handed over as they arrive. It sorts nothing: what a
/// status means is the caller's business (the worker retries what a command-line client
/// reports).
///
/// Threading: loop thread only. A completion always runs on a later loop turn than the call
/// that asked, so a caller can store the `ServerCall` before its answer arrives.
public final class ServerClient {
    private let client: HTTPClient
    /// The server's URL without a trailing slash.
    public let base: String
    private let authorization: HTTPHeaderField?
    /// Longest a call may take (a call that the server holds on purpose gets its hold on top);
    /// also the connect timeout of streams.
    public let timeoutMilliseconds: UInt64
    /// Largest answer read; a larger one is a failed call.
    public let maxAnswerBytes: Int

    public init(client: HTTPClient, server: HTTPURL, authToken: String?, timeoutMilliseconds: UInt64, maxAnswerBytes: Int) {
        self.client = client
        var base = server.text
        while base.hasSuffix("/") { base.removeLast() }
        self.base = base
        authorization = authToken.map { HTTPHeaderField("Authorization", "Bearer \($0)") }
        self.timeoutMilliseconds = timeoutMilliseconds
        self.maxAnswerBytes = maxAnswerBytes
    }

    /// Sends `method` to `path` (which starts with `/`), with `body` as JSON when given.
    /// `holdMilliseconds` is how long the server may hold the call on purpose (a long poll),
    /// on top of the usual limit.
    @discardableResult
    public func call(_ method: String, _ path: String, body: [UInt8]? = nil, headers extra: [HTTPHeaderField] = [],
                     holdMilliseconds: UInt64 = 0, _ completion: @escaping (ServerReply) -> Void) -> ServerCall {
        let call = ServerCall()
        call.completion = completion
        var headers = [HTTPHeaderField("Accept", "application/json")] + extra
        // Also without a body: libcurl would declare a bodiless POST a form, which the server
        // refuses (a form is what another site's page can send).
        if body != nil || method == "POST" { headers.append(HTTPHeaderField("Content-Type", "application/json")) }
        let request: HTTPClientRequest
        switch makeRequest(method, path, headers: headers, body: body) {
        case .failure(let reason): return failLater(call, reason)
        case .success(var made):
            made.timeoutMilliseconds = timeoutMilliseconds + holdMilliseconds
            request = made
        }
        do {
            call.transfer = try client.start(request, onProgress: { _, _ in }) { [maxAnswerBytes] result in
                switch result {
                case .failure(let error):
                    call.finish(.failed(error.description))
                case .success(let response) where response.truncated:
                    call.finish(.failed("the answer is larger than \(maxAnswerBytes) bytes"))
                case .success(let response):
                    call.finish(.answered(ServerResponse(status: response.status, headers: response.headers, body: response.body)))
                }
            }
        } catch {
            return failLater(call, error.description)
        }
        return call
    }

    /// GETs a stream at `path`: once a 2xx head is in, `onOpen` gets it and `onChunk` each piece
    /// of the body as it arrives (both from inside the HTTP client, see `HTTPBodyStream`); the
    /// completion comes when the server ends the stream (`.answered`, 2xx, empty body), or
    /// refuses it (`.answered` with its status and problem), or the exchange fails (`.failed`:
    /// no connection, or the stream broke off). A stream has no time limit but its connect
    /// timeout.
    @discardableResult
    public func stream(_ path: String, headers extra: [HTTPHeaderField] = [], onOpen: @escaping (ServerResponse) -> Void,
                       onChunk: @escaping (UnsafeRawBufferPointer) -> Void,
                       _ completion: @escaping (ServerReply) -> Void) -> ServerCall {
        let call = ServerCall()
        call.completion = completion
        let request: HTTPClientRequest
        switch makeRequest("GET", path, headers: [HTTPHeaderField("Accept", "text/event-stream")] + extra, body: nil) {
        case .failure(let reason): return failLater(call, reason)
        case .success(let made): request = made
        }
        // A refusal's body is a problem document, kept to be read; a stream's goes on.
        var refusal: (status: Int, headers: [HTTPHeaderField], body: [UInt8])?
        let maxAnswerBytes = self.maxAnswerBytes
        let stream = HTTPBodyStream(
            onHead: { status, headers in
                if (200...299).contains(status) {
                    onOpen(ServerResponse(status: status, headers: headers, body: []))
                } else {
                    refusal = (status, headers, [])
                }
            },
            onChunk: { bytes in
                guard refusal != nil else { return onChunk(bytes) }
                refusal!.body += bytes.prefix(max(0, maxAnswerBytes - refusal!.body.count))
            })
        do {
            call.transfer = try client.start(request, streamingTo: stream) { result in
                switch result {
                case .failure(let error):
                    call.finish(.failed(error.description))
                case .success(let response):
                    let answer = refusal.map { ServerResponse(status: $0.status, headers: $0.headers, body: $0.body) }
                        ?? ServerResponse(status: response.status, headers: response.headers, body: [])
                    call.finish(.answered(answer))
                }
            }
        } catch {
            return failLater(call, error.description)
        }
        return call
    }

    private func makeRequest(_ method: String, _ path: String, headers: [HTTPHeaderField], body: [UInt8]?)
        -> Result<HTTPClientRequest, MadeNoRequest> {
        let url: HTTPURL
        do {
            url = try HTTPURL(base + path)
        } catch {
            return .failure(MadeNoRequest(description: "the URL \(base + path) \(error.message)"))
        }
        var request = HTTPClientRequest(method: method, url: url, headers: headers + (authorization.map { [$0] } ?? []), body: body)
        request.followRedirects = false
        request.maxKeptBodyBytes = maxAnswerBytes
        request.connectTimeoutMilliseconds = timeoutMilliseconds
        return .success(request)
    }

    private struct MadeNoRequest: Error, CustomStringConvertible {
        let description: String
    }

    /// A call that could not be made still answers on a later turn.
    private func failLater(_ call: ServerCall, _ reason: CustomStringConvertible) -> ServerCall {
        let bound = LoopBound(call, loop: client.loop)
        let reason = reason.description
        client.loop.execute { bound.value.finish(.failed(reason)) }
        return call
    }
}
