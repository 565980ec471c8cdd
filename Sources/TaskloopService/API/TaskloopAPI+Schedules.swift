import Dispatch
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON
import TaskloopLoop
import TaskloopStore
import TaskloopTime

/// Schedules (cron) over HTTP: create, list, read, change, delete, and trigger one run now.
/// The engine owns them (Engine+Schedules); these read bodies and render.
extension TaskloopApplication {
    func createSchedule(_ request: HTTPRequest, _ reply: Reply) throws {
        try refuseWhileDraining()
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        let spec = reader.object(document, "").flatMap { reader.scheduleSpec($0, merging: nil) }
        try reader.check()
        try checkKindsAllowed(in: spec!.template, reply.engine)
        guard zoneIsLoaded(spec!.timezone, request, reply) else { return }
        let schedule = try reply.engine.createSchedule(spec!)
        reply.send(.json(.created, Representation.schedule(schedule, in: reply.engine),
                         location: Representation.path("/schedules/", schedule.id)))
    }

    func listSchedules(_ request: HTTPRequest, _ reply: Reply) throws {
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        json.key(static: "schedules")
        json.beginArray()
        for schedule in reply.engine.allSchedules { Representation.write(schedule, in: reply.engine, into: &json) }
        json.endArray()
        json.endObject()
        reply.send(.json(.ok, json.bytes, headers: ["Event-Seq": String(eventLog.lastAssigned)]))
    }

    func getSchedule(_ request: HTTPRequest, _ reply: Reply) throws {
        reply.send(.json(.ok, Representation.schedule(try existingSchedule(request, reply.engine), in: reply.engine)))
    }

    func updateSchedule(_ request: HTTPRequest, _ reply: Reply) throws {
        let schedule = try existingSchedule(request, reply.engine)
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        let spec = reader.object(document, "").flatMap { reader.scheduleSpec($0, merging: schedule.spec) }
        try reader.check()
        try checkKindsAllowed(in: spec!.template, reply.engine)
        guard zoneIsLoaded(spec!.timezone, request, reply) else { return }
        try reply.engine.updateSchedule(schedule.id, to: spec!)
        reply.send(.json(.ok, Representation.schedule(schedule, in: reply.engine)))
    }

    func deleteSchedule(_ request: HTTPRequest, _ reply: Reply) throws {
        let schedule = try existingSchedule(request, reply.engine)
        try reply.engine.deleteSchedule(schedule.id)
        reply.send(.json(.ok, Representation.schedule(schedule, in: reply.engine)))
    }

    /// One run now: 201 with the run's task (or workflow) and its Location.
    func triggerSchedule(_ request: HTTPRequest, _ reply: Reply) throws {
        try refuseWhileDraining()
        let schedule = try existingSchedule(request, reply.engine)
        // A trigger's run always made its task or workflow: a refusal throws instead.
        let run = try reply.engine.triggerSchedule(schedule.id)
        if case .workflow(let id) = run.target {
            let workflow = reply.engine.workflow(id)!
            // On cells, members of other cells are made there after the commit: shown as submitted.
            var answer = Representation.workflow(workflow)
            if !workflow.remoteMembers.isEmpty, case .workflow(_, let members) = schedule.spec.template {
                answer = Representation.workflow(workflow, submitted: members.map { ($0.key, $0.spec) }, in: reply.engine)
            }
            reply.send(.json(.created, answer, location: Representation.path("/workflows/", id)))
        } else {
            let id = run.target.id!
            reply.send(.json(.created, Representation.task(reply.engine.task(id)!, in: reply.engine),
                             location: Representation.path("/tasks/", id)))
        }
    }

    /// Whether the engine can have the zone named `name`: it is loaded, or the name is not a
    /// zone's (the engine refuses it). If not, the zone's tzdata file is read off the loop and
    /// the request, which changed nothing yet, is served again once it is; a zone that cannot
    /// be read is answered 400 naming `timezone`, as the engine words it.
    private func zoneIsLoaded(_ name: String, _ request: HTTPRequest, _ reply: Reply) -> Bool {
        let zones = configuration.engine.zones
        if zones.loaded(named: name) != nil || !TimeZoneRules.isValidName(name) { return true }
        let bound = LoopBound((application: self, request: request, reply: reply), loop: loop)
        DispatchQueue.global().async {
            let loaded = Result { () throws(TimeZoneError) in try zones.load(named: name) }
            _ = bound.loop.execute {
                let (application, request, reply) = bound.value
                switch loaded {
                case .success:
                    application.serveAgain(request, reply)
                case .failure(let error):
                    let problem = EngineError(.invalid, "Invalid timezone: \(error.description).", field: "timezone")
                    reply.send(errorResponse(for: problem))
                }
            }
        }
        return false
    }

    func existingSchedule(_ request: HTTPRequest, _ engine: Engine) throws(APIProblem) -> ScheduleRecord {
        let text = request.parameters["id"] ?? ""
        guard let id = TaskID(text), let schedule = engine.schedule(id) else {
            throw APIProblem(.notFound, detail: "No schedule \(text).", code: "not_found")
        }
        return schedule
    }

    /// The kinds a template names must be ones this server lets clients submit, as for POST /tasks.
    private func checkKindsAllowed(in template: ScheduleTemplate, _ engine: Engine) throws {
        switch template {
        case .task(let spec):
            try checkKindAllowed(spec.kind, queue: spec.queue, field: "task.kind", engine)
        case .workflow(_, let members):
            for (index, member) in members.enumerated() {
                try checkKindAllowed(member.spec.kind, queue: member.spec.queue, field: "workflow.tasks[\(index)].kind", engine)
            }
        }
    }
}

extension BodyReader {
    static let scheduleFields = [
        "name", "cron", "timezone", "task", "workflow", "overlap", "catchup", "max_catchup", "paused", "jitter_ms", "start_at",
        "end_at",
    ]

    /// A schedule as `POST /schedules` gives it (`current` nil: `name`, `cron` and one of `task`
    /// or `workflow` required), or `PATCH /schedules/{id}`'s fields merged into `current`.
    mutating func scheduleSpec(_ object: JSONObject, merging current: ScheduleSpec?) -> ScheduleSpec? {
        let errorsBefore = errors.count
        rejectUnknown(object, allowed: Self.scheduleFields, prefix: "")
        var name = current?.name, cron = current?.cron, template = current?.template
        if case .some(let value?) = string(object, "name", prefix: "", maxLength: ScheduleSpec.maxNameLength) {
            if value.isEmpty { fail("name", "must not be empty.") } else { name = value }
        } else if current == nil && object["name"] == nil {
            fail("name", "is required.")
        }
        if case .some(let value?) = string(object, "cron", prefix: "", maxLength: CronExpression.maximumLength) {
            cron = value
        } else if current == nil && object["cron"] == nil {
            fail("cron", "is required: 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or a macro such as @daily.")
        }
        var spec = ScheduleSpec(name: name ?? "", cron: cron ?? "", template: template ?? .task(TaskSpec(kind: "")))
        if let current { spec = current }
        spec.name = name ?? spec.name
        spec.cron = cron ?? spec.cron
        if case .some(let zone?) = string(object, "timezone", prefix: "", maxLength: TimeZoneRules.maximumNameLength) {
            spec.timezone = zone
        }
        let task = object["task"], workflow = object["workflow"]
        switch (task, workflow) {
        case (.some, .some):
            fail("workflow", "cannot be given with task: a schedule runs one task or one workflow.")
        case (.some(let value), nil):
            if let body = self.object(value, "task"), let parsed = taskSpec(body, prefix: "task.") { template = .task(parsed) }
        case (nil, .some(let value)):
            if let body = self.object(value, "workflow"), let parsed = workflowBody(body, prefix: "workflow.") {
                template = .workflow(name: parsed.name, tasks: parsed.members.map { .init(key: $0.key, spec: $0.spec) })
            }
        case (nil, nil):
            if current == nil { fail("task", "is required: the task (as POST /tasks takes it) or a workflow (as POST /workflows takes it) each run submits.") }
        }
        if let template { spec.template = template }
        if case .some(let text?) = string(object, "overlap", prefix: "") {
            if let value = ScheduleOverlap(rawValue: text) { spec.overlap = value } else {
                fail("overlap", "must be \"skip\", \"allow\" or \"cancel_previous\".")
            }
        }
        if case .some(let text?) = string(object, "catchup", prefix: "") {
            if let value = ScheduleCatchup(rawValue: text) { spec.catchup = value } else {
                fail("catchup", "must be \"none\", \"latest\" or \"all\".")
            }
        }
        let catchupRange = Int64(ScheduleSpec.maxCatchupRange.lowerBound)...Int64(ScheduleSpec.maxCatchupRange.upperBound)
        if case .some(let value?) = integer(object, "max_catchup", prefix: "", in: catchupRange) { spec.maxCatchup = Int(value) }
        if case .some(let value?) = boolean(object, "paused", prefix: "") { spec.paused = value }
        if case .some(let value?) = integer(object, "jitter_ms", prefix: "", in: 0...Int64(ScheduleSpec.maxJitterMilliseconds)) {
            spec.jitterMilliseconds = UInt64(value)
        }
        if case .some(let value) = time(object, "start_at", prefix: "", nullable: true) { spec.startAt = value }
        if case .some(let value) = time(object, "end_at", prefix: "", nullable: true) { spec.endAt = value }
        return errors.count == errorsBefore ? spec : nil
    }

    /// `{name?, tasks: [{key, ...task}]}` as `POST /workflows` takes it; `prefix` goes before
    /// every field path (`workflow.` inside a schedule).
    mutating func workflowBody(_ object: JSONObject, prefix: String) -> (name: String?, members: [(key: String, spec: TaskSpec)])? {
        let errorsBefore = errors.count
        var name: String?
        var members: [(key: String, spec: TaskSpec)] = []
        rejectUnknown(object, allowed: ["name", "tasks"], prefix: prefix)
        if case .some(let value) = string(object, "name", prefix: prefix, nullable: true) { name = value }
        if let list = object["tasks"]?.arrayValue {
            if list.isEmpty { fail(prefix + "tasks", "must list at least one task.") }
            let keys = Set(list.compactMap { $0.objectValue?["key"]?.stringValue })
            for (index, element) in list.enumerated() {
                var member: (key: String, spec: TaskSpec)?
                readNamingProblems(under: "\(prefix)tasks[\(index)]") { reader, field in
                    member = reader.workflowMember(element, field: field, siblingKeys: keys)
                }
                if let member { members.append(member) }
            }
        } else {
            fail(prefix + "tasks", object["tasks"] == nil ? "is required." : "must be an array of tasks.")
        }
        return errors.count == errorsBefore ? (name, members) : nil
    }

    /// One task of a workflow body, `{key, ...task fields}`, its problems named under `field`.
    private mutating func workflowMember(_ element: JSONValue, field: String, siblingKeys: Set<String>) -> (key: String, spec: TaskSpec)? {
        guard let task = object(element, field) else { return nil }
        let at = field.isEmpty ? "" : field + "."
        let key: String?
        switch string(task, "key", prefix: at, maxLength: SubmissionValidator.maxKeyLength) {
        case .some(let value?) where !value.isEmpty: key = value
        case .some: fail(at + "key", "is required and must not be empty."); key = nil
        case .none:
            if task["key"] == nil { fail(at + "key", "is required.") }
            key = nil
        }
        guard let spec = taskSpec(task, prefix: at, siblingKeys: siblingKeys), let key else { return nil }
        return (key, spec)
    }
}

extension Representation {
    static func schedule(_ schedule: ScheduleRecord, in engine: Engine) -> [UInt8] {
        var json = JSONWriter(capacity: 1_024)
        write(schedule, in: engine, into: &json)
        return json.bytes
    }

    /// `{id, name, cron, timezone, task | workflow, overlap, catchup, max_catchup, paused,
    /// jitter_ms, start_at, end_at, created_at, updated_at, next_runs, last_runs}`: `next_runs`
    /// the next five slots (unjittered; none while paused), `last_runs` the newest twenty runs,
    /// oldest first, each with its task's or workflow's state now.
    static func write(_ schedule: ScheduleRecord, in engine: Engine, into json: inout JSONWriter) {
        write(schedule.moment(), state: engine.state(of:), into: &json)
    }

    /// A schedule as one change left it (its event), each run's state as `state` reads it.
    static func write(_ schedule: ScheduleMoment, state: (ScheduleRun) -> String, into json: inout JSONWriter) {
        write(schedule.id, schedule.spec, createdAt: schedule.createdAt, updatedAt: schedule.updatedAt,
              nextRuns: schedule.nextRuns(), lastRuns: schedule.lastRuns, state: state, deleted: schedule.deleted, into: &json)
    }

    /// A schedule as its cell's last commit left it (`GET /schedules` with replicas, read from
    /// the database): `state` gives each run's state as its engine would.
    static func write(_ schedule: ScheduleSnapshot, zones: TimeZoneCatalog, state: (ScheduleRun) -> String,
                      into json: inout JSONWriter) {
        write(schedule.id, schedule.spec, createdAt: schedule.createdAt, updatedAt: schedule.updatedAt,
              nextRuns: schedule.nextRuns(zones: zones),
              lastRuns: schedule.lastRuns, state: state, deleted: false, into: &json)
    }

    private static func write(_ id: TaskID, _ spec: ScheduleSpec, createdAt: Int64, updatedAt: Int64, nextRuns: [Int64],
                              lastRuns: [ScheduleRun], state: (ScheduleRun) -> String, deleted: Bool, into json: inout JSONWriter) {
        json.beginObject()
        json.key(static: "id")
        write(id, into: &json)
        json.field("name", spec.name)
        json.field("cron", spec.cron)
        json.field("timezone", spec.timezone)
        ScheduleRecordCodec.write(spec.template, into: &json)
        json.field("overlap", spec.overlap.rawValue)
        json.field("catchup", spec.catchup.rawValue)
        json.field("max_catchup", spec.maxCatchup)
        json.field("paused", spec.paused)
        json.field("jitter_ms", Int(spec.jitterMilliseconds))
        timestamp("start_at", spec.startAt, into: &json)
        timestamp("end_at", spec.endAt, into: &json)
        timestamp("created_at", createdAt, into: &json)
        timestamp("updated_at", updatedAt, into: &json)
        json.key(static: "next_runs")
        json.beginArray()
        for slot in nextRuns { json.string(rfc3339(slot)) }
        json.endArray()
        json.key(static: "last_runs")
        json.beginArray()
        for run in lastRuns {
            json.beginObject()
            timestamp("slot", run.slot, into: &json)
            timestamp("at", run.at, into: &json)
            switch run.target {
            case .task(let id):
                json.key(static: "task_id")
                write(id, into: &json)
            case .workflow(let id):
                json.key(static: "workflow_id")
                write(id, into: &json)
            case .none:
                break
            }
            json.field("state", state(run))
            if let error = run.error { json.field("error", error) }
            json.endObject()
        }
        json.endArray()
        if deleted { json.field("deleted", true) }
        json.endObject()
    }
}
