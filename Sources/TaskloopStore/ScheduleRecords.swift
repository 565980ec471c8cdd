import TaskloopEngine
import TaskloopJSON

/// Schedules as the store keeps them: one JSON document per schedule, its template in the
/// field names of `POST /tasks` and `POST /workflows` (so the API shows it in the same form).
/// Schedules are few and change once per slot, so the compact binary form of tasks buys nothing.
public enum ScheduleRecordCodec {
    /// The template as the API shows it, as a member of the object `json` is writing:
    /// `"task": {...}` or `"workflow": {name, tasks}`. Written straight to bytes: a schedule
    /// firing every second is encoded every second.
    public static func write(_ template: ScheduleTemplate, into json: inout JSONWriter) {
        switch template {
        case .task(let spec):
            json.key(static: "task")
            write(spec, key: nil, into: &json)
        case .workflow(let name, let members):
            json.key(static: "workflow")
            json.beginObject()
            if let name { json.field("name", name) }
            json.key(static: "tasks")
            json.beginArray()
            for member in members { write(member.spec, key: member.key, into: &json) }
            json.endArray()
            json.endObject()
        }
    }

    /// A task spec in the fields `POST /tasks` takes (`key` first inside a workflow).
    private static func write(_ spec: TaskSpec, key: String?, into json: inout JSONWriter) {
        json.beginObject()
        if let key { json.field("key", key) }
        json.field("kind", spec.kind)
        json.field("params", spec.params)
        if let name = spec.name { json.field("name", name) }
        json.field("queue", spec.queue)
        json.field("priority", Int(spec.priority))
        if !spec.dependencies.isEmpty {
            json.key(static: "dependencies")
            json.beginArray()
            for reference in spec.dependencies {
                switch reference {
                case .task(let id): json.string(id.description)
                case .sibling(let key): json.string(key)
                }
            }
            json.endArray()
        }
        json.field("on_dependency_failure", spec.onDependencyFailure.rawValue)
        if let timeout = spec.timeoutMilliseconds { json.key(static: "timeout_ms"); json.int(Int64(clamping: timeout)) }
        json.key(static: "retry")
        json.beginObject()
        json.field("max_attempts", Int(spec.retry.maxAttempts))
        json.key(static: "backoff_ms")
        json.int(Int64(clamping: spec.retry.backoffMilliseconds))
        json.key(static: "backoff_factor")
        json.double(spec.retry.backoffFactor)
        json.endObject()
        if let metadata = spec.metadata { json.field("metadata", metadata) }
        if case .after(let delay)? = spec.runAt { json.key(static: "delay_ms"); json.int(Int64(clamping: delay)) }
        if case .after(let ttl)? = spec.expiry { json.key(static: "ttl_ms"); json.int(Int64(clamping: ttl)) }
        if let key = spec.uniqueKey { json.field("unique_key", key) }
        if let window = spec.uniqueForMilliseconds { json.key(static: "unique_for_ms"); json.int(Int64(clamping: window)) }
        json.endObject()
    }

    public static func encode(_ schedule: ScheduleSnapshot) -> [UInt8] {
        let spec = schedule.spec
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        json.field("id", schedule.id.description)
        json.field("name", spec.name)
        json.field("cron", spec.cron)
        json.field("timezone", spec.timezone)
        write(spec.template, into: &json)
        json.field("overlap", spec.overlap.rawValue)
        json.field("catchup", spec.catchup.rawValue)
        json.field("max_catchup", spec.maxCatchup)
        json.field("paused", spec.paused)
        json.key(static: "jitter_ms")
        json.int(Int64(clamping: spec.jitterMilliseconds))
        if let startAt = spec.startAt { json.key(static: "start_at"); json.int(startAt) }
        if let endAt = spec.endAt { json.key(static: "end_at"); json.int(endAt) }
        json.key(static: "created_at")
        json.int(schedule.createdAt)
        json.key(static: "updated_at")
        json.int(schedule.updatedAt)
        json.key(static: "last_slot")
        json.int(schedule.lastSlot)
        json.key(static: "last_runs")
        json.beginArray()
        for run in schedule.lastRuns {
            json.beginObject()
            json.key(static: "slot")
            json.int(run.slot)
            json.key(static: "at")
            json.int(run.at)
            target(run.target, into: &json)
            if let ended = run.endedAs { json.field("ended_as", ended.rawValue) }
            if let error = run.error { json.field("error", error) }
            json.endObject()
        }
        json.endArray()
        json.key(static: "current_run")
        json.beginObject()
        if let run = schedule.currentRun { target(run, into: &json) }
        json.endObject()
        json.key(static: "fired")
        json.int(Int64(clamping: schedule.firedCount))
        json.key(static: "skipped")
        json.int(Int64(clamping: schedule.skippedCount))
        json.key(static: "missed")
        json.int(Int64(clamping: schedule.missedCount))
        json.endObject()
        return json.bytes
    }

    private static func target(_ target: ScheduleRun.Target, into json: inout JSONWriter) {
        switch target {
        case .task(let id): json.field("task_id", id.description)
        case .workflow(let id): json.field("workflow_id", id.description)
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
