import TaskloopEngine
import TaskloopExecutors
import TaskloopHTTP
import TaskloopHTTPClient
import TaskloopJSON
import TaskloopStore

/// Webhooks over HTTP: create (the secret is shown once), list, read, delete, and each one's
/// delivery log.
extension TaskloopApplication {
    func createWebhook(_ request: HTTPRequest, _ reply: Reply) throws {
        reply.send(try newWebhook(request))
    }

    /// Creates the webhook a request describes; the answer to send once it is kept.
    func newWebhook(_ request: HTTPRequest) throws -> HTTPResponse {
        try refuseWhileDraining()
        let document = try BodyReader.document(request)!
        var reader = BodyReader()
        var url: HTTPURL?
        var kinds: [EventKind] = []
        var queue: String?
        var workflow: TaskID?
        if let object = reader.object(document, "") {
            reader.rejectUnknown(object, allowed: ["url", "events", "queue", "workflow"], prefix: "")
            if let text = object["url"]?.stringValue {
                switch HTTPExecutor.checkedURL(text, policy: configuration.httpPolicy) {
                case .success(let checked): url = checked
                case .failure(let problem): reader.fail("url", problem.message)
                }
            } else {
                reader.fail("url", "is required: the absolute http or https URL deliveries are POSTed to.")
            }
            let known = EventKind.allCases.map(\.rawValue).joined(separator: ", ")
            if let list = object["events"]?.arrayValue, !list.isEmpty, list.count <= EventKind.allCases.count {
                for (index, element) in list.enumerated() {
                    guard let kind = element.stringValue.flatMap(EventKind.init(rawValue:)) else {
                        reader.fail("events[\(index)]", "must be one of \(known).")
                        continue
                    }
                    if kinds.contains(kind) { reader.fail("events[\(index)]", "names \(kind.rawValue) twice.") }
                    kinds.append(kind)
                }
            } else {
                reader.fail("events", "is required: a non-empty array of distinct event types (\(known)).")
            }
            if case .some(let name?) = reader.string(object, "queue", prefix: "", maxLength: BodyReader.Rules.maxQueueNameLength) {
                if BodyReader.Rules.isValidQueueName(name) { queue = name } else {
                    reader.fail("queue", "must be a queue name: 1 to 64 letters, digits, '.', '_' or '-'.")
                }
            }
            if case .some(let text?) = reader.string(object, "workflow", prefix: "") {
                if let id = TaskID(text) { workflow = id } else { reader.fail("workflow", "must be a workflow id.") }
            }
        }
        try reader.check()
        let hook: Webhooks.Hook
        do {
            hook = try webhooks.create(url: url!, events: kinds, queue: queue, workflow: workflow)
        } catch {
            throw APIProblem(.conflict, detail: "This server keeps at most \(configuration.webhooks.maxWebhooks) webhooks "
                + "(--max-webhooks); delete one first.", code: "too_many_webhooks")
        }
        return .json(.created, Self.webhookJSON(hook.record, showingSecret: true), headers: ["Location": "/webhooks/\(hook.record.id)"])
    }

    func listWebhooks(_ request: HTTPRequest, _ reply: Reply) throws {
        var json = JSONWriter(capacity: 256)
        json.beginObject()
        json.key(static: "webhooks")
        json.beginArray()
        for hook in webhooks.all { Self.write(hook.record, into: &json, showingSecret: false) }
        json.endArray()
        json.endObject()
        reply.send(.json(.ok, json.bytes))
    }

    func getWebhook(_ request: HTTPRequest, _ reply: Reply) throws {
        reply.send(.json(.ok, Self.webhookJSON(try existingWebhook(request).record, showingSecret: false)))
    }

    func deleteWebhook(_ request: HTTPRequest, _ reply: Reply) throws {
        reply.send(try deletedWebhook(request))
    }

    /// Deletes the webhook a request names; the answer to send once that is kept.
    func deletedWebhook(_ request: HTTPRequest) throws -> HTTPResponse {
        let hook = try existingWebhook(request)
        _ = webhooks.delete(hook.record.id)
        return .json(.ok, Self.webhookJSON(hook.record, showingSecret: false))
    }

    func listDeliveries(_ request: HTTPRequest, _ reply: Reply) throws {
        let limit = try Self.deliveryLogLimit(request)
        let hook = try existingWebhook(request)
        reply.send(.json(.ok, Self.deliveriesJSON(webhooks.deliveryLog(of: hook, limit: limit))))
    }

    static func deliveryLogLimit(_ request: HTTPRequest) throws(APIProblem) -> Int {
        var errors: [APIProblem.FieldError] = []
        let limit = pageLimit(request, errors: &errors)
        guard errors.isEmpty else { throw APIProblem.invalidQuery(errors) }
        return limit
    }

    /// `{deliveries: [...]}`, entries as `Webhooks.deliveryLog` gives them.
    static func deliveriesJSON(_ log: [DeliveryRecord]) -> [UInt8] {
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        json.key(static: "deliveries")
        json.beginArray()
        for delivery in log {
            json.beginObject()
            json.field("id", delivery.id)
            json.field("event_seq", Int(delivery.eventSeq))
            json.field("type", delivery.type)
            json.field("state", delivery.state.rawValue)
            json.field("attempt", delivery.attempt)
            json.key(static: "status_code")
            if let code = delivery.statusCode { json.int(code) } else { json.null() }
            json.field("error", delivery.error)
            json.key(static: "duration_ms")
            if let milliseconds = delivery.durationMilliseconds { json.int(milliseconds) } else { json.null() }
            Representation.timestamp("at", delivery.attemptedAt, into: &json)
            Representation.timestamp("next_attempt_at", delivery.nextAttemptAt, into: &json)
            json.endObject()
        }
        json.endArray()
        json.endObject()
        return json.bytes
    }

    func existingWebhook(_ request: HTTPRequest) throws(APIProblem) -> Webhooks.Hook {
        let id = request.parameters["id"] ?? ""
        guard let hook = webhooks.hooks[id] else { throw APIProblem(.notFound, detail: "No webhook \(id).") }
        return hook
    }

    static func webhookJSON(_ record: WebhookRecord, showingSecret: Bool) -> [UInt8] {
        var json = JSONWriter(capacity: 256)
        write(record, into: &json, showingSecret: showingSecret)
        return json.bytes
    }

    /// `{id, url, events, queue, workflow, enabled, created_at}`, and `secret` when just made.
    static func write(_ record: WebhookRecord, into json: inout JSONWriter, showingSecret: Bool) {
        json.beginObject()
        json.field("id", record.id)
        json.field("url", record.url)
        json.key(static: "events")
        json.beginArray()
        for event in record.events { json.string(event) }
        json.endArray()
        json.field("queue", record.queue)
        json.field("workflow", record.workflow)
        json.field("enabled", record.enabled)
        Representation.timestamp("created_at", record.createdAt, into: &json)
        if showingSecret { json.field("secret", record.secret) }
        json.endObject()
    }
}
