/// What a store needs from the engine: plain snapshots of the records a settled batch names,
/// and, after a restart, the engine rebuilt from the snapshots it kept.
extension Engine {
    public func snapshot(of record: TaskRecord) -> TaskSnapshot {
        TaskSnapshot(
            id: record.id, sequence: record.sequence, kind: record.kind, params: record.params, name: record.name,
            queue: record.queue.name, priority: record.priority, dependencies: record.dependencies,
            onDependencyFailure: record.onDependencyFailure, timeoutMilliseconds: record.timeoutMilliseconds,
            retry: record.retry, metadata: record.metadata,
            workflow: record.workflow?.id ?? (cell == nil ? nil : workflowOfMember[record.id]), createdAt: record.createdAt,
            state: record.state, cancelRequested: record.cancelRequested, attempt: record.attempt,
            startedAt: record.startedAt, finishedAt: record.finishedAt, result: record.result, error: record.error,
            progress: record.progress, notBefore: record.notBefore,
            lease: record.lease.map {
                LeaseSnapshot(token: $0.token, worker: $0.worker, grantedAt: $0.grantedAt, milliseconds: $0.milliseconds,
                              expiresAt: $0.expiresAt)
            },
            releasedBy: record.releasedBy, watchers: cell == nil ? [] : watchers(of: record), reopenings: record.reopenings,
            scheduledFor: record.scheduledFor, expiresAt: record.expiresAt, inputs: record.inputs,
            resolvedParams: record.resolvedParams, uniqueKey: record.uniqueKey, uniqueForMilliseconds: record.uniqueForMilliseconds,
            concurrencyKey: record.concurrencyKey, schedule: record.schedule)
    }

    public func snapshot(of workflow: WorkflowRecord) -> WorkflowSnapshot {
        WorkflowSnapshot(id: workflow.id, name: workflow.name, createdAt: workflow.createdAt,
                         keys: workflow.keys.map { WorkflowSnapshot.WorkflowKey(key: $0.key, id: $0.id) },
                         remoteMembers: workflow.remoteMembers, schedule: workflow.schedule)
    }

    public func snapshot(of queue: TaskQueue) -> QueueSnapshot {
        QueueSnapshot(name: queue.name, maxConcurrency: queue.maxConcurrency, paused: queue.paused, dispatch: queue.dispatch,
                      keyConcurrency: queue.keyConcurrency, rateLimit: queue.rateLimit)
    }

    /// Rebuilds a new engine (one nothing was submitted to) from what a store kept, ids and
    /// order unchanged, then lets it go on:
    /// - `pending` and `queued` tasks wait and run as before; a retry's backoff resumes from
    ///   wall time (one that elapsed while the server was down ends at once);
    /// - a task that was `running` lost its attempt with the process: a cancellation under way
    ///   completes, anything else ends the attempt as `interrupted` under the retry policy;
    ///   unless a worker leased it: it keeps its lease (and token) until that expires;
    /// - terminal tasks are retained by their finishing time, and those past retention go;
    /// - unique keys are held as before, by the records and `savedUniqueKeys` (Engine+Unique);
    /// - schedules go on after their `lastSlot`, slots missed while down by their `catchup`
    ///   (Engine+Schedules).
    /// - queues keep their settings; a rate limit starts with a full bucket (Engine+RateLimits).
    /// What this changes reaches observers as one settled batch, like any call. Throws, having
    /// changed nothing, when a task's kind has no executor on this server.
    public func restore(queues savedQueues: [QueueSnapshot], workflows savedWorkflows: [WorkflowSnapshot],
                        tasks savedTasks: [TaskSnapshot], uniqueKeys savedUniqueKeys: [UniqueKeyTombstone] = [],
                        schedules savedSchedules: [ScheduleSnapshot] = []) throws(EngineError) {
        precondition(tasks.count == 0 && workflows.isEmpty, "restore needs a new engine")
        var kindsByTask: [TaskKind] = []
        kindsByTask.reserveCapacity(savedTasks.count)
        let ordered = savedTasks.sorted { $0.sequence < $1.sequence }
        for saved in ordered {
            guard let kind = taskKind(named: saved.kind) else {
                throw EngineError(.unknownKind, "Task \(saved.id) is of kind \(saved.kind), which this server does not run "
                                  + "(known kinds: \(kinds.joined(separator: ", "))).")
            }
            kindsByTask.append(kind)
        }
        let parsedSchedules = try parsedSchedules(savedSchedules)
        settling {
            for saved in savedQueues {
                let queue = queue(named: saved.name)
                queue.maxConcurrency = saved.maxConcurrency
                queue.paused = saved.paused
                queue.switchDispatch(to: saved.dispatch)
                if saved.keyConcurrency != nil { queue.setKeyConcurrency(saved.keyConcurrency) }
                setRateLimit(saved.rateLimit, of: queue)
            }
            let wallClock = scheduler.wallClock
            var retainedByFinish: [TaskRecord] = []
            var restored: [TaskRecord] = []
            restored.reserveCapacity(ordered.count)
            for (saved, kind) in zip(ordered, kindsByTask) {
                let record = makeRecord(from: saved, kind: kind)
                record.queue.count(saved.state, 1)
                // Counted here rather than by a transition: its key's lane must know it runs.
                if saved.state == .running && record.concurrencyKey != nil { record.queue.restoreRunning(record) }
                restored.append(record)
                // With cells, the id may be a member another cell made (Engine+CellWorkflows).
                if cell == nil { ids.continueAfter(saved.id) } else { ids.continueAfterMillisecond(of: saved.id) }
                sequence = max(sequence, saved.sequence)
                if saved.state.isTerminal {
                    record.finishedAtMonotonic = Int64(scheduler.now) - max(0, wallClock - (saved.finishedAt ?? wallClock))
                    retainedByFinish.append(record)
                } else {
                    unfinishedCount += 1
                }
            }
            // With cells, members other cells made sort by id among this cell's own.
            if cell != nil { restored.sort { $0.id < $1.id } }
            for record in restored { tasks.append(record) }
            restoreUniqueKeys(savedUniqueKeys, records: restored)
            for saved in savedWorkflows { makeWorkflow(from: saved) }
            if cell != nil { restoreHostedMembers(ordered) }
            let unfinished = ordered.compactMap { saved in saved.state.isTerminal ? nil : tasks[saved.id] }
            // Dependencies first, so that what happens next (interruptions, cascades) reaches
            // every dependent; a dependency no longer kept had finished and been released.
            let wasDispatching = dispatching
            dispatching = true
            for record in unfinished {
                for id in record.dependencies where !record.releasedBy.contains(id) {
                    if let dependency = tasks[id] { link(record, to: dependency) }
                }
            }
            if cell != nil { restoreRemoteDependencies(of: ordered.compactMap { tasks[$0.id] }) }
            var savedLeases: [TaskID: LeaseSnapshot] = [:]
            for saved in ordered where saved.state == .running { savedLeases[saved.id] = saved.lease }
            for record in unfinished where !record.state.isTerminal {
                switch record.state {
                case .running:
                    if let saved = savedLeases[record.id] {
                        resumeLease(of: record, Lease(token: saved.token, worker: saved.worker, grantedAt: saved.grantedAt,
                                                      milliseconds: saved.milliseconds, expiresAt: saved.expiresAt))
                    } else if record.executor.runsOutsideTheProcess {
                        resumeOutside(record)
                    } else {
                        interrupt(record)
                    }
                case .queued:
                    record.queue.enqueue(record)
                    needsDispatch(record.queue)
                case .pending:
                    if let notBefore = record.notBefore, notBefore > wallClock {
                        scheduleRetry(record, after: UInt64(notBefore - wallClock))
                    } else if record.blockingDependencies == 0 {
                        record.notBefore = nil
                        makeReady(record)
                    }
                case .scheduled, .succeeded, .failed, .cancelled:
                    break
                }
            }
            // Before the tasks' deadlines fire: a catch-up run sees the previous run as it was.
            restoreSchedules(parsedSchedules)
            restoreWallTimers(of: unfinished)
            retainedByFinish.sort { ($0.finishedAt ?? 0, $0.sequence) < ($1.finishedAt ?? 0, $1.sequence) }
            retained.append(contentsOf: retainedByFinish)
            while retained.count > configuration.maxRetainedTasks, let oldest = retained.popFirst() { evict(oldest) }
            sweepRetained()
            dispatching = wasDispatching
            dispatch()
        }
    }

    /// A task as a store kept it (or another replica wrote it), not yet in the table.
    func makeRecord(from saved: TaskSnapshot, kind: TaskKind) -> TaskRecord {
        let spec = TaskSpec(kind: saved.kind, params: saved.params, name: saved.name, queue: saved.queue,
                            priority: saved.priority, onDependencyFailure: saved.onDependencyFailure,
                            timeoutMilliseconds: saved.timeoutMilliseconds, retry: saved.retry, metadata: saved.metadata,
                            runAt: saved.scheduledFor.map { .at($0) }, expiry: saved.expiresAt.map { .at($0) },
                            uniqueKey: saved.uniqueKey, uniqueForMilliseconds: saved.uniqueForMilliseconds,
                            concurrencyKey: saved.concurrencyKey, schedule: saved.schedule)
        let record = TaskRecord(id: saved.id, sequence: saved.sequence, spec: spec, kind: kind,
                                queue: queue(named: saved.queue), dependencies: saved.dependencies, createdAt: saved.createdAt)
        copy(saved, into: record)
        return record
    }

    /// What a snapshot holds beyond its spec (the retry policy came with it), onto the record
    /// just made from it. Fields left at their defaults, most of a queued task's, are not set:
    /// each setter of a boxed field looks at its box first (a restart of 50,000 tasks spent
    /// ~900 instructions a task here).
    private func copy(_ saved: TaskSnapshot, into record: TaskRecord) {
        record.state = saved.state
        record.cancelRequested = saved.cancelRequested
        record.attempt = saved.attempt
        record.startedAt = saved.startedAt
        record.finishedAt = saved.finishedAt
        if saved.result != nil { record.result = saved.result }
        if saved.error != nil { record.error = saved.error }
        let progress = saved.progress
        if progress.fraction != nil || progress.message != nil || progress.details != nil || progress.updatedAt != nil {
            record.progress = progress
        }
        if saved.notBefore != nil { record.notBefore = saved.notBefore }
        if !saved.releasedBy.isEmpty { record.releasedBy = saved.releasedBy }
        if !saved.watchers.isEmpty { watchersByTask[saved.id] = saved.watchers }
        record.reopenings = saved.reopenings
        if !saved.inputs.isEmpty { record.inputs = saved.inputs }
        if saved.resolvedParams != nil { record.resolvedParams = saved.resolvedParams }
    }

    /// A workflow as kept, over the tasks of it the table holds (nothing left to keep: nil, not made).
    @discardableResult
    func makeWorkflow(from saved: WorkflowSnapshot) -> WorkflowRecord? {
        let members = saved.keys.compactMap { key in tasks[key.id].map { (key.key, $0) } }
        let workflow = WorkflowRecord(id: saved.id, name: saved.name, createdAt: saved.createdAt, schedule: saved.schedule)
        workflow.attach(members, keys: saved.keys.map { ($0.key, $0.id) }, remoteMembers: saved.remoteMembers)
        guard !workflow.isSpent else { return nil }
        for (_, record) in members { record.workflow = workflow }
        workflows[workflow.id] = workflow
        ids.continueAfter(saved.id)
        return workflow
    }

    /// The server is stopping and keeps its state: nothing starts any more; what runs may
    /// finish (until `suspendForShutdown`).
    public func haltDispatch() {
        halted = true
    }

    /// Tasks running now, in every queue.
    public var runningCount: Int { queues.values.reduce(0) { $0 + $1.counts[.running] } }

    /// Attempts whose work is in this process: not a worker's under a lease, not an `external`
    /// task's (its worker reports from outside).
    public var runningHereCount: Int {
        tasks.entries.count { record in
            guard let record, record.state == .running else { return false }
            return record.lease == nil && !record.executor.runsOutsideTheProcess
        }
    }

    /// The server is stopping and keeps its state: nothing starts any more, and every task
    /// running here is stopped and put back in `queued` with its attempt not consumed, to run
    /// again after the restart (leased and `external` tasks go on: their workers are not in
    /// this process). Returns how many were running here.
    @discardableResult
    public func suspendForShutdown() -> Int {
        settling {
            halted = true
            var suspended = 0
            for case let record? in tasks.entries
            where record.state == .running && record.lease == nil && !record.executor.runsOutsideTheProcess {
                // A cancellation under way completes; only work nobody stopped runs again.
                if record.cancelRequested {
                    finish(record, as: .cancelled, error: .cancelled)
                    continue
                }
                record.attemptTimer?.cancel()
                record.graceTimer?.cancel()
                record.attemptTimer = nil
                record.graceTimer = nil
                let run = record.run
                record.run = nil
                transition(record, to: .queued)
                record.queue.enqueue(record)
                run?.requestStop()
                suspended += 1
            }
            return suspended
        }
    }

    /// After a restart: an `external` task's worker was never in the process, and may still be
    /// at it. The task goes on running with its progress; its timeout counts from its start
    /// (a later attempt's start is not kept: it gets the whole timeout again).
    func resumeOutside(_ record: TaskRecord) {
        if record.cancelRequested {
            finish(record, as: .cancelled, error: .cancelled)
            return
        }
        let run = TaskRun(link: link, record: record)
        record.run = run
        if let timeout = record.timeoutMilliseconds {
            let elapsed = record.attempt == 1 ? max(0, scheduler.wallClock - (record.startedAt ?? scheduler.wallClock)) : 0
            armTimeout(timeout, for: run, on: record, after: UInt64(max(0, Int64(clamping: timeout) - elapsed)))
        }
        record.executor.start(run)
    }

    /// A task restored as `running` has no attempt: the process that ran it is gone.
    func interrupt(_ record: TaskRecord, stoppingLocalWork: Bool = true) {
        if stoppingLocalWork { record.executor.stopInterrupted(record.id) }
        if record.cancelRequested {
            finish(record, as: .cancelled, error: .cancelled)
            return
        }
        let error = TaskError(code: "interrupted", message: "The server stopped while attempt \(record.attempt) ran.")
        if record.attempt < record.maxAttempts {
            retry(record, after: error)
        } else {
            finish(record, as: .failed, error: error)
        }
    }
}
