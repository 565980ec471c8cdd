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

/// An attempt of a delivery that was followed by another: its entry in the webhook's log.
public struct DeliveryAttempt: Sendable, Equatable {
    public var number: Int
    public var statusCode: Int?
    public var error: String?
    public var durationMilliseconds: Int64?
    /// Wall-clock milliseconds of the attempt, and of the retry it scheduled.
    public var attemptedAt: Int64?
    public var nextAttemptAt: Int64?

    public init(number: Int, statusCode: Int?, error: String?, durationMilliseconds: Int64?, attemptedAt: Int64?,
                nextAttemptAt: Int64?) {
        self.number = number
        self.statusCode = statusCode
        self.error = error
        self.durationMilliseconds = durationMilliseconds
        self.attemptedAt = attemptedAt
        self.nextAttemptAt = nextAttemptAt
    }
}

/// One event on its way to one webhook, how its last attempt went, and the attempts before.
/// Kept until it is delivered or given up, then in the webhook's log until newer ones push it
/// out.
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
    /// The attempts before the last, oldest first; the oldest leave first when the log is full.
    public var earlierAttempts: [DeliveryAttempt]

    public init(id: String, webhook: String, eventSeq: UInt64, type: String, body: [UInt8], attempt: Int = 0,
                state: DeliveryState = .pending, statusCode: Int? = nil, error: String? = nil, durationMilliseconds: Int64? = nil,
                attemptedAt: Int64? = nil, nextAttemptAt: Int64? = nil, earlierAttempts: [DeliveryAttempt] = []) {
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
        self.earlierAttempts = earlierAttempts
    }

    /// The last attempt as an earlier one, once another is made; nil before the first.
    public var lastAttempt: DeliveryAttempt? {
        guard attempt > 0 else { return nil }
        return DeliveryAttempt(number: attempt, statusCode: statusCode, error: error, durationMilliseconds: durationMilliseconds,
                               attemptedAt: attemptedAt, nextAttemptAt: nextAttemptAt)
    }

    /// Its entries in the webhook's log: one per attempt kept, or one for a delivery not yet
    /// attempted (or given up before its first attempt).
    public var logEntries: Int { earlierAttempts.count + 1 }
}
