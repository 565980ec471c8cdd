import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// The service on cells (`--replication cells`): each cell's engine commits to PostgreSQL under
/// its epoch, and a replica that starts again on the same database serves what was committed.
@Suite(.serialized)
struct CellServiceTests {
    static let cellCount = 8

    static func cellReplica(_ url: String, name: String) throws -> ServiceHarness {
        try ServiceHarness(replicas: 1) { configuration in
            var settings = SharedDatabaseSettings(url: url, replica: name)
            settings.replication = .cells
            settings.cells = cellCount
            configuration.sharedDatabase = settings
            configuration.durability = .full
        }
    }

    static func waitForEveryCell(_ service: ServiceHarness) throws {
        try service.waitUntil("every cell to open", timeout: 20) { application in
            application.cellHost?.openEngines.count == cellCount
        }
    }

    @Test func tasksOfManyCellsAreServedAndSurviveARestart() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        var service = try Self.cellReplica(url, name: "c0")
        try Self.waitForEveryCell(service)
        let client = try service.client()
        // Queues spread over the cells; each task is served by its queue's cell.
        var ids: [String: String] = [:]
        for index in 0..<24 {
            let queue = "q\(index)"
            let task = try client.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)
            ids[queue] = task["id"] as? String
        }
        for (queue, id) in ids {
            let task = try client.waitForState(id, "succeeded")
            #expect(task["queue"] as? String == queue)
        }
        let waiting = try client.submit(#"{"kind":"sleep","params":{"duration_ms":600000},"queue":"long"}"#)
        let waitingID = try #require(waiting["id"] as? String)
        _ = try client.waitForState(waitingID, "running")
        let dependent = try client.submit(#"{"kind":"noop","queue":"long","dependencies":["\#(waitingID)"]}"#)
        let dependentID = try #require(dependent["id"] as? String)
        #expect(try client.call("GET", "/tasks/01ZZZZZZZZZZZZZZZZZZZZZZZZ").status == 404)
        try service.stop()

        service = try Self.cellReplica(url, name: "c0")
        try Self.waitForEveryCell(service)
        let again = try service.client()
        for (queue, id) in ids {
            let task = try again.task(id)
            #expect(task["state"] as? String == "succeeded" && task["queue"] as? String == queue)
        }
        // Stopped at the shutdown and queued again, its attempt not spent, it runs again here.
        let restarted = try again.waitForState(waitingID, "running")
        #expect(restarted["attempt"] as? Int == 1)
        #expect(try again.task(dependentID)["state"] as? String == "pending")
        let cancel = try again.call("DELETE", "/tasks/\(waitingID)")
        #expect(cancel.status == 200 || cancel.status == 202)
        _ = try again.waitForState(waitingID, "cancelled")
        _ = try again.waitForState(dependentID, "cancelled")
        try service.stop()
    }
}
