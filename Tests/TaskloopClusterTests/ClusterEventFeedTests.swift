import Foundation
import Testing
import TaskloopLoop
import TaskloopPostgres
import TaskloopTestSupport
@testable import TaskloopCluster

/// A replica's feed of the cluster's events: every event once, in the one order, whatever the
/// order transactions commit in, across lost connections, from a resume or from now.
@Suite struct ClusterEventFeedTests {
    /// A feed on the cluster's loop and what it delivered.
    final class Feed: @unchecked Sendable {
        let cluster: CellKeeperTests.Cluster
        /// The feed's sessions are found by this name (`pg_stat_activity`).
        let name: String
        let delivered = Locked<[ClusterEvents.Read]>([])
        let troubles = Locked(0)
        /// How often it has read where it starts (`onPositioned`).
        let positioned = Locked(0)
        private var feed: ClusterEventFeed!

        init(_ cluster: CellKeeperTests.Cluster, _ name: String, from start: ClusterEventFeed.Start, readLimit: Int = 3) {
            self.cluster = cluster
            self.name = name
            cluster.thread.run { [self] in
                var settings = ClusterEventFeed.Settings(url: cluster.url + "?application_name=\(name)")
                settings.pollMilliseconds = 20
                settings.readLimit = readLimit
                settings.reconnectMilliseconds = 20
                feed = try! ClusterEventFeed(loop: cluster.thread.loop, settings: settings, from: start)
                let delivered = self.delivered, troubles = self.troubles
                feed.onEvents = { events in
                    precondition(events.count <= readLimit, "a delivery holds at most a read's limit")
                    delivered.withLock { $0 += events }
                }
                feed.onTrouble = { _ in troubles.withLock { $0 += 1 } }
                let positioned = self.positioned
                feed.onPositioned = { positioned.withLock { $0 += 1 } }
                feed.start()
            }
        }

        var position: EventPosition? { cluster.thread.run { [self] in feed.position } }
        var readsSent: Int { cluster.thread.run { [self] in feed.readsSent } }

        func pause() {
            cluster.thread.run { [self] in feed.pause() }
        }

        func follow() {
            cluster.thread.run { [self] in feed.follow() }
        }

        /// Rests and follows again in one turn of the loop, with whatever was under way.
        func pauseAndFollow() {
            cluster.thread.run { [self] in
                feed.pause()
                feed.follow()
            }
        }

        var tasks: [String] { delivered.value.map { $0.event.task ?? "" } }

        func close() {
            cluster.thread.run { [self] in feed.close() }
        }
    }

    static func event(_ name: String) -> ClusterEvents.Written {
        ClusterEvents.Written(time: 1, type: "task.state", task: name, workflow: nil, queue: "q", data: Array(name.utf8))
    }

    /// The first value of a query on connection `index`, as text.
    static func value(_ cluster: CellKeeperTests.Cluster, _ index: Int, _ sql: String) throws -> String? {
        let found = Locked<String??>(nil)
        cluster.thread.run {
            cluster.connections[index].execute([PGQuery(sql)]) { result in
                found.withLock { $0 = .some((try? result.get()).flatMap { $0[0].rowCount > 0 ? $0[0].text(0, 0) : nil }) }
            }
        }
        try pollUntil("the query") { found.value != nil }
        return found.value!
    }

    /// Waits until `feed` has answered a read begun after now: two reads started after now
    /// (a feed begins a read only once the one before it was delivered).
    static func waitForAReadAfterNow(_ feed: Feed, on index: Int) throws {
        let cluster = feed.cluster
        var since = try value(cluster, index, "SELECT clock_timestamp()::text")!
        for _ in 0..<2 {
            var started: String?
            try pollUntil("a read by \(feed.name) after \(since)", timeout: 20) {
                started = try value(cluster, index, """
                    SELECT query_start::text FROM pg_stat_activity WHERE application_name = '\(feed.name)'
                        AND query LIKE '%FROM taskloop.cell_events%' AND query_start > '\(since)'::timestamptz
                    """)
                return started != nil
            }
            since = started!
        }
    }

    /// Writers on three connections commit in an interleaving, one holding its transaction
    /// open across the others' commits: nothing after it is delivered until it ends, then
    /// everything, each once, in position order, in deliveries of at most the read limit.
    @Test func interleavedCommitsAreDeliveredOnceInOrderAndAnOpenTransactionHoldsTheRestBack() throws {
        let cluster = try CellKeeperTests.Cluster()
        try cluster.start("a")
        let writers = try (0..<3).map { _ in try cluster.connection() }, observer = try cluster.connection()
        let feed = Feed(cluster, "feed_interleaved", from: .after(.start))
        try pollUntil("the feed to start") { feed.position != nil }

        #expect(try cluster.execute(writers[0], [PGQuery("BEGIN")] + ClusterEvents.insert([Self.event("held")], cell: Cell(0))) == nil)
        var written = ["held"]
        for round in 0..<6 {
            for (index, writer) in writers.enumerated().dropFirst() {
                let names = (0...(round % 3)).map { "w\(index)-\(round)-\($0)" }
                #expect(try cluster.execute(writer, [PGQuery("BEGIN")] + ClusterEvents.insert(names.map(Self.event), cell: Cell(UInt16(index)))
                                            + [PGQuery("COMMIT")]) == nil)
                #expect(try cluster.execute(writer, [ClusterEvents.notify(cell: Cell(UInt16(index)))]) == nil)
                written += names
            }
        }
        try Self.waitForAReadAfterNow(feed, on: observer)
        #expect(feed.delivered.value.isEmpty, "held back by the open transaction: \(feed.tasks)")

        // More commits while the first ends: the held one comes first (the oldest transaction).
        #expect(try cluster.execute(writers[0], [PGQuery("COMMIT")]) == nil)
        for index in 1..<3 {
            let name = "after-\(index)"
            #expect(try cluster.execute(writers[index], ClusterEvents.insert([Self.event(name)], cell: Cell(UInt16(index)))) == nil)
            written.append(name)
        }
        try pollUntil("every event", timeout: 20) { feed.delivered.value.count >= written.count }
        let delivered = feed.delivered.value
        #expect(delivered.count == written.count)
        #expect(Set(feed.tasks) == Set(written))
        #expect(feed.tasks.first == "held")
        #expect(zip(delivered, delivered.dropFirst()).allSatisfy { $0.position < $1.position }, "in position order, none twice")
        // Each transaction's events in the order written.
        for index in 1..<3 {
            let mine = feed.tasks.filter { $0.hasPrefix("w\(index)-") }
            #expect(mine == written.filter { $0.hasPrefix("w\(index)-") })
        }
        #expect(feed.position == delivered.last?.position)
        feed.close()
        try cluster.finish()
    }

    /// The feed's session is ended by the server again and again while events are committed:
    /// it connects again each time and goes on from the last event it delivered.
    /// (Deadlines of a minute: the whole suite beside it loads the machine, and each cut waits
    /// out a reconnect.)
    @Test func aCutConnectionLosesAndRepeatsNothing() throws {
        let cluster = try CellKeeperTests.Cluster()
        try cluster.start("a")
        let writer = try cluster.connection(), killer = try cluster.connection()
        let feed = Feed(cluster, "feed_cut", from: .after(.start), readLimit: 2)
        try pollUntil("the feed to start") { feed.position != nil }
        var written: [String] = []
        var cuts = 0
        for round in 0..<8 {
            let names = (0..<5).map { "e\(round)-\($0)" }
            #expect(try cluster.execute(writer, ClusterEvents.insert(names.map(Self.event), cell: Cell(UInt16(round % 4)))) == nil)
            #expect(try cluster.execute(writer, [ClusterEvents.notify(cell: Cell(UInt16(round % 4)))]) == nil)
            written += names
            // Its one session: a session it dropped may linger a moment, and ending only that one
            // would be a cut the feed never sees.
            try pollUntil("the feed's session", timeout: 60) {
                try Self.value(cluster, killer, "SELECT count(*)::text FROM pg_stat_activity WHERE application_name = 'feed_cut'") == "1"
            }
            let ended = try Self.value(cluster, killer, """
                SELECT count(pg_terminate_backend(pid))::text FROM pg_stat_activity WHERE application_name = 'feed_cut'
                """)
            cuts += Int(ended ?? "0") ?? 0
            if round % 2 == 1 {
                // Cut mid-stream, and also once it has delivered everything so far.
                try pollUntil("the feed to catch up", timeout: 60) { feed.delivered.value.count >= written.count }
            }
        }
        #expect(cuts == 8, "the feed's session was ended \(cuts) times")
        // A cut may also fail a read under way: at least one trouble each.
        try pollUntil("the feed to see the last cut", timeout: 60) { feed.troubles.value >= cuts }
        #expect(try cluster.execute(writer, ClusterEvents.insert([Self.event("last")], cell: Cell(0))) == nil)
        written.append("last")
        try pollUntil("every event", timeout: 60) { feed.delivered.value.count >= written.count }
        #expect(feed.tasks == written, "each once, in order")
        feed.close()
        try cluster.finish()
    }

    /// Started from now, a feed delivers what is committed after, none of what was before; a
    /// feed resumed after a position delivers only what follows it.
    @Test func aFeedFromNowSkipsTheOlderEventsAndOneResumedStartsAfterItsPosition() throws {
        let cluster = try CellKeeperTests.Cluster()
        try cluster.start("a")
        let writer = try cluster.connection(), reader = try cluster.connection()
        let old = ["old1", "old2", "old3"]
        #expect(try cluster.execute(writer, ClusterEvents.insert(old.map(Self.event), cell: Cell(1))) == nil)
        // Readable first: a transaction left open elsewhere in the PostgreSQL cluster (another
        // test's) would otherwise keep them after where "now" is.
        let readable = Locked<Int>(0)
        try pollUntil("the old events to be readable", timeout: 20) {
            readable.withLock { $0 = -1 }
            cluster.thread.run {
                cluster.connections[reader].execute([ClusterEvents.read(after: .start, limit: 10)]) { result in
                    readable.withLock { $0 = (try? result.get()).map { ClusterEvents.events(of: $0[0]).count } ?? 0 }
                }
            }
            try pollUntil("the read") { readable.value >= 0 }
            return readable.value == old.count
        }
        let fromNow = Feed(cluster, "feed_now", from: .now)
        try pollUntil("the feed to know where now is") { fromNow.position != nil }
        #expect(try cluster.execute(writer, ClusterEvents.insert(["new1", "new2"].map(Self.event), cell: Cell(2))) == nil)
        try pollUntil("the new events", timeout: 20) { fromNow.delivered.value.count >= 2 }
        #expect(fromNow.tasks == ["new1", "new2"])

        let resumed = Feed(cluster, "feed_resumed", from: .after(fromNow.delivered.value[0].position))
        try pollUntil("the resumed feed's event", timeout: 20) { !resumed.delivered.value.isEmpty }
        #expect(try cluster.execute(writer, ClusterEvents.insert([Self.event("new3")], cell: Cell(3))) == nil)
        try pollUntil("the last event", timeout: 20) { resumed.delivered.value.count >= 2 && fromNow.delivered.value.count >= 3 }
        #expect(resumed.tasks == ["new2", "new3"])
        #expect(fromNow.tasks == ["new1", "new2", "new3"])
        fromNow.close()
        resumed.close()
        try cluster.finish()
    }

    /// At rest a feed neither listens nor reads, and forgets where it was; followed again, it
    /// starts from now: nothing committed while it rested, what comes after. Rested and
    /// followed again while a read is under way, it drops that read's answer: what it delivers
    /// stays in one order, each once.
    @Test func aFeedAtRestNeitherListensNorReadsAndFollowsAgainFromNow() throws {
        let cluster = try CellKeeperTests.Cluster()
        try cluster.start("a")
        let writer = try cluster.connection(), observer = try cluster.connection()
        func commit(_ name: String) throws {
            #expect(try cluster.execute(writer, ClusterEvents.insert([Self.event(name)], cell: Cell(0))) == nil)
            #expect(try cluster.execute(writer, [ClusterEvents.notify(cell: Cell(0))]) == nil)
        }
        let feed = Feed(cluster, "feed_rest", from: .now), witness = Feed(cluster, "feed_rest_witness", from: .now)
        try pollUntil("the feeds to start") { feed.position != nil && witness.position != nil }
        try commit("before")
        try pollUntil("the first event", timeout: 20) { feed.tasks == ["before"] }

        feed.pause()
        #expect(feed.position == nil)
        let lastStatement = "SELECT query FROM pg_stat_activity WHERE application_name = 'feed_rest' AND state = 'idle'"
        try pollUntil("the feed's session to stop listening", timeout: 20) {
            try Self.value(cluster, observer, lastStatement) == "UNLISTEN \(ClusterEvents.channel)"
        }
        let reads = feed.readsSent
        try commit("rested")
        // The witness, polling as often, has read it and read twice more since.
        try pollUntil("the witness to read the event", timeout: 20) { witness.tasks.contains("rested") }
        try Self.waitForAReadAfterNow(witness, on: observer)
        #expect(feed.readsSent == reads)
        #expect(try Self.value(cluster, observer, lastStatement) == "UNLISTEN \(ClusterEvents.channel)")
        #expect(feed.tasks == ["before"])

        feed.follow()
        try pollUntil("the feed to know where now is") { feed.position != nil }
        try commit("after")
        try pollUntil("the event after", timeout: 20) { feed.tasks.count >= 2 }
        #expect(feed.tasks == ["before", "after"])

        // Rested and followed again while it reads a burst, read after read: each time it
        // starts again from now, and tells so.
        for round in 0..<4 {
            let burst = (0..<300).map { "round\(round)-\($0)" }
            #expect(try cluster.execute(writer, ClusterEvents.insert(burst.map(Self.event), cell: Cell(0))) == nil)
            #expect(try cluster.execute(writer, [ClusterEvents.notify(cell: Cell(0))]) == nil)
            try pollUntil("the burst to be under way", timeout: 20) { feed.tasks.contains { $0.hasPrefix("round\(round)-") } }
            feed.pauseAndFollow()
            try pollUntil("the feed to know where now is again", timeout: 20) { feed.positioned.value == 3 + round }
        }
        try commit("last")
        try pollUntil("the last event", timeout: 20) { feed.tasks.last == "last" }
        let delivered = feed.delivered.value
        #expect(zip(delivered, delivered.dropFirst()).allSatisfy { $0.position < $1.position }, "in position order, none twice: \(feed.tasks)")
        #expect(!feed.tasks.contains("rested"))
        feed.close()
        witness.close()
        try cluster.finish()
    }
}
