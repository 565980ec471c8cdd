import TaskloopTime

/// Schedules (cron): each makes a run (a task or a workflow, from its template) at every slot
/// of its cron expression in its zone.
///
/// Each active schedule has one entry in the wall-clock heap (`WallClockTimers`), at its next
/// slot plus that slot's jitter, behind the engine's one wall timer: firing a slot is a heap
/// pop, one search for the following slot and a heap push, never a parse. A slot is dealt with
/// exactly once: firing it makes the run's tasks and moves `lastSlot` past it in the same
/// settled batch, which a store writes in one commit, so a restart (or a cell's next owner)
/// goes on after `lastSlot` and never fires the slot again.
///
/// Slots that passed unseen (the server was down, its loop stalled or the wall clock jumped
/// forward) are dealt with by `catchup`: none runs, the newest runs (`latest`), or the newest
/// `maxCatchup` run oldest first (`all`); the rest count as missed. A slot counts as passed
/// unseen when the slot after it is also certainly due (its time plus the most jitter it may
/// get has come). Slots passed while paused are never caught up: resuming moves `lastSlot` to now.
///
/// Threading: engine thread only, as the rest of the engine.
extension Engine {
    // MARK: client calls

    /// Makes a schedule. Throws, changing nothing, when a field (or the template's) breaks a rule.
    @discardableResult
    public func createSchedule(_ spec: ScheduleSpec) throws(EngineError) -> ScheduleRecord {
        guard schedules.count < configuration.maxSchedules else {
            throw EngineError(.tooManySchedules,
                              "The server already holds \(schedules.count) schedules (limit \(configuration.maxSchedules)).")
        }
        let cron = try check(spec)
        return settling {
            let now = scheduler.wallClock
            let schedule = ScheduleRecord(id: ids.next(wallClockMilliseconds: now), spec: spec, cron: cron, createdAt: now,
                                          lastSlot: now)
            schedules[schedule.id] = schedule
            arm(schedule)
            emit(.scheduleChanged(schedule))
            return schedule
        }
    }

    /// Replaces a schedule's settings (`PATCH` merges the client's fields into the current ones).
    /// A new cron expression or zone, or a resume, counts from now: slots before it are not
    /// caught up.
    @discardableResult
    public func updateSchedule(_ id: TaskID, to spec: ScheduleSpec) throws(EngineError) -> ScheduleRecord {
        guard let schedule = schedules[id] else { throw EngineError(.notFound, "No schedule \(id).") }
        let cron = try check(spec)
        return settling {
            let now = scheduler.wallClock
            let old = schedule.spec
            if old.cron != spec.cron || old.timezone != spec.timezone || (old.paused && !spec.paused) {
                schedule.lastSlot = max(schedule.lastSlot, now)
            }
            schedule.spec = spec
            schedule.cron = cron
            schedule.updatedAt = now
            arm(schedule)
            emit(.scheduleChanged(schedule))
            return schedule
        }
    }

    /// Deletes a schedule: it fires no more; the tasks its runs made are left alone.
    @discardableResult
    public func deleteSchedule(_ id: TaskID) throws(EngineError) -> ScheduleRecord {
        guard let schedule = schedules.removeValue(forKey: id) else { throw EngineError(.notFound, "No schedule \(id).") }
        return settling {
            schedule.deleted = true
            emit(.scheduleDeleted(schedule))
            return schedule
        }
    }

    /// One run now (its slot is now, unjittered), paused or not, obeying `overlap`: with
    /// `skip` and the previous run unfinished it is refused (`previous_run_unfinished`) and
    /// nothing changes; with `cancel_previous` that run is cancelled once the new one is made,
    /// so a submission the moment refuses (a held unique key, the unfinished-task limit) throws
    /// as it would, having changed nothing. `lastSlot` does not move: the cron slots go on as before.
    @discardableResult
    public func triggerSchedule(_ id: TaskID) throws(EngineError) -> ScheduleRun {
        guard let schedule = schedules[id] else { throw EngineError(.notFound, "No schedule \(id).") }
        let unfinished = schedule.currentRun.flatMap { isUnfinished($0) ? $0 : nil }
        if schedule.spec.overlap == .skip, let unfinished {
            throw EngineError(.previousRunUnfinished, "The schedule's previous run \(unfinished.id!) has not finished (overlap skip).",
                              existing: unfinished.id)
        }
        return try settling { () throws(EngineError) -> ScheduleRun in
            let now = scheduler.wallClock
            let wasDispatching = dispatching
            dispatching = true
            defer {
                dispatching = wasDispatching
                dispatch()
            }
            let run = try makeRun(of: schedule, slot: now, at: now)
            if schedule.spec.overlap == .cancelPrevious, let unfinished { cancel(unfinished) }
            schedule.record(run)
            schedule.firedCount += 1
            scheduleTotals.fired += 1
            emit(.scheduleChanged(schedule))
            return run
        }
    }

    public func schedule(_ id: TaskID) -> ScheduleRecord? { schedules[id] }

    /// Every schedule, oldest first.
    public var allSchedules: [ScheduleRecord] { schedules.values.sorted { $0.id < $1.id } }

    public var scheduleCount: Int { schedules.count }

    /// The next `count` slots the schedule fires at (unjittered); none while paused or once deleted.
    public func nextRuns(of schedule: ScheduleRecord, count: Int = 5) -> [Int64] {
        schedule.moment().nextRuns(count: count)
    }

    /// A run's state as `last_runs` shows it: its task's or workflow's now, or the one it ended
    /// with once retention forgot it; `skipped` for a slot skipped or refused.
    public func state(of run: ScheduleRun) -> String {
        switch run.target {
        case .none: return "skipped"
        case .task(let id): return (tasks[id]?.state ?? run.endedAs ?? .cancelled).rawValue
        case .workflow(let id): return (workflows[id]?.state ?? run.endedAs ?? .cancelled).rawValue
        }
    }

    // MARK: checks

    /// Checks a spec's fields and its template; returns its parsed cron schedule.
    func check(_ spec: ScheduleSpec) throws(EngineError) -> CronSchedule {
        guard !spec.name.isEmpty, spec.name.utf8.count <= ScheduleSpec.maxNameLength else {
            throw EngineError(.invalid, "name must be 1 to \(ScheduleSpec.maxNameLength) bytes.", field: "name")
        }
        let expression: CronExpression
        do { expression = try CronExpression(spec.cron) } catch {
            throw EngineError(.invalid, "Invalid cron expression: \(error.description).", field: "cron")
        }
        guard let zone = configuration.zones.loaded(named: spec.timezone) else {
            let reason = TimeZoneRules.isValidName(spec.timezone) ? "the zone \(spec.timezone) is not loaded"
                : TimeZoneError.invalidName(spec.timezone).description
            throw EngineError(.invalid, "Invalid timezone: \(reason).", field: "timezone")
        }
        guard ScheduleSpec.maxCatchupRange.contains(spec.maxCatchup) else {
            throw EngineError(.invalid, "max_catchup must be from \(ScheduleSpec.maxCatchupRange.lowerBound) to "
                              + "\(ScheduleSpec.maxCatchupRange.upperBound).", field: "max_catchup")
        }
        guard spec.jitterMilliseconds <= ScheduleSpec.maxJitterMilliseconds else {
            throw EngineError(.invalid, "jitter_ms must be from 0 to \(ScheduleSpec.maxJitterMilliseconds).", field: "jitter_ms")
        }
        if let startAt = spec.startAt, let endAt = spec.endAt, endAt < startAt {
            throw EngineError(.invalid, "end_at comes before start_at.", field: "end_at")
        }
        try check(spec.template)
        return CronSchedule(expression: expression, zone: zone)
    }

    /// A template is checked as a submission of it would be, except against the state of the
    /// moment (held unique keys, limits): those decide each run. It names no existing task (a
    /// run cannot depend on a task of the day it was written) and no absolute time.
    func check(_ template: ScheduleTemplate) throws(EngineError) {
        switch template {
        case .task(let spec):
            try checkTemplateFields(spec, at: "task.")
            _ = try check(spec, at: "task.", inThisCell: false)
            try checkOutputReferences(in: spec.params, naming: [], at: "task.")
            if configuration.cells != nil { try checkCell(ofQueue: spec.queue, field: "task.queue") }
        case .workflow(_, let members):
            guard !members.isEmpty else {
                throw EngineError(.invalid, "A workflow needs at least one task.", field: "workflow.tasks")
            }
            for (index, member) in members.enumerated() { try checkTemplateFields(member.spec, at: "workflow.tasks[\(index)].") }
            do {
                // As members of other cells: a template makes no queue until it runs.
                _ = try check(members.map { ($0.key, $0.spec) }, memberCells: members.map { _ in UInt16.max })
            } catch {
                var error = error
                error.field = error.field.map { "workflow.\($0)" }
                throw error
            }
            if configuration.cells != nil { try checkCell(ofQueue: template.queue, field: "workflow.tasks[0].queue") }
        }
    }

    private func checkTemplateFields(_ spec: TaskSpec, at prefix: String) throws(EngineError) {
        for (position, reference) in spec.dependencies.enumerated() {
            if case .task = reference {
                throw EngineError(.invalid, "A schedule's template cannot depend on an existing task.",
                                  field: "\(prefix)dependencies[\(position)]")
            }
        }
        if case .at? = spec.runAt {
            throw EngineError(.invalid, "A schedule's template gives delay_ms, not run_at: each run is at its own time.",
                              field: "\(prefix)run_at")
        }
        if case .at? = spec.expiry {
            throw EngineError(.invalid, "A schedule's template gives ttl_ms, not expires_at: each run is at its own time.",
                              field: "\(prefix)expires_at")
        }
        if let window = spec.uniqueForMilliseconds, window > configuration.maxUniqueForMilliseconds {
            throw EngineError(.invalid, "unique_for_ms must be from 1 to \(configuration.maxUniqueForMilliseconds).",
                              field: "\(prefix)unique_for_ms")
        }
    }

    // MARK: firing

    /// Files the schedule's next slot in the wall-clock heap (its old entry goes stale), or
    /// none while paused, deleted or past `end_at`.
    func arm(_ schedule: ScheduleRecord) {
        schedule.generation &+= 1
        wallTimers.dropStaleScheduleEntries(liveCount: schedules.count)
        guard !schedule.spec.paused, !schedule.deleted, let slot = schedule.slot(after: schedule.lastSlot) else { return }
        wallTimers.insert(schedule, slot: slot, at: slot + schedule.jitter(of: slot))
        armWallTimer()
    }

    /// The entry of `slot` came due (`fireDueWallTimers`, dispatch held).
    func fire(_ schedule: ScheduleRecord, slot: Int64, at wallClock: Int64) {
        if let following = schedule.slot(after: slot), following + Int64(schedule.spec.jitterMilliseconds) <= wallClock {
            catchUp(schedule, at: wallClock)
        } else {
            schedule.lastSlot = slot
            run(schedule, slot: slot, at: wallClock)
        }
        arm(schedule)
        emit(.scheduleChanged(schedule))
    }

    /// Deals with the slots after `lastSlot` that are certainly due at `wallClock` (their time
    /// plus the most jitter they may get has come) by the `catchup` rule. False when there were none.
    @discardableResult
    func catchUp(_ schedule: ScheduleRecord, at wallClock: Int64) -> Bool {
        let spec = schedule.spec
        var after = schedule.lastSlot
        if let startAt = spec.startAt { after = max(after, startAt - 1) }
        var through = wallClock - Int64(spec.jitterMilliseconds)
        if let endAt = spec.endAt { through = min(through, endAt) }
        guard through > after else { return false }
        let limit = spec.catchup == .all ? spec.maxCatchup : 1
        let newest = schedule.cron.slots(after: Self.seconds(after), through: Self.seconds(through), limit: limit).map { $0 * 1000 }
        guard let last = newest.last else { return false }
        let passed = Self.countSlots(of: schedule.cron, after: Self.seconds(after), through: last / 1000,
                                     cap: Self.countedMissedSlots)
        let runs = spec.catchup == .none ? [] : newest
        let missed = UInt64(max(0, passed - runs.count))
        schedule.missedCount += missed
        scheduleTotals.missed += missed
        schedule.lastSlot = last
        for slot in runs { run(schedule, slot: slot, at: wallClock) }
        return true
    }

    /// Missed slots are counted one by one up to this many per catch-up (a schedule firing every
    /// second, down for a year, counts this many).
    static let countedMissedSlots = 100_000

    static func countSlots(of cron: CronSchedule, after: Int64, through: Int64, cap: Int) -> Int {
        var count = 0
        var cursor = after
        while count < cap, let slot = cron.next(after: cursor), slot <= through {
            count += 1
            cursor = slot
        }
        return count
    }

    static func seconds(_ milliseconds: Int64) -> Int64 {
        milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
    }

    /// One slot's run, by `overlap`; dispatch must be held by the caller.
    func run(_ schedule: ScheduleRecord, slot: Int64, at wallClock: Int64) {
        if let current = schedule.currentRun, isUnfinished(current) {
            switch schedule.spec.overlap {
            case .skip:
                schedule.record(ScheduleRun(slot: slot, at: wallClock, target: .none))
                schedule.skippedCount += 1
                scheduleTotals.skipped += 1
                return
            case .allow:
                break
            case .cancelPrevious:
                cancel(current)
            }
        }
        do {
            schedule.record(try makeRun(of: schedule, slot: slot, at: wallClock))
            schedule.firedCount += 1
            scheduleTotals.fired += 1
        } catch {
            // The moment's state refused it (the unfinished-task limit, a held unique key).
            schedule.record(ScheduleRun(slot: slot, at: wallClock, target: .none, error: error.message))
            schedule.skippedCount += 1
            scheduleTotals.skipped += 1
        }
    }

    /// Submits the template as the run of `slot`; throws, having made nothing, as a submission would.
    func makeRun(of schedule: ScheduleRecord, slot: Int64, at wallClock: Int64) throws(EngineError) -> ScheduleRun {
        let mark = ScheduleSlot(id: schedule.id, slot: slot)
        switch schedule.spec.template {
        case .task(var spec):
            spec.schedule = mark
            let record = try submitSettling(spec)
            return ScheduleRun(slot: slot, at: wallClock, target: .task(record.id))
        case .workflow(let name, let members):
            let workflow = try submitWorkflowSettling(name: name, tasks: members.map { member in
                var spec = member.spec
                spec.schedule = mark
                return (member.key, spec)
            }, schedule: mark)
            return ScheduleRun(slot: slot, at: wallClock, target: .workflow(workflow.id))
        }
    }

    func isUnfinished(_ target: ScheduleRun.Target) -> Bool {
        switch target {
        case .task(let id): tasks[id].map { !$0.state.isTerminal } ?? false
        case .workflow(let id): workflows[id].map { !$0.state.isTerminal } ?? false
        case .none: false
        }
    }

    /// `cancel_previous`: as `DELETE /tasks/{id}` or a workflow's cancel would.
    func cancel(_ target: ScheduleRun.Target) {
        switch target {
        case .task(let id):
            if let record = tasks[id], !record.state.isTerminal { _ = requestCancel(record) }
        case .workflow(let id):
            _ = try? cancelWorkflow(id)
        case .none:
            break
        }
    }

    /// A task a schedule's run made has ended (`settle`): the run's entry keeps its state, for
    /// when retention forgets the task. O(1): twenty entries at most.
    func scheduleRunEnded(_ record: TaskRecord, run mark: ScheduleSlot) {
        guard let schedule = schedules[mark.id] else { return }
        let target: ScheduleRun.Target
        let ended: TaskState
        if let workflow = record.workflow {
            guard workflow.state.isTerminal else { return }
            target = .workflow(workflow.id)
            ended = workflow.state
        } else {
            target = .task(record.id)
            ended = record.state
        }
        guard let index = schedule.lastRuns.lastIndex(where: { $0.target == target }) else { return }
        schedule.lastRuns[index].endedAs = ended
        emit(.scheduleChanged(schedule))
    }

    // MARK: persistence

    public func snapshot(of schedule: ScheduleRecord) -> ScheduleSnapshot {
        ScheduleSnapshot(id: schedule.id, spec: schedule.spec, createdAt: schedule.createdAt, updatedAt: schedule.updatedAt,
                         lastSlot: schedule.lastSlot, lastRuns: schedule.lastRuns, firedCount: schedule.firedCount,
                         skippedCount: schedule.skippedCount, missedCount: schedule.missedCount,
                         currentRun: schedule.currentRun)
    }

    /// Parses what a store kept; throws, having changed nothing, for a cron expression this
    /// server cannot read or a zone not loaded (`TimeZoneCatalog.load(zonesOf:)` loads them).
    func parsedSchedules(_ saved: [ScheduleSnapshot]) throws(EngineError) -> [(ScheduleSnapshot, CronSchedule)] {
        var parsed: [(ScheduleSnapshot, CronSchedule)] = []
        parsed.reserveCapacity(saved.count)
        for snapshot in saved {
            let expression: CronExpression
            do { expression = try CronExpression(snapshot.spec.cron) } catch {
                throw EngineError(.invalid, "Schedule \(snapshot.id) cannot be restored: \(error).")
            }
            guard let zone = configuration.zones.loaded(named: snapshot.spec.timezone) else {
                throw EngineError(.invalid, "Schedule \(snapshot.id) cannot be restored: its zone \(snapshot.spec.timezone) is not loaded.")
            }
            parsed.append((snapshot, CronSchedule(expression: expression, zone: zone)))
        }
        return parsed
    }

    /// After a restart (inside `restore`, dispatch held, the tasks restored): the schedules as
    /// kept, the slots they missed while down dealt with by their `catchup`, and their next
    /// slots filed.
    func restoreSchedules(_ parsed: [(ScheduleSnapshot, CronSchedule)]) {
        let wallClock = scheduler.wallClock
        for (saved, cron) in parsed {
            let schedule = ScheduleRecord(id: saved.id, spec: saved.spec, cron: cron, createdAt: saved.createdAt,
                                          lastSlot: saved.lastSlot)
            schedule.updatedAt = saved.updatedAt
            schedule.lastRuns = saved.lastRuns
            schedule.currentRun = saved.currentRun
            schedule.firedCount = saved.firedCount
            schedule.skippedCount = saved.skippedCount
            schedule.missedCount = saved.missedCount
            schedules[schedule.id] = schedule
            ids.continueAfter(saved.id)
        }
        for (saved, _) in parsed {
            guard let schedule = schedules[saved.id] else { continue }
            if !schedule.spec.paused && catchUp(schedule, at: wallClock) { emit(.scheduleChanged(schedule)) }
            arm(schedule)
        }
    }
}

/// Runs schedules made, for metrics: totals over every schedule (one series each, whatever
/// the number of schedules).
public struct ScheduleTotals: Sendable, Equatable {
    /// Runs made: slots fired, catch-up runs, triggers.
    public var fired: UInt64 = 0
    /// Slots passed unseen that `catchup` did not run.
    public var missed: UInt64 = 0
    /// Slots skipped by `overlap` (or whose run the moment's state refused).
    public var skipped: UInt64 = 0

    public init() {}
}

extension ScheduleRun.Target {
    /// The task's or workflow's id.
    public var id: TaskID? {
        switch self {
        case .task(let id), .workflow(let id): id
        case .none: nil
        }
    }
}

extension TimeZoneCatalog {
    /// Loads the zones of schedules a store kept, before an engine restores them (at start-up,
    /// or off the loop as a cell opens): blocks on tzdata files. Throws for a zone this
    /// server cannot read (its tzdata lost it), naming the schedule.
    public func load(zonesOf schedules: [ScheduleSnapshot]) throws(EngineError) {
        for schedule in schedules {
            do { _ = try load(named: schedule.spec.timezone) } catch {
                throw EngineError(.invalid, "Schedule \(schedule.id) cannot be restored: \(error).")
            }
        }
    }

    /// Whether every zone those schedules name is loaded already (no file is read).
    public func hasLoaded(zonesOf schedules: [ScheduleSnapshot]) -> Bool {
        schedules.allSatisfy { loaded(named: $0.spec.timezone) != nil }
    }
}
