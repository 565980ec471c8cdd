/// Workflows: a batch of tasks whose dependencies may name each other by key; all or nothing.
extension Engine {
    /// Submits tasks that may depend on each other by key, atomically: all or none.
    public func submitWorkflow(name: String?, tasks batch: [(key: String, spec: TaskSpec)]) throws(EngineError) -> WorkflowRecord {
        try settling { () throws(EngineError) in try submitWorkflowSettling(name: name, tasks: batch) }
    }

    func submitWorkflowSettling(name: String?, tasks batch: [(key: String, spec: TaskSpec)]) throws(EngineError) -> WorkflowRecord {
        guard !batch.isEmpty else { throw EngineError(.invalid, "A workflow needs at least one task.", field: "tasks") }
        let checked = try check(batch)
        try admit(batch.count)
        let now = scheduler.wallClock
        let workflow = WorkflowRecord(id: ids.next(wallClockMilliseconds: now), name: name, createdAt: now)
        // Every member's id first: a task may depend on a sibling listed after it.
        let memberIDs = batch.map { _ in ids.next(wallClockMilliseconds: now) }
        var records: [TaskRecord] = []
        records.reserveCapacity(batch.count)
        for (position, (member, checked)) in zip(batch, checked).enumerated() {
            let dependencyIDs = checked.dependencies.map { reference -> TaskID in
                switch reference {
                case .existing(let record): record.id
                case .remote(let id): id
                case .sibling(let sibling): memberIDs[sibling]
                }
            }
            let record = makeRecord(member.spec, executor: checked.executor, dependencies: dependencyIDs, createdAt: now,
                                    id: memberIDs[position])
            record.workflow = workflow
            records.append(record)
        }
        workflow.attach(zip(batch.map(\.key), records).map { ($0, $1) })
        workflows[workflow.id] = workflow
        emit(.workflowSubmitted(workflow))
        // Nothing may start until the whole batch is linked.
        let wasDispatching = dispatching
        dispatching = true
        for (record, checked) in zip(records, checked) {
            register(record)
            for reference in checked.dependencies {
                switch reference {
                case .existing(let dependency): link(record, to: dependency)
                case .remote(let id): link(record, toRemote: referenceRemote(id))
                case .sibling(let position): link(record, to: records[position])
                }
            }
        }
        for record in records where record.state == .pending && record.blockingDependencies == 0 {
            makeReady(record)
        }
        dispatching = wasDispatching
        dispatch()
        return workflow
    }

    /// Cancels every unfinished task of a workflow; returns how many.
    @discardableResult
    public func cancelWorkflow(_ id: TaskID) throws(EngineError) -> Int {
        guard let workflow = workflows[id] else { throw EngineError(.notFound, "No workflow \(id).") }
        return cancelAll(workflow.tasks)
    }

    enum ResolvedDependency {
        case existing(TaskRecord)
        /// A task of another cell (Engine+Cells).
        case remote(TaskID)
        case sibling(Int)
    }

    /// A workflow member that passed its checks.
    struct CheckedMember {
        let executor: TaskExecutor
        let dependencies: [ResolvedDependency]
    }

    /// Validates a workflow's tasks (keys, fields, dependencies, cycles) without changing anything.
    func check(_ batch: [(key: String, spec: TaskSpec)]) throws(EngineError) -> [CheckedMember] {
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
            let executor = try check(member.spec, at: "tasks[\(index)].")
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
            checked.append(CheckedMember(executor: executor, dependencies: dependencies))
        }
        let newQueues = Set(batch.lazy.map(\.spec.queue).filter { self.queues[$0] == nil })
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
