import Crypto
import TaskloopEngine
import TaskloopHTTP
import TaskloopStore

/// `Idempotency-Key` on `POST /tasks` and `POST /workflows` (contract v2, Idempotency; the
/// IETF httpapi draft's semantics, Stripe's 24 hours): a key names one creation. The same key
/// with the same request replays the first answer's status with the resource as it is now; with
/// another request it is refused. Keys live `--idempotency-ttl-seconds`, are written in the same
/// transaction as what they created, and come back after a restart. At most `maxKeys` live at
/// once: a new key past that is refused until old ones expire, so keys cannot fill memory.
///
/// Threading: loop thread only.
final class IdempotencyKeys {
    private var entries: [String: IdempotencyRecord] = [:]
    /// Keys by expiry, soonest first (the TTL is one for all, so creation order is expiry order).
    private var expiries: [(key: String, expiresAt: Int64)] = []
    private var firstExpiry = 0
    private let ttlMilliseconds: Int64
    private let maxKeys: Int
    private let scheduler: EngineScheduler
    private var sweep: ScheduledAction?
    /// Told which keys expired, to delete them from the store.
    var onExpire: (([String]) -> Void)?

    init(ttlMilliseconds: Int64, maxKeys: Int, scheduler: EngineScheduler, restored: [IdempotencyRecord]) {
        self.ttlMilliseconds = ttlMilliseconds
        self.maxKeys = maxKeys
        self.scheduler = scheduler
        for record in restored.sorted(by: { $0.expiresAt < $1.expiresAt }) {
            entries[record.key] = record
            expiries.append((record.key, record.expiresAt))
        }
    }

    /// The header's key: nil without one, 400 when malformed or repeated.
    static func key(of request: HTTPRequest) throws(APIProblem) -> String? {
        let values = request.headers.values(for: "Idempotency-Key")
        guard let key = values.first else { return nil }
        guard values.count == 1, (1...255).contains(key.utf8.count), key.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw APIProblem(.badRequest, detail: "Idempotency-Key must be one header of 1 to 255 visible ASCII characters.",
                             code: "invalid_idempotency_key")
        }
        return key
    }

    /// What makes two requests the same one: method, path and body, byte for byte.
    static func fingerprint(of request: HTTPRequest) -> [UInt8] {
        var hasher = SHA256()
        hasher.update(data: Array("\(request.method) \(request.path)\n".utf8))
        hasher.update(data: request.body)
        return Array(hasher.finalize())
    }

    /// The live record of `key`, if it was used and has not expired.
    func record(for key: String) -> IdempotencyRecord? {
        guard let record = entries[key], record.expiresAt > scheduler.wallClock else { return nil }
        return record
    }

    /// 429 `too_many_idempotency_keys` when remembering `key` would pass `maxKeys`; a key
    /// remembered already (even expired, not yet swept) takes no more room. `Retry-After`: until
    /// the soonest key expires.
    func checkRoom(for key: String) throws(APIProblem) {
        guard entries.count >= maxKeys, entries[key] == nil else { return }
        let soonest = firstExpiry < expiries.count ? expiries[firstExpiry].expiresAt : scheduler.wallClock
        let seconds = max(1, (soonest - scheduler.wallClock + 999) / 1_000)
        throw APIProblem(.tooManyRequests, detail: "This server remembers \(maxKeys) idempotency keys at most "
                         + "(--max-idempotency-keys); a new key is accepted once older ones expire.",
                         code: "too_many_idempotency_keys", headers: ["Retry-After": String(seconds)])
    }

    /// Remembers what `key` created; returns the record to write with it.
    func remember(_ key: String, fingerprint: [UInt8], status: HTTPStatus, resource: String) -> IdempotencyRecord {
        let record = IdempotencyRecord(key: key, requestHash: fingerprint, status: status.code, resource: resource,
                                       expiresAt: scheduler.wallClock + ttlMilliseconds)
        entries[key] = record
        expiries.append((key, record.expiresAt))
        scheduleSweep()
        return record
    }

    /// Keys other replicas used, and forgot (several replicas on one database).
    func absorb(_ records: [IdempotencyRecord], expired: [String]) {
        for record in records {
            entries[record.key] = record
            expiries.append((record.key, record.expiresAt))
        }
        for key in expired { entries.removeValue(forKey: key) }
        scheduleSweep()
    }

    /// Starts forgetting expired keys (at once for those restored already expired).
    func start() {
        scheduleSweep()
    }

    func close() {
        sweep?.cancel()
        sweep = nil
    }

    private func scheduleSweep() {
        guard sweep == nil, firstExpiry < expiries.count else { return }
        let due = expiries[firstExpiry].expiresAt - scheduler.wallClock
        sweep = scheduler.schedule(after: UInt64(max(0, due))) { [weak self] in
            guard let self else { return }
            sweep = nil
            forgetExpired()
        }
    }

    private func forgetExpired() {
        let now = scheduler.wallClock
        var expired: [String] = []
        while firstExpiry < expiries.count, expiries[firstExpiry].expiresAt <= now {
            let (key, expiresAt) = expiries[firstExpiry]
            firstExpiry += 1
            // A key used again after expiring has a later entry of its own.
            if entries[key]?.expiresAt == expiresAt {
                entries.removeValue(forKey: key)
                expired.append(key)
            }
        }
        if firstExpiry > 1_024 && firstExpiry * 2 > expiries.count {
            expiries.removeFirst(firstExpiry)
            firstExpiry = 0
        }
        if !expired.isEmpty { onExpire?(expired) }
        scheduleSweep()
    }
}
