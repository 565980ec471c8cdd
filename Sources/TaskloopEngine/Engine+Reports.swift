import TaskloopJSON

/// What running work reports (progress, success, failure and retries, cancellation), and
/// what outside workers report for `external` tasks.
extension Engine {
    func attemptProgressed(_ run: TaskRun, fraction: Double?, message: String?, details: JSONValue?) -> Bool {
        settling { progressSettling(run, fraction: fraction, message: message, details: details) }
    }

    func progressSettling(_ run: TaskRun, fraction: Double?, message: String?, details: JSONValue?) -> Bool {
        let record = run.record
        guard run.isCurrent, record.state == .running else { return false }
        if let fraction, fraction.isFinite {
            let clamped = min(1, max(0, fraction))
            let before = record.progress.fraction
            record.progress.fraction = max(before ?? 0, clamped)
            if cell != nil && record.progress.fraction != before { reportToHome(record) }
        }
        if let message { record.progress.message = message }
        if let details { record.progress.details = details }
        record.progress.updatedAt = scheduler.wallClock
        emit(.progressed(record))
        return true
    }

    func attemptSucceeded(_ run: TaskRun, result: JSONValue?) {
        guard run.isCurrent, run.record.state == .running else { return }
        settling {
            run.record.progressSucceeded(at: scheduler.wallClock)
            finish(run.record, as: .succeeded, result: result)
            dispatch()
        }
    }

    func attemptFailed(_ run: TaskRun, error: TaskError) {
        let record = run.record
        guard run.isCurrent, record.state == .running else { return }
        settling {
            if record.cancelRequested {
                finish(record, as: .cancelled, error: .cancelled)
            } else if record.attempt < record.retry.maxAttempts {
                retry(record, after: error)
            } else {
                finish(record, as: .failed, error: error)
            }
            dispatch()
        }
    }

    func attemptCancelled(_ run: TaskRun) {
        guard run.isCurrent, run.record.state == .running else { return }
        settling {
            finish(run.record, as: .cancelled, error: .cancelled)
            dispatch()
        }
    }

    /// Back to `pending` for the backoff, then `queued` again with the next attempt number.
    func retry(_ record: TaskRecord, after error: TaskError) {
        record.run = nil
        if record.lease != nil { endLease(of: record) }
        record.attemptTimer?.cancel()
        record.error = error
        transition(record, to: .pending)
        needsDispatch(record.queue)
        let delay = record.retry.backoff(after: record.attempt)
        record.attempt += 1
        record.notBefore = scheduler.wallClock + Int64(clamping: delay)
        scheduleRetry(record, after: delay)
    }

    /// Makes `record` (pending for a retry's backoff) ready after `delay`.
    func scheduleRetry(_ record: TaskRecord, after delay: UInt64) {
        record.attemptTimer = scheduler.schedule(after: delay) { [link, weak record] in
            guard let engine = link.engine, let record, record.state == .pending else { return }
            engine.settling {
                record.attemptTimer = nil
                record.notBefore = nil
                engine.makeReady(record)
                engine.dispatch()
            }
        }
    }

    /// A worker's report on an `external` task. Throws `notRunning` when the task is not a
    /// running external task, or when its cancellation was requested (the worker learns of it
    /// this way, and the task is then cancelled).
    /// A report on a leased task (of any kind) needs the lease's token instead, and is fenced
    /// by it (`leaseLost`).
    public func report(_ report: ExternalReport, for id: TaskID, leaseToken: String? = nil) throws(EngineError) {
        let record = try existing(id)
        if record.lease != nil || leaseToken != nil { return try reportLeased(report, on: record, token: leaseToken) }
        guard let executor = executors[record.kind] as? ExternalExecutor else {
            throw EngineError(.notRunning, "Task \(id) is of kind \(record.kind), not external.")
        }
        guard record.state == .running, let run = record.run else {
            throw EngineError(.notRunning, "Task \(id) is \(record.state.rawValue), not running.")
        }
        if record.cancelRequested {
            settling {
                finish(record, as: .cancelled, error: .cancelled)
                dispatch()
            }
            throw EngineError(.notRunning, "Task \(id) was cancelled; stop working on it.")
        }
        settling { executor.report(report, for: run) }
    }
}
