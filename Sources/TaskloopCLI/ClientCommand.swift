import TaskloopHTTPClient

/// What every command of the command-line client shares; `taskloop`'s flags fill it.
public struct ClientSettings: Sendable {
    /// The server's base URL (a path prefix is kept).
    public var server: HTTPURL
    /// Sent as `Authorization: Bearer <token>`.
    public var authToken: String?
    /// Longest one call may take.
    public var requestTimeoutMilliseconds: UInt64 = 10_000
    /// Largest answer read (a list of a thousand tasks, a task with a large result).
    public var maxAnswerBytes = 64 << 20
    /// Longest wait between two attempts to get a lost event stream back.
    public var maxBackoffMilliseconds: UInt64 = 30_000
    /// How long a watch keeps trying to get a lost server back before it gives up (status 3).
    public var reconnectTimeoutMilliseconds: UInt64 = 60_000
    /// Silence after which an event stream counts as lost (the server sends a comment every
    /// 15 s, so a live stream is never this quiet).
    public var streamIdleTimeoutMilliseconds: UInt64 = 45_000
    /// Shortest time between two frames of the live display.
    public var frameIntervalMilliseconds: UInt64 = 100
    /// Plain lines even on a terminal.
    public var plainOutput = false

    public init(server: HTTPURL) {
        self.server = server
    }
}

/// One command of the command-line client.
public enum ClientCommand: Sendable {
    /// `POST /tasks` or `POST /workflows`, then what `then` says.
    case submit(Submission, idempotencyKey: String?, then: AfterSubmission)
    /// `POST /tasks/batch` for each part of a `--batch` file, in order (`Submission.batches`);
    /// with a key, part `i` of several goes under `<key>-<i>`.
    case submitBatches([[UInt8]], idempotencyKey: String?)
    /// The task, or else the workflow, with this id.
    case get(id: String)
    /// `GET /tasks`, page after page.
    case list(TaskQuery, format: ListFormat)
    /// `DELETE /tasks/{id}`, or else `/workflows/{id}`.
    case cancel(id: String)
    /// `POST /tasks/{id}/retry`, or else `/workflows/{id}/retry`.
    case retry(id: String)
    /// Follows the task or workflow to its end.
    case watch(id: String)
    /// `taskloop schedule ...` (Schedules).
    case schedule(ScheduleCommand)
    /// `taskloop queue ...` (Queues).
    case queue(QueueCommand)
}

public enum AfterSubmission: Sendable {
    /// Print the new id.
    case printID
    /// Wait until it ends, then print it as it ended.
    case wait
    /// Print the id, then show it as `watch` does until it ends.
    case watch
}

/// `GET /tasks`'s filters and where to start.
public struct TaskQuery: Sendable {
    public var state: String?
    public var queue: String?
    public var workflow: String?
    /// Most tasks printed; nil: every one that matches.
    public var limit: Int?
    /// The cursor to start after (a `next` the server gave, which is a task id).
    public var after: String?

    public init(state: String? = nil, queue: String? = nil, workflow: String? = nil, limit: Int? = 100, after: String? = nil) {
        self.state = state
        self.queue = queue
        self.workflow = workflow
        self.limit = limit
        self.after = after
    }

    /// The server's largest page.
    static let pageLimit = 1_000

    /// The path of the next page, asking for at most `count` tasks after `cursor`.
    func path(count: Int, after cursor: String?) -> String {
        var items = [("limit", String(min(count, Self.pageLimit)))]
        if let state { items.append(("state", state)) }
        if let queue { items.append(("queue", queue)) }
        if let workflow { items.append(("workflow", workflow)) }
        if let cursor { items.append(("after", cursor)) }
        return "/tasks?" + items.map { "\($0)=\(URLText.encoded($1))" }.joined(separator: "&")
    }
}

public enum ListFormat: Sendable {
    /// A table on a terminal, JSON lines otherwise.
    case automatic
    /// One task object per line, compact, whatever standard output is.
    case jsonLines
}

/// Text as it may stand in a URL's path segment or query value.
enum URLText {
    /// Percent-encodes everything but RFC 3986's unreserved characters, so an id or a filter
    /// stays one path segment or one value whatever it holds.
    static func encoded(_ text: String) -> String {
        var result = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                result.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let hex = Array("0123456789ABCDEF".utf8)
                result += "%" + String(decoding: [hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]], as: UTF8.self)
            }
        }
        return result
    }
}
