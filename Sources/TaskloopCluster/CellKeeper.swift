import Glibc
import TaskloopLoop
import TaskloopPostgres
import TaskloopStore

/// One replica's hold on its cells in the shared database: it registers the replica, renews,
/// claims and releases as `CellOwnership` decides, on a connection of its own, and tells the
/// replica which cells to open, drain and close. The tables (`taskloop.cluster`, `members`,
/// `cells`) are created by the first replica, with the cell count it was given; later replicas
/// take the stored count.
///
/// Times for the ownership rules come from CLOCK_BOOTTIME read at the moment, not from the
/// loop's cached clock: after a pause (SIGSTOP, a suspended VM) the keeper must see at once how
/// long it was away, and close its cells before it does anything else.
///
/// Lifecycle: `start`, then `stop` (graceful: cells drained and released, the member row
/// removed) or `abandon` (as a crash leaves things: nothing released).
///
/// Threading: the loop's thread only, callbacks included.
public final class CellKeeper {
    public struct Settings: Sendable {
        public var url: String
        public var identity: ReplicaIdentity
        /// Where other replicas forward requests for this replica's cells.
        public var address: String
        /// The cell count for a cluster this replica creates; an existing cluster keeps its own.
        public var cells: Int = CellLayout.defaultCount
        public var ownership: CellOwnership.Settings
        /// Replicas of another protocol never own cells together: an older one refuses to join.
        public var protocolVersion = ClusterSchema.protocolVersion

        public init(url: String, identity: ReplicaIdentity, address: String, ownership: CellOwnership.Settings) {
            self.url = url
            self.identity = identity
            self.address = address
            self.ownership = ownership
        }
    }

    public let settings: Settings
    private let loop: EventLoop
    private var connection: PGConnection
    private let timer: LoopTimer
    private let reconnectTimer: LoopTimer
    private var ownership: CellOwnership?
    /// The live members' addresses, as the last renewal read them.
    public private(set) var addresses: [String: String] = [:]
    /// Each cell's owner, as the last renewal read it.
    public private(set) var owners: [Cell: ReplicaIdentity] = [:]
    private var stopping: (() -> Void)?
    private var isAbandoned = false
    private var isClosed = false

    /// Open the cell's engine: it commits under `epoch`.
    public var onOpen: ((Cell, UInt64) -> Void)?
    /// Finish the cell's commits and stop its engine and attempts, then call the closure.
    public var onDrain: ((Cell, @escaping () -> Void) -> Void)?
    /// Stop the cell's engine and attempts now; commit nothing more for it.
    public var onClose: ((Cell, CellOwnership.CloseReason) -> Void)?
    /// The cluster moved to a newer protocol (given): this replica handed its cells over and
    /// left it, and owns nothing from now on.
    public var onSuperseded: ((Int) -> Void)?
    /// Another process took this replica's name over; this one has closed its cells and renews
    /// no more.
    public var onReplaced: (() -> Void)?
    /// The cluster's protocol, as the last renewal read it.
    public private(set) var clusterProtocol = 0
    /// Told the cluster's webhooks version at each renewal (`ClusterWebhooks.catchUp`).
    public var onWebhooksVersion: ((Int64) -> Void)?

    /// Whether this replica follows the cluster's events (a stream is open on it). Becoming
    /// true is written at once and the others renew at once: each `NOTIFY` of events wakes
    /// every listening session in the database, so committers send them only while some
    /// member follows (`eventsFollowed`). Until they learn of it the follower's feed polls.
    public var followsEvents = false {
        didSet {
            guard followsEvents, !oldValue, ownership != nil, !isAbandoned else { return }
            eventsFollowed = true
            connection.execute(ClusterSchema.markFollowingEvents(settings)) { _ in }
        }
    }

    /// Whether some live member follows the cluster's events, as the last renewal read it
    /// (and this replica, since it does). True until the first renewal: an announcement too
    /// many costs a wake-up, one too few a poll's delay.
    public private(set) var eventsFollowed = true

    public init(loop: EventLoop, settings: Settings) throws(UVError) {
        self.loop = loop
        self.settings = settings
        connection = PGConnection(loop: loop)
        timer = try LoopTimer(loop: loop)
        do {
            reconnectTimer = try LoopTimer(loop: loop)
        } catch {
            timer.close()
            throw error
        }
    }

    /// Milliseconds on CLOCK_BOOTTIME: monotonic, and counting time the machine was suspended.
    public static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_BOOTTIME, &time)
        return UInt64(time.tv_sec) * 1_000 + UInt64(time.tv_nsec) / 1_000_000
    }

    /// The cells whose engines run here, with their epochs.
    public var openCells: [Cell: UInt64] { ownership?.openCells ?? [:] }

    /// Until when the last confirmed renewal keeps this replica's cells (`now()` time).
    public var keptUntil: UInt64? { ownership?.keptUntil }

    /// Whether a renewal confirmed in time keeps this replica in the cluster now: false while
    /// the database cannot be reached (or this replica's name was taken over).
    public var isRenewed: Bool { keptUntil.map { $0 > Self.now() } ?? false }

    /// Connects, creates or checks the tables, registers this replica (taking the name over
    /// from a previous process of it), and starts renewing. The layout is the cluster's.
    public func start(_ completion: @escaping (Result<CellLayout, PGError>) -> Void) {
        let sentAt = Self.now()
        connect(takingTheNameOver: true) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let layout):
                ownership = CellOwnership(me: settings.identity, layout: layout, settings: settings.ownership)
                ownership?.registered(sentAt: sentAt)
                tick()
                completion(.success(layout))
            }
        }
    }

    /// A start takes this replica's name over from whatever process had it (one killed, or one
    /// still running that will find itself replaced); a reconnect only takes up its own row.
    private func connect(takingTheNameOver: Bool, _ completion: @escaping (Result<CellLayout, PGError>) -> Void) {
        connection.onClosed = { [weak self] _ in self?.connectionLost() }
        let completion = { [weak self] (result: Result<CellLayout, PGError>) in
            if case .failure = result, let self {
                connection.onClosed = nil
                connection.close()
            }
            completion(result)
        }
        connection.onNotification = { [weak self] channel, payload in
            guard let self, channel == ClusterSchema.membershipChannel, payload != settings.identity.incarnation else { return }
            update { ownership in
                ownership.renewSoon()
                return []
            }
        }
        connection.connect(settings.url) { [weak self] result in
            guard let self else { return }
            if case .failure(let error) = result { return completion(.failure(error)) }
            connection.execute([PGQuery("LISTEN \(ClusterSchema.membershipChannel)"), ClusterSchema.clusterExists]) { [weak self] result in
                guard let self else { return }
                switch result {
                case .failure(let error): completion(.failure(error))
                case .success(let results) where results[1].bool(0, 0) == true: checkSchema(takingTheNameOver: takingTheNameOver, completion)
                case .success: migrate(takingTheNameOver: takingTheNameOver, completion)
                }
            }
        }
    }

    /// Tables already at this replica's version take no lock: a `CREATE ... IF NOT EXISTS`
    /// takes its table's lock before it looks, and under load it would queue every commit
    /// behind it.
    private func checkSchema(takingTheNameOver: Bool, _ completion: @escaping (Result<CellLayout, PGError>) -> Void) {
        connection.execute([ClusterSchema.schemaState]) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let results):
                let version = Int(results[0].int(0, 0) ?? 0)
                if let refusal = Self.refusal(ofSchema: version) { return completion(.failure(refusal)) }
                if version < ClusterSchema.schemaVersion { return migrate(takingTheNameOver: takingTheNameOver, completion) }
                register(takingTheNameOver: takingTheNameOver, completion)
            }
        }
    }

    private func migrate(takingTheNameOver: Bool, _ completion: @escaping (Result<CellLayout, PGError>) -> Void) {
        connection.execute(ClusterSchema.beginMigration(settings)) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let results):
                // Read under the lock: another replica may have migrated meanwhile.
                let version = Int(results[results.count - 1].int(0, 0) ?? 0)
                if let refusal = Self.refusal(ofSchema: version) {
                    return connection.execute([PGQuery("ROLLBACK")]) { _ in completion(.failure(refusal)) }
                }
                if version == 0, results[results.count - 2].bool(0, 0) == true {
                    return refuseUnfinishedTurnTasks(then: { [weak self] in
                        self?.finishMigration(from: version, takingTheNameOver, completion)
                    }, failed: { completion(.failure($0)) })
                }
                finishMigration(from: version, takingTheNameOver, completion)
            }
        }
    }

    /// The cluster is being made on a database where v2 replicas took turns: only once every
    /// task they kept has finished.
    private func refuseUnfinishedTurnTasks(then: @escaping () -> Void, failed: @escaping (PGError) -> Void) {
        connection.execute([ClusterSchema.turnTasks]) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error):
                failed(error)
            case .success(let results):
                let unfinished = CellSchema.unfinishedTasks(results[0])
                guard unfinished > 0 else { return then() }
                let refusal = PGError(message: "the database holds \(unfinished) unfinished tasks of v2 replicas, which took turns "
                    + "(taskloop.tasks); cells do not take them over: let v2 replicas finish or cancel them first, or start on "
                    + "a database of its own")
                connection.execute([PGQuery("ROLLBACK")]) { _ in failed(refusal) }
            }
        }
    }

    private func finishMigration(from version: Int, _ takingTheNameOver: Bool,
                                 _ completion: @escaping (Result<CellLayout, PGError>) -> Void) {
        connection.execute(ClusterSchema.migrate(from: version)) { [weak self] result in
            guard let self else { return }
            if case .failure(let error) = result { return completion(.failure(error)) }
            register(takingTheNameOver: takingTheNameOver, completion)
        }
    }

    private static func refusal(ofSchema version: Int) -> PGError? {
        guard version > ClusterSchema.schemaVersion else { return nil }
        return PGError(message: "the cluster's tables are of schema \(version), newer than this replica's "
                       + "\(ClusterSchema.schemaVersion): upgrade this replica before it joins")
    }

    private func register(takingTheNameOver: Bool, _ completion: @escaping (Result<CellLayout, PGError>) -> Void) {
        connection.execute(ClusterSchema.setUp(settings, takingTheNameOver: takingTheNameOver)) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let results):
                let row = ClusterSchema.clusterRow(amongSetUp: results)
                let cells = Int(row.int(0, 0) ?? 0), version = Int(row.int(0, 1) ?? 0)
                guard version <= settings.protocolVersion else {
                    return completion(.failure(PGError(message: "the cluster runs protocol \(version), newer than this "
                        + "replica's \(settings.protocolVersion): upgrade this replica before it joins")))
                }
                guard (1...CellLayout.maximumCount).contains(cells) else {
                    return completion(.failure(PGError(message: "the cluster's cell count \(cells) is out of range")))
                }
                completion(.success(CellLayout(count: cells)))
            }
        }
    }

    /// A commit resolution moved one of this replica's cells to `epoch` (`CellCommitter`).
    public func epochAdvanced(_ cell: Cell, to epoch: UInt64) {
        update { ownership in
            ownership.epochAdvanced(cell, to: epoch)
            return []
        }
    }

    // MARK: the clock

    private func tick() {
        guard !isAbandoned, var ownership else { return }
        let actions = ownership.tick(now: Self.now())
        self.ownership = ownership
        perform(actions)
        scheduleTick()
    }

    private func scheduleTick() {
        guard let ownership, !isAbandoned else { return }
        let now = Self.now()
        let deadline = ownership.nextDeadline
        // Woken at the deadline, and never more than 100 ms apart: the loop's timers run on a
        // clock that stops while the machine is suspended, and after a resume the fence must not
        // wait out the rest of a long delay.
        // Never 0: libuv 1.44 runs a timer re-armed with 0 from its own callback again before
        // it polls, so a deadline that stays due would spin the loop for ever.
        let delay = deadline > now ? min(deadline - now, 100) : 1
        timer.start(after: delay) { [weak self] in self?.tick() }
    }

    // MARK: actions

    private func perform(_ actions: [CellOwnership.Action]) {
        for action in actions {
            switch action {
            case .renew: renew()
            case .claim(let cell, let epoch): claim(cell, from: epoch)
            case .release(let cell, let epoch): release(cell, epoch: epoch)
            case .open(let cell, let epoch): onOpen?(cell, epoch)
            case .close(let cell, let reason): onClose?(cell, reason)
            case .drain(let cell):
                if let onDrain {
                    onDrain(cell) { [weak self] in self?.drained(cell) }
                } else {
                    drained(cell)
                }
            }
        }
        if ownership?.isStopped == true {
            if stopping != nil {
                finishStopping()
            } else if ownership?.isSuperseded == true {
                leaveSuperseded()
            }
        }
        if ownership?.isReplaced == true && !isAbandoned {
            // The members row is the newer process's now: left as it is.
            closeEverything()
            onReplaced?()
        }
    }

    /// Its cells handed over, a replica of an older protocol leaves the cluster, so that the
    /// newer replicas, which claim nothing while it is a live member, take its cells at once.
    private func leaveSuperseded() {
        let version = clusterProtocol
        connection.execute([ClusterSchema.deregister(settings), ClusterSchema.announceChange(settings)]) { [weak self] _ in
            guard let self else { return }
            closeEverything()
            onSuperseded?(version)
        }
        isAbandoned = true
    }

    private func update(_ change: (inout CellOwnership) -> [CellOwnership.Action]) {
        guard !isAbandoned, var ownership else { return }
        let actions = change(&ownership)
        self.ownership = ownership
        perform(actions)
        scheduleTick()
    }

    private func drained(_ cell: Cell) {
        update { $0.drained(cell) }
    }

    private func renew() {
        let sentAt = Self.now()
        connection.execute(ClusterSchema.renewal(settings, followsEvents: followsEvents)) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure:
                update { ownership in
                    ownership.renewalFailed()
                    return []
                }
            case .success(let results):
                let answer = ClusterSchema.readRenewal(results, protocolVersion: settings.protocolVersion)
                addresses = answer.addresses
                owners = answer.owners
                clusterProtocol = answer.clusterProtocol
                onWebhooksVersion?(answer.webhooksVersion)
                eventsFollowed = answer.eventsFollowed || followsEvents
                update { $0.renewed(sentAt: sentAt, now: Self.now(), answer.answer) }
            }
        }
    }

    private func claim(_ cell: Cell, from epoch: UInt64) {
        connection.execute([ClusterSchema.claim(cell, from: epoch, settings)]) { [weak self] result in
            guard let self else { return }
            if case .success(let results) = result, results[0].rowCount == 1, let epoch = results[0].int(0, 0) {
                // The others learn the new owner now, not at their next renewal: requests they
                // hold for the moving cell go on at once.
                connection.execute([ClusterSchema.announceChange(settings)]) { _ in }
                update { $0.claimed(cell, epoch: UInt64(epoch), now: Self.now()) }
            } else {
                update { ownership in
                    ownership.claimFailed(cell)
                    return []
                }
            }
        }
    }

    private func release(_ cell: Cell, epoch: UInt64) {
        connection.execute([ClusterSchema.release(cell, epoch: epoch, settings), ClusterSchema.announceChange(settings)]) {
            [weak self] _ in
            self?.update { ownership in
                ownership.released(cell)
                return []
            }
        }
    }

    // MARK: failures

    /// The connection ended: whatever was under way on it failed (its callbacks said so); a
    /// new one is made a second later, and renewals go on through it. The cells stay open
    /// until the ownership rules close them.
    private func connectionLost() {
        guard !isAbandoned, stopping == nil || ownership?.isStopped == false else { return }
        reconnectTimer.start(after: 1_000) { [weak self] in
            guard let self, !isAbandoned else { return }
            connection = PGConnection(loop: loop)
            connect(takingTheNameOver: false) { [weak self] result in
                if case .failure = result { self?.connectionLost() }
            }
        }
    }

    // MARK: stopping

    /// Drains and releases every cell, removes this replica's row, closes the connection.
    public func stop(_ completion: @escaping () -> Void) {
        // Superseded, it has left already.
        guard !isAbandoned else { return completion() }
        stopping = completion
        update { $0.stop() }
    }

    private func finishStopping() {
        guard let completion = stopping else { return }
        stopping = nil
        connection.execute([ClusterSchema.deregister(settings), ClusterSchema.announceChange(settings)]) { [weak self] _ in
            guard let self else { return completion() }
            closeEverything()
            completion()
        }
    }

    /// Stops at once as a crash would: nothing released, the row left to expire.
    public func abandon() {
        closeEverything()
    }

    private func closeEverything() {
        guard !isClosed else { return }
        isClosed = true
        isAbandoned = true
        timer.close()
        reconnectTimer.close()
        connection.onClosed = nil
        connection.close()
    }
}
