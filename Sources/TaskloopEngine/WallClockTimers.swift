import HeapModule

/// Deadlines in wall-clock time (`run_at`, `expires_at`), which the engine keeps itself rather
/// than as monotonic timers: a wall clock set forward or back moves them with it, and 100,000
/// delayed tasks cost one heap entry each and one armed timer in all.
///
/// Entries are never removed early: one whose task has moved on is dropped when it surfaces
/// (the engine checks), or all at once when they outnumber what can still be live.
///
/// Schedules' next due times (Engine+Schedules) sit in a second heap behind the same timer: one
/// entry per active schedule, made for its `generation`; a schedule that changed since leaves
/// its old entry to be dropped when it surfaces.
///
/// Threading: engine thread only.
struct WallClockTimers {
    enum Purpose: UInt8 {
        /// The task leaves `scheduled`.
        case start
        /// The task is cancelled as `expired` if it has not started.
        case expiry
    }

    struct Entry: Comparable {
        let deadline: Int64
        let sequence: UInt64
        let purpose: Purpose
        let record: TaskRecord

        static func < (lhs: Entry, rhs: Entry) -> Bool {
            (lhs.deadline, lhs.sequence, lhs.purpose.rawValue) < (rhs.deadline, rhs.sequence, rhs.purpose.rawValue)
        }
        static func == (lhs: Entry, rhs: Entry) -> Bool {
            lhs.deadline == rhs.deadline && lhs.sequence == rhs.sequence && lhs.purpose == rhs.purpose
        }
    }

    struct ScheduleEntry: Comparable {
        let deadline: Int64
        let slot: Int64
        let generation: UInt32
        let schedule: ScheduleRecord

        static func < (lhs: ScheduleEntry, rhs: ScheduleEntry) -> Bool {
            (lhs.deadline, lhs.schedule.id) < (rhs.deadline, rhs.schedule.id)
        }
        static func == (lhs: ScheduleEntry, rhs: ScheduleEntry) -> Bool {
            lhs.deadline == rhs.deadline && lhs.schedule === rhs.schedule
        }

        var isStale: Bool { schedule.deleted || schedule.generation != generation }
    }

    private var heap = Heap<Entry>()
    private var schedules = Heap<ScheduleEntry>()

    var count: Int { heap.count }
    var scheduleEntryCount: Int { schedules.count }
    var nextDeadline: Int64? {
        switch (heap.min?.deadline, schedules.min?.deadline) {
        case (let task?, let schedule?): min(task, schedule)
        case (let task, let schedule): task ?? schedule
        }
    }

    mutating func insert(_ record: TaskRecord, at deadline: Int64, for purpose: Purpose) {
        heap.insert(Entry(deadline: deadline, sequence: record.sequence, purpose: purpose, record: record))
    }

    /// The earliest entry due at `wallClock`, removed.
    mutating func popDue(at wallClock: Int64) -> Entry? {
        guard let next = heap.min, next.deadline <= wallClock else { return nil }
        return heap.removeMin()
    }

    /// `schedule` is next due at `deadline` (its `slot` plus jitter).
    mutating func insert(_ schedule: ScheduleRecord, slot: Int64, at deadline: Int64) {
        schedules.insert(ScheduleEntry(deadline: deadline, slot: slot, generation: schedule.generation, schedule: schedule))
    }

    /// The earliest live schedule entry due at `wallClock`, removed (stale ones on the way dropped).
    mutating func popDueSchedule(at wallClock: Int64) -> ScheduleEntry? {
        while let next = schedules.min, next.deadline <= wallClock {
            let entry = schedules.removeMin()
            if !entry.isStale { return entry }
        }
        return nil
    }

    /// Drops schedule entries made stale by changes, when they outnumber the live ones.
    mutating func dropStaleScheduleEntries(liveCount: Int) {
        guard schedules.count > 64 && schedules.count > 2 * liveCount else { return }
        schedules = Heap(schedules.unordered.filter { !$0.isStale })
    }

    /// Drops the entries `isStale` names.
    mutating func removeAll(where isStale: (Entry) -> Bool) {
        heap = Heap(heap.unordered.filter { !isStale($0) })
    }

    /// For the invariants: what each task has an entry for.
    func purposesByRecord() -> [ObjectIdentifier: Set<Purpose>] {
        var purposes: [ObjectIdentifier: Set<Purpose>] = [:]
        for entry in heap.unordered { purposes[ObjectIdentifier(entry.record), default: []].insert(entry.purpose) }
        return purposes
    }
}
