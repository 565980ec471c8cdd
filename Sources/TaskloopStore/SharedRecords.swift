import TaskloopEngine

/// Binary forms of the webhook records for the shared database (the SQLite store keeps them in
/// columns of their own, a delivery's earlier attempts in this form too).
public enum SharedRecordCodec {
    public static func encode(_ webhook: WebhookRecord) -> [UInt8] {
        var output = RecordWriter()
        output.byte(1)
        output.string(webhook.id)
        output.string(webhook.url)
        output.unsigned(UInt64(webhook.events.count))
        for event in webhook.events { output.string(event) }
        output.optional(webhook.queue)
        output.optional(webhook.workflow)
        output.byte(webhook.enabled ? 1 : 0)
        output.signed(webhook.createdAt)
        output.string(webhook.secret)
        return output.bytes
    }

    public static func decodeWebhook(_ bytes: [UInt8]) throws -> WebhookRecord {
        try bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) -> WebhookRecord in
            var input = RecordReader(buffer, table: "webhooks")
            guard try input.byte() == 1 else { throw input.failure("unknown record format") }
            let id = try input.string(), url = try input.string()
            var events: [String] = []
            for _ in 0..<(try input.count(ofAtLeast: 1)) { events.append(try input.string()) }
            let queue = try input.optionalString(), workflow = try input.optionalString()
            let enabled = try input.byte() == 1
            let record = WebhookRecord(id: id, url: url, events: events, queue: queue, workflow: workflow, enabled: enabled,
                                       createdAt: try input.signed(), secret: try input.string())
            guard input.isAtEnd else { throw input.failure("bytes after the last field") }
            return record
        }
    }

    /// Format 2; format 1 (read still) had no earlier attempts.
    public static func encode(_ delivery: DeliveryRecord) -> [UInt8] {
        var output = RecordWriter()
        output.byte(2)
        output.string(delivery.id)
        output.string(delivery.webhook)
        output.unsigned(delivery.eventSeq)
        output.string(delivery.type)
        output.unsigned(UInt64(delivery.body.count))
        output.raw(delivery.body)
        output.unsigned(UInt64(delivery.attempt))
        output.string(delivery.state.rawValue)
        output.optional(delivery.statusCode.map { Int64($0) })
        output.optional(delivery.error)
        output.optional(delivery.durationMilliseconds)
        output.optional(delivery.attemptedAt)
        output.optional(delivery.nextAttemptAt)
        write(delivery.earlierAttempts, into: &output)
        return output.bytes
    }

    static func encode(_ attempts: [DeliveryAttempt]) -> [UInt8] {
        var output = RecordWriter()
        write(attempts, into: &output)
        return output.bytes
    }

    static func decodeAttempts(_ bytes: [UInt8]) throws -> [DeliveryAttempt] {
        try bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) -> [DeliveryAttempt] in
            var input = RecordReader(buffer, table: "webhook_deliveries")
            let attempts = try readAttempts(from: &input)
            guard input.isAtEnd else { throw input.failure("bytes after the last attempt") }
            return attempts
        }
    }

    private static func write(_ attempts: [DeliveryAttempt], into output: inout RecordWriter) {
        output.unsigned(UInt64(attempts.count))
        for attempt in attempts {
            output.unsigned(UInt64(attempt.number))
            output.optional(attempt.statusCode.map { Int64($0) })
            output.optional(attempt.error)
            output.optional(attempt.durationMilliseconds)
            output.optional(attempt.attemptedAt)
            output.optional(attempt.nextAttemptAt)
        }
    }

    private static func readAttempts(from input: inout RecordReader) throws(RecordDecodingError) -> [DeliveryAttempt] {
        var attempts: [DeliveryAttempt] = []
        // An attempt is at least its number and five absence markers.
        for _ in 0..<(try input.count(ofAtLeast: 6)) {
            attempts.append(DeliveryAttempt(
                number: try input.nonNegativeInt(), statusCode: try input.optionalSigned().map { Int($0) },
                error: try input.optionalString(), durationMilliseconds: try input.optionalSigned(),
                attemptedAt: try input.optionalSigned(), nextAttemptAt: try input.optionalSigned()))
        }
        return attempts
    }

    public static func decodeDelivery(_ bytes: [UInt8]) throws -> DeliveryRecord {
        try bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) -> DeliveryRecord in
            var input = RecordReader(buffer, table: "webhook_deliveries")
            let format = try input.byte()
            guard format == 1 || format == 2 else { throw input.failure("unknown record format") }
            let id = try input.string(), webhook = try input.string()
            let eventSeq = try input.unsigned()
            let type = try input.string()
            let length = try input.count(ofAtLeast: 1)
            let body = try input.raw(count: length)
            let attempt = try input.nonNegativeInt()
            guard let state = DeliveryState(rawValue: try input.string()) else { throw input.failure("an unknown delivery state") }
            var record = DeliveryRecord(
                id: id, webhook: webhook, eventSeq: eventSeq, type: type, body: body, attempt: attempt, state: state,
                statusCode: try input.optionalSigned().map { Int($0) }, error: try input.optionalString(),
                durationMilliseconds: try input.optionalSigned(), attemptedAt: try input.optionalSigned(),
                nextAttemptAt: try input.optionalSigned())
            if format == 2 { record.earlierAttempts = try readAttempts(from: &input) }
            guard input.isAtEnd else { throw input.failure("bytes after the last field") }
            return record
        }
    }
}

extension RecordWriter {
    mutating func optional(_ text: String?) {
        byte(text == nil ? 0 : 1)
        if let text { string(text) }
    }

    mutating func optional(_ value: Int64?) {
        byte(value == nil ? 0 : 1)
        if let value { signed(value) }
    }
}

extension RecordReader {
    mutating func optionalString() throws(RecordDecodingError) -> String? {
        try byte() == 1 ? try string() : nil
    }

    mutating func optionalSigned() throws(RecordDecodingError) -> Int64? {
        try byte() == 1 ? try signed() : nil
    }
}
