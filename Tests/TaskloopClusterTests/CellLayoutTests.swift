import Testing
@testable import TaskloopCluster

@Suite struct CellLayoutTests {
    /// The hash is part of the cluster's data: a queue's cell may never change between
    /// versions or machines. These values are fixed; a change to the function fails here.
    @Test func aQueuesCellIsFixedForEver() {
        let layout = CellLayout(count: 256)
        #expect(StableHash.of("") == StableHash.mix(0xcbf2_9ce4_8422_2325))
        let cells = ["default", "emails", "video-transcode", "q1", "q2"].map { layout.cell(ofQueue: $0).index }
        #expect(cells == ["default", "emails", "video-transcode", "q1", "q2"].map { UInt16(StableHash.of($0) % 256) })
        #expect(layout.cell(ofQueue: "default") == layout.cell(ofQueue: "default"))
        #expect(CellLayout(count: 1).cell(ofQueue: "anything") == Cell(0))
    }

    @Test func similarQueueNamesSpreadOverTheCells() {
        let layout = CellLayout(count: 256)
        var perCell = [Int](repeating: 0, count: 256)
        for index in 0..<25_600 { perCell[Int(layout.cell(ofQueue: "queue-\(index)").index)] += 1 }
        // 100 expected per cell; a binomial's spread is about 10.
        #expect(perCell.min()! >= 55 && perCell.max()! <= 145, "\(perCell.min()!)...\(perCell.max()!)")
    }

    @Test func everyReplicaComputesTheSameOwners() {
        let layout = CellLayout(count: 256)
        let replicas = ["replica-a", "replica-b", "replica-c"]
        let owners = Rendezvous.assignment(layout, among: replicas)
        #expect(owners == Rendezvous.assignment(layout, among: replicas.reversed()))
        for cell in layout.cells { #expect(owners[cell] == Rendezvous.owner(of: cell, among: replicas)) }
        #expect(Rendezvous.assignment(layout, among: []).isEmpty)
        let counts = Dictionary(grouping: owners.values, by: { $0 }).mapValues(\.count)
        for replica in replicas { #expect((60...112).contains(counts[replica] ?? 0), "\(counts)") }
    }

    @Test func aJoiningReplicaTakesCellsOnlyFromOthersAndALeavingOneGivesOnlyItsOwn() {
        let layout = CellLayout(count: 256)
        let three = Rendezvous.assignment(layout, among: ["a", "b", "c"])
        let four = Rendezvous.assignment(layout, among: ["a", "b", "c", "d"])
        var moved = 0
        for cell in layout.cells where three[cell] != four[cell] {
            moved += 1
            #expect(four[cell] == "d", "a join moves cells only to the newcomer")
        }
        #expect((40...90).contains(moved), "about a quarter of 256 cells move: \(moved)")
        let two = Rendezvous.assignment(layout, among: ["a", "c"])
        for cell in layout.cells where three[cell] != "b" {
            #expect(two[cell] == three[cell], "a leave moves only the leaver's cells")
        }
    }
}
