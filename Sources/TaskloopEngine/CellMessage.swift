/// What one cell's engine tells another about a dependency across cells (docs/SCALING.md,
/// "Under way: cells"). A message leaves its engine as an `EngineEvent.messageSent` in the
/// settled batch of the change that made it, so a store commits it with that change; the
/// receiving cell's owner hands it to `Engine.apply(_:)` once.
///
/// The protocol, per dependency D and the cell W of tasks that name it:
/// - `watch` (W to D's cell): tasks of W depend on D. D's cell keeps W among D's watchers
///   (with the record) and answers at once with `ended` if D is already terminal, `missing` if
///   it holds no D.
/// - `ended` (D's cell to each watcher): D reached `state`.
/// - `reopened` (D's cell to each watcher): a retry brought D back; W brings back the tasks D
///   cancelled, as a local retry does, and waits for D again.
/// - `missing` (D's cell to W): no such task; W's tasks waiting on D are cancelled
///   (`unknown_dependency`), not left to wait for ever.
///
/// `epoch` is how many times D had been brought back when the message was sent: W ignores an
/// end or a reopening older than what it already applied for D.
public struct CellMessage: Sendable, Hashable, CustomStringConvertible {
    public enum Kind: UInt8, Sendable {
        case watch = 1
        case ended = 2
        case reopened = 3
        case missing = 4
    }

    public var kind: Kind
    public var from: UInt16
    public var to: UInt16
    public var dependency: TaskID
    public var epoch: UInt32
    /// The terminal state `ended` reports; nil for the other kinds.
    public var state: TaskState?

    public init(_ kind: Kind, from: UInt16, to: UInt16, dependency: TaskID, epoch: UInt32 = 0, state: TaskState? = nil) {
        self.kind = kind
        self.from = from
        self.to = to
        self.dependency = dependency
        self.epoch = epoch
        self.state = state
    }

    public var description: String {
        "\(kind)(\(dependency)@\(epoch)\(state.map { " \($0.rawValue)" } ?? "")) \(from)->\(to)"
    }

    // MARK: bytes

    /// The encoding's version, its first byte.
    static let version: UInt8 = 1
    /// Version, kind, from, to, dependency (16), epoch, state: big-endian.
    public static let encodedSize = 27

    /// The stable binary form a store keeps.
    public var encoded: [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Self.encodedSize)
        bytes.append(Self.version)
        bytes.append(kind.rawValue)
        Self.append(UInt64(from), bytes: 2, to: &bytes)
        Self.append(UInt64(to), bytes: 2, to: &bytes)
        Self.append(dependency.high, bytes: 8, to: &bytes)
        Self.append(dependency.low, bytes: 8, to: &bytes)
        Self.append(UInt64(epoch), bytes: 4, to: &bytes)
        // 0 for none, else 1 + its place among the terminal states.
        bytes.append(state.flatMap { Self.terminalStates.firstIndex(of: $0) }.map { UInt8($0 + 1) } ?? 0)
        return bytes
    }

    /// Reads `encoded`'s form; nil for anything else (another length, version, kind or state).
    public init?(encoded bytes: some Collection<UInt8>) {
        let bytes = Array(bytes)
        guard bytes.count == Self.encodedSize, bytes[0] == Self.version, let kind = Kind(rawValue: bytes[1]) else { return nil }
        func read(_ start: Int, _ count: Int) -> UInt64 {
            bytes[start..<start + count].reduce(0) { $0 << 8 | UInt64($1) }
        }
        let stateCode = Int(bytes[26])
        guard stateCode <= Self.terminalStates.count else { return nil }
        let state = stateCode == 0 ? nil : Self.terminalStates[stateCode - 1]
        guard (kind == .ended) == (state != nil) else { return nil }
        self.init(kind, from: UInt16(read(2, 2)), to: UInt16(read(4, 2)),
                  dependency: TaskID(high: read(6, 8), low: read(14, 8)), epoch: UInt32(read(22, 4)), state: state)
    }

    private static let terminalStates: [TaskState] = [.succeeded, .failed, .cancelled]

    private static func append(_ value: UInt64, bytes count: Int, to bytes: inout [UInt8]) {
        for shift in stride(from: (count - 1) * 8, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }
}
