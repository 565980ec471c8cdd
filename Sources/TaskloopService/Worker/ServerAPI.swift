import Logging
import TaskloopEngine
import TaskloopHTTPClient
import TaskloopJSON

/// How the server answered one call, sorted by what the worker does next.
enum ServerAnswer {
    /// 2xx, with the body parsed (`null` when empty).
    case success(JSONValue)
    /// 404 or 409: the task is not this worker's any more (`lease_lost`, `not_found`), or the
    /// queue is unknown or not dispatched to workers.
    case conflict(status: Int, code: String?, detail: String)
    /// 401: the token is missing or wrong. Retrying only helps once the server is told otherwise.
    case unauthorized
    /// No usable answer, or one that says to come back: the connection failed or timed out,
    /// 408, 429, 5xx, or a body that is not JSON.
    case unavailable(String)
    /// Any other 4xx: the server refuses the call as it is, and will again.
    case refused(status: Int, code: String?, detail: String)
}

extension ServerAnswer: CustomStringConvertible {
    var description: String {
        switch self {
        case .success: "success"
        case .conflict(let status, let code, let detail), .refused(let status, let code, let detail):
            "\(status) \(code ?? "-"): \(detail)"
        case .unauthorized: "401"
        case .unavailable(let reason): "unavailable: \(reason)"
        }
    }
}

/// One call in flight; `cancel()` ends it without its completion running. The transfer and the
/// deadline hold it until then, so a caller need not.
final class ServerCall {
    fileprivate var transfer: HTTPTransfer?
    fileprivate var deadline: ScheduledAction?
    fileprivate var completion: ((ServerAnswer) -> Void)?

    func cancel() {
        completion = nil
        deadline?.cancel()
        transfer?.cancel()
        transfer = nil
    }

    fileprivate func finish(_ answer: ServerAnswer) {
        deadline?.cancel()
        transfer = nil
        guard let completion else { return }
        self.completion = nil
        completion(answer)
    }
}

/// The worker's calls to the server: JSON over the HTTP client on the loop, a bearer token,
/// a deadline on every call, and answers sorted into `ServerAnswer`. It also says, once per
/// change, when the server stops or starts answering and when it refuses the token, so an
/// outage is one log line, not one per retry.
///
/// Its HTTP client is not the `http` tasks' one: the tasks' host policy (`--http-allow-hosts`,
/// `--http-deny-private`) must never cut the worker off from its own server.
///
/// Threading: loop thread only.
final class ServerAPI {
    private let client: HTTPClient
    private let scheduler: EngineScheduler
    private let base: String
    private let headers: [HTTPHeaderField]
    private let timeoutMilliseconds: UInt64
    private let maxAnswerBytes: Int
    private let logger: Logger
    /// Set while calls fail for want of an answer; cleared by the next answer.
    private var unreachable = false
    /// Set once a 401 has been logged; cleared by the next accepted call.
    private var tokenRefused = false

    init(client: HTTPClient, scheduler: EngineScheduler, configuration: WorkerConfiguration, logger: Logger) {
        self.client = client
        self.scheduler = scheduler
        var base = configuration.server.text
        while base.hasSuffix("/") { base.removeLast() }
        self.base = base
        var headers = [HTTPHeaderField("Content-Type", "application/json"), HTTPHeaderField("Accept", "application/json")]
        if let token = configuration.authToken { headers.append(HTTPHeaderField("Authorization", "Bearer \(token)")) }
        self.headers = headers
        timeoutMilliseconds = configuration.requestTimeoutMilliseconds
        maxAnswerBytes = configuration.maxAnswerBytes
        self.logger = logger
    }

    /// Where the server is, for log lines.
    var serverDescription: String { base }

    /// POSTs `body` as JSON to `path` (which starts with `/`). The answer comes on a later loop
    /// turn, never from inside this call. `holdMilliseconds` is how long the server may hold the
    /// call on purpose (a long poll), on top of the usual deadline.
    @discardableResult
    func post(_ path: String, _ body: JSONValue, holdMilliseconds: UInt64 = 0,
              _ completion: @escaping (ServerAnswer) -> Void) -> ServerCall {
        let call = ServerCall()
        call.completion = completion
        let started = scheduler.now
        let label = "POST \(path)"
        let request: HTTPClientRequest
        do {
            var built = HTTPClientRequest(method: "POST", url: try HTTPURL(base + path), headers: headers, body: body.encoded)
            built.followRedirects = false
            built.maxKeptBodyBytes = maxAnswerBytes
            built.connectTimeoutMilliseconds = timeoutMilliseconds
            request = built
        } catch {
            // The base URL was checked at start and paths are made of ids and queue names.
            return failLater(call, label, "the URL \(base + path) \(error.message)")
        }
        do {
            call.transfer = try client.start(request, onProgress: { _, _ in }) { [weak self] result in
                guard let self else { return }
                let answer = self.sort(result)
                self.note(answer, label, since: started)
                call.finish(answer)
            }
        } catch {
            return failLater(call, label, "\(error)")
        }
        call.deadline = scheduler.schedule(after: timeoutMilliseconds + holdMilliseconds) { [weak self] in
            guard let self else { return }
            call.transfer?.cancel()
            let answer = ServerAnswer.unavailable("no answer within \(timeoutMilliseconds + holdMilliseconds) ms")
            note(answer, label, since: started)
            call.finish(answer)
        }
        return call
    }

    /// A call that could not be made still answers on a later turn, so its caller has stored
    /// the call before the answer arrives.
    private func failLater(_ call: ServerCall, _ label: String, _ reason: String) -> ServerCall {
        let answer = ServerAnswer.unavailable(reason)
        let started = scheduler.now
        call.deadline = scheduler.schedule(after: 0) { [weak self] in
            self?.note(answer, label, since: started)
            call.finish(answer)
        }
        return call
    }

    private func sort(_ result: Result<HTTPClientResponse, HTTPClientError>) -> ServerAnswer {
        let response: HTTPClientResponse
        switch result {
        case .failure(let error): return .unavailable(error.description)
        case .success(let success): response = success
        }
        if response.truncated {
            return .unavailable("the answer is larger than \(maxAnswerBytes) bytes")
        }
        let document = response.body.isEmpty ? JSONValue.null : try? JSONParser.parse(response.body)
        let problem = document?.objectValue
        let code = problem?["code"]?.stringValue
        let detail = problem?["detail"]?.stringValue ?? problem?["title"]?.stringValue ?? "status \(response.status)"
        switch response.status {
        case 200...299:
            guard let document else { return .unavailable("status \(response.status) with a body that is not JSON") }
            return .success(document)
        case 401: return .unauthorized
        case 404, 409: return .conflict(status: response.status, code: code, detail: detail)
        case 408, 429, 500...599: return .unavailable("status \(response.status): \(detail)")
        default: return .refused(status: response.status, code: code, detail: detail)
        }
    }

    /// One line per change of the server's standing, and each call at debug.
    private func note(_ answer: ServerAnswer, _ call: String, since started: UInt64) {
        logger.debug("\(call) answered", metadata: ["answer": "\(answer)", "ms": "\(scheduler.now - started)"])
        switch answer {
        case .unavailable(let reason):
            if !unreachable {
                unreachable = true
                logger.warning("the server at \(base) is unavailable (\(reason)); retrying with backoff")
            }
        case .unauthorized:
            cameBack()
            if !tokenRefused {
                tokenRefused = true
                logger.error("the server at \(base) refused the bearer token (401): give the worker the server's --auth-token (TASKLOOP_AUTH_TOKEN); retrying with backoff")
            }
        case .success, .conflict, .refused:
            cameBack()
            if tokenRefused {
                tokenRefused = false
                logger.info("the server at \(base) accepts the bearer token again")
            }
        }
    }

    private func cameBack() {
        guard unreachable else { return }
        unreachable = false
        logger.info("the server at \(base) is available again")
    }
}
