/// The rules a settled engine keeps, checked by the tests from inside the observers (which run
/// once a call has settled): the engine-wide ones, and each rule of a task for `records`
/// (those a batch names). Each rule broken is described in the result.
extension Engine {
    func invariantViolations(of records: some Sequence<TaskRecord>) -> [String] {
        var violations: [String] = []
        if callDepth != 0 { violations.append("observed inside a call (depth \(callDepth))") }
        var unfinished = 0
        for queue in queues.values {
            let counts = queue.counts
            unfinished += counts.unfinished
            let hasStartable = queue.lanes.map { $0.hasStartable() } ?? (counts[.queued] > 0)
            let hasRoom = !halted && !queue.paused && queue.running < queue.maxConcurrency && hasStartable
            if hasRoom && (queue.dispatch == .server || queue.lessees.contains { $0.isWaiting && $0.kinds == nil }) {
                // A rate-limited queue may wait for its next token (due now at the latest, when
                // another action due at the same millisecond ran first), with its wake armed.
                if let bucket = queue.rateBucket {
                    if bucket.wake == nil {
                        violations.append("queue \(queue.name) has room and \(counts[.queued]) queued, and no wake for its next token")
                    }
                } else {
                    violations.append("queue \(queue.name) has room (\(queue.running) of \(queue.maxConcurrency)) and \(counts[.queued]) queued")
                }
            }
            if let lanes = queue.lanes {
                if !lanes.rotationIsWhole() { violations.append("queue \(queue.name) has a lane under its cap out of turn") }
                var runningByKey: [String: Int] = [:]
                for case let record? in tasks.entries where record.queue === queue && record.state == .running {
                    if let key = record.concurrencyKey { runningByKey[key, default: 0] += 1 }
                }
                if lanes.runningByKey() != runningByKey {
                    violations.append("queue \(queue.name) counts running by key \(lanes.runningByKey()), holds \(runningByKey)")
                }
            }
            if queue.waitingLessees != queue.lessees.count(where: \.isWaiting) {
                violations.append("queue \(queue.name) counts \(queue.waitingLessees) waiting lease calls")
            }
        }
        let leased = tasks.entries.count { $0?.lease != nil }
        if leased != leasedCount { violations.append("leased count \(leasedCount), but \(leased) tasks hold a lease") }
        if unfinished != unfinishedCount {
            violations.append("unfinished count \(unfinishedCount), but the queues count \(unfinished)")
        }
        for (id, standIn) in remoteDependencies {
            let naming = tasks.entries.count { $0?.dependencies.contains(id) ?? false }
            if standIn.references != naming { violations.append("stand-in \(id) counts \(standIn.references) tasks, \(naming) name it") }
        }
        var checkedWorkflows = Set<ObjectIdentifier>()
        let wallTimed = wallTimers.purposesByRecord()
        for record in records where tasks[record.id] === record {
            let name = "\(record.id) (\(record.state.rawValue))"
            if let workflow = record.workflow, checkedWorkflows.insert(ObjectIdentifier(workflow)).inserted {
                var counted = StateCounts()
                for task in workflow.tasks { counted[task.state] += 1 }
                for member in workflow.remoteMembers { counted[member.state] += 1 }
                if counted != workflow.counts { violations.append("workflow \(workflow.id) counts \(workflow.counts), holds \(counted)") }
            }
            if !record.state.isTerminal {
                // A dependency releases its dependents once, when it ends; one that an explicit
                // retry brought back is no longer waited on by those it released.
                let waitingOn = record.dependencies.filter { id in
                    tasks[id].map { !$0.state.isTerminal && $0.dependents.contains { $0 === record } }
                        ?? remoteDependencies[id]?.holds(record) ?? false
                }.count
                if record.blockingDependencies != waitingOn {
                    violations.append("\(name) is blocked by \(record.blockingDependencies), waits on \(waitingOn)")
                }
                if let key = record.uniqueKey, uniqueKeyHolder(queue: record.queue.name, key: key) != record.id {
                    violations.append("\(name) does not hold its unique key \(key)")
                }
            }
            if record.state != .running && record.lease != nil { violations.append("\(name) holds a lease") }
            if let expiresAt = record.expiresAt, expiresAt > scheduler.wallClock, record.startedAt == nil, !record.state.isTerminal,
               !wallTimed[ObjectIdentifier(record), default: []].contains(.expiry) {
                violations.append("\(name) has an expiry without its timer")
            }
            switch record.state {
            case .scheduled:
                if !wallTimed[ObjectIdentifier(record), default: []].contains(.start) { violations.append("\(name) is scheduled without its timer") }
                if record.attemptTimer != nil { violations.append("\(name) has an attempt timer") }
            case .pending:
                if record.blockingDependencies == 0 && record.attemptTimer == nil {
                    violations.append("\(name) waits for nothing")
                }
            case .queued:
                if record.attemptTimer != nil { violations.append("\(name) has an attempt timer") }
            case .running:
                if record.run?.record !== record { violations.append("\(name) has no current run") }
                if let lease = record.lease, lease.expiry == nil { violations.append("\(name) has a lease without expiry") }
                if record.startedAt == nil { violations.append("\(name) has no start time") }
            case .succeeded, .failed, .cancelled:
                if record.run != nil || record.attemptTimer != nil || record.graceTimer != nil {
                    violations.append("\(name) still has a run or a timer")
                }
                if !record.dependents.isEmpty { violations.append("\(name) still holds dependents") }
                if record.finishedAt == nil { violations.append("\(name) has no finish time") }
            }
        }
        return violations
    }
}
