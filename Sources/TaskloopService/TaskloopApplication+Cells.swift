import Glibc
import TaskloopCluster
import TaskloopEngine
import TaskloopExecutors
import TaskloopHTTP
import TaskloopJSON
import TaskloopLoop
import TaskloopPostgres
import TaskloopStore

/// The service on cells (`--database-url`, docs/SCALING.md): this replica serves the
/// cells it owns, each with an engine of its own that `CellHost` opens, commits and closes;
/// requests for another replica's cell are forwarded to it, and requests for a cell that is
/// moving wait for its new owner.
///
/// Threading: loop thread only, like the application.
extension TaskloopApplication {
    static let cellMoving = APIProblem(
        .serviceUnavailable, detail: "The tasks this request names are moving between replicas; try again in a moment.",
        code: "cell_moving", headers: ["Retry-After": "1"])

    /// How long a request for a cell that is moving waits for its new owner.
    static let movingCellWaitMilliseconds: UInt64 = 1_000
    /// How often a waiting request looks again.
    static let movingCellPollMilliseconds: UInt64 = 20
    /// How long a webhook change waits for the other replicas to read it before it is answered.
    static let webhookSyncWaitMilliseconds: UInt64 = 1_000

    /// Starts the service on cells: the server listens first (the address it advertises may be
    /// the port it was given), then the replica joins the cluster; cells open as it claims
    /// them, and until then their requests wait or go to their owners.
    func startCells(_ settings: SharedDatabaseSettings, engine engineConfiguration: EngineConfiguration,
                    executors: [String: TaskExecutor], scheduler: LoopScheduler) throws -> SocketAddress {
        waiters = TaskWaiters(scheduler: scheduler) { [unowned self] id in taskResponse(id) }
        leaseCalls = LeaseCalls(scheduler: scheduler) { [unowned self] in metrics }
        let idempotency = IdempotencyKeys(ttlMilliseconds: configuration.idempotencyTTLMilliseconds,
                                          maxKeys: configuration.maxIdempotencyKeys, scheduler: scheduler, restored: [])
        idempotency.start()
        self.idempotency = idempotency
        eventLog = EventLog(after: 0, capacity: configuration.eventBufferSize, maxBytes: configuration.eventBufferBytes,
                            clientBufferBytes: configuration.eventClientBufferBytes,
                                writeIntervalMilliseconds: configuration.eventWriteIntervalMilliseconds, scheduler: scheduler)
        let hookJournal = CellWebhookJournal(cluster: try ClusterWebhooks(loop: loop, url: settings.url))
        cellWebhooks = hookJournal
        let webhooks = Webhooks(client: httpClient!, scheduler: scheduler, settings: configuration.webhooks, durable: hookJournal,
                                logger: logger)
        self.webhooks = webhooks
        eventWrites = try LoopCheck(loop: loop) { [unowned self] in
            eventLog.flushPending()
            clusterStreams?.flushPending()
        }
        let routes = routes()
        // The engines open later, cell by cell; their kinds are known now.
        metrics = ServiceMetrics(kinds: Set(Engine.builtInKinds).union(executors.keys).sorted(), routes: routes)
        metrics.cellSeries()
        installRoutes(routes)
        let reads = cellReadHandlers()
        for route in routes {
            if let handler = reads["\(route.method) \(route.pattern)"] { cellReads[route.index] = handler }
        }
        let server = makeServer()
        let address: SocketAddress
        do {
            try adoptOrphans()
            address = try server.start()
        } catch {
            closeAfterFailedStart()
            throw error
        }
        self.server = server
        let advertised = settings.advertiseAddress ?? "\(address.host):\(address.port)"
        let identity = ReplicaIdentity(name: settings.replica, incarnation: Self.incarnation())
        let lease = settings.leaseMilliseconds
        var keeper = CellKeeper.Settings(url: settings.url, identity: identity, address: advertised,
                                         ownership: CellOwnership.Settings(leaseMilliseconds: lease, marginMilliseconds: lease / 5))
        keeper.cells = settings.cells
        let renderer = ClusterEventRenderer(scheduler: scheduler)
        let host: CellHost
        do {
            host = try CellHost(loop: loop, keeper: keeper, zones: engineConfiguration.zones, makeEngine: { [unowned self] cell in
                var configuration = engineConfiguration
                let layout = cellHost!.layout
                configuration.cells = CellPlacement(cell: cell.index) { layout.cell(ofQueue: $0).index }
                return Engine(configuration: configuration, scheduler: scheduler, extraExecutors: executors)
            }, eventsOf: { [unowned self] engine, events in
                let written = renderer.render(events, of: engine, at: scheduler.wallClock)
                numberForWebhooks(written)
                return written
            })
        } catch {
            closeAfterFailedStart()
            throw error
        }
        cellHost = host
        renderer.onHeldProgress = { [unowned self, unowned host] engine, written in
            if host.record(written, by: engine) { numberForWebhooks(written) }
        }
        var forwarding = ClusterForwarder.Settings()
        forwarding.maxResponseBytes = configuration.maxResponseBytes * 2
        do {
            forwarder = try ClusterForwarder(loop: loop, replica: settings.replica, settings: forwarding)
        } catch {
            cellHost = nil
            closeAfterFailedStart()
            throw error
        }
        hookJournal.host = host
        host.onOpened = { [unowned self, unowned idempotency] engine, keys in
            idempotency.absorb(keys, expired: [])
            // An engine may outlive the application in an answer still pending: weak.
            engine.addObserver { [weak self] events in self?.settled(events) }
            if let cell = engine.cell { resumeDeliveries(of: Cell(cell), engine) }
        }
        host.onClosed = { [unowned webhooks, unowned hookJournal] engine in
            if let cell = engine.cell { webhooks.drop(hookJournal.dropCell(Cell(cell))) }
        }
        host.onSuperseded = { [unowned self] version in
            let detail = "The cluster was upgraded to protocol \(version); this replica runs protocol "
                + "\(ClusterSchema.protocolVersion), has handed its cells over and serves no more: run the new version."
            logger.error("\(detail)")
            retiredProblem = APIProblem(.serviceUnavailable, detail: detail, code: "replica_superseded")
        }
        host.onReplaced = { [unowned self] in
            let name = settings.replica
            let detail = "Another process took over the replica name \(name) (--replica-name); this one has closed its cells "
                + "and serves no more."
            logger.error("another process took over the replica name \(name); this process serves no more")
            retiredProblem = APIProblem(.serviceUnavailable, detail: detail, code: "replica_replaced")
        }
        // Keys are the cluster's (see `preReadSubmission`): an expired one goes from the
        // table whichever cell wrote it, unless it was used again meanwhile.
        idempotency.onExpire = { [unowned self] keys in
            cellHost?.read([CellSchema.deleteExpiredKeys(keys, at: scheduler.wallClock)]) { _ in }
        }
        hookJournal.cluster.onChanged = { [unowned webhooks] records in webhooks.sync(records) }
        host.keeper.onWebhooksVersion = { [unowned hookJournal] version in hookJournal.cluster.catchUp(to: version) }
        // The webhooks first: a cell that opens resumes the deliveries of the webhooks it knows.
        var outcome: Result<CellLayout, PGError>?
        hookJournal.cluster.start { result in
            switch result {
            case .success: host.start { outcome = $0 }
            case .failure(let error): outcome = .failure(error)
            }
        }
        loop.run { outcome != nil }
        if case .failure(let error) = outcome! {
            cellHost = nil
            host.abandon()
            forwarder?.close()
            forwarder = nil
            closeAfterFailedStart()
            throw SharedDatabaseError(reason: "the cluster at \(Self.redacted(settings.url)) cannot be joined: \(error)")
        }
        hookJournal.cluster.joined(as: identity, protocolVersion: keeper.protocolVersion)
        do {
            var feed = ClusterEventFeed.Settings(url: settings.url, timeouts: PGTimeouts(seconds: settings.timeoutSeconds))
            feed.pollMilliseconds = settings.eventPollMilliseconds
            clusterStreams = try ClusterEventStreams(
                loop: loop, feed: feed,
                read: { [weak host] queries, completion in
                    guard let host else { return completion(.failure(PGError(message: "the replica is stopping"))) }
                    host.read(queries, completion)
                }, clientBufferBytes: configuration.eventClientBufferBytes,
                historyMilliseconds: configuration.eventHistoryMilliseconds, scheduler: scheduler)
            clusterStreams?.onFollowing = { [weak host] following in host?.keeper.followsEvents = following }
        } catch {
            // Everything else serves; the streams answer 503 meanwhile.
            logger.error("the event streams cannot follow the cluster's events: \(error)")
        }
        logger.info("joined the cluster on \(Self.redacted(settings.url))", metadata: [
            "replica": "\(settings.replica)", "cells": "\(host.layout.count)", "address": "\(advertised)",
        ])
        return address
    }

    // MARK: webhooks

    /// The events a cell's engine settled become deliveries of that cell, written in its commit
    /// and let go once it is known. Each event is its cell's: a task's id carries its cell, a
    /// workflow's id its home cell's, and a queue is in its own.
    func numberForWebhooks(_ written: [ClusterEvents.Written]) {
        guard let host = cellHost, let journal = cellWebhooks, !webhooks.hooks.isEmpty, let first = written.first else { return }
        let cell: Cell
        if let task = first.task.flatMap(TaskID.init) {
            cell = Cell(task.cell)
        } else if let workflow = first.workflow.flatMap(TaskID.init) {
            cell = Cell(workflow.cell)
        } else {
            cell = host.cell(ofQueue: first.queue ?? "")
        }
        // On cells an event's id is its position, known only once committed: deliveries are
        // ordered by the event's time instead (`event_seq`).
        let events = written.compactMap { event in
            EventKind(rawValue: event.type).map { kind in
                StreamEvent(committed: event, kind: kind, seq: UInt64(max(0, event.time)))
            }
        }
        journal.number(events, of: cell, into: webhooks) { [weak self] round in self?.webhooks?.committed(through: round) }
    }

    /// A cell opened here: the deliveries its commits kept are this replica's to attempt now.
    /// The webhooks are read first, so none made just before the cell moved is unknown here.
    func resumeDeliveries(of cell: Cell, _ engine: Engine) {
        guard let journal = cellWebhooks else { return }
        journal.cluster.read { [weak self] hooks in
            guard let self else { return }
            guard case .success = hooks else { return resumeDeliveriesAgain(of: cell, engine) }
            journal.cluster.deliveries(ofCell: cell) { [weak self] result in
                guard let self, case .here(let serving)? = cellHost?.placement(of: cell), serving === engine else { return }
                guard case .success(let deliveries) = result else { return resumeDeliveriesAgain(of: cell, engine) }
                journal.adopt(deliveries, of: cell)
                webhooks.resume(deliveries)
            }
        }
    }

    /// The database could not be read (the connection is being made again): the cell's
    /// deliveries are looked for again shortly, while it is still served by `engine`.
    private func resumeDeliveriesAgain(of cell: Cell, _ engine: Engine) {
        _ = scheduler?.schedule(after: 500) { [weak self] in
            guard let self, case .here(let serving)? = cellHost?.placement(of: cell), serving === engine else { return }
            resumeDeliveries(of: cell, engine)
        }
    }

    /// A name for this process, unique across restarts of the replica: a process that takes
    /// the replica's name over makes the one before it close its cells.
    static func incarnation() -> String {
        var random = SystemRandomNumberGenerator()
        return "\(getpid())-" + String(random.next(), radix: 36)
    }

    /// Stopping with cells: nothing new starts; every cell is drained (what runs here stops and
    /// is queued again for its next owner) and released; then `released` (the server closes).
    func stopCells(grace: UInt64, _ released: @escaping () -> Void) {
        for engine in cellHost?.openEngines ?? [] { engine.haltDispatch() }
        waiters.answerAll()
        leaseCalls.answerAll()
        eventLog.finishAll()
        clusterStreams?.finishAll()
        clusterStreams = nil
        guard let host = cellHost else { return released() }
        var ended = false
        let end = { [unowned self] in
            guard !ended else { return }
            ended = true
            cellHost = nil
            released()
            finishStopping()
        }
        host.stop(end)
        // A hand-over that cannot finish within the grace (the database unreachable, say) is
        // given up as a crash would leave it: the leases run out, and the others take the cells.
        _ = scheduler?.schedule(after: grace) { [weak self, weak host] in
            guard let self, let host, !ended else { return }
            logger.warning("the cells were not handed over within the shutdown grace; leaving them to expire")
            host.abandon()
            end()
        }
    }

    /// Refuses a dependency on a task of another cell (`field` and id, from `specs` and the
    /// field prefix of each) that does not exist, as a single server refuses an unknown one
    /// before it changes anything: the engine takes such a dependency on trust, and its cell
    /// would only report it missing later. Which exist was read before the submission was
    /// served (`preReadSubmission`). Without cells, nothing.
    func refuseUnknownRemoteDependencies(of specs: [(prefix: String, spec: TaskSpec)], _ reply: Reply) throws {
        guard cellHost != nil, let cell = reply.engine.cell else { return }
        for (prefix, spec) in specs {
            for (position, dependency) in spec.dependencies.enumerated() {
                guard case .task(let id) = dependency, id.cell != cell else { continue }
                guard try reply.tasksOfOtherCells.get().contains(id) else {
                    throw EngineError(.unknownDependency, "No task \(id).", field: "\(prefix)dependencies[\(position)]")
                }
            }
        }
    }

    /// The routes any replica answers from the cells' records in the database (event streams
    /// from its own feed of every cell's events, webhooks from the cluster's table), by route
    /// pattern and method.
    func cellReadHandlers() -> [String: ServiceHandler] {
        var handlers: [String: ServiceHandler] = [
            "GET /tasks": { [unowned self] request, reply in
                let listing = try ClusterLists.taskListing(request)
                readFromCellsAfterPosition(reply, { [unowned self] position, execute, done in
                    ClusterLists.tasks(listing, maxResponseBytes: configuration.maxResponseBytes, execute: execute) { page in
                        done(page.map { .json(.ok, $0, headers: ["Event-Seq": position.description]) })
                    }
                })
            },
            "GET /workflows/{id}": { [unowned self] request, reply in
                let text = request.parameters["id"] ?? ""
                guard let id = TaskID(text) else { throw APIProblem(.notFound, detail: "No workflow \(text).") }
                readFromCellsAfterPosition(reply, { position, execute, done in
                    ClusterLists.workflow(id, execute: execute) { result in
                        done(result.map {
                            $0.map { .json(.ok, $0, headers: ["Event-Seq": position.description]) }
                                ?? APIProblem(.notFound, detail: "No workflow \(text).").response()
                        })
                    }
                })
            },
            "GET /queues": { [unowned self] _, reply in
                let wallClock = scheduler?.wallClock ?? 0, queues = queuesHere
                readFromCells(reply, { [unowned self] execute, done in
                    ClusterLists.queues(defaultConcurrency: configuration.engine.defaultConcurrency, at: wallClock,
                                        live: { queues[$0] }, execute: execute) { done($0.map { .json(.ok, $0) }) }
                })
            },
            "GET /schedules": { [unowned self] _, reply in
                let zones = configuration.engine.zones, loop = loop
                readFromCellsAfterPosition(reply, { position, execute, done in
                    ClusterLists.schedules(zones: zones, loop: loop, execute: execute) { list in
                        done(list.map { .json(.ok, $0, headers: ["Event-Seq": position.description]) })
                    }
                })
            },
        ]
        handlers["GET /events"] = { [unowned self] request, reply in try streamClusterEvents(request, reply) }
        handlers["GET /tasks/{id}/events"] = { [unowned self] request, reply in try streamClusterTaskEvents(request, reply) }
        handlers.merge(webhookHandlers()) { $1 }
        return handlers
    }

    /// Webhooks on any replica: each request first reads the cluster's table (a webhook another
    /// replica made or deleted a moment ago is known here before the answer), and a change
    /// is answered once the table has it and every live replica has read it (or after
    /// `webhookSyncWaitMilliseconds`, logged): an event committed anywhere after the answer
    /// is matched against it. A webhook's log is read from every cell's deliveries.
    private func webhookHandlers() -> [String: ServiceHandler] {
        let afterWrite: (@escaping (HTTPRequest) throws -> HTTPResponse) -> ServiceHandler = { change in
            { [unowned self] request, reply in
                withWebhooksRead(request, reply) { [unowned self] in
                    let response = try change(request)
                    cellWebhooks?.cluster.whenSynced(within: Self.webhookSyncWaitMilliseconds) { [weak self] outcome in
                        switch outcome {
                        case .synced:
                            reply.send(response)
                        case .late(let replicas):
                            self?.logger.warning("a webhook change is answered before every replica has read it",
                                                 metadata: ["replicas": "\(replicas.joined(separator: ","))"])
                            reply.send(response)
                        case .failed:
                            reply.send(Self.sharedDatabaseUnavailable.response())
                        }
                    }
                }
            }
        }
        let afterRead: (@escaping ServiceHandler) -> ServiceHandler = { read in
            { [unowned self] request, reply in withWebhooksRead(request, reply) { try read(request, reply) } }
        }
        return [
            "POST /webhooks": afterWrite { [unowned self] in try newWebhook($0) },
            "DELETE /webhooks/{id}": afterWrite { [unowned self] in try deletedWebhook($0) },
            "GET /webhooks": afterRead { [unowned self] in try listWebhooks($0, $1) },
            "GET /webhooks/{id}": afterRead { [unowned self] in try getWebhook($0, $1) },
            "GET /webhooks/{id}/deliveries": afterRead { [unowned self] request, reply in
                let limit = try Self.deliveryLogLimit(request)
                let hook = try existingWebhook(request)
                cellWebhooks?.cluster.deliveries(ofWebhook: hook.record.id) { result in
                    switch result {
                    case .success(let deliveries):
                        // Entries pushed out of the log leave the table after the commit that pushed
                        // them out: read meanwhile, they are not shown.
                        let kept = Webhooks.bounded(deliveries, finishedEntries: self.configuration.webhooks.deliveryLog)
                        reply.send(.json(.ok, Self.deliveriesJSON(Webhooks.log(of: kept, limit: limit))))
                    case .failure:
                        reply.send(Self.sharedDatabaseUnavailable.response())
                    }
                }
            },
        ]
    }

    /// Brings this replica's webhooks up to the table, then runs `body` (its errors answered).
    private func withWebhooksRead(_ request: HTTPRequest, _ reply: Reply, _ body: @escaping () throws -> Void) {
        guard let journal = cellWebhooks else { return reply.send(Self.sharedDatabaseUnavailable.response()) }
        journal.cluster.read { [weak self] result in
            guard self != nil else { return }
            guard case .success = result else { return reply.send(Self.sharedDatabaseUnavailable.response()) }
            do {
                try body()
            } catch {
                reply.send(errorResponse(for: error))
            }
        }
    }

    /// `readFromCells` for an answer that carries its `Event-Seq`: the event position is read
    /// first, so a stream resumed after it misses nothing the answer did not show.
    private func readFromCellsAfterPosition(
        _ reply: Reply,
        _ read: @escaping (EventPosition, @escaping ClusterLists.Execute,
                           @escaping (Result<HTTPResponse, PGError>) -> Void) -> Void
    ) {
        readFromCells(reply, { execute, done in
            execute([ClusterEvents.now()]) { result in
                switch result {
                case .failure(let error): done(.failure(error))
                case .success(let results): read(ClusterEvents.position(of: results[0]), execute, done)
                }
            }
        })
    }

    /// Answers from a read of the cells' records; a database that cannot be read is 503.
    private func readFromCells(_ reply: Reply,
                               _ read: (@escaping ClusterLists.Execute, @escaping (Result<HTTPResponse, PGError>) -> Void) -> Void) {
        guard let host = cellHost else { return reply.send(Self.sharedDatabaseUnavailable.response()) }
        read({ queries, completion in host.read(queries, completion) }) { result in
            switch result {
            case .success(let response): reply.send(response)
            case .failure: reply.send(Self.sharedDatabaseUnavailable.response())
            }
        }
    }

    /// Routes a request to the cell its route names: served here, forwarded to the owner, or
    /// held while the cell moves (up to `movingCellWaitMilliseconds`). Lists and reads of
    /// whole workflows and queues are answered here from the database.
    func serveInCell(_ route: Route, _ request: HTTPRequest, _ reply: Reply, waitedMilliseconds: UInt64 = 0,
                     preRead: Result<Set<TaskID>, PGError>? = nil) {
        guard let host = cellHost else { return reply.send(Self.cellMoving.response()) }
        if let retiredProblem { return reply.send(retiredProblem.response()) }
        if let handler = cellReads[route.index] {
            do {
                try handler(request, reply)
            } catch {
                reply.send(errorResponse(for: error))
            }
            return
        }
        if reply.takesPart == nil, route.placement == .submittedTasks || route.placement == .reportedTasks,
           splitBatchAcrossCells(route, request, reply) {
            return
        }
        guard let cell = cell(of: route, request, host) else {
            // An id that names no cell: any engine here answers the 404.
            var reply = reply
            reply.engine = host.openEngines.first
            guard reply.engine != nil else { return reply.send(Self.cellMoving.response()) }
            return run(route, request, reply)
        }
        let placement = host.placement(of: cell)
        if placement.engine == nil, !host.keeper.isRenewed {
            // Cut off from the database, this replica cannot know who owns the cell now: the
            // client hears why, and a load balancer (by the health check) looks elsewhere.
            return reply.send(Self.sharedDatabaseUnavailable.response())
        }
        switch placement {
        case .here where preRead == nil
            && (route.placement == .submittedTask || route.placement == .submittedWorkflow || route.placement == .submittedTasks):
            preReadSubmission(route, request, in: cell, host) { [weak self] tasksOfOtherCells in
                self?.serveInCell(route, request, reply, waitedMilliseconds: waitedMilliseconds, preRead: tasksOfOtherCells)
            }
        case .here(let engine):
            var reply = reply
            reply.engine = engine
            if let preRead { reply.tasksOfOtherCells = preRead }
            run(route, request, reply)
        case .elsewhere(let address) where !ClusterForwarder.forwardedBy(request).contains(configuration.sharedDatabase?.replica ?? ""):
            guard let forwarder else { return reply.send(Self.cellMoving.response()) }
            metrics.requestForwarded()
            // An owner that cannot be reached is often one that is leaving: the request waits
            // for the cell's next owner, within the same budget as a moving cell.
            let waitsAgain: (() -> Void)? = waitedMilliseconds < Self.movingCellWaitMilliseconds ? { [weak self] in
                guard let self, let scheduler else { return reply.send(Self.cellMoving.response()) }
                _ = scheduler.schedule(after: Self.movingCellPollMilliseconds) { [weak self] in
                    self?.serveInCell(route, request, reply, waitedMilliseconds: waitedMilliseconds + Self.movingCellPollMilliseconds)
                }
            } : nil
            let forwarded = forwarder.forward(request, to: address, whenUnreachable: waitsAgain) { response in
                // A read whose exchange broke (the owner closing a kept-alive connection as it
                // leaves) is asked again: reads change nothing.
                if response.status.code == 502, request.method == .GET || request.method == .HEAD, let waitsAgain {
                    return waitsAgain()
                }
                // The owner did not take it (its cell moved on, or it is stopping): changed
                // nothing, so it goes where the cell is now.
                if response.status.code == 503, let waitsAgain { return waitsAgain() }
                reply.sendMadeElsewhere(response)
            }
            // A client that leaves takes its forward with it: the owner sees the connection end,
            // and a long poll or lease call waiting there for this client ends too.
            reply.onPeerEnded { forwarded.cancel() }
        case .elsewhere, .moving:
            // A request another replica forwarded goes back to it at once: it learns where
            // the cell went sooner than this one may, and holds the request meanwhile.
            if !ClusterForwarder.forwardedBy(request).isEmpty { return reply.send(Self.cellMoving.response()) }
            guard waitedMilliseconds < Self.movingCellWaitMilliseconds, let scheduler else {
                return reply.send(Self.cellMoving.response())
            }
            let request = request
            _ = scheduler.schedule(after: Self.movingCellPollMilliseconds) { [weak self] in
                self?.serveInCell(route, request, reply, waitedMilliseconds: waitedMilliseconds + Self.movingCellPollMilliseconds)
            }
        }
    }

    /// What a submission to a cell served here reads first, in one round trip: its
    /// `Idempotency-Key` when this replica does not know it, and which of the tasks of other
    /// cells it depends on exist (`refuseUnknownRemoteDependencies`); nothing when it needs
    /// neither.
    ///
    /// The key may have been used in another cell. Keys are the cluster's: the same key and
    /// body name the same queue, hence the same cell, whose owner knows the key (it loads the
    /// cell's keys as it opens it); but the same key with another body may name another cell,
    /// which must answer 422 too. So the key is read from `cell_idempotency_keys` (only a key
    /// unknown here), and the answer replays or refuses as the first use's cell would.
    /// (Hashing the key to a cell of its own instead would need a second cell's commit, of the
    /// key, before the creation in the queue's cell.) A read that failed decides nothing for the
    /// key: the cell's own keys are known here, and a commit that would overwrite a live key of
    /// another request fails; the dependencies are then answered as the database is.
    private func preReadSubmission(_ route: Route, _ request: HTTPRequest, in cell: Cell, _ host: CellHost,
                                   then serve: @escaping (Result<Set<TaskID>, PGError>) -> Void) {
        let key = (try? IdempotencyKeys.key(of: request)).flatMap { idempotency.record(for: $0) == nil ? $0 : nil }
        let dependencies = Self.tasksOfOtherCells(namedBy: request, route, than: cell)
        var queries: [PGQuery] = []
        if let key { queries.append(CellSchema.findKey(key, at: scheduler?.wallClock ?? 0)) }
        if !dependencies.isEmpty { queries.append(CellReads.existing(dependencies)) }
        guard !queries.isEmpty else { return serve(.success([])) }
        host.read(queries) { [weak self] result in
            guard let self else { return }
            if key != nil, case .success(let results) = result {
                idempotency.absorb(CellSchema.keys(of: results[0]), expired: [])
            }
            serve(dependencies.isEmpty ? .success([]) : result.map { CellReads.existing($0[$0.count - 1]) })
        }
    }

    /// The task ids of other cells than `cell` a submission's body names as dependencies (of
    /// the task, or of the workflow's tasks), as its handler reads them; a workflow's sibling
    /// key that reads as an id too is looked up in vain.
    private static func tasksOfOtherCells(namedBy request: HTTPRequest, _ route: Route, than cell: Cell) -> [TaskID] {
        guard let body = (try? JSONParser.parse(request.body))?.objectValue else { return [] }
        let specs = route.placement == .submittedWorkflow || route.placement == .submittedTasks
            ? (body["tasks"]?.arrayValue ?? []).compactMap(\.objectValue) : [body]
        var ids: [TaskID] = []
        for spec in specs {
            for dependency in spec["dependencies"]?.arrayValue ?? [] {
                if let id = dependency.stringValue.flatMap(TaskID.init), Cell(id.cell) != cell { ids.append(id) }
            }
        }
        return ids
    }

    /// The cell a request names, or nil for one that reads every cell. A request whose id does
    /// not parse, or names no cell of the cluster, goes to any cell here: its handler answers
    /// the 404.
    private func cell(of route: Route, _ request: HTTPRequest, _ host: CellHost) -> Cell? {
        switch route.placement {
        case .none, .everyCell:
            return nil
        case .task, .workflow, .schedule:
            guard let id = TaskID(request.parameters["id"] ?? ""), Int(id.cell) < host.layout.count else { return nil }
            return Cell(id.cell)
        case .queue:
            return host.cell(ofQueue: request.parameters["name"] ?? "")
        case .submittedTask:
            let queue = (try? JSONParser.parse(request.body))?.objectValue?["queue"]?.stringValue
            return host.cell(ofQueue: queue ?? "default")
        case .submittedWorkflow:
            let first = (try? JSONParser.parse(request.body))?.objectValue?["tasks"]?.arrayValue?.first
            return host.cell(ofQueue: first?.objectValue?["queue"]?.stringValue ?? "default")
        case .submittedTasks, .reportedTasks:
            // A batch of submissions none of which names a cell goes where a task without a
            // queue would: its Idempotency-Key is then read first, as any submission's is.
            let named = batchItemCells(route, request, host)?.first { $0 != nil } ?? nil
            return named ?? (route.placement == .submittedTasks ? host.cell(ofQueue: "default") : nil)
        case .submittedSchedule:
            let body = (try? JSONParser.parse(request.body))?.objectValue
            let task = body?["task"]?.objectValue ?? body?["workflow"]?.objectValue?["tasks"]?.arrayValue?.first?.objectValue
            return host.cell(ofQueue: task?["queue"]?.stringValue ?? "default")
        }
    }
}

extension TaskloopApplication {
    /// The cell of each item of a batch request's body (nil for an item that names none: not
    /// an object, an id of no cell), or nil for a body that is not a batch.
    private func batchItemCells(_ route: Route, _ request: HTTPRequest, _ host: CellHost) -> [Cell?]? {
        let member = route.placement == .submittedTasks ? "tasks" : "reports"
        guard let items = (try? JSONParser.parse(request.body))?.objectValue?[member]?.arrayValue else { return nil }
        return batchItemCells(items, member: member, host)
    }

    private func batchItemCells(_ items: [JSONValue], member: String, _ host: CellHost) -> [Cell?] {
        items.map { item in
            guard let object = item.objectValue else { return nil }
            if member == "tasks" { return host.cell(ofQueue: object["queue"]?.stringValue ?? "default") }
            guard let id = object["id"]?.stringValue.flatMap(TaskID.init), Int(id.cell) < host.layout.count else { return nil }
            return Cell(id.cell)
        }
    }

    /// A batch whose items belong to several cells: each cell's items go on as a batch of
    /// their own through `serveInCell` (served by its engine here, forwarded to its owner, or
    /// held while the cell moves), naming their indices in the client's batch
    /// (`batchIndicesField`), and the parts' answers are merged in the client's order. Each part
    /// is one commit of its cell and answers after it. A part refused whole (its cell moving
    /// past the wait, an owner that cannot be reached) answers each of its items with that
    /// problem, not the whole batch. Items that name no cell go with the first part, whose
    /// handler answers them. Returns false when the batch is one cell's (or not a batch: its
    /// handler answers why), to be served as any request of that cell.
    ///
    /// An `Idempotency-Key` names one creation kept in one cell: a keyed batch spanning cells is
    /// 422 `idempotency_key_spans_cells` (send each cell's part under a key of its own).
    func splitBatchAcrossCells(_ route: Route, _ request: HTTPRequest, _ reply: Reply) -> Bool {
        let member = route.placement == .submittedTasks ? "tasks" : "reports"
        // A request refused whole is refused here, as its handler would: its parts would each
        // look whole (an unknown member of the body is not copied into them).
        let items: [JSONValue]
        do {
            items = try batchItems(request, member: member)
        } catch {
            reply.send(error.response())
            return true
        }
        guard let host = cellHost else { return false }
        let cells = batchItemCells(items, member: member, host)
        guard let firstCell = cells.first(where: { $0 != nil }) ?? nil else { return false }
        var parts: [(cell: Cell, positions: [Int])] = []
        var partOfCell: [Cell: Int] = [:]
        for (position, cell) in cells.enumerated() {
            let cell = cell ?? firstCell
            if let part = partOfCell[cell] { parts[part].positions.append(position); continue }
            partOfCell[cell] = parts.count
            parts.append((cell, [position]))
        }
        guard parts.count > 1 else { return false }
        if !request.headers.values(for: "Idempotency-Key").isEmpty {
            reply.send(APIProblem(.unprocessableContent,
                                  detail: "This batch's tasks belong to \(parts.count) cells, and an Idempotency-Key is kept by one; "
                                      + "send each cell's tasks (by queue) under a key of its own, or the batch without a key.",
                                  code: "idempotency_key_spans_cells").response())
            return true
        }
        var answers = [HTTPResponse?](repeating: nil, count: parts.count)
        var waiting = parts.count
        for (number, part) in parts.enumerated() {
            var json = JSONWriter(capacity: request.body.count / parts.count + 64)
            json.beginObject()
            json.key(member)
            json.beginArray()
            for position in part.positions { json.value(items[position]) }
            json.endArray()
            json.endObject()
            var partRequest = request
            partRequest.body = json.bytes
            partRequest.headers.set(Self.batchIndicesField, part.positions.map(String.init).joined(separator: ","))
            var partReply = reply
            partReply.takesPart = { response in
                answers[number] = response
                waiting -= 1
                guard waiting == 0 else { return }
                reply.sendMadeElsewhere(.json(.multiStatus, Self.merge(answers.map { $0! }, of: parts.map(\.positions), count: cells.count)))
            }
            serveInCell(route, partRequest, partReply)
        }
        return true
    }

    /// The client's 207 from its parts' answers, each item at its index.
    private static func merge(_ answers: [HTTPResponse], of parts: [[Int]], count: Int) -> [UInt8] {
        var results = [JSONValue](repeating: .null, count: count)
        for (answer, positions) in zip(answers, parts) {
            if answer.status.code == 207, let answered = (try? JSONParser.parse(answer.body))?.objectValue?["results"]?.arrayValue,
               answered.count == positions.count {
                for (result, position) in zip(answered, positions) { results[position] = result }
                continue
            }
            let problem = (try? JSONParser.parse(answer.body)).flatMap { $0.objectValue == nil ? nil : $0 }
                ?? (try? JSONParser.parse(HTTPProblem(answer.status, detail: "This item's cell answered \(answer.status.code).").response().body))
                ?? .null
            for position in positions {
                results[position] = .object(["status": .int(Int64(answer.status.code)), "problem": problem])
            }
        }
        var json = JSONWriter(capacity: answers.reduce(16) { $0 + $1.body.count })
        json.beginObject()
        json.key(static: "results")
        json.value(.array(results))
        json.endObject()
        return json.bytes
    }
}

/// Renders the events of a cell's settled batches as the cluster's events table keeps them
/// (without the id, which the commit's transaction gives), as the event log would show them.
/// A task's event names its workflow even when that is another cell's (`?workflow=` and a
/// webhook's `workflow` select by it). Progress events of one task are coalesced as the
/// single server's `EventLog` does: one per `EventLog.progressIntervalMilliseconds`, the latest
/// made once the interval has passed (`onHeldProgress`), if the task still runs there.
///
/// Threading: loop thread only.
final class ClusterEventRenderer {
    private var mapping = EventMapping()
    private let scheduler: EngineScheduler
    /// Each task whose progress was made in the last interval: when that interval ends, and
    /// whether a later report waits for it.
    private var progressWindows: [TaskID: (ends: ScheduledAction, held: Bool)] = [:]
    /// A held progress event of `engine`'s cell, to commit with its next batch.
    var onHeldProgress: ((Engine, [ClusterEvents.Written]) -> Void)?

    init(scheduler: EngineScheduler) {
        self.scheduler = scheduler
    }

    func render(_ events: [EngineEvent], of engine: Engine, at now: Int64) -> [ClusterEvents.Written] {
        var written: [ClusterEvents.Written] = []
        mapping.map(events) { kind, task, state, workflow, queue in
            written.append(Self.written(StreamEvent(seq: 0, kind: kind, time: now, task: task, state: state, workflow: workflow,
                                                    queue: queue, batch: 0), of: engine))
        } progressed: { task in
            if let progress = progressed(task, of: engine, at: now) { written.append(progress) }
        } leftRunning: { task in
            progressWindows.removeValue(forKey: task.id)?.ends.cancel()
        } scheduleChanged: { schedule, deleted in
            written.append(ClusterEvents.Written(time: now, type: EventKind.scheduleUpdated.rawValue, task: nil, workflow: nil, queue: nil,
                                                 schedule: schedule.id.description,
                                                 data: StreamEvent.scheduleData(seq: nil, time: now, schedule: schedule.moment(deleted: deleted),
                                                                                in: engine)))
        }
        return written
    }

    private static func written(_ event: StreamEvent, of engine: Engine) -> ClusterEvents.Written {
        if event.workflowID == nil { event.workflowID = event.task.flatMap(engine.workflowID(of:)) }
        return ClusterEvents.Written(time: event.time, type: event.kind.rawValue, task: event.taskID?.description,
                                     workflow: event.workflowID?.description, queue: event.queueName,
                                     schedule: event.scheduleID?.description, data: event.render(seq: nil))
    }

    /// The progress event to make now, or nil while the task's interval lasts (held until it ends).
    private func progressed(_ task: TaskRecord, of engine: Engine, at now: Int64) -> ClusterEvents.Written? {
        if progressWindows[task.id] != nil {
            progressWindows[task.id]?.held = true
            return nil
        }
        openWindow(for: task, of: engine)
        return Self.written(StreamEvent(seq: 0, kind: .taskProgress, time: now, task: task, state: task.state, batch: 0), of: engine)
    }

    private func openWindow(for task: TaskRecord, of engine: Engine) {
        let id = task.id
        let ends = scheduler.schedule(after: EventLog.progressIntervalMilliseconds) { [weak self, weak engine, weak task] in
            guard let self, let window = progressWindows.removeValue(forKey: id) else { return }
            // A record its engine no longer holds (the cell closed or was loaded again) says nothing more.
            guard window.held, let task, task.state == .running, let engine, engine.task(id) === task else { return }
            openWindow(for: task, of: engine)
            let event = StreamEvent(seq: 0, kind: .taskProgress, time: scheduler.wallClock, task: task, state: task.state, batch: 0)
            onHeldProgress?(engine, [Self.written(event, of: engine)])
        }
        progressWindows[id] = (ends, false)
    }
}
