import TaskloopJSON

/// `taskloop schedule ...`: the calls to `/schedules`.
public enum ScheduleCommand: Sendable {
    /// `POST /schedules`; prints the new schedule's id.
    case create(body: [UInt8])
    /// `GET /schedules`: a line per schedule on a terminal, one JSON object per line otherwise.
    case list(format: ListFormat)
    /// `PATCH /schedules/{id}` with `{"paused": ...}`; prints the schedule.
    case setPaused(id: String, paused: Bool)
    /// `POST /schedules/{id}/trigger`; prints the run's task or workflow id.
    case trigger(id: String)
    /// `DELETE /schedules/{id}`; prints the schedule as it was.
    case remove(id: String)
}

/// What `taskloop schedule create` sends.
public enum ScheduleRequest {
    /// The body of `POST /schedules`: the schedule's fields and its template, a task from
    /// `--kind` (with its params and queue) or the task or workflow a file holds (`-f`). The
    /// server checks the rest, so its messages are the ones users see.
    public static func body(name: String, cron: String, timezone: String?, overlap: String?, catchup: String?, maxCatchup: Int?,
                            jitter: String?, paused: Bool, template: Submission) throws(UsageError) -> [UInt8] {
        var object: JSONObject = ["name": .string(name), "cron": .string(cron)]
        if let timezone { object["timezone"] = .string(timezone) }
        let document: JSONValue
        do { document = try JSONParser.parse(template.body) } catch { throw UsageError("the template is not JSON: \(error)") }
        object[template.isWorkflow ? "workflow" : "task"] = document
        if let overlap { object["overlap"] = .string(overlap) }
        if let catchup { object["catchup"] = .string(catchup) }
        if let maxCatchup { object["max_catchup"] = .int(Int64(maxCatchup)) }
        if let jitter {
            guard let milliseconds = Timestamp.spanMilliseconds(jitter) else {
                throw UsageError("--jitter must be a span such as 30s, 5m or 250ms, not \(jitter)")
            }
            object["jitter_ms"] = .int(milliseconds)
        }
        if paused { object["paused"] = .bool(true) }
        return JSONValue.object(object).encoded
    }

    /// `name  cron (zone)  paused|active  next run  last run's state`, for a terminal.
    static func line(_ schedule: JSONObject) -> String {
        let id = schedule["id"]?.stringValue ?? "?"
        let name = schedule["name"]?.stringValue ?? ""
        let cron = schedule["cron"]?.stringValue ?? ""
        let zone = schedule["timezone"]?.stringValue ?? "UTC"
        let paused = schedule["paused"]?.boolValue == true
        let next = schedule["next_runs"]?.arrayValue?.first?.stringValue ?? "-"
        let last = schedule["last_runs"]?.arrayValue?.last?.objectValue?["state"]?.stringValue ?? "-"
        return [id, name, "\(cron) (\(zone))", paused ? "paused" : "active", "next \(next)", "last \(last)"].joined(separator: "  ")
    }
}
