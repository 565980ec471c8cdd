/// A cell: the unit of ownership in a cluster of replicas. Every queue belongs to one cell, and
/// every task, workflow and schedule of the queue with it; one live replica at a time owns a
/// cell and runs its engine.
public struct Cell: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let index: UInt16

    public init(_ index: UInt16) { self.index = index }

    public static func < (lhs: Cell, rhs: Cell) -> Bool { lhs.index < rhs.index }

    public var description: String { "cell \(index)" }
}

/// How many cells a cluster has, and which cell a queue is in. The count is fixed when the
/// cluster is created (it is stored with it): a queue's cell must never change while its tasks
/// exist, and every replica, of whatever version, must compute the same one.
public struct CellLayout: Equatable, Sendable {
    /// Cells are numbered in 16 bits: task ids carry theirs (`TaskID` keeps 16 bits for it).
    public static let maximumCount = 1 << 16
    public static let defaultCount = 256

    public let count: Int

    public init(count: Int) {
        precondition((1...Self.maximumCount).contains(count), "a cluster has 1...65536 cells")
        self.count = count
    }

    public var cells: [Cell] { (0..<count).map { Cell(UInt16($0)) } }

    /// The queue's cell: a hash of its name's bytes that is the same on every platform and in
    /// every version (Swift's `Hasher` is seeded per process, so it cannot be used).
    public func cell(ofQueue name: String) -> Cell {
        Cell(UInt16(StableHash.of(name) % UInt64(count)))
    }
}

/// 64-bit hashes that never change: FNV-1a over the bytes, then a strong finalizer (FNV-1a
/// alone spreads short, similar names badly over a modulus).
enum StableHash {
    static func of(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01B3
        }
        return mix(hash)
    }

    /// SplitMix64's finalizer: every input bit reaches every output bit.
    static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}

/// Which live replica should own each cell: rendezvous (highest random weight) hashing. Each
/// replica computes it alone from the same list and gets the same answer; when a replica joins
/// it takes about 1/n of the cells, each from its current owner, and when one leaves only its
/// cells move, spread over the rest.
public enum Rendezvous {
    public static func owner(of cell: Cell, among replicas: [String]) -> String? {
        best(for: cell, among: replicas.map { ($0, StableHash.of($0)) })
    }

    /// The owner of every cell of `layout` among `replicas`.
    public static func assignment(_ layout: CellLayout, among replicas: [String]) -> [Cell: String] {
        let hashed = replicas.map { ($0, StableHash.of($0)) }
        var owners: [Cell: String] = [:]
        owners.reserveCapacity(layout.count)
        for cell in layout.cells {
            owners[cell] = best(for: cell, among: hashed)
        }
        return owners
    }

    private static func best(for cell: Cell, among replicas: [(name: String, hash: UInt64)]) -> String? {
        let cellHash = StableHash.mix(UInt64(cell.index) &+ 0x9e37_79b9_7f4a_7c15)
        var best: (weight: UInt64, name: String)?
        for (name, hash) in replicas {
            let weight = StableHash.mix(hash ^ cellHash)
            // Ties (astronomically rare) go to the smaller name, so every replica agrees.
            if let current = best, weight < current.weight || (weight == current.weight && name > current.name) { continue }
            best = (weight, name)
        }
        return best?.name
    }
}
