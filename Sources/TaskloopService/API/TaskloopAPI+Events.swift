import TaskloopCluster
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON
import TaskloopStore

/// The event stream over HTTP (server-sent events): `GET /events` with filters and resume, and
/// `GET /tasks/{id}/events`, which follows one task to its end.
extension TaskloopApplication {
    func streamEvents(_ request: HTTPRequest, _ reply: Reply) throws {
        var errors: [APIProblem.FieldError] = []
        let filter = eventFilter(request, errors: &errors)
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

    /// `?task=&workflow=&queue=&schedule=&types=&progress_body=` as a filter; what does not parse goes to `errors`.
    func eventFilter(_ request: HTTPRequest, errors: inout [APIProblem.FieldError]) -> EventFilter {
        var filter = EventFilter()
        if let text = request.query("task") {
            if let id = TaskID(text) { filter.task = id } else { errors.append(.init(field: "task", message: "is not a task id.")) }
        }
        if let text = request.query("workflow") {
            if let id = TaskID(text) { filter.workflow = id } else { errors.append(.init(field: "workflow", message: "is not a workflow id.")) }
        }
        if let text = request.query("queue") { filter.queue = text }
        if let text = request.query("schedule") {
            if let id = TaskID(text) { filter.schedule = id } else { errors.append(.init(field: "schedule", message: "is not a schedule id.")) }
        }
        if let text = request.query("types") {
            var kinds = Set<EventKind>()
            for name in text.split(separator: ",", omittingEmptySubsequences: false) {
                if let kind = EventKind(rawValue: String(name)) { kinds.insert(kind) } else {
                    errors.append(.init(field: "types", message: "\(name) is not one of \(EventKind.allCases.map(\.rawValue).joined(separator: ", ")).")) }
            }
            filter.kinds = kinds
        }
        filter.briefProgress = Self.briefProgress(request, errors: &errors)
        return filter
    }

    /// `?progress_body=brief` (`EventFilter.briefProgress`); `full`, the default, is false.
    static func briefProgress(_ request: HTTPRequest, errors: inout [APIProblem.FieldError]) -> Bool {
        switch request.query("progress_body") {
        case nil, "full": return false
        case "brief": return true
        default:
            errors.append(.init(field: "progress_body", message: "must be full or brief."))
            return false
        }
    }

    /// `briefProgress(_:errors:)` for a route that takes no other query: a bad value is thrown.
    static func briefProgress(_ request: HTTPRequest) throws(APIProblem) -> Bool {
        var errors: [APIProblem.FieldError] = []
        let brief = briefProgress(request, errors: &errors)
        guard errors.isEmpty else { throw APIProblem.invalidQuery(errors) }
        return brief
    }

    func streamTaskEvents(_ request: HTTPRequest, _ reply: Reply) throws {
        let brief = try Self.briefProgress(request)
        let task = try existingTask(request, reply.engine)
        try refuseWhileDraining()
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        json.field("seq", Int(eventLog.lastAssigned))
        let snapshot = Self.taskSnapshot(task, &json)
        answered(reply, status: .ok)
        if task.state.isTerminal {
            eventLog.finish(reply, snapshot: snapshot)
        } else {
            eventLog.subscribe(reply, filter: EventFilter(task: task.id, briefProgress: brief), since: nil, snapshot: snapshot,
                              endsWith: task.id)
        }
    }

    /// A task stream's first event, `task.snapshot`, after `json`'s `seq`.
    static func taskSnapshot<Task: RepresentedTask>(_ task: Task, _ json: inout JSONWriter) -> [UInt8] {
        json.field("type", "task.snapshot")
        json.key(static: "task")
        Representation.write(task, into: &json, resultLimit: Representation.eventResultBytes)
        json.endObject()
        return Array("event: task.snapshot\ndata: ".utf8) + json.bytes + [0x0A, 0x0A]
    }

    // MARK: on cells

    /// `GET /events` on cells: as on a single server, with ids that are `EventPosition`s.
    func streamClusterEvents(_ request: HTTPRequest, _ reply: Reply) throws {
        var errors: [APIProblem.FieldError] = []
        let filter = eventFilter(request, errors: &errors)
        var since: EventPosition?
        if let text = request.headers["Last-Event-ID"] ?? request.query("since") {
            // `0`, before every event as on a single server: everything kept, one way for both.
            if text == "0" { since = .start } else if let value = EventPosition(text) { since = value } else {
                errors.append(.init(field: "since", message: "must be an event id (the id: of an event)."))
            }
        }
        var until: EventPosition?
        if let text = request.query("until") {
            if let value = EventPosition(text) { until = value } else {
                errors.append(.init(field: "until", message: "must be an event id (the id: of an event)."))
            }
        }
        guard errors.isEmpty else { throw APIProblem.invalidQuery(errors) }
        try refuseWhileDraining()
        guard let streams = clusterStreams else { throw Self.sharedDatabaseUnavailable }
        withClusterStreams(streams, reply) { [unowned self] in
            answered(reply, status: .ok)
            streams.subscribe(reply, filter: filter, since: since, until: until)
        }
    }

    /// `GET /tasks/{id}/events` on cells, on any replica: the task as its cell last committed
    /// it, then its events from the position read just before it (the feed, which may start
    /// after that, catches the stream up from the history).
    func streamClusterTaskEvents(_ request: HTTPRequest, _ reply: Reply) throws {
        let text = request.parameters["id"] ?? ""
        let brief = try Self.briefProgress(request)
        guard let id = TaskID(text) else { throw APIProblem(.notFound, detail: "No task \(text).") }
        try refuseWhileDraining()
        guard let host = cellHost, let streams = clusterStreams else { throw Self.sharedDatabaseUnavailable }
        host.read([ClusterEvents.now(), CellReads.task(id)]) { [weak self] result in
            guard let self else { return }
            let found: TaskSnapshot?, position: EventPosition
            do {
                let results = try result.get()
                found = try CellReads.task(results[1])
                position = ClusterEvents.position(of: results[0])
            } catch {
                return reply.send(Self.sharedDatabaseUnavailable.response())
            }
            guard let task = found else { return reply.send(APIProblem(.notFound, detail: "No task \(text).").response()) }
            var json = JSONWriter(capacity: 1_024)
            json.beginObject()
            json.field("seq", position.description)
            let snapshot = Self.taskSnapshot(task, &json)
            if task.state.isTerminal {
                answered(reply, status: .ok)
                return eventLog.finish(reply, snapshot: snapshot)
            }
            withClusterStreams(streams, reply) { [unowned self] in
                answered(reply, status: .ok)
                streams.subscribe(reply, filter: EventFilter(task: id, briefProgress: brief), since: position, snapshot: snapshot,
                                  endsWith: id)
            }
        }
    }

    /// Serves once `streams`' feed knows where it is (it rests while no stream is open here): a
    /// request waits for that as one for a moving cell waits for its owner, and is 503 if it
    /// does not come.
    private func withClusterStreams(_ streams: ClusterEventStreams, _ reply: Reply, _ serve: @escaping () -> Void) {
        streams.whenFollowing(within: Self.movingCellWaitMilliseconds) { following in
            if following { serve() } else { reply.send(Self.sharedDatabaseUnavailable.response()) }
        }
    }
}
