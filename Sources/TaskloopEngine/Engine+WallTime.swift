/// Tasks that wait for a wall-clock time: `run_at`/`delay_ms` (the `scheduled` state) and
/// expiry (`expires_at`/`ttl_ms`). Their deadlines sit in `wallTimers`, and one monotonic
/// timer wakes the engine at the earliest, or after `wallClockCheckMilliseconds` at most, so a
/// wall clock set forward is noticed within that (one set back: the deadline is not yet due
/// when the timer fires, and the timer is armed again).
extension Engine {
    /// The end of `register`: a task whose time has not come waits `scheduled`; one that may
    /// expire gets its deadline.
    func waitForTime(_ record: TaskRecord) {
        let wallClock = scheduler.wallClock
        if let expiresAt = record.expiresAt { wallTimers.insert(record, at: expiresAt, for: .expiry) }
        if let scheduledFor = record.scheduledFor, scheduledFor > wallClock {
            transition(record, to: .scheduled)
            wallTimers.insert(record, at: scheduledFor, for: .start)
        }
        if record.expiresAt != nil || record.state == .scheduled { armWallTimer() }
    }

    /// After an explicit retry or a dependency's retry reopened `record` (now `pending`): its
    /// time, if still to come, holds it again, and so does an expiry still to come; one that
    /// passed is cleared (the task was brought back on purpose).
    func waitForTimeAgain(_ record: TaskRecord) {
        let wallClock = scheduler.wallClock
        var armed = false
        if let expiresAt = record.expiresAt, record.startedAt == nil {
            if expiresAt > wallClock {
                wallTimers.insert(record, at: expiresAt, for: .expiry)
                armed = true
            } else {
                record.expiresAt = nil
            }
        }
        if let scheduledFor = record.scheduledFor, scheduledFor > wallClock {
            transition(record, to: .scheduled)
            wallTimers.insert(record, at: scheduledFor, for: .start)
            armed = true
        }
        if armed { armWallTimer() }
    }

    /// After a restart: the deadlines of the restored unfinished tasks. A time that passed while
    /// the server was down is due at once: before anything restored starts, so a task that
    /// expired meanwhile never does.
    func restoreWallTimers(of records: [TaskRecord]) {
        for record in records where !record.state.isTerminal {
            if let expiresAt = record.expiresAt, record.startedAt == nil { wallTimers.insert(record, at: expiresAt, for: .expiry) }
            if record.state == .scheduled, let scheduledFor = record.scheduledFor {
                wallTimers.insert(record, at: scheduledFor, for: .start)
            }
        }
        fireDueWallTimers()
        armWallTimer()
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
