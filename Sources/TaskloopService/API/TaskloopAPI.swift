import TaskloopCluster
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON

/// The REST API of the contract: each route reads its input, asks the engine, and renders.
/// Validation problems are 422 with `errors[].field`; engine errors map in `ServiceErrors`.
/// One route as data: method, path pattern, the statuses its handler answers (a request may
/// also get any of `Route.anyRequest`), whether it needs no token, and the handler.
/// openapi.yaml documents exactly these (a test holds the two together), and the metrics count
/// each from zero. A class: the router hands out the route of every request, and a reference
/// is one retain where a struct of these fields is five.
final class Route {
    let method: HTTPMethod
    let pattern: String
    let answers: [Int]
    /// Served without a bearer token even when the server has one.
    let isPublic: Bool
    /// The least a token must be allowed to call it: reads for GET, the worker's reports, else admin.
    let role: AccessRole
    /// Reads or changes tasks, queues, webhooks or events: with replicas it waits for a
    /// catch-up (reads) or a turn (changes). The page, the spec, health and metrics do not.
    let usesState: Bool
    /// Which cell serves it, with cells (docs/SCALING.md): the request is served by that cell's
    /// engine where it runs, or forwarded to its owner.
    let placement: RoutePlacement
    let handler: ServiceHandler
    /// The route's place in the route table, which is where the metrics keep its collectors.
    fileprivate(set) var index = -1

    init(_ method: HTTPMethod, _ pattern: String, _ answers: [Int], isPublic: Bool = false, forWorkers: Bool = false,
         usesState: Bool = true, placement: RoutePlacement = .none, _ handler: @escaping ServiceHandler) {
        self.method = method
        self.pattern = pattern
        var answers = answers
        // Another site's page, or a token whose role falls short; a POST may be a form.
        if method.changesState && !answers.contains(403) { answers.append(403) }
        if method == .POST && !answers.contains(415) { answers.append(415) }
        self.answers = answers
        self.isPublic = isPublic
        role = method == .GET ? .read : forWorkers ? .worker : .admin
        self.usesState = usesState
        self.placement = placement
        self.handler = handler
    }

    /// What the HTTP layer and access control may answer any request: malformed, slow, too
    /// large (body, target, head), no token (with a token configured), a Host that is not
    /// answered (421), too many connections or shutting down.
    static let anyRequest = [400, 401, 408, 413, 414, 421, 431, 503]
}

/// Where a route's request is served when the tasks live in cells: by the cell its path or
/// body names (each reads its engine from `Reply.engine`), or by no cell.
enum RoutePlacement {
    /// Needs no engine: health, the spec, the page, metrics.
    case none
    /// The task of path parameter `id`: its id carries its cell.
    case task
    /// The workflow of path parameter `id` (ids carry their cell).
    case workflow
    /// The queue of path parameter `name`.
    case queue
    /// `POST /tasks`: the queue its body names.
    case submittedTask
    /// `POST /tasks/batch`: each item's queue; a batch whose items span cells is split by cell.
    case submittedTasks
    /// `POST /tasks/reports`: each item's task id; split by cell as a batch of submissions.
    case reportedTasks
    /// `POST /workflows`: the queue of its first task (a workflow's tasks share a cell).
    case submittedWorkflow
    /// Every cell: lists, streams and webhooks, read from the database.
    case everyCell
    /// The schedule of path parameter `id` (its id carries its cell, as a task's does).
    case schedule
    /// `POST /schedules`: the queue of its template's task (a workflow's first task).
    case submittedSchedule
}

extension TaskloopApplication {
    func routes() -> [Route] {
        [
            Route(.GET, "/healthz", [200], isPublic: true, usesState: false) { [unowned self] _, reply in
                if isDraining {
                    reply.send(APIProblem(.serviceUnavailable, detail: "The server is shutting down.").response())
                } else if let cellHost, !cellHost.keeper.isRenewed {
                    // A load balancer sends the work to a replica that can reach the database.
                    reply.send(Self.sharedDatabaseUnavailable.response())
                } else if let retiredProblem {
                    reply.send(retiredProblem.response())
                } else {
                    reply.send(.json(.ok, Array(#"{"status":"ok","process_isolation":"\#(processIsolation)"}"#.utf8)))
                }
            },
            Route(.GET, "/whoami", [200], usesState: false) { [unowned self] request, reply in
                let role = access.role(of: request)
                reply.send(.json(.ok, Array(#"{"role":"\#(role.rawValue)","token_required":\#(access.requiresToken)}"#.utf8)))
            },
            Route(.GET, "/openapi.yaml", [200], usesState: false) { _, reply in
                reply.send(HTTPResponse(status: .ok, headers: ["Content-Type": "application/yaml"], body: PackageResources.openapi_yaml))
            },
            Route(.GET, "/ui", [200, 304], isPublic: true, usesState: false) { request, reply in
                reply.send(Dashboard.response(for: "index.html", request)!)
            },
            Route(.GET, "/ui/{file}", [200, 304, 404], isPublic: true, usesState: false) { request, reply in
                guard let response = Dashboard.response(for: request.parameters["file"] ?? "", request) else {
                    throw APIProblem(.notFound, detail: "The dashboard has no file of that name.", code: "not_found")
                }
                reply.send(response)
            },
            Route(.GET, "/metrics", [200], usesState: false) { [unowned self] _, reply in
                reply.send(HTTPResponse(status: .ok, headers: ["Content-Type": "text/plain; version=0.0.4; charset=utf-8"],
                                        body: renderMetrics()))
            },
            Route(.POST, "/tasks", [201, 404, 409, 415, 422, 429], placement: .submittedTask) { [unowned self] request, reply in try submitTask(request, reply) },
            Route(.POST, "/tasks/batch", [207, 415, 422, 429], placement: .submittedTasks) { [unowned self] request, reply in
                try submitTaskBatch(request, reply)
            },
            Route(.POST, "/tasks/reports", [207, 415, 422], forWorkers: true, placement: .reportedTasks) { [unowned self] request, reply in
                try reportBatch(request, reply)
            },
            Route(.GET, "/tasks", [200], placement: .everyCell) { [unowned self] request, reply in try listTasks(request, reply) },
            Route(.GET, "/events", [200, 400], placement: .everyCell) { [unowned self] request, reply in try streamEvents(request, reply) },
            Route(.GET, "/tasks/{id}/events", [200, 404], placement: .task) { [unowned self] request, reply in
                try streamTaskEvents(request, reply)
            },
            Route(.GET, "/tasks/{id}", [200, 404], placement: .task) { [unowned self] request, reply in try getTask(request, reply) },
            Route(.DELETE, "/tasks/{id}", [200, 202, 404, 409], placement: .task) { [unowned self] request, reply in
                let task = try existingTask(request, reply.engine)
                let outcome = try reply.engine.cancel(task.id)
                reply.send(.json(outcome == .cancelled ? .ok : .accepted, Representation.task(task, in: reply.engine)))
            },
            Route(.POST, "/tasks/{id}/progress", [200, 404, 409, 415, 422], forWorkers: true, placement: .task) { [unowned self] request, reply in
                try reportProgress(request, reply)
            },
            Route(.POST, "/tasks/{id}/complete", [200, 404, 409, 415, 422], forWorkers: true, placement: .task) { [unowned self] request, reply in
                try reportCompletion(request, reply)
            },
            Route(.POST, "/tasks/{id}/fail", [200, 404, 409, 415, 422], forWorkers: true, placement: .task) { [unowned self] request, reply in
                try reportFailure(request, reply)
            },
            Route(.POST, "/tasks/{id}/retry", [200, 404, 409, 429], placement: .task) { [unowned self] request, reply in
                try refuseWhileDraining()
                let task = try existingTask(request, reply.engine)
                try reply.engine.retryTask(task.id)
                reply.send(.json(.ok, Representation.task(task, in: reply.engine)))
            },
            Route(.POST, "/tasks/{id}/heartbeat", [200, 404, 409, 415, 422], forWorkers: true, placement: .task) { [unowned self] request, reply in
                try heartbeat(request, reply)
            },
            Route(.POST, "/tasks/{id}/release", [200, 404, 409, 415, 422], forWorkers: true, placement: .task) { [unowned self] request, reply in
                try release(request, reply)
            },
            Route(.POST, "/workflows", [201, 404, 409, 415, 422, 429], placement: .submittedWorkflow) { [unowned self] request, reply in try submitWorkflow(request, reply) },
            Route(.GET, "/workflows/{id}", [200, 404], placement: .workflow) { [unowned self] request, reply in
                reply.send(.json(.ok, Representation.workflow(try existingWorkflow(request, reply.engine)),
                                 headers: ["Event-Seq": String(eventLog.lastAssigned)]))
            },
            Route(.DELETE, "/workflows/{id}", [200, 404], placement: .workflow) { [unowned self] request, reply in
                let workflow = try existingWorkflow(request, reply.engine)
                try reply.engine.cancelWorkflow(workflow.id)
                reply.send(.json(.ok, Representation.workflow(workflow)))
            },
            Route(.POST, "/workflows/{id}/retry", [200, 404, 409, 429], placement: .workflow) { [unowned self] request, reply in
                try refuseWhileDraining()
                let workflow = try existingWorkflow(request, reply.engine)
                let count = try reply.engine.retryWorkflow(workflow.id)
                reply.send(.json(.ok, Array(#"{"retried":\#(count)}"#.utf8)))
            },
            Route(.GET, "/queues", [200], placement: .everyCell) { _, reply in
                var json = JSONWriter(capacity: 1_024)
                json.beginObject()
                json.key(static: "queues")
                json.beginArray()
                let now = reply.engine.scheduler.wallClock
                for name in reply.engine.queues.keys.sorted() { Representation.write(reply.engine.queues[name]!, at: now, into: &json) }
                json.endArray()
                json.endObject()
                reply.send(.json(.ok, json.bytes))
            },
            Route(.GET, "/queues/{name}", [200, 404], placement: .queue) { [unowned self] request, reply in
                reply.send(.json(.ok, Representation.queue(try existingQueue(request, reply.engine), at: reply.engine.scheduler.wallClock)))
            },
            Route(.PATCH, "/queues/{name}", [200, 415, 422], placement: .queue) { [unowned self] request, reply in try updateQueue(request, reply) },
            Route(.POST, "/webhooks", [201, 409, 415, 422], placement: .everyCell) { [unowned self] request, reply in try createWebhook(request, reply) },
            Route(.GET, "/webhooks", [200], placement: .everyCell) { [unowned self] request, reply in try listWebhooks(request, reply) },
            Route(.GET, "/webhooks/{id}", [200, 404], placement: .everyCell) { [unowned self] request, reply in try getWebhook(request, reply) },
            Route(.DELETE, "/webhooks/{id}", [200, 404], placement: .everyCell) { [unowned self] request, reply in try deleteWebhook(request, reply) },
            Route(.GET, "/webhooks/{id}/deliveries", [200, 400, 404], placement: .everyCell) { [unowned self] request, reply in
                try listDeliveries(request, reply)
            },
            Route(.POST, "/queues/{name}/lease", [200, 404, 409, 415, 422], forWorkers: true, placement: .queue) { [unowned self] request, reply in
                try lease(request, reply)
            },
            Route(.POST, "/schedules", [201, 409, 415, 422], placement: .submittedSchedule) { [unowned self] request, reply in
                try createSchedule(request, reply)
            },
            Route(.GET, "/schedules", [200], placement: .everyCell) { [unowned self] request, reply in try listSchedules(request, reply) },
            Route(.GET, "/schedules/{id}", [200, 404], placement: .schedule) { [unowned self] request, reply in
                try getSchedule(request, reply)
            },
            Route(.PATCH, "/schedules/{id}", [200, 404, 415, 422], placement: .schedule) { [unowned self] request, reply in
                try updateSchedule(request, reply)
            },
            Route(.DELETE, "/schedules/{id}", [200, 404], placement: .schedule) { [unowned self] request, reply in
                try deleteSchedule(request, reply)
            },
            Route(.POST, "/schedules/{id}/trigger", [201, 404, 409, 429], placement: .schedule) { [unowned self] request, reply in
                try triggerSchedule(request, reply)
            },
            Route(.POST, "/queues/{name}/cancel", [200, 404], placement: .queue) { [unowned self] request, reply in
                let queue = try existingQueue(request, reply.engine)
                let count = reply.engine.cancelAll(inQueue: queue.name)
                reply.send(.json(.ok, Array(#"{"cancelled":\#(count)}"#.utf8)))
            },
        ]
    }

    func makeRouter(_ routes: [Route]) -> Router<Route> {
        var router = Router<Route>()
        for (index, route) in routes.enumerated() {
            route.index = index
            router.add(route.method, route.pattern, route)
        }
        return router
    }

    // MARK: tasks

    private func submitTask(_ request: HTTPRequest, _ reply: Reply) throws {
        try refuseWhileDraining()
        let key = try IdempotencyKeys.key(of: request)
        let fingerprint = key.map { _ in IdempotencyKeys.fingerprint(of: request) }
        if try replayed(key, fingerprint, reply) { return }
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        let spec = reader.object(document, "").flatMap { reader.taskSpec($0, prefix: "") }
        try reader.check()
        try checkKindAllowed(spec!.kind, queue: spec!.queue, field: "kind", reply.engine)
        try refuseUnknownRemoteDependencies(of: [("", spec!)], reply)
        if let key { try idempotency.checkRoom(for: key) }
        let task = try reply.engine.submit(spec!)
        if let key, let fingerprint {
            // Remembered in memory in any case; with a store, written in this turn's batch.
            let record = idempotency.remember(key, fingerprint: fingerprint, status: .created, resource: "/tasks/\(task.id)")
            durable?.record(record)
            if let cellHost, let cell = reply.engine.cell { cellHost.record(record, in: Cell(cell)) }
        }
        metrics.taskSubmitted(kind: task.kind)
        reply.send(.json(.created, Representation.task(task, in: reply.engine), location: Representation.path("/tasks/", task.id)))
    }

    private func getTask(_ request: HTTPRequest, _ reply: Reply) throws {
        let task = try existingTask(request, reply.engine)
        var wait: UInt64 = 0
        if let text = request.query("wait") {
            guard let seconds = Double(text), seconds.isFinite, (0...60).contains(seconds) else {
                throw APIProblem(.badRequest, detail: "wait must be a number of seconds from 0 to 60.",
                                  type: ProblemType.validation, code: "invalid_query",
                                  fieldErrors: [.init(field: "wait", message: "must be 0 to 60.")])
            }
            wait = UInt64(seconds * 1_000)
        }
        if wait == 0 || task.state.isTerminal || isDraining {
            return reply.send(.json(.ok, Representation.task(task, in: reply.engine)))
        }
        waiters.wait(for: task.id, reply: reply, milliseconds: wait)
    }

    /// `?limit=`: 1 to 1000, 100 when absent.
    static func pageLimit(_ request: HTTPRequest, errors: inout [APIProblem.FieldError]) -> Int {
        guard let text = request.query("limit") else { return 100 }
        guard let value = Int(text), (1...1_000).contains(value) else {
            errors.append(.init(field: "limit", message: "must be an integer from 1 to 1000."))
            return 100
        }
        return value
    }

    private func listTasks(_ request: HTTPRequest, _ reply: Reply) throws {
        var errors: [APIProblem.FieldError] = []
        var state: TaskState?
        var queue: TaskQueue?
        var workflow: WorkflowRecord?
        var after: TaskID?
        var empty = false
        if let text = request.query("state") {
            state = TaskState(rawValue: text)
            if state == nil {
                errors.append(.init(field: "state", message: "must be one of \(TaskState.allCases.map(\.rawValue).joined(separator: ", ")).")) }
        }
        if let text = request.query("queue") {
            queue = reply.engine.queues[text]
            if queue == nil { empty = true }
        }
        if let text = request.query("workflow") {
            workflow = TaskID(text).flatMap { reply.engine.workflow($0) }
            if workflow == nil { empty = true }
        }
        let kind = request.query("kind")
        // Case-insensitive, as people type names; an empty text matches every task.
        let nameContains = request.query("name").flatMap { $0.isEmpty ? nil : $0.lowercased() }
        var dependency: TaskID?
        if let text = request.query("depends_on") {
            dependency = TaskID(text)
            if dependency == nil { empty = true }
        }
        let limit = Self.pageLimit(request, errors: &errors)
        if let text = request.query("after"), !text.isEmpty {
            after = TaskID(text)
            if after == nil { errors.append(.init(field: "after", message: "is not a cursor this server gave out.")) }
        }
        guard errors.isEmpty else { throw APIProblem.invalidQuery(errors) }
        let page = empty ? (tasks: [], next: nil) : reply.engine.listTasks(before: after, limit: limit, in: workflow) { task in
            (state == nil || task.state == state) && (queue == nil || task.queue === queue)
                && (kind == nil || task.kind == kind)
                && (dependency == nil || task.dependencies.contains(dependency!))
                && (nameContains == nil || task.name?.lowercased().contains(nameContains!) == true)
        }
        var json = JSONWriter(capacity: 512 * (page.tasks.count + 1))
        json.beginObject()
        json.key(static: "tasks")
        json.beginArray()
        var next = page.next
        for (index, task) in page.tasks.enumerated() {
            Representation.write(task, into: &json, workflow: reply.engine.workflowID(of: task))
            // A page of large tasks stops early; `next` goes on from the last one written.
            if json.byteCount > configuration.maxResponseBytes && index + 1 < page.tasks.count {
                next = task.id
                break
            }
        }
        json.endArray()
        json.field("next", next?.description)
        json.endObject()
        reply.send(.json(.ok, json.bytes, headers: ["Event-Seq": String(eventLog.lastAssigned)]))
    }

    private func reportProgress(_ request: HTTPRequest, _ reply: Reply) throws {
        let task = try existingTask(request, reply.engine)
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var progress: ExternalReport?
        var token: String?
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: ["fraction", "message", "details", "lease_token"], prefix: "")
            progress = reader.progressReport(object, prefix: "")
            token = reader.leaseToken(object)
        }
        try reader.check()
        try reply.engine.report(progress!, for: task.id, leaseToken: token)
        reply.send(.json(.ok, Representation.task(task, in: reply.engine)))
    }

    private func reportCompletion(_ request: HTTPRequest, _ reply: Reply) throws {
        let task = try existingTask(request, reply.engine)
        var result: JSONValue?
        var token: String?
        if let document = try BodyReader.document(request, optional: true) {
            var reader = BodyReader()
            if let object = reader.object(document, "") {
                reader.rejectUnknown(object, allowed: ["result", "lease_token"], prefix: "")
                result = object["result"]
                token = reader.leaseToken(object)
            }
            try reader.check()
        }
        try reply.engine.report(.complete(result: result), for: task.id, leaseToken: token)
        reply.send(.json(.ok, Representation.task(task, in: reply.engine)))
    }

    private func reportFailure(_ request: HTTPRequest, _ reply: Reply) throws {
        let task = try existingTask(request, reply.engine)
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var failure: TaskError?
        var token: String?
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: ["error", "lease_token"], prefix: "")
            token = reader.leaseToken(object)
            failure = reader.failure(object, prefix: "")
        }
        try reader.check()
        try reply.engine.report(.fail(failure!), for: task.id, leaseToken: token)
        reply.send(.json(.ok, Representation.task(task, in: reply.engine)))
    }

    // MARK: workflows

    private func submitWorkflow(_ request: HTTPRequest, _ reply: Reply) throws {
        try refuseWhileDraining()
        let key = try IdempotencyKeys.key(of: request)
        let fingerprint = key.map { _ in IdempotencyKeys.fingerprint(of: request) }
        if try replayed(key, fingerprint, reply) { return }
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        let body = reader.object(document, "").flatMap { reader.workflowBody($0, prefix: "") }
        try reader.check()
        let name = body!.name, members = body!.members
        for (index, member) in members.enumerated() {
            try checkKindAllowed(member.spec.kind, queue: member.spec.queue, field: "tasks[\(index)].kind", reply.engine)
        }
        try refuseUnknownRemoteDependencies(of: members.enumerated().map { ("tasks[\($0.offset)].", $0.element.spec) }, reply)
        if let key { try idempotency.checkRoom(for: key) }
        let workflow = try reply.engine.submitWorkflow(name: name, tasks: members)
        if let key, let fingerprint {
            let record = idempotency.remember(key, fingerprint: fingerprint, status: .created, resource: "/workflows/\(workflow.id)")
            durable?.record(record)
            if let cellHost, let cell = reply.engine.cell { cellHost.record(record, in: Cell(cell)) }
        }
        for task in workflow.tasks { metrics.taskSubmitted(kind: task.kind) }
        let answer = workflow.remoteMembers.isEmpty
            ? Representation.workflow(workflow) : Representation.workflow(workflow, submitted: members, in: reply.engine)
        reply.send(.json(.created, answer, location: Representation.path("/workflows/", workflow.id)))
    }

    // MARK: queues

    private func updateQueue(_ request: HTTPRequest, _ reply: Reply) throws {
        let name = request.parameters["name"] ?? ""
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var maxConcurrency: Int?, paused: Bool?, dispatch: QueueDispatch?, keyConcurrency: Int??, rateLimit: RateLimit??
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: ["max_concurrency", "paused", "dispatch", "key_concurrency", "rate_limit"], prefix: "")
            if case .some(let value?) = reader.string(object, "dispatch", prefix: "") {
                dispatch = QueueDispatch(rawValue: value)
                if dispatch == nil { reader.fail("dispatch", "must be server or workers.") }
            }
            if case .some(let value?) = reader.integer(object, "max_concurrency", prefix: "", in: SubmissionValidator.maxConcurrency) {
                maxConcurrency = Int(value)
            }
            if case .some(let value?) = reader.boolean(object, "paused", prefix: "") { paused = value }
            if case .some(let value) = reader.integer(object, "key_concurrency", prefix: "", in: SubmissionValidator.keyConcurrency,
                                                      nullable: true) {
                keyConcurrency = .some(value.map { Int($0) })
            }
            if let value = object["rate_limit"] { rateLimit = reader.rateLimit(value) }
        }
        try reader.check()
        let queue = try reply.engine.updateQueue(name, maxConcurrency: maxConcurrency, paused: paused, dispatch: dispatch,
                                                 keyConcurrency: keyConcurrency, rateLimit: rateLimit)
        reply.send(.json(.ok, Representation.queue(queue, at: reply.engine.scheduler.wallClock)))
    }

    // MARK: helpers

    /// A repeat of an `Idempotency-Key`'s first request answers that request's status with the
    /// resource as it is now, marked `Idempotent-Replayed`; another request under the key is
    /// 422. Returns whether it answered.
    func replayed(_ key: String?, _ fingerprint: [UInt8]?, _ reply: Reply) throws(APIProblem) -> Bool {
        guard let key, let fingerprint, let first = idempotency.record(for: key) else { return false }
        guard first.requestHash == fingerprint else {
            throw APIProblem(.unprocessableContent, detail: "Idempotency-Key \(key) was first used with a different request.",
                             code: "idempotency_key_reused")
        }
        let status = HTTPStatus(code: first.status)
        var response: HTTPResponse
        if first.resource.hasPrefix("/tasks/"), let id = TaskID(String(first.resource.dropFirst(7))), let task = reply.engine.task(id) {
            response = .json(status, Representation.task(task, in: reply.engine), location: first.resource)
        } else if first.resource.hasPrefix("/workflows/"), let id = TaskID(String(first.resource.dropFirst(11))),
                  let workflow = reply.engine.workflow(id) {
            if let cellHost, !workflow.remoteMembers.isEmpty {
                // Its members in other cells are read where they are kept, as `GET /workflows/{id}` reads them.
                ClusterLists.workflow(id, execute: cellHost.read) { result in
                    guard case .success(let body?) = result else { return reply.send(Self.sharedDatabaseUnavailable.response()) }
                    var response = HTTPResponse.json(status, body, location: first.resource)
                    response.headers.add("Idempotent-Replayed", "true")
                    reply.send(response)
                }
                return true
            }
            response = .json(status, Representation.workflow(workflow), location: first.resource)
        } else {
            throw APIProblem(.notFound, detail: "What Idempotency-Key \(key) created (\(first.resource)) has been forgotten since.")
        }
        response.headers.add("Idempotent-Replayed", "true")
        reply.send(response)
        return true
    }

    func refuseWhileDraining() throws(APIProblem) {
        guard !isDraining else {
            throw APIProblem(.serviceUnavailable, detail: "The server is shutting down and accepts no new tasks.",
                              headers: ["Retry-After": "5"])
        }
    }

    /// `exec` needs `--allow-exec`, except in a queue that workers lease: there the worker's
    /// own flag decides.
    func checkKindAllowed(_ kind: String, queue: String, field: String, _ engine: Engine) throws(APIProblem) {
        guard kind != "exec" || configuration.allowExec || engine.queues[queue]?.dispatch == .workers else {
            throw APIProblem(.unprocessableContent,
                              detail: "exec tasks are disabled here; the server must be started with --allow-exec, "
                                  + "or the task sent to a queue that workers lease.",
                              type: ProblemType.validation, code: "exec_not_allowed",
                              fieldErrors: [.init(field: field, message: "exec is not allowed here.")])
        }
    }

    func existingTask(_ request: HTTPRequest, _ engine: Engine) throws(APIProblem) -> TaskRecord {
        let text = request.parameters["id"] ?? ""
        guard let id = TaskID(text), let task = engine.task(id) else {
            throw APIProblem(.notFound, detail: "No task \(text).")
        }
        return task
    }

    private func existingWorkflow(_ request: HTTPRequest, _ engine: Engine) throws(APIProblem) -> WorkflowRecord {
        let text = request.parameters["id"] ?? ""
        guard let id = TaskID(text), let workflow = engine.workflow(id) else {
            throw APIProblem(.notFound, detail: "No workflow \(text).")
        }
        return workflow
    }

    private func existingQueue(_ request: HTTPRequest, _ engine: Engine) throws(APIProblem) -> TaskQueue {
        let name = request.parameters["name"] ?? ""
        guard let queue = engine.queues[name] else { throw APIProblem(.notFound, detail: "No queue \(name).") }
        return queue
    }
}
