import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON

/// The event stream over HTTP (server-sent events): `GET /events` with filters and resume, and
/// `GET /tasks/{id}/events`, which follows one task to its end.
extension TaskloopApplication {
    func streamEvents(_ request: HTTPRequest, _ reply: Reply) throws {
        var errors: [APIProblem.FieldError] = []
        var filter = EventFilter()
        if let text = request.query("task") {
            if let id = TaskID(text) { filter.task = id } else { errors.append(.init(field: "task", message: "is not a task id.")) }
        }
        if let text = request.query("workflow") {
            if let id = TaskID(text) { filter.workflow = id } else { errors.append(.init(field: "workflow", message: "is not a workflow id.")) }
        }
        if let text = request.query("queue") { filter.queue = text }
        if let text = request.query("types") {
            var kinds = Set<EventKind>()
            for name in text.split(separator: ",", omittingEmptySubsequences: false) {
                if let kind = EventKind(rawValue: String(name)) { kinds.insert(kind) } else {
                    errors.append(.init(field: "types", message: "\(name) is not one of \(EventKind.allCases.map(\.rawValue).joined(separator: ", ")).")) }
            }
            filter.kinds = kinds
        }
        // A reconnecting EventSource sends Last-Event-ID; it wins over the URL's `since`.
        var since: UInt64?
        if let text = request.headers["Last-Event-ID"] ?? request.query("since") {
            if let value = UInt64(text) { since = value } else {
                errors.append(.init(field: "since", message: "must be an event number (the id: of an event)."))
            }
        }
        // A bounded replay (a page catching one view up while it follows everything elsewhere).
        var until: UInt64?
        if let text = request.query("until") {
            if let value = UInt64(text) { until = value } else {
                errors.append(.init(field: "until", message: "must be an event number (the id: of an event)."))
            }
        }
        guard errors.isEmpty else { throw APIProblem.invalidQuery(errors) }
        try refuseWhileDraining()
        answered(reply, status: .ok)
        eventLog.subscribe(reply, filter: filter, since: since, until: until)
    }

    func streamTaskEvents(_ request: HTTPRequest, _ reply: Reply) throws {
        let task = try existingTask(request, reply.engine)
        try refuseWhileDraining()
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        json.field("seq", Int(eventLog.lastAssigned))
        json.field("type", "task.snapshot")
        json.key(static: "task")
        Representation.write(task, into: &json, resultLimit: Representation.eventResultBytes)
        json.endObject()
        let snapshot = Array("event: task.snapshot\ndata: ".utf8) + json.bytes + [0x0A, 0x0A]
        answered(reply, status: .ok)
        if task.state.isTerminal {
            eventLog.finish(reply, snapshot: snapshot)
        } else {
            eventLog.subscribe(reply, filter: EventFilter(task: task.id), since: nil, snapshot: snapshot, endsWith: task.id)
        }
    }
}
