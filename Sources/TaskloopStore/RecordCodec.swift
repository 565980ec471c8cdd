import TaskloopEngine
import TaskloopJSON

/// Why a stored record cannot be read back: the database holds something this server did not
/// write (a damaged or hand-edited row).
public struct RecordDecodingError: Error, Equatable, CustomStringConvertible {
    public let table: String
    public let reason: String
    public var description: String { "a row of \(table) cannot be read: \(reason)" }
}

/// Records as the store keeps them: a compact binary form, because the bytes of every task
/// pass through the write-ahead log and the checkpoint, and at restart every retained task is
/// decoded before the server listens. A noop task takes about 70 bytes (its JSON form took
/// 400).
///
/// The layout: a format byte; a bit set saying which optional fields follow; then the fields
/// in a fixed order. Integers are LEB128 varints (signed ones zigzagged), ids 16 bytes
/// big-endian, strings a length and UTF-8, free-form values (params, metadata, results,
/// details) a length and their JSON text, enums the stable codes below (never their
/// declaration order). A new optional field takes the next bit and goes at the end, so older
/// records stay readable without a migration.
enum RecordCodec {
    static let taskFormat: UInt8 = 1
    static let workflowFormat: UInt8 = 1

    /// Which optional fields a task record holds.
    private struct TaskFields: OptionSet {
        let rawValue: UInt64
        static let params = TaskFields(rawValue: 1 << 0)
        static let name = TaskFields(rawValue: 1 << 1)
        static let timeout = TaskFields(rawValue: 1 << 2)
        static let metadata = TaskFields(rawValue: 1 << 3)
        static let workflow = TaskFields(rawValue: 1 << 4)
        static let cancelRequested = TaskFields(rawValue: 1 << 5)
        static let startedAt = TaskFields(rawValue: 1 << 6)
        static let finishedAt = TaskFields(rawValue: 1 << 7)
        static let result = TaskFields(rawValue: 1 << 8)
        static let error = TaskFields(rawValue: 1 << 9)
        static let progressFraction = TaskFields(rawValue: 1 << 10)
        static let progressMessage = TaskFields(rawValue: 1 << 11)
        static let progressDetails = TaskFields(rawValue: 1 << 12)
        static let progressUpdatedAt = TaskFields(rawValue: 1 << 13)
        static let notBefore = TaskFields(rawValue: 1 << 14)
        static let lease = TaskFields(rawValue: 1 << 15)
        /// Written by replicas that took turns (v2): the replica running the attempt. Read past.
        static let runner = TaskFields(rawValue: 1 << 16)
        static let releasedBy = TaskFields(rawValue: 1 << 17)
        /// Cells waiting for the task's end (a cluster's dependencies across cells).
        static let watchers = TaskFields(rawValue: 1 << 18)
        static let reopenings = TaskFields(rawValue: 1 << 19)
        static let scheduledFor = TaskFields(rawValue: 1 << 20)
        static let expiresAt = TaskFields(rawValue: 1 << 21)
        /// What the task's output references took from its dependencies (Engine+Outputs).
        static let inputs = TaskFields(rawValue: 1 << 22)
        static let resolvedParams = TaskFields(rawValue: 1 << 23)
        static let uniqueKey = TaskFields(rawValue: 1 << 24)
        static let uniqueFor = TaskFields(rawValue: 1 << 25)
        static let concurrencyKey = TaskFields(rawValue: 1 << 26)
        /// The schedule run that made the task (Engine+Schedules): its id and slot.
        static let schedule = TaskFields(rawValue: 1 << 27)
        static let known = TaskFields(rawValue: (1 << 28) - 1)
    }

    /// The task without its sequence number, which is the row's key.
    static func encode(_ task: TaskSnapshot, into output: inout RecordWriter) {
        var fields: TaskFields = []
        if task.params != .object([:]) { fields.insert(.params) }
        if task.name != nil { fields.insert(.name) }
        if task.timeoutMilliseconds != nil { fields.insert(.timeout) }
        if task.metadata != nil { fields.insert(.metadata) }
        if task.workflow != nil { fields.insert(.workflow) }
        if task.cancelRequested { fields.insert(.cancelRequested) }
        if task.startedAt != nil { fields.insert(.startedAt) }
        if task.finishedAt != nil { fields.insert(.finishedAt) }
        if task.result != nil { fields.insert(.result) }
        if task.error != nil { fields.insert(.error) }
        if task.progress.fraction != nil { fields.insert(.progressFraction) }
        if task.progress.message != nil { fields.insert(.progressMessage) }
        if task.progress.details != nil { fields.insert(.progressDetails) }
        if task.progress.updatedAt != nil { fields.insert(.progressUpdatedAt) }
        if task.notBefore != nil { fields.insert(.notBefore) }
        if task.lease != nil { fields.insert(.lease) }
        if !task.releasedBy.isEmpty { fields.insert(.releasedBy) }
        if !task.watchers.isEmpty { fields.insert(.watchers) }
        if task.reopenings != 0 { fields.insert(.reopenings) }
        if task.scheduledFor != nil { fields.insert(.scheduledFor) }
        if task.expiresAt != nil { fields.insert(.expiresAt) }
        if !task.inputs.isEmpty { fields.insert(.inputs) }
        if task.resolvedParams != nil { fields.insert(.resolvedParams) }
        if task.uniqueKey != nil { fields.insert(.uniqueKey) }
        if task.uniqueForMilliseconds != nil { fields.insert(.uniqueFor) }
        if task.concurrencyKey != nil { fields.insert(.concurrencyKey) }
        if task.schedule != nil { fields.insert(.schedule) }

        output.byte(taskFormat)
        output.unsigned(fields.rawValue)
        output.id(task.id)
        output.string(task.kind)
        output.byte(code(of: task.state))
        output.unsigned(UInt64(task.attempt))
        output.string(task.queue)
        output.signed(Int64(task.priority))
        output.unsigned(UInt64(task.dependencies.count))
        for dependency in task.dependencies { output.id(dependency) }
        output.byte(code(of: task.onDependencyFailure))
        output.unsigned(UInt64(task.retry.maxAttempts))
        output.unsigned(task.retry.backoffMilliseconds)
        output.double(task.retry.backoffFactor)
        output.signed(task.createdAt)
        if fields.contains(.params) { output.json(task.params) }
        if let name = task.name { output.string(name) }
        if let timeout = task.timeoutMilliseconds { output.unsigned(timeout) }
        if let metadata = task.metadata { output.json(metadata) }
        if let workflow = task.workflow { output.id(workflow) }
        if let startedAt = task.startedAt { output.signed(startedAt) }
        if let finishedAt = task.finishedAt { output.signed(finishedAt) }
        if let result = task.result { output.json(result) }
        if let error = task.error {
            output.string(error.code)
            output.string(error.message)
            output.json(.object(error.details))
        }
        if let fraction = task.progress.fraction { output.double(fraction) }
        if let message = task.progress.message { output.string(message) }
        if let details = task.progress.details { output.json(details) }
        if let updatedAt = task.progress.updatedAt { output.signed(updatedAt) }
        if let notBefore = task.notBefore { output.signed(notBefore) }
        if let lease = task.lease {
            output.string(lease.token)
            output.string(lease.worker)
            output.signed(lease.grantedAt)
            output.unsigned(lease.milliseconds)
            output.signed(lease.expiresAt)
        }
        if !task.releasedBy.isEmpty {
            output.unsigned(UInt64(task.releasedBy.count))
            for id in task.releasedBy { output.id(id) }
        }
        if !task.watchers.isEmpty {
            output.unsigned(UInt64(task.watchers.count))
            for cell in task.watchers { output.unsigned(UInt64(cell)) }
        }
        if task.reopenings != 0 { output.unsigned(UInt64(task.reopenings)) }
        if let scheduledFor = task.scheduledFor { output.signed(scheduledFor) }
        if let expiresAt = task.expiresAt { output.signed(expiresAt) }
        if !task.inputs.isEmpty {
            output.unsigned(UInt64(task.inputs.count))
            for input in task.inputs {
                output.string(input.from)
                output.string(input.pointer.description)
                output.json(input.value)
            }
        }
        if let resolvedParams = task.resolvedParams { output.json(resolvedParams) }
        if let uniqueKey = task.uniqueKey { output.string(uniqueKey) }
        if let uniqueFor = task.uniqueForMilliseconds { output.unsigned(uniqueFor) }
        if let concurrencyKey = task.concurrencyKey { output.string(concurrencyKey) }
        if let schedule = task.schedule {
            output.id(schedule.id)
            output.signed(schedule.slot)
        }
    }

    static func decodeTask(_ bytes: UnsafeRawBufferPointer, sequence: UInt64) throws(RecordDecodingError) -> TaskSnapshot {
        var input = RecordReader(bytes, table: "tasks")
        guard try input.byte() == taskFormat else { throw input.failure("unknown record format") }
        let fields = TaskFields(rawValue: try input.unsigned())
        guard fields.isSubset(of: .known) else { throw input.failure("fields this server does not know") }
        let id = try input.id()
        let kind = try input.string()
        let state = try input.state()
        let attempt = try input.nonNegativeInt()
        let queue = try input.string()
        let priority = Int(try input.signed())
        var dependencies: [TaskID] = []
        let dependencyCount = try input.count(ofAtLeast: 16)
        dependencies.reserveCapacity(dependencyCount)
        for _ in 0..<dependencyCount { dependencies.append(try input.id()) }
        let onDependencyFailure = try input.dependencyFailurePolicy()
        let retry = RetryPolicy(maxAttempts: try input.nonNegativeInt(), backoffMilliseconds: try input.unsigned(),
                                backoffFactor: try input.double())
        let createdAt = try input.signed()
        let params = try input.json(if: fields.contains(.params)) ?? .object([:])
        let name = fields.contains(.name) ? try input.string() : nil
        let timeout = fields.contains(.timeout) ? try input.unsigned() : nil
        let metadata = try input.json(if: fields.contains(.metadata))
        let workflow = fields.contains(.workflow) ? try input.id() : nil
        let startedAt = fields.contains(.startedAt) ? try input.signed() : nil
        let finishedAt = fields.contains(.finishedAt) ? try input.signed() : nil
        let result = try input.json(if: fields.contains(.result))
        var error: TaskError?
        if fields.contains(.error) {
            let code = try input.string()
            let message = try input.string()
            guard let details = try input.json().objectValue else { throw input.failure("error details are not an object") }
            error = TaskError(code: code, message: message, details: details)
        }
        let progress = TaskProgress(
            fraction: fields.contains(.progressFraction) ? try input.double() : nil,
            message: fields.contains(.progressMessage) ? try input.string() : nil,
            details: try input.json(if: fields.contains(.progressDetails)),
            updatedAt: fields.contains(.progressUpdatedAt) ? try input.signed() : nil)
        let notBefore = fields.contains(.notBefore) ? try input.signed() : nil
        var lease: LeaseSnapshot?
        if fields.contains(.lease) {
            lease = LeaseSnapshot(token: try input.string(), worker: try input.string(), grantedAt: try input.signed(),
                                  milliseconds: try input.unsigned(), expiresAt: try input.signed())
        }
        if fields.contains(.runner) { _ = try input.string() }
        var releasedBy: [TaskID] = []
        if fields.contains(.releasedBy) {
            for _ in 0..<(try input.count(ofAtLeast: 16)) { releasedBy.append(try input.id()) }
        }
        var watchers: [UInt16] = []
        if fields.contains(.watchers) {
            for _ in 0..<(try input.count(ofAtLeast: 1)) {
                guard let cell = UInt16(exactly: try input.unsigned()) else { throw input.failure("a cell beyond 65535") }
                watchers.append(cell)
            }
        }
        var reopenings: UInt32 = 0
        if fields.contains(.reopenings) {
            guard let count = UInt32(exactly: try input.unsigned()) else { throw input.failure("too many reopenings") }
            reopenings = count
        }
        let scheduledFor = fields.contains(.scheduledFor) ? try input.signed() : nil
        let expiresAt = fields.contains(.expiresAt) ? try input.signed() : nil
        var inputs: [TaskInput] = []
        if fields.contains(.inputs) {
            for _ in 0..<(try input.count(ofAtLeast: 3)) {
                let from = try input.string()
                let text = try input.string()
                guard let pointer = try? JSONPointer(text) else { throw input.failure("an input's pointer is not a JSON Pointer") }
                inputs.append(TaskInput(from: from, pointer: pointer, value: try input.json()))
            }
        }
        let resolvedParams = try input.json(if: fields.contains(.resolvedParams))
        let uniqueKey = fields.contains(.uniqueKey) ? try input.string() : nil
        let uniqueFor = fields.contains(.uniqueFor) ? try input.unsigned() : nil
        let concurrencyKey = fields.contains(.concurrencyKey) ? try input.string() : nil
        let schedule = fields.contains(.schedule) ? ScheduleSlot(id: try input.id(), slot: try input.signed()) : nil
        guard input.isAtEnd else { throw input.failure("bytes after the last field") }
        return TaskSnapshot(
            id: id, sequence: sequence, kind: kind, params: params, name: name, queue: queue, priority: priority,
            dependencies: dependencies, onDependencyFailure: onDependencyFailure, timeoutMilliseconds: timeout,
            retry: retry, metadata: metadata, workflow: workflow, createdAt: createdAt, state: state,
            cancelRequested: fields.contains(.cancelRequested), attempt: attempt, startedAt: startedAt,
            finishedAt: finishedAt, result: result, error: error, progress: progress, notBefore: notBefore, lease: lease,
            releasedBy: releasedBy, watchers: watchers, reopenings: reopenings, scheduledFor: scheduledFor,
            expiresAt: expiresAt, inputs: inputs, resolvedParams: resolvedParams, uniqueKey: uniqueKey,
            uniqueForMilliseconds: uniqueFor, concurrencyKey: concurrencyKey, schedule: schedule)
    }

    /// Which optional fields a workflow record holds.
    private struct WorkflowFields: OptionSet {
        let rawValue: UInt64
        static let name = WorkflowFields(rawValue: 1 << 0)
        /// What members in other cells last reported (a cluster's workflows across cells).
        static let remoteMembers = WorkflowFields(rawValue: 1 << 1)
        /// The schedule run that made it: its id and slot, as a task's.
        static let schedule = WorkflowFields(rawValue: 1 << 2)
        static let known = WorkflowFields(rawValue: (1 << 3) - 1)
    }

    /// A remote member's fraction, when it has one, follows its state code with this bit set.
    private static let fractionFollows: UInt8 = 0x80

    static func encode(_ workflow: WorkflowSnapshot, into output: inout RecordWriter) {
        var fields: WorkflowFields = []
        if workflow.name != nil { fields.insert(.name) }
        if !workflow.remoteMembers.isEmpty { fields.insert(.remoteMembers) }
        if workflow.schedule != nil { fields.insert(.schedule) }
        output.byte(workflowFormat)
        output.unsigned(fields.rawValue)
        output.signed(workflow.createdAt)
        output.unsigned(UInt64(workflow.keys.count))
        for key in workflow.keys {
            output.string(key.key)
            output.id(key.id)
        }
        if let name = workflow.name { output.string(name) }
        if !workflow.remoteMembers.isEmpty {
            output.unsigned(UInt64(workflow.remoteMembers.count))
            for member in workflow.remoteMembers {
                output.id(member.id)
                output.byte(code(of: member.state) | (member.fraction == nil ? 0 : fractionFollows))
                if let fraction = member.fraction { output.double(fraction) }
            }
        }
        if let schedule = workflow.schedule {
            output.id(schedule.id)
            output.signed(schedule.slot)
        }
    }

    static func decodeWorkflow(_ bytes: UnsafeRawBufferPointer, id: TaskID) throws(RecordDecodingError) -> WorkflowSnapshot {
        var input = RecordReader(bytes, table: "workflows")
        guard try input.byte() == workflowFormat else { throw input.failure("unknown record format") }
        let fields = WorkflowFields(rawValue: try input.unsigned())
        guard fields.isSubset(of: .known) else { throw input.failure("fields this server does not know") }
        let createdAt = try input.signed()
        let count = try input.count(ofAtLeast: 17)
        var keys: [WorkflowSnapshot.WorkflowKey] = []
        keys.reserveCapacity(count)
        for _ in 0..<count {
            let key = try input.string()
            keys.append(WorkflowSnapshot.WorkflowKey(key: key, id: try input.id()))
        }
        let name = fields.contains(.name) ? try input.string() : nil
        var remoteMembers: [WorkflowRecord.RemoteMember] = []
        if fields.contains(.remoteMembers) {
            let count = try input.count(ofAtLeast: 17)
            remoteMembers.reserveCapacity(count)
            for _ in 0..<count {
                let member = try input.id()
                let code = try input.byte()
                guard let state = RecordCodec.state(code: code & ~fractionFollows) else { throw input.failure("an unknown state") }
                let fraction = code & fractionFollows != 0 ? try input.double() : nil
                remoteMembers.append(WorkflowRecord.RemoteMember(id: member, state: state, fraction: fraction))
            }
        }
        let schedule = fields.contains(.schedule) ? ScheduleSlot(id: try input.id(), slot: try input.signed()) : nil
        guard input.isAtEnd else { throw input.failure("bytes after the last field") }
        return WorkflowSnapshot(id: id, name: name, createdAt: createdAt, keys: keys, remoteMembers: remoteMembers,
                                schedule: schedule)
    }

    // Stable codes: a record written today must read the same after the enums gain cases.
    static func code(of state: TaskState) -> UInt8 {
        switch state {
        case .pending: 0
        case .queued: 1
        case .running: 2
        case .succeeded: 3
        case .failed: 4
        case .cancelled: 5
        case .scheduled: 6
        }
    }

    static func state(code: UInt8) -> TaskState? {
        switch code {
        case 0: .pending
        case 1: .queued
        case 2: .running
        case 3: .succeeded
        case 4: .failed
        case 5: .cancelled
        case 6: .scheduled
        default: nil
        }
    }

    static func code(of policy: DependencyFailurePolicy) -> UInt8 {
        switch policy {
        case .cancel: 0
        case .run: 1
        }
    }

    static func dependencyFailurePolicy(code: UInt8) -> DependencyFailurePolicy? {
        switch code {
        case 0: .cancel
        case 1: .run
        default: nil
        }
    }
}

/// Appends record fields to one reusable buffer (the writer thread encodes a whole batch
/// through one).
struct RecordWriter {
    private(set) var bytes: [UInt8] = []

    init() { bytes.reserveCapacity(512) }

    private mutating func clear() { bytes.removeAll(keepingCapacity: true) }

    /// `task`'s record, encoded afresh into this writer's buffer.
    mutating func record(of task: TaskSnapshot) -> [UInt8] {
        clear()
        RecordCodec.encode(task, into: &self)
        return bytes
    }

    mutating func record(of workflow: WorkflowSnapshot) -> [UInt8] {
        clear()
        RecordCodec.encode(workflow, into: &self)
        return bytes
    }

    mutating func byte(_ value: UInt8) { bytes.append(value) }

    mutating func unsigned(_ value: UInt64) {
        var value = value
        while value >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }

    mutating func signed(_ value: Int64) {
        unsigned(UInt64(bitPattern: (value << 1) ^ (value >> 63)))
    }

    mutating func double(_ value: Double) {
        var bits = value.bitPattern
        for _ in 0..<8 {
            bytes.append(UInt8(truncatingIfNeeded: bits))
            bits >>= 8
        }
    }

    mutating func id(_ id: TaskID) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: id.high >> UInt64(shift))) }
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: id.low >> UInt64(shift))) }
    }

    mutating func string(_ text: String) {
        var text = text
        text.withUTF8 { utf8 in
            unsigned(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    /// Bytes as they are (their length written before them by the caller).
    mutating func raw(_ values: [UInt8]) { bytes.append(contentsOf: values) }

    mutating func json(_ value: JSONValue) {
        var writer = JSONWriter(capacity: 64)
        writer.value(value)
        unsigned(UInt64(writer.bytes.count))
        bytes.append(contentsOf: writer.bytes)
    }
}

/// Reads record fields with every length checked against what is left: a damaged row is an
/// error naming its table, never a crash.
struct RecordReader {
    private let bytes: UnsafeRawBufferPointer
    private var offset = 0
    let table: String

    init(_ bytes: UnsafeRawBufferPointer, table: String) {
        self.bytes = bytes
        self.table = table
    }

    var isAtEnd: Bool { offset == bytes.count }

    func failure(_ reason: String) -> RecordDecodingError {
        RecordDecodingError(table: table, reason: "\(reason) (at byte \(offset))")
    }

    mutating func byte() throws(RecordDecodingError) -> UInt8 {
        guard offset < bytes.count else { throw failure("the record ends early") }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func unsigned() throws(RecordDecodingError) -> UInt64 {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let next = try byte()
            guard shift < 64, shift < 63 || next <= 1 else { throw failure("a number is too long") }
            value |= UInt64(next & 0x7F) << shift
            if next < 0x80 { return value }
            shift += 7
        }
    }

    mutating func nonNegativeInt() throws(RecordDecodingError) -> Int {
        guard let value = Int(exactly: try unsigned()) else { throw failure("a count is out of range") }
        return value
    }

    mutating func signed() throws(RecordDecodingError) -> Int64 {
        let zigzag = try unsigned()
        return Int64(bitPattern: zigzag >> 1) ^ -Int64(bitPattern: zigzag & 1)
    }

    /// A count of items each at least `size` bytes long, checked against what is left.
    mutating func count(ofAtLeast size: Int) throws(RecordDecodingError) -> Int {
        let count = try unsigned()
        guard count <= UInt64(bytes.count - offset) / UInt64(size) else { throw failure("a count exceeds the record") }
        return Int(count)
    }

    mutating func double() throws(RecordDecodingError) -> Double {
        guard bytes.count - offset >= 8 else { throw failure("the record ends early") }
        var bits: UInt64 = 0
        for index in (0..<8).reversed() { bits = bits << 8 | UInt64(bytes[offset + index]) }
        offset += 8
        return Double(bitPattern: bits)
    }

    mutating func id() throws(RecordDecodingError) -> TaskID {
        guard bytes.count - offset >= 16 else { throw failure("the record ends early") }
        var high: UInt64 = 0, low: UInt64 = 0
        for index in 0..<8 { high = high << 8 | UInt64(bytes[offset + index]) }
        for index in 8..<16 { low = low << 8 | UInt64(bytes[offset + index]) }
        offset += 16
        return TaskID(high: high, low: low)
    }

    private mutating func span() throws(RecordDecodingError) -> UnsafeBufferPointer<UInt8> {
        let count = try self.count(ofAtLeast: 1)
        defer { offset += count }
        return UnsafeBufferPointer(rebasing: bytes.assumingMemoryBound(to: UInt8.self)[offset..<offset + count])
    }

    /// `count` bytes as they are.
    mutating func raw(count: Int) throws(RecordDecodingError) -> [UInt8] {
        guard bytes.count - offset >= count else { throw failure("the record ends early") }
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }

    /// ASCII (names, kinds, queues, keys: nearly every string kept) is valid UTF-8 as it is and
    /// is made without `String(validating:)`, whose generic path took a restart a quarter of
    /// its instructions (callgrind of a restart of 50,000 queued tasks).
    mutating func string() throws(RecordDecodingError) -> String {
        let utf8 = try span()
        var high: UInt8 = 0
        for byte in utf8 { high |= byte }
        if high < 0x80 { return String(decoding: utf8, as: UTF8.self) }
        guard let text = String(validating: utf8, as: UTF8.self) else { throw failure("a string is not UTF-8") }
        return text
    }

    mutating func json() throws(RecordDecodingError) -> JSONValue {
        let text = try span()
        do {
            return try JSONParser.parse(text, maxDepth: 512)
        } catch {
            throw failure("a value is not JSON: \(error)")
        }
    }

    /// A free-form value when `present`; `.none` (not JSON's null) otherwise.
    mutating func json(if present: Bool) throws(RecordDecodingError) -> JSONValue? {
        present ? .some(try json()) : .none
    }

    mutating func state() throws(RecordDecodingError) -> TaskState {
        guard let state = RecordCodec.state(code: try byte()) else { throw failure("an unknown state") }
        return state
    }

    mutating func dependencyFailurePolicy() throws(RecordDecodingError) -> DependencyFailurePolicy {
        guard let policy = RecordCodec.dependencyFailurePolicy(code: try byte()) else {
            throw failure("an unknown dependency failure policy")
        }
        return policy
    }
}
