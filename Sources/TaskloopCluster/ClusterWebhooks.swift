import TaskloopLoop
import TaskloopPostgres
import TaskloopStore

/// Webhooks on cells (docs/SCALING.md, "Under way: cells"). A webhook is the cluster's, not a
/// cell's: its definition is a row of `cluster_webhooks`, written by whichever replica took the
/// request, on a connection of its own, and announced on `taskloop_webhooks`; every replica
/// reads the whole table when told (or when a request asks about webhooks), so each knows them
/// all. Every change also raises the cluster's webhooks version (`cluster.webhooks`) in its
/// transaction; a replica that has read the table records the version it read in its
/// `members` row, and a change is answered once every live member has recorded it
/// (`whenSynced`), so an event any replica commits after the answer is matched against the
/// change. A replica reads on each announcement and, should one be missed, when its renewal
/// finds the version ahead of what it read (`catchUp`). A delivery is its event's cell's: a row
/// of `cell_deliveries` written in the fenced commits of that cell (made with the change it
/// reports, then each attempt's outcome), so the cell's owner attempts it only once the change
/// has committed, and the next owner resumes it where the last committed attempt left it.
///
/// Threading: the loop's thread only, callbacks included.
public final class ClusterWebhooks {
    /// The channel a change of the webhooks table is announced on.
    public static let channel = "taskloop_webhooks"

    /// Created if missing by each replica as it starts (a cluster made before them has none),
    /// under the lock of the cluster's own tables (`ClusterSchema.setUp`); on tables that exist
    /// it takes no lock of theirs, so commits under way wait for nothing. The webhooks must be known before any cell opens
    /// here (its events may match one), so this is read before the replica joins.
    /// No index beyond the keys: a cell's deliveries are read when it opens and a webhook's when
    /// its log is asked for, and the table holds only the logs (bounded by
    /// `--webhook-delivery-log`) and what is pending; an index would cost every commit.
    static let setUp = [
        PGQuery("SELECT pg_advisory_xact_lock(\(ClusterSchema.setUpLock))"),
        PGQuery("CREATE SCHEMA IF NOT EXISTS taskloop"),
        PGQuery("CREATE TABLE IF NOT EXISTS taskloop.cluster_webhooks (id text PRIMARY KEY, record bytea NOT NULL)"),
        PGQuery("""
            CREATE TABLE IF NOT EXISTS taskloop.cell_deliveries (id text PRIMARY KEY, cell int NOT NULL, webhook text NOT NULL,
                record bytea NOT NULL)
            """),
    ]

    static let upsertDelivery = PGStatement("cell_upsert_delivery", """
        INSERT INTO taskloop.cell_deliveries (id, cell, webhook, record) VALUES ($1, $2, $3, $4)
        ON CONFLICT (id) DO UPDATE SET cell = excluded.cell, record = excluded.record
        """)

    /// The statement that keeps `delivery` as it is now, for a commit of `cell`.
    public static func save(_ delivery: DeliveryRecord, in cell: Cell) -> PGQuery {
        PGQuery(upsertDelivery, [.text(delivery.id), .int(Int(cell.index)), .text(delivery.webhook),
                                 .bytes(SharedRecordCodec.encode(delivery))])
    }

    private let loop: EventLoop
    private let url: String
    private var connection: PGConnection
    private var isClosed = false
    private var isReconnecting = false
    /// Reads of the table asked for while one is under way, answered by the next.
    private var readers: [(Result<Void, PGError>) -> Void] = []
    private var isReading = false
    /// Writes that failed so far: `whenSynced` tells whether one failed after it was asked.
    private var failedWrites = 0
    /// This replica's row in `members`, once it has joined: from then on each read records
    /// the version it read there.
    private var member: (identity: ReplicaIdentity, protocolVersion: Int)?
    /// The webhooks version of the last read (0 until this replica has joined).
    private var readVersion: Int64 = 0
    /// The version last recorded in this replica's row.
    private var recordedVersion: Int64 = 0
    /// The version the last change this replica wrote raised the cluster's to.
    private var writtenVersion: Int64 = 0
    /// Changes whose answers wait for every live member to have read them.
    private var syncWaiters: [SyncWaiter] = []
    private let syncPoll: LoopTimer
    /// Told the table's webhooks at every read of it, before the version read is recorded: the
    /// replica's webhooks must be the table's by then.
    public var onChanged: (([WebhookRecord]) -> Void)?

    /// How a change's wait for the other replicas ended.
    public enum SyncOutcome {
        case synced
        /// Some live members had not read it when the wait ended (named).
        case late([String])
        /// The change, or the read of the members, failed.
        case failed
    }

    private struct SyncWaiter {
        let version: Int64
        let deadline: UInt64
        let action: (SyncOutcome) -> Void
    }

    /// How often a change waiting for the members looks at their rows again.
    static let syncPollMilliseconds: UInt64 = 10

    public init(loop: EventLoop, url: String) throws(UVError) {
        self.loop = loop
        self.url = url
        connection = PGConnection(loop: loop)
        syncPoll = try LoopTimer(loop: loop)
    }

    /// Connects, creates the tables if they are missing, listens, and reads the webhooks.
    public func start(_ completion: @escaping (Result<Void, PGError>) -> Void) {
        connection.onNotification = { [weak self] channel, _ in
            guard let self, channel == Self.channel else { return }
            read { _ in }
        }
        connection.onClosed = { [weak self] _ in self?.connectionLost() }
        connection.connect(url) { [weak self] result in
            guard let self else { return }
            if case .failure(let error) = result { return completion(.failure(error)) }
            connection.execute(Self.setUp + [PGQuery("LISTEN \(Self.channel)")]) { [weak self] result in
                guard let self else { return }
                if case .failure(let error) = result { return completion(.failure(error)) }
                read(completion)
            }
        }
    }

    /// This replica has joined the cluster as `identity` (its tables are current): it records
    /// each version it reads from now on, starting with a read now.
    public func joined(as identity: ReplicaIdentity, protocolVersion: Int) {
        member = (identity, protocolVersion)
        read { _ in }
    }

    /// A renewal read the cluster's webhooks version: a change whose announcement was missed
    /// is read now.
    public func catchUp(to version: Int64) {
        if member != nil, version > readVersion, !isReading { read { _ in } }
    }

    /// Brings this replica's webhooks (`onChanged`) up to the table. Reads asked for while one
    /// is under way share the next.
    public func read(_ completion: @escaping (Result<Void, PGError>) -> Void) {
        readers.append(completion)
        if !isReading { readTable() }
    }

    private func readTable() {
        isReading = true
        let waiting = readers
        readers = []
        let member = member
        // The version first: the webhooks read after it hold every change up to it.
        let version = member == nil ? [] : [PGQuery("SELECT webhooks FROM taskloop.cluster")]
        let records = PGQuery("SELECT record FROM taskloop.cluster_webhooks", binaryResults: true)
        connection.execute(version + [records]) { [weak self] result in
            guard let self else { return }
            isReading = false
            switch result {
            case .success(let results):
                let table = results[results.count - 1]
                onChanged?((0..<table.rowCount).compactMap { row in
                    table.bytes(row, 0).flatMap { try? SharedRecordCodec.decodeWebhook($0) }
                })
                if let member, let read = results[0].int(0, 0) {
                    readVersion = max(readVersion, read)
                    // Most reads (each webhook request makes one) find nothing new to record.
                    if readVersion > recordedVersion { record(readVersion, as: member.identity) }
                }
                for completion in waiting { completion(.success(())) }
            case .failure(let error):
                for completion in waiting { completion(.failure(error)) }
            }
            if !readers.isEmpty { readTable() }
        }
    }

    private func record(_ version: Int64, as identity: ReplicaIdentity) {
        connection.execute([PGQuery("""
            UPDATE taskloop.members SET webhooks = greatest(webhooks, $3) WHERE name = $1 AND incarnation = $2
            """, [.text(identity.name), .text(identity.incarnation), .int(version)])]) { [weak self] result in
            guard let self, case .success = result else { return }
            recordedVersion = max(recordedVersion, version)
        }
    }

    /// A new webhook.
    public func create(_ record: WebhookRecord) {
        write([PGQuery("INSERT INTO taskloop.cluster_webhooks (id, record) VALUES ($1, $2)",
                       [.text(record.id), .bytes(SharedRecordCodec.encode(record))])])
    }

    /// A webhook changed (disabled by a 410): never one deleted meanwhile brought back.
    public func update(_ record: WebhookRecord) {
        write([PGQuery("UPDATE taskloop.cluster_webhooks SET record = $2 WHERE id = $1",
                       [.text(record.id), .bytes(SharedRecordCodec.encode(record))])])
    }

    /// A webhook and its deliveries, in every cell. (A commit of a cell may still write one of
    /// its deliveries afterwards; a cell's deliveries are read with the webhooks still there.)
    public func delete(_ id: String) {
        write([PGQuery("DELETE FROM taskloop.cluster_webhooks WHERE id = $1", [.text(id)]),
               PGQuery("DELETE FROM taskloop.cell_deliveries WHERE webhook = $1", [.text(id)])])
    }

    /// Deliveries pushed out of their webhook's log. Outside the cells' commits: a finished
    /// delivery is written by no one again.
    public func deleteDeliveries(_ ids: [String]) {
        guard !ids.isEmpty else { return }
        connection.execute([PGQuery("DELETE FROM taskloop.cell_deliveries WHERE id = ANY($1::text[])",
                                    [.text("{" + ids.joined(separator: ",") + "}")])]) { _ in }
    }

    /// Runs `action` once every write asked for so far has committed and every live member of
    /// this protocol has read it, or once `milliseconds` have passed (`late`, naming those that
    /// had not); `failed` when a write failed.
    public func whenSynced(within milliseconds: UInt64, _ action: @escaping (SyncOutcome) -> Void) {
        let failed = failedWrites
        connection.execute([PGQuery("SELECT 1")]) { [weak self] result in
            guard let self, failedWrites == failed, (try? result.get()) != nil else { return action(.failed) }
            syncWaiters.append(SyncWaiter(version: writtenVersion, deadline: loop.now + milliseconds, action: action))
            if syncWaiters.count == 1 { pollMembers() }
        }
    }

    /// One read of the members' rows serves every change waiting.
    private func pollMembers() {
        // Not joined yet (a request in the moment the replica starts): the members' rows may
        // not be readable, and there is no one to wait for as a member.
        guard let member else { return endSyncWaits(.late([])) }
        connection.execute([PGQuery("""
            SELECT name, webhooks FROM taskloop.members WHERE expires_at > clock_timestamp() AND protocol = $1
            """, [.int(member.protocolVersion)])]) { [weak self] result in
            guard let self else { return }
            guard case .success(let results) = result else { return endSyncWaits(.failed) }
            let members = (0..<results[0].rowCount).map { (name: results[0].text($0, 0) ?? "", read: results[0].int($0, 1) ?? 0) }
            let now = loop.now
            var waiting: [SyncWaiter] = []
            for waiter in syncWaiters {
                let lagging = members.filter { $0.read < waiter.version }.map(\.name)
                if lagging.isEmpty {
                    waiter.action(.synced)
                } else if now >= waiter.deadline {
                    waiter.action(.late(lagging))
                } else {
                    waiting.append(waiter)
                }
            }
            syncWaiters = waiting
            guard !waiting.isEmpty else { return }
            syncPoll.start(after: Self.syncPollMilliseconds) { [weak self] in self?.pollMembers() }
        }
    }

    private func endSyncWaits(_ outcome: SyncOutcome) {
        let waiting = syncWaiters
        syncWaiters = []
        for waiter in waiting { waiter.action(outcome) }
    }

    /// The deliveries kept for `cell`, of webhooks that still exist.
    public func deliveries(ofCell cell: Cell, _ completion: @escaping (Result<[DeliveryRecord], PGError>) -> Void) {
        readDeliveries(PGQuery("""
            SELECT record FROM taskloop.cell_deliveries WHERE cell = $1
                AND webhook IN (SELECT id FROM taskloop.cluster_webhooks)
            """, [.int(Int(cell.index))], binaryResults: true), completion)
    }

    /// Every delivery kept for `webhook`, whichever cell made it.
    public func deliveries(ofWebhook webhook: String, _ completion: @escaping (Result<[DeliveryRecord], PGError>) -> Void) {
        readDeliveries(PGQuery("SELECT record FROM taskloop.cell_deliveries WHERE webhook = $1", [.text(webhook)],
                               binaryResults: true), completion)
    }

    private func readDeliveries(_ query: PGQuery, _ completion: @escaping (Result<[DeliveryRecord], PGError>) -> Void) {
        connection.execute([query]) { result in
            completion(result.map { results in
                (0..<results[0].rowCount).compactMap { row in
                    results[0].bytes(row, 0).flatMap { try? SharedRecordCodec.decodeDelivery($0) }
                }
            })
        }
    }

    /// Changes of the table raise the version and are announced in the same transaction: a
    /// replica reads the table after the change committed.
    private func write(_ queries: [PGQuery]) {
        let announced = queries + [PGQuery("UPDATE taskloop.cluster SET webhooks = webhooks + 1 RETURNING webhooks"),
                                   PGQuery("SELECT pg_notify('\(Self.channel)', '')")]
        connection.execute(announced) { [weak self] result in
            guard let self else { return }
            switch result {
            case .success(let results): writtenVersion = max(writtenVersion, results[queries.count].int(0, 0) ?? 0)
            case .failure: failedWrites += 1
            }
        }
    }

    /// A new connection listens again and reads the table (`start`): what was announced
    /// meanwhile is not missed.
    private func connectionLost() {
        guard !isClosed, !isReconnecting else { return }
        isReconnecting = true
        connection.onClosed = nil
        connection = PGConnection(loop: loop)
        guard let timer = try? LoopTimer(loop: loop) else { return }
        timer.start(after: 500) { [weak self] in
            timer.close()
            guard let self, !isClosed else { return }
            isReading = false
            isReconnecting = false
            start { [weak self] result in
                if case .failure = result { self?.connectionLost() }
            }
        }
    }

    public func close() {
        isClosed = true
        syncPoll.close()
        connection.onClosed = nil
        connection.close()
    }
}
