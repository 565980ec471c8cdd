/// Retention: terminal tasks are kept for a while, then forgotten oldest first.
extension Engine {
    func retain(_ record: TaskRecord) {
        retained.append(record)
        while retained.count > configuration.maxRetainedTasks, let oldest = retained.popFirst() {
            evict(oldest)
        }
        scheduleRetentionSweep()
    }

    func scheduleRetentionSweep() {
        guard retentionTimer == nil, let oldest = retained.first else { return }
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
        while let oldest = retained.first, oldest.finishedAtMonotonic + Int64(configuration.retentionMilliseconds) <= now {
            retained.removeFirst()
            evict(oldest)
        }
        scheduleRetentionSweep()
    }

    func evict(_ record: TaskRecord) {
        tasks.remove(record.id)
        record.queue.count(record.state, -1)
        if isIdle(record.queue) { forget(record.queue) }
        var workflowEmptied = false
        if let workflow = record.workflow {
            workflow.evicted(record)
            if workflow.tasks.isEmpty {
                workflows.removeValue(forKey: workflow.id)
                workflowEmptied = true
            }
        }
        emit(.evicted(record, workflowEmptied: workflowEmptied))
    }
}
