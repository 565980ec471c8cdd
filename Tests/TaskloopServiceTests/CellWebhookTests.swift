import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

/// Webhooks and idempotency keys on cells: a webhook is the cluster's (made, read and deleted on
/// any replica), its deliveries are made by the owner of the cell whose commit made the event,
/// and follow the cell when it moves; a key holds across replicas and cells.
@Suite(.serialized, .inTheDefaultStageOnly)
struct CellWebhookTests {
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

    /// A queue whose cell rendezvous hashing gives to `name` among `names`.
    static func queue(ownedBy name: String, among names: [String], _ service: ServiceHarness) -> String {
        service.onLoop { application in
            let host = application.cellHost!
            let assignment = Rendezvous.assignment(host.layout, among: names)
            return (0...).lazy.map { "mq\($0)" }.first { assignment[host.cell(ofQueue: $0)] == name }!
        }
    }

    /// Made on one replica, a webhook gets the events of every replica's cells, signed; deleted
    /// on the other, it gets nothing more from either.
    @Test func aWebhookMadeOnOneReplicaHearsEveryCellUntilDeletedOnAnother() throws {
        let replicas = try CellServiceTests.startCellReplicas("h0", "h1").replicas
        let (first, second) = (replicas[0], replicas[1])
        let (mine, theirs) = Self.queuesHereAndElsewhere(first)
        let one = try APIClient(port: first.port), other = try APIClient(port: second.port)
        let receiver = try WebhookReceiver()
        let webhook = try WebhookTests.create(one, #"{"url":"\#(receiver.url("/hook"))","events":["task.state"]}"#)
        let id = try #require(webhook["id"] as? String)
        try receiver.configure(secret: try #require(webhook["secret"] as? String))
        let shown = try other.call("GET", "/webhooks/\(id)")
        #expect(shown.status == 200 && shown.json["secret"] == nil && shown.json["url"] as? String == receiver.url("/hook"))
        #expect((try other.call("GET", "/webhooks").json["webhooks"] as? [[String: Any]])?.count == 1)

        let here = try #require(try one.submit(#"{"kind":"noop","queue":"\#(mine)"}"#)["id"] as? String)
        let there = try #require(try one.submit(#"{"kind":"noop","queue":"\#(theirs)"}"#)["id"] as? String)
        for (task, whose) in [(here, "the first replica's cell"), (there, "the second replica's cell")] {
            let received = try receiver.waitFor("\(task) of \(whose) succeeded", path: "/hook") {
                $0.deliveredTask?["id"] as? String == task && $0.deliveredTask?["state"] as? String == "succeeded"
            }
            #expect(received.allSatisfy { $0["verified"] as? Bool == true })
        }
        #expect(first.onLoop { $0.webhooks.attempts["delivered"] ?? 0 } > 0, "the owner of the first cell delivered")
        #expect(second.onLoop { $0.webhooks.attempts["delivered"] ?? 0 } > 0, "the owner of the second cell delivered")
        // The log is every cell's, on either replica.
        let answered = receiver.deliveries.filter { $0["path"] as? String == "/hook" }.count
        for client in [one, other] {
            try pollUntil("every delivery so far in the log", timeout: 10) {
                try WebhookTests.deliveries(client, id).filter { $0["state"] as? String == "delivered" }.count >= answered
            }
        }

        let deleted = try other.call("DELETE", "/webhooks/\(id)")
        #expect(deleted.status == 200, "\(deleted.text)")
        #expect((try one.call("GET", "/webhooks").json["webhooks"] as? [[String: Any]])?.isEmpty == true)
        #expect(try one.call("GET", "/webhooks/\(id)").status == 404)
        // A second webhook shows when the later events have been delivered.
        let witness = try WebhookReceiver()
        let later = try WebhookTests.create(other, #"{"url":"\#(witness.url("/later"))","events":["task.state"]}"#)
        try witness.configure(secret: try #require(later["secret"] as? String))
        // Any request about webhooks brings a replica up to the table (it also hears of the new
        // one by a notification, a round trip later).
        #expect(try one.call("GET", "/webhooks/\(try #require(later["id"] as? String))").status == 200)
        let afterwards = try [mine, theirs].map { queue in
            try #require(try one.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String)
        }
        for task in afterwards {
            try witness.waitFor("\(task) succeeded", path: "/later") {
                $0.deliveredTask?["id"] as? String == task && $0.deliveredTask?["state"] as? String == "succeeded"
            }
        }
        #expect(!receiver.deliveries.contains { afterwards.contains($0.deliveredTask?["id"] as? String ?? "") },
                "the deleted webhook heard nothing more from either replica")
        try second.stop()
        try first.stop()
    }

    /// A webhook change is answered once every live replica has read it: an event another
    /// replica commits right after the answer is delivered, even when that replica hears of
    /// the webhook late (its database's answers held back a while, as by a slow network).
    @Test func aWebhookIsEveryReplicasOnceItsCreationIsAnswered() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let proxy = try PostgresProxy(forwardingTo: url)
        defer { proxy.stop() }
        let first = try CellServiceTests.cellReplica(url, name: "s0")
        let second = try CellServiceTests.cellReplica(proxy.url(through: url), name: "s1")
        try CellServiceTests.waitForEveryCell([first, second])
        let theirs = Self.queuesHereAndElsewhere(first).elsewhere
        let creator = try APIClient(port: first.port), submitter = try APIClient(port: second.port)
        let receiver = try WebhookReceiver()
        let created = DispatchSemaphore(value: 0)
        let submitted = Locked<String?>(nil)
        proxy.freeze(toServer: false, toClient: true)
        Thread {
            defer { created.signal() }
            guard (try? WebhookTests.create(creator, #"{"url":"\#(receiver.url("/hook"))","events":["task.created"]}"#)) != nil
            else { return }
            let task = try? submitter.submit(#"{"kind":"noop","queue":"\#(theirs)"}"#)["id"] as? String
            submitted.withLock { $0 = task }
        }.start()
        // Answered at once, the creation would let the submission reach the second replica
        // while it knows no webhook yet (its commit then held by the proxy); waiting for it,
        // the creation is answered only once the second replica hears from the database again.
        _ = try? second.waitUntil("the submission held in the second replica's commit", timeout: 0.5) {
            !$0.cellHost!.isCaughtUp
        }
        proxy.freeze(toServer: false, toClient: false)
        #expect(created.wait(timeout: .now() + 15) == .success)
        let task = try #require(submitted.value)
        try receiver.waitFor("the creation of \(task)", path: "/hook") { $0.deliveredTask?["id"] as? String == task }
        try second.stop()
        try first.stop()
    }

    /// A live replica that does not read the change (its database out of reach) holds the
    /// answer up for a second at most: then it is answered all the same.
    @Test func aReplicaThatDoesNotReadAChangeDelaysItsAnswerByASecondAtMost() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let proxy = try PostgresProxy(forwardingTo: url)
        defer { proxy.stop() }
        let first = try CellServiceTests.cellReplica(url, name: "d0")
        let second = try CellServiceTests.cellReplica(proxy.url(through: url), name: "d1")
        try CellServiceTests.waitForEveryCell([first, second])
        let client = try APIClient(port: first.port)
        proxy.freeze(toServer: true, toClient: true)
        let started = Date()
        let created = try client.call("POST", "/webhooks", json: #"{"url":"http://127.0.0.1:9/hook","events":["task.created"]}"#)
        let waited = Date().timeIntervalSince(started)
        #expect(created.status == 201, "\(created.text)")
        #expect(waited >= 1 && waited < 3, "answered after \(waited) s")
        proxy.freeze(toServer: false, toClient: false)
        try second.stop()
        try first.stop()
    }

    /// A delivery whose receiver failed is retried on its schedule by the cell's next owner, and
    /// one cut short by the move is made again there.
    @Test func aDeliveryFollowsItsCellToItsNextOwner() throws {
        // Long enough for the cell to move before the retry is due.
        let settings: (inout ServiceConfiguration) -> Void = { $0.webhooks.retrySchedule = [8_000] }
        let (url, replicas) = try CellServiceTests.startCellReplicas("m0", configure: settings)
        let first = replicas[0]
        let queue = Self.queue(ownedBy: "m1", among: ["m0", "m1"], first)
        let client = try APIClient(port: first.port)
        // The first attempt of one delivery is refused, of the other left without an answer.
        let answers = ["/flaky": [500, 200], "/stuck": [0, 200]]
        let receiver = try WebhookReceiver()
        var ids: [String: String] = [:]
        for path in ["/flaky", "/stuck"] {
            let webhook = try WebhookTests.create(client, #"{"url":"\#(receiver.url(path))","events":["task.created"],"queue":"\#(queue)"}"#)
            ids[path] = try #require(webhook["id"] as? String)
            if path == "/flaky" { try receiver.configure(secret: try #require(webhook["secret"] as? String), answers: answers) }
        }
        let task = try #require(try client.submit(#"{"kind":"noop","queue":"\#(queue)"}"#)["id"] as? String)
        let refused = try receiver.waitFor("the first attempt", path: "/flaky") { $0["answered"] as? Int == 500 }
        try receiver.waitFor("the attempt left hanging", path: "/stuck") { _ in true }

        let second = try CellServiceTests.cellReplica(url, name: "m1", settings)
        try CellServiceTests.waitForEveryCell([first, second])
        #expect(first.onLoop { $0.webhooks.pendingCount } == 0, "the first owner gave its deliveries up with the cell")
        try second.waitUntil("the new owner to hold the retry") { $0.webhooks.pendingCount >= 1 }
        let retried = try receiver.waitFor("the retry", path: "/flaky", timeout: 30) { $0["answered"] as? Int == 200 }
        #expect(Set(retried.compactMap { $0["id"] as? String }).count == 1, "one delivery, attempted twice")
        #expect(retried.allSatisfy { $0.deliveredTask?["id"] as? String == task && $0["verified"] as? Bool == true })
        let firstAt = try #require(Int(refused.first?["timestamp"] as? String ?? ""))
        let retriedAt = try #require(Int(retried.last?["timestamp"] as? String ?? ""))
        #expect(retriedAt - firstAt >= 7, "retried on its schedule, not at once")
        try receiver.waitFor("the delivery made again", path: "/stuck", timeout: 20) { $0["answered"] as? Int == 200 }
        // The receiver logs a request before it answers: the count follows a moment later.
        try second.waitUntil("the new owner to have delivered both") { ($0.webhooks.attempts["delivered"] ?? 0) == 2 }
        #expect(first.onLoop { $0.webhooks.attempts["delivered"] ?? 0 } == 0)
        #expect(first.onLoop { $0.webhooks.attempts["retrying"] ?? 0 } == 1, "the first owner made the first attempt")
        let log = try WebhookTests.deliveries(client, ids["/flaky"]!, once: "delivered")
        #expect(log.map { $0["attempt"] as? Int } == [2, 1], "\(log)")
        #expect(log.last?["status_code"] as? Int == 500)
        try second.stop()
        try first.stop()
    }

    /// The same key and body create once whichever replica takes them; the same key with a body
    /// for another cell is 422 on every replica. An expired key leaves the table.
    @Test func anIdempotencyKeyHoldsAcrossReplicasAndCells() throws {
        let (url, replicas) = try CellServiceTests.startCellReplicas("k0", "k1") { $0.idempotencyTTLMilliseconds = 3_000 }
        let (first, second) = (replicas[0], replicas[1])
        let (mine, theirs) = Self.queuesHereAndElsewhere(first)
        let one = try APIClient(port: first.port), other = try APIClient(port: second.port)
        let body = #"{"kind":"noop","queue":"\#(mine)"}"#
        let created = try one.call("POST", "/tasks", json: body, headers: ["Idempotency-Key": "order-1"])
        #expect(created.status == 201)
        let replayed = try other.call("POST", "/tasks", json: body, headers: ["Idempotency-Key": "order-1"])
        #expect(replayed.status == 201 && replayed.header("Idempotent-Replayed") == "true")
        #expect(replayed.json["id"] as? String == created.json["id"] as? String)
        // Unknown to the owner of the other cell, with a dependency on a task of another cell
        // too: both are read in one round trip, and the key refuses it.
        let createdID = try #require(created.json["id"] as? String)
        let dependent = try other.call("POST", "/tasks", json: #"{"kind":"noop","queue":"\#(theirs)","dependencies":["\#(createdID)"]}"#,
                                       headers: ["Idempotency-Key": "order-1"])
        #expect(dependent.status == 422 && dependent.json["code"] as? String == "idempotency_key_reused", "\(dependent.text)")
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
