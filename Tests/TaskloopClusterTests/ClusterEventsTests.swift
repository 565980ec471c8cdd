import Foundation
import Testing
import TaskloopPostgres
import TaskloopTestSupport
@testable import TaskloopCluster

@Suite struct ClusterEventsTests {
    @Test func idsAreOpaqueFixedWidthAndSortAsTheirPositions() {
        let positions = [EventPosition(transaction: 0, index: 0), EventPosition(transaction: 9, index: 300),
                         EventPosition(transaction: 10, index: 0), EventPosition(transaction: .max, index: .max)]
        for position in positions { #expect(EventPosition(position.description) == position) }
        #expect(positions.map(\.description) == positions.map(\.description).sorted())
        for bad in ["", "12", "000000000000000a0000000G", "000000000000000A00000000", "0000000000000000000000000"] {
            #expect(EventPosition(bad) == nil, "\(bad)")
        }
    }

    /// Cells commit side by side: an event committed after a reader passed its position would be
    /// lost to that reader. Readers see a transaction's events only once every older
    /// transaction has ended, so they arrive once, in one order, whatever the commit order.
    @Test func aReaderNeverPassesATransactionStillRunning() throws {
        let cluster = try CellKeeperTests.Cluster()
        try cluster.start("a")
        let early = try cluster.connection(), late = try cluster.connection(), reader = try cluster.connection()
        func event(_ name: String, time: Int64 = 1) -> ClusterEvents.Written {
            ClusterEvents.Written(time: time, type: "task.created", task: name, workflow: nil, queue: "q", data: Array(name.utf8))
        }
        func read(after position: EventPosition) throws -> [ClusterEvents.Read] {
            let found = Locked<[ClusterEvents.Read]?>(nil)
            cluster.thread.run {
                cluster.connections[reader].execute([ClusterEvents.read(after: position, limit: 100)]) { result in
                    found.withLock { $0 = (try? result.get()).map { ClusterEvents.events(of: $0[0]) } ?? [] }
                }
            }
            try pollUntil("the read") { found.value != nil }
            return found.value!
        }
        #expect(try cluster.execute(early, [PGQuery("BEGIN")] + ClusterEvents.insert([event("e1")], cell: Cell(0))) == nil)
        #expect(try cluster.execute(late, [PGQuery("BEGIN")] + ClusterEvents.insert([event("e2"), event("e3")], cell: Cell(1))
                                    + [PGQuery("COMMIT")]) == nil)
        #expect(try read(after: .start).isEmpty, "e2 and e3 wait for the older transaction still running")
        #expect(try cluster.execute(early, [PGQuery("COMMIT")]) == nil)
        // Any transaction open in the PostgreSQL cluster (other tests' included) holds readers
        // back until it ends: the three come once every older one has.
        var all: [ClusterEvents.Read] = []
        try pollUntil("the three events", timeout: 20) {
            all = try read(after: .start)
            return all.count == 3
        }
        #expect(all.map { $0.event.task } == ["e1", "e2", "e3"])
        #expect(all.map(\.cell) == [Cell(0), Cell(1), Cell(1)])
        #expect(all.map { String(decoding: $0.event.data, as: UTF8.self) } == ["e1", "e2", "e3"])
        #expect(try read(after: all[1].position).map { $0.event.task } == ["e3"])
        #expect(try read(after: EventPosition(all[2].position.description)!).isEmpty)

        // Kept by time: the old go, the rest stay.
        #expect(try cluster.execute(early, ClusterEvents.insert([event("recent", time: 5_000)], cell: Cell(2))) == nil)
        #expect(try cluster.execute(early, [ClusterEvents.trim(before: 2_000, limit: 10)]) == nil)
        try pollUntil("only the recent event", timeout: 20) { try read(after: .start).map { $0.event.task } == ["recent"] }
        try cluster.finish()
    }

    /// Positions order as numbers, not as their text: 98, 99, 100 (as text "100" comes first).
    @Test func readsOrderTransactionsAsNumbers() throws {
        let cluster = try CellKeeperTests.Cluster()
        try cluster.start("a")
        let connection = try cluster.connection()
        #expect(try cluster.execute(connection, [PGQuery("""
            INSERT INTO taskloop.cell_events (transaction, index, cell, time, type, data)
            VALUES ('100', 0, 0, 1, 'task.created', ''), ('98', 0, 0, 1, 'task.created', ''), ('99', 0, 0, 1, 'task.created', '')
            """)]) == nil)
        func results(_ queries: [PGQuery]) throws -> [PGResult] {
            let found = Locked<[PGResult]?>(nil)
            cluster.thread.run {
                cluster.connections[connection].execute(queries) { result in found.withLock { $0 = (try? result.get()) ?? [] } }
            }
            try pollUntil("the read") { found.value != nil }
            return found.value!
        }
        let read = try results([ClusterEvents.read(after: .start, limit: 2), ClusterEvents.read(after: EventPosition(transaction: 99, index: 0), limit: 2),
                                ClusterEvents.now(), ClusterEvents.oldest()])
        #expect(read.count == 4)
        #expect(ClusterEvents.events(of: read[0]).map(\.position.transaction) == [98, 99])
        #expect(ClusterEvents.events(of: read[1]).map(\.position.transaction) == [100])
        #expect(ClusterEvents.position(of: read[2]) == EventPosition(transaction: 100, index: 0))
        #expect(ClusterEvents.position(of: read[3]) == EventPosition(transaction: 98, index: 0))
        try cluster.finish()
    }
}
