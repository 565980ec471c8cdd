/// Cancelling: at once for waiting tasks; through the executor, within a grace, for running ones.
extension Engine {
    /// Cancels a task: at once if it has not started; a running task is asked to stop and
    /// becomes `cancelled` when its executor confirms, or when the grace period ends.
    @discardableResult
    public func cancel(_ id: TaskID) throws(EngineError) -> CancelOutcome {
        guard let record = tasks[id] else { throw EngineError(.notFound, "No task \(id).") }
        guard !record.state.isTerminal else {
            throw EngineError(.alreadyTerminal, "Task \(id) already \(record.state.rawValue).")
        }
        return settling {
            let outcome = requestCancel(record)
            dispatch()
            return outcome
        }
    }

    func requestCancel(_ record: TaskRecord) -> CancelOutcome {
        switch record.state {
        case .scheduled, .pending, .queued:
            finish(record, as: .cancelled, error: .cancelled)
            return .cancelled
        case .running:
            if !record.cancelRequested {
                record.cancelRequested = true
                emit(.cancelRequested(record))
                armCancelGrace(on: record, after: record.run?.stopGraceMilliseconds ?? configuration.cancelGraceMilliseconds)
                record.run?.requestStop()
            }
            return record.state == .cancelled ? .cancelled : .cancelRequested
        case .succeeded, .failed, .cancelled:
            return .cancelled
        }
    }

    /// Finishes a task whose cancellation was requested after `grace`, confirmed or not.
    func armCancelGrace(on record: TaskRecord, after grace: UInt64) {
        record.graceTimer = scheduler.schedule(after: grace) { [link, weak record] in
            guard let engine = link.engine, let record, record.state == .running else { return }
            engine.settling {
                engine.finish(record, as: .cancelled, error: TaskError(
                    code: "cancelled", message: "The task was cancelled; its work did not confirm within the grace period."))
                engine.dispatch()
            }
        }
    }

    /// Cancels every unfinished task of a queue, dependents first; returns how many.
    @discardableResult
    public func cancelAll(inQueue name: String) -> Int {
        guard let queue = queues[name] else { return 0 }
        guard queue.counts.unfinished > 0 else { return 0 }
        return settling {
            var count = 0
            // Nothing starts meanwhile: a running task that confirms its cancellation at once
            // would otherwise make room for one of those still to be cancelled.
            let wasDispatching = dispatching
            dispatching = true
            // Newest first: a dependent is cancelled as such, not as a cascade of its dependency.
            for case let record? in tasks.entries.reversed() where record.queue === queue && !record.state.isTerminal {
                _ = requestCancel(record)
                count += 1
            }
            dispatching = wasDispatching
            dispatch()
            return count
        }
    }

    /// Cancels `records` (in creation order) newest first, as `cancelAll(inQueue:)` does.
    func cancelAll(_ records: [TaskRecord]) -> Int {
        settling {
            var count = 0
            let wasDispatching = dispatching
            dispatching = true
            for record in records.reversed() where !record.state.isTerminal {
                _ = requestCancel(record)
                count += 1
            }
            dispatching = wasDispatching
            dispatch()
            return count
        }
    }
}
