import TaskloopClient
import TaskloopJSON
import TaskloopTime

/// A task as a watcher shows it: what its line needs, read from the API's task object.
public struct WatchedTask: Equatable, Sendable {
    public var id: String
    public var name: String?
    /// Its key in its workflow (from the workflow's `keys`), when watched as part of one.
    public var key: String?
    public var kind: String
    public var state: String
    public var cancelRequested: Bool
    public var attempt: Int
    public var fraction: Double?
    public var message: String?
    /// `code: message` of the error of a task that failed or was cancelled.
    public var error: String?
    public var createdAt: Int64?
    public var startedAt: Int64?
    public var finishedAt: Int64?

    /// Reads a task object; nil when it lacks an id, a kind or a state.
    public init?(_ object: JSONObject, key: String? = nil) {
        guard let id = object["id"]?.stringValue, let kind = object["kind"]?.stringValue,
              let state = object["state"]?.stringValue else { return nil }
        self.id = id
        self.key = key
        self.kind = kind
        self.state = state
        name = object["name"]?.stringValue
        cancelRequested = object["cancel_requested"]?.boolValue ?? false
        attempt = object["attempt"]?.intValue.map { Int($0) } ?? 1
        let progress = object["progress"]?.objectValue
        fraction = progress?["fraction"]?.doubleValue
        message = progress?["message"]?.stringValue
        error = object["error"]?.objectValue.map { error in
            [error["code"]?.stringValue, error["message"]?.stringValue].compactMap { $0 }.joined(separator: ": ")
        }
        createdAt = object["created_at"]?.stringValue.flatMap(RFC3339.milliseconds)
        startedAt = object["started_at"]?.stringValue.flatMap(RFC3339.milliseconds)
        finishedAt = object["finished_at"]?.stringValue.flatMap(RFC3339.milliseconds)
    }

    /// What names it on screen: its name, else its workflow key, else its kind.
    public var label: String { name ?? key ?? kind }

    public var isTerminal: Bool { WatchModel.terminalStates.contains(state) }

    /// The state as shown: a running task whose cancellation is under way is `cancelling`.
    public var shownState: String { state == "running" && cancelRequested ? "cancelling" : state }

    /// What its line says after the numbers: the error of a task that ended badly, else its
    /// progress message; a later attempt says which.
    public var detail: String {
        let text = (state == "failed" || state == "cancelled" ? error : nil) ?? message ?? ""
        return attempt > 1 ? "attempt \(attempt)" + (text.isEmpty ? "" : ": \(text)") : text
    }
}

/// What a workflow's line shows.
public struct WatchedWorkflow: Equatable, Sendable {
    public var id: String
    public var name: String?
    public var state: String
    public var fraction: Double?
    public var createdAt: Int64?
}

/// What a watch knows of its subject (a task, or a workflow and its tasks), built from the
/// API's objects and kept current by the event stream. A value type without I/O: the watcher
/// feeds it and the displays read it, and tests drive it with plain events.
///
/// Events are numbered by the server; the model remembers the number of the last one it took
/// (or of the snapshot it was loaded from) and ignores any at or before it, so a snapshot and
/// the stream that follows it never move a task back.
public struct WatchModel: Sendable {
    public enum Subject: Equatable, Sendable {
        case task(String)
        case workflow(String)
    }

    /// What changed, for a display that reports changes one by one.
    public enum Change: Equatable, Sendable {
        /// The task at this position in `tasks`; the time of the change when the server said.
        case task(Int, at: Int64?)
        case workflow(at: Int64?)
    }

    /// What an event came to.
    public enum Update: Equatable, Sendable {
        case changed([Change])
        case unchanged
        /// The server no longer has the events after the one the stream resumed from: the
        /// subject must be fetched again.
        case reset
    }

    static let terminalStates: Set<String> = ["succeeded", "failed", "cancelled"]

    public private(set) var subject: Subject?
    public private(set) var workflow: WatchedWorkflow?
    /// In the order the server listed or created them, which is submission order.
    public private(set) var tasks: [WatchedTask] = []
    private var positions: [String: Int] = [:]
    private var keysByTaskID: [String: String] = [:]
    /// The id of the last event taken, or the position of the snapshot loaded.
    public private(set) var lastSeq = "0"

    /// Whether event id `later` comes after `earlier`. Ids are the server's to make (openapi.yaml's
    /// `EventID`): decimal numbers on a single server, positions of 24 hex digits on cells, each
    /// of one width or growing, so a longer id is later and ids of one length order as text.
    static func comesAfter(_ later: String, _ earlier: String) -> Bool {
        later.utf8.count != earlier.utf8.count ? later.utf8.count > earlier.utf8.count : later > earlier
    }

    public init() {}

    /// The subject's terminal state, once it has one.
    public var outcome: String? {
        switch subject {
        case .task(let id): positions[id].map { tasks[$0].state }.flatMap { Self.terminalStates.contains($0) ? $0 : nil }
        case .workflow: workflow.flatMap { Self.terminalStates.contains($0.state) ? $0.state : nil }
        case nil: nil
        }
    }

    /// The workflow's progress as the server defines it (the mean over its tasks, a finished
    /// task counting 1), from the tasks as they are now: the server only sends the workflow
    /// when its state changes.
    public var workflowFraction: Double? {
        guard !tasks.isEmpty else { return workflow?.fraction }
        let sum = tasks.reduce(0.0) { $0 + ($1.isTerminal ? 1 : $1.fraction ?? 0) }
        return sum / Double(tasks.count)
    }

    /// Loads a workflow object (`GET /workflows/{id}`), as of event `seq` (its `Event-Seq`).
    public mutating func load(workflow object: JSONObject, seq: String) -> [Change] {
        guard let id = object["id"]?.stringValue, let state = object["state"]?.stringValue else { return [] }
        subject = .workflow(id)
        workflow = WatchedWorkflow(id: id, name: object["name"]?.stringValue, state: state,
                                   fraction: object["progress"]?.objectValue?["fraction"]?.doubleValue,
                                   createdAt: object["created_at"]?.stringValue.flatMap(RFC3339.milliseconds))
        keysByTaskID = [:]
        for member in object["keys"]?.objectValue ?? JSONObject() {
            if let taskID = member.value.stringValue { keysByTaskID[taskID] = member.key }
        }
        tasks = []
        positions = [:]
        var changes: [Change] = []
        for element in object["tasks"]?.arrayValue ?? [] {
            if let object = element.objectValue, let index = upsert(object) { changes.append(.task(index, at: nil)) }
        }
        lastSeq = seq
        // The tasks, then the workflow that sums them up.
        return changes + [.workflow(at: nil)]
    }

    /// Takes one event of `GET /tasks/{id}/events` or `GET /events`.
    public mutating func apply(_ event: ServerSentEvent) -> Update {
        if event.type == "reset" { return .reset }
        guard let data = (try? JSONParser.parse(event.data))?.objectValue,
              let seq = data["seq"].flatMap({ $0.stringValue ?? $0.intValue.map(String.init) }) else { return .unchanged }
        let time = data["time"]?.stringValue.flatMap(RFC3339.milliseconds)
        switch event.type {
        case "task.snapshot":
            // The task as it is when its stream starts: it replaces whatever was known.
            guard let object = data["task"]?.objectValue, let id = object["id"]?.stringValue else { return .unchanged }
            subject = .task(id)
            tasks = []
            positions = [:]
            lastSeq = seq
            return upsert(object).map { .changed([.task($0, at: nil)]) } ?? .unchanged
        case "task.created", "task.state", "task.progress":
            guard Self.comesAfter(seq, lastSeq), let object = data["task"]?.objectValue else { return .unchanged }
            lastSeq = seq
            return upsert(object).map { .changed([.task($0, at: time)]) } ?? .unchanged
        case "workflow.state":
            guard Self.comesAfter(seq, lastSeq), let object = data["workflow"]?.objectValue, let state = object["state"]?.stringValue,
                  var updated = workflow, object["id"]?.stringValue == updated.id else { return .unchanged }
            lastSeq = seq
            updated.state = state
            updated.name = object["name"]?.stringValue
            updated.fraction = object["progress"]?.objectValue?["fraction"]?.doubleValue
            workflow = updated
            return .changed([.workflow(at: time)])
        default:
            return .unchanged
        }
    }

    /// Adds or replaces the task the object describes; its position, or nil when the object
    /// is not a task.
    private mutating func upsert(_ object: JSONObject) -> Int? {
        guard var task = WatchedTask(object) else { return nil }
        task.key = keysByTaskID[task.id]
        if let index = positions[task.id] {
            tasks[index] = task
            return index
        }
        positions[task.id] = tasks.count
        tasks.append(task)
        return tasks.count - 1
    }
}
