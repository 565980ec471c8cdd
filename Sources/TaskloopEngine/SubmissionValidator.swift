/// The rules a submission's own fields obey (ranges, lengths, shapes), written once. The engine
/// checks every spec and queue setting with them; the HTTP body readers take their ranges and
/// lengths from here, so that they can report every bad field at once without restating a
/// rule. Pure: no state, no executors (a kind's `params` are its executor's to check).
public enum SubmissionValidator {
    public static let priorities: ClosedRange<Int64> = -8...8
    public static let timeoutMilliseconds: ClosedRange<Int64> = 1...604_800_000
    public static let maxAttempts: ClosedRange<Int64> = 1...100
    public static let backoffMilliseconds: ClosedRange<Int64> = 0...86_400_000
    public static let backoffFactors: ClosedRange<Double> = 1...10
    public static let maxConcurrency: ClosedRange<Int64> = 1...10_000
    /// A queue's `rate_limit`: tasks per second (fractions allowed) and the burst.
    public static let rateLimitPerSecond: ClosedRange<Double> = 0.001...1_000_000
    public static let rateLimitBurst: ClosedRange<Int64> = 1...1_000_000
    /// `delay_ms` and `ttl_ms` (the engine's `maxScheduleAheadMilliseconds` bounds them further).
    public static let delayMilliseconds: ClosedRange<Int64> = 0...315_360_000_000
    public static let ttlMilliseconds: ClosedRange<Int64> = 1...315_360_000_000
    /// Lengths in Unicode scalars, as JSON Schema counts them.
    public static let maxKindLength = 64
    public static let maxQueueNameLength = 64
    public static let maxNameLength = 256
    public static let maxKeyLength = 128
    public static let uniqueKeyLengths = 1...255
    public static let concurrencyKeyLengths = 1...255
    public static let keyConcurrency: ClosedRange<Int64> = 1...10_000
    /// The upper bound is the server's (`EngineConfiguration.maxUniqueForMilliseconds`).
    public static let minUniqueForMilliseconds: Int64 = 1
    public static let queueNameRule = "queue must be 1 to 64 letters, digits, '-', '_' or '.'."

    /// Checks `spec`'s own fields (not its kind, params or dependencies), naming the first
    /// that breaks a rule. `at` prefixes field paths (`tasks[3].`).
    public static func check(_ spec: TaskSpec, at prefix: () -> String) throws(EngineError) {
        if let name = spec.name, name.utf8.count > maxNameLength, name.unicodeScalars.count > maxNameLength {
            throw EngineError(.invalid, "name must be at most \(maxNameLength) characters.", field: "\(prefix())name")
        }
        guard priorities.contains(Int64(spec.priority)) else {
            throw EngineError(.invalid, "priority \(rangeRule(priorities))", field: "\(prefix())priority")
        }
        if let timeout = spec.timeoutMilliseconds, !timeoutMilliseconds.contains(Int64(clamping: timeout)) {
            throw EngineError(.invalid, "timeout_ms \(rangeRule(timeoutMilliseconds))", field: "\(prefix())timeout_ms")
        }
        guard maxAttempts.contains(Int64(spec.retry.maxAttempts)) else {
            throw EngineError(.invalid, "retry.max_attempts \(rangeRule(maxAttempts))", field: "\(prefix())retry.max_attempts")
        }
        guard backoffMilliseconds.contains(Int64(clamping: spec.retry.backoffMilliseconds)) else {
            throw EngineError(.invalid, "retry.backoff_ms \(rangeRule(backoffMilliseconds))", field: "\(prefix())retry.backoff_ms")
        }
        guard spec.retry.backoffFactor.isFinite, backoffFactors.contains(spec.retry.backoffFactor) else {
            throw EngineError(.invalid, "retry.backoff_factor must be from 1 to 10.", field: "\(prefix())retry.backoff_factor")
        }
        if let key = spec.uniqueKey, !isValidUniqueKey(key) {
            throw EngineError(.invalid, uniqueKeyRule, field: "\(prefix())unique_key")
        }
        if let window = spec.uniqueForMilliseconds {
            guard spec.uniqueKey != nil else {
                throw EngineError(.invalid, "unique_for_ms needs a unique_key.", field: "\(prefix())unique_for_ms")
            }
            guard Int64(clamping: window) >= minUniqueForMilliseconds else {
                throw EngineError(.invalid, "unique_for_ms must be at least 1.", field: "\(prefix())unique_for_ms")
            }
        }
        if let key = spec.concurrencyKey, !isValidConcurrencyKey(key) {
            throw EngineError(.invalid, concurrencyKeyRule, field: "\(prefix())concurrency_key")
        }
    }

    public static let concurrencyKeyRule = "concurrency_key must be 1 to 255 characters."

    /// 1 to 255 Unicode scalars, as JSON Schema counts them.
    public static func isValidConcurrencyKey(_ key: String) -> Bool {
        concurrencyKeyLengths.contains(key.utf8.count) || concurrencyKeyLengths.contains(key.unicodeScalars.count)
    }

    /// Checks a queue's rate limit, naming the field that breaks a rule.
    public static func check(_ limit: RateLimit) throws(EngineError) {
        guard limit.perSecond.isFinite, rateLimitPerSecond.contains(limit.perSecond) else {
            throw EngineError(.invalid, "rate_limit.per_second \(rangeRule(rateLimitPerSecond))", field: "rate_limit.per_second")
        }
        guard rateLimitBurst.contains(Int64(limit.burst)) else {
            throw EngineError(.invalid, "rate_limit.burst \(rangeRule(rateLimitBurst))", field: "rate_limit.burst")
        }
    }

    public static let uniqueKeyRule = "unique_key must be 1 to 255 characters."

    /// 1 to 255 Unicode scalars, as JSON Schema counts them.
    public static func isValidUniqueKey(_ key: String) -> Bool {
        uniqueKeyLengths.contains(key.utf8.count) || uniqueKeyLengths.contains(key.unicodeScalars.count)
    }

    /// 1 to 64 ASCII letters, digits, '-', '_' or '.'.
    public static func isValidQueueName(_ name: String) -> Bool {
        (1...maxQueueNameLength).contains(name.utf8.count) && name.utf8.allSatisfy {
            ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || $0 == 0x2D || $0 == 0x5F || $0 == 0x2E
        }
    }

    /// "must be from A to B.", the message for a value outside `range`.
    public static func rangeRule<Bound: Comparable>(_ range: ClosedRange<Bound>) -> String {
        "must be from \(range.lowerBound) to \(range.upperBound)."
    }
}
