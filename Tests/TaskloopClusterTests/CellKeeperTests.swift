import Foundation
import Testing
import TaskloopLoop
import TaskloopLoopTestSupport
import TaskloopPostgres
import TaskloopTestSupport
@testable import TaskloopCluster
import TaskloopEngine
@testable import TaskloopStore

/// CellKeeper against a real PostgreSQL: replicas share the cells, give them up gracefully,
/// and take a crashed or replaced replica's cells only once its lease and the margin are over.
@Suite struct CellKeeperTests {
    static let ownership = CellOwnership.Settings(leaseMilliseconds: 2_000, marginMilliseconds: 300)

    /// Keepers on one loop thread, and what they were told, for the test thread.
    final class Cluster: @unchecked Sendable {
        let thread = LoopThread(try! EventLoop(), name: "cells-test")
        let url: String
        var keepers: [String: CellKeeper] = [:]
        /// "name open 3 @1", "name close 3 lost", "name drain 3", with the time of each.
        let log = Locked<[(line: String, at: UInt64)]>([])

        init(cells: Int = 16) throws {
            url = try PostgresCluster.shared().makeDatabase()
            self.cells = cells
        }
        let cells: Int

        func start(_ name: String, incarnation: String? = nil, through url: String? = nil,
                   protocolVersion: Int = ClusterSchema.protocolVersion) throws {
            let outcome = try attemptStart(name, incarnation: incarnation, through: url, protocolVersion: protocolVersion)
            #expect(outcome == "success(\(cells))")
        }

        /// Starts a keeper; how its start ended ("success(16)", or the failure).
        func attemptStart(_ name: String, incarnation: String? = nil, through url: String? = nil,
                          protocolVersion: Int = ClusterSchema.protocolVersion) throws -> String {
            let started = Locked<String?>(nil)
            thread.run { [self] in
                var settings = CellKeeper.Settings(url: url ?? self.url, identity: ReplicaIdentity(name: name, incarnation: incarnation ?? name),
                                                   address: "http://\(name).invalid", ownership: CellKeeperTests.ownership)
                settings.cells = cells
                settings.protocolVersion = protocolVersion
                let keeper = try! CellKeeper(loop: thread.loop, settings: settings)
                keepers[name + (incarnation ?? "")] = keeper
                let log = self.log
                keeper.onOpen = { cell, epoch in log.withLock { $0.append(("\(name) open \(cell.index) @\(epoch)", CellKeeper.now())) } }
                keeper.onClose = { cell, reason in log.withLock { $0.append(("\(name) close \(cell.index) \(reason)", CellKeeper.now())) } }
                keeper.onDrain = { cell, done in
                    log.withLock { $0.append(("\(name) drain \(cell.index)", CellKeeper.now())) }
                    done()
                }
                keeper.onSuperseded = { version in log.withLock { $0.append(("\(name) superseded by \(version)", CellKeeper.now())) } }
                keeper.start { result in started.withLock { $0 = "\(result.map { $0.count })" } }
            }
            try pollUntil("\(name) to start") { started.value != nil }
            return started.value!
        }

        /// Starts a alone and waits until it runs every cell; the epochs it holds them under.
        func startOwningEverything() throws -> [Cell: UInt64] {
            try start("a")
            try pollUntil("a to take every cell", timeout: 10) { open("a").count == cells }
            return thread.run { [self] in keepers["a"]!.openCells }
        }

        /// Waits until a and b run exactly the cells rendezvous gives each; those cells.
        func settle() throws -> [String: Set<UInt16>] {
            let expected = CellKeeperTests.rendezvous(cells, ["a", "b"])
            try pollUntil("the cells to settle: a \(open("a")), b \(open("b"))", timeout: 20) {
                open("a") == expected["a"] && open("b") == expected["b"]
            }
            return expected
        }

        func open(_ key: String) -> Set<UInt16> {
            thread.run { [self] in Set(keepers[key]!.openCells.keys.map(\.index)) }
        }

        var connections: [PGConnection] = []

        /// A connection of the test's own to the cluster's database, on the loop; its index.
        func connection() throws -> Int {
            let connected = Locked<Result<Void, PGError>?>(nil)
            let index = thread.run { [self] in
                let connection = PGConnection(loop: thread.loop)
                connections.append(connection)
                connection.connect(url) { result in connected.withLock { $0 = result } }
                return connections.count - 1
            }
            try pollUntil("a connection") { connected.value != nil }
            try connected.value!.get()
            return index
        }

        /// Runs a batch on connection `index`; its error's SQLSTATE (or message), or nil.
        func execute(_ index: Int, _ queries: [PGQuery]) throws -> String? {
            let outcome = Locked<String??>(nil)
            thread.run { [self] in
                connections[index].execute(queries) { result in
                    var error: String?
                    if case .failure(let failure) = result { error = failure.sqlState ?? failure.message }
                    outcome.withLock { $0 = .some(error) }
                }
            }
            try pollUntil("the batch to end") { outcome.value != nil }
            return outcome.value!
        }

        func lines(containing text: String) -> [(line: String, at: UInt64)] { log.value.filter { $0.line.contains(text) } }

        func finish() throws {
            thread.run { [self] in
                for keeper in keepers.values { keeper.abandon() }
                for connection in connections { connection.close() }
                thread.loop.finish()
            }
            try thread.waitForExit(timeout: 10)
        }
    }

    static func rendezvous(_ cells: Int, _ replicas: [String]) -> [String: Set<UInt16>] {
        var owned: [String: Set<UInt16>] = [:]
        for (cell, owner) in Rendezvous.assignment(CellLayout(count: cells), among: replicas) { owned[owner, default: []].insert(cell.index) }
        return owned
    }

    @Test func replicasShareTheCellsAsRendezvousSays() throws {
        let cluster = try Cluster()
        try cluster.start("a")
        try cluster.start("b")
        let expected = try cluster.settle()
        // a had them all for a moment: the cells that moved to b were drained by a first.
        for cell in expected["b"]! {
            let drained = cluster.lines(containing: "a drain \(cell)").first
            let opened = cluster.lines(containing: "b open \(cell) ").first
            if let drained { #expect(drained.at <= opened!.at) }
        }
        try cluster.finish()
    }

    @Test func aGracefulStopHandsEveryCellOverAtOnce() throws {
        let cluster = try Cluster()
        try cluster.start("a")
        try cluster.start("b")
        let expected = try cluster.settle()
        let stopped = Locked(false)
        cluster.thread.run { cluster.keepers["b"]!.stop { stopped.withLock { $0 = true } } }
        try pollUntil("b to stop") { stopped.value }
        #expect(Set(cluster.lines(containing: "b drain").map { UInt16($0.line.split(separator: " ")[2])! }) == expected["b"])
        #expect(cluster.lines(containing: "b close").isEmpty, "nothing was cut short")
        // Well within a lease: released cells are claimed at a's next renewal.
        try pollUntil("a to take every cell", timeout: 1.5) { cluster.open("a").count == 16 }
        try cluster.finish()
    }

    @Test func aCrashedReplicasCellsWaitForItsLeaseAndTheMargin() throws {
        let cluster = try Cluster()
        try cluster.start("a")
        try cluster.start("b")
        let expected = try cluster.settle()
        let keptUntil = cluster.thread.run { cluster.keepers["b"]!.keptUntil! }
        cluster.thread.run { cluster.keepers["b"]!.abandon() }
        try pollUntil("a to take every cell", timeout: 10) { cluster.open("a").count == 16 }
        for cell in expected["b"]! {
            let taken = try #require(cluster.lines(containing: "a open \(cell) ").last)
            // b would have closed them by keptUntil; a may take them two margins after that.
            #expect(taken.at >= keptUntil + 2 * Self.ownership.marginMilliseconds - 50, "\(taken.line) at \(taken.at), b kept until \(keptUntil)")
            let held = try #require(cluster.lines(containing: "b open \(cell) ").last)
            let epochs = [held, taken].map { UInt64($0.line.split(separator: "@").last!)! }
            #expect(epochs[1] == epochs[0] + 1, "a new epoch: \(held.line), then \(taken.line)")
        }
        try cluster.finish()
    }

    @Test func aNewProcessUnderTheSameNameReplacesTheOldOne() throws {
        let cluster = try Cluster()
        try cluster.start("a", incarnation: "first")
        try pollUntil("a to take every cell", timeout: 10) { cluster.open("afirst").count == 16 }
        try cluster.start("a", incarnation: "second")
        try pollUntil("the old process to close everything", timeout: 10) { cluster.lines(containing: "close").count == 16 }
        #expect(cluster.lines(containing: "close").allSatisfy { $0.line.hasSuffix("replaced") })
        try pollUntil("the new process to take every cell", timeout: 10) { cluster.open("asecond").count == 16 }
        #expect(cluster.open("afirst").isEmpty)
        try cluster.finish()
    }

    /// A partition: b's connection hangs (nothing forwarded, nothing closed). b closes its cells
    /// on its own clock before a may take them, and once the partition heals the cells go back
    /// to b, each under a new epoch.
    @Test func aReplicaCutOffClosesItsCellsBeforeAnyoneTakesThem() throws {
        let cluster = try Cluster()
        let proxy = try PostgresProxy(forwardingTo: cluster.url)
        defer { proxy.stop() }
        try cluster.start("a")
        try cluster.start("b", through: proxy.url(through: cluster.url))
        let expected = try cluster.settle()
        proxy.freeze(toServer: true, toClient: true)
        try pollUntil("a to take every cell", timeout: 15) { cluster.open("a").count == 16 }
        for cell in expected["b"]! {
            let fenced = try #require(cluster.lines(containing: "b close \(cell) fenced").last, "b closed \(cell) itself")
            let taken = try #require(cluster.lines(containing: "a open \(cell) ").last)
            #expect(taken.at >= fenced.at + Self.ownership.marginMilliseconds, "b closed \(cell) at \(fenced.at), a took it at \(taken.at)")
        }
        proxy.freeze(toServer: false, toClient: false)
        _ = try cluster.settle()
        try cluster.finish()
    }

    /// A rolling upgrade: a replica of a newer protocol raises the cluster's; the older one
    /// hands every cell over and leaves, and the newer takes each only after the older drained
    /// it; an older replica can no longer join.
    @Test func aNewerProtocolTakesTheClusterOverAndOlderReplicasLeave() throws {
        let cluster = try Cluster()
        let current = ClusterSchema.protocolVersion
        try cluster.start("a")
        try pollUntil("a to take every cell", timeout: 10) { cluster.open("a").count == 16 }
        try cluster.start("b", protocolVersion: current + 1)
        try pollUntil("b to take every cell", timeout: 15) { cluster.open("b").count == 16 }
        #expect(cluster.open("a").isEmpty)
        #expect(cluster.lines(containing: "a superseded by \(current + 1)").count == 1)
        for cell in 0..<16 {
            let drained = try #require(cluster.lines(containing: "a drain \(cell)").first, "a handed \(cell) over")
            let taken = try #require(cluster.lines(containing: "b open \(cell) ").first)
            #expect(drained.at <= taken.at)
        }
        #expect(cluster.lines(containing: "a close").isEmpty, "nothing was cut short")
        let members = try PostgresCluster.shared().sql("SELECT string_agg(name || ':' || protocol, ',') FROM taskloop.members",
                                                       database: cluster.url)
        #expect(members.trimmingCharacters(in: .whitespacesAndNewlines) == "b:\(current + 1)")
        let refused = try cluster.attemptStart("c")
        #expect(refused.contains("the cluster runs protocol \(current + 1), newer than this replica's \(current)"), "\(refused)")
        try cluster.finish()
    }

    /// The tables carry their version: a new cluster is at this build's, one a version behind
    /// is migrated once by the first replica, and one that is newer is refused by name.
    /// Committers announce events only while some member follows them: a replica that starts
    /// following is marked in its row at once and the others learn it; one that stops is
    /// unmarked by its next renewal.
    @Test func membersLearnWhetherAnyoneFollowsTheEvents() throws {
        let cluster = try Cluster()
        let postgres = try PostgresCluster.shared()
        try cluster.start("a")
        try cluster.start("b")
        _ = try cluster.settle()
        func followed(_ key: String) -> Bool { cluster.thread.run { cluster.keepers[key]!.eventsFollowed } }
        func marked() throws -> String {
            try postgres.sql("SELECT string_agg(name, ',' ORDER BY name) FROM taskloop.members WHERE follows_events",
                             database: cluster.url).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        try pollUntil("the renewals to find no follower") { !followed("a") && !followed("b") }
        cluster.thread.run { cluster.keepers["b"]!.followsEvents = true }
        #expect(followed("b"))
        try pollUntil("b's row to be marked and a to learn it") { try marked() == "b" && followed("a") }
        cluster.thread.run { cluster.keepers["b"]!.followsEvents = false }
        try pollUntil("b's renewal to unmark it and a to learn it", timeout: 10) { try marked() == "" && !followed("a") && !followed("b") }
        try cluster.finish()
    }

    @Test func theTablesAreMigratedAndNewerOnesRefused() throws {
        let cluster = try Cluster()
        let postgres = try PostgresCluster.shared()
        func schema() throws -> String {
            try postgres.sql("SELECT schema FROM taskloop.cluster", database: cluster.url).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        try cluster.start("a")
        #expect(try schema() == "\(ClusterSchema.schemaVersion)")
        // As a cluster made before the last migration: its version says what is still to run.
        _ = try postgres.sql("UPDATE taskloop.cluster SET schema = \(ClusterSchema.schemaVersion - 1)", database: cluster.url)
        try cluster.start("b")
        #expect(try schema() == "\(ClusterSchema.schemaVersion)")
        _ = try cluster.settle()
        _ = try postgres.sql("UPDATE taskloop.cluster SET schema = \(ClusterSchema.schemaVersion + 1)", database: cluster.url)
        let refused = try cluster.attemptStart("c")
        #expect(refused.contains("the cluster's tables are of schema \(ClusterSchema.schemaVersion + 1), newer than this replica's"),
                "\(refused)")
        try cluster.finish()
    }

    /// A database where v2 replicas took turns: no cluster is made over unfinished tasks of
    /// theirs (cells would never serve them); once every one has finished, it is.
    @Test func noClusterIsMadeOverUnfinishedTasksOfReplicasThatTookTurns() throws {
        let cluster = try Cluster()
        let postgres = try PostgresCluster.shared()
        func record(_ state: TaskState) -> String {
            let task = TaskSnapshot(
                id: TaskID(high: 1, low: 1), sequence: 1, kind: "noop", params: .object([:]), name: nil, queue: "default",
                priority: 0, dependencies: [], onDependencyFailure: .cancel, timeoutMilliseconds: nil, retry: RetryPolicy(),
                metadata: nil, workflow: nil, createdAt: 1_795_000_000_000, state: state, cancelRequested: false,
                attempt: 1, startedAt: nil, finishedAt: state.isTerminal ? 1_795_000_000_001 : nil, result: nil, error: nil,
                progress: TaskProgress(), notBefore: nil)
            var writer = RecordWriter()
            return "\\x" + writer.record(of: task).map { String(format: "%02x", $0) }.joined()
        }
        _ = try postgres.sql("""
            CREATE SCHEMA taskloop;
            CREATE TABLE taskloop.state (turn bigint NOT NULL, event_seq bigint NOT NULL);
            CREATE TABLE taskloop.tasks (sequence bigint PRIMARY KEY, id text NOT NULL UNIQUE, turn bigint NOT NULL, record bytea NOT NULL);
            INSERT INTO taskloop.tasks VALUES (1, 'a', 1, '\(record(.succeeded))'), (2, 'b', 1, '\(record(.queued))');
            """, database: cluster.url)
        let refused = try cluster.attemptStart("a")
        #expect(refused.contains("the database holds 1 unfinished tasks of v2 replicas"), "\(refused)")
        #expect(try postgres.sql("SELECT to_regclass('taskloop.cluster') IS NULL", database: cluster.url).hasPrefix("t"),
                "nothing of the cluster was made")
        _ = try postgres.sql("UPDATE taskloop.tasks SET record = '\(record(.cancelled))' WHERE sequence = 2", database: cluster.url)
        try cluster.start("b")
        try cluster.finish()
    }

    /// Every commit of a cell checks its epoch first: commits under way hold a claim back, and
    /// once the cell is claimed again the former holder's commit fails and writes nothing.
    @Test func aDeposedOwnersCommitChangesNothing() throws {
        let cluster = try Cluster()
        let epoch = try cluster.startOwningEverything()[Cell(0)]!
        let a = ReplicaIdentity(name: "a", incarnation: "a")
        try PostgresCluster.shared().sql("CREATE TABLE written (x int)", database: cluster.url)
        func commit(_ x: Int, on connection: Int, ending: Bool = true) throws -> String? {
            try cluster.execute(connection, [PGQuery("BEGIN"), ClusterSchema.fenceCommit(Cell(0), epoch: epoch, by: a, token: "t1"),
                                             PGQuery("INSERT INTO written VALUES ($1)", [.int(x)])] + (ending ? [PGQuery("COMMIT")] : []))
        }
        let writer = try cluster.connection(), claimer = try cluster.connection()
        #expect(try commit(1, on: writer) == nil)
        // A commit under way holds the cell's row: a claim waits for it.
        #expect(try commit(2, on: writer, ending: false) == nil)
        let claim = [PGQuery("SET lock_timeout = 200"), PGQuery("UPDATE taskloop.cells SET epoch = epoch + 1 WHERE cell = 0")]
        #expect(try cluster.execute(claimer, claim) == "55P03", "the claim waited for the commit and gave up")
        #expect(try cluster.execute(writer, [PGQuery("COMMIT")]) == nil)
        #expect(try cluster.execute(claimer, claim) == nil)
        // Deposed: the commit fails and writes nothing.
        #expect(try commit(3, on: writer) == ClusterSchema.deposedState)
        #expect(try cluster.execute(writer, [PGQuery("ROLLBACK")]) == nil)
        #expect(try PostgresCluster.shared().sql("SELECT string_agg(x::text, ',' ORDER BY x) FROM written", database: cluster.url).trimmingCharacters(in: .whitespacesAndNewlines) == "1,2")
        try cluster.finish()
    }

    /// A commit of several cells fails, writing nothing, once any of them is claimed away, by a
    /// claim under way as it began too (the commit waits for it, then sees the new epoch), and
    /// the failure names the cells lost.
    @Test func aCommitOfSeveralCellsFailsWholeAndNamesTheCellsItLost() throws {
        let cluster = try Cluster()
        let epochs = try cluster.startOwningEverything()
        let a = ReplicaIdentity(name: "a", incarnation: "a")
        try PostgresCluster.shared().sql("CREATE TABLE written (x int)", database: cluster.url)
        let writer = try cluster.connection(), claimer = try cluster.connection()
        let cells = [Cell(1), Cell(2), Cell(3)]
        let commit = [ClusterSchema.fenceCommit(cells.map { ($0, epochs[$0]!) }, by: a, token: "t1"),
                      PGQuery("INSERT INTO written VALUES (1)")]
        #expect(try cluster.execute(claimer, [PGQuery("BEGIN"), PGQuery("UPDATE taskloop.cells SET epoch = epoch + 1 WHERE cell = 2")]) == nil)
        let outcome = Locked<PGError??>(nil)
        cluster.thread.run {
            cluster.connections[writer].execute(commit) { result in
                var failure: PGError?
                if case .failure(let error) = result { failure = error }
                outcome.withLock { $0 = .some(failure) }
            }
        }
        try pollUntil("the commit to wait for the claim") {
            (try? PostgresCluster.shared().sql("""
                SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND query LIKE '%fence_commits%'
                """, database: cluster.url).trimmingCharacters(in: .whitespacesAndNewlines)) == "1"
        }
        #expect(outcome.value == nil)
        #expect(try cluster.execute(claimer, [PGQuery("COMMIT")]) == nil)
        try pollUntil("the commit's answer") { outcome.value != nil }
        let error = try #require(outcome.value ?? nil, "a commit of a cell claimed away went through")
        #expect(error.sqlState == ClusterSchema.deposedState)
        #expect(ClusterSchema.deposedCells(in: error.message) == [Cell(2)])
        #expect(try PostgresCluster.shared().sql("SELECT count(*) FROM written", database: cluster.url)
            .trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        #expect(try PostgresCluster.shared().sql("SELECT count(*) FROM taskloop.cells WHERE commit_token = 't1'", database: cluster.url)
            .trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        try cluster.finish()
    }
}
