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
    /// One item's outcome: its status, the task a submission created (which an
    /// `Idempotency-Key`'s replay shows as it is then), and a refused item's problem as JSON.
    struct BatchItemOutcome {
        var status: Int
        var created: TaskID? = nil
        var problem: [UInt8] = []
    }

    /// The 207 `{results: [{status, task | problem}]}`, written as the items are answered: each
    /// task straight into the answer, rather than rendered on its own and copied in (a thousand
    /// allocations and copies of ~700 bytes a batch).
    struct BatchAnswer: ~Copyable {
        private var json: JSONWriter
        private(set) var outcomes: [BatchItemOutcome] = []

        init(items: Int) {
            json = JSONWriter(capacity: 32 + items * 800)
            outcomes.reserveCapacity(items)
            json.beginObject()
            json.key(static: "results")
            json.beginArray()
        }

        mutating func add(_ task: TaskRecord, status: Int, in engine: Engine, created: Bool = false) {
            json.beginObject()
            json.field("status", status)
            json.key(static: "task")
            Representation.write(task, task.moment, into: &json, workflow: engine.workflowID(of: task))
            json.endObject()
            outcomes.append(BatchItemOutcome(status: status, created: created ? task.id : nil))
        }

        mutating func add(_ refused: BatchItemOutcome) {
            json.beginObject()
            json.field("status", refused.status)
            json.key(static: "problem")
            json.encoded(refused.problem)
            json.endObject()
            outcomes.append(refused)
        }

        /// The whole answer's JSON; `outcomes` stay readable.
        mutating func finish() -> [UInt8] {
            json.endArray()
            json.endObject()
            return json.bytes
        }
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
        var answer = BatchAnswer(items: items.count)
        reply.engine.settlingTogether {
            for (position, item) in items.enumerated() {
                submitBatchItem(item, index: indices[position], into: &answer, reply)
            }
        }
        if let key, let fingerprint {
            let record = idempotency.remember(key, fingerprint: fingerprint, status: .multiStatus,
                                              resource: Self.batchReplayPrefix + Self.replayText(answer.outcomes))
            durable?.record(record)
            if let cellHost, let cell = reply.engine.cell { cellHost.record(record, in: Cell(cell)) }
        }
        answerBatch(answer, reply)
    }

    func reportBatch(_ request: HTTPRequest, _ reply: Reply) throws {
        let items = try batchItems(request, member: "reports")
        let indices = Self.batchIndices(request, count: items.count)
        var firstIndexOfID: [String: Int] = [:]
        var answer = BatchAnswer(items: items.count)
        reply.engine.settlingTogether {
            for (position, item) in items.enumerated() {
                reportBatchItem(item, index: indices[position], firstIndexOfID: &firstIndexOfID, into: &answer, reply.engine)
            }
        }
        answerBatch(answer, reply)
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
    /// fields named under the item's index (`tasks[3].kind`).
    private func submitBatchItem(_ item: JSONValue, index: Int, into answer: inout BatchAnswer, _ reply: Reply) {
        do {
            var reader = BodyReader()
            var read: TaskSpec?
            reader.readNamingProblems(under: Self.itemField("tasks", index)) { reader, field in
                read = reader.object(item, field).flatMap { reader.taskSpec($0, prefix: field.isEmpty ? "" : field + ".") }
            }
            try reader.check()
            // Nil only with a problem, which `check` threw.
            let spec = read!
            // Fields named as in a body of its own; `itemProblem` puts them under the item.
            try checkKindAllowed(spec.kind, queue: spec.queue, field: "kind", reply.engine)
            if !spec.dependencies.isEmpty { try refuseUnknownRemoteDependencies(of: [("", spec)], reply) }
            let task = try reply.engine.submit(spec)
            metrics.taskSubmitted(kind: task.kind)
            answer.add(task, status: 201, in: reply.engine, created: true)
        } catch {
            answer.add(Self.itemProblem(error, prefix: Self.itemField("tasks", index)))
        }
    }

    /// An item's field in the client's batch: `tasks[3]`.
    static func itemField(_ member: String, _ index: Int) -> String { "\(member)[\(index)]" }

    /// One report, as `POST /tasks/{id}/complete|fail|progress` takes it: `{id, lease_token?,
    /// complete: {result?} | fail: {error} | progress: {fraction?, message?, details?}}`. A task
    /// reported by an earlier item of the batch is 422 `duplicate_id` and changes nothing.
    private func reportBatchItem(_ item: JSONValue, index: Int, firstIndexOfID: inout [String: Int],
                                 into answer: inout BatchAnswer, _ engine: Engine) {
        do {
            var reader = BodyReader()
            var read: (id: String?, token: String?, report: ExternalReport?) = (nil, nil, nil)
            reader.readNamingProblems(under: Self.itemField("reports", index)) { reader, field in
                read = Self.readReport(item, prefix: field, &reader)
            }
            // A repeated id is the item's problem before any other.
            if let id = read.id {
                if let first = firstIndexOfID[id] {
                    throw APIProblem(.unprocessableContent,
                                     detail: "Task \(id) is reported by reports[\(first)] already; a batch reports a task once.",
                                     type: ProblemType.validation, code: "duplicate_id",
                                     fieldErrors: [.init(field: "id", message: "repeats reports[\(first)].id.")])
                }
                firstIndexOfID[id] = index
            }
            try reader.check()
            // Both nil only with a problem, which `check` threw.
            let (id, report) = (read.id!, read.report!)
            guard let task = TaskID(id).flatMap(engine.task) else { throw APIProblem(.notFound, detail: "No task \(id).") }
            try engine.report(report, for: task.id, leaseToken: read.token)
            answer.add(task, status: 200, in: engine)
        } catch {
            answer.add(Self.itemProblem(error, prefix: Self.itemField("reports", index)))
        }
    }

    /// A report item's id, lease token and report, with its problems named under `prefix`.
    private static func readReport(_ item: JSONValue, prefix: String, _ reader: inout BodyReader)
        -> (id: String?, token: String?, report: ExternalReport?) {
        var id: String?, token: String?, report: ExternalReport?
        let fields = prefix.isEmpty ? "" : prefix + "."
        guard let object = reader.object(item, prefix) else { return (nil, nil, nil) }
        reader.rejectUnknown(object, allowed: ["id", "lease_token", "complete", "fail", "progress"], prefix: fields)
        if case .some(let value?) = reader.string(object, "id", prefix: fields, maxLength: 64) {
            id = value
        } else if object["id"] == nil {
            reader.fail(fields + "id", "is required.")
        }
        token = reader.leaseToken(object, prefix: fields)
        var outcome: String?
        var outcomes = 0
        for name in ["complete", "fail", "progress"] where object[name] != nil {
            outcome = outcome ?? name
            outcomes += 1
        }
        if outcomes != 1 {
            let named = ["complete", "fail", "progress"].filter { object[$0] != nil }
            reader.fail(prefix.isEmpty ? "body" : prefix, named.isEmpty ? "must carry one of complete, fail or progress."
                            : "must carry one of complete, fail or progress, not \(named.joined(separator: " and ")).")
        } else if let outcome, let body = reader.object(object[outcome], fields + outcome) {
            let bodyFields = fields + outcome + "."
            switch outcome {
            case "complete":
                reader.rejectUnknown(body, allowed: ["result"], prefix: bodyFields)
                report = .complete(result: body["result"])
            case "fail":
                reader.rejectUnknown(body, allowed: ["error"], prefix: bodyFields)
                report = reader.failure(body, prefix: bodyFields).map { .fail($0) }
            default:
                reader.rejectUnknown(body, allowed: ["fraction", "message", "details"], prefix: bodyFields)
                report = reader.progressReport(body, prefix: bodyFields)
            }
        }
        return (id, token, report)
    }

    /// The problem an item's error is, as its single route answers it, with the fields it
    /// names put under the item's `prefix` (the engine names them as in a body of its own).
    static func itemProblem(_ error: any Error, prefix: String) -> BatchItemOutcome {
        var problem: APIProblem
        switch error {
        case let error as EngineError: problem = error.problem
        case let error as APIProblem: problem = error
        default:
            let response = errorResponse(for: error)
            return BatchItemOutcome(status: response.status.code, problem: response.body)
        }
        for index in problem.fieldErrors.indices {
            let field = problem.fieldErrors[index].field
            if field == prefix || field.hasPrefix(prefix + ".") { continue }
            problem.fieldErrors[index].field = field == "body" ? prefix : prefix + "." + field
        }
        return BatchItemOutcome(status: problem.status.code, problem: problem.response().body)
    }

    /// Sends the 207, its items counted by status.
    func answerBatch(_ answer: consuming BatchAnswer, _ reply: Reply, headers: HTTPHeaders = [:]) {
        if let route = reply.route { metrics.batchItemsAnswered(route: route, outcomes: answer.outcomes) }
        reply.send(.json(.multiStatus, answer.finish(), headers: headers))
    }

    /// The outcomes an `Idempotency-Key` keeps: a created task's id, or `{status, problem}`.
    private static func replayText(_ outcomes: [BatchItemOutcome]) -> String {
        var json = JSONWriter(capacity: outcomes.count * 48)
        json.beginArray()
        for outcome in outcomes {
            if let created = outcome.created {
                json.string(created.description)
            } else {
                json.beginObject()
                json.field("status", outcome.status)
                json.key(static: "problem")
                json.encoded(outcome.problem)
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
        var answer = BatchAnswer(items: outcomes.count)
        for outcome in outcomes {
            if let text = outcome.stringValue {
                if let id = TaskID(text), let task = reply.engine.task(id) {
                    answer.add(task, status: 201, in: reply.engine, created: true)
                } else {
                    let problem = APIProblem(.notFound, detail: "Task \(text), which this Idempotency-Key created, has been forgotten since.")
                    answer.add(BatchItemOutcome(status: 404, problem: problem.response().body))
                }
            } else if let object = outcome.objectValue, let status = object["status"]?.intValue, let problem = object["problem"] {
                var json = JSONWriter()
                json.value(problem)
                answer.add(BatchItemOutcome(status: Int(status), problem: json.bytes))
            }
        }
        answerBatch(answer, reply, headers: ["Idempotent-Replayed": "true"])
    }
}
