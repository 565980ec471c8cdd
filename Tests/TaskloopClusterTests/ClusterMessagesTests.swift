import Foundation
import Testing
import TaskloopPostgres
import TaskloopTestSupport
@testable import TaskloopCluster

@Suite struct ClusterMessagesTests {
    /// Messages arrive in the order each sender sent them, wake the receiver, and are deleted
    /// only by a commit of the receiving cell that still holds it: a deposed owner's commit
    /// leaves them for the next.
    @Test func messagesArriveInOrderAndAreAppliedOnceUnderTheReceiversEpoch() throws {
        let cluster = try CellKeeperTests.Cluster()
        let epoch = try cluster.startOwningEverything()[Cell(5)]!
        let a = ReplicaIdentity(name: "a", incarnation: "a")
        let sender = try cluster.connection(), receiver = try cluster.connection(), listener = try cluster.connection()
        let woken = Locked<[String]>([])
        cluster.thread.run { cluster.connections[listener].onNotification = { _, payload in woken.withLock { $0.append(payload) } } }
        #expect(try cluster.execute(listener, [PGQuery("LISTEN \(ClusterMessages.channel)")]) == nil)

        func body(_ text: String) -> [UInt8] { Array(text.utf8) }
        for (from, texts) in [(Cell(1), ["1a", "1b"]), (Cell(2), ["2a"]), (Cell(1), ["1c"])] {
            #expect(try cluster.execute(sender, [PGQuery("BEGIN")] + ClusterMessages.send(texts.map(body), to: Cell(5), from: from)
                                        + [PGQuery("COMMIT")]) == nil)
            #expect(try cluster.execute(sender, ClusterMessages.notify([Cell(5)])) == nil)
        }
        try pollUntil("the receiver to be woken") { woken.value.count == 3 }
        #expect(Set(woken.value) == ["5"])
        func read() throws -> [ClusterMessages.Message] {
            let found = Locked<[ClusterMessages.Message]?>(nil)
            cluster.thread.run {
                cluster.connections[receiver].execute([ClusterMessages.read(for: Cell(5), limit: 10)]) { result in
                    found.withLock { $0 = (try? result.get()).map { ClusterMessages.messages(of: $0[0]) } ?? [] }
                }
            }
            try pollUntil("the read") { found.value != nil }
            return found.value!
        }
        let messages = try read()
        #expect(messages.map { String(decoding: $0.body, as: UTF8.self) } == ["1a", "1b", "2a", "1c"])
        #expect(messages.map(\.sender) == [Cell(1), Cell(1), Cell(2), Cell(1)])

        // Claimed by another meanwhile: the old owner's commit applies nothing.
        let applied = [PGQuery("BEGIN"), ClusterSchema.fenceCommit(Cell(5), epoch: epoch, by: a, token: "t1"),
                       ClusterMessages.acknowledge(messages.prefix(2).map(\.id), of: Cell(5)), PGQuery("COMMIT")]
        #expect(try cluster.execute(receiver, [PGQuery("UPDATE taskloop.cells SET epoch = epoch + 1, owner = 'b', incarnation = 'b', "
                                                       + "lease_until = now() + interval '1 hour' WHERE cell = 5")]) == nil)
        #expect(try cluster.execute(receiver, applied) == ClusterSchema.deposedState)
        #expect(try cluster.execute(receiver, [PGQuery("ROLLBACK")]) == nil)
        #expect(try read().count == 4)
        // The holder's commit deletes what it applied; the rest wait.
        let current = [PGQuery("BEGIN"), ClusterSchema.fenceCommit(Cell(5), epoch: epoch + 1, by: ReplicaIdentity(name: "b", incarnation: "b"), token: "t2"),
                       ClusterMessages.acknowledge(messages.prefix(2).map(\.id), of: Cell(5)), PGQuery("COMMIT")]
        let outcome = try cluster.execute(receiver, current)
        #expect(outcome == nil, "\(outcome ?? "")")
        #expect(try read().map { String(decoding: $0.body, as: UTF8.self) } == ["2a", "1c"])
        try cluster.finish()
    }
}
