import TaskloopHTTP
import TaskloopJSON

/// A problem the API answers: the server's RFC 9457 problem plus the members only the API
/// has, `errors: [{field, message}]` for what was invalid and `keys` for the workflow keys a
/// rule names (a cycle's). Handlers throw it; it knows its response.
public struct APIProblem: HTTPResponseError, Equatable {
    public var problem: HTTPProblem
    /// Validation failures, rendered as `errors: [{field, message}]`.
    public var fieldErrors: [FieldError]
    public var keys: [String]
    /// The task that holds a duplicate's unique key (`existing_id`).
    public var existingID: String?

    public struct FieldError: Sendable, Equatable {
        public var field: String
        public var message: String
        public init(field: String, message: String) {
            self.field = field
            self.message = message
        }
    }

    public init(
        _ status: HTTPStatus, detail: String, type: String = "about:blank", code: String? = nil,
        headers: HTTPHeaders = [:], fieldErrors: [FieldError] = [], keys: [String] = [], existingID: String? = nil
    ) {
        problem = HTTPProblem(status, detail: detail, type: type, code: code, headers: headers)
        self.fieldErrors = fieldErrors
        self.keys = keys
        self.existingID = existingID
    }

    /// 400 `invalid_query`, naming each bad query parameter.
    static func invalidQuery(_ errors: [FieldError]) -> APIProblem {
        APIProblem(.badRequest, detail: "The query has \(errors.count) invalid parameter(s).", type: ProblemType.validation,
                   code: "invalid_query", fieldErrors: errors)
    }

    public var status: HTTPStatus { problem.status }
    public var code: String { problem.code }

    public func response() -> HTTPResponse {
        guard !fieldErrors.isEmpty || !keys.isEmpty || existingID != nil else { return problem.response() }
        var json = JSONWriter()
        json.beginObject()
        if !fieldErrors.isEmpty {
            json.key(static: "errors")
            json.beginArray()
            for error in fieldErrors {
                json.beginObject()
                json.field("field", error.field)
                json.field("message", error.message)
                json.endObject()
            }
            json.endArray()
        }
        if !keys.isEmpty {
            json.key(static: "keys")
            json.beginArray()
            for key in keys { json.string(key) }
            json.endArray()
        }
        if let existingID { json.field("existing_id", existingID) }
        json.endObject()
        // The members without the object's braces.
        return problem.response(extraMembers: Array(json.bytes.dropFirst().dropLast()))
    }
}
