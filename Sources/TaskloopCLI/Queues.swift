import TaskloopJSON

/// `taskloop queue ...`: the calls to `/queues`.
public enum QueueCommand: Sendable {
    /// `GET /queues`: a line per queue on a terminal, one JSON object per line otherwise.
    case list(format: ListFormat)
    /// `GET /queues/{name}`; prints the queue.
    case show(name: String)
    /// `PATCH /queues/{name}` with `QueueRequest.body`'s settings; prints the queue as changed.
    case update(name: String, body: [UInt8])
}

/// What `taskloop queue set` sends, and how `taskloop queue ls` shows a queue.
public enum QueueRequest {
    /// A change of `key_concurrency` or of `rate_limit`: a new value, or none (null lifts it).
    public enum Setting<Value: Sendable>: Sendable {
        case to(Value)
        case removed
    }

    /// The body of `PATCH /queues/{name}`: only the settings given. `rate` is a count per unit,
    /// `10/s`, `600/m`, `0.5/s` or `3600/h`, sent as `per_second`. The server checks the ranges,
    /// so its messages are the ones users see; what cannot be sent at all is refused here.
    public static func body(maxConcurrency: Int?, paused: Bool?, dispatch: String?, keyConcurrency: Setting<Int>?,
                            rate: Setting<(rate: String, burst: Int)>?) throws(UsageError) -> [UInt8] {
        var object: JSONObject = [:]
        if let maxConcurrency { object["max_concurrency"] = .int(Int64(maxConcurrency)) }
        if let paused { object["paused"] = .bool(paused) }
        if let dispatch { object["dispatch"] = .string(dispatch) }
        switch keyConcurrency {
        case .to(let cap)?: object["key_concurrency"] = .int(Int64(cap))
        case .removed?: object["key_concurrency"] = .null
        case nil: break
        }
        switch rate {
        case .to(let limit)?:
            guard let perSecond = perSecond(limit.rate) else {
                throw UsageError("--rate must be a count per unit such as 10/s, 600/m or 0.5/s, not \(limit.rate)")
            }
            object["rate_limit"] = .object(["per_second": .double(perSecond), "burst": .int(Int64(limit.burst))])
        case .removed?:
            object["rate_limit"] = .null
        case nil:
            break
        }
        guard !object.isEmpty else { throw UsageError("give at least one setting to change") }
        return JSONValue.object(object).encoded
    }

    /// Starts per second of `10/s`, `600/m`, `3600/h` (a fraction allowed: `0.5/s`); nil for anything else.
    static func perSecond(_ text: String) -> Double? {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, let count = Double(parts[0]), count.isFinite, count >= 0 else { return nil }
        let seconds: Double
        switch parts[1] {
        case "s": seconds = 1
        case "m": seconds = 60
        case "h": seconds = 3_600
        default: return nil
        }
        return count / seconds
    }

    /// `name  active|paused  running R/M  queued Q  per key K|-  rate 10/s burst 5|none  dispatch D`, for a terminal.
    static func line(_ queue: JSONObject) -> String {
        let name = queue["name"]?.stringValue ?? "?"
        let paused = queue["paused"]?.boolValue == true
        let counts = queue["counts"]?.objectValue
        func count(_ state: String) -> String { counts?[state]?.intValue.map(String.init) ?? "?" }
        let limit = queue["max_concurrency"]?.intValue.map(String.init) ?? "?"
        let perKey = queue["key_concurrency"]?.intValue.map(String.init) ?? "-"
        let rate = queue["rate_limit"]?.objectValue.map { limit in
            "rate \(limit["per_second"].map(JSONText.compact) ?? "?")/s burst \(limit["burst"]?.intValue.map(String.init) ?? "?")"
        } ?? "rate none"
        return [name, paused ? "paused" : "active", "running \(count("running"))/\(limit)", "queued \(count("queued"))",
                "per key \(perKey)", rate, "dispatch \(queue["dispatch"]?.stringValue ?? "?")"].joined(separator: "  ")
    }
}
