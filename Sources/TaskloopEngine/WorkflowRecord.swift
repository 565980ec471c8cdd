/// Tasks submitted together. Its state and progress are derived from its tasks.
///
/// Threading: engine thread only.
public final class WorkflowRecord {
    public let id: TaskID
    public let name: String?
    public let createdAt: Int64
    /// The schedule run that made it (Engine+Schedules), as each of its tasks carries it: kept
    /// here too, since its tasks may be forgotten or in other cells while it is shown.
    public let schedule: ScheduleSlot?
    /// Its tasks in submission (= creation) order, evicted ones removed. With cells, only those
    /// of its home cell (the cell its id carries): the rest are `remoteMembers`.
    public private(set) var tasks: [TaskRecord] = []
    /// Each task's key, in submission order: every member, in whichever cell.
    public private(set) var keys: [(key: String, id: TaskID)] = []
    /// Its members in other cells, in submission order, as their cells last reported them
    /// (Engine+Workflows): the home holds no record of them.
    public internal(set) var remoteMembers: [RemoteMember] = []
    /// Its tasks by state (remote members by their last report), kept by the engine's
    /// transitions: the state is O(1).
    var counts = StateCounts()

    /// What a member's cell last reported of it.
    public struct RemoteMember: Sendable, Equatable {
        public let id: TaskID
        /// `pending` until it ends, and again once brought back.
        public internal(set) var state: TaskState
        public internal(set) var fraction: Double?

        public init(id: TaskID, state: TaskState = .pending, fraction: Double? = nil) {
            self.id = id
            self.state = state
            self.fraction = fraction
        }
    }

    init(id: TaskID, name: String?, createdAt: Int64, schedule: ScheduleSlot? = nil) {
        self.id = id
        self.name = name
        self.createdAt = createdAt
        self.schedule = schedule
    }

    func attach(_ members: [(String, TaskRecord)]) {
        attach(members, keys: members.map { ($0.0, $0.1.id) }, remoteMembers: [])
    }

    func attach(_ members: [(String, TaskRecord)], keys: [(key: String, id: TaskID)], remoteMembers: [RemoteMember]) {
        tasks = members.map(\.1)
        self.keys = keys
        self.remoteMembers = remoteMembers
        counts = StateCounts()
        for task in tasks { counts[task.state] += 1 }
        for member in remoteMembers { counts[member.state] += 1 }
    }

    func evicted(_ record: TaskRecord) {
        tasks.removeAll { $0 === record }
        counts[record.state] -= 1
    }

    /// Applies a member cell's report; false when it changes nothing.
    func update(remote id: TaskID, state: TaskState, fraction: Double?) -> Bool {
        guard let index = remoteMembers.firstIndex(where: { $0.id == id }) else { return false }
        let old = remoteMembers[index]
        guard old.state != state || old.fraction != fraction else { return false }
        counts[old.state] -= 1
        counts[state] += 1
        remoteMembers[index].state = state
        remoteMembers[index].fraction = fraction
        return true
    }

    /// Nothing left to keep: its own members are evicted, and every remote member reported its end.
    var isSpent: Bool {
        tasks.isEmpty && remoteMembers.allSatisfy(\.state.isTerminal)
    }

    /// Its own members' and the remote members' states (their counts hold both).
    public var state: TaskState { Self.state(of: counts) }

    public var fraction: Double {
        Self.fraction(of: tasks.map { ($0.state, $0.progress.fraction) } + remoteMembers.map { ($0.state, $0.fraction) })
    }

    /// A workflow's state from its tasks' counts by state (a live workflow's, or one read from
    /// the records a store keeps): `succeeded` when all succeeded; `failed` when all are
    /// terminal and one failed; `cancelled` when all are terminal, none failed and one was
    /// cancelled; else `running`.
    public static func state(of counts: StateCounts) -> TaskState {
        if counts.unfinished > 0 { return .running }
        return counts.failed > 0 ? .failed : counts.cancelled > 0 ? .cancelled : .succeeded
    }

    /// A workflow's progress from its tasks', in order: the mean, terminal tasks counting 1.
    public static func fraction(of tasks: some Collection<(state: TaskState, progress: Double?)>) -> Double {
        guard !tasks.isEmpty else { return 1 }
        let sum = tasks.reduce(0.0) { $0 + ($1.state.isTerminal ? 1 : ($1.progress ?? 0)) }
        return sum / Double(tasks.count)
    }
}
