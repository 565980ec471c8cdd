import TaskloopJSON

/// Dependencies across cells (docs/SCALING.md, "Under way: cells"). An engine configured with
/// `EngineConfiguration.cells` holds the tasks of its own cell's queues only; a task may still
/// depend on a task of another cell. The rules stay the engine's own, on both sides:
///
/// - The dependent's cell links the dependent to a stand-in (`RemoteDependency`) for the task it
///   does not hold, and asks that task's cell to report its end (`CellMessage.watch`). When the
///   end arrives, the stand-in's waiting dependents are released or cancelled by the same code
///   as a local dependency's (`release`, `cancel(cascade:)`).
/// - The dependency's cell keeps the watching cells of the task (`watchers(of:)`, kept with the
///   record, so they survive restarts) and tells each of them when the task ends (`settle`) and
///   when a retry brings it back (`reopenOne`); the watcher then brings back the tasks that end
///   had cancelled, as a local retry does (`bringBack`).
///
/// Stand-ins are not tasks: never listed, counted, evicted or kept. One lives while a task of
/// this engine names its dependency; after a restart they are made again, asking again (a
/// dependency's cell answers a repeated watch with the end it already reported, and the
/// stand-in's epoch makes the second copy harmless).
final class RemoteDependency {
    enum Knowledge {
        /// Asked (`watch` sent); no answer yet.
        case asked
        /// A reopening said it runs again.
        case unfinished
        case ended(TaskState)
        /// Its cell holds no such task.
        case missing
    }

    let id: TaskID
    var knowledge = Knowledge.asked
    /// Its result, once `ended` brought it: tasks linked later take their inputs from it.
    var result: JSONValue?
    /// The dependency's `reopenings` when the last message applied was sent; nil before any.
    var epoch: UInt32?
    /// Tasks waiting for its end (some may have ended meanwhile, as on a task's list).
    var dependents: [TaskRecord] = []
    /// Tasks of this engine that name it.
    var references = 0

    init(id: TaskID) {
        self.id = id
    }

    var isWaitedOn: Bool {
        switch knowledge {
        case .asked, .unfinished: true
        case .ended, .missing: false
        }
    }

    /// True when `record` waits for it.
    func holds(_ record: TaskRecord) -> Bool {
        isWaitedOn && dependents.contains { $0 === record }
    }
}

extension Engine {
    /// Applies a message from another cell, as one settled call; the messages it causes leave in
    /// its batch. Each message is to be applied once, in the order its sender sent it.
    public func apply(_ message: CellMessage) {
        precondition(message.to == cell, "message \(message) reached cell \(cell.map(String.init) ?? "none")")
        settling {
            let wasDispatching = dispatching
            dispatching = true
            switch message.kind {
            case .watch: watch(message)
            case .ended, .missing: dependencyEnded(message)
            case .reopened: dependencyReopened(message)
            case .members, .memberChanged, .cancelMembers, .retryMembers: applyWorkflowMessage(message)
            }
            dispatching = wasDispatching
            dispatch()
        }
    }

    /// The stand-in of dependency `id` for one more task naming it; a new one asks `id`'s cell.
    func referenceRemote(_ id: TaskID) -> RemoteDependency {
        let standIn: RemoteDependency
        if let existing = remoteDependencies[id] {
            standIn = existing
        } else {
            standIn = RemoteDependency(id: id)
            remoteDependencies[id] = standIn
            emit(.messageSent(CellMessage(.watch, from: cell!, to: id.cell, dependency: id)))
        }
        standIn.references += 1
        return standIn
    }

    /// Makes `record` wait for a dependency in another cell, or applies what is known of its end.
    func link(_ record: TaskRecord, toRemote standIn: RemoteDependency) {
        switch standIn.knowledge {
        case .asked, .unfinished:
            record.blockingDependencies += 1
            standIn.dependents.append(record)
        case .ended(let state):
            if state == .succeeded || record.onDependencyFailure == .run {
                takeInputs(of: record, from: standIn.id, result: standIn.result)
            }
            link(record, toEnded: standIn.id, as: state)
            if !record.state.isTerminal { record.releasedBy.append(standIn.id) }
        case .missing:
            if !record.state.isTerminal { finish(record, as: .cancelled, error: .unknownDependency(standIn.id)) }
        }
    }

    /// A dependency of the list being checked that another cell holds: only its repetition is
    /// refused here (whether it exists is that cell's to say).
    func claimRemote(_ id: TaskID, field: () -> String) throws(EngineError) {
        if claimedRemote.stamp != duplicateStamp { claimedRemote = (duplicateStamp, []) }
        guard !claimedRemote.ids.contains(id) else {
            throw EngineError(.duplicateDependency, "Task \(id) is listed twice.", field: field())
        }
        claimedRemote.ids.append(id)
    }

    /// Refuses a queue another cell holds: whoever routed the call should have sent it there.
    func checkCell(ofQueue name: String, field: String) throws(EngineError) {
        guard let cells = configuration.cells else { return }
        let owner = cells.cellOfQueue(name)
        guard owner == cells.cell else {
            throw EngineError(.invalid, "Queue \(name) belongs to cell \(owner), not to this engine's cell \(cells.cell).",
                              field: field)
        }
    }

    /// Tells every cell watching `record` that it ended or was brought back.
    func tellWatchers(of record: TaskRecord, _ kind: CellMessage.Kind) {
        guard let cell, let watchers = watchersByTask[record.id] else { return }
        for watcher in watchers {
            emit(.messageSent(CellMessage(kind, from: cell, to: watcher, dependency: record.id, epoch: record.reopenings,
                                          state: kind == .ended ? record.state : nil,
                                          result: kind == .ended ? record.result : nil)))
        }
    }

    /// Cells whose tasks depend on `record`: each is told when it ends and when a retry brings it back.
    public func watchers(of record: TaskRecord) -> [UInt16] {
        watchersByTask[record.id] ?? []
    }

    /// A forgotten task is watched no more, and no longer holds the stand-ins of its dependencies in other cells.
    func dropRemoteReferences(of record: TaskRecord) {
        watchersByTask.removeValue(forKey: record.id)
        for id in record.dependencies {
            guard let standIn = remoteDependencies[id] else { continue }
            standIn.references -= 1
            if standIn.references == 0 { remoteDependencies.removeValue(forKey: id) }
        }
    }

    /// After `restore`: a stand-in for every dependency in another cell that a kept task names;
    /// each asks again. The unfinished tasks not released by one wait for it.
    func restoreRemoteDependencies(of records: [TaskRecord]) {
        for record in records {
            for id in record.dependencies where tasks[id] == nil && id.cell != cell {
                let standIn = referenceRemote(id)
                if !record.state.isTerminal && !record.releasedBy.contains(id) { link(record, toRemote: standIn) }
            }
        }
    }

    // MARK: applying messages

    private func watch(_ message: CellMessage) {
        guard let record = tasks[message.dependency] else {
            emit(.messageSent(CellMessage(.missing, from: cell!, to: message.from, dependency: message.dependency)))
            return
        }
        if !watchersByTask[record.id, default: []].contains(message.from) {
            watchersByTask[record.id, default: []].append(message.from)
            emit(.watched(record))
        }
        if record.state.isTerminal {
            emit(.messageSent(CellMessage(.ended, from: cell!, to: message.from, dependency: record.id,
                                          epoch: record.reopenings, state: record.state, result: record.result)))
        }
    }

    private func dependencyEnded(_ message: CellMessage) {
        guard let standIn = remoteDependencies[message.dependency] else { return }
        if let epoch = standIn.epoch {
            // Older than a reopening applied already, or a second answer to the same end.
            guard message.epoch >= epoch, message.epoch > epoch || standIn.isWaitedOn else { return }
        }
        standIn.epoch = message.epoch
        let dependents = standIn.dependents
        standIn.dependents = []
        var cascade: [(dependent: TaskRecord, error: TaskError)] = []
        if let state = message.state {
            standIn.knowledge = .ended(state)
            standIn.result = message.result
            release(dependents, endOf: standIn.id, as: state, result: message.result, cascade: &cascade)
            // Its end is not at hand after a restart: the record says it no longer holds these up.
            for dependent in dependents
            where !dependent.state.isTerminal && (state == .succeeded || dependent.onDependencyFailure == .run) {
                dependent.releasedBy.append(standIn.id)
                emit(.releasedByRetry(dependent))
            }
        } else {
            standIn.knowledge = .missing
            for dependent in dependents where !dependent.state.isTerminal {
                cascade.append((dependent, .unknownDependency(standIn.id)))
            }
        }
        cancel(cascade: &cascade)
    }

    private func dependencyReopened(_ message: CellMessage) {
        guard let standIn = remoteDependencies[message.dependency] else { return }
        if let epoch = standIn.epoch, message.epoch <= epoch { return }
        standIn.epoch = message.epoch
        standIn.knowledge = .unfinished
        standIn.result = nil
        // The retry was admitted in its own cell; what it brings back here is not refused.
        bringBack([], dependents: cancelledDependents(of: [standIn.id]), reopenedElsewhere: standIn.id)
    }
}
