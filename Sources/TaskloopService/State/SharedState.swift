import Logging
import TaskloopEngine
import TaskloopLoop
import TaskloopPostgres
import TaskloopStore

/// One replica's side of the shared database (docs/SCALING.md, "turns"): every change this
/// replica makes happens inside a turn, and every answer, event and webhook that shows a
/// change leaves after the turn that made it has committed.
///
/// - Changing requests, timers and executors' reports wait (`defer`, the engine's gate) for
///   the next turn. A turn: take the turn lock, absorb what other replicas committed since this
///   replica's last turn, take over what replicas found gone ran, run everything that waited,
///   write the turn's changes and events, commit. Work that arrives meanwhile waits for the
///   next turn; turns of one replica follow one another. Attempts the turn made start once it
///   has committed (the engine holds them, `startsAfterCommit`); a turn that fails drops them.
/// - Reads wait for a catch-up (`whenCaughtUp`): what was committed before the read arrived is
///   absorbed first, so a replica never answers from behind a change another has acknowledged.
///   A read that arrives while a turn is being opened rides with that turn instead.
/// - Each turn's `NOTIFY` wakes the other replicas, which catch up at once: their long polls,
///   event streams and lease calls see the change without polling.
/// - The replica renews its lease every quarter of its length; when the renewal says another
///   replica's lease ran out, a turn takes over what that replica ran. When it says this
///   replica was taken for gone, or the database cannot be reached or fails a turn, the
///   replica stops serving (503) and starts over from the database once it can.
/// - When a renewal or a turn finds that another process took this replica's name over, this
///   process stops for good: its work, and serving (503).
///
/// Threading: loop thread only.
final class SharedState: Journal, EngineGate {
    private(set) var journal: PostgresJournal
    private unowned let engine: Engine
    private let loop: EventLoop
    private let scheduler: EngineScheduler
    private let logger: Logger
    private var builder = StoreBatchBuilder()
    /// The last turn absorbed or made.
    private(set) var applied: UInt64 = 0

    // The gate.
    private(set) var isOpen = false
    /// Work for the next turn, and how to refuse it if the replica starts over first (a
    /// request's 503; nothing for the engine's own work, which the database's state replaces).
    private var deferred: [(run: () -> Void, refuse: (() -> Void)?)] = []
    private var readers: [(run: () -> Void, refuse: () -> Void)] = []
    /// After starting over: attempts still marked as this replica's are run by nothing here.
    private var reclaimsOwnAttempts = false

    private enum Phase {
        case idle
        /// Waiting for the turn lock and what others committed.
        case opening
        case committing
        case catchingUp
        /// The database is out of reach, or this replica must start over.
        case recovering
        /// Another process holds this replica's name: this one does nothing more.
        case displaced
    }
    private var phase = Phase.idle
    private var wantsTurn = false
    /// The newest turn another replica announced: caught up with once this replica is idle
    /// (a notice that comes while a turn or a catch-up is under way is not lost).
    private var announced: UInt64 = 0

    /// Turns committed by this replica, and waiters on them (as DurableState's batches).
    private var sent = 0
    private var answered = 0
    private var waiting: [(batch: Int, action: (Bool) -> Void)] = []
    var onCommitted: ((Int) -> Void)?
    var eventSequence: (() -> UInt64)?
    var currentKey: ((String) -> IdempotencyRecord?)?
    /// Distributes what other replicas committed (to idempotency keys, events, webhooks).
    var onAbsorbed: ((SharedDelta) -> Void)?
    /// The events numbered for a batch, rendered.
    var eventsOfBatch: ((Int) -> [SharedEvent])?
    /// Told each replica found gone, in the turn that takes over what it ran.
    var onReplicaGone: ((String) -> Void)?
    /// Told when this replica starts over from the database (`loaded`): it must drop what it
    /// had not committed.
    var onStartOver: ((PostgresJournal.Loaded) -> Void)?
    private var leaseRenewal: ScheduledAction?
    private var closing: (() -> Void)?

    /// What this replica did, for the metrics.
    struct Counts {
        var turns = 0, catchUps = 0, takeovers = 0
    }
    private(set) var counts = Counts()
    /// Told each committed turn's time, from asking for it to its commit, in seconds.
    var onTurnCommitted: ((Double) -> Void)?
    /// When the turn under way was asked for (monotonic ms).
    private var turnAskedAt: UInt64 = 0

    init(journal: PostgresJournal, engine: Engine, loop: EventLoop, scheduler: EngineScheduler, logger: Logger, turn: UInt64) {
        self.journal = journal
        self.engine = engine
        self.loop = loop
        self.scheduler = scheduler
        self.logger = logger
        applied = turn
        listen(to: journal)
    }

    private func listen(to journal: PostgresJournal) {
        journal.onTurnCommitted = { [unowned self] turn in
            announced = max(announced, turn)
            if turn > applied && phase == .idle { catchUp() }
        }
        journal.onLost = { [unowned self] error in lose(error) }
    }

    /// Starts renewing the lease, and takes a first turn: what the start found to do, and the
    /// attempts a previous process of this name ran, which nothing here runs now.
    func start() {
        reclaimsOwnAttempts = true
        renewLease()
        scheduleTurn()
    }

    // MARK: the gate

    func `defer`(_ work: @escaping () -> Void) {
        guard phase != .displaced else { return }
        deferred.append((work, nil))
        scheduleTurn()
    }

    /// Runs a changing request in the next turn; `refuse` answers it if that turn never comes.
    func inNextTurn(_ run: @escaping () -> Void, refuse: @escaping () -> Void) {
        guard phase != .displaced else { return refuse() }
        deferred.append((run, refuse))
        scheduleTurn()
    }

    /// Runs `read` once what was committed before now has been absorbed.
    func whenCaughtUp(_ read: @escaping () -> Void, refuse: @escaping () -> Void) {
        guard phase != .displaced else { return refuse() }
        readers.append((read, refuse))
        switch phase {
        case .idle: catchUp()
        case .opening, .committing, .catchingUp, .recovering, .displaced: break
        }
    }

    private func scheduleTurn() {
        guard phase == .idle, closing == nil || !deferred.isEmpty || !builder.isEmpty else {
            wantsTurn = true
            return
        }
        openTurn()
    }

    // MARK: turns

    private func openTurn() {
        phase = .opening
        turnAskedAt = scheduler.now
        wantsTurn = false
        let readersNow = readers
        readers = []
        journal.beginTurn(after: applied) { [unowned self] result in
            switch result {
            case .failure(let error):
                readers = readersNow + readers
                fail(error)
            case .success(nil):
                readers = readersNow + readers
                startOver(reason: "it fell behind the database's retained history")
            case .success(let delta?):
                absorb(delta)
                runTurn(gone: delta.goneReplicas, readers: readersNow)
            }
        }
    }

    private func runTurn(gone: [String], readers readersNow: [(run: () -> Void, refuse: () -> Void)]) {
        isOpen = true
        engine.dispatchWaiting()
        for name in gone {
            let count = engine.interruptAttempts(of: name)
            counts.takeovers += 1
            onReplicaGone?(name)
            logger.warning("replica \(name) is gone; its attempts were interrupted", metadata: ["attempts": "\(count)"])
        }
        if reclaimsOwnAttempts {
            reclaimsOwnAttempts = false
            engine.interruptAttempts(of: journal.settings.replica)
        }
        while !deferred.isEmpty {
            let work = deferred
            deferred = []
            for item in work { item.run() }
        }
        for read in readersNow { read.run() }
        isOpen = false
        commit(gone: gone)
    }

    private func commit(gone: [String]) {
        let number = sent + 1
        let batch = builder.take(from: engine)
        let started = engine.markHeldStarts()
        let events = eventsOfBatch?(number) ?? []
        guard !batch.isEmpty || !events.isEmpty || !gone.isEmpty else {
            phase = .committing
            journal.abandonTurn { [unowned self] in turnEnded() }
            return
        }
        sent = number
        phase = .committing
        journal.commitTurn(applied + 1, batch, events: events, eventSequence: eventSequence?() ?? 0, goneReplicas: gone) {
            [unowned self] result in
            switch result {
            case .success:
                applied += 1
                counts.turns += 1
                engine.releaseStarts(through: started)
                onTurnCommitted?(Double(scheduler.now &- turnAskedAt) / 1_000)
                answer(through: number, committed: true)
                onCommitted?(number)
                turnEnded()
            case .failure(let error):
                answer(through: number, committed: false)
                lose(error)
            }
        }
    }

    private func turnEnded() {
        phase = .idle
        if let closing, deferred.isEmpty, builder.isEmpty {
            self.closing = nil
            return finishClosing(closing)
        }
        if wantsTurn || !deferred.isEmpty || !builder.isEmpty {
            openTurn()
        } else if !readers.isEmpty || announced > applied {
            catchUp()
        }
    }

    // MARK: catching up

    private func catchUp() {
        guard phase == .idle else { return }
        phase = .catchingUp
        counts.catchUps += 1
        let readersNow = readers
        readers = []
        journal.catchUp(after: applied) { [unowned self] result in
            switch result {
            case .failure(let error):
                readers = readersNow + readers
                lose(error)
            case .success(let delta):
                if journal.needsReload {
                    readers = readersNow + readers
                    return startOver(reason: "it fell behind the database's retained history")
                }
                if let delta { absorb(delta) }
                for read in readersNow { read.run() }
                phase = .idle
                if !deferred.isEmpty || wantsTurn || !builder.isEmpty || closing != nil {
                    turnEnded()
                } else if !readers.isEmpty || announced > applied {
                    catchUp()
                }
            }
        }
    }

    private func absorb(_ delta: SharedDelta) {
        applied = delta.turn
        guard !delta.isEmpty else { return }
        engine.absorb(delta.changes)
        onAbsorbed?(delta)
        // Work absorbed records made startable (room in a queue, a lease call waiting) is
        // started in a turn.
        if engine.hasWorkToStart { wantsTurn = true }
    }

    // MARK: the lease

    private func renewLease() {
        leaseRenewal = scheduler.schedule(after: journal.settings.leaseMilliseconds / 4) { [weak self] in
            guard let self, phase != .recovering, phase != .displaced else { return }
            journal.renewLease { [weak self] result in
                guard let self else { return }
                switch result {
                case .failure(let error):
                    fail(error)
                case .success:
                    journal.anyReplicaGone { [weak self] result in
                        if case .success(true) = result { self?.scheduleTurnForTakeover() }
                    }
                    renewLease()
                }
            }
        }
    }

    private func scheduleTurnForTakeover() {
        wantsTurn = true
        if phase == .idle { openTurn() }
    }

    // MARK: failing and starting over

    var isFailing: Bool { phase == .recovering || phase == .displaced }

    /// A turn or a renewal failed: the database, or this replica's standing in it.
    private func fail(_ error: PGError) {
        switch error.sqlState {
        case PostgresJournal.replicaGone: startOver(reason: "other replicas took it for gone")
        case PostgresJournal.replicaReplaced: yieldTheName()
        default: lose(error)
        }
    }

    private func lose(_ error: PGError) {
        if let closing {
            // Stopping: what was not committed stays so; the process ends as after a crash.
            self.closing = nil
            logger.error("the shared database failed while stopping", metadata: ["error": "\(error)"])
            return finishClosing(closing)
        }
        // What was in flight when the name went is refused as it fails.
        guard phase != .displaced else { return refuseWaiting() }
        // The journal reports its lost connection itself once the turn being committed has its
        // outcome; until then nobody is answered (a lease renewal failing meanwhile included).
        guard phase != .recovering, !journal.isResolvingCommit else { return }
        logger.error("the shared database failed; serving 503 until it is back", metadata: ["error": "\(error)"])
        startOver(reason: "\(error)")
    }

    /// Drops what was not committed and loads everything again from a new connection, retrying
    /// every second until the database answers.
    private func startOver(reason: String) {
        phase = .recovering
        isOpen = false
        leaseRenewal?.cancel()
        leaseRenewal = nil
        // What waited on a turn that will not commit is refused; what waits for the next turn
        // is refused too: the replica does not know what the database holds until it reloads.
        refuseWaiting()
        logger.warning("starting over from the shared database", metadata: ["reason": "\(reason)"])
        reconnect()
    }

    private func refuseWaiting() {
        answer(through: sent, committed: false)
        builder = StoreBatchBuilder()
        // Attempts the failed turn made never start: the database's state replaces them.
        engine.dropHeldStarts()
        let refused = deferred.compactMap(\.refuse) + readers.map(\.refuse)
        deferred = []
        readers = []
        for refuse in refused { refuse() }
    }

    /// Another process took this replica's name over (started under it: a restart while this
    /// one was frozen or cut off, or a second process by mistake). It owns the name's records
    /// now, and its first turn interrupted this one's attempts: this process stops its work and
    /// serves 503 until it is stopped. It does not take the name back, which would make the
    /// other stop in turn.
    private func yieldTheName() {
        guard phase != .displaced else { return }
        phase = .displaced
        isOpen = false
        leaseRenewal?.cancel()
        leaseRenewal = nil
        let stopped = engine.suspendForShutdown()
        refuseWaiting()
        logger.error("""
            another process took over the replica name \(journal.settings.replica): this one stops serving (503) and should be \
            stopped; give each process its own --replica-name
            """, metadata: ["attempts stopped": "\(stopped)"])
        journal.onLost = nil
        journal.onTurnCommitted = nil
        journal.discard()
    }

    private func reconnect() {
        let fresh = PostgresJournal(loop: loop, settings: journal.settings)
        let previous = journal
        previous.onLost = nil
        previous.onTurnCommitted = nil
        previous.discard()
        // This may run inside the previous journal's failing batch, whose connection fails the
        // batches after it once this returns (their completions hold the journal unowned): it
        // goes once the loop is back.
        _ = scheduler.schedule(after: 0) { withExtendedLifetime(previous) {} }
        journal = fresh
        listen(to: fresh)
        fresh.open(replacing: false) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error) where error.sqlState == PostgresJournal.replicaReplaced:
                yieldTheName()
            case .failure(let error):
                logger.debug("the shared database is still out of reach", metadata: ["error": "\(error)"])
                _ = scheduler.schedule(after: 1_000) { [weak self] in self?.reconnect() }
            case .success(let loaded):
                onStartOver?(loaded)
                applied = loaded.turn
                reclaimsOwnAttempts = true
                phase = .idle
                logger.info("serving again from the shared database", metadata: ["turn": "\(applied)"])
                renewLease()
                scheduleTurn()
            }
        }
    }

    // MARK: Journal

    func record(_ events: [EngineEvent]) {
        guard !engine.isAbsorbing else { return }
        builder.add(events)
    }

    func record(_ key: IdempotencyRecord) { builder.add(key) }

    func expire(_ keys: [String]) {
        builder.expire(keys)
        scheduleTurn()
    }

    func record(_ webhook: WebhookRecord) { builder.write(webhook) }

    func delete(webhook id: String) { builder.delete(webhook: id) }

    /// A delivery's outcome may come between turns (its transfer ended): it goes with the next.
    func record(_ delivery: DeliveryRecord) {
        builder.write(delivery)
        if !isOpen { scheduleTurn() }
    }

    func delete(deliveries ids: [String]) {
        builder.delete(deliveries: ids)
        if !isOpen { scheduleTurn() }
    }

    var pendingBatch: Int? {
        let target = builder.isEmpty && !isOpen ? sent : sent + 1
        return answered < target ? target : nil
    }

    /// Displaced, nothing commits any more: answers leave at once.
    var isCaughtUp: Bool { phase == .displaced || builder.isEmpty && answered == sent }

    func whenDurable(_ action: @escaping (Bool) -> Void) {
        guard phase != .displaced else { return action(false) }
        let target = builder.isEmpty ? sent : sent + 1
        guard answered < target else { return action(true) }
        waiting.append((target, action))
    }

    private func answer(through number: Int, committed: Bool) {
        answered = max(answered, number)
        let due = waiting.filter { $0.batch <= number }
        waiting.removeAll { $0.batch <= number }
        for entry in due { entry.action(committed) }
    }

    /// Commits what is left, gives this replica's row up, and closes the connections.
    func close(_ completion: @escaping () -> Void) {
        leaseRenewal?.cancel()
        leaseRenewal = nil
        closing = completion
        switch phase {
        case .idle:
            if deferred.isEmpty && builder.isEmpty {
                closing = nil
                finishClosing(completion)
            } else {
                openTurn()
            }
        case .recovering, .displaced:
            closing = nil
            finishClosing(completion)
        case .opening, .committing, .catchingUp:
            break
        }
    }

    private func finishClosing(_ completion: @escaping () -> Void) {
        phase = .recovering
        journal.onLost = nil
        journal.close(completion)
    }
}
