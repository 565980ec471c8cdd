import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

/// Idempotency keys on cells: a key holds across replicas and cells.
@Suite(.serialized, .inTheDefaultStageOnly)
struct CellWebhookTests {
    static func replica(_ url: String, name: String, _ configure: @escaping (inout ServiceConfiguration) -> Void = { _ in })
        throws -> ServiceHarness {
        try ServiceHarness(replicas: 1) { configuration in
            var settings = SharedDatabaseSettings(url: url, replica: name)
            settings.replication = .cells
            settings.cells = CellServiceTests.cellCount
            configuration.sharedDatabase = settings
            configuration.durability = .full
            configure(&configuration)
        }
    }

    /// A queue whose cell `service` serves, and one whose cell it does not.
    static func queuesHereAndElsewhere(_ service: ServiceHarness) -> (here: String, elsewhere: String) {
        service.onLoop { application in
            let host = application.cellHost!
            func isHere(_ queue: String) -> Bool {
                if case .here = host.placement(of: host.cell(ofQueue: queue)) { return true }
                return false
            }
            let names = (0...).lazy.map { "hq\($0)" }
            return (names.first(where: isHere)!, names.first { !isHere($0) }!)
        }
    }

    /// The same key and body create once whichever replica takes them; the same key with a body
    /// for another cell is 422 on every replica. An expired key leaves the table.
    @Test func anIdempotencyKeyHoldsAcrossReplicasAndCells() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let settings: (inout ServiceConfiguration) -> Void = { $0.idempotencyTTLMilliseconds = 3_000 }
        let first = try Self.replica(url, name: "k0", settings)
        let second = try Self.replica(url, name: "k1", settings)
        try CellServiceTests.waitForEveryCell([first, second])
        let (mine, theirs) = Self.queuesHereAndElsewhere(first)
        let one = try APIClient(port: first.port), other = try APIClient(port: second.port)
        let body = #"{"kind":"noop","queue":"\#(mine)"}"#
        let created = try one.call("POST", "/tasks", json: body, headers: ["Idempotency-Key": "order-1"])
        #expect(created.status == 201)
        let replayed = try other.call("POST", "/tasks", json: body, headers: ["Idempotency-Key": "order-1"])
        #expect(replayed.status == 201 && replayed.header("Idempotent-Replayed") == "true")
        #expect(replayed.json["id"] as? String == created.json["id"] as? String)
        for client in [one, other] {
            let reused = try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"\#(theirs)"}"#,
                                         headers: ["Idempotency-Key": "order-1"])
            #expect(reused.status == 422 && reused.json["code"] as? String == "idempotency_key_reused", "\(reused.text)")
        }
        let listed = try one.call("GET", "/tasks?limit=100").json["tasks"] as? [[String: Any]]
        #expect(listed?.count == 1, "one task in all")
        let cluster = try PostgresCluster.shared()
        try pollUntil("the expired key to leave the table", timeout: 15) {
            try cluster.sql("SELECT count(*) FROM taskloop.cell_idempotency_keys", database: url)
                .trimmingCharacters(in: .whitespacesAndNewlines) == "0"
        }
        try second.stop()
        try first.stop()
    }
}
