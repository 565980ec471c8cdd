/// Reading: tasks, workflows, pages of tasks, queues and executors by name.
extension Engine {
    public func task(_ id: TaskID) -> TaskRecord? { tasks[id] }

    public func workflow(_ id: TaskID) -> WorkflowRecord? { workflows[id] }

    /// The workflow `task` is a member of; on cells, also that of another cell's workflow, whose
    /// record is its home's.
    public func workflowID(of task: TaskRecord) -> TaskID? { task.workflow?.id ?? (cell == nil ? nil : workflowOfMember[task.id]) }

    public var taskCount: Int { tasks.count }

    /// Tasks newest first, starting below the cursor `before` (exclusive), up to `limit` that
    /// match; `next` is the cursor for the following page, nil on the last. A cursor is an id,
    /// so pages stay correct while tasks are added (they sort above it) or evicted.
    public func listTasks(before: TaskID?, limit: Int, in workflow: WorkflowRecord? = nil,
                          where matches: (TaskRecord) -> Bool) -> (tasks: [TaskRecord], next: TaskID?) {
        var page: [TaskRecord] = []
        page.reserveCapacity(min(limit, 256))
        func take(_ record: TaskRecord) -> Bool {
            guard matches(record) else { return true }
            guard page.count < limit else { return false }
            page.append(record)
            return true
        }
        var exhausted = true
        if let workflow {
            for record in workflow.tasks.reversed() where before.map({ record.id < $0 }) ?? true {
                if !take(record) {
                    exhausted = false
                    break
                }
            }
        } else {
            var index = before.map { tasks.endIndex(below: $0) } ?? tasks.entries.count
            while index > 0 {
                index -= 1
                guard let record = tasks.entries[index] else { continue }
                if !take(record) {
                    exhausted = false
                    break
                }
            }
        }
        return (page, exhausted ? nil : page.last?.id)
    }

    /// The queue, created with the default limit if it does not exist yet.
    public func queue(named name: String) -> TaskQueue {
        if let lastQueue, lastQueue.name == name { return lastQueue }
        if let queue = queues[name] {
            lastQueue = queue
            return queue
        }
        let queue = TaskQueue(name: name, maxConcurrency: configuration.defaultConcurrency)
        queues[name] = queue
        lastQueue = queue
        return queue
    }

    func taskKind(named name: String) -> TaskKind? {
        if let lastKind, lastKind.name == name { return lastKind }
        guard let kind = taskKinds[name] else { return nil }
        lastKind = kind
        return kind
    }
}
