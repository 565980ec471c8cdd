import HeapModule

/// A queue's ready tasks: higher priority first, then earlier submission.
struct ReadyHeap {
    private struct Entry: Comparable {
        let priority: Int
        let sequence: UInt64
        let record: TaskRecord

        /// "Less" means "runs later": lower priority, or same priority and submitted later.
        static func < (lhs: Entry, rhs: Entry) -> Bool {
            lhs.priority != rhs.priority ? lhs.priority < rhs.priority : lhs.sequence > rhs.sequence
        }

        static func == (lhs: Entry, rhs: Entry) -> Bool { lhs.sequence == rhs.sequence }
    }

    private var heap = Heap<Entry>()

    mutating func insert(_ record: TaskRecord) {
        heap.insert(Entry(priority: record.priority, sequence: record.sequence, record: record))
    }

    /// The best task that is still queued; stale entries are dropped on the way.
    mutating func popBest() -> TaskRecord? {
        while let entry = heap.popMax() {
            if entry.record.state == .queued { return entry.record }
        }
        return nil
    }
}
