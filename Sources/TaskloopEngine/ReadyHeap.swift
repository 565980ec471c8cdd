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

    /// Every queued task, emptying this.
    mutating func removeAll() -> [TaskRecord] {
        var records: [TaskRecord] = []
        while let record = popBest() { records.append(record) }
        return records
    }

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

    /// The best task that is still queued, left in place; stale entries are dropped.
    mutating func best() -> TaskRecord? {
        while let entry = heap.max {
            if entry.record.state == .queued { return entry.record }
            heap.removeMax()
        }
        return nil
    }

    /// Whether `record` runs before `other` (both queued, in one queue).
    static func precedes(_ record: TaskRecord, _ other: TaskRecord) -> Bool {
        record.priority != other.priority ? record.priority > other.priority : record.sequence < other.sequence
    }
}

/// A worker queue's ready tasks, by kind: a lease that asks for some kinds takes the best of
/// those kinds' heads instead of passing over every task of other kinds. A server knows a
/// handful of kinds, so they are a list, scanned without hashing.
struct ReadyByKind {
    private var kinds: [String] = []
    private var heaps: [ReadyHeap] = []

    mutating func insert(_ record: TaskRecord) {
        if let index = kinds.firstIndex(of: record.kind) { return heaps[index].insert(record) }
        kinds.append(record.kind)
        heaps.append(ReadyHeap())
        heaps[heaps.count - 1].insert(record)
    }

    /// The best queued task of `kinds` (of any kind when nil), removed.
    mutating func popBest(of wanted: Set<String>?) -> TaskRecord? {
        var bestIndex: Int?
        var best: TaskRecord?
        for index in heaps.indices where wanted?.contains(kinds[index]) ?? true {
            guard let head = heaps[index].best() else { continue }
            if best == nil || ReadyHeap.precedes(head, best!) {
                best = head
                bestIndex = index
            }
        }
        guard let bestIndex else { return nil }
        return heaps[bestIndex].popBest()
    }

    /// Whether a task of any kind is still queued (stale heads are dropped on the way).
    mutating func hasQueued() -> Bool {
        heaps.indices.contains { heaps[$0].best() != nil }
    }

    /// Every queued task, emptying this.
    mutating func removeAll() -> [TaskRecord] {
        var records: [TaskRecord] = []
        for index in heaps.indices { records += heaps[index].removeAll() }
        kinds.removeAll()
        heaps.removeAll()
        return records
    }
}
