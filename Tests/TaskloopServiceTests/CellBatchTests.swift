import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

extension CellServiceTests {
    /// Batches whose items span cells go on while a replica joins (cells move to it) and leaves
    /// (they move back). Every batch is answered whole and in order; a created item's task is
    /// there afterwards exactly once; an item refused while its cell moved created nothing; no
    /// part is carried out twice by a forward that was tried again.
    @Test func batchesSpanningCellsStayExactWhileCellsMove() throws {
        let (url, replicas) = try Self.startCellReplicas("b0", "b1")
        let (first, second) = (replicas[0], replicas[1])
        defer {
            try? second.stop()
            try? first.stop()
        }
        let client = try APIClient(ports: [first.port, second.port])
        let queues = first.onLoop { application in
            let host = application.cellHost!
            var byCell: [Cell: String] = [:]
            for index in 0..<400 where byCell.count < Self.cellCount {
                let queue = "bm\(index)"
                if byCell[host.cell(ofQueue: queue)] == nil { byCell[host.cell(ofQueue: queue)] = queue }
            }
            return byCell.values.sorted()
        }
        try #require(queues.count == Self.cellCount)
        // One thread sends batch after batch while this one moves the cells under it.
        let outcomes = Locked((created: [String: String](), refused: Set<String>(), rounds: 0, unexpected: [String]()))
        let submitting = Locked(true)
        let finished = Locked(false)
        let submitter = Thread {
            do {
                let client = try APIClient(ports: [first.port, second.port])
                var round = 0
                // At most 400 rounds: 800 tasks a queue, which one page of the list shows.
                while (submitting.value || round < 3) && round < 400 {
                    let names = queues.flatMap { queue in (0..<2).map { "\(queue)-\(round)-\($0)" } }
                    let items = names.map { name in #"{"kind":"noop","queue":"\#(name.prefix { $0 != "-" })","name":"\#(name)"}"# }
                    round += 1
                    let response = try client.call("POST", "/tasks/batch", json: #"{"tasks":[\#(items.joined(separator: ","))]}"#)
                    let results = response.status == 207 ? response.json["results"] as? [[String: Any]] ?? [] : []
                    outcomes.withLock { outcomes in
                        outcomes.rounds = round
                        guard results.count == names.count else {
                            return outcomes.unexpected.append("round \(round): \(response.status) \(response.text.prefix(300))")
                        }
                        for (name, result) in zip(names, results) {
                            switch result["status"] as? Int {
                            case 201:
                                let task = result["task"] as? [String: Any]
                                if task?["name"] as? String != name { outcomes.unexpected.append("\(name): \(result)") }
                                outcomes.created[name] = task?["id"] as? String ?? "?"
                            case 503:
                                outcomes.refused.insert(name)
                            default:
                                outcomes.unexpected.append("\(name): \(result)")
                            }
                        }
                    }
                }
            } catch {
                outcomes.withLock { $0.unexpected.append("the submitter stopped: \(error)") }
            }
            finished.withLock { $0 = true }
        }
        submitter.start()
        try pollUntil("a few batches", timeout: 30) { outcomes.value.rounds >= 3 }
        let third = try Self.cellReplica(url, name: "b2")
        try Self.waitForEveryCell([first, second, third], timeout: 30)
        let roundsBeforeLeaving = outcomes.value.rounds
        try pollUntil("batches to the three replicas", timeout: 30) { outcomes.value.rounds >= roundsBeforeLeaving + 3 || finished.value }
        try third.stop()
        try Self.waitForEveryCell([first, second], timeout: 30)
        let roundsAfterLeaving = outcomes.value.rounds
        try pollUntil("batches after the third replica left", timeout: 30) { outcomes.value.rounds >= roundsAfterLeaving + 3 || finished.value }
        submitting.withLock { $0 = false }
        try pollUntil("the submitter to finish", timeout: 30) { finished.value }
        let (created, refused, rounds, unexpected) = outcomes.value
        #expect(unexpected.isEmpty, "\(unexpected.prefix(5))")

        var found: [String: [String]] = [:]
        for queue in queues {
            let listed = try #require(try client.call("GET", "/tasks?queue=\(queue)&limit=1000").json["tasks"] as? [[String: Any]])
            for task in listed {
                found[task["name"] as? String ?? "?", default: []].append(task["id"] as? String ?? "?")
            }
        }
        #expect(created.count + refused.count == rounds * queues.count * 2)
        for (name, ids) in found { #expect(ids.count == 1, "\(name) was created \(ids.count) times: \(ids)") }
        for (name, id) in created { #expect(found[name] == [id], "\(name): answered \(id), found \(found[name] ?? [])") }
        for name in refused { #expect(found[name] == nil, "\(name) was refused, yet created: \(found[name] ?? [])") }
    }
}
