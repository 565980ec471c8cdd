/// Tasks that wait for a wall-clock time: `run_at`/`delay_ms` (the `scheduled` state) and
/// expiry (`expires_at`/`ttl_ms`). Their deadlines sit in `wallTimers`, and one monotonic
/// timer wakes the engine at the earliest, or after `wallClockCheckMilliseconds` at most, so a
/// wall clock set forward is noticed within that (one set back: the deadline is not yet due
/// when the timer fires, and the timer is armed again).
extension Engine {
    /// How a task's deadlines come into `wallTimers`.
    enum WallTimeEntry {
        /// The end of `register`: the task is `pending`.
        case registered
        /// An explicit retry or a dependency's retry reopened the task (now `pending`).
        case reopened
        /// After a restart: the task is as it was saved.
        case restored
    }

    /// Puts `record`'s deadlines in `wallTimers` and arms the timer if any went in. Whether
    /// registered, reopened or restored, a task that has not started keeps its expiry and one
    /// that waits `scheduled` its start; a `pending` task whose time is still to come waits
    /// `scheduled` again (a restored one is as it was saved: its time passed while it was
    /// `pending` only if the clock was set back). An expiry that passed is due at once, except a
    /// reopened task's, which is cleared: the task was brought back on purpose.
    func waitForTime(_ record: TaskRecord, _ entry: WallTimeEntry) {
        if insertWallTimers(of: record, entry) { armWallTimer() }
    }

    /// After a restart: the deadlines of the restored unfinished tasks. A time that passed while
    /// the server was down is due at once: before anything restored starts, so a task that
    /// expired meanwhile never does.
    func restoreWallTimers(of records: [TaskRecord]) {
        for record in records where !record.state.isTerminal { insertWallTimers(of: record, .restored) }
        fireDueWallTimers()
        armWallTimer()
    }

    /// `waitForTime` without arming the timer; returns whether a deadline went in.
    @discardableResult
    private func insertWallTimers(of record: TaskRecord, _ entry: WallTimeEntry) -> Bool {
        let wallClock = scheduler.wallClock
        var inserted = false
        if let expiresAt = record.expiresAt, record.startedAt == nil {
            if entry == .reopened && expiresAt <= wallClock {
                record.expiresAt = nil
            } else {
                wallTimers.insert(record, at: expiresAt, for: .expiry)
                inserted = true
            }
        }
        if let scheduledFor = record.scheduledFor {
            if entry != .restored && scheduledFor > wallClock { transition(record, to: .scheduled) }
            if record.state == .scheduled {
                wallTimers.insert(record, at: scheduledFor, for: .start)
                inserted = true
            }
        }
        return inserted
    }

    /// Arms the one timer for the earliest deadline, unless it already fires by then.
    func armWallTimer() {
        if wallTimers.count > 1_024 && wallTimers.count > 4 * unfinishedCount { dropStaleWallTimers() }
        guard let deadline = wallTimers.nextDeadline else {
            wallTimer?.cancel()
            wallTimer = nil
            return
        }
        // At least 1 ms: libuv runs a timer armed for 0 ms from a timer callback in the same pass.
        let wait = UInt64(max(1, min(deadline - scheduler.wallClock, Int64(configuration.wallClockCheckMilliseconds))))
        let firesAt = scheduler.now + wait
        if wallTimer != nil && wallTimerFiresAt <= firesAt { return }
        wallTimer?.cancel()
        wallTimerFiresAt = firesAt
        wallTimer = scheduler.schedule(after: wait) { [link] in
            guard let engine = link.engine else { return }
            engine.wallTimer = nil
            engine.settling { engine.fireDueWallTimers() }
            engine.armWallTimer()
        }
    }

    func fireDueWallTimers() {
        let wallClock = scheduler.wallClock
        let wasDispatching = dispatching
        dispatching = true
        while let entry = wallTimers.popDue(at: wallClock) {
            let record = entry.record
            switch entry.purpose {
            case .start:
                guard record.state == .scheduled else { continue }
                transition(record, to: .pending)
                if record.blockingDependencies == 0 { makeReady(record) }
            case .expiry:
                guard !record.state.isTerminal, record.startedAt == nil, record.expiresAt == entry.deadline else { continue }
                finish(record, as: .cancelled, error: .expired(at: entry.deadline))
            }
        }
        while let entry = wallTimers.popDueSchedule(at: wallClock) {
            fire(entry.schedule, slot: entry.slot, at: wallClock)
        }
        dispatching = wasDispatching
        dispatch()
    }

    /// Whether `record` is cancelled as expired rather than started: its expiry came, and the
    /// timer has not fired yet (it fires in the same millisecond, after a start, or up to
    /// `wallClockCheckMilliseconds` late when the wall clock was set forward).
    func expiresInsteadOfStarting(_ record: TaskRecord) -> Bool {
        guard let expiresAt = record.expiresAt, record.startedAt == nil, scheduler.wallClock >= expiresAt else { return false }
        finish(record, as: .cancelled, error: .expired(at: expiresAt))
        return true
    }

    /// Entries whose tasks moved on (cancelled, started, forgotten) go all at once when they
    /// outnumber what can still be live (two per unfinished task), so submitting and
    /// cancelling far-off tasks does not grow the heap without end.
    private func dropStaleWallTimers() {
        wallTimers.removeAll { entry in
            let record = entry.record
            switch entry.purpose {
            case .start: return record.state != .scheduled
            case .expiry: return record.state.isTerminal || record.startedAt != nil
            }
        }
    }
}
