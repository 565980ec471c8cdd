import TaskloopTime

/// Which run of which schedule made a task: `schedule: {id, slot}` in the API.
public struct ScheduleSlot: Hashable, Sendable {
    public var id: TaskID
    /// Wall-clock milliseconds the run was due (unjittered), or the moment of a trigger.
    public var slot: Int64

    public init(id: TaskID, slot: Int64) {
        self.id = id
        self.slot = slot
    }
}

/// What does a schedule do when a slot comes and its previous run has not finished.
public enum ScheduleOverlap: String, Sendable, CaseIterable {
    /// No run; the slot is recorded as skipped.
    case skip
    case allow
    /// The previous run is cancelled (as a client's cancel would), then the new one made.
    case cancelPrevious = "cancel_previous"
}

/// What a schedule does with slots that passed while the server was down (or its loop stalled).
public enum ScheduleCatchup: String, Sendable, CaseIterable {
    /// None runs; each counts as missed.
    case none
    /// One run, for the newest.
    case latest
    /// The newest `maxCatchup`, oldest first; the rest count as missed.
    case all
}

/// What a schedule's run submits: one task, or a workflow, as `POST /tasks` and
/// `POST /workflows` take them.
public enum ScheduleTemplate: Sendable, Equatable {
    case task(TaskSpec)
    case workflow(name: String?, tasks: [WorkflowMember])

    public struct WorkflowMember: Sendable, Equatable {
        public var key: String
        public var spec: TaskSpec

        public init(key: String, spec: TaskSpec) {
            self.key = key
            self.spec = spec
        }
    }

    /// The queue whose cell holds the schedule: the task's, or the workflow's first task's.
    public var queue: String {
        switch self {
        case .task(let spec): spec.queue
        case .workflow(_, let tasks): tasks.first?.spec.queue ?? "default"
        }
    }
}

/// Everything a client says about a schedule (`POST /schedules`); validated by the engine.
public struct ScheduleSpec: Sendable, Equatable {
    public var name: String
    public var cron: String
    public var timezone: String
    public var template: ScheduleTemplate
    public var overlap: ScheduleOverlap
    public var catchup: ScheduleCatchup
    public var maxCatchup: Int
    public var paused: Bool
    public var jitterMilliseconds: UInt64
    /// Wall-clock milliseconds bounding the slots, both inclusive.
    public var startAt: Int64?
    public var endAt: Int64?

    public init(name: String, cron: String, timezone: String = "UTC", template: ScheduleTemplate,
                overlap: ScheduleOverlap = .skip, catchup: ScheduleCatchup = .none, maxCatchup: Int = 10,
                paused: Bool = false, jitterMilliseconds: UInt64 = 0, startAt: Int64? = nil, endAt: Int64? = nil) {
        self.name = name
        self.cron = cron
        self.timezone = timezone
        self.template = template
        self.overlap = overlap
        self.catchup = catchup
        self.maxCatchup = maxCatchup
        self.paused = paused
        self.jitterMilliseconds = jitterMilliseconds
        self.startAt = startAt
        self.endAt = endAt
    }

    public static let maxCatchupRange = 1...1_000
    public static let maxJitterMilliseconds: UInt64 = 3_600_000
    public static let maxNameLength = 255
}

/// One run of a schedule, as `last_runs` shows it.
public struct ScheduleRun: Sendable, Equatable {
    public enum Target: Sendable, Equatable {
        case task(TaskID)
        case workflow(TaskID)
        /// Skipped by `overlap`, or refused (`error`).
        case none
    }

    /// Wall-clock milliseconds it was due (a trigger's: its moment).
    public var slot: Int64
    /// Wall-clock milliseconds it was made (or skipped).
    public var at: Int64
    public var target: Target
    /// Its task's or workflow's state once ended (kept for when retention has forgotten it);
    /// nil while unfinished: read from the task then. Skipped and refused runs have none.
    public var endedAs: TaskState?
    /// Why the run's submission was refused (the unfinished-task limit, a held unique key).
    public var error: String?

    public init(slot: Int64, at: Int64, target: Target, endedAs: TaskState? = nil, error: String? = nil) {
        self.slot = slot
        self.at = at
        self.target = target
        self.endedAs = endedAs
        self.error = error
    }
}

/// A schedule as the engine keeps it.
///
/// Threading: engine thread only.
public final class ScheduleRecord {
    public let id: TaskID
    public internal(set) var spec: ScheduleSpec
    /// `spec.cron` in `spec.timezone`, parsed once.
    public internal(set) var cron: CronSchedule
    public let createdAt: Int64
    public internal(set) var updatedAt: Int64
    /// The newest slot dealt with (fired, skipped or missed), wall-clock milliseconds: slots
    /// after it are still to come. Moved to now on create, resume and a change of cron or zone.
    public internal(set) var lastSlot: Int64
    /// The newest runs, oldest first, at most `ScheduleRecord.keptRuns`.
    public internal(set) var lastRuns: [ScheduleRun] = []
    /// Counts since the schedule was made (its own; the engine keeps totals too).
    public internal(set) var firedCount: UInt64 = 0
    public internal(set) var skippedCount: UInt64 = 0
    public internal(set) var missedCount: UInt64 = 0
    /// Moves on whenever the schedule's next due time changes: an entry in the wall-clock heap
    /// made for another generation is stale.
    var generation: UInt32 = 0
    var deleted = false

    public static let keptRuns = 20

    init(id: TaskID, spec: ScheduleSpec, cron: CronSchedule, createdAt: Int64, lastSlot: Int64) {
        self.id = id
        self.spec = spec
        self.cron = cron
        self.createdAt = createdAt
        updatedAt = createdAt
        self.lastSlot = lastSlot
    }

    /// The run `overlap` looks at: the newest that made a task or workflow. Kept apart from
    /// `lastRuns`, which twenty skipped slots in a row would push it out of.
    public internal(set) var currentRun: ScheduleRun.Target?

    func record(_ run: ScheduleRun) {
        if lastRuns.count == Self.keptRuns { lastRuns.removeFirst() }
        lastRuns.append(run)
        if run.target != .none { currentRun = run.target }
    }

    /// The deterministic jitter of `slot`, in `0...spec.jitterMilliseconds`: the same after a
    /// restart or on another replica, so a slot is due at the same instant everywhere.
    func jitter(of slot: Int64) -> Int64 {
        guard spec.jitterMilliseconds > 0 else { return 0 }
        var mixed = id.high ^ (id.low &* 0x9E37_79B9_7F4A_7C15) ^ UInt64(bitPattern: slot)
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        mixed ^= mixed >> 31
        return Int64(mixed % (spec.jitterMilliseconds + 1))
    }

    /// The first slot after `instant` (wall-clock milliseconds) within start/end, in milliseconds.
    func slot(after instant: Int64) -> Int64? {
        guard let next = cron.next(after: firstSearchSecond(after: instant)), next <= lastSlotSecond else { return nil }
        return next * 1000
    }

    /// The next `count` slots after `instant` within start/end.
    public func slots(count: Int, after instant: Int64) -> [Int64] {
        Self.slots(of: spec, cron, count: count, after: instant)
    }

    static func slots(of spec: ScheduleSpec, _ cron: CronSchedule, count: Int, after instant: Int64) -> [Int64] {
        cron.next(count: count, after: firstSearchSecond(of: spec, after: instant), through: lastSlotSecond(of: spec))
            .map { $0 * 1000 }
    }

    private func firstSearchSecond(after instant: Int64) -> Int64 { Self.firstSearchSecond(of: spec, after: instant) }

    private var lastSlotSecond: Int64 { Self.lastSlotSecond(of: spec) }

    /// The cron search for the slots after `instant` starts after this second: none is before start_at.
    private static func firstSearchSecond(of spec: ScheduleSpec, after instant: Int64) -> Int64 {
        guard let startAt = spec.startAt else { return Engine.seconds(instant) }
        return Engine.seconds(max(instant, startAt - 1))
    }

    /// The last second a slot may fall on: end_at's, or none.
    private static func lastSlotSecond(of spec: ScheduleSpec) -> Int64 {
        spec.endAt.map(Engine.seconds) ?? .max
    }

    /// The schedule as it stands now, for its `schedule.updated` event (`deleted`: the event of
    /// its deletion).
    public func moment(deleted: Bool = false) -> ScheduleMoment {
        ScheduleMoment(id: id, spec: spec, cron: cron, createdAt: createdAt, updatedAt: updatedAt, lastSlot: lastSlot,
                       lastRuns: lastRuns, deleted: deleted || self.deleted)
    }
}

/// A schedule as one change left it. Its event keeps this rather than its rendering: a schedule
/// that fires every second changes every second, and what nobody reads is never rendered. Its
/// parts are shared with the record until the record changes again (copy on write), so taking
/// one costs a few retains.
public struct ScheduleMoment {
    public let id: TaskID
    public let spec: ScheduleSpec
    let cron: CronSchedule
    public let createdAt: Int64
    public let updatedAt: Int64
    let lastSlot: Int64
    public let lastRuns: [ScheduleRun]
    public let deleted: Bool

    /// The next `count` slots (unjittered) as they were at the change, as `Engine.nextRuns`
    /// showed them then: none while paused or once deleted.
    public func nextRuns(count: Int = 5) -> [Int64] {
        guard !spec.paused, !deleted else { return [] }
        return ScheduleRecord.slots(of: spec, cron, count: count, after: lastSlot)
    }
}

/// A schedule as a store keeps it: `Engine.restore` rebuilds the record from it.
public struct ScheduleSnapshot: Sendable, Equatable {
    public var id: TaskID
    public var spec: ScheduleSpec
    public var createdAt: Int64
    public var updatedAt: Int64
    public var lastSlot: Int64
    public var lastRuns: [ScheduleRun]
    public var firedCount: UInt64
    public var skippedCount: UInt64
    public var missedCount: UInt64
    public var currentRun: ScheduleRun.Target?

    public init(id: TaskID, spec: ScheduleSpec, createdAt: Int64, updatedAt: Int64, lastSlot: Int64,
                lastRuns: [ScheduleRun] = [], firedCount: UInt64 = 0, skippedCount: UInt64 = 0, missedCount: UInt64 = 0,
                currentRun: ScheduleRun.Target? = nil) {
        self.id = id
        self.spec = spec
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.lastSlot = lastSlot
        self.lastRuns = lastRuns
        self.firedCount = firedCount
        self.skippedCount = skippedCount
        self.missedCount = missedCount
        self.currentRun = currentRun
    }
}

extension ScheduleSnapshot {
    /// The next `count` slots after `lastSlot` (unjittered), as `Engine.nextRuns` shows a live
    /// schedule's: for a schedule read from a store rather than an engine. None while paused,
    /// or when its cron cannot be read here or its zone is not among those loaded (no file is read).
    public func nextRuns(count: Int = 5, zones: TimeZoneCatalog) -> [Int64] {
        guard !spec.paused, let expression = try? CronExpression(spec.cron),
              let zone = zones.loaded(named: spec.timezone) else { return [] }
        let record = ScheduleRecord(id: id, spec: spec, cron: CronSchedule(expression: expression, zone: zone), createdAt: createdAt,
                                    lastSlot: lastSlot)
        return record.slots(count: count, after: lastSlot)
    }
}
