import Foundation
import Testing
import TaskloopEngine
import TaskloopJSON
@testable import TaskloopStore

/// The binary records, and the migration that rewrote version 1's JSON ones.
@Suite struct RecordCodecTests {
    static let rich = TaskSnapshot(
        id: TaskID(high: 0x0192_3456_789A_BCDE, low: 0xFEDC_BA98_7654_3210), sequence: 7, kind: "http",
        params: ["url": "http://example.test/", "n": 1.5], name: "fetch ✓", queue: "io", priority: -3,
        dependencies: [TaskID(high: 1, low: 2), TaskID(high: 3, low: 4)], onDependencyFailure: .run,
        timeoutMilliseconds: 60_000, retry: RetryPolicy(maxAttempts: 5, backoffMilliseconds: 250, backoffFactor: 1.5),
        metadata: ["owner": "me", "tags": ["a", nil]], workflow: TaskID(high: 9, low: 9), createdAt: 1_795_000_000_000,
        state: .failed, cancelRequested: true, attempt: 5, startedAt: 1_795_000_000_001, finishedAt: 1_795_000_000_002,
        result: .null, error: TaskError(code: "http_status", message: "502", details: ["status": 502]),
        progress: TaskProgress(fraction: 0.25, message: "a quarter", details: .null, updatedAt: 1_795_000_000_003),
        notBefore: -1, releasedBy: [TaskID(high: 3, low: 4)], watchers: [3, 65_535], reopenings: 2, uniqueKey: "invoice ✓",
        uniqueForMilliseconds: 86_400_000, concurrencyKey: "tenant ✓")

    static func encoded(_ task: TaskSnapshot) -> [UInt8] {
        var output = RecordWriter()
        return output.record(of: task)
    }

    static func decoded(_ bytes: [UInt8], sequence: UInt64 = 7) throws -> TaskSnapshot {
        try bytes.withUnsafeBytes { buffer in try RecordCodec.decodeTask(buffer, sequence: sequence) }
    }

    @Test func everyFieldRoundTrips() throws {
        #expect(try Self.decoded(Self.encoded(Self.rich)) == Self.rich)
        // Absent optionals stay absent (not JSON null), and a bare task is small.
        let bare = TaskSnapshot(
            id: TaskID(high: 1, low: 1), sequence: 1, kind: "noop", params: .object([:]), name: nil, queue: "default",
            priority: 0, dependencies: [], onDependencyFailure: .cancel, timeoutMilliseconds: nil, retry: RetryPolicy(),
            metadata: nil, workflow: nil, createdAt: 1_795_000_000_000, state: .succeeded, cancelRequested: false,
            attempt: 1, startedAt: 1_795_000_000_000, finishedAt: 1_795_000_000_000, result: nil, error: nil,
            progress: TaskProgress(), notBefore: nil)
        #expect(try Self.decoded(Self.encoded(bare), sequence: 1) == bare)
        #expect(Self.encoded(bare).count < 80)
    }

    /// Replicas that took turns, and cells before v3, wrote the replica running an attempt
    /// (field bit 16, after the lease): such a record still reads, the name skipped.
    @Test func aRecordNamingTheReplicaThatRanItStillReads() throws {
        let task = TaskSnapshot(
            id: TaskID(high: 1, low: 1), sequence: 1, kind: "sleep", params: .object([:]), name: nil, queue: "default",
            priority: 0, dependencies: [], onDependencyFailure: .cancel, timeoutMilliseconds: nil, retry: RetryPolicy(),
            metadata: nil, workflow: nil, createdAt: 1_795_000_000_000, state: .running, cancelRequested: false,
            attempt: 1, startedAt: 1_795_000_000_000, finishedAt: nil, result: nil, error: nil,
            progress: TaskProgress(), notBefore: nil)
        let current = Self.encoded(task)
        var fields: UInt64 = 0, end = 1, shift: UInt64 = 0
        repeat {
            fields |= UInt64(current[end] & 0x7F) << shift
            shift += 7
            end += 1
        } while current[end - 1] & 0x80 != 0
        var old = RecordWriter()
        old.byte(current[0])
        old.unsigned(fields | 1 << 16)
        var bytes = old.bytes + current[end...]
        var runner = RecordWriter()
        runner.string("replica-7")
        bytes += runner.bytes
        #expect(try Self.decoded(bytes, sequence: 1) == task)
        // The name is read, not ignored: cut short, it is a damaged record.
        #expect(throws: RecordDecodingError.self) { try Self.decoded(Array(bytes.dropLast()), sequence: 1) }
    }

    @Test func extremeNumbersRoundTrip() throws {
        var task = Self.rich
        task.priority = Int.min
        task.createdAt = Int64.max
        task.startedAt = Int64.min
        task.timeoutMilliseconds = UInt64.max
        task.retry = RetryPolicy(maxAttempts: Int.max, backoffMilliseconds: UInt64.max, backoffFactor: .greatestFiniteMagnitude)
        #expect(try Self.decoded(Self.encoded(task)) == task)
    }

    /// A damaged row is an error naming the table, whatever byte it stops or goes wrong at.
    @Test func everyTruncationAndCorruptionIsAnErrorNotACrash() {
        let bytes = Self.encoded(Self.rich)
        for length in 0..<bytes.count {
            #expect(throws: RecordDecodingError.self) { try Self.decoded(Array(bytes[..<length])) }
        }
        #expect(throws: RecordDecodingError.self) { try Self.decoded(bytes + [0]) }
        for index in bytes.indices {
            var flipped = bytes
            flipped[index] ^= 0xFF
            // Either it reads as some other task or it is refused; it never traps.
            _ = try? Self.decoded(flipped)
        }
        #expect(throws: RecordDecodingError.self) { try Self.decoded([RecordCodec.taskFormat, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]) }
        // An attempt count beyond Int.max: refused, not trapped on.
        var huge = bytes
        let attempt = 1 + 4 + 16 + 5 + 1  // format, fields (22 bits: four bytes), id, kind, state
        #expect(huge[attempt] == 5)
        huge.replaceSubrange(attempt...attempt, with: [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01])
        #expect(throws: RecordDecodingError.self) { try Self.decoded(huge) }
    }

    @Test func workflowsRoundTrip() throws {
        let workflow = WorkflowSnapshot(id: TaskID(high: 5, low: 6), name: "build", createdAt: 1_795_000_000_000,
                                        keys: [.init(key: "a", id: TaskID(high: 1, low: 2)), .init(key: "ü", id: TaskID(high: 3, low: 4))])
        var output = RecordWriter()
        let decoded = try output.record(of: workflow).withUnsafeBytes { buffer in
            try RecordCodec.decodeWorkflow(buffer, id: workflow.id)
        }
        #expect(decoded == workflow)
        // A schedule's run keeps the schedule and slot that made it, beside remote members.
        var scheduled = workflow
        scheduled.schedule = ScheduleSlot(id: TaskID(high: 7, low: 8), slot: 1_795_000_060_000)
        scheduled.remoteMembers = [.init(id: TaskID(high: 3, low: 4), state: .running, fraction: 0.5)]
        let bytes = output.record(of: scheduled)
        #expect(try bytes.withUnsafeBytes { try RecordCodec.decodeWorkflow($0, id: workflow.id) } == scheduled)
        #expect(throws: RecordDecodingError.self) {
            try Array(bytes.dropLast()).withUnsafeBytes { try RecordCodec.decodeWorkflow($0, id: workflow.id) }
        }
    }

    /// A workflow across cells keeps what its members in other cells last reported.
    @Test func aWorkflowsRemoteMembersRoundTrip() throws {
        let workflow = WorkflowSnapshot(
            id: TaskID(high: 5, low: 6), name: nil, createdAt: 1_795_000_000_000,
            keys: [.init(key: "a", id: TaskID(high: 1, low: 2)), .init(key: "b", id: TaskID(high: 3, low: 4))],
            remoteMembers: [.init(id: TaskID(high: 3, low: 4), state: .failed),
                            .init(id: TaskID(high: 7, low: 8), state: .running, fraction: 0.25),
                            .init(id: TaskID(high: 9, low: 10), state: .pending, fraction: 0)])
        var output = RecordWriter()
        let bytes = output.record(of: workflow)
        let decoded = try bytes.withUnsafeBytes { try RecordCodec.decodeWorkflow($0, id: workflow.id) }
        #expect(decoded == workflow)
        // An unknown state code is an error, not a crash: the first member's, before two members
        // of an id, a state and a fraction each.
        var damaged = bytes
        let failedCode = bytes.count - 2 * (16 + 1 + 8) - 1
        #expect(damaged[failedCode] == RecordCodec.code(of: .failed))
        damaged[failedCode] = 0x7F
        #expect(throws: RecordDecodingError.self) { try damaged.withUnsafeBytes { try RecordCodec.decodeWorkflow($0, id: workflow.id) } }
        for length in 0..<bytes.count {
            #expect(throws: RecordDecodingError.self) {
                try Array(bytes[..<length]).withUnsafeBytes { try RecordCodec.decodeWorkflow($0, id: workflow.id) }
            }
        }
    }

    /// A version 1 file (JSON records keyed by id) opens as version 2 with every field kept.
    @Test func aVersionOneFileIsMigratedKeepingItsTasksAndWorkflows() throws {
        let path = DataDirectoryTests.temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: path) }
        do {
            let directory = try DataDirectory(path: path)
            let database = try SQLiteDatabase(path: directory.databasePath)
            try StoreSchema.prepare(database, upTo: 1)
            try database.execute("""
                INSERT INTO tasks (id, sequence, state, workflow, record) VALUES ('01M7Q5CQG0Q4NGPGVDXF6Y158Z', 4, 'pending',
                '01M7Q5CQG0Q4NGPGVDXF6Y1590', '{"id":"01M7Q5CQG0Q4NGPGVDXF6Y158Z","sequence":4,"kind":"sleep",
                "params":{"duration_ms":10},"name":"flaky","queue":"default","priority":2,"dependencies":[],
                "on_dependency_failure":"cancel","timeout_ms":60000,"retry":{"max_attempts":2,"backoff_ms":1000,
                "backoff_factor":2},"metadata":{"owner":"me"},"workflow":"01M7Q5CQG0Q4NGPGVDXF6Y1590",
                "created_at":1795000000000,"state":"pending","attempt":2,"started_at":1795000000000,
                "error":{"code":"sleep_failed","message":"no","details":{}},
                "progress":{"fraction":0.9,"message":"step 9","updated_at":1795000000009},"not_before":1795000001010}');
                INSERT INTO workflows (id, record) VALUES ('01M7Q5CQG0Q4NGPGVDXF6Y1590', '{"id":"01M7Q5CQG0Q4NGPGVDXF6Y1590",
                "name":"w","created_at":1795000000000,"keys":[["a","01M7Q5CQG0Q4NGPGVDXF6Y158Z"]]}');
                """)
        }
        let store = try SQLiteTaskStore(dataDirectory: path, syncLevel: .normal) { $0() }
        defer { store.close() }
        let loaded = store.takeLoaded()
        let id = try #require(TaskID("01M7Q5CQG0Q4NGPGVDXF6Y158Z"))
        let workflow = try #require(TaskID("01M7Q5CQG0Q4NGPGVDXF6Y1590"))
        #expect(loaded.tasks == [TaskSnapshot(
            id: id, sequence: 4, kind: "sleep", params: ["duration_ms": 10], name: "flaky", queue: "default", priority: 2,
            dependencies: [], onDependencyFailure: .cancel, timeoutMilliseconds: 60_000, retry: RetryPolicy(maxAttempts: 2),
            metadata: ["owner": "me"], workflow: workflow, createdAt: 1_795_000_000_000, state: .pending,
            cancelRequested: false, attempt: 2, startedAt: 1_795_000_000_000, finishedAt: nil, result: nil,
            error: TaskError(code: "sleep_failed", message: "no"),
            progress: TaskProgress(fraction: 0.9, message: "step 9", updatedAt: 1_795_000_000_009), notBefore: 1_795_000_001_010)])
        #expect(loaded.workflows == [WorkflowSnapshot(id: workflow, name: "w", createdAt: 1_795_000_000_000,
                                                      keys: [.init(key: "a", id: id)])])
    }

    /// A version 1 row the migration cannot read stops the start and leaves the file as it was.
    @Test func aDamagedVersionOneRowStopsTheMigrationAndTouchesNothing() throws {
        let path = DataDirectoryTests.temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let file: String
        do {
            let directory = try DataDirectory(path: path)
            file = directory.databasePath
            let database = try SQLiteDatabase(path: file)
            try StoreSchema.prepare(database, upTo: 1)
            try database.execute("INSERT INTO tasks VALUES ('x', 1, 'queued', NULL, '{\"id\": 42}')")
        }
        let before = try DataDirectoryTests.digest(file)
        do {
            _ = try SQLiteTaskStore(dataDirectory: path, syncLevel: .normal) { $0() }
            Issue.record("a damaged version 1 row was migrated")
        } catch {
            guard case .damaged = error else { throw error }
        }
        #expect(try DataDirectoryTests.digest(file) == before)
        let database = try SQLiteDatabase(path: file, mode: .readOnly)
        #expect(try database.integer("PRAGMA user_version") == 1)
    }
}

/// Deliveries as the shared database keeps them: with their earlier attempts, and as replicas
/// of schema version 1 wrote them (no attempts before the last).
@Suite struct DeliveryRecordCodecTests {
    static let delivery = DeliveryRecord(
        id: "msg_1", webhook: "wh_a", eventSeq: 9, type: "task.state", body: Array("{}".utf8), attempt: 3, state: .delivered,
        statusCode: 204, durationMilliseconds: 4, attemptedAt: 300,
        earlierAttempts: [DeliveryAttempt(number: 1, statusCode: 500, error: nil, durationMilliseconds: 2, attemptedAt: 100, nextAttemptAt: 200),
                          DeliveryAttempt(number: 2, statusCode: nil, error: "timeout", durationMilliseconds: nil, attemptedAt: 200,
                                          nextAttemptAt: 300)])

    @Test func attemptsRoundTrip() throws {
        #expect(try SharedRecordCodec.decodeDelivery(SharedRecordCodec.encode(Self.delivery)) == Self.delivery)
        #expect(try SharedRecordCodec.decodeAttempts(SharedRecordCodec.encode(Self.delivery.earlierAttempts))
            == Self.delivery.earlierAttempts)
    }

    @Test func aFormatOneRecordHasNoEarlierAttempts() throws {
        var last = Self.delivery
        last.earlierAttempts = []
        // Format 2 is format 1 and a count of earlier attempts (here 0, one byte).
        let formatOne = [1] + SharedRecordCodec.encode(last).dropFirst().dropLast()
        #expect(try SharedRecordCodec.decodeDelivery(Array(formatOne)) == last)
        let truncated = Array(SharedRecordCodec.encode(Self.delivery).dropLast())
        #expect(throws: RecordDecodingError.self) { try SharedRecordCodec.decodeDelivery(truncated) }
    }
}

@Suite struct EvictionRangeTests {
    @Test func runsCoverExactlyTheNumbersGiven() {
        #expect(SQLiteTaskStore.consecutiveRuns([]) == [])
        #expect(SQLiteTaskStore.consecutiveRuns([5, 3, 4, 9, 7, 8, 8, 1, 9]) == [1...1, 3...5, 7...9])
        #expect(SQLiteTaskStore.consecutiveRuns([UInt64.max, 0, UInt64.max - 1, UInt64.max]) == [0...0, (UInt64.max - 1)...UInt64.max])
    }
}
