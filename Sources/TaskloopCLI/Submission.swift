import TaskloopJSON
import TaskloopTime

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

    /// When a task from flags may run and until when it may start: `--at`/`--expires-at` are
    /// RFC 3339 times, `--delay`/`--ttl` spans such as `90s`, `1h30m` or `250ms`.
    public struct Times: Sendable {
        public var at: String?
        public var delay: String?
        public var expiresAt: String?
        public var ttl: String?

        public init(at: String? = nil, delay: String? = nil, expiresAt: String? = nil, ttl: String? = nil) {
            self.at = at
            self.delay = delay
            self.expiresAt = expiresAt
            self.ttl = ttl
        }

        func write(into object: inout JSONObject) throws(UsageError) {
            for (flag, text, key) in [("--at", at, "run_at"), ("--expires-at", expiresAt, "expires_at")] {
                guard let text else { continue }
                guard RFC3339.milliseconds(text) != nil else {
                    throw UsageError("\(flag) must be an RFC 3339 time such as 2026-11-27T02:00:00Z, not \(text)")
                }
                object[key] = .string(text)
            }
            for (flag, text, key) in [("--delay", delay, "delay_ms"), ("--ttl", ttl, "ttl_ms")] {
                guard let text else { continue }
                guard let milliseconds = Timestamp.spanMilliseconds(text) else {
                    throw UsageError("\(flag) must be a span such as 90s, 1h30m or 250ms, not \(text)")
                }
                object[key] = .int(milliseconds)
            }
        }
    }

    /// A task from flags. `params` must be JSON; everything else the server checks, so its
    /// messages are the ones users see.
    public static func task(kind: String, params: String?, queue: String?, priority: Int?, name: String?,
                            times: Times = Times(), uniqueKey: String? = nil, uniqueFor: String? = nil,
                            concurrencyKey: String? = nil) throws(UsageError) -> Submission {
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
        try times.write(into: &object)
        if let uniqueKey { object["unique_key"] = .string(uniqueKey) }
        if let uniqueFor {
            guard let milliseconds = Timestamp.spanMilliseconds(uniqueFor) else {
                throw UsageError("--unique-for must be a span such as 90s, 1h30m or 250ms, not \(uniqueFor)")
            }
            object["unique_for_ms"] = .int(milliseconds)
        }
        if let concurrencyKey { object["concurrency_key"] = .string(concurrencyKey) }
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

    /// The most tasks `submit --batch` sends in one `POST /tasks/batch` (the server's default
    /// `--max-batch-items`).
    public static let batchSize = 1_000

    /// The bodies of `POST /tasks/batch` for the tasks in the file at `path` (`-` for standard input).
    public static func batchFile(_ path: String) throws(UsageError) -> [[UInt8]] {
        try batches(try Console.contents(of: path), source: path == "-" ? "standard input" : path)
    }

    /// The bodies of `POST /tasks/batch` for the tasks of a `--batch` file: one JSON array of
    /// tasks, or JSON lines (one task per line, blank lines skipped), sent in order in parts of
    /// up to `size`. Each task goes as written; the server checks each, and answers each.
    public static func batches(_ bytes: [UInt8], source: String, size: Int = batchSize) throws(UsageError) -> [[UInt8]] {
        var tasks: [JSONValue] = []
        let first = bytes.first { $0 != 0x20 && $0 != 0x09 && $0 != 0x0A && $0 != 0x0D }
        if first == UInt8(ascii: "[") {
            do {
                tasks = try JSONParser.parse(bytes).arrayValue ?? []
            } catch {
                throw UsageError("\(source) is not a JSON array of tasks: \(error)")
            }
        } else {
            for (number, line) in bytes.split(separator: 0x0A, omittingEmptySubsequences: false).enumerated() {
                guard line.contains(where: { $0 != 0x20 && $0 != 0x09 && $0 != 0x0D }) else { continue }
                do {
                    tasks.append(try JSONParser.parse(Array(line)))
                } catch {
                    throw UsageError("\(source) line \(number + 1) is not JSON: \(error)")
                }
            }
        }
        guard !tasks.isEmpty else { throw UsageError("\(source) holds no tasks") }
        return stride(from: 0, to: tasks.count, by: size).map { start in
            JSONValue.object(["tasks": .array(Array(tasks[start..<min(start + size, tasks.count)]))]).encoded
        }
    }

    /// One line for an item of a batch's answer: `<status> <task id>` for a created task,
    /// `<status> <code> <detail>` for a refused one.
    public static func batchLine(_ result: JSONValue) -> String {
        let object = result.objectValue ?? [:]
        let status = object["status"]?.intValue.map(String.init) ?? "?"
        if let id = object["task"]?.objectValue?["id"]?.stringValue { return "\(status) \(id)" }
        let problem = object["problem"]?.objectValue ?? [:]
        return "\(status) \(problem["code"]?.stringValue ?? "error") \(problem["detail"]?.stringValue ?? "")"
    }
}
