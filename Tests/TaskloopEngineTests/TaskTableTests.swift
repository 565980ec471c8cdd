import Testing
import TaskloopTestSupport
@testable import TaskloopEngine

@Suite struct TaskTableTests {
    private let queue = TaskQueue(name: "default", maxConcurrency: 1)
    private let kind = TaskKind(name: "noop", executor: NoopExecutor())

    private func record(_ id: TaskID) -> TaskRecord {
        TaskRecord(id: id, sequence: 0, spec: TaskSpec(kind: "noop"), kind: kind, queue: queue, dependencies: [],
                   createdAt: 0)
    }

    /// Random appends and removals against a plain model: lookups, counts, creation order and
    /// cursor positions must agree after every step, across many rebuilds.
    @Test func agreesWithAModelUnderRandomAppendsAndRemovals() {
        var random = SplitMix64(seed: 7)
        var table = TaskTable()
        var model: [TaskID] = []
        var generator = TaskIDGenerator(random: SplitMix64(seed: 11))
        var clock: Int64 = 1_795_000_000_000
        for step in 0..<20_000 {
            if model.isEmpty || random.below(3) > 0 {
                clock += Int64(random.below(2))
                let id = generator.next(wallClockMilliseconds: clock)
                table.append(record(id))
                model.append(id)
            } else {
                let victim = model.remove(at: random.below(model.count))
                let removed = table.remove(victim), removedAgain = table.remove(victim)
                #expect(removed && !removedAgain)
                #expect(table[victim] == nil)
            }
            #expect(table.count == model.count)
            if step % 997 == 0 {
                #expect(table.entries.compactMap { $0?.id } == model)
                for id in model { #expect(table[id]?.id == id) }
                for probe in model.prefix(50) {
                    let position = table.endIndex(below: probe)
                    #expect(table.entries[..<position].allSatisfy { $0.map { $0.id < probe } ?? true })
                    #expect(table.entries[position...].allSatisfy { $0.map { $0.id >= probe } ?? true })
                }
            }
        }
    }

    /// Members another cell made arrive below the newest ids: inserted in their place, among
    /// removals and appends, the table still agrees with a sorted model.
    @Test func insertsBelowTheNewestAgreeWithAModel() {
        var random = SplitMix64(seed: 9)
        var table = TaskTable()
        var model: [TaskID] = []
        var newest: UInt64 = 0
        for step in 0..<20_000 {
            switch random.below(4) {
            case 0 where !model.isEmpty:
                let victim = model.remove(at: random.below(model.count))
                let removed = table.remove(victim)
                #expect(removed)
            case 1 where model.count > 2:
                // Between two neighbours, near the end.
                let at = model.count - 1 - random.below(min(model.count - 1, 40))
                let below = model[at - 1], above = model[at]
                guard above.low > below.low + 1 && above.high == below.high else { break }
                let id = TaskID(high: below.high, low: below.low + 1 + random.next() % (above.low - below.low - 1))
                table.insert(record(id))
                model.insert(id, at: at)
            default:
                newest += 1 + UInt64(random.below(1_000))
                let id = TaskID(high: 1, low: newest)
                table.insert(record(id))
                model.append(id)
            }
            #expect(table.count == model.count)
            if step % 499 == 0 {
                #expect(table.entries.compactMap { $0?.id } == model)
                for id in model { #expect(table[id]?.id == id) }
            }
        }
        #expect(table.entries.compactMap { $0?.id } == model)
        for id in model { #expect(table[id]?.id == id) }
    }

    @Test func unknownIdsAreNotFound() {
        var table = TaskTable()
        var generator = TaskIDGenerator(random: SplitMix64(seed: 3))
        for _ in 0..<100 { table.append(record(generator.next(wallClockMilliseconds: 5))) }
        #expect(table[TaskID(high: 1, low: 2)] == nil)
        let removed = table.remove(TaskID(high: 1, low: 2))
        #expect(!removed)
        #expect(table.endIndex(below: TaskID(high: 0, low: 0)) == 0)
        #expect(table.endIndex(below: TaskID(high: .max, low: .max)) == 100)
    }
}

@Suite struct TaskIDCellTests {
    @Test func idsMadeForACellCarryItAndStillIncrease() {
        var generator = TaskIDGenerator(random: SplitMix64(seed: 5), cell: 0x0A3F)
        var previous = TaskID(high: 0, low: 0)
        for step in 0..<2_000 {
            // Many ids per millisecond, and the clock stepping back now and then.
            let id = generator.next(wallClockMilliseconds: 1_700_000_000_000 + Int64(step / 100) - (step % 250 == 0 ? 5 : 0))
            #expect(id.cell == 0x0A3F)
            #expect(id > previous)
            #expect(TaskID(id.description) == id)
            previous = id
        }
    }

    @Test func countingPastTheLowWordMovesToTheNextMillisecondKeepingTheCell() {
        var generator = TaskIDGenerator(random: SplitMix64(seed: 5), cell: 7)
        generator.continueAfter(TaskID(high: 1_000 << 16 | 7, low: .max))
        let id = generator.next(wallClockMilliseconds: 1_000)
        #expect(id.cell == 7 && id.timestamp == 1_001)
        // After an id of another cell in the same millisecond (a restored one), too.
        generator.continueAfter(TaskID(high: 2_000 << 16 | 9, low: 5))
        let after = generator.next(wallClockMilliseconds: 2_000)
        #expect(after.cell == 7 && after > TaskID(high: 2_000 << 16 | 9, low: 5))
        // A single server's ids keep random bits there, and carry into them as before.
        var single = TaskIDGenerator(random: SplitMix64(seed: 5))
        single.continueAfter(TaskID(high: 1_000 << 16 | 7, low: .max))
        #expect(single.next(wallClockMilliseconds: 1_000) == TaskID(high: 1_000 << 16 | 8, low: 0))
    }
}
