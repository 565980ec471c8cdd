/// A replica as the cells table knows it: its name, and the process behind it now. A process
/// that restarts under the same name is another incarnation, and owns nothing the previous one
/// owned without claiming it again.
public struct ReplicaIdentity: Hashable, Sendable, CustomStringConvertible {
    public let name: String
    public let incarnation: String

    public init(name: String, incarnation: String) {
        self.name = name
        self.incarnation = incarnation
    }

    public var description: String { "\(name) (\(incarnation))" }
}

/// One row of the cells table as a renewal read it.
public struct CellRow: Equatable, Sendable {
    public let cell: Cell
    public let owner: ReplicaIdentity?
    public let epoch: UInt64
    /// The owner's lease ended more than the margin ago, by the database's clock: anyone may
    /// claim the cell.
    public let expired: Bool

    public init(cell: Cell, owner: ReplicaIdentity?, epoch: UInt64, expired: Bool) {
        self.cell = cell
        self.owner = owner
        self.epoch = epoch
        self.expired = expired
    }
}

/// What a renewal found: it extended this replica's lease and the leases of the cells the
/// table says it owns, then read who is live and every cell's row, in one transaction.
public struct RenewalAnswer: Sendable {
    /// False when this replica's row is gone or belongs to another incarnation (another
    /// process took the name): nothing was renewed.
    public var isRegistered: Bool
    /// Names of the live replicas that may own cells with this one (same protocol), this one
    /// included.
    public var live: [String]
    public var cells: [CellRow]
    /// The cluster runs a newer protocol than this replica: it hands its cells over and leaves.
    public var isSuperseded = false
    /// A replica of an older protocol is still live: it is handing its cells over, and none
    /// may be claimed until it is gone, so replicas of two protocols never own cells together.
    public var olderMembersLive = false

    public init(isRegistered: Bool, live: [String], cells: [CellRow]) {
        self.isRegistered = isRegistered
        self.live = live
        self.cells = cells
    }
}

/// One replica's side of owning cells, as a value: events (a tick of the clock, a renewal's
/// answer, a claim's outcome, a drain's end) return the actions to take. The driver sends the
/// statements and runs the cells' engines; this holds the rules, so they are tested without a
/// database or a clock.
///
/// The timing rule, which keeps one attempt from running twice at once even across a
/// partition: a renewal sent at local time `t` keeps this replica's cells until `t + lease -
/// margin` on its own monotonic clock. The database sets the lease to its own clock at the
/// renewal plus `lease`, which is no earlier, and another replica may claim a cell only
/// `margin` after that. So without a confirmed renewal the owner closes its cells (stops
/// starting work, stops its attempts) at least two margins before anyone may take them, as
/// long as the two clocks' rates differ by less than that over a lease.
///
/// Threading: a value; its driver keeps it on one thread.
public struct CellOwnership: Sendable {
    public struct Settings: Sendable {
        public var leaseMilliseconds: UInt64
        public var marginMilliseconds: UInt64

        public init(leaseMilliseconds: UInt64, marginMilliseconds: UInt64) {
            precondition(marginMilliseconds * 4 <= leaseMilliseconds, "the margin is at most a quarter of the lease")
            self.leaseMilliseconds = leaseMilliseconds
            self.marginMilliseconds = marginMilliseconds
        }

        /// Renewals come four times a lease: two may be lost before anything is fenced.
        public var renewalInterval: UInt64 { leaseMilliseconds / 4 }
    }

    /// A cell this replica has to do with. Cells it neither owns nor claims are absent.
    public enum CellState: Equatable, Sendable {
        /// Claim sent for the cell at this epoch (it becomes epoch + 1).
        case claiming(from: UInt64)
        case owned(epoch: UInt64)
        /// Another replica should own it: its engine finishes what it committed and stops.
        case draining(epoch: UInt64)
        /// Drained; the release is on its way.
        case releasing(epoch: UInt64)
    }

    public enum CloseReason: Equatable, Sendable {
        /// The table says another replica owns it (or a newer epoch): this replica was deposed.
        case lost
        /// No renewal was confirmed in time: the replica stops before anyone may take over.
        case fenced
        /// Another process registered under this replica's name.
        case replaced
    }

    public enum Action: Equatable, Sendable {
        /// Send a renewal; answer with `renewed(sentAt:_:)` (the time passed to the tick that
        /// asked for it) or `renewalFailed()`.
        case renew
        /// Claim the cell if its row is still at `currentEpoch` and claimable; answer with
        /// `claimed` or `claimFailed`.
        case claim(Cell, currentEpoch: UInt64)
        /// Claimed: load the cell's records and run its engine, committing under `epoch`.
        case open(Cell, epoch: UInt64)
        /// Finish the cell's commits, stop its engine and its attempts; answer with `drained`.
        case drain(Cell)
        /// Give the cell up (owner cleared where the epoch still matches); answer with
        /// `released`.
        case release(Cell, epoch: UInt64)
        /// Stop the cell's engine and attempts now and commit nothing more for it.
        case close(Cell, CloseReason)
    }

    public let me: ReplicaIdentity
    public let layout: CellLayout
    public let settings: Settings
    public private(set) var cells: [Cell: CellState] = [:]
    /// Until when (local monotonic ms) the last confirmed renewal keeps this replica's cells.
    public private(set) var keptUntil: UInt64?
    /// When the renewal under way was sent.
    private var renewalSentAt: UInt64?
    private var nextRenewalAt: UInt64 = 0
    /// Asked to renew while a renewal was under way: the next goes at once after it.
    private var renewsAgain = false
    public private(set) var isStopping = false
    /// The cluster moved to a newer protocol: this replica stops as in a graceful stop, and
    /// never claims again.
    public private(set) var isSuperseded = false
    /// Another process registered under this replica's name: this one closed its cells and is
    /// done (the name, and the cells it held, are the newer process's to take).
    public private(set) var isReplaced = false

    public init(me: ReplicaIdentity, layout: CellLayout, settings: Settings) {
        self.me = me
        self.layout = layout
        self.settings = settings
    }

    /// The registration sent at `sentAt` set this replica's row to expire a lease later, as a
    /// renewal does: it keeps the replica (with no cells yet) until the first renewal's answer.
    public mutating func registered(sentAt: UInt64) {
        keptUntil = max(keptUntil ?? 0, sentAt + settings.leaseMilliseconds - settings.marginMilliseconds)
    }

    /// Stopping, and nothing is left to give up.
    public var isStopped: Bool { isStopping && cells.isEmpty }

    /// The cells whose engines run here (owned or draining), with their epochs.
    public var openCells: [Cell: UInt64] {
        var open: [Cell: UInt64] = [:]
        for (cell, state) in cells {
            switch state {
            case .owned(let epoch), .draining(let epoch): open[cell] = epoch
            case .claiming, .releasing: break
            }
        }
        return open
    }

    /// When the driver must tick next at the latest (a renewal is due, or the fence).
    public var nextDeadline: UInt64 {
        // Stopped, nothing is due: a renewal asked for (`renewSoon`) is never sent.
        var deadline = renewalSentAt == nil && !isStopped ? nextRenewalAt : UInt64.max
        if let keptUntil, !cells.isEmpty { deadline = min(deadline, keptUntil) }
        return deadline
    }

    // MARK: events

    /// Another replica joined, left or gave a cell up: renew at the next tick rather than at
    /// the interval, so cells move in a round trip or two instead of a renewal interval.
    public mutating func renewSoon() {
        if renewalSentAt == nil {
            nextRenewalAt = 0
        } else {
            renewsAgain = true
        }
    }

    public mutating func tick(now: UInt64) -> [Action] {
        var actions: [Action] = []
        if let keptUntil, now >= keptUntil, !cells.isEmpty {
            actions += closeAll(.fenced)
        }
        if renewalSentAt == nil, now >= nextRenewalAt, !isStopped {
            renewalSentAt = now
            actions.append(.renew)
        }
        return actions
    }

    /// A renewal's answer, read at `now`. One that comes after the lease it confirms would have
    /// ended (a long pause) still shows which cells were lost, but claims and drains nothing:
    /// the next renewal, sent now, decides on fresh rows.
    public mutating func renewed(sentAt: UInt64, now: UInt64, _ answer: RenewalAnswer) -> [Action] {
        renewalSentAt = nil
        nextRenewalAt = renewsAgain ? 0 : sentAt + settings.renewalInterval
        renewsAgain = false
        guard answer.isRegistered else {
            keptUntil = nil
            isReplaced = true
            return closeAll(.replaced)
        }
        keptUntil = max(keptUntil ?? 0, sentAt + settings.leaseMilliseconds - settings.marginMilliseconds)
        let isFresh = now < keptUntil!
        var actions: [Action] = []
        if answer.isSuperseded && !isSuperseded {
            isSuperseded = true
            actions += stop()
        }
        let rows = Dictionary(answer.cells.map { ($0.cell, $0) }, uniquingKeysWith: { first, _ in first })
        let owners = Rendezvous.assignment(layout, among: isStopping ? answer.live.filter { $0 != me.name } : answer.live)
        for (cell, state) in cells.sorted(by: { $0.key < $1.key }) {
            let row = rows[cell]
            switch state {
            case .owned(let epoch):
                guard row?.owner == me && row?.epoch == epoch else {
                    cells[cell] = nil
                    actions.append(.close(cell, .lost))
                    continue
                }
                if owners[cell] != me.name && isFresh {
                    cells[cell] = .draining(epoch: epoch)
                    actions.append(.drain(cell))
                }
            case .draining(let epoch):
                if row?.owner != me || row?.epoch != epoch {
                    cells[cell] = nil
                    actions.append(.close(cell, .lost))
                }
            case .claiming, .releasing:
                break
            }
        }
        guard isFresh else { return actions }
        for cell in layout.cells where cells[cell] == nil {
            guard let row = rows[cell] else { continue }
            if owners[cell] == me.name && !isStopping && !answer.olderMembersLive {
                // A row that still names this process is one it closed (fenced, or a claim
                // whose answer was lost) and may take back, with a new epoch and its records
                // read again.
                if row.owner == nil || row.owner == me || row.expired {
                    cells[cell] = .claiming(from: row.epoch)
                    actions.append(.claim(cell, currentEpoch: row.epoch))
                }
            } else if row.owner == me {
                // Such a row that should be another's: this renewal just extended its lease,
                // and nobody else may claim it until it is given up.
                cells[cell] = .releasing(epoch: row.epoch)
                actions.append(.release(cell, epoch: row.epoch))
            }
        }
        return actions
    }

    public mutating func renewalFailed() {
        renewalSentAt = nil
    }

    /// The claim answered at `now` succeeded: the row names this process under `epoch`.
    public mutating func claimed(_ cell: Cell, epoch: UInt64, now: UInt64) -> [Action] {
        guard case .claiming = cells[cell], now < keptUntil ?? 0 else {
            // Closed while the claim was out (fenced), or answered too late to run under the
            // lease this replica can vouch for: the row names this process, and the next
            // renewal takes the cell back or lets it lapse.
            cells[cell] = nil
            return []
        }
        guard !isStopping else {
            cells[cell] = .releasing(epoch: epoch)
            return [.release(cell, epoch: epoch)]
        }
        cells[cell] = .owned(epoch: epoch)
        return [.open(cell, epoch: epoch)]
    }

    /// This replica moved its own cell to a newer epoch (resolving commits a lost connection
    /// left unanswered): the cell stays its own under that epoch.
    public mutating func epochAdvanced(_ cell: Cell, to epoch: UInt64) {
        switch cells[cell] {
        case .owned(let current)? where epoch > current: cells[cell] = .owned(epoch: epoch)
        case .draining(let current)? where epoch > current: cells[cell] = .draining(epoch: epoch)
        default: break
        }
    }

    public mutating func claimFailed(_ cell: Cell) {
        if case .claiming = cells[cell] { cells[cell] = nil }
    }

    public mutating func drained(_ cell: Cell) -> [Action] {
        guard case .draining(let epoch) = cells[cell] else { return [] }
        cells[cell] = .releasing(epoch: epoch)
        return [.release(cell, epoch: epoch)]
    }

    /// The release is done, or failed: either way the cell is no longer this replica's (a
    /// failed release lapses with the lease).
    public mutating func released(_ cell: Cell) {
        if case .releasing = cells[cell] { cells[cell] = nil }
    }

    /// A graceful stop: every owned cell is drained and released for others to claim at once.
    public mutating func stop() -> [Action] {
        isStopping = true
        var actions: [Action] = []
        for (cell, state) in cells.sorted(by: { $0.key < $1.key }) {
            if case .owned(let epoch) = state {
                cells[cell] = .draining(epoch: epoch)
                actions.append(.drain(cell))
            }
        }
        return actions
    }

    /// Closes the cells whose engines run here; claims and releases under way are forgotten
    /// (a claim that lands names this process, and the next renewal sorts it out).
    private mutating func closeAll(_ reason: CloseReason) -> [Action] {
        let closed = openCells.keys.sorted()
        cells = [:]
        return closed.map { .close($0, reason) }
    }
}
