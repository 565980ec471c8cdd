import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON

/// The one mapping from engine errors to HTTP: status, problem type and `errors[].field`.
extension EngineError: HTTPResponseError {
    public func response() -> HTTPResponse { problem.response() }

    var problem: HTTPProblem {
        var extensions: JSONObject = [:]
        if !keys.isEmpty { extensions["keys"] = .array(keys.map { .string($0) }) }
        switch code {
        case .invalid, .unknownKind, .unknownDependency, .selfDependency, .duplicateDependency, .cycle, .tooManyQueues:
            return HTTPProblem(.unprocessableContent, detail: message, type: ProblemType.validation, code: code.rawValue,
                               fieldErrors: [HTTPProblem.FieldError(field: field ?? "body", message: message)],
                               extensions: extensions)
        case .tooManyUnfinishedTasks:
            return HTTPProblem(.tooManyRequests, detail: message, code: code.rawValue, headers: ["Retry-After": "1"], extensions: extensions)
        case .notFound:
            return HTTPProblem(.notFound, detail: message, code: code.rawValue, extensions: extensions)
        case .alreadyTerminal, .notRunning:
            return HTTPProblem(.conflict, detail: message, code: code.rawValue, extensions: extensions)
        }
    }
}
