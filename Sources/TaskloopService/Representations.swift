import TaskloopEngine
import TaskloopJSON

/// How engine objects look on the wire. One place, so every endpoint shows a task the same way.
///
/// Threading: loop thread (the records belong to the engine).
enum Representation {
    static func task(_ task: TaskRecord) -> [UInt8] {
        var json = JSONWriter(capacity: 512)
        write(task, into: &json)
        return json.bytes
    }

    static func write(_ task: TaskRecord, into json: inout JSONWriter) {
        json.beginObject()
        json.field("id", task.id.description)
        json.field("name", task.name)
        json.field("kind", task.kind)
        json.field("params", task.params)
        json.field("queue", task.queue.name)
        json.field("priority", task.priority)
        json.field("state", task.state.rawValue)
        json.field("cancel_requested", task.cancelRequested)
        json.key("dependencies")
        json.beginArray()
        for dependency in task.dependencies { json.string(dependency.description) }
        json.endArray()
        json.field("on_dependency_failure", task.onDependencyFailure.rawValue)
        json.key("progress")
        write(task.progress, into: &json)
        json.field("attempt", task.attempt)
        json.field("max_attempts", task.maxAttempts)
        json.key("timeout_ms")
        if let timeout = task.timeoutMilliseconds { json.int(Int64(timeout)) } else { json.null() }
        json.key("retry")
        json.beginObject()
        json.field("max_attempts", task.retry.maxAttempts)
        json.field("backoff_ms", Int(task.retry.backoffMilliseconds))
        json.key("backoff_factor")
        json.double(task.retry.backoffFactor)
        json.endObject()
        timestamp("created_at", task.createdAt, into: &json)
        timestamp("started_at", task.startedAt, into: &json)
        timestamp("finished_at", task.finishedAt, into: &json)
        json.field("result", task.result ?? .null)
        json.key("error")
        if let error = task.error { write(error, into: &json) } else { json.null() }
        json.field("metadata", task.metadata ?? .null)
        json.field("workflow", task.workflow?.id.description)
        json.endObject()
    }

    static func write(_ progress: TaskProgress, into json: inout JSONWriter) {
        json.beginObject()
        json.key("fraction")
        if let fraction = progress.fraction { json.double(fraction) } else { json.null() }
        json.field("message", progress.message)
        json.field("details", progress.details ?? .null)
        timestamp("updated_at", progress.updatedAt, into: &json)
        json.endObject()
    }

    static func write(_ error: TaskError, into json: inout JSONWriter) {
        json.beginObject()
        json.field("code", error.code)
        json.field("message", error.message)
        for member in error.details where member.key != "code" && member.key != "message" {
            json.field(member.key, member.value)
        }
        json.endObject()
    }

    static func workflow(_ workflow: WorkflowRecord) -> [UInt8] {
        var json = JSONWriter(capacity: 512 * (workflow.tasks.count + 1))
        json.beginObject()
        json.field("id", workflow.id.description)
        json.field("name", workflow.name)
        json.field("state", workflow.state.rawValue)
        json.key("progress")
        json.beginObject()
        json.key("fraction")
        json.double(workflow.fraction)
        json.endObject()
        timestamp("created_at", workflow.createdAt, into: &json)
        json.key("tasks")
        json.beginArray()
        for task in workflow.tasks { write(task, into: &json) }
        json.endArray()
        json.key("keys")
        json.beginObject()
        for entry in workflow.keys { json.field(entry.key, entry.id.description) }
        json.endObject()
        json.endObject()
        return json.bytes
    }

    static func write(_ queue: TaskQueue, into json: inout JSONWriter) {
        json.beginObject()
        json.field("name", queue.name)
        json.field("max_concurrency", queue.maxConcurrency)
        json.field("paused", queue.paused)
        json.key("counts")
        json.beginObject()
        for state in TaskState.allCases { json.field(state.rawValue, queue.counts[state]) }
        json.endObject()
        json.endObject()
    }

    static func queue(_ queue: TaskQueue) -> [UInt8] {
        var json = JSONWriter()
        write(queue, into: &json)
        return json.bytes
    }

    private static func timestamp(_ name: String, _ milliseconds: Int64?, into json: inout JSONWriter) {
        json.key(name)
        if let milliseconds { json.string(rfc3339(milliseconds)) } else { json.null() }
    }

    /// `2026-11-22T14:50:00.123Z` from milliseconds since the Unix epoch (UTC, proleptic
    /// Gregorian; Howard Hinnant's days-to-civil).
    static func rfc3339(_ milliseconds: Int64) -> String {
        let millisecondsPerDay: Int64 = 86_400_000
        var days = milliseconds / millisecondsPerDay
        var rest = milliseconds % millisecondsPerDay
        if rest < 0 {
            rest += millisecondsPerDay
            days -= 1
        }
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(24)
        func digits(_ value: Int64, _ width: Int) {
            var divisor: Int64 = 1
            for _ in 1..<width { divisor *= 10 }
            var value = value
            while divisor > 0 {
                bytes.append(UInt8(ascii: "0") + UInt8(value / divisor % 10))
                value %= divisor
                divisor /= 10
            }
        }
        digits(year, 4)
        bytes.append(UInt8(ascii: "-"))
        digits(month, 2)
        bytes.append(UInt8(ascii: "-"))
        digits(day, 2)
        bytes.append(UInt8(ascii: "T"))
        digits(rest / 3_600_000, 2)
        bytes.append(UInt8(ascii: ":"))
        digits(rest / 60_000 % 60, 2)
        bytes.append(UInt8(ascii: ":"))
        digits(rest / 1_000 % 60, 2)
        bytes.append(UInt8(ascii: "."))
        digits(rest % 1_000, 3)
        bytes.append(UInt8(ascii: "Z"))
        return String(decoding: bytes, as: UTF8.self)
    }
}
