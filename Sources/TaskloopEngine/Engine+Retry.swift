/// Explicit retry: the one way a terminal state changes. A failed or cancelled task gets a new
/// attempt, and the dependents that were cancelled because of it (`dependency_failed`, naming
/// it, and so on down the chain) wait for it again.
extension Engine {
    /// Retries a failed or cancelled task: attempt + 1 (`max_attempts` raised to allow it),
    /// `queued`, or `pending` while dependencies are unfinished. Throws `notRetryable` in any
    /// other state, and changes nothing when the unfinished-task limit would be passed.
    @discardableResult
    public func retryTask(_ id: TaskID) throws(EngineError) -> TaskRecord {
        let record = try existing(id)
        guard record.state == .failed || record.state == .cancelled else {
            throw EngineError(.notRetryable, "Task \(id) is \(record.state.rawValue); only failed or cancelled tasks can be retried.")
        }
        try reopen([record])
        return record
    }

    /// Retries every failed or cancelled task of a workflow, as `retryTask` does; returns how
    /// many tasks left a terminal state (dependents brought back included). With cells, the
    /// member cells are told to retry theirs, and the count can only be what this cell knows:
    /// its own tasks brought back, plus the remote members last reported failed or cancelled
    /// (not their dependents there). Those remote members count as reported until their cells
    /// report them brought back.
    public func retryWorkflow(_ id: TaskID) throws(EngineError) -> Int {
        guard let workflow = workflows[id] else { throw EngineError(.notFound, "No workflow \(id).") }
        let retried = workflow.tasks.filter { $0.state == .failed || $0.state == .cancelled }
        guard !workflow.remoteMembers.isEmpty else { return try reopen(retried) }
        let dependents = cancelledDependents(of: retried.map(\.id))
        try checkUniqueKeys(ofReopened: retried + dependents)
        try admit(retried.count + dependents.count)
        return settling {
            // First: a member there cancelled by one of these is retried as a member, as on one engine.
            tellMemberCells(of: workflow, .retryMembers)
            if !retried.isEmpty { bringBack(retried, dependents: dependents) }
            return retried.count + dependents.count
                + workflow.remoteMembers.count { $0.state == .failed || $0.state == .cancelled }
        }
    }

    /// Brings `retried` back with new attempts, and their `dependency_failed` dependents with
    /// them, in one settled call.
    @discardableResult
    private func reopen(_ retried: [TaskRecord]) throws(EngineError) -> Int {
        guard !retried.isEmpty else { return 0 }
        let dependents = cancelledDependents(of: retried.map(\.id))
        try checkUniqueKeys(ofReopened: retried + dependents)
        try admit(retried.count + dependents.count)
        settling { bringBack(retried, dependents: dependents) }
        return retried.count + dependents.count
    }

    /// Reopens `retried` (new attempts) and `dependents` (their cancellations undone), after
    /// noting the tasks that the reopened ones, or `reopenedElsewhere` (a dependency in
    /// another cell: Engine+Cells), had released. All are reopened before any is linked to its
    /// dependencies (inside a workflow a task may depend on a later sibling), so links among
    /// them wait.
    func bringBack(_ retried: [TaskRecord], dependents: [TaskRecord], reopenedElsewhere: TaskID? = nil) {
        let explicit = Set(retried.map { ObjectIdentifier($0) })
        let all = (retried + dependents).sorted { $0.sequence < $1.sequence }
        let wasDispatching = dispatching
        dispatching = true
        var reopenedIDs = Set(all.map(\.id))
        if let reopenedElsewhere { reopenedIDs.insert(reopenedElsewhere) }
        noteReleasedDependents(of: reopenedIDs)
        for record in all { reopenOne(record, newAttempt: explicit.contains(ObjectIdentifier(record))) }
        for record in all where !record.state.isTerminal { relink(record) }
        for record in all where record.state == .pending && (record.scheduledFor != nil || record.expiresAt != nil) {
            waitForTime(record, .reopened)
        }
        for record in all where record.state == .pending && record.blockingDependencies == 0 { makeReady(record) }
        dispatching = wasDispatching
        dispatch()
    }

    private func reopenOne(_ record: TaskRecord, newAttempt: Bool) {
        let from = record.state
        unretain(record)
        record.queue.count(from, -1)
        record.queue.count(.pending, 1)
        if let workflow = record.workflow {
            workflow.counts[from] -= 1
            workflow.counts[.pending] += 1
        }
        record.state = .pending
        unfinishedCount += 1
        if newAttempt {
            record.attempt += 1
            record.retry.maxAttempts = max(record.retry.maxAttempts, record.attempt)
        } else {
            // It never ran for this failure: its cancellation by the dependency is undone.
            record.error = nil
        }
        record.cancelRequested = false
        record.finishedAt = nil
        record.result = nil
        record.notBefore = nil
        record.progress = TaskProgress()
        record.resolvedParams = nil
        emit(.stateChanged(record, from: from, to: .pending))
        record.blockingDependencies = 0
        record.releasedBy = []
        record.reopenings &+= 1
        if record.uniqueKey != nil { claimUniqueKey(of: record) }
        if cell != nil {
            tellWatchers(of: record, .reopened)
            reportToHome(record)
        }
    }

    /// Unfinished tasks that `reopened` released when they ended go on without waiting for
    /// them again; each notes which, so its waits can be rebuilt from records (a replica, a
    /// restart) rather than from the lists of dependents, which say it only here.
    /// (A task still waiting on a dependency in another cell had not been released by it.)
    private func noteReleasedDependents(of ids: Set<TaskID>) {
        for case let record? in tasks.entries where !record.state.isTerminal && !record.dependencies.isEmpty {
            let released = record.dependencies.filter {
                ids.contains($0) && !record.releasedBy.contains($0) && !(remoteDependencies[$0]?.holds(record) ?? false)
            }
            guard !released.isEmpty else { continue }
            record.releasedBy += released
            emit(.releasedByRetry(record))
        }
    }

    /// Waits on the dependencies again. A task cancelled while a dependency was unfinished is
    /// still on that dependency's list of dependents: it is counted, not added twice.
    private func relink(_ record: TaskRecord) {
        for id in record.dependencies where !record.state.isTerminal {
            if let dependency = tasks[id] {
                if !dependency.state.isTerminal && dependency.dependents.contains(where: { $0 === record }) {
                    record.blockingDependencies += 1
                } else {
                    link(record, to: dependency)
                }
            } else if let standIn = remoteDependencies[id] {
                if standIn.holds(record) { record.blockingDependencies += 1 } else { link(record, toRemote: standIn) }
            }
        }
    }

    /// Tasks cancelled with `dependency_failed` naming one of `roots`, or, transitively, one of
    /// those: found by one walk over the tasks (terminal tasks keep no list of dependents).
    func cancelledDependents(of roots: [TaskID]) -> [TaskRecord] {
        var byDependency: [TaskID: [TaskRecord]] = [:]
        for case let record? in tasks.entries where record.state == .cancelled && record.error?.code == "dependency_failed" {
            if case .string(let text)? = record.error?.details["dependency"], let dependency = TaskID(text) {
                byDependency[dependency, default: []].append(record)
            }
        }
        guard !byDependency.isEmpty else { return [] }
        var found: [TaskRecord] = []
        var seen = Set(roots)
        var work = roots
        while let id = work.popLast() {
            for dependent in byDependency[id] ?? [] where seen.insert(dependent.id).inserted {
                found.append(dependent)
                work.append(dependent.id)
            }
        }
        return found
    }
}
