/// Retention: terminal tasks are kept for a while, then forgotten oldest first.
///
/// `retained` lists terminal tasks in the order they finished. A task that an explicit retry
/// brings back leaves a stale entry behind (counted in its `staleRetentionEntries`), skipped
/// when it surfaces and not counted against `maxRetainedTasks`. A task's stale entries are
/// older than its live one, so the first of its entries to surface are the stale ones. An
/// entry is its record alone: 8 bytes of every retained task, where one with an epoch took 16.

extension Engine {
    func retain(_ record: TaskRecord) {
        retained.append(record)
        while retained.count - staleRetained > configuration.maxRetainedTasks, let oldest = popRetained() {
            evict(oldest)
        }
        scheduleRetentionSweep()
    }

    /// The oldest live entry's task, removed (stale entries before it go too).
    private func popRetained() -> TaskRecord? {
        while let record = retained.popFirst() {
            if !skipsStale(record) { return record }
        }
        return nil
    }

    /// The oldest live entry's task, stale entries before it dropped.
    private func oldestRetained() -> TaskRecord? {
        while let record = retained.first {
            if record.staleRetentionEntries == 0 { return record }
            retained.removeFirst()
            _ = skipsStale(record)
        }
        return nil
    }

    /// A terminal task is brought back by a retry: its entry goes stale.
    func unretain(_ record: TaskRecord) {
        record.staleRetentionEntries += 1
        staleRetained += 1
    }

    /// Whether `record`'s entry, just taken off `retained`, was a stale one (now dropped).
    private func skipsStale(_ record: TaskRecord) -> Bool {
        guard record.staleRetentionEntries > 0 else { return false }
        record.staleRetentionEntries -= 1
        staleRetained -= 1
        return true
    }

    func scheduleRetentionSweep() {
        guard retentionTimer == nil, let oldest = oldestRetained() else { return }
        let due = oldest.finishedAtMonotonic + Int64(configuration.retentionMilliseconds)
        let now = Int64(scheduler.now)
        retentionTimer = scheduler.schedule(after: due > now ? UInt64(due - now) : 0) { [link] in
            guard let engine = link.engine else { return }
            engine.settling { engine.sweepRetained() }
        }
    }

    func sweepRetained() {
        retentionTimer = nil
        let now = Int64(scheduler.now)
        while let oldest = oldestRetained(), oldest.finishedAtMonotonic + Int64(configuration.retentionMilliseconds) <= now {
            retained.removeFirst()
            evict(oldest)
        }
        scheduleRetentionSweep()
    }

    func evict(_ record: TaskRecord) {
        tasks.remove(record.id)
        if record.uniqueKey != nil { forgetUniqueKey(of: record) }
        if cell != nil {
            dropRemoteReferences(of: record)
            forgetHostedMember(record)
        }
        record.queue.count(record.state, -1)
        if isIdle(record.queue) { forget(record.queue) }
        var workflowEmptied = false
        if let workflow = record.workflow {
            workflow.evicted(record)
            if workflow.isSpent {
                workflows.removeValue(forKey: workflow.id)
                workflowEmptied = true
            }
        }
        emit(.evicted(record, workflowEmptied: workflowEmptied))
    }
}
