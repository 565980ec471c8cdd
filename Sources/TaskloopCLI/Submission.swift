import TaskloopJSON

/// A command line the client refuses before it calls the server.
public struct UsageError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// What `taskloop submit` sends: one task (`POST /tasks`) or a workflow (`POST /workflows`).
public struct Submission: Sendable {
    /// The JSON body, as sent.
    public let body: [UInt8]
    public let isWorkflow: Bool

    /// A task from flags. `params` must be JSON; everything else the server checks, so its
    /// messages are the ones users see.
    public static func task(kind: String, params: String?, queue: String?, priority: Int?, name: String?) throws(UsageError)
        -> Submission {
        var object: JSONObject = ["kind": .string(kind)]
        if let params {
            do {
                object["params"] = try JSONParser.parse(params)
            } catch {
                throw UsageError("--params is not JSON: \(error)")
            }
        }
        if let queue { object["queue"] = .string(queue) }
        if let priority { object["priority"] = .int(Int64(priority)) }
        if let name { object["name"] = .string(name) }
        return Submission(body: JSONValue.object(object).encoded, isWorkflow: false)
    }

    /// The document in the file at `path` (`-` for standard input).
    public static func file(_ path: String) throws(UsageError) -> Submission {
        try document(try Console.contents(of: path), source: path == "-" ? "standard input" : path)
    }

    /// A task or, when it has `tasks`, a workflow, from a document (`-f FILE`), sent byte for
    /// byte as written. `source` names it in messages.
    public static func document(_ bytes: [UInt8], source: String) throws(UsageError) -> Submission {
        let document: JSONValue
        do {
            document = try JSONParser.parse(bytes)
        } catch {
            throw UsageError("\(source) is not JSON: \(error)")
        }
        guard let object = document.objectValue else {
            throw UsageError("\(source) must hold a JSON object: a task, or a workflow with \"tasks\"")
        }
        return Submission(body: bytes, isWorkflow: object["tasks"] != nil)
    }
}
