import Dispatch
import Glibc
import Logging
import TaskloopCluster
import TaskloopEngine
import TaskloopExecutors
import TaskloopHTTP
import TaskloopLoop
import TaskloopHTTPClient
import TaskloopJSON
import TaskloopPostgres
import TaskloopStore

/// The service on one event loop: the HTTP server, the engine on the loop's clock, the routes
/// between them.
///
/// Start and stop are one ordered story. `start()`: loop clock, HTTP client, executors, engine,
/// routes, then bind. `stop(completion:)`, within the shutdown grace G:
/// 1. stop accepting; requests in flight are answered with `Connection: close`, idle
///    connections close; new submissions get 503;
/// 2. in memory, every unfinished task is cancelled: running work is told to stop (SIGTERM to
///    `exec` trees, whose SIGKILL comes after min(`grace_ms`, what is left of G); transfers
///    aborted). With a store, nothing new starts and running work may finish within G; what
///    still runs at G is stopped and queued again for after the restart;
/// 3. long polls are answered with their task as it is now;
/// 4. at G: connections still open are closed, `exec` trees still alive are SIGKILLed, and
///    half a second later output they still hold open is given up;
/// 5. once the server is closed and every child reaped: the HTTP client, the orphan reaper and
///    the clock close, and the completion runs; then the loop can finish, clean.
///
/// Threading: loop thread only, like everything it owns. The engine lives on the loop thread;
/// executors that block run their work elsewhere and hop back with `EventLoop.execute`.
public final class TaskloopApplication {
    public let loop: EventLoop
    public let configuration: ServiceConfiguration
    let logger: Logger
    /// The engine of a single server; nil on a cluster, where each cell this replica owns has
    /// its own (`cellHost`), and a request gets its cell's engine in `Reply.engine`.
    private(set) var engine: Engine!
    /// With `--database-url`: the cells this replica owns, their engines and commits.
    var cellHost: CellHost?
    /// With cells: sends requests for other replicas' cells to their owners.
    var forwarder: ClusterForwarder?
    /// With cells: the routes answered from the cells' records instead of an engine, by index.
    var cellReads: [Int: ServiceHandler] = [:]
    /// Set once this replica is out of the cluster for good (the cluster moved to a newer
    /// protocol, or another process took its name over): what it answers for every cell and
    /// for its health from then on.
    var retiredProblem: APIProblem?
    /// With cells: the cluster's webhooks table, and where deliveries are written.
    var cellWebhooks: CellWebhookJournal?
    /// With cells: the event streams, which follow every cell's events.
    var clusterStreams: ClusterEventStreams?
    private(set) var scheduler: LoopScheduler?
    private(set) var httpClient: HTTPClient?
    var server: HTTPServer?
    private var execExecutor: ExecExecutor?
    /// What holds `exec` programs together (`GET /healthz`): `cgroup`, `cookie`, or `none` when
    /// this server runs no programs.
    var processIsolation: String { execExecutor?.isolation.name ?? "none" }
    private(set) var orphanReaper: OrphanReaper?
    var waiters: TaskWaiters!
    var leaseCalls: LeaseCalls!
    var eventLog: EventLog!
    var webhooks: Webhooks!
    /// Writes what each loop turn published to the event streams.
    var eventWrites: LoopCheck?
    private var router = Router<Route>()
    /// Set once stopping: submissions are refused with 503.
    private(set) var isDraining = false
    private var serverClosed = false
    private var stopCompletion: (() -> Void)?
    /// Tokens, hosts and origins; decided on each request's head (`admit`).
    private(set) var access: AccessPolicy
    /// The routes by their index, for requests the admission check already routed.
    private(set) var routeTable: [Route] = []
    /// Each request is logged at debug; known once, at start.
    private let logsRequests: Bool
    var metrics: ServiceMetrics!
    /// Where a single server's changes become durable, unless `durability` is `memory`: the
    /// embedded store (on a cluster, `cellHost` commits each cell's changes).
    private(set) var durable: Journal?
    private(set) var sqlite: DurableState?
    var idempotency: IdempotencyKeys!

    public init(loop: EventLoop, configuration: ServiceConfiguration, logger: Logger = Logger(label: "taskloop")) {
        self.loop = loop
        self.configuration = configuration
        self.logger = logger
        access = AccessPolicy(tokens: [], allowedHosts: configuration.allowedHosts.map { $0.lowercased() },
                              allowedOrigins: configuration.allowedOrigins.map { $0.lowercased() })
        logsRequests = logger.logLevel <= .debug
    }

    /// The tokens of `--auth-token` and `--auth-token-file`; throws naming what is wrong.
    static func tokens(flag: String?, file: String?) throws(AccessError) -> [AccessToken] {
        var tokens: [AccessToken] = []
        if let flag {
            do { tokens.append(try AccessToken(flag)) } catch { throw AccessError("--auth-token: \(error.reason)") }
        }
        if let file { tokens += try AccessToken.readFile(file) }
        return tokens
    }

    /// Reads the token file again (SIGHUP), off the loop, and uses its tokens from the next
    /// request on; a file that cannot be read or parsed leaves the tokens as they were.
    /// `completion` runs on the loop with nil, or why nothing changed.
    public func reloadTokens(completion: @escaping (String?) -> Void = { _ in }) {
        guard let file = configuration.authTokenFile else { return completion("no --auth-token-file to re-read") }
        let flag = configuration.authToken
        let bound = LoopBound((application: self, completion: completion), loop: loop)
        DispatchQueue.global().async {
            let result = Result { () throws(AccessError) in try TaskloopApplication.tokens(flag: flag, file: file) }
            _ = bound.loop.execute {
                let (application, completion) = bound.value
                switch result {
                case .success(let tokens):
                    application.access.tokens = tokens
                    application.logger.notice("auth tokens re-read", metadata: ["tokens": "\(tokens.count)"])
                    completion(nil)
                case .failure(let error):
                    application.logger.error("auth tokens not re-read; the previous ones stay", metadata: ["reason": "\(error.reason)"])
                    completion(error.reason)
                }
            }
        }
    }

    /// Builds the engine on the loop's clock and binds; returns the bound address.
    public func start() throws -> SocketAddress {
        access.tokens = try Self.tokens(flag: configuration.authToken, file: configuration.authTokenFile)
        let scheduler = try LoopScheduler(loop: loop)
        self.scheduler = scheduler
        let httpClient: HTTPClient
        do {
            httpClient = try HTTPClient(loop: loop, policy: configuration.httpPolicy,
                                        maxHostConnections: configuration.httpMaxHostConnections)
        } catch {
            scheduler.close()
            throw error
        }
        self.httpClient = httpClient
        var extra: [String: TaskExecutor] = ["http": HTTPExecutor(client: httpClient, scheduler: scheduler)]
        if configuration.allowExec {
            let isolation: ProcessIsolation
            do {
                isolation = try ProcessIsolation.choose(configuration.execIsolation)
            } catch {
                httpClient.close()
                scheduler.close()
                self.scheduler = nil
                throw error
            }
            logger.info("\(isolation.summary)")
            let exec = ExecExecutor(loop: loop, scheduler: scheduler, isolation: isolation)
            execExecutor = exec
            extra["exec"] = exec
        } else {
            extra["exec"] = ExecRefusingExecutor()
        }
        var engineConfiguration = configuration.engine
        // With a store too: a crash then never leaves a program running (or a request sent) for
        // a task the disk holds as queued, and waiting for the group commit was within the noise
        // of Benchmarks/service's exec and http bursts.
        engineConfiguration.startsAfterCommit = configuration.sharedDatabase != nil || configuration.durability != .memory
        if let settings = configuration.sharedDatabase {
            return try startCells(settings, engine: engineConfiguration, executors: extra, scheduler: scheduler)
        }
        let engine = Engine(configuration: engineConfiguration, scheduler: scheduler, extraExecutors: extra)
        self.engine = engine
        waiters = TaskWaiters(scheduler: scheduler) { [unowned self] id in taskResponse(id) }
        leaseCalls = LeaseCalls(scheduler: scheduler) { [unowned self] in metrics }
        var restored = StoredState()
        if configuration.durability != .memory {
            do {
                restored = try openStore(engine: engine, scheduler: scheduler)
            } catch {
                httpClient.close()
                scheduler.close()
                self.scheduler = nil
                throw error
            }
        }
        let idempotency = IdempotencyKeys(ttlMilliseconds: configuration.idempotencyTTLMilliseconds,
                                          maxKeys: configuration.maxIdempotencyKeys, scheduler: scheduler,
                                          restored: restored.idempotencyKeys)
        idempotency.onExpire = { [unowned self] keys in durable?.expire(keys) }
        durable?.currentKey = { [unowned idempotency] key in idempotency.record(for: key) }
        idempotency.start()
        self.idempotency = idempotency
        engine.addObserver { [unowned self] events in settled(events) }
        // Numbered after the store has the batch (the observer above it), so each event knows
        // the commit it waits for.
        let eventLog = EventLog(after: restored.eventSequence,
                                capacity: configuration.eventBufferSize, maxBytes: configuration.eventBufferBytes,
                                clientBufferBytes: configuration.eventClientBufferBytes,
                                writeIntervalMilliseconds: configuration.eventWriteIntervalMilliseconds, scheduler: scheduler)
        self.eventLog = eventLog
        let webhooks = Webhooks(client: httpClient, scheduler: scheduler, settings: configuration.webhooks, durable: durable,
                                logger: logger)
        self.webhooks = webhooks
        webhooks.restore(restored.webhooks, restored.deliveries)
        eventLog.onNumbered = { [unowned webhooks] event in webhooks.numbered(event) }
        if let durable {
            eventLog.batchOfNextChange = { [unowned durable] in durable.pendingBatch }
            durable.onCommitted = { [unowned eventLog, unowned webhooks] number in
                eventLog.committed(through: number)
                webhooks.committed(through: number)
            }
            durable.eventSequence = { [unowned eventLog] in eventLog.lastAssigned }
        }
        engine.addObserver { [unowned eventLog, unowned engine] events in eventLog.record(events, of: engine) }
        eventWrites = try LoopCheck(loop: loop) { [unowned eventLog] in eventLog.flushPending() }
        let routes = routes()
        metrics = ServiceMetrics(kinds: engine.kinds, routes: routes)
        installRoutes(routes)
        let server = makeServer()
        do {
            try adoptOrphans()
            let address = try server.start()
            self.server = server
            return address
        } catch {
            closeAfterFailedStart()
            throw error
        }
    }

    func installRoutes(_ routes: [Route]) {
        router = makeRouter(routes)
        routeTable = routes
    }

    func makeServer() -> HTTPServer {
        HTTPServer(loop: loop, configuration: configuration.http, admission: { [unowned self] request in
            admit(&request)
        }) { [unowned self] request, responder in
            handle(request, responder)
        }
    }

    /// With `--adopt-orphans`: this process reaps what its programs leave behind.
    func adoptOrphans() throws {
        guard configuration.adoptsOrphans else { return }
        try OrphanReaper.becomeChildSubreaper()
        orphanReaper = try OrphanReaper(loop: loop)
    }

    /// Undoes a start that failed before the server listened.
    func closeAfterFailedStart() {
        closeResources { orphanReaper?.close() }
    }

    /// The shutdown story (see the type's comment); `completion` runs once, when everything the
    /// application owns is closed.
    public func stop(completion: @escaping () -> Void) {
        guard !isDraining else { return }
        isDraining = true
        stopCompletion = completion
        let grace = configuration.shutdownGraceMilliseconds
        execExecutor?.stopBy(loop.now + grace)
        execExecutor?.onIdle = { [unowned self] in finishStopping() }
        if cellHost != nil {
            // The server answers on until the cells have moved: requests other replicas send
            // for them meanwhile are held, then go to the cells' next owners.
            let linger = configuration.sharedDatabase?.releasedCellsLingerMilliseconds ?? 0
            stopCells(grace: grace) { [unowned self] in closeServer(grace: grace, idleLinger: linger) }
        } else {
            closeServer(grace: grace)
        }
        if cellHost == nil, let engine, let scheduler {
            if durable != nil {
                // The state is kept: nothing new starts, running work has the grace to finish,
                // and what still runs then is stopped and runs again after the restart.
                engine.haltDispatch()
            } else {
                for name in engine.queues.keys.sorted() { engine.cancelAll(inQueue: name) }
            }
            waiters.answerAll()
            leaseCalls.answerAll()
            eventLog.finishAll()
            _ = scheduler.schedule(after: grace) { [weak self] in
                if self?.durable != nil { self?.engine.suspendForShutdown() }
                self?.execExecutor?.killAll()
                _ = self?.scheduler?.schedule(after: 500) { [weak self] in self?.execExecutor?.abandonOutput() }
            }
        } else if cellHost != nil, let scheduler {
            // As on a single server: at the grace, `exec` trees still alive are killed.
            _ = scheduler.schedule(after: grace) { [weak self] in
                self?.execExecutor?.killAll()
                _ = self?.scheduler?.schedule(after: 500) { [weak self] in self?.execExecutor?.abandonOutput() }
            }
        }
        finishStopping()
    }

    private func closeServer(grace: UInt64, idleLinger: UInt64 = 0) {
        guard let server else {
            serverClosed = true
            return
        }
        server.shutdown(gracePeriodMilliseconds: grace, idleLingerMilliseconds: idleLinger) { [unowned self] in
            serverClosed = true
            finishStopping()
        }
    }

    static let sharedDatabaseUnavailable = APIProblem(
        .serviceUnavailable, detail: "The shared database cannot be reached; this replica serves again once it can.",
        code: "database_unavailable", headers: ["Retry-After": "1"])

    static let storageUnavailable = APIProblem(
        .serviceUnavailable, detail: "The server cannot write to its storage; the change was not made durable. Try again later.",
        code: "storage_unavailable", headers: ["Retry-After": "1"])

    /// Opens the data dir (its lock, schema, rows), rebuilds the engine from it, and starts
    /// group commit; what the rebuild changed (interrupted attempts) is its first batch.
    private func openStore(engine: Engine, scheduler: LoopScheduler) throws -> StoredState {
        let loop = self.loop
        let store = try SQLiteTaskStore(
            dataDirectory: configuration.dataDirectory, syncLevel: configuration.durability == .full ? .full : .normal
        ) { work in loop.execute(work) }
        for file in store.directory.tightened {
            logger.warning("a data file its group or others could use was made 0600", metadata: ["file": "\(file)"])
        }
        let durable: DurableState
        do {
            durable = try DurableState(store: store, engine: engine, loop: loop, scheduler: scheduler, logger: logger)
        } catch {
            store.close()
            throw error
        }
        engine.addObserver { events in durable.record(events) }
        var loaded = store.takeLoaded()
        do {
            // Start-up may block: the engine reads no tzdata file.
            try configuration.engine.zones.load(zonesOf: loaded.schedules)
            try engine.restore(queues: loaded.queues, workflows: loaded.workflows, tasks: loaded.tasks,
                               uniqueKeys: loaded.uniqueKeys, schedules: loaded.schedules)
        } catch {
            durable.close()
            throw error
        }
        self.durable = durable
        sqlite = durable
        logger.info("restored from \(configuration.dataDirectory)", metadata: [
            "tasks": "\(loaded.tasks.count)", "unfinished": "\(engine.unfinishedCount)", "durability": "\(configuration.durability)",
        ])
        // The rest is small; the tasks now live in the engine.
        loaded.tasks = []
        return loaded
    }

    /// A database connection string without its password, for logs and errors, in each form
    /// libpq reads: `postgres://user:pw@host`, `...?password=pw` and `host=h password='p w'`.
    static func redacted(_ connection: String) -> String {
        var text = connection
        if let scheme = text.firstRange(of: "://") {
            let authorityEnd = text[scheme.upperBound...].firstIndex { $0 == "/" || $0 == "?" } ?? text.endIndex
            if let at = text[scheme.upperBound..<authorityEnd].lastIndex(of: "@"),
               let colon = text[scheme.upperBound..<at].firstIndex(of: ":") {
                text = String(text[..<colon]) + ":***" + String(text[at...])
            }
        }
        let password = #/(?i)(^|[\s?&])password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]*)/#
        return text.replacing(password) { match in "\(match.1)password=***" }
    }

    func finishStopping() {
        guard isDraining, serverClosed, (execExecutor?.liveAttempts ?? 0) == 0, cellHost == nil,
              durable == nil || engine.runningHereCount == 0,
              let completion = stopCompletion else { return }
        stopCompletion = nil
        finishClosing(completion)
    }

    func finishClosing(_ completion: @escaping () -> Void) {
        server = nil
        closeResources { finishProcessTrees(exec: execExecutor, orphanReaper: orphanReaper) }
        completion()
    }

    /// Closes what the application owns besides the server, in one order for a stop and for a
    /// start that failed; `endProcessTrees` deals with the programs and the orphan reaper.
    private func closeResources(endProcessTrees: () -> Void) {
        // Webhook attempts end unrecorded (they are made again after a restart), then cancelling
        // has removed every transfer; this frees curl's connection cache and handles. With cells,
        // forwards still in flight are answered 503 (the server has closed).
        webhooks?.close()
        cellWebhooks?.cluster.close()
        cellWebhooks = nil
        forwarder?.close()
        forwarder = nil
        httpClient?.close()
        httpClient = nil
        // What the last changes were is written before the process may end; the store's threads
        // end before anything they point at goes away (a port in use crashed the exit now and
        // then when they outlived the application).
        idempotency?.close()
        sqlite?.close()
        sqlite = nil
        durable = nil
        endProcessTrees()
        orphanReaper = nil
        eventWrites?.close()
        eventWrites = nil
        scheduler?.close()
        scheduler = nil
    }

    // MARK: requests

    /// Decides on a request's head, before its body is read: routes it (the handler then uses
    /// that route) and asks the access policy. A refusal closes the connection unread.
    private func admit(_ request: inout HTTPRequest) -> HTTPAdmission {
        if !request.method.isGeneralPurpose {
            return refuse(request, nil, Router<Route>.notImplemented(request.method).response())
        }
        var found: Route?
        if case .found(let route, let parameters, _) = router.match(request.method, rawPath: request.rawPath) {
            found = route
            request.parameters = parameters
            request.matchedRoute = route.index
        }
        if let problem = access.refusal(of: request, route: found) {
            return refuse(request, found, problem.response())
        }
        return access.corsFields(for: request).map { .admitAnswering(with: $0) } ?? .admit
    }

    private func refuse(_ request: HTTPRequest, _ route: Route?, _ response: HTTPResponse) -> HTTPAdmission {
        metrics.requestAnswered(route: route, method: request.method, status: response.status, seconds: 0)
        if logsRequests {
            logger.debug("\(request.method) \(request.path) \(response.status.code) (refused on its head)", metadata: [
                "route": "\(route?.pattern ?? ServiceMetrics.unmatchedRoute)", "status": "\(response.status.code)",
            ])
        }
        return .refuse(response)
    }

    /// Consumes the request: setting its parameters then needs no copy of it.
    private func handle(_ request: consuming HTTPRequest, _ responder: HTTPResponder) {
        let found = request.matchedRoute >= 0 ? routeTable[request.matchedRoute] : nil
        var reply = Reply(responder: responder, method: request.method, path: logsRequests ? request.path : "", route: found,
                          started: Self.monotonicNanoseconds(), application: self)
        if request.method == .OPTIONS && access.isPreflight(request) {
            return reply.send(AccessPolicy.preflightAnswer())
        }
        if sqlite?.isFailing == true && request.method != .GET && request.method != .HEAD {
            return reply.send(Self.storageUnavailable.response())
        }
        guard let route = found else {
            let match = router.match(request.method, rawPath: request.rawPath)
            return reply.send(Router<Route>.problem(for: match, request)!.response())
        }
        if cellHost != nil && route.placement != .none {
            return serveInCell(route, request, reply)
        }
        // A replica whose cells have gone (it is stopping) holds no task: a request still
        // reaching it (forwarded before the others learned, or in flight on a kept-alive
        // connection) is told the cell moves on, and its forwarder asks the next owner.
        if configuration.sharedDatabase != nil && route.placement != .none {
            return reply.send(Self.cellMoving.response())
        }
        reply.engine = engine
        run(route, request, reply)
    }

    /// A request whose handler waited off the loop (for a zone to load) and changed nothing:
    /// served from the start again, where its cell is now.
    func serveAgain(_ request: HTTPRequest, _ reply: Reply) {
        guard let route = reply.route else { return }
        if cellHost != nil && route.placement != .none { return serveInCell(route, request, reply) }
        run(route, request, reply)
    }

    func run(_ route: Route, _ request: HTTPRequest, _ reply: Reply) {
        do {
            try route.handler(request, reply)
        } catch {
            if !(error is HTTPResponseError) {
                logger.error("unexpected error", metadata: ["error": "\(error)", "route": "\(route.pattern)"])
            }
            reply.send(errorResponse(for: error))
        }
    }

    /// Called once per answered request.
    func answered(_ reply: Reply, status: HTTPStatus) {
        let microseconds = (Self.monotonicNanoseconds() - reply.started) / 1_000
        metrics.requestAnswered(route: reply.route, method: reply.method, status: status, seconds: Double(microseconds) / 1e6)
        guard logsRequests else { return }
        let fraction = String(microseconds % 1_000)
        logger.debug("\(reply.method) \(reply.path) \(status.code)", metadata: [
            "route": "\(reply.route?.pattern ?? ServiceMetrics.unmatchedRoute)", "status": "\(status.code)",
            "ms": "\(microseconds / 1_000).\(String(repeating: "0", count: 3 - fraction.count))\(fraction)",
        ])
    }

    /// What one engine call changed, once it has settled: logs (state changes at debug: at info
    /// they cost most of a submission), metrics, and long polls whose task has ended.
    func settled(_ events: [EngineEvent]) {
        let logsStates = logger.logLevel <= .debug
        for case .stateChanged(let task, let from, let to) in events {
            if logsStates {
                logger.debug("task \(task.id) \(from.rawValue) -> \(to.rawValue)", metadata: [
                    "task": "\(task.id)", "kind": "\(task.kind)", "queue": "\(task.queue.name)", "state": "\(to.rawValue)",
                ])
            }
            if to.isTerminal {
                metrics.taskFinished(task)
                waiters.finished(task.id)
            }
        }
        // Stopping with a store waits for running work to finish within the grace.
        if isDraining && durable != nil { finishStopping() }
    }

    /// `http` transfers in flight.
    var activeTransfers: Int { httpClient?.activeTransfers ?? 0 }

    func renderMetrics() -> [UInt8] {
        metrics.render(queues: queuesHere, connections: server?.openConnections ?? 0, longPolls: waiters.count,
                       transfers: activeTransfers, eventStreams: eventLog.subscriberCount + (clusterStreams?.subscriberCount ?? 0),
                       eventStreamsDisconnected: eventLog.disconnectedBehind + (clusterStreams?.disconnectedBehind ?? 0),
                       webhooks: webhooks,
                       droppedLogLines: configuration.logSink?.dropped ?? 0, cellHost: cellHost, scheduleTotals: scheduleTotalsHere)
    }

    /// What the schedules of the engines here did (with cells, of the cells this replica serves now).
    var scheduleTotalsHere: ScheduleTotals {
        let engines = cellHost?.openEngines ?? [engine]
        var totals = ScheduleTotals()
        for engine in engines {
            totals.fired += engine.scheduleTotals.fired
            totals.missed += engine.scheduleTotals.missed
            totals.skipped += engine.scheduleTotals.skipped
        }
        return totals
    }

    /// The queues of the engines here (with cells, of the cells this replica serves).
    var queuesHere: [String: TaskQueue] {
        guard let cellHost else { return engine.queues }
        var queues: [String: TaskQueue] = [:]
        for engine in cellHost.openEngines { queues.merge(engine.queues) { first, _ in first } }
        return queues
    }

    /// The engine that holds task `id` here, if any.
    func engine(holding id: TaskID) -> Engine? {
        guard let cellHost else { return engine }
        return cellHost.placement(of: Cell(id.cell)).engine
    }

    /// The task as JSON, or 404 if it is gone.
    func taskResponse(_ id: TaskID, status: HTTPStatus = .ok) -> HTTPResponse {
        guard let engine = engine(holding: id) else { return Self.cellMoving.response() }
        guard let task = engine.task(id) else {
            return APIProblem(.notFound, detail: "No task \(id).").response()
        }
        return .json(status, Representation.task(task, in: engine))
    }

    static func monotonicNanoseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
    }
}

/// A route's handler: answers through the reply, now or later, or throws an
/// `HTTPResponseError` (anything else is a 500).
typealias ServiceHandler = (HTTPRequest, Reply) throws -> Void

/// One request's answer channel: sends once, and tells the application (logs, metrics).
struct Reply {
    let responder: HTTPResponder
    let method: HTTPMethod
    /// For the debug log line only (empty when that is off).
    let path: String
    /// Nil when no route took the request.
    let route: Route?
    let started: UInt64
    unowned let application: TaskloopApplication
    /// The engine serving the request: the server's, or with cells its cell's (set when routed).
    var engine: Engine!
    /// With cells: which tasks of other cells that a submission depends on exist, read before
    /// it was served (`preReadSubmission`).
    var tasksOfOtherCells: Result<Set<TaskID>, PGError> = .success([])
    /// With cells, one cell's part of a batch that spans cells (`splitBatchAcrossCells`): its
    /// answer is handed here to be merged into the client's, not sent (nor counted: the
    /// client's request is).
    var takesPart: ((HTTPResponse) -> Void)?

    /// With a store, the answer leaves once everything changed so far is committed (at once
    /// when nothing is in flight, or when the store is failing and this is a read).
    func send(_ response: HTTPResponse) {
        guard responder.isOpen else { return }
        if let cellHost = application.cellHost, !cellHost.isCaughtUp {
            return cellHost.whenDurable(of: engine?.cell.map(Cell.init)) { committed in
                deliver(committed ? response : TaskloopApplication.sharedDatabaseUnavailable.response())
            }
        }
        // The common case sends at once, without making a closure per answer.
        guard let durable = application.durable, !durable.isCaughtUp,
              !(durable.isFailing && (method == .GET || method == .HEAD)) else {
            return deliver(response)
        }
        durable.whenDurable { committed in
            deliver(committed ? response : TaskloopApplication.storageUnavailable.response())
        }
    }

    /// An answer another replica made: it left there once its change was committed, and holds
    /// nothing of this replica's, so it does not wait for this one's commits.
    func sendMadeElsewhere(_ response: HTTPResponse) {
        deliver(response)
    }

    private func deliver(_ response: HTTPResponse) {
        guard responder.isOpen else { return }
        if let takesPart { return takesPart(response) }
        application.answered(self, status: response.status)
        responder.respond(response)
    }

    func onClose(_ observer: @escaping () -> Void) {
        responder.onClose(observer)
    }

    func onPeerEnded(_ observer: @escaping () -> Void) {
        responder.onPeerEnded(observer)
    }
}

/// The shared database could not be joined at start.
struct SharedDatabaseError: Error, CustomStringConvertible {
    let reason: String
    var description: String { reason }
}
