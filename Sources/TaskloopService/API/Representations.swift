import Glibc
import TaskloopEngine
import TaskloopExecutors
import TaskloopJSON
import TaskloopTime

/// How engine objects look on the wire. One place, so every endpoint shows a task the same way.
///
/// Threading: loop thread (the records belong to the engine).
enum Representation {
    /// `engine`: the engine holding it, which knows its workflow when that is another cell's
    /// (`Engine.workflowID(of:)`).
    static func task(_ task: TaskRecord, in engine: Engine? = nil) -> [UInt8] {
        // A task is ~700 bytes: room for it at once spares a grow and a copy.
        var json = JSONWriter(capacity: 1_024)
        write(task, task.moment, into: &json, workflow: engine?.workflowID(of: task))
        return json.bytes
    }

    /// `forLessee`: the lease's token and the secrets in params as they are, for the worker the
    /// lease was granted to (a lease answer: the worker runs the task with them). Everywhere
    /// else a secret's value is `"***"`.
    /// Taking the moment costs nothing measurable here: 18 instructions of GET /tasks/{id}'s
    /// 24.2k (callgrind) against reading the record's fields directly.
    static func write<Task: RepresentedTask>(_ task: Task, into json: inout JSONWriter, forLessee: Bool = false,
                                             resultLimit: Int? = nil, workflow: TaskID? = nil) {
        write(task, task.moment, into: &json, forLessee: forLessee, resultLimit: resultLimit, workflow: workflow)
    }

    /// The most of a task's `result` an event or a webhook carries; `GET /tasks/{id}` has it all.
    static let eventResultBytes = 64 * 1024

    /// The task with what changes over its life as `moment` holds it. `resultLimit`: the most
    /// bytes of `result` to show (events, webhooks), with `result_truncated` saying whether it
    /// was cut. `workflow`: its workflow when the task itself does not know it (a member of a
    /// workflow whose home is another cell).
    static func write<Task: RepresentedTask>(_ task: Task, _ moment: TaskMoment, into json: inout JSONWriter,
                                             forLessee: Bool = false, resultLimit: Int? = nil, workflow: TaskID? = nil) {
        json.beginObject()
        json.key(static: "id")
        write(task.id, into: &json)
        json.field("name", task.name)
        json.field("kind", task.kind)
        json.key(static: "params")
        let params = moment.resolvedParams ?? task.params
        if !forLessee, let secrets = secretParameter(of: task.kind), let object = params.objectValue, object[secrets] != nil {
            writeMasking(secrets, of: object, into: &json)
        } else {
            json.value(params)
        }
        json.field("queue", task.queueName)
        json.field("priority", task.priority)
        json.key(static: "state")
        json.string(static: name(of: moment.state))
        json.field("cancel_requested", moment.cancelRequested)
        json.key(static: "dependencies")
        json.beginArray()
        for dependency in task.dependencies { write(dependency, into: &json) }
        json.endArray()
        json.key(static: "on_dependency_failure")
        json.string(static: task.onDependencyFailure == .cancel ? "cancel" : "run")
        json.key(static: "progress")
        write(moment.progress, into: &json)
        json.field("attempt", moment.attempt)
        json.field("max_attempts", moment.retry.maxAttempts)
        json.key(static: "timeout_ms")
        if let timeout = task.timeoutMilliseconds { json.int(Int64(timeout)) } else { json.null() }
        json.key(static: "retry")
        json.beginObject()
        json.field("max_attempts", moment.retry.maxAttempts)
        json.field("backoff_ms", Int(moment.retry.backoffMilliseconds))
        json.key(static: "backoff_factor")
        json.double(moment.retry.backoffFactor)
        json.endObject()
        timestamp("created_at", task.createdAt, into: &json)
        if task.scheduledFor == nil && task.expiresAt == nil {
            json.members(static: #""scheduled_for":null,"expires_at":null"#)
        } else {
            timestamp("scheduled_for", task.scheduledFor, into: &json)
            timestamp("expires_at", task.expiresAt, into: &json)
        }
        timestamp("started_at", moment.startedAt, into: &json)
        timestamp("finished_at", moment.finishedAt, into: &json)
        if let resultLimit {
            let (shown, cut) = bounded(moment.result ?? .null, to: resultLimit)
            json.field("result", shown)
            json.field("result_truncated", cut)
        } else {
            json.field("result", moment.result ?? .null)
        }
        json.key(static: "error")
        if let error = moment.error { write(error, into: &json) } else { json.null() }
        json.field("metadata", task.metadata ?? .null)
        json.key(static: "workflow")
        if let workflow = workflow ?? task.workflowID { write(workflow, into: &json) } else { json.null() }
        json.key(static: "lease")
        if let lease = moment.lease {
            write(lease, into: &json, showingToken: forLessee)
        } else {
            json.null()
        }
        if task.hasRareFields {
            writeRareFields(of: task, into: &json)
        } else {
            json.members(static: #""unique_key":null,"unique_for_ms":null,"concurrency_key":null,"schedule":null"#)
        }
        json.endObject()
    }

    /// A task as a `task.progress` event of a `?progress_body=brief` stream shows it:
    /// `{id, queue, workflow, state, attempt, progress}`, the fields a progress bar follows.
    static func writeBrief<Task: RepresentedTask>(_ task: Task, _ moment: TaskMoment, into json: inout JSONWriter,
                                                  workflow: TaskID? = nil) {
        json.beginObject()
        json.key(static: "id")
        write(task.id, into: &json)
        json.field("queue", task.queueName)
        json.key(static: "workflow")
        if let workflow = workflow ?? task.workflowID { write(workflow, into: &json) } else { json.null() }
        json.key(static: "state")
        json.string(static: name(of: moment.state))
        json.field("attempt", moment.attempt)
        json.key(static: "progress")
        write(moment.progress, into: &json)
        json.endObject()
    }

    /// The fields of `writeBrief`, in its order.
    static let briefTaskFields = ["id", "queue", "workflow", "state", "attempt", "progress"]

    /// The fields few tasks carry (`TaskRecord.hasRareFields`).
    private static func writeRareFields<Task: RepresentedTask>(of task: Task, into json: inout JSONWriter) {
        json.field("unique_key", task.uniqueKey)
        json.key(static: "unique_for_ms")
        if let window = task.uniqueForMilliseconds { json.int(Int64(clamping: window)) } else { json.null() }
        json.field("concurrency_key", task.concurrencyKey)
        write(schedule: task.schedule, into: &json)
    }

    /// `value`, or, when its JSON passes `limit` bytes, the same shape with long strings and
    /// arrays cut shorter until it fits (an http body keeps its start, the status stays), and
    /// whether it was cut; null if nothing of its shape fits. Rare (results are small), so
    /// rendering to measure is fine.
    static func bounded(_ value: JSONValue, to limit: Int) -> (JSONValue, cut: Bool) {
        func size(_ value: JSONValue) -> Int {
            var json = JSONWriter(capacity: 4_096)
            json.value(value)
            return json.byteCount
        }
        guard size(value) > limit else { return (value, false) }
        var cap = limit / 2
        while cap >= 16 {
            let shortened = cut(value, stringBytes: cap, arrayItems: max(1, cap / 16))
            if size(shortened) <= limit { return (shortened, true) }
            cap /= 4
        }
        return (.null, true)
    }

    private static func cut(_ value: JSONValue, stringBytes: Int, arrayItems: Int) -> JSONValue {
        switch value {
        case .string(let text) where text.utf8.count > stringBytes:
            // On a character's boundary, so the cut text is still UTF-8.
            let utf8 = Array(text.utf8)
            var end = stringBytes
            while end > 0 && utf8[end] & 0xC0 == 0x80 { end -= 1 }
            return .string(String(decoding: utf8[..<end], as: UTF8.self))
        case .array(let items):
            return .array(items.prefix(arrayItems).map { cut($0, stringBytes: stringBytes, arrayItems: arrayItems) })
        case .object(let object):
            return .object(JSONObject(object.members.map {
                JSONObject.Member($0.key, cut($0.value, stringBytes: stringBytes, arrayItems: arrayItems))
            }))
        default:
            return value
        }
    }

    /// The member of a kind's params whose values are secrets (contract v3, Secrets in params).
    private static func secretParameter(of kind: String) -> String? {
        switch kind {
        case "http": HTTPExecutor.secretParameter
        case "exec": ExecExecutor.secretParameter
        default: nil
        }
    }

    /// `params` with each value of its member `secrets` written as `"***"`; the names stay.
    private static func writeMasking(_ secrets: String, of params: JSONObject, into json: inout JSONWriter) {
        json.beginObject()
        for member in params {
            json.key(member.key)
            guard member.key == secrets, !member.value.isNull else {
                json.value(member.value)
                continue
            }
            json.beginObject()
            for secret in member.value.objectValue ?? [:] {
                json.key(secret.key)
                json.string(static: "***")
            }
            json.endObject()
        }
        json.endObject()
    }

    static func write<Held: RepresentedLease>(_ lease: Held, into json: inout JSONWriter, showingToken: Bool) {
        json.beginObject()
        if showingToken { json.field("token", lease.token) }
        json.field("worker", lease.worker)
        timestamp("expires_at", lease.expiresAt, into: &json)
        json.endObject()
    }

    /// The state's name, as a literal: no String is made for it.
    static func name(of state: TaskState) -> StaticString {
        switch state {
        case .scheduled: "scheduled"
        case .pending: "pending"
        case .queued: "queued"
        case .running: "running"
        case .succeeded: "succeeded"
        case .failed: "failed"
        case .cancelled: "cancelled"
        }
    }

    /// `prefix` then the id, e.g. `/tasks/01M8...`, made in one allocation.
    static func path(_ prefix: StaticString, _ id: TaskID) -> String {
        String(unsafeUninitializedCapacity: prefix.utf8CodeUnitCount + 26) { buffer in
            let start = buffer.baseAddress!
            start.update(from: prefix.utf8Start, count: prefix.utf8CodeUnitCount)
            return prefix.utf8CodeUnitCount + id.write(to: start + prefix.utf8CodeUnitCount)
        }
    }

    static func write(_ id: TaskID, into json: inout JSONWriter) {
        json.asciiString(maxLength: 26) { id.write(to: $0) }
    }

    static func write(_ progress: TaskProgress, into json: inout JSONWriter) {
        json.beginObject()
        json.key(static: "fraction")
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
            json.key(member.key)
            json.value(member.value)
        }
        json.endObject()
    }

    static func workflow(_ workflow: WorkflowRecord) -> [UInt8] {
        write(workflow: workflow.id, name: workflow.name, state: workflow.state, fraction: workflow.fraction,
              createdAt: workflow.createdAt, schedule: workflow.schedule, tasks: workflow.tasks, keys: workflow.keys)
    }

    /// A workflow just submitted to `engine`, its home cell, with `submitted` (the request's
    /// members): those of other cells are not made there yet (their cells apply the home's
    /// message after its commit), so they are shown as submitted, `pending`, in their place.
    static func workflow(_ workflow: WorkflowRecord, submitted: [(key: String, spec: TaskSpec)], in engine: Engine) -> [UInt8] {
        let ids = Dictionary(workflow.keys.map { ($0.key, $0.id) }, uniquingKeysWith: { first, _ in first })
        let here = Dictionary(workflow.tasks.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        let tasks = submitted.compactMap { member -> TaskSnapshot? in
            guard let id = ids[member.key] else { return nil }
            if let record = here[id] { return engine.snapshot(of: record) }
            let spec = member.spec
            let scheduledFor = spec.runAt?.instant(submittedAt: workflow.createdAt)
            let dependencies = spec.dependencies.compactMap { reference -> TaskID? in
                switch reference {
                case .task(let id): id
                case .sibling(let key): ids[key]
                }
            }
            return TaskSnapshot(
                id: id, sequence: 0, kind: spec.kind, params: spec.params, name: spec.name, queue: spec.queue,
                priority: spec.priority, dependencies: dependencies, onDependencyFailure: spec.onDependencyFailure,
                timeoutMilliseconds: spec.timeoutMilliseconds, retry: spec.retry, metadata: spec.metadata, workflow: workflow.id,
                createdAt: workflow.createdAt, state: scheduledFor.map { $0 > workflow.createdAt } == true ? .scheduled : .pending,
                cancelRequested: false, attempt: 1, startedAt: nil, finishedAt: nil, result: nil, error: nil,
                progress: TaskProgress(), notBefore: nil, scheduledFor: scheduledFor,
                expiresAt: spec.expiry?.instant(submittedAt: workflow.createdAt), uniqueKey: spec.uniqueKey,
                uniqueForMilliseconds: spec.uniqueForMilliseconds, concurrencyKey: spec.concurrencyKey, schedule: spec.schedule)
        }
        return write(workflow: workflow.id, name: workflow.name, state: workflow.state, fraction: workflow.fraction,
                     createdAt: workflow.createdAt, schedule: workflow.schedule, tasks: tasks, keys: workflow.keys)
    }

    /// A workflow as the cells' records keep it, with `tasks`, those of its tasks still kept, in
    /// order. Its state and progress are its home cell's, as a live workflow's are: members in
    /// other cells count as they last reported to the home (a member's row may be ahead of its
    /// report, or not written yet), so a workflow read as ended is one its home knows ended,
    /// and a retry or cancel sent to it then acts on what the read showed.
    static func workflow(_ workflow: WorkflowSnapshot, tasks: [TaskSnapshot]) -> [UInt8] {
        let remote = Set(workflow.remoteMembers.lazy.map(\.id))
        let home = tasks.filter { !remote.contains($0.id) }
        var counts = StateCounts()
        for task in home { counts[task.state] += 1 }
        for member in workflow.remoteMembers { counts[member.state] += 1 }
        let parts = home.map { ($0.state, $0.progress.fraction) } + workflow.remoteMembers.map { ($0.state, $0.fraction) }
        return write(workflow: workflow.id, name: workflow.name, state: WorkflowRecord.state(of: counts),
                     fraction: WorkflowRecord.fraction(of: parts),
                     createdAt: workflow.createdAt, schedule: workflow.schedule, tasks: tasks,
                     keys: workflow.keys.lazy.map { (key: $0.key, id: $0.id) })
    }

    private static func write<Task: RepresentedTask>(
        workflow id: TaskID, name: String?, state: TaskState, fraction: Double, createdAt: Int64, schedule: ScheduleSlot?,
        tasks: [Task], keys: some Sequence<(key: String, id: TaskID)>
    ) -> [UInt8] {
        var json = JSONWriter(capacity: 512 * (tasks.count + 1))
        json.beginObject()
        json.key(static: "id")
        write(id, into: &json)
        json.field("name", name)
        json.field("state", state.rawValue)
        json.key(static: "progress")
        json.beginObject()
        json.key(static: "fraction")
        json.double(fraction)
        json.endObject()
        timestamp("created_at", createdAt, into: &json)
        write(schedule: schedule, into: &json)
        json.key(static: "tasks")
        json.beginArray()
        for task in tasks { write(task, task.moment, into: &json) }
        json.endArray()
        json.key(static: "keys")
        json.beginObject()
        for entry in keys {
            json.key(entry.key)
            write(entry.id, into: &json)
        }
        json.endObject()
        json.endObject()
        return json.bytes
    }

    /// `at`: the wall-clock time the queue's finish history is read at.
    static func write(_ queue: TaskQueue, at wallClock: Int64, into json: inout JSONWriter) {
        writeQueue(queue.name, maxConcurrency: queue.maxConcurrency, paused: queue.paused, dispatch: queue.dispatch,
                   keyConcurrency: queue.keyConcurrency, rateLimit: queue.rateLimit, waitingWorkers: queue.waitingLessees,
                   count: { queue.counts[$0] },
                   finished: queue.finishHistory.counts(at: wallClock), into: &json)
    }

    /// A queue from its parts: a live one's, or what the cells' records say of one.
    /// `finished`: tasks finished per interval of `FinishHistory`, oldest first.
    static func writeQueue(_ name: String, maxConcurrency: Int, paused: Bool, dispatch: QueueDispatch, keyConcurrency: Int?,
                           rateLimit: RateLimit?,
                           waitingWorkers: Int, count: (TaskState) -> Int, finished: [Int], into json: inout JSONWriter) {
        json.beginObject()
        json.field("name", name)
        json.field("max_concurrency", maxConcurrency)
        json.field("paused", paused)
        json.field("dispatch", dispatch.rawValue)
        json.key(static: "key_concurrency")
        if let keyConcurrency { json.int(keyConcurrency) } else { json.null() }
        json.key(static: "rate_limit")
        if let rateLimit {
            json.beginObject()
            json.key(static: "per_second")
            json.double(rateLimit.perSecond)
            json.field("burst", rateLimit.burst)
            json.endObject()
        } else {
            json.null()
        }
        json.field("waiting_workers", waitingWorkers)
        json.key(static: "counts")
        json.beginObject()
        for state in TaskState.allCases {
            json.key(state.rawValue)
            json.int(count(state))
        }
        json.endObject()
        json.key(static: "throughput")
        json.beginObject()
        json.field("interval_seconds", Int(FinishHistory.intervalMilliseconds / 1_000))
        json.key(static: "finished")
        json.beginArray()
        for count in finished { json.int(count) }
        json.endArray()
        json.endObject()
        json.endObject()
    }

    static func queue(_ queue: TaskQueue, at wallClock: Int64) -> [UInt8] {
        var json = JSONWriter()
        write(queue, at: wallClock, into: &json)
        return json.bytes
    }

    /// `"schedule": {id, slot}`, the schedule run that made a workflow, or null (a task writes
    /// its own among its rare fields).
    static func write(schedule: ScheduleSlot?, into json: inout JSONWriter) {
        json.key(static: "schedule")
        if let schedule {
            json.beginObject()
            json.key(static: "id")
            write(schedule.id, into: &json)
            timestamp("slot", schedule.slot, into: &json)
            json.endObject()
        } else {
            json.null()
        }
    }

    /// A workflow without its tasks, as events show it: `{id, name, state, progress, schedule}`.
    static func writeSummary(_ workflow: WorkflowRecord, state: TaskState, fraction: Double, into json: inout JSONWriter) {
        json.beginObject()
        json.key(static: "id")
        write(workflow.id, into: &json)
        json.field("name", workflow.name)
        json.field("state", state.rawValue)
        json.key(static: "progress")
        json.beginObject()
        json.key(static: "fraction")
        json.double(fraction)
        json.endObject()
        write(schedule: workflow.schedule, into: &json)
        json.endObject()
    }

    static func timestamp(_ name: StaticString, _ milliseconds: Int64?, into json: inout JSONWriter) {
        json.key(static: name)
        if let milliseconds {
            json.asciiString(maxLength: 24) { writeRFC3339(milliseconds, to: $0, reusingDay: true) }
        } else {
            json.null()
        }
    }

    /// `2026-11-22T14:50:00.123Z` from milliseconds since the Unix epoch.
    static func rfc3339(_ milliseconds: Int64) -> String {
        String(unsafeUninitializedCapacity: 24) { writeRFC3339(milliseconds, to: $0.baseAddress!) }
    }

    /// Writes the 24 bytes of `2026-11-22T14:50:00.123Z` (UTC, proleptic Gregorian; Howard
    /// Hinnant's days-to-civil, in `CivilTime`) and returns 24.
    ///
    /// With `reusingDay` (it keeps the last day per thread), a time on the same day as the last
    /// one copies the date instead of working it out again.
    static func writeRFC3339(_ milliseconds: Int64, to output: UnsafeMutablePointer<UInt8>, reusingDay: Bool = false) -> Int {
        let millisecondsPerDay: Int64 = 86_400_000
        var days = milliseconds / millisecondsPerDay
        var rest = milliseconds % millisecondsPerDay
        if rest < 0 {
            rest += millisecondsPerDay
            days -= 1
        }
        let lastDate = reusingDay ? DayCache.ofThisThread : nil
        if let lastDate, lastDate.days == days {
            withUnsafeBytes(of: lastDate.text) { output.update(from: $0.baseAddress!.assumingMemoryBound(to: UInt8.self), count: 11) }
        } else {
            writeDate(days, to: output)
            if let lastDate {
                withUnsafeMutableBytes(of: &lastDate.text) { $0.baseAddress!.copyMemory(from: output, byteCount: 11) }
                lastDate.days = days
            }
        }
        var position = 11
        func digits(_ value: Int64, _ width: Int) {
            var value = value
            for offset in stride(from: width - 1, through: 0, by: -1) {
                output[position + offset] = UInt8(ascii: "0") + UInt8(value % 10)
                value /= 10
            }
            position += width
        }
        func separator(_ character: Unicode.Scalar) {
            output[position] = UInt8(ascii: character)
            position += 1
        }
        digits(rest / 3_600_000, 2)
        separator(":")
        digits(rest / 60_000 % 60, 2)
        separator(":")
        digits(rest / 1_000 % 60, 2)
        separator(".")
        digits(rest % 1_000, 3)
        separator("Z")
        return position
    }

    /// Writes `YYYY-MM-DDT` for a count of days since the epoch (11 bytes).
    private static func writeDate(_ days: Int64, to output: UnsafeMutablePointer<UInt8>) {
        let (civilYear, month, day) = CivilTime.date(days: days)
        let year = min(9_999, max(0, civilYear))
        var position = 0
        func digits(_ value: Int64, _ width: Int) {
            var value = value
            for offset in stride(from: width - 1, through: 0, by: -1) {
                output[position + offset] = UInt8(ascii: "0") + UInt8(value % 10)
                value /= 10
            }
            position += width
        }
        func separator(_ character: Unicode.Scalar) {
            output[position] = UInt8(ascii: character)
            position += 1
        }
        digits(year, 4)
        separator("-")
        digits(month, 2)
        separator("-")
        digits(day, 2)
        separator("T")
    }
}

/// The day a thread last wrote, as `YYYY-MM-DDT`: times of one day share it. One per thread,
/// since a process may run several loops (the tests do).
private final class DayCache {
    var days: Int64 = .min
    var text: (UInt64, UInt64) = (0, 0)

    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let created = pthread_key_create(&key) { cache in
            if let cache { Unmanaged<DayCache>.fromOpaque(cache).release() }
        }
        precondition(created == 0, "cannot create the date cache's thread key")
        return key
    }()

    static var ofThisThread: DayCache {
        if let cache = pthread_getspecific(key) { return Unmanaged<DayCache>.fromOpaque(cache).takeUnretainedValue() }
        let cache = DayCache()
        pthread_setspecific(key, Unmanaged.passRetained(cache).toOpaque())
        return cache
    }
}

/// What of a task changes over its life, as it was at one moment. An event keeps one from when
/// it was numbered and renders from it whenever a subscriber first needs its JSON, so a replay
/// shows each change as it was, never a later state (which might not be committed yet).
/// A few words and references: taking one costs far less than rendering.
///
/// Threading: made on the loop thread; immutable.
struct TaskMoment {
    let state: TaskState
    let cancelRequested: Bool
    let attempt: Int
    let retry: RetryPolicy
    let startedAt: Int64?
    let finishedAt: Int64?
    let result: JSONValue?
    let error: TaskError?
    let progress: TaskProgress
    /// As it was: a live lease's expiry moves on with each heartbeat.
    let lease: LeaseSnapshot?
    /// The params it shows once started (Engine+Outputs).
    let resolvedParams: JSONValue?

    /// `state`: the state to show instead of the task's own (an event announcing a state the
    /// task has already left within the same engine call).
    /// A state the task has left shows none of what came after it in that call: not the end
    /// (`finished_at`, `result`), and before it runs, not its start (`started_at`, progress, a
    /// lease) either. A noop is queued, started and finished in one call; its `queued` event
    /// must not show it finished. After a first attempt the times and error are the task's own
    /// (they outlive a retry).
    init(_ task: TaskRecord, state: TaskState? = nil) {
        let shown = state ?? task.state
        self.state = shown
        cancelRequested = task.cancelRequested
        attempt = task.attempt
        retry = task.retry
        guard shown != task.state && !shown.isTerminal else {
            startedAt = task.startedAt
            finishedAt = task.finishedAt
            result = task.result
            error = task.error
            progress = task.progress
            lease = Self.lease(of: task)
            resolvedParams = task.resolvedParams
            return
        }
        let firstAttempt = task.attempt <= 1
        let beforeRunning = shown != .running
        startedAt = beforeRunning && firstAttempt ? nil : task.startedAt
        finishedAt = nil
        result = nil
        error = firstAttempt ? nil : task.error
        progress = TaskProgress()
        lease = beforeRunning ? nil : Self.lease(of: task)
        resolvedParams = beforeRunning ? nil : task.resolvedParams
    }

    /// The task's lease as it is now: a live lease's expiry moves on with each heartbeat.
    @inline(__always)
    private static func lease(of task: TaskRecord) -> LeaseSnapshot? {
        task.lease.map {
            LeaseSnapshot(token: $0.token, worker: $0.worker, grantedAt: $0.grantedAt, milliseconds: $0.milliseconds, expiresAt: $0.expiresAt)
        }
    }

    init(_ task: TaskSnapshot) {
        state = task.state
        cancelRequested = task.cancelRequested
        attempt = task.attempt
        retry = task.retry
        startedAt = task.startedAt
        finishedAt = task.finishedAt
        result = task.result
        error = task.error
        progress = task.progress
        lease = task.lease
        resolvedParams = task.resolvedParams
    }
}

/// What of a task stays as it was submitted: a live record and a cell's record of it (a
/// snapshot) are shown alike.
protocol RepresentedTask {
    var id: TaskID { get }
    var name: String? { get }
    var kind: String { get }
    var params: JSONValue { get }
    var queueName: String { get }
    var priority: Int { get }
    var dependencies: [TaskID] { get }
    var onDependencyFailure: DependencyFailurePolicy { get }
    var timeoutMilliseconds: UInt64? { get }
    var createdAt: Int64 { get }
    var scheduledFor: Int64? { get }
    var expiresAt: Int64? { get }
    var metadata: JSONValue? { get }
    var workflowID: TaskID? { get }
    var uniqueKey: String? { get }
    var uniqueForMilliseconds: UInt64? { get }
    var concurrencyKey: String? { get }
    /// The schedule run that made it.
    var schedule: ScheduleSlot? { get }
    /// Whether any of the four fields above is set: most tasks have none.
    var hasRareFields: Bool { get }
    /// What changes over its life, as it is now.
    var moment: TaskMoment { get }
}

extension TaskRecord: RepresentedTask {
    var queueName: String { queue.name }
    var workflowID: TaskID? { workflow?.id }
    var moment: TaskMoment { TaskMoment(self) }
}

extension TaskSnapshot: RepresentedTask {
    var queueName: String { queue }
    var workflowID: TaskID? { workflow }
    var hasRareFields: Bool { uniqueKey != nil || uniqueForMilliseconds != nil || concurrencyKey != nil || schedule != nil }
    var moment: TaskMoment { TaskMoment(self) }
}

/// A worker's lease as shown: a live one, or as a moment or a cell's record kept it.
protocol RepresentedLease {
    var token: String { get }
    var worker: String { get }
    var expiresAt: Int64 { get }
}

extension Lease: RepresentedLease {}
extension LeaseSnapshot: RepresentedLease {}
