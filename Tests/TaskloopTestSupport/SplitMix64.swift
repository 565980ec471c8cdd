import Foundation
/// A small, fast, seedable generator (SplitMix64), so randomized tests replay from a seed.
public struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number in 0..<bound (0 when bound <= 1).
    public mutating func below(_ bound: Int) -> Int {
        bound <= 1 ? 0 : Int(next() % UInt64(bound))
    }
}

/// The seeds of a property test: `TASKLOOP_ENGINE_SEED=<n>` runs just that one (a failure
/// names it), `TASKLOOP_ENGINE_SEEDS=<count>` runs that many instead of `count`.
public func propertySeeds(base: UInt64, count: Int) -> [UInt64] {
    let environment = ProcessInfo.processInfo.environment
    if let one = environment["TASKLOOP_ENGINE_SEED"].flatMap({ UInt64($0) }) { return [one] }
    let count = Int(environment["TASKLOOP_ENGINE_SEEDS"] ?? "") ?? count
    return (1...UInt64(count)).map { base + $0 }
}

/// Runs a property test's `run` for each seed (`propertySeeds`) until one fails; that failure,
/// naming its seed so that it can be run alone, or nil.
public func firstPropertyFailure(base: UInt64, count: Int, _ run: (UInt64) -> String?) -> String? {
    for seed in propertySeeds(base: base, count: count) {
        if let failure = run(seed) { return "seed \(seed) (TASKLOOP_ENGINE_SEED=\(seed)): \(failure)" }
    }
    return nil
}
