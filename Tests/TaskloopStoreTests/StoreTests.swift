import Foundation
import Testing
import TaskloopStore
import TaskloopTestSupport

/// The data dir, the schema and the writer thread, on real files in a temporary directory.
@Suite struct DataDirectoryTests {
    static func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-store-\(UUID())").path
    }

    static func digest(_ path: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: path)) }

    @Test func aNewDirectoryGetsTheCurrentSchema() throws {
        let path = Self.temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let directory = try DataDirectory(path: path)
        let database = try SQLiteDatabase(path: directory.databasePath)
        try StoreSchema.prepare(database)
        #expect(try database.integer("PRAGMA user_version") == Int64(StoreSchema.version))
        let tables = try database.integer("SELECT count(*) FROM sqlite_schema WHERE type = 'table'")
        #expect(tables == 9)
        // Preparing again is a no-op.
        try StoreSchema.prepare(database)
    }

    @Test func aSecondHolderIsRefusedNamingTheFirst() throws {
        let path = Self.temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: path) }
        var first: DataDirectory? = try DataDirectory(path: path)
        do {
            _ = try DataDirectory(path: path)
            Issue.record("a second holder took the lock")
        } catch {
            guard case .locked(_, let holder) = error else { throw error }
            #expect(holder.hasPrefix("pid \(getpid()) on "))
            #expect(error.description.contains("in use by another server"))
        }
        withExtendedLifetime(first) {}
        first = nil
        _ = try DataDirectory(path: path)
    }

    @Test func aNewerSchemaIsRefusedAndLeftUntouched() throws {
        let path = Self.temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let directory = try DataDirectory(path: path)
        do {
            let database = try SQLiteDatabase(path: directory.databasePath)
            try database.execute("CREATE TABLE future (x); PRAGMA user_version = \(StoreSchema.version + 1)")
        }
        let before = try Self.digest(directory.databasePath)
        let database = try SQLiteDatabase(path: directory.databasePath)
        #expect(throws: DataDirectoryError.newerSchema(path: directory.databasePath, found: Int64(StoreSchema.version + 1),
                                                       supported: StoreSchema.version)) {
            try StoreSchema.prepare(database)
        }
        #expect(try Self.digest(directory.databasePath) == before)
    }

    @Test func aDamagedFileIsRefusedAndLeftUntouched() throws {
        let path = Self.temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let directory = try DataDirectory(path: path)
        let garbage = Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        try garbage.write(to: URL(fileURLWithPath: directory.databasePath))
        let database = try SQLiteDatabase(path: directory.databasePath)
        do {
            try StoreSchema.prepare(database)
            Issue.record("a damaged file was accepted")
        } catch {
            guard case .damaged = error else { throw error }
            #expect(error.description.contains("restore a backup"))
        }
        #expect(try Self.digest(directory.databasePath) == garbage)
    }
}

@Suite struct StoreWriterTests {
    /// A writer on a fresh database whose completions run on a serial queue.
    final class Harness {
        let path = DataDirectoryTests.temporaryPath()
        let directory: DataDirectory
        let writer: StoreWriter
        let completions = DispatchQueue(label: "completions")

        init(syncLevel: SyncLevel = .full) throws {
            directory = try DataDirectory(path: path)
            let database = try SQLiteDatabase(path: directory.databasePath)
            try StoreSchema.prepare(database)
            let queue = completions
            writer = try StoreWriter(database: database, syncLevel: syncLevel) { work in queue.async(execute: work) }
        }

        func close() {
            writer.close()
            try? FileManager.default.removeItem(atPath: path)
        }

        /// Inserts a queue row named `name` (any table does).
        static func insert(_ name: String) -> StoreWriter.Work {
            { database in
                try database.statement("INSERT INTO queues (name, max_concurrency, paused) VALUES (?, 1, 0)").bind(1, name).run()
            }
        }

        func count() throws -> Int64? {
            let reader = try SQLiteDatabase(path: directory.databasePath, mode: .readOnly)
            return try reader.integer("SELECT count(*) FROM queues")
        }
    }

    /// Everything queued while a transaction is being written goes into the next one.
    @Test func workQueuedDuringACommitSharesTheNextTransaction() throws {
        let harness = try Harness()
        defer { harness.close() }
        let gate = DispatchSemaphore(value: 0), entered = DispatchSemaphore(value: 0)
        let order = Locked<[String]>([])
        harness.writer.submit({ _ in
            entered.signal()
            gate.wait()
        }, completion: { _ in order.withLock { $0.append("gate") } })
        #expect(entered.wait(timeout: .now() + 10) == .success)
        for index in 0..<200 {
            harness.writer.submit(Harness.insert("q\(index)")) { result in
                if case .success = result { order.withLock { $0.append("q\(index)") } }
            }
        }
        gate.signal()
        try pollUntil("every completion") { order.value.count == 201 }
        #expect(order.value == ["gate"] + (0..<200).map { "q\($0)" })
        #expect(harness.writer.transactionsCommitted == 2)
        #expect(try harness.count() == 200)
    }

    /// In order at both levels: with `full` the outcomes pass through the log flusher.
    @Test(arguments: SyncLevel.allCases)
    func aFailingItemRollsBackItsTransactionAndTheNextOneCommits(syncLevel: SyncLevel) throws {
        let harness = try Harness(syncLevel: syncLevel)
        defer { harness.close() }
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        let outcomes = Locked<[Bool]>([])
        harness.writer.submit({ _ in
            entered.signal()
            gate.wait()
        }, completion: { _ in })
        // Both inserts are queued while the writer is inside the first transaction, so they
        // share the next one (else the first insert could join the gate's and commit alone).
        #expect(entered.wait(timeout: .now() + 10) == .success)
        harness.writer.submit(Harness.insert("a")) { result in outcomes.withLock { $0.append((try? result.get()) != nil) } }
        harness.writer.submit(Harness.insert("a")) { result in outcomes.withLock { $0.append((try? result.get()) != nil) } }
        gate.signal()
        try pollUntil("both outcomes") { outcomes.value.count == 2 }
        #expect(outcomes.value == [false, false], "a duplicate key fails the whole transaction")
        #expect(try harness.count() == 0)
        harness.writer.submit(Harness.insert("b")) { result in outcomes.withLock { $0.append((try? result.get()) != nil) } }
        try pollUntil("the next outcome") { outcomes.value.count == 3 }
        #expect(outcomes.value.last == true)
        #expect(try harness.count() == 1)
    }

    /// Bursts push the write-ahead log far past its limit (while a reader's snapshot keeps any
    /// checkpoint from rewinding it) and a sweep deletes what they wrote: once the writer is
    /// idle, the log file is back within the limit rather than at its high-water mark.
    @Test func theLogShrinksToItsLimitOnceTheWriterIsIdle() throws {
        let harness = try Harness()
        defer { harness.close() }
        let log = harness.directory.databasePath + "-wal"
        func logSize() throws -> Int { try #require(FileManager.default.attributesOfItem(atPath: log)[.size] as? Int) }
        let committed = Locked(0)
        func write(_ work: @escaping StoreWriter.Work) throws {
            let before = committed.value
            harness.writer.submit(work) { result in
                #expect((try? result.get()) != nil, "\(result)")
                committed.withLock { $0 += 1 }
            }
            try pollUntil("the write to commit") { committed.value > before }
        }
        let reader = try SQLiteDatabase(path: harness.directory.databasePath, mode: .readOnly)
        try reader.execute("BEGIN")
        _ = try reader.integer("SELECT count(*) FROM meta")
        for burst in 0..<4 {
            try write { database in
                let insert = try database.statement("INSERT INTO meta (name, value) VALUES (?, ?)")
                for row in 0..<1_000 {
                    try insert.bind(1, "b\(burst)-\(row)").bind(2, bytes: [UInt8](repeating: UInt8(row & 0xFF), count: 3_000)).run()
                }
            }
        }
        #expect(try logSize() > 2 * StoreWriter.logSizeLimit)
        try reader.execute("COMMIT")
        try write { database in try database.execute("DELETE FROM meta WHERE name LIKE 'b%'") }
        try pollUntil("the log within its limit") { try logSize() <= StoreWriter.logSizeLimit }
    }

    /// A full disk, made with SQLite's page limit: the batch fails as a storage failure,
    /// nothing of it is written, and once there is room again writes succeed by themselves.
    @Test func aFullDiskFailsTheBatchAndWritesResumeWhenThereIsRoom() throws {
        let harness = try Harness()
        defer { harness.close() }
        let results = Locked<[Result<Void, SQLiteError>]>([])
        func submit(_ work: @escaping StoreWriter.Work) {
            harness.writer.submit(work) { result in results.withLock { $0.append(result) } }
        }
        submit { database in
            let pages = try database.integer("PRAGMA page_count") ?? 0
            try database.execute("PRAGMA max_page_count = \(pages + 2)")
        }
        submit { database in
            try database.statement("INSERT INTO meta (name, value) VALUES ('big', ?)")
                .bind(1, bytes: [UInt8](repeating: 7, count: 1 << 20)).run()
        }
        try pollUntil("two results") { results.value.count == 2 }
        guard case .failure(let error) = results.value[1] else {
            Issue.record("a 1 MiB row fit in two pages")
            return
        }
        #expect(error.isStorageFailure, "\(error)")
        submit { database in try database.execute("PRAGMA max_page_count = 1073741823") }
        submit(Harness.insert("after"))
        try pollUntil("four results") { results.value.count == 4 }
        #expect((try? results.value[3].get()) != nil)
        #expect(try harness.count() == 1)
    }
}
