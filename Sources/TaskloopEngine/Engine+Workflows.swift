/// Workflows: a batch of tasks whose dependencies may name each other by key; all or nothing.
extension Engine {
    /// Submits tasks that may depend on each other by key, atomically: all or none.
    public func submitWorkflow(name: String?, tasks batch: [(key: String, spec: TaskSpec)]) throws(EngineError) -> WorkflowRecord {
        try settling { () throws(EngineError) in try submitWorkflowSettling(name: name, tasks: batch) }
    }

    /// `schedule`: the schedule run making it (its members carry the same mark).
    func submitWorkflowSettling(name: String?, tasks batch: [(key: String, spec: TaskSpec)],
                                schedule: ScheduleSlot? = nil) throws(EngineError) -> WorkflowRecord {
        guard !batch.isEmpty else { throw EngineError(.invalid, "A workflow needs at least one task.", field: "tasks") }
        // With cells, each member's (nil: this one's).
        let memberCells = configuration.cells.map { cells in
            batch.map { member -> UInt16? in
                let owner = cells.cellOfQueue(member.spec.queue)
                return owner == cells.cell ? nil : owner
            }
        }
        if let memberCells, !memberCells.contains(nil) {
            throw EngineError(.invalid, "No task of the workflow is in this engine's cell \(cell!): send it to the cell of its first task's queue.",
                              field: "tasks")
        }
        let checked = try check(batch, memberCells: memberCells)
        try checkUniqueKeys(ofMembers: batch)
        for (index, member) in batch.enumerated() where member.spec.uniqueKey != nil {
            try checkUniqueKey(member.spec, at: "tasks[\(index)].", inThisCell: memberCells?[index] == nil)
        }
        try admit(batch.count)
        let now = scheduler.wallClock
        let workflow = WorkflowRecord(id: ids.next(wallClockMilliseconds: now), name: name, createdAt: now, schedule: schedule)
        // Every member's id first: a task may depend on a sibling listed after it.
        let memberIDs = batch.indices.map { position in
            memberCells?[position].map { ids.next(wallClockMilliseconds: now, carrying: $0) } ?? ids.next(wallClockMilliseconds: now)
        }
        let siblingIDs = memberCells == nil ? [:] : Dictionary(zip(batch.map(\.key), memberIDs), uniquingKeysWith: { first, _ in first })
        var records: [TaskRecord?] = []
        records.reserveCapacity(batch.count)
        var remote: [UInt16: [CellMessage.Member]] = [:]
        for (position, (member, checked)) in zip(batch, checked).enumerated() {
            let dependencyIDs = checked.dependencies.map { reference -> TaskID in
                switch reference {
                case .existing(let record): record.id
                case .remote(let id): id
                case .sibling(let sibling): memberIDs[sibling]
                }
            }
            if let memberCell = memberCells?[position] {
                var spec = member.spec
                spec.dependencies = dependencyIDs.map { .task($0) }
                spec.params = Self.namingByID(spec.params, keys: siblingIDs)
                remote[memberCell, default: []].append(CellMessage.Member(id: memberIDs[position], spec: spec, createdAt: now))
                records.append(nil)
                continue
            }
            let record = makeRecord(member.spec, kind: checked.kind, dependencies: dependencyIDs, createdAt: now,
                                    id: memberIDs[position])
            record.workflow = workflow
            records.append(record)
        }
        workflow.attach(zip(batch, records).compactMap { member, record in record.map { (member.key, $0) } },
                        keys: zip(batch, memberIDs).map { ($0.key, $1) },
                        remoteMembers: zip(records, memberIDs).compactMap { $0 == nil ? WorkflowRecord.RemoteMember(id: $1) : nil })
        workflows[workflow.id] = workflow
        emit(.workflowSubmitted(workflow))
        // Before any watch of a member there: a cell creates its members first.
        for (memberCell, members) in remote.sorted(by: { $0.key < $1.key }) {
            emit(.messageSent(CellMessage(.members, from: cell!, to: memberCell, workflow: workflow.id, members: members)))
        }
        // Nothing may start until the whole batch is linked.
        let wasDispatching = dispatching
        dispatching = true
        for (record, checked) in zip(records, checked) {
            guard let record else { continue }
            register(record)
            for reference in checked.dependencies {
                switch reference {
                case .existing(let dependency): link(record, to: dependency)
                case .remote(let id): link(record, toRemote: referenceRemote(id))
                case .sibling(let position):
                    if let sibling = records[position] {
                        link(record, to: sibling)
                    } else {
                        link(record, toRemote: referenceRemote(memberIDs[position]))
                    }
                }
            }
        }
        for case let record? in records where record.state == .pending && record.blockingDependencies == 0 {
            makeReady(record)
        }
        dispatching = wasDispatching
        dispatch()
        return workflow
    }

    /// Cancels every unfinished task of a workflow; returns how many: with cells, its own
    /// members cancelled here plus the remote members not known to have ended, which their
    /// cells are told to cancel (before this cell's members end, so that each is cancelled as
    /// a member rather than as a dependent, as on one engine). One engine cancels newest first;
    /// each cell does so with its own members only, so a member depending on a sibling listed
    /// after it in another cell may end with `cancelled` where one engine says `dependency_failed`.
    @discardableResult
    public func cancelWorkflow(_ id: TaskID) throws(EngineError) -> Int {
        guard let workflow = workflows[id] else { throw EngineError(.notFound, "No workflow \(id).") }
        guard !workflow.remoteMembers.isEmpty else { return cancelAll(workflow.tasks) }
        return settling {
            tellMemberCells(of: workflow, .cancelMembers)
            return cancelAll(workflow.tasks) + workflow.remoteMembers.count { !$0.state.isTerminal }
        }
    }

    enum ResolvedDependency {
        case existing(TaskRecord)
        /// A task of another cell (Engine+Cells).
        case remote(TaskID)
        case sibling(Int)
    }

    /// A workflow member that passed its checks.
    struct CheckedMember {
        let kind: TaskKind
        let dependencies: [ResolvedDependency]
    }

    /// Validates a workflow's tasks (keys, fields, dependencies, cycles) without changing anything.
    /// `memberCells` (with cells) names each member's cell, nil for this one: a member of
    /// another cell is checked as fully, but its queue is that cell's to make.
    func check(_ batch: [(key: String, spec: TaskSpec)], memberCells: [UInt16?]? = nil) throws(EngineError) -> [CheckedMember] {
        var positions: [String: Int] = [:]
        for (index, member) in batch.enumerated() {
            guard !member.key.isEmpty else { throw EngineError(.invalid, "key must not be empty.", field: "tasks[\(index)].key") }
            guard positions.updateValue(index, forKey: member.key) == nil else {
                throw EngineError(.invalid, "Key \(member.key) is used twice.", field: "tasks[\(index)].key")
            }
        }
        var checked: [CheckedMember] = []
        checked.reserveCapacity(batch.count)
        for (index, member) in batch.enumerated() {
            let kind = try check(member.spec, at: "tasks[\(index)].", inThisCell: memberCells?[index] == nil)
            var dependencies: [ResolvedDependency] = []
            dependencies.reserveCapacity(member.spec.dependencies.count)
            duplicateStamp += 1
            var seenSiblings = Set<Int>()
            for (position, reference) in member.spec.dependencies.enumerated() {
                func field() -> String { "tasks[\(index)].dependencies[\(position)]" }
                switch reference {
                case .task(let id):
                    dependencies.append(try claimDependency(id, field: field).map { .existing($0) } ?? .remote(id))
                case .sibling(let key):
                    guard let sibling = positions[key] else {
                        throw EngineError(.unknownDependency, "No task with key \(key) in this workflow.", field: field())
                    }
                    guard sibling != index else {
                        throw EngineError(.selfDependency, "A task cannot depend on itself.", field: field())
                    }
                    guard seenSiblings.insert(sibling).inserted else {
                        throw EngineError(.duplicateDependency, "Key \(key) is listed twice.", field: field())
                    }
                    dependencies.append(.sibling(sibling))
                }
            }
            try checkOutputReferences(in: member.spec.params, naming: member.spec.dependencies, at: "tasks[\(index)].")
            checked.append(CheckedMember(kind: kind, dependencies: dependencies))
        }
        let newQueues = Set(batch.indices.lazy.filter { memberCells?[$0] == nil }.map { batch[$0].spec.queue }
            .filter { self.queues[$0] == nil })
        if newQueues.count > 1 { try makeRoomForQueues(newQueues.count, field: "tasks") }
        if let cycle = Self.findCycle(checked.map(\.dependencies)) {
            let keys = cycle.map { batch[$0].key }
            throw EngineError(.cycle, "The tasks depend on each other in a circle: \(keys.joined(separator: " -> ")).",
                              field: "tasks", keys: keys)
        }
        return checked
    }

    /// A cycle among siblings, as positions in dependency order, or nil. Iterative DFS.
    static func findCycle(_ graph: [[ResolvedDependency]]) -> [Int]? {
        var color = [UInt8](repeating: 0, count: graph.count)  // 0 new, 1 on stack, 2 done
        for root in graph.indices where color[root] == 0 {
            var stack: [(node: Int, next: Int)] = [(root, 0)]
            color[root] = 1
            while let top = stack.last {
                let siblings = graph[top.node]
                if top.next == siblings.count {
                    color[top.node] = 2
                    stack.removeLast()
                    continue
                }
                stack[stack.count - 1].next += 1
                guard case .sibling(let child) = siblings[top.next] else { continue }
                if color[child] == 1 {
                    let start = stack.firstIndex { $0.node == child }!
                    return stack[start...].map(\.node)
                }
                if color[child] == 0 {
                    color[child] = 1
                    stack.append((child, 0))
                }
            }
        }
        return nil
    }
}
