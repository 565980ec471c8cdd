import HeapModule

/// Deadlines in wall-clock time (`run_at`, `expires_at`), which the engine keeps itself rather
/// than as monotonic timers: a wall clock set forward or back moves them with it, and 100,000
/// delayed tasks cost one heap entry each and one armed timer in all.
///
/// Entries are never removed early: one whose task has moved on is dropped when it surfaces
/// (the engine checks), or all at once when they outnumber what can still be live.
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

    private var heap = Heap<Entry>()

    var count: Int { heap.count }
    var nextDeadline: Int64? { heap.min?.deadline }

    mutating func insert(_ record: TaskRecord, at deadline: Int64, for purpose: Purpose) {
        heap.insert(Entry(deadline: deadline, sequence: record.sequence, purpose: purpose, record: record))
    }

    /// The earliest entry due at `wallClock`, removed.
    mutating func popDue(at wallClock: Int64) -> Entry? {
        guard let next = heap.min, next.deadline <= wallClock else { return nil }
        return heap.removeMin()
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
