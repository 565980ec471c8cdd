import Foundation
import Testing
import TaskloopLoop
import TaskloopPostgres
import TaskloopTestSupport
@testable import TaskloopCluster

/// Commits whose answer a dropped connection took are resolved before anyone is told: the one
/// the database had committed says so, the one that never reached it says it failed, and later
/// commits go on under the cell's new epoch.
@Suite struct CellCommitterTests {
    @Test func aCommitWhoseAnswerWasLostIsResolvedBeforeAnyoneIsAnswered() throws {
        let cluster = try CellKeeperTests.Cluster()
        let epoch = try cluster.startOwningEverything()[Cell(4)]!
        try PostgresCluster.shared().sql("CREATE TABLE written (x int)", database: cluster.url)
        let proxy = try PostgresProxy(forwardingTo: cluster.url)
        defer { proxy.stop() }
        let outcomes = Locked<[String: CellCommitter.Outcome]>([:])
        let advanced = Locked<[UInt64]>([])
        let committer = cluster.thread.run {
            let committer = CellCommitter(loop: cluster.thread.loop, url: proxy.url(through: cluster.url),
                                          identity: ReplicaIdentity(name: "a", incarnation: "a"))
            committer.onEpochAdvanced = { cell, epoch in
                advanced.withLock { $0.append(epoch) }
                cluster.keepers["a"]!.epochAdvanced(cell, to: epoch)
            }
            return LoopBound(committer, loop: cluster.thread.loop)
        }
        func commit(_ name: String, _ x: Int) {
            cluster.thread.run {
                committer.value.commit(Cell(4), epoch: epoch, writes: [PGQuery("INSERT INTO written VALUES ($1)", [.int(x)])]) { outcome in
                    outcomes.withLock { $0[name] = outcome }
                }
            }
        }
        func written() throws -> String {
            try PostgresCluster.shared().sql("SELECT coalesce(string_agg(x::text, ',' ORDER BY x), '') FROM written", database: cluster.url)
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }

        commit("first", 1)
        try pollUntil("the first commit") { outcomes.value["first"] != nil }
        #expect(outcomes.value["first"] == .committed)

        // The commit reaches the database, its answer does not: committed, and said so.
        proxy.freeze(toServer: false, toClient: true)
        commit("answer lost", 2)
        try pollUntil("the commit to land") { try written() == "1,2" }
        #expect(outcomes.value["answer lost"] == nil, "nobody is told before the outcome is known")
        proxy.cutConnections()
        proxy.freeze(toServer: false, toClient: false)
        try pollUntil("the resolution", timeout: 10) { outcomes.value["answer lost"] != nil }
        #expect(outcomes.value["answer lost"] == .committed)
        #expect(advanced.value == [epoch + 1])

        // The commit never reaches the database: not committed, and said so.
        proxy.freeze(toServer: true, toClient: false)
        commit("request lost", 3)
        proxy.cutConnections()
        proxy.freeze(toServer: false, toClient: false)
        try pollUntil("the resolution", timeout: 10) { outcomes.value["request lost"] != nil }
        guard case .failed = outcomes.value["request lost"] else { Issue.record("\(String(describing: outcomes.value["request lost"]))"); return }
        #expect(advanced.value == [epoch + 1, epoch + 2])

        // Later commits, named with the old epoch, go under the new one; the keeper keeps the cell.
        commit("after", 4)
        try pollUntil("the last commit") { outcomes.value["after"] != nil }
        #expect(outcomes.value["after"] == .committed)
        #expect(try written() == "1,2,4")
        #expect(cluster.thread.run { cluster.keepers["a"]!.openCells[Cell(4)] } == epoch + 2)
        cluster.thread.run { committer.value.close() }
        try cluster.finish()
    }

    /// Commits made while the first connection is still being made wait for it, together.
    @Test func commitsWhileConnectingWaitForTheOneConnection() throws {
        let cluster = try CellKeeperTests.Cluster()
        let epoch = try cluster.startOwningEverything()[Cell(2)]!
        try PostgresCluster.shared().sql("CREATE TABLE waited (x int)", database: cluster.url)
        let outcomes = Locked<[CellCommitter.Outcome]>([])
        let committer = cluster.thread.run {
            let committer = CellCommitter(loop: cluster.thread.loop, url: cluster.url, identity: ReplicaIdentity(name: "a", incarnation: "a"))
            for x in 1...3 {
                committer.commit(Cell(2), epoch: epoch, writes: [PGQuery("INSERT INTO waited VALUES ($1)", [.int(x)])]) { outcome in
                    outcomes.withLock { $0.append(outcome) }
                }
            }
            return LoopBound(committer, loop: cluster.thread.loop)
        }
        try pollUntil("three commits") { outcomes.value.count == 3 }
        #expect(outcomes.value == [.committed, .committed, .committed])
        #expect(try PostgresCluster.shared().sql("SELECT count(*) FROM waited", database: cluster.url)
            .trimmingCharacters(in: .whitespacesAndNewlines) == "3")
        cluster.thread.run { committer.value.close() }
        try cluster.finish()
    }
}
