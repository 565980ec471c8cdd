import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON
import TaskloopTime

/// Reads request bodies into engine values, field by field. Every problem found is reported at
/// once as `errors[{field, message}]` (422); bodies that are not JSON are 400, bodies that are
/// not declared JSON are 415. Nothing here changes state.
struct BodyReader {
    /// The ranges and lengths come from the engine's rules, written once there.
    typealias Rules = SubmissionValidator
    private(set) var errors: [APIProblem.FieldError] = []

    /// The JSON document of a request, or nil for an empty body when `optional`.
    static func document(_ request: HTTPRequest, optional: Bool = false) throws(APIProblem) -> JSONValue? {
        if request.body.isEmpty && optional { return nil }
        guard request.headers.firstValue(of: "Content-Type", satisfies: isJSON) == true else {
            let contentType = request.headers["Content-Type"] ?? ""
            throw APIProblem(.unsupportedMediaType,
                              detail: contentType.isEmpty ? "Send the body as application/json (Content-Type is missing)."
                                  : "Send the body as application/json, not \(contentType).")
        }
        do {
            return try JSONParser.parse(request.body)
        } catch {
            throw APIProblem(.badRequest, detail: "The body is not valid JSON: \(error).", code: "malformed_json")
        }
    }

    /// `application/json` or `application/*+json`, any case, parameters ignored. On bytes:
    /// Character-level String work here cost ~20,000 instructions per request.
    static func isJSON(_ contentType: String) -> Bool {
        var contentType = contentType
        return contentType.withUTF8 { isJSON($0) }
    }

    static func isJSON(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        var end = bytes.firstIndex(of: UInt8(ascii: ";")) ?? bytes.count
        var start = 0
        while start < end && (bytes[start] == 0x20 || bytes[start] == 0x09) { start += 1 }
        while end > start && (bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09) { end -= 1 }
        let mediaType = UnsafeBufferPointer(rebasing: bytes[start..<end])
        func hasPrefix(_ prefix: StaticString, at offset: Int) -> Bool {
            guard offset >= 0, offset + prefix.utf8CodeUnitCount <= mediaType.count else { return false }
            for index in 0..<prefix.utf8CodeUnitCount where mediaType[offset + index] | 0x20 != prefix.utf8Start[index] {
                return false
            }
            return true
        }
        guard hasPrefix("application/", at: 0) else { return false }
        let subtype = mediaType.count - 12
        return (subtype == 4 && hasPrefix("json", at: 12)) || (subtype > 5 && hasPrefix("+json", at: mediaType.count - 5))
    }

    /// Reads one part of a body (a batch's item, a workflow's task) with `read`, its problems
    /// named under `field`. Read first naming nothing: the names (`tasks[3].kind`) are strings
    /// made for every field read, and nearly every part has no problem to name. A part that has
    /// one is read again, into this reader, with them. `read` keeps what it makes itself: a
    /// generic result was copied and destroyed through its type's witnesses, ~450 instructions
    /// a report item (callgrind).
    mutating func readNamingProblems(under field: @autoclosure () -> String, _ read: (inout BodyReader, _ field: String) -> Void) {
        var quiet = BodyReader()
        read(&quiet, "")
        guard !quiet.errors.isEmpty else { return }
        read(&self, field())
    }

    mutating func fail(_ field: String, _ message: String) {
        errors.append(APIProblem.FieldError(field: field, message: message))
    }

    /// Throws the collected errors, if any, as one 422.
    func check() throws(APIProblem) {
        guard !errors.isEmpty else { return }
        let detail = errors.count == 1 ? "\(errors[0].field): \(errors[0].message)"
            : "The request has \(errors.count) invalid fields."
        throw APIProblem(.unprocessableContent, detail: detail, type: ProblemType.validation, fieldErrors: errors)
    }

    /// The body's object, or a 422 naming `field` (empty for the whole body).
    mutating func object(_ value: JSONValue?, _ field: String) -> JSONObject? {
        guard let value else { return nil }
        guard let object = value.objectValue else {
            fail(field.isEmpty ? "body" : field, "must be an object, not \(value.kindDescription).")
            return nil
        }
        return object
    }

    /// Refuses the members not in `allowed` (nor `extra`) and answers which of `allowed` are
    /// present, bit `i` for `allowed[i]`, so a reader can skip the lookups of the many optional
    /// fields a body leaves out. A body names a handful of fields: scanning the list beats hashing.
    @discardableResult
    mutating func rejectUnknown(_ object: JSONObject, allowed: [String], alsoAllowed extra: String? = nil,
                                prefix: String) -> UInt64 {
        var present: UInt64 = 0
        for member in object {
            if let index = allowed.firstIndex(of: member.key) {
                present |= 1 << UInt64(index)
            } else if member.key != extra {
                fail(prefix + member.key, "is not a known field.")
            }
        }
        return present
    }

    /// Why a field's value was refused, for `errors[].message`.
    private struct Refusal: Error {
        let message: String
        init(_ message: String) { self.message = message }
    }

    /// A field's value: `.none` when it is absent or refused (the refusal recorded), `.some(nil)`
    /// for null where the field is `nullable` (null elsewhere is refused: the spec says where it
    /// may appear), else what `read` made of it.
    private mutating func field<Value>(
        _ object: JSONObject, _ key: String, prefix: String, nullable: Bool,
        _ read: (JSONValue) -> Result<Value, Refusal>
    ) -> Value?? {
        guard let value = object[key] else { return .none }
        if value.isNull {
            guard nullable else {
                fail(prefix + key, "must not be null.")
                return .none
            }
            return .some(nil)
        }
        switch read(value) {
        case .success(let converted): return .some(converted)
        case .failure(let refusal):
            fail(prefix + key, refusal.message)
            return .none
        }
    }

    /// A string of at most `maxLength` characters (Unicode scalars, as JSON Schema counts).
    mutating func string(_ object: JSONObject, _ key: String, prefix: String, maxLength: Int = 256,
                         nullable: Bool = false) -> String?? {
        field(object, key, prefix: prefix, nullable: nullable) { value in
            guard let text = value.stringValue else { return .failure(Refusal("must be a string, not \(value.kindDescription).")) }
            guard text.utf8.count <= maxLength || text.unicodeScalars.count <= maxLength else {
                return .failure(Refusal("must be at most \(maxLength) characters."))
            }
            return .success(text)
        }
    }

    mutating func integer(_ object: JSONObject, _ key: String, prefix: String, in range: ClosedRange<Int64>,
                          nullable: Bool = false) -> Int64?? {
        field(object, key, prefix: prefix, nullable: nullable) { value in
            guard let number = value.intValue else {
                return .failure(Refusal("must be an integer, not \(value.kindDescription)."))
            }
            guard range.contains(number) else {
                return .failure(Refusal(Rules.rangeRule(range)))
            }
            return .success(number)
        }
    }

    /// An RFC 3339 time, as wall-clock milliseconds.
    mutating func time(_ object: JSONObject, _ key: String, prefix: String, nullable: Bool = false) -> Int64?? {
        field(object, key, prefix: prefix, nullable: nullable) { value in
            guard let text = value.stringValue else { return .failure(Refusal("must be an RFC 3339 time, not \(value.kindDescription).")) }
            guard let milliseconds = RFC3339.milliseconds(text) else {
                return .failure(Refusal("must be an RFC 3339 time such as 2026-11-27T02:00:00Z."))
            }
            return .success(milliseconds)
        }
    }

    mutating func number(_ object: JSONObject, _ key: String, prefix: String, in range: ClosedRange<Double>,
                         nullable: Bool = false) -> Double?? {
        field(object, key, prefix: prefix, nullable: nullable) { value in
            guard let number = value.doubleValue, range.contains(number) else {
                return .failure(Refusal("must be a number from \(range.lowerBound) to \(range.upperBound)."))
            }
            return .success(number)
        }
    }

    mutating func boolean(_ object: JSONObject, _ key: String, prefix: String) -> Bool?? {
        field(object, key, prefix: prefix, nullable: false) { value in
            value.boolValue.map { .success($0) } ?? .failure(Refusal("must be true or false, not \(value.kindDescription)."))
        }
    }

    /// A queue's `rate_limit`: `{per_second, burst}`, or null to remove it (`.some(nil)`);
    /// nil when refused.
    mutating func rateLimit(_ value: JSONValue) -> RateLimit?? {
        if value.isNull { return .some(nil) }
        guard let object = object(value, "rate_limit") else { return nil }
        rejectUnknown(object, allowed: ["per_second", "burst"], prefix: "rate_limit.")
        var perSecond: Double?, burst: Int?
        if case .some(let value?) = number(object, "per_second", prefix: "rate_limit.", in: Rules.rateLimitPerSecond) {
            perSecond = value
        } else if object["per_second"] == nil {
            fail("rate_limit.per_second", "is required: the tasks the queue may start per second.")
        }
        if case .some(let value?) = integer(object, "burst", prefix: "rate_limit.", in: Rules.rateLimitBurst) {
            burst = Int(value)
        } else if object["burst"] == nil {
            fail("rate_limit.burst", "is required: the tasks the queue may start at once.")
        }
        guard let perSecond, let burst else { return nil }
        return .some(RateLimit(perSecond: perSecond, burst: burst))
    }

    /// `{fraction?, message?, details?}` of a progress report or a heartbeat.
    mutating func progressReport(_ object: JSONObject, prefix: String) -> ExternalReport {
        var fraction: Double?, message: String?, details: JSONValue?
        if case .some(let value) = number(object, "fraction", prefix: prefix, in: 0...1, nullable: true) { fraction = value }
        if case .some(let value) = string(object, "message", prefix: prefix, maxLength: 4_096, nullable: true) { message = value }
        if let value = object.nonNull("details") {
            if value.objectValue != nil { details = value } else {
                fail(prefix + "details", "must be an object, not \(value.kindDescription).")
            }
        }
        return .progress(fraction: fraction, message: message, details: details)
    }

    /// `lease_token`: a report on a leased task quotes its lease.
    mutating func leaseToken(_ object: JSONObject, prefix: String = "") -> String? {
        if case .some(let value?) = string(object, "lease_token", prefix: prefix, maxLength: 256) { return value }
        return nil
    }

    /// The `error` of a failure report, `{code = "failed", message, ...details}`: required.
    mutating func failure(_ object: JSONObject, prefix: String) -> TaskError? {
        guard let error = self.object(object["error"], prefix + "error") else {
            if object["error"] == nil { fail(prefix + "error", "is required.") }
            return nil
        }
        var code = "failed"
        if case .some(let value?) = string(error, "code", prefix: prefix + "error.", maxLength: 64) { code = value }
        var details = JSONObject()
        for member in error where member.key != "code" && member.key != "message" { details[member.key] = member.value }
        switch string(error, "message", prefix: prefix + "error.", maxLength: 4_096) {
        case .some(let message?): return TaskError(code: code, message: message, details: details)
        case .some(nil), .none:
            if error["message"] == nil { fail(prefix + "error.message", "is required.") }
            return nil
        }
    }

    static let taskFields: [String] = [
        "kind", "params", "name", "queue", "priority", "dependencies", "on_dependency_failure", "timeout_ms", "retry",
        "metadata", "run_at", "delay_ms", "expires_at", "ttl_ms", "unique_key", "unique_for_ms", "concurrency_key",
    ]

    /// The fields of a submission that most leave out, as bits of `rejectUnknown`'s answer:
    /// a plain task pays one test for them all.
    private static let optionalTaskFields: (plain: UInt64, later: UInt64) = {
        func bits(_ names: [String]) -> UInt64 {
            names.reduce(0) { $0 | 1 << UInt64(taskFields.firstIndex(of: $1)!) }
        }
        return (plain: bits(["name", "priority", "dependencies", "on_dependency_failure", "timeout_ms", "retry", "metadata"]),
                later: bits(["run_at", "delay_ms", "expires_at", "ttl_ms", "unique_key", "unique_for_ms", "concurrency_key"]))
    }()

    /// A task submission. Inside a workflow (`siblingKeys` non-nil), dependencies may name
    /// sibling keys and `key` is allowed.
    mutating func taskSpec(_ object: JSONObject, prefix: String, siblingKeys: Set<String>? = nil) -> TaskSpec? {
        let errorsBefore = errors.count
        let present = rejectUnknown(object, allowed: Self.taskFields, alsoAllowed: siblingKeys == nil ? nil : "key",
                                    prefix: prefix)
        var spec = TaskSpec(kind: "")
        if object.nonNull("kind") != nil {
            if case .some(let kind?) = string(object, "kind", prefix: prefix, maxLength: Rules.maxKindLength) { spec.kind = kind }
        } else {
            fail(prefix + "kind", "is required.")
        }
        if let params = object["params"] {
            if params.objectValue != nil { spec.params = params } else {
                fail(prefix + "params", "must be an object, not \(params.kindDescription).")
            }
        }
        if case .some(let queue?) = string(object, "queue", prefix: prefix, maxLength: Rules.maxQueueNameLength) { spec.queue = queue }
        if present & Self.optionalTaskFields.plain != 0 { plainOptions(object, prefix: prefix, siblingKeys: siblingKeys, into: &spec) }
        if present & Self.optionalTaskFields.later != 0 { laterOptions(object, prefix: prefix, into: &spec) }
        return errors.count == errorsBefore ? spec : nil
    }

    /// A submission's v1 options beyond kind, params and queue.
    private mutating func plainOptions(_ object: JSONObject, prefix: String, siblingKeys: Set<String>?, into spec: inout TaskSpec) {
        if case .some(let name) = string(object, "name", prefix: prefix, maxLength: Rules.maxNameLength, nullable: true) { spec.name = name }
        if case .some(let priority?) = integer(object, "priority", prefix: prefix, in: Rules.priorities) { spec.priority = Int(priority) }
        if let dependencies = object["dependencies"] {
            if let list = dependencies.arrayValue {
                spec.dependencies.reserveCapacity(list.count)
                for (index, element) in list.enumerated() {
                    guard let text = element.stringValue else {
                        let expected = siblingKeys == nil ? "a task id" : "a task id or a key"
                        fail("\(prefix)dependencies[\(index)]", "must be \(expected), not \(element.kindDescription).")
                        continue
                    }
                    if let siblingKeys, siblingKeys.contains(text) {
                        spec.dependencies.append(.sibling(key: text))
                    } else if let id = TaskID(text) {
                        spec.dependencies.append(.task(id))
                    } else if siblingKeys != nil {
                        // The engine names it: no task with this key in the workflow.
                        spec.dependencies.append(.sibling(key: text))
                    } else {
                        fail("\(prefix)dependencies[\(index)]", "is not a task id.")
                    }
                }
            } else {
                fail(prefix + "dependencies", "must be an array, not \(dependencies.kindDescription).")
            }
        }
        if case .some(let policy?) = string(object, "on_dependency_failure", prefix: prefix) {
            if let value = DependencyFailurePolicy(rawValue: policy) { spec.onDependencyFailure = value } else {
                fail(prefix + "on_dependency_failure", "must be \"cancel\" or \"run\".")
            }
        }
        if case .some(let timeout?) = integer(object, "timeout_ms", prefix: prefix, in: Rules.timeoutMilliseconds, nullable: true) {
            spec.timeoutMilliseconds = UInt64(timeout)
        }
        if let retry = object["retry"] {
            if let retryObject = self.object(retry, prefix + "retry") {
                let at = prefix + "retry."
                rejectUnknown(retryObject, allowed: ["max_attempts", "backoff_ms", "backoff_factor"], prefix: at)
                if case .some(let attempts?) = integer(retryObject, "max_attempts", prefix: at, in: Rules.maxAttempts) {
                    spec.retry.maxAttempts = Int(attempts)
                }
                if case .some(let backoff?) = integer(retryObject, "backoff_ms", prefix: at, in: Rules.backoffMilliseconds) {
                    spec.retry.backoffMilliseconds = UInt64(backoff)
                }
                if case .some(let factor?) = number(retryObject, "backoff_factor", prefix: at, in: Rules.backoffFactors) {
                    spec.retry.backoffFactor = factor
                }
            }
        }
        if let metadata = object.nonNull("metadata") {
            if metadata.objectValue != nil { spec.metadata = metadata } else {
                fail(prefix + "metadata", "must be an object, not \(metadata.kindDescription).")
            }
        }
    }

    /// A submission's time-and-flow options: times, a unique key, a concurrency key.
    private mutating func laterOptions(_ object: JSONObject, prefix: String, into spec: inout TaskSpec) {
        spec.runAt = taskTime(object, at: "run_at", after: "delay_ms", in: Rules.delayMilliseconds, prefix: prefix)
        spec.expiry = taskTime(object, at: "expires_at", after: "ttl_ms", in: Rules.ttlMilliseconds, prefix: prefix)
        if case .some(let key) = string(object, "unique_key", prefix: prefix, maxLength: Rules.uniqueKeyLengths.upperBound,
                                        nullable: true) {
            if let key, !Rules.isValidUniqueKey(key) { fail(prefix + "unique_key", Rules.uniqueKeyRule) } else { spec.uniqueKey = key }
        }
        if case .some(let window?) = integer(object, "unique_for_ms", prefix: prefix, in: Rules.minUniqueForMilliseconds...Int64.max,
                                             nullable: true) {
            spec.uniqueForMilliseconds = UInt64(window)
        }
        if case .some(let key) = string(object, "concurrency_key", prefix: prefix, maxLength: Rules.concurrencyKeyLengths.upperBound,
                                        nullable: true) {
            if let key, !Rules.isValidConcurrencyKey(key) {
                fail(prefix + "concurrency_key", Rules.concurrencyKeyRule)
            } else {
                spec.concurrencyKey = key
            }
        }
    }

    /// A time given as an RFC 3339 `atKey` or as milliseconds after submission `afterKey`, not both.
    private mutating func taskTime(_ object: JSONObject, at atKey: String, after afterKey: String,
                                   in range: ClosedRange<Int64>, prefix: String) -> TaskTime? {
        let instant = time(object, atKey, prefix: prefix, nullable: true)
        let span = integer(object, afterKey, prefix: prefix, in: range, nullable: true)
        switch (instant, span) {
        case (.some(.some), .some(.some)):
            fail(prefix + afterKey, "cannot be given with \(atKey): give one of them.")
            return nil
        case (.some(.some(let instant)), _): return .at(instant)
        case (_, .some(.some(let span))): return .after(UInt64(span))
        default: return nil
        }
    }
}

/// `type` URIs of the problems this service defines; others are `about:blank`.
enum ProblemType {
    static let validation = "https://taskloop.dev/problems/validation"
}
