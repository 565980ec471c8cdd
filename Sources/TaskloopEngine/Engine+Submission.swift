/// Submitting a task: checks that change nothing, then insertion and linking.
extension Engine {
    /// Submits one task. Throws (changing nothing) if the spec or a dependency is invalid or
    /// the unfinished-task limit would be exceeded.
    @discardableResult
    public func submit(_ spec: TaskSpec) throws(EngineError) -> TaskRecord {
        try settling { () throws(EngineError) in try submitSettling(spec) }
    }

    func submitSettling(_ spec: TaskSpec) throws(EngineError) -> TaskRecord {
        let kind = try check(spec, at: "")
        var dependencies: [TaskID] = []
        if !spec.dependencies.isEmpty {
            dependencies.reserveCapacity(spec.dependencies.count)
            duplicateStamp += 1
            for (position, reference) in spec.dependencies.enumerated() {
                guard case .task(let id) = reference else {
                    throw EngineError(.unknownDependency, "Keys name sibling tasks only inside a workflow.",
                                      field: "dependencies[\(position)]")
                }
                try claimDependency(id) { "dependencies[\(position)]" }
                dependencies.append(id)
            }
        }
        try checkOutputReferences(in: spec.params, naming: spec.dependencies, at: "")
        try checkUniqueKey(spec, at: "")
        try admit(1)
        let now = scheduler.wallClock
        let record = makeRecord(spec, kind: kind, dependencies: dependencies, createdAt: now)
        let wasDispatching = dispatching
        dispatching = true
        register(record)
        for id in dependencies {
            if let dependency = tasks[id] { link(record, to: dependency) } else { link(record, toRemote: referenceRemote(id)) }
        }
        if record.state == .pending && record.blockingDependencies == 0 { makeReady(record) }
        dispatching = wasDispatching
        dispatch()
        return record
    }

    /// The existing task `id` as a dependency of the list being checked (stamped with
    /// `duplicateStamp`), or nil for a task of another cell (Engine+Cells), taken on trust:
    /// throws if it does not exist or the list named it already.
    @discardableResult
    func claimDependency(_ id: TaskID, field: () -> String) throws(EngineError) -> TaskRecord? {
        guard let dependency = tasks[id] else {
            if let cell, id.cell != cell {
                try claimRemote(id, field: field)
                return nil
            }
            throw EngineError(.unknownDependency, "No task \(id).", field: field())
        }
        guard dependency.duplicateStamp != duplicateStamp else {
            throw EngineError(.duplicateDependency, "Task \(id) is listed twice.", field: field())
        }
        dependency.duplicateStamp = duplicateStamp
        return dependency
    }

    /// Refuses a submission that would exceed the unfinished-task limit.
    func admit(_ count: Int) throws(EngineError) {
        guard unfinishedCount + count <= configuration.maxUnfinishedTasks else {
            throw EngineError(.tooManyUnfinishedTasks,
                              "The server already holds \(unfinishedCount) unfinished tasks (limit \(configuration.maxUnfinishedTasks)).")
        }
    }

    /// Inlined: out of line it cost a submission ~800 instructions of argument copies.
    @inline(__always)
    func makeRecord(_ spec: TaskSpec, kind: TaskKind, dependencies: [TaskID], createdAt: Int64,
                    id: TaskID? = nil) -> TaskRecord {
        sequence += 1
        return TaskRecord(id: id ?? ids.next(wallClockMilliseconds: createdAt), sequence: sequence, spec: spec,
                          kind: kind, queue: queue(named: spec.queue), dependencies: dependencies,
                          createdAt: createdAt)
    }

    /// `outOfOrder`: a workflow member another cell made, whose id may sort below others here.
    /// `claimingUniqueKey`: false for such a member that duplicates another's key (it is cancelled).
    func register(_ record: TaskRecord, outOfOrder: Bool = false, claimingUniqueKey: Bool = true) {
        if outOfOrder { tasks.insert(record) } else { tasks.append(record) }
        emit(.submitted(record))
        unfinishedCount += 1
        record.queue.count(.pending, 1)
        if record.scheduledFor != nil || record.expiresAt != nil { waitForTime(record, .registered) }
        if claimingUniqueKey && record.uniqueKey != nil { claimUniqueKey(of: record) }
    }

    /// Checks a spec's own fields (not its dependencies) and finds its kind. `at` prefixes
    /// field paths (`tasks[3].`). A workflow's member of another cell (not `inThisCell`) makes
    /// no queue here: its queue's limit and cell are its cell's.
    func check(_ spec: TaskSpec, at: @autoclosure () -> String, inThisCell: Bool = true) throws(EngineError) -> TaskKind {
        guard let kind = taskKind(named: spec.kind) else {
            throw EngineError(.unknownKind, "Unknown kind \(spec.kind); known kinds: \(kinds.joined(separator: ", ")).",
                              field: "\(at())kind")
        }
        do {
            try kind.executor.validate(maskingOutputs(in: spec.params))
        } catch let error where awaitsOutputs(error.field, in: spec.params) {
            // Checked once the references are resolved, at start (Engine+Outputs).
        } catch {
            let field = error.field.map { $0.isEmpty ? "\(at())params" : "\(at())params.\($0)" }
            throw EngineError(error.code, error.message, field: field)
        }
        try SubmissionValidator.check(spec, at: at)
        if spec.runAt != nil || spec.expiry != nil { try checkTimes(of: spec, at: at) }
        guard lastQueue?.name == spec.queue || queues[spec.queue] != nil || SubmissionValidator.isValidQueueName(spec.queue) else {
            throw EngineError(.invalid, SubmissionValidator.queueNameRule, field: "\(at())queue")
        }
        if inThisCell && lastQueue?.name != spec.queue && queues[spec.queue] == nil {
            try makeRoomForQueues(1, field: "\(at())queue")
            if configuration.cells != nil { try checkCell(ofQueue: spec.queue, field: "\(at())queue") }
        }
        return kind
    }

    /// `run_at`/`delay_ms` and `expires_at`/`ttl_ms` against the clock: within
    /// `maxScheduleAheadMilliseconds`, an expiry still to come and after the run time.
    func checkTimes(of spec: TaskSpec, at: () -> String) throws(EngineError) {
        let now = scheduler.wallClock
        let horizon = now &+ Int64(clamping: configuration.maxScheduleAheadMilliseconds)
        let runAt = spec.runAt?.instant(submittedAt: now)
        if let runAt, runAt > horizon {
            let field = if case .after = spec.runAt { "delay_ms" } else { "run_at" }
            throw EngineError(.invalid, "\(field) reaches more than \(configuration.maxScheduleAheadMilliseconds) ms ahead.",
                              field: "\(at())\(field)")
        }
        guard let expiry = spec.expiry else { return }
        let field = if case .after = expiry { "ttl_ms" } else { "expires_at" }
        let expiresAt = expiry.instant(submittedAt: now)
        if expiresAt > horizon {
            throw EngineError(.invalid, "\(field) reaches more than \(configuration.maxScheduleAheadMilliseconds) ms ahead.",
                              field: "\(at())\(field)")
        }
        if expiresAt <= now { throw EngineError(.invalid, "\(field) has passed already.", field: "\(at())\(field)") }
        if let runAt, expiresAt <= runAt {
            throw EngineError(.invalid, "\(field) comes before the task may run (its run_at or delay_ms).", field: "\(at())\(field)")
        }
    }

    /// Makes `record` wait for `dependency`, or applies a dependency that already finished.
    func link(_ record: TaskRecord, to dependency: TaskRecord) {
        if dependency.state.isTerminal {
            if dependency.state == .succeeded || record.onDependencyFailure == .run {
                takeInputs(of: record, from: dependency.id, result: dependency.result)
            }
            link(record, toEnded: dependency.id, as: dependency.state)
            return
        }
        record.blockingDependencies += 1
        dependency.dependents.append(record)
    }

    /// Applies a dependency that already finished (here, or in another cell) to a task linked to it.
    func link(_ record: TaskRecord, toEnded dependency: TaskID, as state: TaskState) {
        if state != .succeeded, record.onDependencyFailure == .cancel, !record.state.isTerminal {
            finish(record, as: .cancelled, error: .dependencyFailed(dependency, state: state))
        }
    }
}
