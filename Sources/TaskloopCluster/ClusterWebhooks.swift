import TaskloopLoop
import TaskloopPostgres
import TaskloopStore

/// Webhooks on cells (docs/SCALING.md, "Under way: cells"). A webhook is the cluster's, not a
/// cell's: its definition is a row of `cluster_webhooks`, written by whichever replica took the
/// request, on a connection of its own, and announced on `taskloop_webhooks`; every replica
/// reads the whole table when told (or when a request asks about webhooks), so each knows them
/// all. A delivery is its event's cell's: a row of `cell_deliveries` written in the fenced
/// commits of that cell (made with the change it reports, then each attempt's outcome), so the
/// cell's owner attempts it only once the change has committed, and the next owner resumes it
/// where the last committed attempt left it.
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
    private var readers: [(Result<[WebhookRecord], PGError>) -> Void] = []
    private var isReading = false
    /// Writes that failed so far: `whenWritten` tells whether one failed after it was asked.
    private var failedWrites = 0
    /// Told the table's webhooks after each change another replica announced, and after a
    /// reconnect (what was announced meanwhile may have been missed).
    public var onChanged: (([WebhookRecord]) -> Void)?

    public init(loop: EventLoop, url: String) {
        self.loop = loop
        self.url = url
        connection = PGConnection(loop: loop)
    }

    /// Connects, creates the tables if they are missing, listens, and reads the webhooks.
    public func start(_ completion: @escaping (Result<[WebhookRecord], PGError>) -> Void) {
        connection.onNotification = { [weak self] channel, _ in
            guard let self, channel == Self.channel else { return }
            read { [weak self] result in
                if case .success(let records) = result { self?.onChanged?(records) }
            }
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

    /// The webhooks the table holds now. Reads asked for while one is under way share the next.
    public func read(_ completion: @escaping (Result<[WebhookRecord], PGError>) -> Void) {
        readers.append(completion)
        if !isReading { readTable() }
    }

    private func readTable() {
        isReading = true
        let waiting = readers
        readers = []
        connection.execute([PGQuery("SELECT record FROM taskloop.cluster_webhooks", binaryResults: true)]) { [weak self] result in
            guard let self else { return }
            isReading = false
            let records = result.map { results in
                (0..<results[0].rowCount).compactMap { row in
                    results[0].bytes(row, 0).flatMap { try? SharedRecordCodec.decodeWebhook($0) }
                }
            }
            for completion in waiting { completion(records) }
            if !readers.isEmpty { readTable() }
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

    /// Runs `action(true)` once every write asked for so far has committed; `action(false)` when
    /// one of them failed.
    public func whenWritten(_ action: @escaping (Bool) -> Void) {
        let failed = failedWrites
        connection.execute([PGQuery("SELECT 1")]) { [weak self] result in
            guard let self else { return action(false) }
            action(failedWrites == failed && (try? result.get()) != nil)
        }
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

    /// Changes of the table are announced in the same transaction: a replica reads it after
    /// the change committed.
    private func write(_ queries: [PGQuery]) {
        connection.execute(queries + [PGQuery("SELECT pg_notify('\(Self.channel)', '')")]) { [weak self] result in
            if case .failure = result { self?.failedWrites += 1 }
        }
    }

    /// A new connection listens again and reads the table: what was announced meanwhile is not
    /// missed.
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
                guard let self else { return }
                switch result {
                case .success(let records): onChanged?(records)
                case .failure: connectionLost()
                }
            }
        }
    }

    public func close() {
        isClosed = true
        connection.onClosed = nil
        connection.close()
    }
}
