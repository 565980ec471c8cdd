import TaskloopCluster
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON
import TaskloopStore

/// `POST /tasks/batch` and `POST /tasks/reports` (contract v3, Batches): many submissions or
/// reports in one request, each item answered as its single route would have answered it
/// alone, in order, under one 207. Items are independent (not atomic, unlike a workflow): a bad
/// item is its own 4xx and the others go on. Every item is handled in the one loop turn of the
/// request, so with a store the batch is one store batch (one transaction), and the 207 leaves
/// once it has committed. With cells a batch whose items span cells is split by cell
/// (`splitBatchAcrossCells`), each cell's part one commit of that cell.
extension TaskloopApplication {
    /// One item's answer: its status and body (the task for a 2xx, else the problem), as JSON.
    struct BatchItemResult {
        var status: Int
        var body: [UInt8]
        /// The task a submission created, which an `Idempotency-Key`'s replay shows as it is then.
        var created: TaskID?
    }

    /// What an `Idempotency-Key` of a batch remembers: this, then the items' outcomes as JSON
    /// (each a created task's id, or the status and problem answered).
    static let batchReplayPrefix = "/tasks/batch "
    /// A part of a batch another replica split by cell names its items' indices in the
    /// client's batch here, so each problem names the field the client sent.
    static let batchIndicesField = "Taskloop-Batch-Indices"

    func submitTaskBatch(_ request: HTTPRequest, _ reply: Reply) throws {
        try refuseWhileDraining()
        let key = try IdempotencyKeys.key(of: request)
        let fingerprint = key.map { _ in IdempotencyKeys.fingerprint(of: request) }
        if let key, let fingerprint, let first = idempotency.record(for: key), first.requestHash == fingerprint,
           first.resource.hasPrefix(Self.batchReplayPrefix) {
            return replayBatch(first, reply)
        }
        // Another request under the key (or what it made forgotten): answered as `POST /tasks` would.
        if try replayed(key, fingerprint, reply) { return }
        let items = try batchItems(request, member: "tasks")
        if let key { try idempotency.checkRoom(for: key) }
        let indices = Self.batchIndices(request, count: items.count)
        var results: [BatchItemResult] = []
        results.reserveCapacity(items.count)
        for (position, item) in items.enumerated() {
            results.append(submitBatchItem(item, prefix: "tasks[\(indices[position])]", reply))
        }
        if let key, let fingerprint {
            let record = idempotency.remember(key, fingerprint: fingerprint, status: .multiStatus,
                                              resource: Self.batchReplayPrefix + Self.replayText(results))
            durable?.record(record)
            if let cellHost, let cell = reply.engine.cell { cellHost.record(record, in: Cell(cell)) }
        }
        answerBatch(results, reply)
    }

    func reportBatch(_ request: HTTPRequest, _ reply: Reply) throws {
        let items = try batchItems(request, member: "reports")
        let indices = Self.batchIndices(request, count: items.count)
        var firstIndexOfID: [String: Int] = [:]
        var results: [BatchItemResult] = []
        results.reserveCapacity(items.count)
        for (position, item) in items.enumerated() {
            results.append(reportBatchItem(item, index: indices[position], firstIndexOfID: &firstIndexOfID, reply.engine))
        }
        answerBatch(results, reply)
    }

    /// The items of a batch body `{<member>: [...]}`. Whole-request problems change nothing:
    /// 415 and 400 as for any body, 422 naming `member` when it is missing, not an array or
    /// empty, and 422 `too_many_items` past `--max-batch-items` (413 is the body's size, which
    /// --max-body-bytes refuses before it is read).
    func batchItems(_ request: HTTPRequest, member: String) throws(APIProblem) -> [JSONValue] {
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var items: [JSONValue] = []
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: [member], prefix: "")
            switch object[member] {
            case nil: reader.fail(member, "is required.")
            case .array(let array)?:
                if array.isEmpty { reader.fail(member, "must hold at least one item.") }
                items = array
            case let value?: reader.fail(member, "must be an array, not \(value.kindDescription).")
            }
        }
        try reader.check()
        let limit = configuration.maxBatchItems
        guard items.count <= limit else {
            throw APIProblem(.unprocessableContent,
                             detail: "A batch carries at most \(limit) items (--max-batch-items); this one has \(items.count). Send it in parts.",
                             type: ProblemType.validation, code: "too_many_items",
                             fieldErrors: [.init(field: member, message: "must hold at most \(limit) items.")])
        }
        return items
    }

    /// Each item's index in the client's batch: its position, or for a part of a batch that a
    /// replica split by cell, the indices that replica names (`batchIndicesField`; a part served
    /// where it was split is not forwarded, so the field is read on any request: a client that
    /// sends it only renames its own problems' fields).
    static func batchIndices(_ request: HTTPRequest, count: Int) -> [Int] {
        if let text = request.headers[batchIndicesField] {
            let indices = text.split(separator: ",").compactMap { Int($0) }
            if indices.count == count && indices.allSatisfy({ $0 >= 0 }) { return indices }
        }
        return Array(0..<count)
    }

    /// One submission, as `POST /tasks` makes it: the same readers and checks, its problem's
    /// fields named under `prefix` (`tasks[3].kind`).
    private func submitBatchItem(_ item: JSONValue, prefix: String, _ reply: Reply) -> BatchItemResult {
        do {
            var reader = BodyReader()
            let spec = reader.object(item, prefix).flatMap { reader.taskSpec($0, prefix: prefix + ".") }
            try reader.check()
            try checkKindAllowed(spec!.kind, queue: spec!.queue, field: prefix + ".kind", reply.engine)
            try refuseUnknownRemoteDependencies(of: [(prefix + ".", spec!)], reply)
            let task = try reply.engine.submit(spec!)
            metrics.taskSubmitted(kind: task.kind)
            return BatchItemResult(status: 201, body: Representation.task(task, in: reply.engine), created: task.id)
        } catch {
            return Self.itemProblem(error, prefix: prefix)
        }
    }

    /// One report, as `POST /tasks/{id}/complete|fail|progress` takes it: `{id, lease_token?,
    /// complete: {result?} | fail: {error} | progress: {fraction?, message?, details?}}`. A task
    /// reported by an earlier item of the batch is 422 `duplicate_id` and changes nothing.
    private func reportBatchItem(_ item: JSONValue, index: Int, firstIndexOfID: inout [String: Int],
                                 _ engine: Engine) -> BatchItemResult {
        let prefix = "reports[\(index)]"
        do {
            var reader = BodyReader()
            var id: String?, token: String?, report: ExternalReport?
            if let object = reader.object(item, prefix) {
                reader.rejectUnknown(object, allowed: ["id", "lease_token", "complete", "fail", "progress"], prefix: prefix + ".")
                if case .some(let value?) = reader.string(object, "id", prefix: prefix + ".", maxLength: 64) {
                    if let first = firstIndexOfID[value] {
                        throw APIProblem(.unprocessableContent,
                                         detail: "Task \(value) is reported by reports[\(first)] already; a batch reports a task once.",
                                         type: ProblemType.validation, code: "duplicate_id",
                                         fieldErrors: [.init(field: prefix + ".id", message: "repeats reports[\(first)].id.")])
                    }
                    firstIndexOfID[value] = index
                    id = value
                } else if object["id"] == nil {
                    reader.fail(prefix + ".id", "is required.")
                }
                token = reader.leaseToken(object, prefix: prefix + ".")
                let outcomes = ["complete", "fail", "progress"].filter { object[$0] != nil }
                if outcomes.count != 1 {
                    reader.fail(prefix, outcomes.isEmpty ? "must carry one of complete, fail or progress."
                                    : "must carry one of complete, fail or progress, not \(outcomes.joined(separator: " and ")).")
                } else if let body = reader.object(object[outcomes[0]], prefix + "." + outcomes[0]) {
                    let fields = prefix + "." + outcomes[0] + "."
                    switch outcomes[0] {
                    case "complete":
                        reader.rejectUnknown(body, allowed: ["result"], prefix: fields)
                        report = .complete(result: body["result"])
                    case "fail":
                        reader.rejectUnknown(body, allowed: ["error"], prefix: fields)
                        report = reader.failure(body, prefix: fields).map { .fail($0) }
                    default:
                        reader.rejectUnknown(body, allowed: ["fraction", "message", "details"], prefix: fields)
                        report = reader.progressReport(body, prefix: fields)
                    }
                }
            }
            try reader.check()
            guard let task = TaskID(id!).flatMap(engine.task) else { throw APIProblem(.notFound, detail: "No task \(id!).") }
            try engine.report(report!, for: task.id, leaseToken: token)
            return BatchItemResult(status: 200, body: Representation.task(task, in: engine))
        } catch {
            return Self.itemProblem(error, prefix: prefix)
        }
    }

    /// The problem an item's error is, as its single route answers it, with the fields it
    /// names put under the item's `prefix` (the engine names them as in a body of its own).
    static func itemProblem(_ error: any Error, prefix: String) -> BatchItemResult {
        var problem: APIProblem
        switch error {
        case let error as EngineError: problem = error.problem
        case let error as APIProblem: problem = error
        default:
            let response = errorResponse(for: error)
            return BatchItemResult(status: response.status.code, body: response.body)
        }
        for index in problem.fieldErrors.indices {
            let field = problem.fieldErrors[index].field
            if field == prefix || field.hasPrefix(prefix + ".") { continue }
            problem.fieldErrors[index].field = field == "body" ? prefix : prefix + "." + field
        }
        return BatchItemResult(status: problem.status.code, body: problem.response().body)
    }

    /// The 207 `{results: [{status, task | problem}]}`, counted by item status.
    func answerBatch(_ results: [BatchItemResult], _ reply: Reply, headers: HTTPHeaders = [:]) {
        if let route = reply.route { metrics.batchItemsAnswered(route: route, statuses: results.map(\.status)) }
        reply.send(.json(.multiStatus, Self.render(results), headers: headers))
    }

    static func render(_ results: [BatchItemResult]) -> [UInt8] {
        var json = JSONWriter(capacity: results.reduce(16) { $0 + $1.body.count + 32 })
        json.beginObject()
        json.key(static: "results")
        json.beginArray()
        for result in results {
            json.beginObject()
            json.field("status", result.status)
            if (200..<300).contains(result.status) { json.key(static: "task") } else { json.key(static: "problem") }
            json.encoded(result.body)
            json.endObject()
        }
        json.endArray()
        json.endObject()
        return json.bytes
    }

    /// The outcomes an `Idempotency-Key` keeps: a created task's id, or `{status, problem}`.
    private static func replayText(_ results: [BatchItemResult]) -> String {
        var json = JSONWriter(capacity: results.count * 48)
        json.beginArray()
        for result in results {
            if let created = result.created {
                json.string(created.description)
            } else {
                json.beginObject()
                json.field("status", result.status)
                json.key(static: "problem")
                json.encoded(result.body)
                json.endObject()
            }
        }
        json.endArray()
        return String(decoding: json.bytes, as: UTF8.self)
    }

    /// The first answer again, marked `Idempotent-Replayed`: each created task as it is now (a
    /// task forgotten since is that item's 404), each problem as it was.
    private func replayBatch(_ first: IdempotencyRecord, _ reply: Reply) {
        let text = first.resource.utf8.dropFirst(Self.batchReplayPrefix.utf8.count)
        let outcomes = (try? JSONParser.parse(Array(text)))?.arrayValue ?? []
        var results: [BatchItemResult] = []
        results.reserveCapacity(outcomes.count)
        for outcome in outcomes {
            if let text = outcome.stringValue {
                if let id = TaskID(text), let task = reply.engine.task(id) {
                    results.append(BatchItemResult(status: 201, body: Representation.task(task, in: reply.engine), created: id))
                } else {
                    let problem = APIProblem(.notFound, detail: "Task \(text), which this Idempotency-Key created, has been forgotten since.")
                    results.append(BatchItemResult(status: 404, body: problem.response().body))
                }
            } else if let object = outcome.objectValue, let status = object["status"]?.intValue, let problem = object["problem"] {
                var json = JSONWriter()
                json.value(problem)
                results.append(BatchItemResult(status: Int(status), body: json.bytes))
            }
        }
        answerBatch(results, reply, headers: ["Idempotent-Replayed": "true"])
    }
}
