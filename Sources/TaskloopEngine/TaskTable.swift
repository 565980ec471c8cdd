/// The engine's tasks by id, in creation order: an insertion-ordered open-addressing table in
/// the manner of CPython's compact dict.
///
/// `entries` holds the records in creation order (so sorted by id), with nil where one was
/// removed; `slots` maps a hash of the id to an entry index. Removing leaves a hole that
/// lookups step over; holes are squeezed out when the table next grows, so removal is O(1)
/// and memory stays within a constant factor of the live tasks.
///
/// Why not `Dictionary`: ids are made by the engine, never chosen by clients, and their low
/// word is random or counting, so a multiplicative hash spreads them without SipHash; growing
/// re-inserts without rehashing through `Hasher`; and creation order comes for free, for
/// listings and cursors. Measured on the engine benchmark it halves the cost of keeping tasks.
///
/// Threading: engine thread only.
struct TaskTable {
    /// Records in creation order; nil where one was removed.
    private(set) var entries: [TaskRecord?] = []
    /// Indexes into `entries`, or `empty`. At most three quarters are in use: ids hashed by
    /// Fibonacci hashing spread evenly, so probes stay short, and at half (the bound before)
    /// the slots took 16 bytes of every task at a million of them, 8 now.
    private var slots: [Int32]
    /// 64 - log2(slots.count): the hash is the top bits of a multiplicative mix.
    private var shift: UInt64 = 60
    private(set) var count = 0

    private static let empty: Int32 = -1

    init() {
        slots = [Int32](repeating: Self.empty, count: 16)
    }

    private var mask: Int { slots.count - 1 }

    /// Fibonacci hashing: consecutive ids (the common case) land far apart.
    private func hash(_ id: TaskID) -> Int {
        Int(truncatingIfNeeded: ((id.low ^ id.high) &* 0x9E37_79B9_7F4A_7C15) >> shift)
    }

    subscript(id: TaskID) -> TaskRecord? {
        var slot = hash(id) & mask
        while true {
            let entry = slots[slot]
            if entry == Self.empty { return nil }
            if let record = entries[Int(entry)], record.id == id { return record }
            slot = (slot + 1) & mask
        }
    }

    /// Adds a record whose id is greater than every id in the table.
    mutating func append(_ record: TaskRecord) {
        assert((entries.last ?? nil).map { $0.id < record.id } ?? true, "ids must increase")
        if needsRebuild { rebuild() }
        insertSlot(hash(record.id), entry: Int32(entries.count))
        entries.append(record)
        count += 1
    }

    /// Adds a record whose id may be below others in the table: a workflow member another
    /// cell made (Engine+CellWorkflows), usually just below the newest ones. In its place by
    /// id: the records after it move up one, and so does each one's slot (the first in its
    /// probe sequence holding its old place; a stale slot of a removed record may be the one,
    /// which does as well, as lookups compare ids). O(records after it).
    mutating func insert(_ record: TaskRecord) {
        guard let last = entries.last(where: { $0 != nil }) ?? nil, record.id < last.id else { return append(record) }
        if needsRebuild { rebuild() }
        let position = endIndex(below: record.id)
        // From the end, so a slot moved to a place is never taken for the one leaving it.
        for index in stride(from: entries.count - 1, through: position, by: -1) {
            guard let moving = entries[index] else { continue }
            var slot = hash(moving.id) & mask
            while slots[slot] != Int32(index) { slot = (slot + 1) & mask }
            slots[slot] = Int32(index + 1)
        }
        entries.insert(record, at: position)
        insertSlot(hash(record.id), entry: Int32(position))
        count += 1
    }

    /// Removes a record; returns false if it was not there.
    @discardableResult
    mutating func remove(_ id: TaskID) -> Bool {
        var slot = hash(id) & mask
        while true {
            let entry = slots[slot]
            if entry == Self.empty { return false }
            if let record = entries[Int(entry)], record.id == id {
                entries[Int(entry)] = nil
                count -= 1
                return true
            }
            slot = (slot + 1) & mask
        }
    }

    /// Whether one more entry would fill more than three quarters of the slots.
    private var needsRebuild: Bool { (entries.count + 1) * 4 > slots.count * 3 }

    private mutating func insertSlot(_ hash: Int, entry: Int32) {
        var slot = hash & mask
        while slots[slot] != Self.empty { slot = (slot + 1) & mask }
        slots[slot] = entry
    }

    /// Squeezes out holes and sizes the slots for the live records with room to grow.
    private mutating func rebuild() {
        entries.removeAll { $0 == nil }
        var size = 16
        shift = 60
        while size < (count + 1) * 2 {
            size *= 2
            shift -= 1
        }
        slots = [Int32](repeating: Self.empty, count: size)
        for (index, record) in entries.enumerated() {
            insertSlot(hash(record!.id), entry: Int32(index))
        }
    }

    /// The position in `entries` just past every record whose id is below `id` (ids ascend).
    func endIndex(below id: TaskID) -> Int {
        var low = 0, high = entries.count
        while low < high {
            let middle = (low + high) / 2
            // Compare with the nearest record at or before `middle`; holes carry no id.
            var probe = middle
            while probe >= low, entries[probe] == nil { probe -= 1 }
            if probe < low {
                low = middle + 1
            } else if entries[probe]!.id < id {
                low = middle + 1
            } else {
                high = probe
            }
        }
        return low
    }
}
