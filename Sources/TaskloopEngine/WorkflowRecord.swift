/// Tasks submitted together. Its state and progress are derived from its tasks.
///
/// Threading: engine thread only.
public final class WorkflowRecord {
    public let id: TaskID
    public let name: String?
    public let createdAt: Int64
    /// Its tasks in submission (= creation) order, evicted ones removed.
    public private(set) var tasks: [TaskRecord] = []
    /// Each task's key, in submission order.
    public private(set) var keys: [(key: String, id: TaskID)] = []
    /// Its tasks by state, kept by the engine's transitions: the state is O(1).
    var counts = StateCounts()

    init(id: TaskID, name: String?, createdAt: Int64) {
        self.id = id
        self.name = name
        self.createdAt = createdAt
    }

    func attach(_ members: [(String, TaskRecord)]) {
        tasks = members.map(\.1)
        keys = members.map { ($0.0, $0.1.id) }
        counts = StateCounts()
        for task in tasks { counts[task.state] += 1 }
    }

    func evicted(_ record: TaskRecord) {
        tasks.removeAll { $0 === record }
        counts[record.state] -= 1
    }

    public var state: TaskState { Self.state(of: counts) }

    public var fraction: Double { Self.fraction(of: tasks.lazy.map { ($0.state, $0.progress.fraction) }) }

    /// A workflow's state from its tasks' counts by state (a live workflow's, or one read from
    /// the records a store keeps): `succeeded` when all succeeded; `failed` when all are
    /// terminal and one failed; `cancelled` when all are terminal, none failed and one was
    /// cancelled; else `running`.
    public static func state(of counts: StateCounts) -> TaskState {
        if counts.pending + counts.queued + counts.running > 0 { return .running }
        return counts.failed > 0 ? .failed : counts.cancelled > 0 ? .cancelled : .succeeded
    }

    /// A workflow's progress from its tasks', in order: the mean, terminal tasks counting 1.
    public static func fraction(of tasks: some Collection<(state: TaskState, progress: Double?)>) -> Double {
        guard !tasks.isEmpty else { return 1 }
        let sum = tasks.reduce(0.0) { $0 + ($1.state.isTerminal ? 1 : ($1.progress ?? 0)) }
        return sum / Double(tasks.count)
    }
}
