/// A webhook as it is kept: where events go, which ones, and the secret that signs them.
public struct WebhookRecord: Sendable, Equatable {
    public var id: String
    public var url: String
    /// Event type names (`task.state`, ...).
    public var events: [String]
    public var queue: String?
    public var workflow: String?
    public var enabled: Bool
    /// Wall-clock milliseconds.
    public var createdAt: Int64
    /// `whsec_` + base64 of the key.
    public var secret: String

    public init(id: String, url: String, events: [String], queue: String?, workflow: String?, enabled: Bool, createdAt: Int64,
                secret: String) {
        self.id = id
        self.url = url
        self.events = events
        self.queue = queue
        self.workflow = workflow
        self.enabled = enabled
        self.createdAt = createdAt
        self.secret = secret
    }
}

public enum DeliveryState: String, Sendable, CaseIterable {
    /// Not yet accepted by the receiver; `nextAttemptAt` says when it is tried (again).
    case pending
    case delivered
    /// Given up: the retry schedule ran out, the webhook was disabled, or its backlog was full.
    case failed
}

/// One event on its way to one webhook, and how its last attempt went. Kept until it is
/// delivered or given up, then in the webhook's log until newer ones push it out.
public struct DeliveryRecord: Sendable, Equatable {
    public var id: String
    public var webhook: String
    public var eventSeq: UInt64
    public var type: String
    /// The request body as first rendered (every attempt sends the same bytes); emptied once the
    /// delivery is finished.
    public var body: [UInt8]
    /// Attempts made so far.
    public var attempt: Int
    public var state: DeliveryState
    public var statusCode: Int?
    public var error: String?
    public var durationMilliseconds: Int64?
    /// Wall-clock milliseconds of the last attempt, and of the next (nil once finished).
    public var attemptedAt: Int64?
    public var nextAttemptAt: Int64?

    public init(id: String, webhook: String, eventSeq: UInt64, type: String, body: [UInt8], attempt: Int = 0,
                state: DeliveryState = .pending, statusCode: Int? = nil, error: String? = nil, durationMilliseconds: Int64? = nil,
                attemptedAt: Int64? = nil, nextAttemptAt: Int64? = nil) {
        self.id = id
        self.webhook = webhook
        self.eventSeq = eventSeq
        self.type = type
        self.body = body
        self.attempt = attempt
        self.state = state
        self.statusCode = statusCode
        self.error = error
        self.durationMilliseconds = durationMilliseconds
        self.attemptedAt = attemptedAt
        self.nextAttemptAt = nextAttemptAt
    }
}
