import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON

/// Worker leases over HTTP: lease (with long polls), heartbeat and release. Progress, complete
/// and fail of a leased task go through the v1 report routes with a `lease_token`.
extension TaskloopApplication {
    static let leaseMilliseconds: ClosedRange<Int64> = 1_000...3_600_000

    func lease(_ request: HTTPRequest, _ reply: Reply) throws {
        try refuseWhileDraining()
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var terms = LeaseCalls.Terms(worker: "")
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: ["worker", "kinds", "max_tasks", "lease_ms", "wait_s"], prefix: "")
            switch reader.string(object, "worker", prefix: "", maxLength: 256) {
            case .some(let worker?) where !worker.isEmpty: terms.worker = worker
            case .some: reader.fail("worker", "must not be empty.")
            case .none: if object["worker"] == nil { reader.fail("worker", "is required: a name for the worker, shown on its tasks.") }
            }
            if let value = object["kinds"] {
                if let list = value.arrayValue, !list.isEmpty {
                    var kinds = Set<String>()
                    for (index, element) in list.enumerated() {
                        if let kind = element.stringValue, reply.engine.kinds.contains(kind) { kinds.insert(kind) } else {
                            reader.fail("kinds[\(index)]", "must be one of \(reply.engine.kinds.joined(separator: ", ")).")
                        }
                    }
                    terms.kinds = kinds
                } else {
                    reader.fail("kinds", "must be a non-empty array of kinds.")
                }
            }
            if case .some(let value?) = reader.integer(object, "max_tasks", prefix: "", in: 1...100) { terms.maxTasks = Int(value) }
            if case .some(let value?) = reader.integer(object, "lease_ms", prefix: "", in: Self.leaseMilliseconds) {
                terms.milliseconds = UInt64(value)
            }
            if case .some(let value?) = reader.number(object, "wait_s", prefix: "", in: 0...60) {
                terms.waitMilliseconds = min(UInt64(value * 1_000), configuration.maxLeaseWaitMilliseconds)
            }
        }
        try reader.check()
        try leaseCalls.lease(from: request.parameters["name"] ?? "", terms, reply: reply)
    }

    func heartbeat(_ request: HTTPRequest, _ reply: Reply) throws {
        let task = try existingTask(request, reply.engine)
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var token: String?, milliseconds: UInt64?, progress: ExternalReport?
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: ["lease_token", "lease_ms", "progress"], prefix: "")
            token = reader.leaseToken(object)
            if object["lease_token"] == nil { reader.fail("lease_token", "is required.") }
            if case .some(let value?) = reader.integer(object, "lease_ms", prefix: "", in: Self.leaseMilliseconds) {
                milliseconds = UInt64(value)
            }
            if let value = object.nonNull("progress") {
                if let fields = reader.object(value, "progress") {
                    reader.rejectUnknown(fields, allowed: ["fraction", "message", "details"], prefix: "progress.")
                    progress = reader.progressReport(fields, prefix: "progress.")
                }
            }
        }
        try reader.check()
        try reply.engine.heartbeat(task.id, token: token, milliseconds: milliseconds, progress: progress)
        var json = JSONWriter(capacity: 128)
        json.beginObject()
        json.key(static: "lease")
        Representation.write(task.lease!, into: &json, showingToken: false)
        json.field("cancel_requested", task.cancelRequested)
        json.endObject()
        reply.send(.json(.ok, json.bytes))
    }

    func release(_ request: HTTPRequest, _ reply: Reply) throws {
        let task = try existingTask(request, reply.engine)
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var token: String?
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: ["lease_token"], prefix: "")
            token = reader.leaseToken(object)
            if object["lease_token"] == nil { reader.fail("lease_token", "is required.") }
        }
        try reader.check()
        try reply.engine.release(task.id, token: token)
        reply.send(.json(.ok, Representation.task(task, in: reply.engine)))
    }
}
