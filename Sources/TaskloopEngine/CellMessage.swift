import TaskloopJSON

/// What one cell's engine tells another about a dependency across cells (docs/SCALING.md,
/// "Under way: cells"). A message leaves its engine as an `EngineEvent.messageSent` in the
/// settled batch of the change that made it, so a store commits it with that change; the
/// receiving cell's owner hands it to `Engine.apply(_:)` once.
///
/// The protocol, per dependency D and the cell W of tasks that name it:
/// - `watch` (W to D's cell): tasks of W depend on D. D's cell keeps W among D's watchers
///   (with the record) and answers at once with `ended` if D is already terminal, `missing` if
///   it holds no D.
/// - `ended` (D's cell to each watcher): D reached `state`, with its `result`: W's tasks take
///   their inputs from it (Engine+Outputs), as D itself may be forgotten before they start.
/// - `reopened` (D's cell to each watcher): a retry brought D back; W brings back the tasks D
///   cancelled, as a local retry does, and waits for D again.
/// - `missing` (D's cell to W): no such task; W's tasks waiting on D are cancelled
///   (`unknown_dependency`), not left to wait for ever.
///
/// `epoch` is how many times D had been brought back when the message was sent: W ignores an
/// end or a reopening older than what it already applied for D.
///
/// Workflows across cells (Engine+Workflows), per workflow F, its home cell H (the cell F's
/// id carries) and each other cell M holding members of it:
/// - `members` (H to M): create these members of `workflow` (`members`, specs in full,
///   dependencies resolved to ids). Checked in H already: M refuses nothing.
/// - `memberChanged` (M to H): member `dependency` of `workflow` ended, was brought back, or
///   progressed: its `state` (pending for brought back) and progress `fraction` now.
/// - `cancelMembers`, `retryMembers` (H to M): cancel, or retry, M's members of `workflow`, as
///   `cancelWorkflow` and `retryWorkflow` do with H's own.
///
/// A cell must apply a workflow message from H before any message sent to it after that one
/// (whoever sent it): a member cell's watch of a sibling must not reach the sibling's cell
/// before the sibling does. The cluster's inbox does so: it is one sequence, read in order,
/// and a message is sent only in the commit of what caused it.
public struct CellMessage: Sendable, Equatable, CustomStringConvertible {
    public enum Kind: UInt8, Sendable {
        case watch = 1
        case ended = 2
        case reopened = 3
        case missing = 4
        case members = 5
        case memberChanged = 6
        case cancelMembers = 7
        case retryMembers = 8

        /// Workflow kinds (5 and up) name a workflow and take the longer encoding.
        var isAboutWorkflow: Bool { rawValue >= Kind.members.rawValue }
    }

    /// A workflow member a home cell tells another cell to create.
    public struct Member: Sendable, Equatable {
        public var id: TaskID
        /// Dependencies are `.task` ids, siblings' resolved.
        public var spec: TaskSpec
        public var createdAt: Int64

        public init(id: TaskID, spec: TaskSpec, createdAt: Int64) {
            self.id = id
            self.spec = spec
            self.createdAt = createdAt
        }
    }

    public var kind: Kind
    public var from: UInt16
    public var to: UInt16
    public var dependency: TaskID
    public var epoch: UInt32
    /// The terminal state `ended` reports, the member's state `memberChanged` reports; nil for the other kinds.
    public var state: TaskState?
    /// The workflow of the workflow kinds; nil for the others.
    public var workflow: TaskID?
    /// `members`' tasks to create.
    public var members: [Member]
    /// The member's progress `memberChanged` reports.
    public var fraction: Double?
    /// The result of the dependency `ended` reports, if it has one.
    public var result: JSONValue?

    public init(_ kind: Kind, from: UInt16, to: UInt16, dependency: TaskID, epoch: UInt32 = 0, state: TaskState? = nil,
                result: JSONValue? = nil) {
        self.kind = kind
        self.from = from
        self.to = to
        self.dependency = dependency
        self.epoch = epoch
        self.state = state
        self.result = result
        workflow = nil
        members = []
        fraction = nil
    }

    /// A workflow kind's message; `dependency` is the member `memberChanged` reports on (else the workflow).
    public init(_ kind: Kind, from: UInt16, to: UInt16, workflow: TaskID, member: TaskID? = nil, epoch: UInt32 = 0,
                state: TaskState? = nil, fraction: Double? = nil, members: [Member] = []) {
        self.init(kind, from: from, to: to, dependency: member ?? workflow, epoch: epoch, state: state)
        self.workflow = workflow
        self.fraction = fraction
        self.members = members
    }

    public var description: String {
        let about = workflow.map { workflow in
            "\(workflow)\(dependency == workflow ? "" : " \(dependency)")\(members.isEmpty ? "" : " \(members.count) members")"
        } ?? "\(dependency)"
        return "\(kind)(\(about)@\(epoch)\(state.map { " \($0.rawValue)" } ?? "")) \(from)->\(to)"
    }

    // MARK: bytes

    /// The encoding's version, its first byte: 1 for the dependency kinds (3 for an `ended`
    /// with a result), 3 for the workflow kinds (2 before members had optional fields; still read).
    static let version: UInt8 = 1
    static let resultVersion: UInt8 = 3
    static let workflowVersion: UInt8 = 3
    /// Version 1's size: version, kind, from, to, dependency (16), epoch, state; big-endian.
    public static let encodedSize = 27

    /// The stable binary form a store keeps. Version 2 is version 1's fields (its state byte
    /// codes every state), then the workflow (16), the fraction (a presence byte, then its 8
    /// bytes), and the members (a count, then each: id, created at, the spec's fields in a
    /// fixed order, strings and JSON as a 4-byte length and UTF-8). Version 3 of the workflow
    /// kinds ends each member with its optional fields: a 2-byte set of which follow, then each
    /// in the set's order (`MemberFields`). Version 3 of `ended` is version 1's fields, then the
    /// result as JSON.
    public var encoded: [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Self.encodedSize)
        bytes.append(kind.isAboutWorkflow ? Self.workflowVersion : result == nil ? Self.version : Self.resultVersion)
        bytes.append(kind.rawValue)
        Self.append(UInt64(from), bytes: 2, to: &bytes)
        Self.append(UInt64(to), bytes: 2, to: &bytes)
        Self.append(dependency, to: &bytes)
        Self.append(UInt64(epoch), bytes: 4, to: &bytes)
        // 0 for none, else 1 + its place among the states (terminal ones first, as version 1 has them).
        bytes.append(state.flatMap { Self.states.firstIndex(of: $0) }.map { UInt8($0 + 1) } ?? 0)
        guard kind.isAboutWorkflow else {
            if let result { Self.append(result.encoded, to: &bytes) }
            return bytes
        }
        Self.append(workflow ?? dependency, to: &bytes)
        bytes.append(fraction == nil ? 0 : 1)
        if let fraction { Self.append(fraction.bitPattern, bytes: 8, to: &bytes) }
        Self.append(UInt64(members.count), bytes: 4, to: &bytes)
        for member in members { Self.append(member, to: &bytes) }
        return bytes
    }

    /// Reads `encoded`'s form; nil for anything else (another length, version, kind or state).
    public init?(encoded bytes: some Collection<UInt8>) {
        var reader = Reader(bytes: Array(bytes))
        guard let version = reader.byte(), let kind = reader.byte().flatMap(Kind.init(rawValue:)),
              kind.isAboutWorkflow ? (version == 2 || version == Self.workflowVersion)
                : version == Self.version || (version == Self.resultVersion && kind == .ended),
              let from = reader.integer(2), let to = reader.integer(2), let dependency = reader.id(),
              let epoch = reader.integer(4), let stateCode = reader.byte().map(Int.init),
              stateCode <= (kind.isAboutWorkflow ? Self.states.count : Self.terminalStateCount) else { return nil }
        let state = stateCode == 0 ? nil : Self.states[stateCode - 1]
        guard (kind == .ended || kind == .memberChanged) == (state != nil) else { return nil }
        self.init(kind, from: UInt16(from), to: UInt16(to), dependency: dependency, epoch: UInt32(epoch), state: state)
        if !kind.isAboutWorkflow && version == Self.resultVersion {
            guard case .some(.some(let result)) = reader.json() else { return nil }
            self.result = result
        }
        if kind.isAboutWorkflow {
            guard let workflow = reader.id(), let hasFraction = reader.byte(), hasFraction <= 1 else { return nil }
            self.workflow = workflow
            if hasFraction == 1 {
                guard let bits = reader.integer(8) else { return nil }
                fraction = Double(bitPattern: bits)
            }
            guard let count = reader.integer(4), count <= reader.remaining else { return nil }
            for _ in 0..<count {
                guard let member = reader.member(withOptionalFields: version >= 3) else { return nil }
                members.append(member)
            }
        }
        guard reader.remaining == 0 else { return nil }
    }

    private static let states: [TaskState] = [.succeeded, .failed, .cancelled, .pending, .queued, .running, .scheduled]

    /// A member's optional fields (version 3), in the order they follow. Times are wall-clock
    /// milliseconds, resolved from the home's submission.
    private struct MemberFields: OptionSet {
        let rawValue: UInt16
        static let runAt = MemberFields(rawValue: 1 << 0)
        static let expiry = MemberFields(rawValue: 1 << 1)
        /// A string: a 4-byte length and UTF-8.
        static let uniqueKey = MemberFields(rawValue: 1 << 2)
        static let uniqueFor = MemberFields(rawValue: 1 << 3)
        /// A string, as `uniqueKey`.
        static let concurrencyKey = MemberFields(rawValue: 1 << 4)
        /// The schedule run that made the workflow: its id (16 bytes), then its slot (8).
        static let schedule = MemberFields(rawValue: 1 << 5)
        static let known: MemberFields = [.runAt, .expiry, .uniqueKey, .uniqueFor, .concurrencyKey, .schedule]
    }
    private static let terminalStateCount = 3

    private static func append(_ value: UInt64, bytes count: Int, to bytes: inout [UInt8]) {
        for shift in stride(from: (count - 1) * 8, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }

    private static func append(_ id: TaskID, to bytes: inout [UInt8]) {
        append(id.high, bytes: 8, to: &bytes)
        append(id.low, bytes: 8, to: &bytes)
    }

    private static func append(_ text: [UInt8]?, to bytes: inout [UInt8]) {
        guard let text else { return append(UInt64(UInt32.max), bytes: 4, to: &bytes) }
        append(UInt64(text.count), bytes: 4, to: &bytes)
        bytes += text
    }

    private static func append(_ member: Member, to bytes: inout [UInt8]) {
        let spec = member.spec
        append(member.id, to: &bytes)
        append(UInt64(bitPattern: member.createdAt), bytes: 8, to: &bytes)
        append(Array(spec.kind.utf8), to: &bytes)
        append(spec.params.encoded, to: &bytes)
        append(spec.name.map { Array($0.utf8) }, to: &bytes)
        append(Array(spec.queue.utf8), to: &bytes)
        append(UInt64(bitPattern: Int64(spec.priority)), bytes: 8, to: &bytes)
        append(UInt64(spec.dependencies.count), bytes: 4, to: &bytes)
        for case .task(let id) in spec.dependencies { append(id, to: &bytes) }
        bytes.append(spec.onDependencyFailure == .cancel ? 0 : 1)
        bytes.append(spec.timeoutMilliseconds == nil ? 0 : 1)
        if let timeout = spec.timeoutMilliseconds { append(timeout, bytes: 8, to: &bytes) }
        append(UInt64(bitPattern: Int64(spec.retry.maxAttempts)), bytes: 8, to: &bytes)
        append(spec.retry.backoffMilliseconds, bytes: 8, to: &bytes)
        append(spec.retry.backoffFactor.bitPattern, bytes: 8, to: &bytes)
        append(spec.metadata?.encoded, to: &bytes)
        let runAt = spec.runAt?.instant(submittedAt: member.createdAt)
        let expiry = spec.expiry?.instant(submittedAt: member.createdAt)
        var fields: MemberFields = []
        if runAt != nil { fields.insert(.runAt) }
        if expiry != nil { fields.insert(.expiry) }
        if spec.uniqueKey != nil { fields.insert(.uniqueKey) }
        if spec.uniqueForMilliseconds != nil { fields.insert(.uniqueFor) }
        if spec.concurrencyKey != nil { fields.insert(.concurrencyKey) }
        if spec.schedule != nil { fields.insert(.schedule) }
        append(UInt64(fields.rawValue), bytes: 2, to: &bytes)
        if let runAt { append(UInt64(bitPattern: runAt), bytes: 8, to: &bytes) }
        if let expiry { append(UInt64(bitPattern: expiry), bytes: 8, to: &bytes) }
        if let uniqueKey = spec.uniqueKey { append(Array(uniqueKey.utf8), to: &bytes) }
        if let window = spec.uniqueForMilliseconds { append(window, bytes: 8, to: &bytes) }
        if let concurrencyKey = spec.concurrencyKey { append(Array(concurrencyKey.utf8), to: &bytes) }
        if let schedule = spec.schedule {
            append(schedule.id, to: &bytes)
            append(UInt64(bitPattern: schedule.slot), bytes: 8, to: &bytes)
        }
    }

    private struct Reader {
        let bytes: [UInt8]
        var position = 0

        var remaining: Int { bytes.count - position }

        mutating func byte() -> UInt8? {
            guard position < bytes.count else { return nil }
            position += 1
            return bytes[position - 1]
        }

        mutating func integer(_ count: Int) -> UInt64? {
            guard remaining >= count else { return nil }
            defer { position += count }
            return bytes[position..<position + count].reduce(0) { $0 << 8 | UInt64($1) }
        }

        mutating func id() -> TaskID? {
            guard let high = integer(8), let low = integer(8) else { return nil }
            return TaskID(high: high, low: low)
        }

        /// A length-prefixed byte string; `.some(nil)` for the absent one.
        mutating func text() -> [UInt8]?? {
            guard let count = integer(4) else { return nil }
            if count == UInt64(UInt32.max) { return .some(nil) }
            guard count <= remaining else { return nil }
            defer { position += Int(count) }
            return .some(Array(bytes[position..<position + Int(count)]))
        }

        mutating func string() -> String? {
            guard case .some(.some(let text)) = text() else { return nil }
            return String(validating: text, as: UTF8.self)
        }

        mutating func json() -> JSONValue?? {
            guard case .some(let text) = text() else { return nil }
            guard let text else { return .some(nil) }
            guard let value = try? JSONParser.parse(text) else { return nil }
            return .some(value)
        }

        mutating func member(withOptionalFields: Bool) -> Member? {
            guard let id = id(), let createdAt = integer(8), let kind = string(), case .some(.some(let params)) = json(),
                  case .some(let name) = text(), let queue = string(), let priority = integer(8),
                  let count = integer(4), count <= remaining else { return nil }
            var dependencies: [DependencyReference] = []
            for _ in 0..<count {
                guard let dependency = self.id() else { return nil }
                dependencies.append(.task(dependency))
            }
            guard let policy = byte(), policy <= 1, let hasTimeout = byte(), hasTimeout <= 1 else { return nil }
            var timeout: UInt64?
            if hasTimeout == 1 {
                guard let value = integer(8) else { return nil }
                timeout = value
            }
            guard let maxAttempts = integer(8), let backoff = integer(8), let factor = integer(8),
                  case .some(let metadata) = json() else { return nil }
            let nameText: String?
            if let name {
                guard let decoded = String(validating: name, as: UTF8.self) else { return nil }
                nameText = decoded
            } else {
                nameText = nil
            }
            var spec = TaskSpec(
                kind: kind, params: params, name: nameText, queue: queue, priority: Int(Int64(bitPattern: priority)),
                dependencies: dependencies, onDependencyFailure: policy == 0 ? .cancel : .run, timeoutMilliseconds: timeout,
                retry: RetryPolicy(maxAttempts: Int(Int64(bitPattern: maxAttempts)), backoffMilliseconds: backoff,
                                   backoffFactor: Double(bitPattern: factor)),
                metadata: metadata)
            if withOptionalFields {
                guard let rawFields = integer(2) else { return nil }
                let fields = MemberFields(rawValue: UInt16(rawFields))
                guard fields.isSubset(of: .known) else { return nil }
                if fields.contains(.runAt) {
                    guard let runAt = integer(8) else { return nil }
                    spec.runAt = .at(Int64(bitPattern: runAt))
                }
                if fields.contains(.expiry) {
                    guard let expiry = integer(8) else { return nil }
                    spec.expiry = .at(Int64(bitPattern: expiry))
                }
                if fields.contains(.uniqueKey) {
                    guard let uniqueKey = string() else { return nil }
                    spec.uniqueKey = uniqueKey
                }
                if fields.contains(.uniqueFor) {
                    guard let window = integer(8) else { return nil }
                    spec.uniqueForMilliseconds = window
                }
                if fields.contains(.concurrencyKey) {
                    guard let concurrencyKey = string() else { return nil }
                    spec.concurrencyKey = concurrencyKey
                }
                if fields.contains(.schedule) {
                    guard let schedule = self.id(), let slot = integer(8) else { return nil }
                    spec.schedule = ScheduleSlot(id: schedule, slot: Int64(bitPattern: slot))
                }
            }
            return Member(id: id, spec: spec, createdAt: Int64(bitPattern: createdAt))
        }
    }
}
