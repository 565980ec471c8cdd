import TaskloopBytes
import TaskloopJSON

/// Who starts a queue's tasks.
public enum QueueDispatch: String, Sendable, CaseIterable {
    /// The server's executors, as in v1.
    case server
    /// Workers elsewhere, which lease them (`Engine.lease`).
    case workers
}

/// A worker's hold on the running attempt of one task. The token fences the attempt: only
/// reports quoting the current lease's token change anything.
///
/// Threading: engine thread only.
public final class Lease {
    /// Unguessable (128 random bits); shown to the worker that holds the lease, and nobody else.
    public let token: String
    public let worker: String
    /// Wall-clock milliseconds of the grant, from which the attempt's timeout counts.
    public let grantedAt: Int64
    /// The length it was granted with; a heartbeat without its own length extends by this.
    public let milliseconds: UInt64
    /// Wall-clock milliseconds; without a heartbeat before then, the attempt ends.
    public internal(set) var expiresAt: Int64
    var expiry: ScheduledAction?

    init(token: String, worker: String, grantedAt: Int64, milliseconds: UInt64, expiresAt: Int64) {
        self.token = token
        self.worker = worker
        self.grantedAt = grantedAt
        self.milliseconds = milliseconds
        self.expiresAt = expiresAt
    }
}

/// Lease traffic of one queue since the start, for metrics.
public struct LeaseCounts: Sendable, Equatable {
    public internal(set) var granted = 0
    public internal(set) var expired = 0
    public internal(set) var released = 0
    /// Tasks that failed for good because their last attempt's lease expired: work that keeps
    /// killing its workers.
    public internal(set) var poisoned = 0

    public init(granted: Int = 0, expired: Int = 0, released: Int = 0, poisoned: Int = 0) {
        self.granted = granted
        self.expired = expired
        self.released = released
        self.poisoned = poisoned
    }
}

/// One lease call: what the worker takes, and where the tasks go once it gets some.
///
/// Threading: engine thread only.
public final class LeaseRequest {
    public let worker: String
    /// Only tasks of these kinds; any kind when nil.
    public let kinds: Set<String>?
    public let maxTasks: Int
    public let milliseconds: UInt64
    /// Called once, with the leased tasks, if the call waited (`Engine.lease(_:from:waiting:)`);
    /// with none when the queue stopped being leasable meanwhile.
    let onGrant: ([TaskRecord]) -> Void
    /// Set while the call waits in its queue.
    fileprivate(set) var isWaiting = false
    /// Where it waits; cleared when it stops waiting.
    fileprivate var queue: TaskQueue?

    public init(worker: String, kinds: Set<String>?, maxTasks: Int, milliseconds: UInt64,
                onGrant: @escaping ([TaskRecord]) -> Void) {
        self.worker = worker
        self.kinds = kinds
        self.maxTasks = maxTasks
        self.milliseconds = milliseconds
        self.onGrant = onGrant
    }
}

/// Leasing is dispatch for a queue whose tasks workers run: it takes queued tasks in the
/// queue's order, within its concurrency limit and pause switch. Expiry is a timer per lease;
/// a lease ends with its attempt (`settle`, `retry`), on release, or when it expires.
extension Engine {
    /// Leases up to `request.maxTasks` tasks of queue `name` to a worker; they are `running`
    /// under fresh leases when this returns. When none can be leased now and `waiting`, the
    /// request waits behind earlier ones, and `onGrant` gets the tasks once some can be leased
    /// (after their events are published); `withdraw` it when the caller stops waiting.
    public func lease(_ request: LeaseRequest, from name: String, waiting: Bool) throws(EngineError) -> [TaskRecord] {
        guard let queue = queues[name] else { throw EngineError(.notFound, "No queue \(name).") }
        guard queue.dispatch == .workers else {
            throw EngineError(.notLeasable, "Queue \(name) is dispatched by the server; PATCH it with dispatch: workers to lease its tasks.")
        }
        return settling {
            let tasks = halted ? [] : take(from: queue, for: request)
            if tasks.isEmpty && waiting {
                request.isWaiting = true
                request.queue = queue
                queue.lessees.append(request)
                queue.waitingLessees += 1
            }
            return tasks
        }
    }

    /// A waiting lease call gives up (its time passed, or its client went away).
    public func withdraw(_ request: LeaseRequest) {
        guard request.isWaiting, let queue = request.queue else { return }
        request.isWaiting = false
        request.queue = nil
        queue.waitingLessees -= 1
        // Withdrawn calls leave the line when they reach its head; a line of mostly withdrawn
        // calls is compacted so that it cannot grow without bound.
        if queue.lessees.count > 2 * queue.waitingLessees + 64 { queue.lessees.removeAll { !$0.isWaiting } }
    }

    /// Extends the lease of task `id` by `milliseconds` (else by the length it was granted
    /// with), after applying `progress`. Throws `leaseLost` unless `token` is its current lease.
    @discardableResult
    public func heartbeat(_ id: TaskID, token: String?, milliseconds: UInt64? = nil,
                          progress: ExternalReport? = nil) throws(EngineError) -> TaskRecord {
        let record = try existing(id)
        let lease = try currentLease(of: record, token: token)
        settling {
            lease.expiresAt = scheduler.wallClock + Int64(clamping: milliseconds ?? lease.milliseconds)
            armExpiry(of: lease, on: record)
            if case .progress(let fraction, let message, let details)? = progress, let run = record.run {
                _ = progressSettling(run, fraction: fraction, message: message, details: details)
            }
            emit(.leaseRenewed(record))
        }
        return record
    }

    /// A worker hands task `id` back: it is `queued` again at its place, its attempt not
    /// consumed (a cancellation under way completes instead).
    @discardableResult
    public func release(_ id: TaskID, token: String?) throws(EngineError) -> TaskRecord {
        let record = try existing(id)
        _ = try currentLease(of: record, token: token)
        settling {
            record.queue.leaseCounts.released += 1
            if record.cancelRequested {
                finish(record, as: .cancelled, error: .cancelled)
            } else {
                endLease(of: record)
                record.attemptTimer?.cancel()
                record.attemptTimer = nil
                record.run = nil
                transition(record, to: .queued)
                record.queue.enqueue(record)
                needsDispatch(record.queue)
            }
            dispatch()
        }
        return record
    }

    /// A worker's report on a leased task: progress, success or failure of its attempt.
    func reportLeased(_ report: ExternalReport, on record: TaskRecord, token: String?) throws(EngineError) {
        _ = try currentLease(of: record, token: token)
        guard let run = record.run else { return }
        settling {
            switch report {
            case .progress(let fraction, let message, let details):
                _ = progressSettling(run, fraction: fraction, message: message, details: details)
            case .complete(let result):
                attemptSucceeded(run, result: result)
            case .fail(let error):
                attemptFailed(run, error: error)
            }
        }
    }

    // MARK: inside the engine

    func existing(_ id: TaskID) throws(EngineError) -> TaskRecord {
        guard let record = tasks[id] else { throw EngineError(.notFound, "No task \(id).") }
        return record
    }

    func currentLease(of record: TaskRecord, token: String?) throws(EngineError) -> Lease {
        guard let lease = record.lease else {
            throw EngineError(.leaseLost, "Task \(record.id) is \(record.state.rawValue) and under no lease "
                              + "(it expired, was released, or the task ended).")
        }
        guard let token else {
            throw EngineError(.leaseLost, "Task \(record.id) is leased; its reports need their lease_token.")
        }
        guard Self.constantTimeEqual(token, lease.token) else {
            throw EngineError(.leaseLost, "That is not the current lease of task \(record.id).")
        }
        return lease
    }

    /// Serves the calls waiting on a worker queue, first come first served, while it has
    /// leasable tasks and room.
    func serveLessees(_ queue: TaskQueue) {
        guard queue.waitingLessees > 0 else { return }
        var served = false
        var index = 0
        while index < queue.lessees.count, !queue.paused, queue.running < queue.maxConcurrency, queue.counts[.queued] > 0 {
            if let bucket = queue.rateBucket, !bucket.hasToken(at: scheduler.now) {
                waitForToken(queue, bucket)
                break
            }
            let request = queue.lessees[index]
            index += 1
            guard request.isWaiting else { continue }
            let tasks = take(from: queue, for: request)
            guard !tasks.isEmpty else { continue }
            request.isWaiting = false
            request.queue = nil
            queue.waitingLessees -= 1
            grants.append((request, tasks))
            served = true
        }
        if served { queue.lessees.removeAll { !$0.isWaiting } }
    }

    /// Answers the waiting calls of a queue that workers no longer lease from: with nothing.
    func dismissLessees(_ queue: TaskQueue) {
        for request in queue.lessees where request.isWaiting {
            request.isWaiting = false
            request.queue = nil
            grants.append((request, []))
        }
        queue.lessees.removeAll()
        queue.waitingLessees = 0
    }

    func deliverGrants() {
        while !grants.isEmpty {
            let ready = grants
            grants = []
            for (request, tasks) in ready { request.onGrant(tasks) }
        }
    }

    /// Takes the best leasable tasks for `request` and starts them under fresh leases.
    private func take(from queue: TaskQueue, for request: LeaseRequest) -> [TaskRecord] {
        var tasks: [TaskRecord] = []
        let bucket = queue.rateBucket
        while tasks.count < request.maxTasks, !queue.paused, queue.running < queue.maxConcurrency {
            if let bucket, !bucket.hasToken(at: scheduler.now) {
                if queue.counts[.queued] > 0 { waitForToken(queue, bucket) }
                return tasks
            }
            guard let record = queue.popForWorkers(of: request.kinds) else { break }
            let now = scheduler.wallClock
            record.lease = Lease(token: newLeaseToken(), worker: request.worker, grantedAt: now,
                                 milliseconds: request.milliseconds, expiresAt: now + Int64(clamping: request.milliseconds))
            leasedCount += 1
            // Its inputs were missing (Engine+Outputs): it failed instead.
            guard start(record) else { continue }
            if let bucket { tookToken(queue, bucket, at: scheduler.now) }
            queue.leaseCounts.granted += 1
            tasks.append(record)
        }
        bucket?.throttled = false
        return tasks
    }

    func armExpiry(of lease: Lease, on record: TaskRecord) {
        lease.expiry?.cancel()
        let delay = UInt64(max(0, lease.expiresAt - scheduler.wallClock))
        // Strong captures (a weak one gives the record a side table, and slows every retain of
        // it): ending the lease cancels the timer, which lets the closure go.
        lease.expiry = scheduler.schedule(after: delay) { [link, record, lease] in
            guard let engine = link.engine, record.lease === lease, let run = record.run else { return }
            engine.settling {
                let queue = record.queue
                queue.leaseCounts.expired += 1
                if !record.cancelRequested && record.attempt >= record.retry.maxAttempts { queue.leaseCounts.poisoned += 1 }
                engine.attemptFailed(run, error: TaskError(
                    code: "lease_expired", message: "Worker \(lease.worker) did not renew its lease in time.",
                    details: ["worker": .string(lease.worker)]))
            }
        }
    }

    func endLease(of record: TaskRecord) {
        record.lease?.expiry?.cancel()
        record.lease = nil
        leasedCount -= 1
    }

    /// After a restart: a task that was running under a lease keeps it until it expires (its
    /// worker may still be at it); its timeout and a cancellation under way go on from wall time.
    func resumeLease(of record: TaskRecord, _ lease: Lease) {
        record.lease = lease
        leasedCount += 1
        let run = TaskRun(link: link, record: record)
        run.stopGraceMilliseconds = lease.milliseconds
        record.run = run
        let now = scheduler.wallClock
        if let timeout = record.timeoutMilliseconds {
            armTimeout(timeout, for: run, on: record, after: UInt64(max(0, lease.grantedAt + Int64(clamping: timeout) - now)))
        }
        if record.cancelRequested { armCancelGrace(on: record, after: lease.milliseconds) }
        armExpiry(of: lease, on: record)
    }

    /// 128 random bits as 32 hex digits.
    private func newLeaseToken() -> String {
        Hex.encode(leaseTokens.take(16))
    }

    /// Compares without an early exit, so the time taken says nothing about the token.
    static func constantTimeEqual(_ given: String, _ expected: String) -> Bool {
        // On the strings' own bytes: copying them into arrays cost two allocations a report.
        var given = given, expected = expected
        return given.withUTF8 { given in
            expected.withUTF8 { expected in
                var difference = UInt8(given.count == expected.count ? 0 : 1)
                for index in expected.indices { difference |= expected[index] ^ (index < given.count ? given[index] : 0) }
                return difference == 0
            }
        }
    }
}
