import TaskloopLoop
import TaskloopPostgres

/// The commits of the cells this replica owns. A commit is one batch on the connection (one
/// sync: one implicit transaction): the cell's fence (its epoch checked, the commit's token
/// left in its row), then the writes. Commits of one cell are sent in order and pipelined.
///
/// When the connection is lost with commits on it, their outcome is unknown, and nobody is
/// answered until it is known: the committer connects again and, in one statement per loss,
/// moves each such cell to a new epoch and reads the token its row holds. The update waits
/// for a commit still running on the old session; once it is through, that session's later
/// commits fail their fence (the old epoch). The row's token is the last commit that went
/// through, so every commit of the cell up to it committed and the rest did not. A cell that
/// moved to another owner meanwhile cannot be told: its commits end `.unknown`.
///
/// Threading: the loop's thread only, callbacks included.
public final class CellCommitter {
    public enum Outcome: Equatable, Sendable {
        case committed
        /// The cell's row no longer names this replica at the epoch: nothing was written.
        case deposed
        /// Not written (the database refused the batch, or a lost connection's commit that the
        /// resolution found had not gone through).
        case failed(String)
        /// The connection was lost and the cell moved to another owner before it could be told.
        case unknown
    }

    private let loop: EventLoop
    private let url: String
    private let identity: ReplicaIdentity
    private var connection: PGConnection
    private var connected = false
    /// A connection is being made (or waited for after a failure): commits wait for it.
    private var connecting = false
    /// Commits sent and not yet answered, per cell, in the order sent.
    private var inFlight: [Cell: [(token: String, completion: (Outcome) -> Void)]] = [:]
    /// Commits waiting for the connection (while it is made, or a loss is resolved).
    private var waiting: [(cell: Cell, epoch: UInt64, writes: [PGQuery], completion: (Outcome) -> Void)] = []
    private var resolving = false
    private var sequence: UInt64 = 0
    private var isClosed = false
    /// Told when resolving a loss moved a cell to a new epoch: later commits use it.
    public var onEpochAdvanced: ((Cell, UInt64) -> Void)?
    private var epochs: [Cell: UInt64] = [:]

    public init(loop: EventLoop, url: String, identity: ReplicaIdentity) {
        self.loop = loop
        self.url = url
        self.identity = identity
        connection = PGConnection(loop: loop)
    }

    /// Commits `writes` for `cell` under `epoch` (or the newer epoch a resolution moved it to).
    public func commit(_ cell: Cell, epoch: UInt64, writes: [PGQuery], _ completion: @escaping (Outcome) -> Void) {
        guard !isClosed else { return completion(.failed("the committer is closed")) }
        guard connected, !resolving else {
            waiting.append((cell, epoch, writes, completion))
            if !connected && !connecting { connect() }
            return
        }
        send(cell, epoch: max(epoch, epochs[cell] ?? 0), writes: writes, completion)
    }

    private func send(_ cell: Cell, epoch: UInt64, writes: [PGQuery], _ completion: @escaping (Outcome) -> Void) {
        sequence += 1
        let token = "\(identity.incarnation):\(sequence)"
        inFlight[cell, default: []].append((token, completion))
        connection.execute([ClusterSchema.fenceCommit(cell, epoch: epoch, by: identity, token: token)] + writes) { [weak self] result in
            guard let self else { return }
            switch result {
            case .success:
                finish(cell, token: token, .committed)
            case .failure(let error) where error.isConnectionLost:
                // Left in flight: the resolution answers it.
                break
            case .failure(let error) where error.sqlState == ClusterSchema.deposedState:
                finish(cell, token: token, .deposed)
            case .failure(let error):
                finish(cell, token: token, .failed("\(error)"))
            }
        }
    }

    private func finish(_ cell: Cell, token: String, _ outcome: Outcome) {
        guard let index = inFlight[cell]?.firstIndex(where: { $0.token == token }) else { return }
        let entry = inFlight[cell]!.remove(at: index)
        if inFlight[cell]!.isEmpty { inFlight[cell] = nil }
        entry.completion(outcome)
    }

    private func connect() {
        connecting = true
        connection.onClosed = { [weak self] _ in self?.connectionLost() }
        connection.connect(url) { [weak self] result in
            guard let self, !isClosed else { return }
            guard case .success = result else {
                connection.onClosed = nil
                connection.close()
                return retryLater()
            }
            connecting = false
            connected = true
            if inFlight.isEmpty { flushWaiting() } else { resolve() }
        }
    }

    private func connectionLost() {
        guard !isClosed else { return }
        connected = false
        connection = PGConnection(loop: loop)
        resolving = !inFlight.isEmpty
        connect()
    }

    private func retryLater() {
        connection = PGConnection(loop: loop)
        guard let timer = try? LoopTimer(loop: loop) else { return connect() }
        timer.start(after: 1_000) { [weak self] in
            timer.close()
            self?.connect()
        }
    }

    /// Finds out which commits of the lost connection went through (see the type's comment).
    private func resolve() {
        resolving = true
        let cells = inFlight.keys.sorted()
        connection.execute([ClusterSchema.refence(cells, by: identity)]) { [weak self] result in
            guard let self else { return }
            guard case .success(let results) = result else { return }  // Lost again: resolved on the next connection.
            var rows: [Cell: (epoch: UInt64, token: String?)] = [:]
            let answer = results[0]
            for row in 0..<answer.rowCount {
                guard let index = answer.int(row, 0), let epoch = answer.int(row, 1) else { continue }
                rows[Cell(UInt16(truncatingIfNeeded: index))] = (UInt64(epoch), answer.text(row, 2))
            }
            for cell in cells {
                let entries = inFlight[cell] ?? []
                inFlight[cell] = nil
                guard let row = rows[cell] else {
                    for entry in entries { entry.completion(.unknown) }
                    continue
                }
                epochs[cell] = row.epoch
                onEpochAdvanced?(cell, row.epoch)
                let through = row.token.flatMap { token in entries.firstIndex { $0.token == token } }
                for (index, entry) in entries.enumerated() {
                    entry.completion(through.map { index <= $0 } == true
                                     ? .committed : .failed("not committed: the connection was lost before the commit"))
                }
            }
            resolving = false
            flushWaiting()
        }
    }

    private func flushWaiting() {
        let queued = waiting
        waiting = []
        for item in queued { send(item.cell, epoch: max(item.epoch, epochs[item.cell] ?? 0), writes: item.writes, item.completion) }
    }

    /// Closes the connection; what is in flight or waiting fails.
    public func close() {
        isClosed = true
        connection.onClosed = nil
        connection.close()
        let pending = inFlight.values.flatMap { $0 }
        inFlight = [:]
        for entry in pending { entry.completion(.unknown) }
        for item in waiting { item.completion(.failed("the committer is closed")) }
        waiting = []
    }
}
