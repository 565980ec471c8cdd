import DequeModule

/// Unique tasks: a task may carry a `uniqueKey`, and a submission naming the key of an
/// unfinished task of the same queue, or (with `uniqueForMilliseconds`) of one that finished
/// less than that long ago, is refused (`duplicate_task`, naming the task that holds the key).
///
/// The window is the submission's: the client that submits decides how recent a finished task
/// must be to count as the same work (as River and Oban do), and a task submitted without a
/// window is refused only by an unfinished one. So a finished task must be remembered for the
/// longest window a later submission may ask for (`maxUniqueForMilliseconds`).
///
/// The index holds, per queue and key, the one task that decides: the unfinished task if there
/// is one (there is never more than one: an explicit retry that would make a second is refused
/// as well), else the one that finished last. A finished task that retention forgets while a
/// window may still reach it leaves a tombstone (id and finishing time) in its place; the store
/// keeps the tombstones beside the records (`takeUniqueKeyChanges`), so the index is rebuilt
/// from both after a restart or on a cell's next owner (`restoreUniqueKeys`). Tombstones go
/// once no window can reach them, or oldest first past `maxForgottenUniqueKeys`.
extension Engine {
    /// Refuses a task whose key is held: by an unfinished task of its queue, or by one that
    /// finished within the spec's window. `at` prefixes field paths (`tasks[3].`). A workflow's
    /// member of another cell (not `inThisCell`) has its window checked only: its cell holds the key.
    func checkUniqueKey(_ spec: TaskSpec, at prefix: String, inThisCell: Bool = true) throws(EngineError) {
        guard let key = spec.uniqueKey else { return }
        if let window = spec.uniqueForMilliseconds, window > configuration.maxUniqueForMilliseconds {
            throw EngineError(.invalid, "unique_for_ms must be from 1 to \(configuration.maxUniqueForMilliseconds).",
                              field: "\(prefix)unique_for_ms")
        }
        let name = UniqueKeyName(queue: spec.queue, key: key)
        guard inThisCell, let holder = uniqueKeys.holders[name] else { return }
        let finishedAt: Int64
        switch holder {
        case .task(let record) where !record.state.isTerminal:
            throw duplicate(name, holder: record.id, field: "\(prefix)unique_key")
        case .task(let record):
            finishedAt = record.finishedAt ?? scheduler.wallClock
        case .forgotten(_, let finished):
            finishedAt = finished
        }
        if let window = spec.uniqueForMilliseconds, scheduler.wallClock - finishedAt < Int64(clamping: window) {
            throw duplicate(name, holder: holder.id, field: "\(prefix)unique_key")
        }
    }

    /// Refuses a workflow two of whose members of one queue carry the same key.
    func checkUniqueKeys(ofMembers batch: [(key: String, spec: TaskSpec)]) throws(EngineError) {
        var first: [UniqueKeyName: Int] = [:]
        for (index, member) in batch.enumerated() {
            guard let key = member.spec.uniqueKey else { continue }
            if let earlier = first.updateValue(index, forKey: UniqueKeyName(queue: member.spec.queue, key: key)) {
                throw EngineError(.duplicateTask, "tasks[\(earlier)] carries unique_key \(key) in queue \(member.spec.queue) too.",
                                  field: "tasks[\(index)].unique_key")
            }
        }
    }

    /// Refuses an explicit retry that would make a task unfinished while another task of its
    /// queue holds its key unfinished (or while another task of the same retry would).
    func checkUniqueKeys(ofReopened records: [TaskRecord]) throws(EngineError) {
        var reopening: [UniqueKeyName: TaskRecord] = [:]
        for record in records {
            guard let key = record.uniqueKey else { continue }
            let name = UniqueKeyName(queue: record.queue.name, key: key)
            if case .task(let holder)? = uniqueKeys.holders[name], holder !== record, !holder.state.isTerminal {
                throw duplicate(name, holder: holder.id, field: nil, retrying: record.id)
            }
            if let other = reopening.updateValue(record, forKey: name), other !== record {
                throw duplicate(name, holder: other.id, field: nil, retrying: record.id)
            }
        }
    }

    private func duplicate(_ name: UniqueKeyName, holder: TaskID, field: String?, retrying: TaskID? = nil) -> EngineError {
        let message = retrying.map { "Task \($0) cannot be retried: task \(holder) holds unique_key \(name.key) in queue \(name.queue)." }
            ?? "Task \(holder) holds unique_key \(name.key) in queue \(name.queue)."
        return EngineError(.duplicateTask, message, field: field, existing: holder)
    }

    /// `record` (new, or made unfinished by a retry) holds its key now, unless another
    /// unfinished task does: a retry another cell asked for cannot be refused, and the first
    /// holder keeps the key.
    func claimUniqueKey(of record: TaskRecord) {
        guard let key = record.uniqueKey else { return }
        let name = UniqueKeyName(queue: record.queue.name, key: key)
        let previous = uniqueKeys.holders[name]
        if case .task(let holder)? = previous, holder !== record, !holder.state.isTerminal { return }
        uniqueKeys.holders[name] = .task(record)
        if case .forgotten? = previous { uniqueKeys.drop(name) }
    }

    /// Retention forgets `record`: if it held its key and a window may still reach its end, a
    /// tombstone takes its place.
    func forgetUniqueKey(of record: TaskRecord) {
        guard let key = record.uniqueKey else { return }
        let name = UniqueKeyName(queue: record.queue.name, key: key)
        guard case .task(let holder)? = uniqueKeys.holders[name], holder === record else { return }
        let finishedAt = record.finishedAt ?? scheduler.wallClock
        if finishedAt > scheduler.wallClock - Int64(clamping: configuration.maxUniqueForMilliseconds) {
            let tombstone = UniqueKeyTombstone(queue: name.queue, key: key, id: record.id, finishedAt: finishedAt)
            uniqueKeys.holders[name] = .forgotten(id: record.id, finishedAt: finishedAt)
            uniqueKeys.keep(tombstone)
        } else {
            uniqueKeys.holders.removeValue(forKey: name)
        }
        expireTombstones()
    }

    /// Drops the tombstones no window can reach any more, and the oldest beyond the limit.
    func expireTombstones() {
        let reach = scheduler.wallClock - Int64(clamping: configuration.maxUniqueForMilliseconds)
        while let entry = uniqueKeys.tombstones.first {
            let (name, id) = entry
            guard case .forgotten(let holderID, let finishedAt)? = uniqueKeys.holders[name], holderID == id else {
                // Claimed again since, or already dropped.
                uniqueKeys.tombstones.removeFirst()
                continue
            }
            guard finishedAt <= reach || uniqueKeys.tombstones.count > configuration.maxForgottenUniqueKeys else { break }
            uniqueKeys.tombstones.removeFirst()
            uniqueKeys.holders.removeValue(forKey: name)
            uniqueKeys.drop(name)
        }
    }

    /// After `restore` made the records: each key's holder from them and the kept tombstones
    /// (an unfinished task first, else whichever finished last).
    func restoreUniqueKeys(_ saved: [UniqueKeyTombstone], records: [TaskRecord]) {
        for record in records where record.uniqueKey != nil {
            let name = UniqueKeyName(queue: record.queue.name, key: record.uniqueKey!)
            if case .task(let other)? = uniqueKeys.holders[name],
               !other.state.isTerminal || (record.state.isTerminal && (other.finishedAt ?? 0) > (record.finishedAt ?? 0)) {
                continue
            }
            uniqueKeys.holders[name] = .task(record)
        }
        for tombstone in saved.sorted(by: { $0.finishedAt < $1.finishedAt }) {
            let name = UniqueKeyName(queue: tombstone.queue, key: tombstone.key)
            if case .task(let record)? = uniqueKeys.holders[name],
               !record.state.isTerminal || (record.finishedAt ?? 0) >= tombstone.finishedAt {
                // A record of the key decides: its tombstone is only an older one.
                uniqueKeys.drop(name)
                continue
            }
            uniqueKeys.holders[name] = .forgotten(id: tombstone.id, finishedAt: tombstone.finishedAt)
            uniqueKeys.tombstones.append((name, tombstone.id))
        }
        expireTombstones()
    }

    /// Tombstones made and dropped since the last call, for a store to write with the batch.
    public func takeUniqueKeyChanges() -> (kept: [UniqueKeyTombstone], dropped: [UniqueKeyName]) {
        guard !uniqueKeys.kept.isEmpty || !uniqueKeys.dropped.isEmpty else { return ([], []) }
        defer {
            uniqueKeys.kept = [:]
            uniqueKeys.dropped = []
        }
        return (Array(uniqueKeys.kept.values), Array(uniqueKeys.dropped))
    }

    /// The task holding `key` in `queue` (unfinished or finished) or the id of a forgotten one,
    /// for tests and diagnostics.
    public func uniqueKeyHolder(queue: String, key: String) -> TaskID? {
        uniqueKeys.holders[UniqueKeyName(queue: queue, key: key)]?.id
    }

    /// Tombstones kept now.
    public var forgottenUniqueKeyCount: Int {
        uniqueKeys.holders.values.count { if case .forgotten = $0 { true } else { false } }
    }
}

/// The fields few tasks carry, in one box (`TaskRecord.rare`): a `uniqueKey` and the window it
/// was submitted with, and the schedule run that made the task.
final class RareTaskFields {
    let uniqueKey: String?
    let uniqueForMilliseconds: UInt64?
    let schedule: ScheduleSlot?

    init(uniqueKey: String?, uniqueForMilliseconds: UInt64?, schedule: ScheduleSlot?) {
        self.uniqueKey = uniqueKey
        self.uniqueForMilliseconds = uniqueForMilliseconds
        self.schedule = schedule
    }
}

/// A unique key as the index files it: keys are per queue.
public struct UniqueKeyName: Hashable, Sendable {
    public var queue: String
    public var key: String

    public init(queue: String, key: String) {
        self.queue = queue
        self.key = key
    }
}

/// A finished task retention forgot while a submission's window may still reach its end.
public struct UniqueKeyTombstone: Sendable, Equatable {
    public var queue: String
    public var key: String
    public var id: TaskID
    /// Wall-clock milliseconds.
    public var finishedAt: Int64

    public init(queue: String, key: String, id: TaskID, finishedAt: Int64) {
        self.queue = queue
        self.key = key
        self.id = id
        self.finishedAt = finishedAt
    }

    public var name: UniqueKeyName { UniqueKeyName(queue: queue, key: key) }
}

/// The engine's unique keys (Engine+Unique).
///
/// Threading: engine thread only.
struct UniqueKeyIndex {
    enum Holder {
        case task(TaskRecord)
        case forgotten(id: TaskID, finishedAt: Int64)

        var id: TaskID {
            switch self {
            case .task(let record): record.id
            case .forgotten(let id, _): id
            }
        }
    }

    var holders: [UniqueKeyName: Holder] = [:]
    /// Tombstones in the order they were made (by finishing time, near enough), with the id of
    /// each: an entry whose key was claimed again since is skipped when it surfaces.
    var tombstones = Deque<(UniqueKeyName, TaskID)>()
    /// What the store has not yet been given: tombstones to write, and keys whose tombstone goes.
    var kept: [UniqueKeyName: UniqueKeyTombstone] = [:]
    var dropped: Set<UniqueKeyName> = []

    mutating func keep(_ tombstone: UniqueKeyTombstone) {
        tombstones.append((tombstone.name, tombstone.id))
        dropped.remove(tombstone.name)
        kept[tombstone.name] = tombstone
    }

    mutating func drop(_ name: UniqueKeyName) {
        kept.removeValue(forKey: name)
        dropped.insert(name)
    }
}
