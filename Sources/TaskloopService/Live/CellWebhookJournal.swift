import TaskloopCluster
import TaskloopEngine
import TaskloopStore

/// Where `Webhooks` keeps its records on cells (docs/SCALING.md): webhooks in the cluster's
/// table (`ClusterWebhooks`), each delivery in the commits of the cell whose event it reports,
/// so its first attempt waits for the commit of that change, and a new owner of the cell resumes
/// it. The same `Webhooks` signs, schedules and logs as on a single server.
///
/// Threading: loop thread only.
final class CellWebhookJournal: WebhookJournal {
    let cluster: ClusterWebhooks
    weak var host: CellHost?
    /// The cell whose events are being numbered now: the deliveries they make are its.
    private var numberingCell: Cell?
    /// The cell of each delivery this replica attempts or logs.
    private var cells: [String: Cell] = [:]
    /// Numbers the rounds of new deliveries: each is let go once every commit begun before it
    /// has answered (0 would mean "at once" to `Webhooks`).
    private var round = 1
    private var roundMadeDeliveries = false

    init(cluster: ClusterWebhooks) {
        self.cluster = cluster
    }

    /// Makes the deliveries of events `cell`'s engine settled; `release(through:)` runs once
    /// their commit is known. A commit that fails closes the cell first (`dropCell`), so what
    /// is let go then is only what committed.
    func number(_ events: [StreamEvent], of cell: Cell, into webhooks: Webhooks, release: @escaping (Int) -> Void) {
        numberingCell = cell
        for event in events { webhooks.numbered(event) }
        numberingCell = nil
        guard roundMadeDeliveries, let host else { return }
        let made = round
        round += 1
        roundMadeDeliveries = false
        host.whenDurable(of: cell) { _ in release(made) }
    }

    /// A cell's engine is gone from here: the ids of its deliveries, no longer this replica's.
    func dropCell(_ cell: Cell) -> Set<String> {
        let ids = Set(cells.filter { $0.value == cell }.keys)
        for id in ids { cells.removeValue(forKey: id) }
        return ids
    }

    /// Deliveries a cell's new owner (this replica) found in the database.
    func adopt(_ deliveries: [DeliveryRecord], of cell: Cell) {
        for delivery in deliveries { cells[delivery.id] = cell }
    }

    func record(_ webhook: WebhookRecord) {
        // Enabled only as created; a change is a 410 disabling it.
        if webhook.enabled { cluster.create(webhook) } else { cluster.update(webhook) }
    }

    func delete(webhook id: String) {
        cluster.delete(id)
    }

    func record(_ delivery: DeliveryRecord) {
        guard let cell = cells[delivery.id] ?? numberingCell else { return }
        cells[delivery.id] = cell
        if numberingCell != nil { roundMadeDeliveries = true }
        // A cell no longer here writes nothing: its new owner attempts the delivery.
        host?.write([ClusterWebhooks.save(delivery, in: cell)], in: cell)
    }

    func delete(deliveries ids: [String]) {
        for id in ids { cells.removeValue(forKey: id) }
        cluster.deleteDeliveries(ids)
    }

    var pendingBatch: Int? { round }
}
