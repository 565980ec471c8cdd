import TaskloopLoop
import TaskloopPostgres

/// The commits of the cells this replica owns. A commit is one batch on the connection (one
/// sync: one implicit transaction) for one cell or several: their fence first (each cell's
/// epoch checked, the commit's token left in each one's row; a single fsync for all of them),
/// then the writes. Commits are sent in order and pipelined.
///
/// When the connection is lost with commits on it, their outcome is unknown, and nobody is
/// answered until it is known: the committer connects again and, in one statement, moves each
/// cell of those commits to a new epoch and reads the token its row holds. The update waits
/// for a commit still running on the old session; once it is through, that session's later
/// commits fail their fence (the old epoch). A cell's row holds the token of the last commit of
/// it that went through; commits are in order and all-or-nothing, so a commit went through
/// exactly when it is at or before that one among the commits in flight that wrote the cell.
/// A commit none of whose cells this replica still holds cannot be told: it ends `.unknown`.
///
/// Threading: the loop's thread only, callbacks included.
public final class CellCommitter {
    public enum Outcome: Equatable, Sendable {
        case committed
        /// These cells' rows no longer name this replica at their epochs: nothing was written.
        case deposed([Cell])
        /// Not written (the database refused the batch, or a lost connection's commit that the
        /// resolution found had not gone through).
        case failed(String)
        /// The connection was lost and the cells moved to another owner before it could be told.
        case unknown
    }

    private final class Commit {
        let cells: [(cell: Cell, epoch: UInt64)]
        let writes: [PGQuery]
        let completion: (Outcome) -> Void
        var token = ""

        init(cells: [(cell: Cell, epoch: UInt64)], writes: [PGQuery], completion: @escaping (Outcome) -> Void) {
            self.cells = cells
            self.writes = writes
            self.completion = completion
        }
    }

    private let loop: EventLoop
    private let url: String
    private let identity: ReplicaIdentity
    private var connection: PGConnection
    private var connected = false
    /// A connection is being made (or waited for after a failure): commits wait for it.
    private var connecting = false
    /// Commits sent and not yet answered, in the order sent.
    private var inFlight: [Commit] = []
    /// Commits waiting for the connection (while it is made, or a loss is resolved).
    private var waiting: [Commit] = []
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
        commit([(cell, epoch)], writes: writes, completion)
    }

    /// Commits `writes`, which change these cells only, in one transaction fenced by each
    /// cell's epoch (or the newer one a resolution moved it to): all of them or none.
    public func commit(_ cells: [(cell: Cell, epoch: UInt64)], writes: [PGQuery], _ completion: @escaping (Outcome) -> Void) {
        precondition(!cells.isEmpty && Set(cells.map(\.cell)).count == cells.count, "each cell once")
        let commit = Commit(cells: cells, writes: writes, completion: completion)
        guard !isClosed else { return completion(.failed("the committer is closed")) }
        guard connected, !resolving else {
            waiting.append(commit)
            if !connected && !connecting { connect() }
            return
        }
        send(commit)
    }

    private func send(_ commit: Commit) {
        sequence += 1
        commit.token = "\(identity.incarnation):\(sequence)"
        inFlight.append(commit)
        let fence = ClusterSchema.fenceCommit(commit.cells.map { ($0.cell, max($0.epoch, epochs[$0.cell] ?? 0)) }, by: identity,
                                              token: commit.token)
        connection.execute([fence] + commit.writes) { [weak self, weak commit] result in
            guard let self, let commit else { return }
            switch result {
            case .success:
                finish(commit, .committed)
            case .failure(let error) where error.isConnectionLost:
                // Left in flight: the resolution answers it.
                break
            case .failure(let error) where error.sqlState == ClusterSchema.deposedState:
                finish(commit, .deposed(ClusterSchema.deposedCells(in: error.message)))
            case .failure(let error):
                finish(commit, .failed("\(error)"))
            }
        }
    }

    private func finish(_ commit: Commit, _ outcome: Outcome) {
        guard let index = inFlight.firstIndex(where: { $0 === commit }) else { return }
        inFlight.remove(at: index)
        commit.completion(outcome)
    }

    private func connect() {
        connecting = true
        connection.onClosed = { [weak self] _ in self?.connectionLost() }
        connection.connect(url) { [weak self] result in
            guard let self, !isClosed else { return }
            guard case .success = result else {
                connection.onClosed = nil
                connection.close()
                // Nothing of these was sent: they fail now instead of waiting for a database
                // that may stay away (their clients are answered 503 and may try again).
                let unsent = waiting
                waiting = []
                for commit in unsent { commit.completion(.failed("the database cannot be reached")) }
                return retryLater()
            }
            connecting = false
            connected = true
            // Every statement of a commit finds its rows by key: a generic plan, made once per
            // statement, serves them all. Custom plans (the default for a statement's first uses,
            // and for good where the planner judges one cheaper) plan `fence_commits`'s update
            // anew in each commit.
            connection.execute([PGQuery("SET plan_cache_mode = force_generic_plan")]) { _ in }
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
        let cells = Set(inFlight.flatMap { $0.cells.map(\.cell) }).sorted()
        connection.execute([ClusterSchema.refence(cells, by: identity)]) { [weak self] result in
            guard let self else { return }
            guard case .success(let results) = result else { return }  // Lost again: resolved on the next connection.
            var rows: [Cell: (epoch: UInt64, token: String?)] = [:]
            let answer = results[0]
            for row in 0..<answer.rowCount {
                guard let index = answer.int(row, 0), let epoch = answer.int(row, 1) else { continue }
                rows[Cell(UInt16(truncatingIfNeeded: index))] = (UInt64(epoch), answer.text(row, 2))
            }
            for (cell, row) in rows.sorted(by: { $0.key < $1.key }) {
                epochs[cell] = row.epoch
                onEpochAdvanced?(cell, row.epoch)
            }
            // For each cell still held: the place, among the commits in flight that wrote it, of
            // the last one that went through (-1: none did).
            var through: [Cell: Int] = [:]
            for (cell, row) in rows {
                let writers = inFlight.filter { $0.cells.contains { $0.cell == cell } }
                through[cell] = row.token.flatMap { token in writers.firstIndex { $0.token == token } } ?? -1
            }
            var seen: [Cell: Int] = [:]
            let commits = inFlight
            inFlight = []
            for commit in commits {
                var outcome = Outcome.unknown
                for (cell, _) in commit.cells {
                    let place = seen[cell, default: 0]
                    seen[cell] = place + 1
                    if let last = through[cell], outcome == .unknown {
                        outcome = place <= last ? .committed : .failed("not committed: the connection was lost before the commit")
                    }
                }
                commit.completion(outcome)
            }
            resolving = false
            flushWaiting()
        }
    }

    private func flushWaiting() {
        let queued = waiting
        waiting = []
        for commit in queued { send(commit) }
    }

    /// Closes the connection; what is in flight or waiting fails.
    public func close() {
        isClosed = true
        connection.onClosed = nil
        connection.close()
        let pending = inFlight
        inFlight = []
        for commit in pending { commit.completion(.unknown) }
        let queued = waiting
        waiting = []
        for commit in queued { commit.completion(.failed("the committer is closed")) }
    }
}
