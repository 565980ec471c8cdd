import Logging
import TaskloopClient
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

/// The worker's calls to the server: JSON through a `ServerClient` (the bearer token, a
/// deadline on every call, answers read up to `--max-answer-bytes`), sorted into
/// `ServerAnswer`. It also says, once per change, when the server stops or starts answering
/// and when it refuses the token, so an outage is one log line, not one per retry.
///
/// Its HTTP client is not the `http` tasks' one: the tasks' host policy (`--http-allow-hosts`,
/// `--http-deny-private`) must never cut the worker off from its own server.
///
/// Threading: loop thread only.
final class ServerAPI {
    private let server: ServerClient
    private let scheduler: EngineScheduler
    private let logger: Logger
    /// Set while calls fail for want of an answer; cleared by the next answer.
    private var unreachable = false
    /// Set once a 401 has been logged; cleared by the next accepted call.
    private var tokenRefused = false

    init(client: HTTPClient, scheduler: EngineScheduler, configuration: WorkerConfiguration, logger: Logger) {
        server = ServerClient(client: client, server: configuration.server, authToken: configuration.authToken,
                              timeoutMilliseconds: configuration.requestTimeoutMilliseconds,
                              maxAnswerBytes: configuration.maxAnswerBytes)
        self.scheduler = scheduler
        self.logger = logger
    }

    /// Where the server is, for log lines.
    var serverDescription: String { server.base }

    /// POSTs `body` as JSON to `path` (which starts with `/`). The answer comes on a later loop
    /// turn, never from inside this call. `holdMilliseconds` is how long the server may hold the
    /// call on purpose (a long poll), on top of the usual deadline.
    @discardableResult
    func post(_ path: String, _ body: JSONValue, holdMilliseconds: UInt64 = 0,
              _ completion: @escaping (ServerAnswer) -> Void) -> ServerCall {
        let started = scheduler.now
        return server.call("POST", path, body: body.encoded, holdMilliseconds: holdMilliseconds) { [weak self] reply in
            guard let self else { return }
            let answer = sort(reply)
            note(answer, "POST \(path)", since: started)
            completion(answer)
        }
    }

    private func sort(_ reply: ServerReply) -> ServerAnswer {
        let response: ServerResponse
        switch reply {
        case .failed(let reason): return .unavailable(reason)
        case .answered(let answered): response = answered
        }
        return Self.answer(status: response.status, document: response.body.isEmpty ? JSONValue.null : response.json)
    }

    /// An answer sorted by its status: a whole call's, or one item's of a batch (`document` is
    /// then the item's task or problem). A 2xx whose body is not JSON (nil) is no answer.
    static func answer(status: Int, document: JSONValue?) -> ServerAnswer {
        let problem = ServerProblem(status: status, document: document?.objectValue)
        switch status {
        case 200...299:
            guard let document else { return .unavailable("status \(status) with a body that is not JSON") }
            return .success(document)
        case 401: return .unauthorized
        case 404, 409: return .conflict(status: status, code: problem.code, detail: problem.summary)
        case 408, 429, 500...599: return .unavailable("status \(status): \(problem.summary)")
        default: return .refused(status: status, code: problem.code, detail: problem.summary)
        }
    }

    /// One line per change of the server's standing, and each call at debug.
    private func note(_ answer: ServerAnswer, _ call: String, since started: UInt64) {
        logger.debug("\(call) answered", metadata: ["answer": "\(answer)", "ms": "\(scheduler.now - started)"])
        switch answer {
        case .unavailable(let reason):
            if !unreachable {
                unreachable = true
                logger.warning("the server at \(server.base) is unavailable (\(reason)); retrying with backoff")
            }
        case .unauthorized:
            cameBack()
            if !tokenRefused {
                tokenRefused = true
                logger.error("the server at \(server.base) refused the bearer token (401): give the worker the server's --auth-token (TASKLOOP_AUTH_TOKEN); retrying with backoff")
            }
        case .success, .conflict, .refused:
            cameBack()
            if tokenRefused {
                tokenRefused = false
                logger.info("the server at \(server.base) accepts the bearer token again")
            }
        }
    }

    private func cameBack() {
        guard unreachable else { return }
        unreachable = false
        logger.info("the server at \(server.base) is available again")
    }
}
