import Foundation
import Testing
import TaskloopTestSupport

/// Replicas on cells as users run them: the built binary, several processes on one
/// PostgreSQL, an owner killed with SIGKILL or frozen with SIGSTOP under a stream of work.
@Suite(.serialized, .inTheDefaultStageOnly) struct CellProcessTests {
    typealias RunningBinary = BinaryTests.RunningBinary
    static let cells = 16
    static let leaseSeconds = 2

    /// A replica of the binary on cells; its client and port.
    static func replica(_ name: String, _ url: String, extra: [String] = []) throws -> (RunningBinary, APIClient, Int) {
        let binary = try RunningBinary(arguments: ["--port", "0", "--database-url", url, "--replica-name", name,
                                                   "--cells", "\(cells)", "--replica-lease-seconds", "\(leaseSeconds)",
                                                   "--allow-exec", "--log-level", "warning"] + extra,
                                       environment: ["PGAPPNAME": name])
        let line = try binary.waitForLine(containing: "listening on", timeout: 30)
        let port = try #require(BinaryTests.port(from: line))
        return (binary, try APIClient(port: port), port)
    }

    /// The cells each replica serves, by its metrics.
    static func cellsServed(_ port: Int) -> Int {
        guard let text = try? APIClient(port: port).call("GET", "/metrics").text else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("taskloop_cells_served ") {
            return Int(Double(line.dropFirst("taskloop_cells_served ".count)) ?? 0)
        }
        return 0
    }

    static func waitForSpread(_ ports: [Int], timeout: Double = 30) throws {
        try pollUntil("the cells to spread over \(ports.count) replicas", timeout: timeout) {
            let counts = ports.map(cellsServed)
            return counts.reduce(0, +) == cells && counts.allSatisfy { $0 > 0 }
        }
    }

    /// An `exec` task that appends its attempt's start and end to a file of its own: two
    /// copies of one task running at once would interleave there.
    static func markedTask(queue: String, in directory: String, seconds: Double = 0.3) -> String {
        let script = #"f=\#(directory)/$TASKLOOP_TASK_ID; echo start $TASKLOOP_TASK_ATTEMPT >> $f; sleep \#(seconds); echo end $TASKLOOP_TASK_ATTEMPT >> $f"#
        return #"{"kind":"exec","queue":"\#(queue)","params":{"argv":["sh","-c","\#(script)"]},"retry":{"max_attempts":5,"backoff_ms":0}}"#
    }

    /// The attempts a marker file shows never overlap: each start is followed by its own end
    /// or by nothing (the attempt was killed with its replica), never by another's lines.
    static func attemptsNeverOverlapped(_ path: String) -> Bool {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return true }
        var running: String?
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 2 else { return false }
            if parts[0] == "start" {
                running = String(parts[1])
            } else if parts[0] == "end" {
                guard running == String(parts[1]) else { return false }
                running = nil
            }
        }
        return true
    }

    @Test func anOwnerKilledUnderSubmissionsLosesNothingAndNoAttemptRunsTwiceAtOnce() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let markers = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-markers-\(UUID())").path
        try FileManager.default.createDirectory(atPath: markers, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: markers) }
        let victim = try Self.replica("k0", url)
        let survivor = try Self.replica("k1", url)
        try Self.waitForSpread([victim.2, survivor.2])
        // Tasks that outlast the takeover, running on the victim when it dies: their next
        // attempts must not start beside the first, whose programs outlive the victim.
        var long: [String] = []
        for index in 0..<8 {
            let answer = try victim.1.call("POST", "/tasks", json: Self.markedTask(queue: "long\(index)", in: markers, seconds: 8))
            long.append(try #require(answer.json["id"] as? String))
        }
        for id in long { _ = try victim.1.waitForState(id, "running") }

        // Submissions stream to both replicas; each goes to a queue of any cell, and is
        // acknowledged only by a 201.
        let acknowledged = Locked<[String]>([])
        let stop = Locked(false)
        let killedAt = Locked<Date?>(nil)
        let servedAgainAfter = Locked<Double?>(nil)
        let threads = [victim.2, survivor.2, survivor.2].enumerated().map { index, port in
            let thread = Thread {
                guard let client = try? APIClient(port: port) else { return }
                var sequence = index
                while !stop.value {
                    sequence += 3
                    let body = Self.markedTask(queue: "q\(sequence % 32)", in: markers)
                    guard let answer = try? client.call("POST", "/tasks", json: body, timeout: 10) else { return }
                    if answer.status == 201, let id = answer.json["id"] as? String {
                        acknowledged.withLock { $0.append(id) }
                        if let killed = killedAt.value, servedAgainAfter.value == nil {
                            servedAgainAfter.withLock { $0 = $0 ?? Date().timeIntervalSince(killed) }
                        }
                    }
                }
            }
            thread.start()
            return thread
        }
        try pollUntil("a hundred acknowledged submissions", timeout: 60) { acknowledged.value.count >= 100 }
        kill(victim.0.process.processIdentifier, SIGKILL)
        killedAt.withLock { $0 = Date() }
        _ = try victim.0.waitForExit()
        // Once the victim's cells are taken over, submissions to every queue succeed again.
        try pollUntil("the survivor to serve every cell", timeout: Double(Self.leaseSeconds) + 10) {
            Self.cellsServed(survivor.2) == Self.cells
        }
        let tookOver = try #require(killedAt.value).distance(to: Date())
        #expect(tookOver <= Double(Self.leaseSeconds) + 3, "cells served again after \(tookOver) s")
        let atTakeover = acknowledged.value.count
        try pollUntil("more acknowledged after the takeover", timeout: 60) { acknowledged.value.count >= atTakeover + 100 }
        stop.withLock { $0 = true }
        _ = threads

        // Every acknowledged task is there and ran; no attempt ran beside another of its task.
        for id in acknowledged.value {
            let task = try survivor.1.call("GET", "/tasks/\(id)?wait=20", timeout: 30)
            #expect(task.status == 200 && task.json["state"] as? String == "succeeded", "task \(id): \(task.status) \(task.text)")
            #expect(Self.attemptsNeverOverlapped(markers + "/" + id), "task \(id) ran two attempts at once")
        }
        // The victim's long tasks ran again, once its programs were stopped; the others once.
        var interrupted = 0
        for id in long {
            let task = try survivor.1.call("GET", "/tasks/\(id)?wait=30", timeout: 40)
            #expect(task.json["state"] as? String == "succeeded", "task \(id): \(task.text)")
            #expect(Self.attemptsNeverOverlapped(markers + "/" + id), "task \(id) ran two attempts at once")
            if task.json["attempt"] as? Int == 2 { interrupted += 1 }
        }
        #expect(interrupted > 0, "none of the long tasks ran on the victim")
        #expect(try survivor.0.stop() == 0, "it printed \(String(survivor.0.printed.suffix(2_000)).debugDescription)")
    }
}

extension CellProcessTests {
    /// An owner frozen for longer than its lease: the other replica takes its cells over and
    /// runs its work again (stopping what the frozen one had started on this machine); when
    /// the frozen one wakes, it fences itself at once, and nothing it commits late changes a
    /// thing.
    @Test func anOwnerFrozenPastItsLeaseFencesItselfAndItsLateCommitsChangeNothing() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let markers = FileManager.default.temporaryDirectory.appendingPathComponent("taskloop-markers-\(UUID())").path
        try FileManager.default.createDirectory(atPath: markers, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: markers) }
        let frozen = try Self.replica("s0", url)
        let other = try Self.replica("s1", url)
        try Self.waitForSpread([frozen.2, other.2])
        var ids: [String] = []
        for index in 0..<8 {
            let answer = try frozen.1.call("POST", "/tasks", json: Self.markedTask(queue: "frozen\(index)", in: markers, seconds: 4))
            ids.append(try #require(answer.json["id"] as? String))
        }
        for id in ids { _ = try frozen.1.waitForState(id, "running") }
        let served = Self.cellsServed(frozen.2)
        kill(frozen.0.process.processIdentifier, SIGSTOP)
        try pollUntil("the other replica to take every cell", timeout: Double(Self.leaseSeconds) + 10) {
            Self.cellsServed(other.2) == Self.cells
        }
        // While it is frozen its tasks run again elsewhere and finish there.
        var states: [String: String] = [:]
        for id in ids {
            let task = try other.1.call("GET", "/tasks/\(id)?wait=20", timeout: 30).json
            states[id] = "\(task["state"] ?? "") \(task["attempt"] ?? "")"
            #expect(task["state"] as? String == "succeeded")
        }
        // Attempt 2 or later: on a loaded machine the taker may also miss a renewal, fence itself
        // and take its cells back, which runs them once more.
        #expect(states.values.contains { (Int($0.split(separator: " ").last ?? "") ?? 0) >= 2 },
                "none of the tasks ran on the frozen replica: \(states)")
        kill(frozen.0.process.processIdentifier, SIGCONT)
        // Awake, it serves nothing until its cells come back to it by the usual hand-over.
        try pollUntil("the woken replica to answer", timeout: 10) { (try? frozen.1.call("GET", "/healthz", timeout: 2)) != nil }
        try pollUntil("the cells to spread again", timeout: 30) {
            Self.cellsServed(frozen.2) > 0 && Self.cellsServed(frozen.2) + Self.cellsServed(other.2) == Self.cells
        }
        #expect(served > 0)
        for id in ids {
            let task = try frozen.1.task(id)
            #expect("\(task["state"] ?? "") \(task["attempt"] ?? "")" == states[id], "task \(id) changed after the wake-up: \(task)")
            #expect(Self.attemptsNeverOverlapped(markers + "/" + id), "task \(id) ran two attempts at once")
        }
        #expect(try frozen.0.stop() == 0, "it printed \(String(frozen.0.printed.suffix(2_000)).debugDescription)")
        #expect(try other.0.stop() == 0, "it printed \(String(other.0.printed.suffix(2_000)).debugDescription)")
    }
}

extension CellProcessTests {
    /// Cells move when a replica joins and when it leaves, while requests stream to the
    /// replica that stays: requests for a moving cell wait for it, and none is refused.
    @Test func aReplicaJoiningAndLeavingUnderLoadRefusesNoRequest() throws {
        let url = try PostgresCluster.shared().makeDatabase()
        let stays = try Self.replica("j0", url)
        try Self.waitForSpread([stays.2])
        let answered = Locked(0)
        let refusals = Locked<[String]>([])
        let stop = Locked(false)
        let port = stays.2
        let threads = (0..<2).map { index in
            let thread = Thread {
                guard let client = try? APIClient(port: port) else { return }
                var sequence = index
                while !stop.value {
                    sequence += 2
                    let queue = "q\(sequence % 40)"
                    do {
                        let answer = try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"\#(queue)"}"#, timeout: 10)
                        guard answer.status == 201, let id = answer.json["id"] as? String else {
                            refusals.withLock { $0.append("POST \(answer.status) \(answer.text)") }
                            continue
                        }
                        let read = try client.call("GET", "/tasks/\(id)", timeout: 10)
                        if read.status != 200 { refusals.withLock { $0.append("GET \(read.status) \(read.text)") } }
                        answered.withLock { $0 += 1 }
                    } catch {
                        refusals.withLock { $0.append("\(error)") }
                        return
                    }
                }
            }
            thread.start()
            return thread
        }
        try pollUntil("requests under way", timeout: 30) { answered.value >= 200 }
        let joins = try Self.replica("j1", url)
        try Self.waitForSpread([stays.2, joins.2])
        let atJoin = answered.value
        try pollUntil("requests after the join", timeout: 30) { answered.value >= atJoin + 200 }
        #expect(try joins.0.stop() == 0, "it printed \(String(joins.0.printed.suffix(2_000)).debugDescription)")
        try pollUntil("every cell back on the replica that stays", timeout: 30) { Self.cellsServed(stays.2) == Self.cells }
        let atLeave = answered.value
        try pollUntil("requests after the leave", timeout: 30) { answered.value >= atLeave + 200 }
        stop.withLock { $0 = true }
        _ = threads
        #expect(refusals.value.isEmpty, "\(refusals.value.count) refused: \(refusals.value.prefix(5))")
        #expect(try stays.0.stop() == 0, "it printed \(String(stays.0.printed.suffix(2_000)).debugDescription)")
    }
}
