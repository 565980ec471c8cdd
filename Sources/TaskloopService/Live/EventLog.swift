import DequeModule
import TaskloopCluster
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON
import TaskloopStore

/// The kinds of the event stream, by their wire names.
enum EventKind: String, CaseIterable {
    case taskCreated = "task.created"
    case taskState = "task.state"
    case taskProgress = "task.progress"
    case workflowState = "workflow.state"
    case queueUpdated = "queue.updated"
    case scheduleUpdated = "schedule.updated"
}

/// What one settled engine call shows on the event stream, in order: the single server numbers
/// it (`EventLog.record`), a cell writes it with its commit (`ClusterEventRenderer`). After the
/// call's own events, a `workflow.state` for each workflow whose state it changed.
struct EventMapping {
    /// The state each workflow's last `workflow.state` event announced.
    private var announced: [ObjectIdentifier: TaskState] = [:]

    /// `emit`: an event's kind and what it shows (a task in a state, a workflow in a state, or
    /// a queue); `progressed`: a task's progress (a single server coalesces it);
    /// `leftRunning`: a task moved to a state other than `running`, before its event.
    @inline(__always)
    mutating func map(_ events: [EngineEvent],
                      emit: (EventKind, TaskRecord?, TaskState?, WorkflowRecord?, TaskQueue?) -> Void,
                      progressed: (TaskRecord) -> Void, leftRunning: (TaskRecord) -> Void,
                      scheduleChanged: (ScheduleRecord, _ deleted: Bool) -> Void = { _, _ in }) {
        var workflowsTouched = OrderedObjects<WorkflowRecord>()
        var schedulesTouched = OrderedObjects<ScheduleRecord>()
        var deletedSchedules = OrderedObjects<ScheduleRecord>()
        var spent: [WorkflowRecord] = []
        for event in events {
            switch event {
            case .submitted(let task):
                emit(.taskCreated, task, .pending, nil, nil)
            case .stateChanged(let task, _, let to):
                if to != .running { leftRunning(task) }
                emit(.taskState, task, to, nil, nil)
                if let workflow = task.workflow { workflowsTouched.insert(workflow) }
            case .progressed(let task):
                progressed(task)
            case .workflowSubmitted(let workflow):
                // Created running; where its tasks took it in the same call follows below.
                announced[ObjectIdentifier(workflow)] = .running
                emit(.workflowState, nil, .running, workflow, nil)
                workflowsTouched.insert(workflow)
            case .workflowReported(let workflow, let isSpent):
                // On cells: a member of another cell changed it at its home, as a local one would.
                workflowsTouched.insert(workflow)
                if isSpent { spent.append(workflow) }
            case .queueChanged(let queue):
                emit(.queueUpdated, nil, nil, nil, queue)
            case .cancelRequested(let task):
                emit(.taskState, task, task.state, nil, nil)
            case .evicted(let task, let workflowEmptied):
                if workflowEmptied, let workflow = task.workflow { announced.removeValue(forKey: ObjectIdentifier(workflow)) }
            case .scheduleChanged(let schedule):
                schedulesTouched.insert(schedule)
            case .scheduleDeleted(let schedule):
                deletedSchedules.insert(schedule)
            case .queueForgotten, .leaseRenewed, .releasedByRetry, .messageSent, .watched:
                break
            }
        }
        for workflow in workflowsTouched.elements where announced[ObjectIdentifier(workflow)] != workflow.state {
            announced[ObjectIdentifier(workflow)] = workflow.state
            emit(.workflowState, nil, workflow.state, workflow, nil)
        }
        // Forgotten by its engine: nothing more is said of it.
        for workflow in spent { announced.removeValue(forKey: ObjectIdentifier(workflow)) }
        // Once per schedule per call, as the call left it (a fire and its run's end may share
        // one); a schedule deleted in the call is said last, deleted.
        for schedule in schedulesTouched.elements where !deletedSchedules.contains(schedule) { scheduleChanged(schedule, false) }
        for schedule in deletedSchedules.elements { scheduleChanged(schedule, true) }
    }
}


/// One numbered change. It keeps what the change showed (a task's `TaskMoment`, a workflow's
/// state and progress) from when it was numbered; its `data` is rendered from that the first
/// time a subscriber needs it and kept for the others: a server nobody listens to renders
/// nothing, and a replay shows each change as it was. A queue event is rendered when numbered.
/// A `schedule.updated` keeps the schedule as the change left it (`ScheduleMoment`); only its
/// runs' states are read when it is rendered.
///
/// Threading: loop thread only.
final class StreamEvent: FramedEvent {
    let seq: UInt64
    let kind: EventKind
    /// Wall-clock milliseconds of the change.
    let time: Int64
    let task: TaskRecord?
    /// The task as the change left it.
    let moment: TaskMoment?
    /// The workflow's state and progress as the change left them.
    let workflowState: TaskState?
    let workflowFraction: Double
    let workflow: WorkflowRecord?
    let queue: TaskQueue?
    /// The batch whose commit makes it visible (durable state), or 0.
    let batch: Int
    private var renderedData: [UInt8]?
    private var rendered: [UInt8]?
    /// What the history counted of its rendered bytes (`EventLog.account`).
    var accountedBytes = 0
    /// The bytes its renderings hold.
    var renderedBytes: Int { (renderedData?.count ?? 0) + (rendered?.count ?? 0) + (renderedBrief?.count ?? 0) }

    init(seq: UInt64, kind: EventKind, time: Int64, task: TaskRecord? = nil, state: TaskState? = nil,
         workflow: WorkflowRecord? = nil, queue: TaskQueue? = nil, batch: Int) {
        self.seq = seq
        self.kind = kind
        self.time = time
        self.task = task
        moment = task.map { TaskMoment($0, state: state) }
        workflowState = workflow.map { state ?? $0.state }
        workflowFraction = workflow?.fraction ?? 0
        self.workflow = workflow
        self.queue = queue
        self.batch = batch
        taskID = task?.id
        workflowID = workflow?.id ?? task?.workflow?.id
        queueName = queue?.name ?? task?.queue.name
        scheduleID = task?.schedule?.id ?? workflow?.schedule?.id
        endsTask = kind == .taskState && moment?.state.isTerminal == true
        // A queue keeps no moment: its rare events are rendered now, as the change left it.
        if queue != nil { _ = data }
    }

    /// A `schedule.updated`: the schedule as the change left it, rendered when first needed;
    /// each run's state is read from `engine` then.
    init(seq: UInt64, time: Int64, schedule: ScheduleMoment, in engine: Engine, batch: Int) {
        self.seq = seq
        kind = .scheduleUpdated
        self.time = time
        task = nil
        moment = nil
        workflowState = nil
        workflowFraction = 0
        workflow = nil
        queue = nil
        self.batch = batch
        taskID = nil
        workflowID = nil
        queueName = nil
        scheduleID = schedule.id
        endsTask = false
        scheduleMoment = ScheduleEventMoment(schedule: schedule, engine: engine)
    }

    /// A `schedule.updated` event's JSON; without `seq` where the id is given later (cells: the database's).
    static func scheduleData(seq: Int?, time: Int64, schedule: ScheduleMoment, in engine: Engine) -> [UInt8] {
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        if let seq { json.field("seq", seq) }
        json.field("type", EventKind.scheduleUpdated.rawValue)
        Representation.timestamp("time", time, into: &json)
        json.key(static: "schedule")
        Representation.write(schedule, state: engine.state(of:), into: &json)
        json.endObject()
        return json.bytes
    }

    /// What a `schedule.updated` shows, until rendered.
    private final class ScheduleEventMoment {
        let schedule: ScheduleMoment
        unowned let engine: Engine
        init(schedule: ScheduleMoment, engine: Engine) {
            self.schedule = schedule
            self.engine = engine
        }
    }
    private var scheduleMoment: ScheduleEventMoment?

    /// An event a cell's commit wrote, rendered by the engine that made it (a replica on cells).
    /// `seq` numbers it where no position is known yet.
    init(committed event: ClusterEvents.Written, kind: EventKind, seq: UInt64) {
        self.seq = seq
        self.kind = kind
        time = event.time
        task = nil
        moment = nil
        workflowState = nil
        workflowFraction = 0
        workflow = nil
        queue = nil
        batch = 0
        taskID = event.task.flatMap(TaskID.init)
        workflowID = event.workflow.flatMap(TaskID.init)
        queueName = event.queue
        scheduleID = event.schedule.flatMap(TaskID.init)
        endsTask = false
        renderedData = event.data
    }

    let taskID: TaskID?
    /// Its workflow's id; set by a replica on cells for a member whose workflow is another cell's.
    var workflowID: TaskID?
    let queueName: String?
    /// The schedule it is of: a `schedule.updated`'s, or the one whose run made its task or workflow.
    let scheduleID: TaskID?
    /// A task's terminal state: a task's own stream ends with it.
    let endsTask: Bool


    /// The event's JSON, `{seq, type, time, task | workflow | queue}`: the stream's `data:` line
    /// and a webhook's `data`.
    var data: [UInt8] {
        if let renderedData { return renderedData }
        let bytes: [UInt8]
        if let scheduleMoment {
            bytes = Self.scheduleData(seq: Int(seq), time: time, schedule: scheduleMoment.schedule, in: scheduleMoment.engine)
            self.scheduleMoment = nil
        } else {
            bytes = render(seq: Int(seq))
        }
        renderedData = bytes
        return bytes
    }

    /// The event's JSON; without `seq` where the id is given later (cells: the database's).
    func render(seq: Int?) -> [UInt8] {
        var json = JSONWriter(capacity: 1_024)
        json.beginObject()
        if let seq { json.field("seq", seq) }
        json.field("type", kind.rawValue)
        Representation.timestamp("time", time, into: &json)
        if let task, let moment {
            json.key(static: "task")
            Representation.write(task, moment, into: &json, resultLimit: Representation.eventResultBytes, workflow: workflowID)
        } else if let workflow, let workflowState {
            json.key(static: "workflow")
            Representation.writeSummary(workflow, state: workflowState, fraction: workflowFraction, into: &json)
        } else if let queue {
            json.key(static: "queue")
            Representation.write(queue, at: time, into: &json)
        }
        json.endObject()
        return json.bytes
    }

    /// `id:`, `event:` and `data:` lines and the blank line that ends them.
    var frame: [UInt8] {
        if let rendered { return rendered }
        var frame = Array("id: \(seq)\nevent: \(kind.rawValue)\ndata: ".utf8)
        frame += data
        frame += [0x0A, 0x0A]
        rendered = frame
        return frame
    }

    /// A `task.progress` as `?progress_body=brief` streams send it (`Representation.writeBrief`);
    /// the whole frame for every other event.
    var briefFrame: [UInt8] {
        guard kind == .taskProgress, let task, let moment else { return frame }
        if let renderedBrief { return renderedBrief }
        var json = JSONWriter(capacity: 256)
        json.beginObject()
        json.field("seq", Int(seq))
        json.field("type", kind.rawValue)
        Representation.timestamp("time", time, into: &json)
        json.key(static: "task")
        Representation.writeBrief(task, moment, into: &json, workflow: workflowID)
        json.endObject()
        let frame = Array("id: \(seq)\nevent: \(kind.rawValue)\ndata: ".utf8) + json.bytes + [0x0A, 0x0A]
        renderedBrief = frame
        return frame
    }
    private var renderedBrief: [UInt8]?
}

/// What a subscriber wants: every filter given must match.
/// What a stream's filter looks at: a single server's events and those of the cluster's one
/// order (cells) alike.
protocol FilterableEvent {
    var kind: EventKind { get }
    var taskID: TaskID? { get }
    var workflowID: TaskID? { get }
    var queueName: String? { get }
    var scheduleID: TaskID? { get }
}

struct EventFilter: Hashable {
    var task: TaskID?
    var workflow: TaskID?
    var queue: String?
    /// A schedule's own events and those of the tasks and workflows its runs made.
    var schedule: TaskID?
    var kinds: Set<EventKind>?
    /// `?progress_body=brief`: `task.progress` events carry the task's `id, queue, workflow,
    /// state, attempt, progress` only. Not a filter (every event still matches), but the streams
    /// of one group share one rendering, so it is part of what groups them.
    var briefProgress = false

    func matches(_ event: some FilterableEvent) -> Bool {
        if let kinds, !kinds.contains(event.kind) { return false }
        if let task, event.taskID != task { return false }
        if let workflow, event.workflowID != workflow { return false }
        if let queue, event.queueName != queue { return false }
        if let schedule, event.scheduleID != schedule { return false }
        return true
    }
}

/// The one ordered sequence of changes (contract: "Events"), and the streams that follow it.
///
/// Every settled engine batch is numbered here as it is published by the engine; with a
/// store, the numbered events wait until the batch that holds their change has committed
/// (`committed(through:)`), so no subscriber sees a state a crash could take back. Published
/// events are kept in a ring of `capacity` for resumes; a subscriber that asks for older ones
/// first gets `reset`; the ring is also bounded by the bytes its rendered events hold
/// (`maxBytes`). A resume is written from the ring a chunk at a time, as the reader takes it
/// (`replay`), never copied whole into its buffer. Progress events of one task are coalesced to one per
/// `progressIntervalMilliseconds` (the latest wins) before they are numbered; state events are
/// never dropped or reordered. A subscriber whose unsent bytes pass `clientBufferBytes` when
/// more is to be written is disconnected; one that has taken everything gets the next event
/// however large. What a loop turn publishes is written to each stream at once, at the turn's
/// end (`StreamSubscribers`, which cells' streams share), the same bytes to every live stream
/// with the same filter (`SharedFrames`).
///
/// Threading: loop thread only.
final class EventLog {
    final class Subscriber: StreamSubscriber {
        let reply: Reply
        let filter: EventFilter
        /// `GET /tasks/{id}/events`: the stream ends after this task's terminal event.
        let endsWith: TaskID?
        /// Events up to this one it has (`since` may name one not yet published).
        let after: UInt64
        /// The last event published when it started, or when its resume caught up: later ones
        /// reach it live, at the end of the turn that published them.
        var liveFrom: UInt64
        /// The streams with its filter, when it ends with neither a task nor `until`.
        let group: SharedFrames.Group?
        /// While it resumes: the next event of the ring to write; nil once it follows live.
        var replayNext: UInt64?
        var pending: [UInt8] = []
        var isDirty = false
        /// `?until=`: the stream ends once the events up to this one are sent.
        let until: UInt64?
        /// Its task ended, or `until` was reached.
        var ending = false

        init(reply: Reply, filter: EventFilter, endsWith: TaskID?, after: UInt64, liveFrom: UInt64, until: UInt64?,
             group: SharedFrames.Group?) {
            self.reply = reply
            self.filter = filter
            self.endsWith = endsWith
            self.after = after
            self.liveFrom = liveFrom
            self.until = until
            self.group = group
        }
    }

    static let progressIntervalMilliseconds: UInt64 = 200
    static let keepAliveMilliseconds: UInt64 = 15_000
    static let retryMilliseconds = 2_000

    private let capacity: Int
    private let maxBytes: Int
    /// What the ring's events hold rendered, as last counted.
    private(set) var ringBytes = 0
    private let scheduler: EngineScheduler
    /// The last number given out (published or not) and the last one subscribers may see.
    private(set) var lastAssigned: UInt64
    private(set) var lastPublished: UInt64
    private var ring = Deque<StreamEvent>()
    private var unpublished = Deque<StreamEvent>()
    private let subscribers: StreamSubscribers<Subscriber>
    private let shared = SharedFrames()
    /// Published while streams were open and not yet given to them: at the end of this loop
    /// turn, or of a later one while the streams wait out `writeIntervalMilliseconds`.
    private var turnEvents: [StreamEvent] = []
    /// Streams are written at most once per this many milliseconds (`--event-write-interval-ms`):
    /// under load each write then carries several turns' events, rendered once. A stream costs
    /// the server a system call per write (on loopback the kernel's receiving work too), which
    /// once per turn was most of what 100 streams cost. Events that come after a quiet spell
    /// are written at the end of their turn.
    private let writeIntervalMilliseconds: UInt64
    /// When the streams were last written (the scheduler's clock), and the write waiting for
    /// the interval to pass.
    private var lastWrite: UInt64?
    private var waitingWrite: ScheduledAction?
    /// Per running task: when its last progress event was numbered, and whether a later one waits.
    private var lastProgress: [ObjectIdentifier: UInt64] = [:]
    private var heldProgress: [ObjectIdentifier: ScheduledAction] = [:]
    private var mapping = EventMapping()
    /// With a store: the batch whose commit makes a change made now durable, or nil when it
    /// already is. Without a store (nil) events are published at once.
    var batchOfNextChange: (() -> Int?)?
    /// Told each event as it is numbered, before it is published (webhooks keep their
    /// deliveries in the same batch as the change).
    var onNumbered: ((StreamEvent) -> Void)?

    /// A resume writes this much of the ring at a time, then waits for the reader to take it.
    static let replayChunkBytes = 256 * 1024
    /// ...and looks at most this many events per loop turn, matching or not.
    static let replayScanLimit = 20_000

    init(after lastSeq: UInt64, capacity: Int, maxBytes: Int = 256 << 20, clientBufferBytes: Int, writeIntervalMilliseconds: UInt64 = 0,
         scheduler: EngineScheduler) {
        self.writeIntervalMilliseconds = writeIntervalMilliseconds
        lastAssigned = lastSeq
        lastPublished = lastSeq
        self.capacity = max(1, capacity)
        self.maxBytes = maxBytes
        self.scheduler = scheduler
        subscribers = StreamSubscribers(clientBufferBytes: clientBufferBytes, scheduler: scheduler)
        subscribers.nextChunk = { [weak self] subscriber in
            self?.replay(subscriber)
            return subscriber.replayNext != nil
        }
    }

    var subscriberCount: Int { subscribers.count }
    /// Streams disconnected so far because their reader fell behind (`--event-client-buffer-bytes`).
    var disconnectedBehind: Int { subscribers.disconnectedBehind }
    /// The oldest event a resume can still get.
    var oldestKept: UInt64 { ring.first?.seq ?? lastPublished + 1 }

    // MARK: numbering

    /// Numbers what one settled engine call changed; `engine` made them (a schedule's event
    /// shows what only it knows: the next runs, the runs' states).
    func record(_ events: [EngineEvent], of engine: Engine? = nil) {
        let waitsFor = batchOfNextChange?() ?? nil
        let batch = waitsFor ?? 0
        let before = lastAssigned
        let now = scheduler.wallClock
        mapping.map(events) { kind, task, state, workflow, queue in
            append(StreamEvent(seq: next(), kind: kind, time: now, task: task, state: state, workflow: workflow, queue: queue,
                               batch: batch))
        } progressed: { task in
            progressed(task, now: now, batch: batch)
        } leftRunning: { task in
            // Most tasks never report progress: no hashing for them.
            guard !lastProgress.isEmpty || !heldProgress.isEmpty else { return }
            heldProgress.removeValue(forKey: ObjectIdentifier(task))?.cancel()
            lastProgress.removeValue(forKey: ObjectIdentifier(task))
        } scheduleChanged: { schedule, deleted in
            if let engine {
                append(StreamEvent(seq: next(), time: now, schedule: schedule.moment(deleted: deleted), in: engine, batch: batch))
            }
        }
        if waitsFor == nil && lastAssigned != before { publish(through: lastAssigned) }
    }

    /// With a store: batch `number` (and every one before it) has committed.
    func committed(through number: Int) {
        var last: UInt64?
        for event in unpublished {
            guard event.batch <= number else { break }
            last = event.seq
        }
        if let last { publish(through: last) }
    }

    private func next() -> UInt64 {
        lastAssigned += 1
        return lastAssigned
    }

    private func append(_ event: StreamEvent) {
        unpublished.append(event)
        onNumbered?(event)
    }

    private func progressed(_ task: TaskRecord, now: Int64, batch: Int) {
        let key = ObjectIdentifier(task)
        guard heldProgress[key] == nil else { return }
        let monotonic = scheduler.now
        if let last = lastProgress[key], monotonic &- last < Self.progressIntervalMilliseconds {
            heldProgress[key] = scheduler.schedule(after: last + Self.progressIntervalMilliseconds - monotonic) { [weak self] in
                self?.numberHeldProgress(of: task, key: key)
            }
            return
        }
        lastProgress[key] = monotonic
        append(StreamEvent(seq: next(), kind: .taskProgress, time: now, task: task, batch: batch))
    }

    /// A coalesced progress event, numbered once its interval has passed (if the task still
    /// runs). Its change went to the store in a batch of its own: published once that commits.
    private func numberHeldProgress(of task: TaskRecord, key: ObjectIdentifier) {
        guard heldProgress.removeValue(forKey: key) != nil, task.state == .running else { return }
        lastProgress[key] = scheduler.now
        let waitsFor = batchOfNextChange?() ?? nil
        append(StreamEvent(seq: next(), kind: .taskProgress, time: scheduler.wallClock, task: task, batch: waitsFor ?? 0))
        if waitsFor == nil { publish(through: lastAssigned) }
    }

    // MARK: publishing

    private func publish(through seq: UInt64) {
        var fresh: [StreamEvent] = []
        while let event = unpublished.first, event.seq <= seq {
            unpublished.removeFirst()
            ring.append(event)
            fresh.append(event)
        }
        guard let last = fresh.last else { return }
        lastPublished = last.seq
        if !subscribers.isEmpty { turnEvents += fresh }
        // Counted once rendered: by webhooks when numbered, by the streams at the turn's end.
        for event in fresh { account(event) }
        trimRing()
    }

    /// Gives the streams what the turn published: each group of live streams with one filter
    /// one rendering of it (`SharedFrames`), any other stream its own.
    private func deliverTurn() {
        let events = turnEvents
        turnEvents.removeAll(keepingCapacity: true)
        guard let first = events.first?.seq else { return }
        shared.deliver(events) { frames in
            for subscriber in subscribers.all.values {
                guard let group = subscriber.group, !subscriber.ending, subscriber.replayNext == nil,
                      subscriber.after < first, subscriber.liveFrom < first else {
                    deliver(events, to: subscriber)
                    continue
                }
                let bytes = frames(group)
                guard !bytes.isEmpty else { continue }
                if subscriber.pending.isEmpty { subscriber.pending = bytes } else { subscriber.pending += bytes }
                subscribers.markDirty(subscriber)
            }
        }
        let kept = oldestKept
        for event in events where event.seq >= kept { account(event) }
        trimRing()
    }

    /// Counts what `event` holds rendered now (renderings happen lazily, on first need).
    private func account(_ event: StreamEvent) {
        let bytes = event.renderedBytes
        ringBytes += bytes - event.accountedBytes
        event.accountedBytes = bytes
    }

    private func trimRing() {
        while ring.count > capacity || (ringBytes > maxBytes && ring.count > 1), let oldest = ring.popFirst() {
            ringBytes -= oldest.accountedBytes
        }
    }

    private func deliver(_ events: some Sequence<StreamEvent>, to subscriber: Subscriber) {
        // A resuming stream reaches these through the ring, in order.
        guard !subscriber.ending, subscriber.replayNext == nil else { return }
        let before = subscriber.pending.count
        let last = subscriber.until ?? .max
        let from = max(subscriber.after, subscriber.liveFrom)
        for event in events where event.seq > from && event.seq <= last && subscriber.filter.matches(event) {
            subscriber.pending += event.frame(for: subscriber.filter)
            if let id = subscriber.endsWith, event.endsTask, event.taskID == id {
                subscriber.ending = true
                break
            }
        }
        if lastPublished >= last { subscriber.ending = true }
        if subscriber.pending.count > before || subscriber.ending { subscribers.markDirty(subscriber) }
    }

    /// Writes what the turn published; called once per loop turn. Within
    /// `writeIntervalMilliseconds` of the last write, waits for the interval to pass.
    func flushPending() {
        guard !turnEvents.isEmpty || subscribers.hasPending, waitingWrite == nil else { return }
        let now = scheduler.now
        if let lastWrite, now &- lastWrite < writeIntervalMilliseconds {
            waitingWrite = scheduler.schedule(after: lastWrite + writeIntervalMilliseconds - now) { [weak self] in
                self?.waitingWrite = nil
                self?.write()
            }
            return
        }
        write()
    }

    private func write() {
        if writeIntervalMilliseconds > 0 { lastWrite = scheduler.now }
        if !turnEvents.isEmpty { deliverTurn() }
        subscribers.flushPending()
    }

    /// Moves a resuming stream's next chunk from the ring into its pending bytes: at most
    /// `replayChunkBytes` of matching events, at most `replayScanLimit` looked at. Events the
    /// ring dropped meanwhile are announced with `reset`. Caught up, it follows live.
    private func replay(_ subscriber: Subscriber) {
        guard var next = subscriber.replayNext else { return }
        guard let oldest = ring.first?.seq, next <= lastPublished else {
            subscriber.replayNext = nil
            subscriber.liveFrom = lastPublished
            return
        }
        if next < oldest {
            subscriber.pending += Self.reset(oldest: oldest)
            next = oldest
        }
        var index = Int(next - oldest)
        var scanned = 0
        let last = subscriber.until ?? .max
        while index < ring.count && subscriber.pending.count < Self.replayChunkBytes && scanned < Self.replayScanLimit {
            let event = ring[index]
            index += 1
            scanned += 1
            guard event.seq <= last else {
                subscriber.ending = true
                subscriber.replayNext = nil
                return
            }
            guard event.seq > subscriber.after, subscriber.filter.matches(event) else { continue }
            subscriber.pending += event.frame(for: subscriber.filter)
            account(event)
            if let id = subscriber.endsWith, event.endsTask, event.taskID == id {
                subscriber.ending = true
                subscriber.replayNext = nil
                return
            }
        }
        subscriber.replayNext = index < ring.count ? ring[index].seq : nil
        // It has looked at every event published so far, this turn's too.
        if subscriber.replayNext == nil { subscriber.liveFrom = lastPublished }
        if subscriber.replayNext == nil && lastPublished >= last { subscriber.ending = true }
    }

    private static func reset(oldest: UInt64) -> [UInt8] {
        Array("event: reset\ndata: {\"oldest\":\(oldest)}\n\n".utf8)
    }

    // MARK: subscribing

    /// Starts a stream: `retry:`, then (with `since`) what was published after it, or `reset`
    /// and everything kept when that is gone, then every new matching event, up to `until` if
    /// given. `snapshot` is written first (`GET /tasks/{id}/events`). Its head's `Event-Seq` is
    /// the last event published: what follows it is live.
    func subscribe(_ reply: Reply, filter: EventFilter, since: UInt64?, until: UInt64? = nil, snapshot: [UInt8]? = nil,
                   endsWith: TaskID? = nil) {
        let subscriber = Subscriber(reply: reply, filter: filter, endsWith: endsWith, after: since ?? 0, liveFrom: lastPublished,
                                    until: until, group: endsWith == nil && until == nil ? shared.group(for: filter) : nil)
        subscribers.subscribe(subscriber, eventSeq: String(lastPublished), snapshot: snapshot) {
            if let since, since < lastPublished {
                if ring.isEmpty {
                    subscriber.pending += Self.reset(oldest: lastPublished + 1)
                } else {
                    subscriber.replayNext = since + 1
                }
            }
            if let until, lastPublished >= until { subscriber.ending = true }
        }
    }

    /// Ends a task stream at once (its task is already terminal).
    func finish(_ reply: Reply, snapshot: [UInt8]) {
        guard reply.responder.startStream(headers: Self.streamHeaders) else { return }
        reply.responder.write(Array("retry: \(Self.retryMilliseconds)\n\n".utf8) + snapshot)
        reply.responder.finish()
    }

    /// Ends every stream (shutdown): clients reconnect to the next server with Last-Event-ID.
    func finishAll() {
        waitingWrite?.cancel()
        waitingWrite = nil
        if !turnEvents.isEmpty { deliverTurn() }
        subscribers.finishAll()
    }

    static let keepAliveComment: [UInt8] = Array(": keep-alive\n\n".utf8)
    /// Every stream's head: not cached, and not buffered by a proxy in front (nginx).
    static let streamHeaders: HTTPHeaders = [
        "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
    ]
}
