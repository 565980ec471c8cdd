import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON

/// The one mapping from engine errors to HTTP: status, problem type and `errors[].field`.
extension EngineError: HTTPResponseError {
    public func response() -> HTTPResponse { problem.response() }

    var problem: APIProblem {
        switch code {
        case .invalid, .unknownKind, .unknownDependency, .selfDependency, .duplicateDependency, .cycle, .tooManyQueues:
            return APIProblem(.unprocessableContent, detail: message, type: ProblemType.validation, code: code.rawValue,
                              fieldErrors: [APIProblem.FieldError(field: field ?? "body", message: message)], keys: keys)
        case .tooManyUnfinishedTasks:
            return APIProblem(.tooManyRequests, detail: message, code: code.rawValue, headers: ["Retry-After": "1"], keys: keys)
        case .notFound:
            return APIProblem(.notFound, detail: message, code: code.rawValue, keys: keys)
        case .alreadyTerminal, .notRunning, .leaseLost, .notLeasable, .notRetryable:
            return APIProblem(.conflict, detail: message, code: code.rawValue, keys: keys)
        case .duplicateTask:
            return APIProblem(.conflict, detail: message, code: code.rawValue,
                              fieldErrors: field.map { [APIProblem.FieldError(field: $0, message: message)] } ?? [],
                              existingID: existing?.description)
        case .tooManySchedules:
            return APIProblem(.conflict, detail: message + " (--max-schedules); delete one first.", code: code.rawValue)
        case .previousRunUnfinished:
            return APIProblem(.conflict, detail: message, code: code.rawValue, existingID: existing?.description)
        }
    }
}
