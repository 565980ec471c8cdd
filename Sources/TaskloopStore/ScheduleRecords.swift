import TaskloopEngine
import TaskloopJSON

/// Schedules as the store keeps them: one JSON document per schedule, its template in the
/// field names of `POST /tasks` and `POST /workflows` (so the API shows it in the same form).
/// Schedules are few and change once per slot, so the compact binary form of tasks buys nothing.
public enum ScheduleRecordCodec {
    /// The template as the API shows it: `("task", {...})` or `("workflow", {name, tasks})`.
    public static func json(_ template: ScheduleTemplate) -> (key: String, value: JSONValue) {
        switch template {
        case .task(let spec):
            return ("task", .object(json(spec, key: nil)))
        case .workflow(let name, let members):
            var object = JSONObject()
            if let name { object.append("name", .string(name)) }
            object.append("tasks", .array(members.map { .object(json($0.spec, key: $0.key)) }))
            return ("workflow", .object(object))
        }
    }

    /// A task spec in the fields `POST /tasks` takes (`key` first inside a workflow).
    public static func json(_ spec: TaskSpec, key: String?) -> JSONObject {
        var object = JSONObject()
        if let key { object.append("key", .string(key)) }
        object.append("kind", .string(spec.kind))
        object.append("params", spec.params)
        if let name = spec.name { object.append("name", .string(name)) }
        object.append("queue", .string(spec.queue))
        object.append("priority", .int(Int64(spec.priority)))
        if !spec.dependencies.isEmpty {
            object.append("dependencies", .array(spec.dependencies.map { reference in
                switch reference {
                case .task(let id): .string(id.description)
                case .sibling(let key): .string(key)
                }
            }))
        }
        object.append("on_dependency_failure", .string(spec.onDependencyFailure.rawValue))
        if let timeout = spec.timeoutMilliseconds { object.append("timeout_ms", .int(Int64(clamping: timeout))) }
        object.append("retry", .object([
            "max_attempts": .int(Int64(spec.retry.maxAttempts)),
            "backoff_ms": .int(Int64(clamping: spec.retry.backoffMilliseconds)),
            "backoff_factor": .double(spec.retry.backoffFactor),
        ]))
        if let metadata = spec.metadata { object.append("metadata", metadata) }
        if case .after(let delay)? = spec.runAt { object.append("delay_ms", .int(Int64(clamping: delay))) }
        if case .after(let ttl)? = spec.expiry { object.append("ttl_ms", .int(Int64(clamping: ttl))) }
        if let key = spec.uniqueKey { object.append("unique_key", .string(key)) }
        if let window = spec.uniqueForMilliseconds { object.append("unique_for_ms", .int(Int64(clamping: window))) }
        return object
    }

    public static func encode(_ schedule: ScheduleSnapshot) -> [UInt8] {
        let spec = schedule.spec
        var object = JSONObject()
        object.append("id", .string(schedule.id.description))
        object.append("name", .string(spec.name))
        object.append("cron", .string(spec.cron))
        object.append("timezone", .string(spec.timezone))
        let template = json(spec.template)
        object.append(template.key, template.value)
        object.append("overlap", .string(spec.overlap.rawValue))
        object.append("catchup", .string(spec.catchup.rawValue))
        object.append("max_catchup", .int(Int64(spec.maxCatchup)))
        object.append("paused", .bool(spec.paused))
        object.append("jitter_ms", .int(Int64(clamping: spec.jitterMilliseconds)))
        if let startAt = spec.startAt { object.append("start_at", .int(startAt)) }
        if let endAt = spec.endAt { object.append("end_at", .int(endAt)) }
        object.append("created_at", .int(schedule.createdAt))
        object.append("updated_at", .int(schedule.updatedAt))
        object.append("last_slot", .int(schedule.lastSlot))
        object.append("last_runs", .array(schedule.lastRuns.map { run in
            var entry = JSONObject()
            entry.append("slot", .int(run.slot))
            entry.append("at", .int(run.at))
            target(run.target, into: &entry)
            if let ended = run.endedAs { entry.append("ended_as", .string(ended.rawValue)) }
            if let error = run.error { entry.append("error", .string(error)) }
            return .object(entry)
        }))
        var current = JSONObject()
        if let run = schedule.currentRun { target(run, into: &current) }
        object.append("current_run", .object(current))
        object.append("fired", .int(Int64(clamping: schedule.firedCount)))
        object.append("skipped", .int(Int64(clamping: schedule.skippedCount)))
        object.append("missed", .int(Int64(clamping: schedule.missedCount)))
        var writer = JSONWriter()
        writer.value(.object(object))
        return writer.bytes
    }

    private static func target(_ target: ScheduleRun.Target, into object: inout JSONObject) {
        switch target {
        case .task(let id): object.append("task_id", .string(id.description))
        case .workflow(let id): object.append("workflow_id", .string(id.description))
        case .none: break
        }
    }

    public static func decode(_ bytes: [UInt8]) throws(RecordDecodingError) -> ScheduleSnapshot {
        func failure(_ reason: String) -> RecordDecodingError { RecordDecodingError(table: "schedules", reason: reason) }
        guard let value = try? JSONParser.parse(bytes), let object = value.objectValue else { throw failure("not a JSON object") }
        func text(_ key: String, in object: JSONObject) throws(RecordDecodingError) -> String {
            guard let value = object[key]?.stringValue else { throw failure("no \(key)") }
            return value
        }
        func integer(_ key: String, in object: JSONObject) throws(RecordDecodingError) -> Int64 {
            guard let value = object[key]?.intValue else { throw failure("no \(key)") }
            return value
        }
        func id(_ text: String?) throws(RecordDecodingError) -> TaskID {
            guard let text, let id = TaskID(text) else { throw failure("a bad id") }
            return id
        }
        func target(_ object: JSONObject) throws(RecordDecodingError) -> ScheduleRun.Target {
            if let task = object["task_id"] { return .task(try id(task.stringValue)) }
            if let workflow = object["workflow_id"] { return .workflow(try id(workflow.stringValue)) }
            return .none
        }
        let template: ScheduleTemplate
        if let task = object["task"]?.objectValue {
            template = .task(try spec(task, failure: failure))
        } else if let workflow = object["workflow"]?.objectValue, let members = workflow["tasks"]?.arrayValue {
            var decoded: [ScheduleTemplate.WorkflowMember] = []
            for member in members {
                guard let memberObject = member.objectValue else { throw failure("a workflow member is not an object") }
                decoded.append(.init(key: try text("key", in: memberObject), spec: try spec(memberObject, failure: failure)))
            }
            template = .workflow(name: workflow["name"]?.stringValue, tasks: decoded)
        } else {
            throw failure("no task or workflow")
        }
        guard let overlap = ScheduleOverlap(rawValue: try text("overlap", in: object)),
              let catchup = ScheduleCatchup(rawValue: try text("catchup", in: object)) else { throw failure("a bad overlap or catchup") }
        let spec = ScheduleSpec(
            name: try text("name", in: object), cron: try text("cron", in: object), timezone: try text("timezone", in: object),
            template: template, overlap: overlap, catchup: catchup, maxCatchup: Int(try integer("max_catchup", in: object)),
            paused: object["paused"]?.boolValue ?? false, jitterMilliseconds: UInt64(max(0, try integer("jitter_ms", in: object))),
            startAt: object["start_at"]?.intValue, endAt: object["end_at"]?.intValue)
        var runs: [ScheduleRun] = []
        for entry in object["last_runs"]?.arrayValue ?? [] {
            guard let run = entry.objectValue else { throw failure("a run is not an object") }
            runs.append(ScheduleRun(slot: try integer("slot", in: run), at: try integer("at", in: run), target: try target(run),
                                    endedAs: run["ended_as"]?.stringValue.flatMap(TaskState.init(rawValue:)),
                                    error: run["error"]?.stringValue))
        }
        let current = try object["current_run"]?.objectValue.map { object throws(RecordDecodingError) in try target(object) }
        return ScheduleSnapshot(
            id: try id(object["id"]?.stringValue), spec: spec, createdAt: try integer("created_at", in: object),
            updatedAt: try integer("updated_at", in: object), lastSlot: try integer("last_slot", in: object), lastRuns: runs,
            firedCount: UInt64(max(0, object["fired"]?.intValue ?? 0)), skippedCount: UInt64(max(0, object["skipped"]?.intValue ?? 0)),
            missedCount: UInt64(max(0, object["missed"]?.intValue ?? 0)), currentRun: current == ScheduleRun.Target.none ? nil : current)
    }

    /// A template's task as `json(_:key:)` wrote it (trusted: the store wrote it).
    static func spec(_ object: JSONObject, failure: (String) -> RecordDecodingError) throws(RecordDecodingError) -> TaskSpec {
        guard let kind = object["kind"]?.stringValue else { throw failure("a template without a kind") }
        var spec = TaskSpec(kind: kind)
        if let params = object["params"] { spec.params = params }
        spec.name = object["name"]?.stringValue
        if let queue = object["queue"]?.stringValue { spec.queue = queue }
        spec.priority = Int(object["priority"]?.intValue ?? 0)
        spec.dependencies = (object["dependencies"]?.arrayValue ?? []).compactMap { value in
            // A template names siblings only (Engine+Schedules refuses existing tasks).
            value.stringValue.map { .sibling(key: $0) }
        }
        if let policy = object["on_dependency_failure"]?.stringValue.flatMap(DependencyFailurePolicy.init(rawValue:)) {
            spec.onDependencyFailure = policy
        }
        spec.timeoutMilliseconds = object["timeout_ms"]?.intValue.map { UInt64(max(0, $0)) }
        if let retry = object["retry"]?.objectValue {
            spec.retry = RetryPolicy(maxAttempts: Int(retry["max_attempts"]?.intValue ?? 1),
                                     backoffMilliseconds: UInt64(max(0, retry["backoff_ms"]?.intValue ?? 1_000)),
                                     backoffFactor: retry["backoff_factor"]?.doubleValue ?? 2)
        }
        spec.metadata = object["metadata"]
        spec.runAt = object["delay_ms"]?.intValue.map { .after(UInt64(max(0, $0))) }
        spec.expiry = object["ttl_ms"]?.intValue.map { .after(UInt64(max(0, $0))) }
        spec.uniqueKey = object["unique_key"]?.stringValue
        spec.uniqueForMilliseconds = object["unique_for_ms"]?.intValue.map { UInt64(max(0, $0)) }
        return spec
    }
}

private extension JSONObject {
    mutating func append(_ key: String, _ value: JSONValue) { self[key] = value }
}
