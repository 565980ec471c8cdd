import Dispatch
import Glibc
import TaskloopEngine
import TaskloopLoop
import TaskloopPostgres
import TaskloopStore
import TaskloopTime

/// The cells this replica owns, each a single-server engine of its own (docs/SCALING.md,
/// "Under way: cells"): the keeper says which cells to open, drain and close; the host loads a
/// cell's records into a new engine, commits each loop turn's settled batches of every cell
/// (fenced by the cell's epoch, with the events and the messages to other cells the change
/// made, and the deletion of the messages it applied), and applies the messages other cells
/// send it, in the order they were sent.
///
/// A cell's story: `opening` (claimed; its records load) -> `open` (serving) -> `draining`
/// (graceful: nothing new starts, what runs here is stopped and queued again, that is
/// committed) -> gone. A commit that fails takes the cell back to `opening` from the database
/// (the truth): the engine that made the failed change is dropped with its held starts, so no
/// work starts for a change that was not committed. A cell closed at once (fenced, deposed)
/// stops its attempts and is gone; nothing more is committed for it.
///
/// Answers wait for commits (`whenDurable`), as with a single server's store; commits of all
/// cells share one connection and complete in order.
///
/// Threading: the loop's thread only, callbacks included.
public final class CellHost {
    public enum Placement {
        /// Served here, by this engine.
        case here(Engine)
        /// Owned by the replica at this address.
        case elsewhere(String)
        /// Owned by nobody reachable just now, or moving: ask again shortly.
        case moving

        /// The engine serving it here, if it is served here.
        public var engine: Engine? {
            if case .here(let engine) = self { engine } else { nil }
        }
    }

    private enum Phase {
        case opening
        case open
        case draining
    }

    private final class HostedCell {
        let cell: Cell
        var epoch: UInt64
        var phase = Phase.opening
        var engine: Engine?
        var builder = StoreBatchBuilder()
        var events: [ClusterEvents.Written] = []
        /// The service's own rows for the next commit (`write(_:in:)`).
        var writes: [PGQuery] = []
        var dirty = false
        /// Messages applied and not yet deleted by a commit, and the last one read.
        var applied: [Int64] = []
        var lastMessage: Int64 = 0
        var readingInbox = false
        var inboxAgain = false
        /// Commits sent and not answered.
        var commitsInFlight = 0
        /// Opened again after a failed commit; each load knows which generation it is for.
        var generation = 0
        var drained: (() -> Void)?

        init(cell: Cell, epoch: UInt64) {
            self.cell = cell
            self.epoch = epoch
        }
    }

    public let loop: EventLoop
    public let keeper: CellKeeper
    private let committer: CellCommitter
    private var reader: PGConnection
    private let url: String
    private var cells: [Cell: HostedCell] = [:]
    private let makeEngine: (Cell) -> Engine
    /// The zones the engines' schedules use, loaded off the loop as a cell opens.
    private let zones: TimeZoneCatalog
    private let eventsOf: (Engine, [EngineEvent]) -> [ClusterEvents.Written]
    private var endOfTurn: LoopCheck?
    private var isClosed = false
    public private(set) var layout = CellLayout(count: CellLayout.defaultCount)

    /// Told when a cell's engine serves (add observers; the cell's idempotency keys), and when
    /// it goes.
    public var onOpened: ((Engine, [IdempotencyRecord]) -> Void)?
    public var onClosed: ((Engine) -> Void)?
    /// The cluster moved to a newer protocol (given): every cell was handed over, and this
    /// replica left the cluster for good.
    public var onSuperseded: ((Int) -> Void)?
    /// Another process took this replica's name over (`CellKeeper.onReplaced`).
    public var onReplaced: (() -> Void)?

    /// Commits answered, and those among them that did not commit.
    public private(set) var commitCount = 0
    public private(set) var failedCommitCount = 0

    // Commits are numbered in the order sent; they complete in order on the one connection.
    private var sent = 0
    private var answeredThrough = 0
    private var completed: Set<Int> = []
    /// Commits that did not commit, with the cells whose changes they lost.
    private var failedCommits: [(number: Int, cells: Set<Cell>)] = []
    private var waiting: [(from: Int, target: Int, cell: Cell?, action: (Bool) -> Void)] = []
    /// What the next announcement wakes (`announce`), and whether one is under way.
    private var announcedCells: Set<Cell> = []
    private var announcesEvents = false
    private var announcing = false
    /// A commit is in flight (`commitDirtyCells`).
    private var isCommitting = false
    /// Group commit under a closed loop of clients (`commitDirtyCells`): when the commit in
    /// flight was sent, the times of the last few commits (their shortest is the usual one: a
    /// commit held up by a takeover or a load must not stretch the waits after it), how many
    /// answers the last one let go, and until when the next one may wait for as many, in
    /// microseconds of the monotonic clock.
    private var commitSentAt: UInt64 = 0
    private var commitTimes: [UInt64] = []
    private var answeredByLastCommit = 0
    private var gatherUntil: UInt64 = 0
    private var gatherTimer: LoopTimer?

    public init(loop: EventLoop, keeper settings: CellKeeper.Settings, zones: TimeZoneCatalog = .system,
                makeEngine: @escaping (Cell) -> Engine,
                eventsOf: @escaping (Engine, [EngineEvent]) -> [ClusterEvents.Written]) throws(UVError) {
        self.loop = loop
        url = settings.url
        keeper = try CellKeeper(loop: loop, settings: settings)
        committer = CellCommitter(loop: loop, url: settings.url, identity: settings.identity)
        reader = PGConnection(loop: loop)
        self.makeEngine = makeEngine
        self.zones = zones
        self.eventsOf = eventsOf
        // Weak: engines, keeper and committer may call back after the host has gone (an engine
        // a pending answer still holds, a timer), and then there is nothing to do.
        endOfTurn = try LoopCheck(loop: loop) { [weak self] in self?.commitDirtyCells() }
        gatherTimer = try LoopTimer(loop: loop)
        committer.onEpochAdvanced = { [weak self] cell, epoch in
            guard let self else { return }
            cells[cell]?.epoch = epoch
            keeper.epochAdvanced(cell, to: epoch)
        }
        keeper.onOpen = { [weak self] cell, epoch in self?.open(cell, epoch: epoch) }
        keeper.onDrain = { [weak self] cell, done in
            guard let self else { return done() }
            drain(cell, done)
        }
        keeper.onClose = { [weak self] cell, _ in self?.close(cell) }
        keeper.onSuperseded = { [weak self] version in self?.onSuperseded?(version) }
        keeper.onReplaced = { [weak self] in self?.onReplaced?() }
    }

    /// Connects the reader, then joins the cluster; `completion` runs once the keeper has the
    /// cluster's layout (cells open as their claims succeed, after that).
    public func start(_ completion: @escaping (Result<CellLayout, PGError>) -> Void) {
        connectReader { [weak self] result in
            guard let self else { return }
            if case .failure(let error) = result { return completion(.failure(error)) }
            keeper.start { [weak self] result in
                if case .success(let layout) = result { self?.layout = layout }
                completion(result)
            }
        }
    }

    // MARK: routing

    /// Where the requests of `cell` go now.
    public func placement(of cell: Cell) -> Placement {
        if let hosted = cells[cell] {
            if hosted.phase == .open, let engine = hosted.engine { return .here(engine) }
            return .moving
        }
        guard let owner = keeper.owners[cell], owner.name != keeper.settings.identity.name,
              let address = keeper.addresses[owner.name] else { return .moving }
        return .elsewhere(address)
    }

    public func cell(ofQueue name: String) -> Cell { layout.cell(ofQueue: name) }

    /// The engines serving here.
    public var openEngines: [Engine] {
        cells.keys.sorted().compactMap { cell in cells[cell].flatMap { $0.phase == .open ? $0.engine : nil } }
    }

    /// The cells that are opening, open or draining here.
    public var hostedCells: [Cell] { cells.keys.sorted() }

    // MARK: durability

    /// True when nothing changed is uncommitted: an answer may leave at once.
    public var isCaughtUp: Bool { answeredThrough == sent && !cells.values.contains { $0.dirty } }

    /// Runs `action(true)` once every change made so far is committed; `action(false)` when a
    /// commit among them lost a change of `cell` (of any cell, without one).
    public func whenDurable(of cell: Cell?, _ action: @escaping (Bool) -> Void) {
        let target = sent + (cells.values.contains { $0.dirty } ? 1 : 0)
        guard target > answeredThrough else { return action(true) }
        waiting.append((answeredThrough + 1, target, cell, action))
    }

    /// Statements of the service's own (webhook deliveries) that go in `cell`'s next commit,
    /// under its epoch; false when no engine of the cell is here to commit them.
    @discardableResult
    public func write(_ queries: [PGQuery], in cell: Cell) -> Bool {
        guard let hosted = cells[cell], hosted.engine != nil else { return false }
        hosted.writes += queries
        hosted.dirty = true
        return true
    }

    /// Records what one settled call of `cell`'s engine changed.
    private func record(_ events: [EngineEvent], of hosted: HostedCell, by engine: Engine) {
        hosted.builder.add(events)
        hosted.events += eventsOf(engine, events)
        hosted.dirty = true
    }

    /// Events of `engine`'s cell made outside its settled calls (a progress event held back to
    /// coalesce it), committed with the cell's next batch; false when `engine` no longer serves
    /// the cell here.
    @discardableResult
    public func record(_ events: [ClusterEvents.Written], by engine: Engine) -> Bool {
        guard let cell = engine.cell, let hosted = cells[Cell(cell)], hosted.engine === engine else { return false }
        hosted.events += events
        hosted.dirty = true
        return true
    }

    /// An idempotency key a request to `cell` made, committed with the cell's next batch.
    public func record(_ key: IdempotencyRecord, in cell: Cell) {
        guard let hosted = cells[cell] else { return }
        hosted.builder.add(key)
        hosted.dirty = true
    }

    /// One cell's share of a commit, and what to do once it is known.
    private struct PendingPart {
        let hosted: HostedCell
        let generation: Int
        let held: HeldStartsMark
        let epoch: UInt64
        let batch: StoreBatch
        let events: [ClusterEvents.Written]
        /// The messages this commit deletes, applied by the cell's engine.
        let applied: [Int64]
        /// Statements the service wrote for the cell (`write(_:in:)`), in this commit with it.
        let extra: [PGQuery]

        var cell: Cell { hosted.cell }
        var messagedCells: [Cell] { Set(batch.messages.map(\.to)).sorted().map(Cell.init) }
    }

    /// Every cell changed since the last commit commits in one transaction: one flush for all.
    /// One commit is in flight at a time; what changes meanwhile goes in the next, so commits
    /// grow with the load instead of queueing behind each other's flushes (group commit).
    ///
    /// The clients a commit answered mostly ask again at once. Sent at once, the next commit
    /// would hold only what came while the last one was in flight, and the others would wait a
    /// whole commit more: a closed loop of clients splits in two halves that take turns. So a
    /// commit right after one that answered waits until as many answers wait as that one let
    /// go, but at most half a usual commit's time (what a wait in vain costs). The changes
    /// their answers made (the starts it released, what those did) go in it too.
    private func commitDirtyCells() {
        guard !isCommitting else { return }
        if waiting.count < answeredByLastCommit {
            let now = Self.microseconds()
            if now < gatherUntil {
                // Millisecond timers: a wait shorter than one ends at the first turn after it.
                gatherTimer?.start(after: max(1, (gatherUntil - now) / 1_000)) { [weak self] in self?.commitDirtyCells() }
                return
            }
        }
        gatherUntil = 0
        var parts: [PendingPart] = []
        for cell in cells.keys.sorted() {
            guard let hosted = cells[cell], hosted.dirty, let engine = hosted.engine else { continue }
            hosted.dirty = false
            hosted.commitsInFlight += 1
            parts.append(PendingPart(hosted: hosted, generation: hosted.generation, held: engine.markHeldStarts(), epoch: hosted.epoch,
                                     batch: hosted.builder.take(from: engine), events: hosted.events, applied: hosted.applied,
                                     extra: hosted.writes))
            hosted.events = []
            hosted.applied = []
            hosted.writes = []
        }
        guard !parts.isEmpty else {
            // The changes answers waited for went with a stopped engine (`stopEngine`), and no
            // other is left to commit: they are answered now, not at some later change's commit.
            if waiting.contains(where: { $0.target > sent }) {
                sent += 1
                completed.insert(sent)
                releaseWaiters()
            }
            return
        }
        sent += 1
        isCommitting = true
        commitSentAt = Self.microseconds()
        send(parts, number: sent)
    }

    private static func microseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
    }

    /// What a commit of these parts writes: the cells' records, their events (numbered across
    /// the transaction), the messages each sends and the deletion of those it applied. Rows of
    /// every cell share statements: a statement costs the database more than a row does.
    private static func writes(of parts: [PendingPart]) -> [PGQuery] {
        var writes = CellSchema.writes(of: parts.map { ($0.batch, $0.cell.index) })
        writes += ClusterEvents.insert(parts.flatMap { part in part.events.map { (part.cell, $0) } })
        for part in parts {
            var byCell: [UInt16: [[UInt8]]] = [:]
            for message in part.batch.messages { byCell[message.to, default: []].append(message.encoded) }
            for (to, bodies) in byCell.sorted(by: { $0.key < $1.key }) {
                writes += ClusterMessages.send(bodies, to: Cell(to), from: part.cell)
            }
            if !part.applied.isEmpty { writes.append(ClusterMessages.acknowledge(part.applied, of: part.cell)) }
            writes += part.extra
        }
        return writes
    }

    /// A commit's outcome is known (and its part resent if that was needed): the next may go.
    private func commitEnded() {
        isCommitting = false
        let now = Self.microseconds()
        commitTimes.append(now - commitSentAt)
        if commitTimes.count > 8 { commitTimes.removeFirst() }
        gatherUntil = now + (commitTimes.min() ?? 0) / 2
        if !isClosed { commitDirtyCells() }
    }

    private func send(_ parts: [PendingPart], number: Int) {
        committer.commit(parts.map { ($0.cell, $0.epoch) }, writes: Self.writes(of: parts)) { [weak self] outcome in
            guard let self else { return }
            switch outcome {
            case .committed:
                for part in parts { settle(part, outcome) }
                announce(parts)
                answered(number, failed: [])
                commitEnded()
            case .deposed(let lost):
                // Those cells are another replica's now; the others' writes stand on their own.
                let lost = Set(lost.isEmpty ? parts.map(\.cell) : lost)
                let gone = parts.filter { lost.contains($0.cell) }, kept = parts.filter { !lost.contains($0.cell) }
                for part in gone { settle(part, outcome) }
                let current = kept.filter { isCurrent($0) }
                for part in kept where !isCurrent(part) { settle(part, .failed("closed meanwhile")) }
                if current.isEmpty {
                    answered(number, failed: Set(parts.map(\.cell)))
                    commitEnded()
                } else {
                    failedCommits.append((number, Set(gone.map(\.cell))))
                    send(current, number: number)
                }
            case .failed, .unknown:
                for part in parts { settle(part, outcome) }
                answered(number, failed: Set(parts.map(\.cell)))
                commitEnded()
            }
        }
    }

    private func isCurrent(_ part: PendingPart) -> Bool {
        part.hosted.generation == part.generation && cells[part.hosted.cell] === part.hosted
    }

    /// What a commit's outcome means for one cell: its held starts go, or it starts over.
    private func settle(_ part: PendingPart, _ outcome: CellCommitter.Outcome) {
        let hosted = part.hosted
        hosted.commitsInFlight -= 1
        if outcome == .committed {
            if isCurrent(part), let engine = hosted.engine { engine.releaseStarts(through: part.held) }
        } else if isCurrent(part) {
            return commitFailed(hosted, outcome)
        }
        if hosted.commitsInFlight == 0, let drained = hosted.drained, !hosted.dirty {
            hosted.drained = nil
            drained()
        }
    }

    /// Wakes the readers of what the commit wrote: the owners of the cells it sent messages to,
    /// and the event feeds. In a batch of its own after the commit (see `ClusterMessages.notify`),
    /// one at a time; what comes meanwhile goes in the next.
    private func announce(_ parts: [PendingPart]) {
        for part in parts {
            announcedCells.formUnion(part.messagedCells)
            if !part.events.isEmpty && keeper.eventsFollowed { announcesEvents = true }
        }
        guard !announcing, !announcedCells.isEmpty || announcesEvents, !isClosed else { return }
        var queries = ClusterMessages.notify(announcedCells.sorted())
        if announcesEvents { queries.append(ClusterEvents.notify(cell: parts.first?.cell ?? Cell(0))) }
        announcedCells = []
        announcesEvents = false
        announcing = true
        reader.execute(queries) { [weak self] _ in
            guard let self else { return }
            announcing = false
            announce([])
        }
    }

    private func answered(_ number: Int, failed: Set<Cell>) {
        commitCount += 1
        if !failed.isEmpty {
            failedCommitCount += 1
            failedCommits.append((number, failed))
        }
        completed.insert(number)
        answeredByLastCommit = releaseWaiters()
    }

    /// Answers those whose changes are all committed (or lost) by now; how many.
    @discardableResult
    private func releaseWaiters() -> Int {
        while completed.remove(answeredThrough + 1) != nil { answeredThrough += 1 }
        var index = 0, released = 0
        while index < waiting.count {
            let entry = waiting[index]
            if entry.target <= answeredThrough {
                waiting.remove(at: index)
                released += 1
                entry.action(!failedCommits.contains { failure in
                    (entry.from...entry.target).contains(failure.number) && entry.cell.map { failure.cells.contains($0) } != false
                })
            } else {
                index += 1
            }
        }
        let oldest = waiting.map(\.from).min() ?? answeredThrough + 1
        failedCommits.removeAll { $0.number < oldest }
        return released
    }

    /// The engine's state went beyond what the database holds: drop it, and load the cell
    /// again if it is still this replica's.
    private func commitFailed(_ hosted: HostedCell, _ outcome: CellCommitter.Outcome) {
        switch outcome {
        case .committed:
            return
        case .failed:
            stopEngine(of: hosted)
            hosted.generation += 1
            hosted.phase = .opening
            load(hosted)
        case .deposed, .unknown:
            // Another replica holds it; the keeper's next renewal sees so.
            stopEngine(of: hosted)
            cells[hosted.cell] = nil
            hosted.drained?()
            hosted.drained = nil
        }
    }

    // MARK: opening

    private func open(_ cell: Cell, epoch: UInt64) {
        let hosted = HostedCell(cell: cell, epoch: epoch)
        cells[cell] = hosted
        load(hosted)
    }

    private func load(_ hosted: HostedCell) {
        let generation = hosted.generation
        reader.execute(CellSchema.load(cell: hosted.cell.index)) { [weak self, weak hosted] result in
            guard let self, let hosted, cells[hosted.cell] === hosted, hosted.generation == generation else { return }
            switch result {
            case .failure:
                // The reader reconnects; the load is tried again then.
                retryLoad(hosted)
            case .success(let results):
                do {
                    let state = try CellSchema.loaded(results)
                    if zones.hasLoaded(zonesOf: state.schedules) {
                        try serve(hosted, state)
                    } else {
                        serveLoadingZones(hosted, state, generation: generation)
                    }
                } catch {
                    retryLoad(hosted)
                }
            }
        }
    }

    /// Reads the tzdata files of zones the cell's schedules name and no engine here has used
    /// yet off the loop, then serves the cell; a zone that cannot be read fails the load, as a
    /// record that cannot be read does.
    private func serveLoadingZones(_ hosted: HostedCell, _ state: StoredState, generation: Int) {
        let zones = zones, schedules = state.schedules
        let bound = LoopBound((host: self, hosted: hosted, state: state), loop: loop)
        DispatchQueue.global().async {
            let loaded = Result { () throws(EngineError) in try zones.load(zonesOf: schedules) }
            _ = bound.loop.execute {
                let (host, hosted, state) = bound.value
                guard host.cells[hosted.cell] === hosted, hosted.generation == generation, !host.isClosed else { return }
                do {
                    try loaded.get()
                    try host.serve(hosted, state)
                } catch {
                    host.retryLoad(hosted)
                }
            }
        }
    }

    private func retryLoad(_ hosted: HostedCell) {
        let generation = hosted.generation
        guard let timer = try? LoopTimer(loop: loop) else { return }
        timer.start(after: 500) { [weak self, weak hosted] in
            timer.close()
            guard let self, let hosted, cells[hosted.cell] === hosted, hosted.generation == generation, !isClosed else { return }
            load(hosted)
        }
    }

    private func serve(_ hosted: HostedCell, _ state: StoredState) throws {
        let engine = makeEngine(hosted.cell)
        engine.addObserver { [weak self, weak hosted, unowned engine] events in
            guard let self, let hosted else { return }
            record(events, of: hosted, by: engine)
        }
        try engine.restore(queues: state.queues, workflows: state.workflows, tasks: state.tasks, uniqueKeys: state.uniqueKeys,
                           schedules: state.schedules)
        hosted.engine = engine
        hosted.lastMessage = 0
        hosted.applied = []
        hosted.phase = .open
        onOpened?(engine, state.idempotencyKeys)
        readInbox(of: hosted)
    }

    /// Reads on the host's reading connection (lists from every cell's records).
    public func read(_ queries: [PGQuery], _ completion: @escaping (Result<[PGResult], PGError>) -> Void) {
        guard !isClosed else { return completion(.failure(PGError(message: "the replica is stopping"))) }
        reader.execute(queries, completion)
    }

    // MARK: messages from other cells

    private func readInbox(of hosted: HostedCell) {
        guard hosted.phase == .open else { return }
        guard !hosted.readingInbox else {
            hosted.inboxAgain = true
            return
        }
        hosted.readingInbox = true
        let generation = hosted.generation
        reader.execute([ClusterMessages.read(for: hosted.cell, after: hosted.lastMessage, limit: 1_000)]) {
            [weak self, weak hosted] result in
            guard let self, let hosted else { return }
            hosted.readingInbox = false
            guard cells[hosted.cell] === hosted, hosted.phase == .open, let engine = hosted.engine else { return }
            // A read for an engine since dropped (a failed commit loaded the cell again) applies
            // nothing; the new engine's own read may have waited for it.
            guard hosted.generation == generation else {
                if hosted.inboxAgain {
                    hosted.inboxAgain = false
                    readInbox(of: hosted)
                }
                return
            }
            guard case .success(let results) = result else { return }
            let messages = ClusterMessages.messages(of: results[0])
            for message in messages {
                hosted.lastMessage = message.id
                hosted.applied.append(message.id)
                if let decoded = CellMessage(encoded: message.body), decoded.to == hosted.cell.index {
                    engine.apply(decoded)
                }
                hosted.dirty = true
            }
            if messages.count == 1_000 || hosted.inboxAgain {
                hosted.inboxAgain = false
                readInbox(of: hosted)
            }
        }
    }

    private func connectReader(_ completion: @escaping (Result<Void, PGError>) -> Void) {
        reader.onNotification = { [weak self] channel, payload in
            guard let self, channel == ClusterMessages.channel, let index = UInt16(payload),
                  let hosted = cells[Cell(index)] else { return }
            readInbox(of: hosted)
        }
        reader.onClosed = { [weak self] _ in self?.readerLost() }
        reader.connect(url) { [weak self] result in
            guard let self else { return }
            if case .failure(let error) = result { return completion(.failure(error)) }
            reader.execute([PGQuery("LISTEN \(ClusterMessages.channel)")]) { result in
                completion(result.map { _ in })
            }
        }
    }

    /// A new reader listens again and reads every open cell's messages it may have missed.
    private func readerLost() {
        guard !isClosed else { return }
        reader = PGConnection(loop: loop)
        guard let timer = try? LoopTimer(loop: loop) else { return }
        timer.start(after: 500) { [weak self] in
            timer.close()
            guard let self, !isClosed else { return }
            connectReader { [weak self] result in
                guard let self else { return }
                if case .failure = result { return readerLost() }
                for hosted in cells.values {
                    hosted.readingInbox = false
                    readInbox(of: hosted)
                }
            }
        }
    }

    // MARK: draining and closing

    /// Graceful: nothing new starts; what runs here is stopped and queued again (its attempt not
    /// spent); once that and everything before it is committed, the cell goes.
    private func drain(_ cell: Cell, _ done: @escaping () -> Void) {
        guard let hosted = cells[cell] else { return done() }
        let finish = { [weak self, weak hosted] in
            guard let self, let hosted else { return done() }
            stopEngine(of: hosted)
            if cells[cell] === hosted { cells[cell] = nil }
            done()
        }
        guard hosted.phase == .open, let engine = hosted.engine else {
            hosted.phase = .draining
            return finish()
        }
        hosted.phase = .draining
        engine.suspendForShutdown()
        if hosted.commitsInFlight == 0 && !hosted.dirty {
            finish()
        } else {
            hosted.drained = finish
        }
    }

    /// At once: the cell's attempts stop, and nothing more is committed for it.
    private func close(_ cell: Cell) {
        guard let hosted = cells.removeValue(forKey: cell) else { return }
        stopEngine(of: hosted)
        hosted.drained?()
        hosted.drained = nil
    }

    private func stopEngine(of hosted: HostedCell) {
        guard let engine = hosted.engine else { return }
        hosted.engine = nil
        if hosted.dirty {
            // Changes not sent yet go with the engine: those who wait for them (for this cell's,
            // or for every cell's) hear so now, not "committed" from the commit they waited for.
            let lost = waiting.filter { $0.target > sent && ($0.cell == nil || $0.cell == hosted.cell) }
            waiting.removeAll { $0.target > sent && ($0.cell == nil || $0.cell == hosted.cell) }
            for entry in lost { entry.action(false) }
        }
        engine.dropHeldStarts()
        hosted.dirty = false
        hosted.events = []
        hosted.writes = []
        hosted.applied = []
        hosted.builder = StoreBatchBuilder()
        // Stops the attempts running here (their runs are told to stop); the state change it
        // makes is not committed: the cell's records stay as last committed.
        engine.suspendForShutdown()
        hosted.builder = StoreBatchBuilder()
        hosted.events = []
        hosted.writes = []
        hosted.dirty = false
        onClosed?(engine)
    }

    /// Graceful stop: every cell drained and released, the member row removed.
    public func stop(_ completion: @escaping () -> Void) {
        keeper.stop { [weak self] in
            self?.closeConnections()
            completion()
        }
    }

    /// As a crash: nothing released.
    public func abandon() {
        keeper.abandon()
        for cell in cells.keys.sorted() { close(cell) }
        closeConnections()
    }

    private func closeConnections() {
        isClosed = true
        endOfTurn?.close()
        endOfTurn = nil
        gatherTimer?.close()
        gatherTimer = nil
        committer.close()
        reader.onClosed = nil
        reader.close()
        let pending = waiting
        waiting = []
        for entry in pending { entry.action(false) }
    }
}
