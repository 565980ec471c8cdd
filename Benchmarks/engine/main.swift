// Engine benchmark: TaskloopEngine and Foundation's OperationQueue (BlockOperation +
// addDependency, maxConcurrentOperationCount 2) on the same workloads with no-op bodies, in one
// process and one run. Prints tasks/s for each and the ratio, W1 and W4 at 1/4, 1/2 and full
// size, and bytes of memory per retained terminal noop task.
import Foundation
import TaskloopEngine
import TaskloopJSON

/// A generator that replays the same DAG for both contenders.
struct SplitMix64 {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Task i's dependencies (indices of earlier tasks); index 0 of `blockedRoot` workloads is the root.
struct Workload {
    let name: String
    let count: Int
    let dependencies: (Int) -> [Int]
    /// W3/W5: task 0 is held until everything is submitted.
    let blockedRoot: Bool
    /// W5: everything is cancelled while the root is held; the time to drain is measured.
    let cancelAll: Bool
}

func independent(_ count: Int) -> Workload {
    Workload(name: "W1 \(count) independent", count: count, dependencies: { _ in [] }, blockedRoot: false, cancelAll: false)
}

func randomDAG(_ count: Int) -> Workload {
    var random = SplitMix64(state: 42)
    let table: [[Int]] = (0..<count).map { index in
        guard index > 0 else { return [] }
        let picks = Int(random.next() % 4)
        var chosen = Set<Int>()
        for _ in 0..<picks { chosen.insert(index - 1 - Int(random.next() % UInt64(min(1_000, index)))) }
        return chosen.sorted()
    }
    return Workload(name: "W4 \(count) random DAG", count: count, dependencies: { table[$0] }, blockedRoot: false, cancelAll: false)
}

let chain = Workload(name: "W2 10000 chain", count: 10_000, dependencies: { $0 == 0 ? [] : [$0 - 1] },
                     blockedRoot: false, cancelAll: false)
let fan = Workload(name: "W3 1 -> 20000 -> 1", count: 20_002,
                   dependencies: { $0 == 0 ? [] : $0 == 20_001 ? Array(1...20_000) : [0] }, blockedRoot: true, cancelAll: false)
let drain = Workload(name: "W5 100000 cancelled", count: 100_001, dependencies: { $0 == 0 ? [] : [0] },
                     blockedRoot: true, cancelAll: true)

/// The production engine with a clock that never fires: noop tasks need no timers.
final class StillClock: EngineScheduler {
    var now: UInt64 { 0 }
    var wallClock: Int64 { 1_795_000_000_000 }
    final class Never: ScheduledAction { func cancel() {} }
    func schedule(after delay: UInt64, _ action: @escaping () -> Void) -> ScheduledAction { Never() }
}

func seconds(_ body: () -> Void) -> Double {
    let start = DispatchTime.now().uptimeNanoseconds
    body()
    return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
}

func runEngine(_ workload: Workload) -> Double {
    var configuration = EngineConfiguration()
    configuration.defaultConcurrency = 2
    configuration.maxUnfinishedTasks = 2_000_000
    configuration.maxRetainedTasks = 2_000_000
    let engine = Engine(configuration: configuration, scheduler: StillClock())
    var ids: [TaskID] = []
    ids.reserveCapacity(workload.count)
    return seconds {
        for index in 0..<workload.count {
            let kind = workload.blockedRoot && index == 0 ? "external" : "noop"
            let spec = TaskSpec(kind: kind, dependencies: workload.dependencies(index).map { .task(ids[$0]) })
            ids.append(try! engine.submit(spec).id)
        }
        if workload.cancelAll {
            engine.cancelAll(inQueue: "default")
            // The root's worker reports, learns of the cancellation (409), and the root ends.
            _ = try? engine.report(.complete(result: nil), for: ids[0])
        } else if workload.blockedRoot {
            try! engine.report(.complete(result: nil), for: ids[0])
        }
        precondition(engine.unfinishedCount == 0, "engine did not finish \(workload.name)")
    }
}

func runOperationQueue(_ workload: Workload) -> Double {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 2
    let gate = DispatchSemaphore(value: 0)
    var operations: [BlockOperation] = []
    operations.reserveCapacity(workload.count)
    return seconds {
        for index in 0..<workload.count {
            let operation = workload.blockedRoot && index == 0 ? BlockOperation { gate.wait() } : BlockOperation {}
            for dependency in workload.dependencies(index) { operation.addDependency(operations[dependency]) }
            operations.append(operation)
        }
        queue.addOperations(operations, waitUntilFinished: false)
        if workload.cancelAll { queue.cancelAllOperations() }
        if workload.blockedRoot { gate.signal() }
        queue.waitUntilAllOperationsAreFinished()
    }
}

func residentBytes() -> Int {
    let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
    let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
    return (Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0) * 1024
}

let quick = CommandLine.arguments.contains("--quick")
/// For profiling the engine alone.
let engineOnly = CommandLine.arguments.contains("--engine-only")
let scale = quick ? 10 : 1
func sized(_ make: (Int) -> Workload, _ full: Int) -> [Workload] {
    [full / 4, full / 2, full].map { make($0 / scale) }
}
let workloads = sized(independent, 100_000) + [chain, fan] + sized(randomDAG, 50_000) + [drain]

// Memory: RSS growth while 1,000,000 finished noop tasks are retained, measured first, in a
// heap nothing was freed to yet: after the workloads, their freed memory took in part of the
// tasks unseen (the figure read ~100 bytes lower per task than a fresh process's).
var memoryLine = ""
do {
    let retainedCount = 1_000_000 / scale
    var configuration = EngineConfiguration()
    configuration.maxUnfinishedTasks = 2_000_000
    configuration.maxRetainedTasks = 2_000_000
    let before = residentBytes()
    let engine = Engine(configuration: configuration, scheduler: StillClock())
    for _ in 0..<retainedCount { _ = try! engine.submit(TaskSpec(kind: "noop")) }
    let after = residentBytes()
    memoryLine = String(format: "memory: %.0f bytes per retained terminal noop task (RSS +%.1f MiB over %d tasks, %d retained)",
                        Double(after - before) / Double(retainedCount), Double(after - before) / 1_048_576,
                        retainedCount, engine.taskCount)
}

print("TaskloopEngine vs OperationQueue (maxConcurrentOperationCount 2), no-op bodies, best of 3")
print(String(repeating: " ", count: 1), "workload".padding(toLength: 24, withPad: " ", startingAt: 0),
      "engine tasks/s".leftPadded(16), "OperationQueue tasks/s".leftPadded(24), "ratio".leftPadded(8))
for workload in workloads {
    let engine = (0..<3).map { _ in runEngine(workload) }.min()!
    let foundation = engineOnly ? .nan : (0..<(workload.count > 50_000 ? 1 : 3)).map { _ in runOperationQueue(workload) }.min()!
    let engineRate = Double(workload.count) / engine
    let foundationRate = Double(workload.count) / foundation
    print(" ", workload.name.padding(toLength: 24, withPad: " ", startingAt: 0),
          String(format: "%16.0f", engineRate), String(format: "%24.0f", foundationRate),
          String(format: "%7.1fx", engineRate / foundationRate))
    fflush(nil)
}

print(memoryLine)

extension String {
    func leftPadded(_ width: Int) -> String { String(repeating: " ", count: max(0, width - count)) + self }
}
