import DequeModule

/// Fair share (`concurrency_key`): a queue's ready tasks in lanes, one per key and one for the
/// tasks without a key, taken round-robin; within a lane the best first, as `ReadyHeap` orders
/// a queue (priority, then submission). Each lane sorts its tasks by kind (`ReadyByKind`), so
/// one structure serves the server's dispatch and workers' leases alike.
///
/// A lane whose key runs `cap` tasks (leased ones count) leaves the rotation when it reaches
/// the front, and rejoins at the back once one of them leaves `running`: a dispatch never
/// passes over capped lanes again and again. The lane without a key has no cap.
///
/// A queue gets its lanes with its first keyed task (`TaskQueue.makeLanes`); until then its
/// tasks go through `TaskQueue.ready` or `readyForWorkers` as before, at the cost of one branch.
///
/// Threading: engine thread only.
final class KeyLanes {
    final class Lane {
        /// Nil for the lane of tasks without a key.
        let key: String?
        var ready = ReadyByKind()
        /// Tasks of its key running now.
        var running = 0
        /// Whether it waits in `rotation`.
        var inRotation = false

        init(key: String?) {
            self.key = key
        }
    }

    private var lanes: [String: Lane] = [:]
    private let keyless = Lane(key: nil)
    /// Lanes with queued tasks, in turn; capped ones leave when they surface.
    private var rotation = Deque<Lane>()
    private(set) var cap: Int?

    init(cap: Int?) {
        self.cap = cap
    }

    func isCapped(_ lane: Lane) -> Bool {
        guard let cap, lane.key != nil else { return false }
        return lane.running >= cap
    }

    func insert(_ record: TaskRecord) {
        let lane = self.lane(for: record.concurrencyKey)
        lane.ready.insert(record)
        if !lane.inRotation && !isCapped(lane) { join(lane) }
    }

    /// The next task in turn of `kinds` (any kind when nil), removed; its lane moves to the back.
    /// Lanes without a task of `kinds` keep their places.
    func popNext(of kinds: Set<String>?) -> TaskRecord? {
        var index = 0
        while index < rotation.count {
            let lane = rotation[index]
            if isCapped(lane) {
                leave(lane, at: index)
                continue
            }
            guard let record = lane.ready.popBest(of: kinds) else {
                if kinds == nil || !lane.ready.hasQueued() {
                    leave(lane, at: index)
                    forgetIfIdle(lane)
                } else {
                    index += 1
                }
                continue
            }
            rotation.remove(at: index)
            if lane.ready.hasQueued() {
                rotation.append(lane)
            } else {
                // Forgotten now if nothing of its key runs: a task taken may expire instead of
                // starting, and a start makes the lane again (`started`).
                lane.inRotation = false
                forgetIfIdle(lane)
            }
            return record
        }
        return nil
    }

    /// A task of this queue became `running`.
    func started(_ record: TaskRecord) {
        guard let key = record.concurrencyKey else { return }
        lane(for: key).running += 1
    }

    /// A task of this queue left `running`; true when that put its lane back in turn.
    func stopped(_ record: TaskRecord) -> Bool {
        guard let key = record.concurrencyKey, let lane = lanes[key] else { return false }
        lane.running -= 1
        guard !lane.inRotation else { return false }
        if !isCapped(lane) && lane.ready.hasQueued() {
            join(lane)
            return true
        }
        forgetIfIdle(lane)
        return false
    }

    /// A new cap: lanes under it with queued tasks rejoin (by key, so the order is the same
    /// every time); those over it leave as they surface.
    func setCap(_ newCap: Int?) {
        cap = newCap
        for (_, lane) in lanes.sorted(by: { $0.key < $1.key }) where !lane.inRotation && !isCapped(lane) {
            if lane.ready.hasQueued() { join(lane) }
        }
    }

    /// Keys with a lane now: those with tasks queued or running (and, until they surface in
    /// the rotation, some whose queued tasks all left).
    var keyCount: Int { lanes.count }

    /// Tasks running now by key, as the lanes count them (keys with none left out).
    func runningByKey() -> [String: Int] {
        lanes.compactMapValues { $0.running == 0 ? nil : $0.running }
    }

    /// Whether a task waits in a lane under its cap (for the engine's invariants; scans).
    func hasStartable() -> Bool {
        (lanes.values + [keyless]).contains { !isCapped($0) && $0.ready.hasQueued() }
    }

    /// Whether every lane under its cap with queued tasks is in the rotation.
    func rotationIsWhole() -> Bool {
        (lanes.values + [keyless]).allSatisfy { lane in
            !lane.ready.hasQueued() || isCapped(lane) || lane.inRotation
        }
    }

    private func lane(for key: String?) -> Lane {
        guard let key else { return keyless }
        if let lane = lanes[key] { return lane }
        let lane = Lane(key: key)
        lanes[key] = lane
        return lane
    }

    private func join(_ lane: Lane) {
        lane.inRotation = true
        rotation.append(lane)
    }

    private func leave(_ lane: Lane, at index: Int) {
        rotation.remove(at: index)
        lane.inRotation = false
    }

    /// A key with nothing queued or running costs nothing: many keys come and go.
    private func forgetIfIdle(_ lane: Lane) {
        guard let key = lane.key, lane.running == 0, !lane.inRotation, !lane.ready.hasQueued() else { return }
        lanes.removeValue(forKey: key)
    }
}
