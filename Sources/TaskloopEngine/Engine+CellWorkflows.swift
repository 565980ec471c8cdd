/// Workflows across cells (docs/SCALING.md, "Under way: cells"). A workflow lives in its home
/// cell, the cell of the engine it is submitted to, whose id it carries; the home holds one of
/// its members at least. The home checks the whole workflow as one engine would, makes every
/// member's id (one of another cell carries that cell: `TaskIDGenerator.next(wallClockMilliseconds:carrying:)`),
/// keeps the workflow record and its own members, and sends each other cell the members it
/// must create (`CellMessage.members`), which that cell creates without refusing. Members
/// depending on each other across cells are dependencies across cells like any (Engine+Cells).
///
/// - A member cell keeps its members of each such workflow (`hostedMembers`; the workflow's id
///   is kept with each member's record, so they are found again after a restart) and reports
///   to the home what moves the workflow's state or progress: a member's end, its return by a
///   retry, its fraction (`memberChanged`).
/// - The home keeps what was last reported of each remote member (`WorkflowRecord.remoteMembers`,
///   kept with the workflow): the workflow's state and fraction follow the rules of one engine,
///   and only the home knows them.
/// - `cancelWorkflow` and `retryWorkflow` at home tell every member cell to do the same with
///   its members (`cancelMembers`, `retryMembers`).
/// - Retention: members are tasks like any, forgotten by their own cells. The home keeps the
///   workflow until its own members are evicted and every remote member has reported its end
///   (so a remote member still running keeps it; its end then lets it go at once).
extension Engine {
    /// Tells the home of `record`'s workflow, when that is another cell, its state and fraction now.
    func reportToHome(_ record: TaskRecord) {
        guard let workflow = workflowOfMember[record.id] else { return }
        emit(.messageSent(CellMessage(.memberChanged, from: cell!, to: workflow.cell, workflow: workflow, member: record.id,
                                      epoch: record.reopenings, state: record.state, fraction: record.progress.fraction)))
    }

    /// Sends `kind` about `workflow` to every cell holding members of it.
    func tellMemberCells(of workflow: WorkflowRecord, _ kind: CellMessage.Kind) {
        var told: [UInt16] = []
        for member in workflow.remoteMembers where !told.contains(member.id.cell) {
            told.append(member.id.cell)
            emit(.messageSent(CellMessage(kind, from: cell!, to: member.id.cell, workflow: workflow.id)))
        }
    }

    /// Workflows whose remote members' reports changed them, and the ids of those the reports
    /// left with nothing to keep, since the last call: a store writes the one and deletes the
    /// other.
    func takeReportedWorkflows() -> (changed: [WorkflowRecord], spent: [TaskID]) {
        guard !reportedWorkflows.isEmpty || !spentWorkflows.isEmpty else { return ([], []) }
        defer {
            reportedWorkflows = []
            spentWorkflows = []
        }
        return (reportedWorkflows.filter { workflows[$0.id] === $0 }, spentWorkflows)
    }

    /// A forgotten task is no longer a member this cell holds for another's workflow.
    func forgetHostedMember(_ record: TaskRecord) {
        guard let workflow = workflowOfMember.removeValue(forKey: record.id) else { return }
        hostedMembers[workflow]?.removeAll { $0 === record }
        if hostedMembers[workflow]?.isEmpty ?? false { hostedMembers.removeValue(forKey: workflow) }
    }

    /// After `restore`: the members this cell holds of workflows whose home is another cell.
    func restoreHostedMembers(_ saved: [TaskSnapshot]) {
        for task in saved {
            guard let workflow = task.workflow, workflow.cell != cell, let record = tasks[task.id] else { continue }
            hostedMembers[workflow, default: []].append(record)
            workflowOfMember[record.id] = workflow
        }
    }

    // MARK: applying messages

    func applyWorkflowMessage(_ message: CellMessage) {
        guard let workflow = message.workflow else { return }
        switch message.kind {
        case .members: createMembers(message.members, of: workflow)
        case .memberChanged: memberChanged(message, of: workflow)
        case .cancelMembers: _ = cancelAll(hostedMembers[workflow] ?? [])
        case .retryMembers: retryMembers(of: workflow)
        case .watch, .ended, .reopened, .missing: break
        }
    }

    /// Creates members the home checked, all of them: a limit of this cell (unfinished tasks,
    /// queues) they pass is not applied, as the home answered already.
    private func createMembers(_ members: [CellMessage.Member], of workflow: TaskID) {
        var records: [TaskRecord] = []
        records.reserveCapacity(members.count)
        // Applied once by the host's rules; a member already here is never made twice anyway.
        for member in members where tasks[member.id] == nil {
            let dependencies = member.spec.dependencies.compactMap { reference -> TaskID? in
                if case .task(let id) = reference { id } else { nil }
            }
            // Every cell runs the same kinds (one binary); one unknown here ends its task below.
            let kind = taskKind(named: member.spec.kind)
            // The home could not see this cell's keys: a duplicate is made, and cancelled below.
            var duplicate: EngineError?
            do { try checkUniqueKey(member.spec, at: "") } catch { duplicate = error }
            let record = makeRecord(member.spec, kind: kind ?? TaskKind(name: member.spec.kind, executor: NoopExecutor()), dependencies: dependencies,
                                    createdAt: member.createdAt, id: member.id)
            register(record, outOfOrder: true, claimingUniqueKey: duplicate == nil)
            // This cell's next ids sort after it (the table appends those).
            ids.continueAfterMillisecond(of: record.id)
            workflowOfMember[record.id] = workflow
            records.append(record)
            if kind == nil {
                finish(record, as: .failed, error: TaskError(code: "unknown_kind", message: "This cell does not run kind \(record.kind)."))
            } else if let duplicate, let existing = duplicate.existing {
                finish(record, as: .cancelled, error: TaskError(code: "duplicate_task", message: duplicate.message,
                                                                details: ["existing_id": .string(existing.description)]))
            }
        }
        hostedMembers[workflow, default: []] += records
        for record in records {
            for id in record.dependencies {
                if let dependency = tasks[id] {
                    link(record, to: dependency)
                } else if id.cell != cell {
                    link(record, toRemote: referenceRemote(id))
                } else if !record.state.isTerminal {
                    // Taken on trust by the home, and gone (or never here): as a `missing` answer.
                    finish(record, as: .cancelled, error: .unknownDependency(id))
                }
            }
        }
        for record in records where record.state == .pending && record.blockingDependencies == 0 {
            makeReady(record)
        }
    }

    private func memberChanged(_ message: CellMessage, of id: TaskID) {
        guard let workflow = workflows[id], let state = message.state,
              workflow.update(remote: message.dependency, state: state, fraction: message.fraction) else { return }
        emit(.workflowReported(workflow, spent: workflow.isSpent))
        if workflow.isSpent {
            workflows.removeValue(forKey: id)
            spentWorkflows.append(id)
        } else if !reportedWorkflows.contains(where: { $0 === workflow }) {
            reportedWorkflows.append(workflow)
        }
    }

    /// As `retryWorkflow` with this cell's members; the home admitted it, so this cell's limit does not apply.
    private func retryMembers(of workflow: TaskID) {
        let retried = (hostedMembers[workflow] ?? []).filter { $0.state == .failed || $0.state == .cancelled }
        guard !retried.isEmpty else { return }
        bringBack(retried, dependents: cancelledDependents(of: retried.map(\.id)))
    }
}
