import TaskloopCluster
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON
import TaskloopLoop
import TaskloopPostgres

/// One of the cluster's events as the streams of a replica on cells send it: its id is its
/// `EventPosition` (opaque to clients), and its data is what the committing cell rendered, with
/// that id as `seq`.
///
/// Threading: loop thread only.
final class ClusterStreamEvent: FramedEvent {
    let position: EventPosition
    let kind: EventKind
    let taskID: TaskID?
    let workflowID: TaskID?
    let queueName: String?
    let scheduleID: TaskID?
    private let data: [UInt8]

    init?(_ read: ClusterEvents.Read) {
        guard let kind = EventKind(rawValue: read.event.type), read.event.data.first == UInt8(ascii: "{") else { return nil }
        position = read.position
        self.kind = kind
        taskID = read.event.task.flatMap(TaskID.init)
        workflowID = read.event.workflow.flatMap(TaskID.init)
        queueName = read.event.queue
        scheduleID = read.event.schedule.flatMap(TaskID.init)
        data = read.event.data
    }

    /// `id:`, `event:` and `data:` lines and the blank line that ends them; rendered once, for
    /// the first stream that sends it.
    private(set) lazy var frame: [UInt8] = {
        let id = position.description
        var frame = Array("id: \(id)\nevent: \(kind.rawValue)\ndata: {\"seq\":\"\(id)\"".utf8)
        frame.reserveCapacity(frame.count + data.count + 3)
        // The committed data has no id (the transaction gave it): `seq` goes first, as on a
        // single server.
        if data.count > 2 { frame.append(UInt8(ascii: ",")) }
        frame += data.dropFirst()
        frame += [0x0A, 0x0A]
        return frame
    }()

    /// A `task.progress` as `?progress_body=brief` streams send it: the committed task cut down
    /// to `Representation.briefTaskFields`, rendered once for the first such stream (the cell
    /// committed the whole task); the whole frame for every other event.
    private(set) lazy var briefFrame: [UInt8] = {
        guard kind == .taskProgress, case .object(let members)? = try? JSONParser.parse(data),
              let task = members["task"]?.objectValue else { return frame }
        var json = JSONWriter(capacity: 256)
        json.beginObject()
        for member in members where member.key != "task" {
            json.key(member.key)
            json.value(member.value)
        }
        json.key(static: "task")
        json.beginObject()
        for name in Representation.briefTaskFields {
            json.key(name)
            json.value(task[name] ?? .null)
        }
        json.endObject()
        json.endObject()
        let id = position.description
        return Array("id: \(id)\nevent: \(kind.rawValue)\ndata: {\"seq\":\"\(id)\",".utf8) + json.bytes.dropFirst() + [0x0A, 0x0A]
    }()

    /// A task's terminal state: a task's own stream ends with it. Read from the data, and only
    /// for a task's own stream.
    private(set) lazy var endsTask: Bool = {
        guard kind == .taskState, let object = try? JSONParser.parse(data).objectValue,
              let state = object["task"]?.objectValue?["state"]?.stringValue.flatMap(TaskState.init(rawValue:)) else { return false }
        return state.isTerminal
    }()
}

/// The event streams of a replica on cells (contract v3, "Replicas that add capacity"): every
/// replica follows the cluster's one order of events with a `ClusterEventFeed` of its own and
/// writes them to its streams, so a stream opened on any replica has the events of every cell.
/// The feed follows only while a stream is open here (or waits for it to): otherwise it rests,
/// and every replica reading and decoding every event of the cluster for nobody would cost
/// PostgreSQL reads and wake-ups at every commit. A stream arriving then waits for the feed to
/// read where it starts again (`whenFollowing`).
/// A stream that resumes (`Last-Event-ID`, `since`, or a task stream from its snapshot) reads
/// what it missed from the history in the database, a bounded read at a time as the reader
/// takes it, and follows the feed once it has caught up with it: positions are one order, so
/// each event reaches it once, whichever replica gave it the id it resumes from. A resume from
/// before the oldest event kept starts with `reset`, as on a single server.
///
/// The rest is the single server's `EventLog`: filters, `until`, a task stream ending with its
/// task, and its `StreamSubscribers` (a reader whose unsent bytes pass `clientBufferBytes`
/// disconnected, a keep-alive comment, writes once per loop turn).
///
/// Threading: loop thread only.
final class ClusterEventStreams {
    typealias Read = (_ queries: [PGQuery], _ completion: @escaping (Result<[PGResult], PGError>) -> Void) -> Void

    final class Subscriber: StreamSubscriber {
        let reply: Reply
        let filter: EventFilter
        /// `GET /tasks/{id}/events`: the stream ends after this task's terminal event.
        let endsWith: TaskID?
        let until: EventPosition?
        /// Every event up to here has been written to it or passed over by its filter.
        var position: EventPosition
        /// Reading what it missed from the database; the feed's events reach it once it has.
        var catchingUp: Bool
        /// Whether a resume from before the history's oldest event was looked for.
        var lookedForReset = false
        var pending: [UInt8] = []
        var isDirty = false
        var ending = false
        /// The streams with its filter, when it ends with neither a task nor `until`.
        let group: SharedFrames.Group?

        init(reply: Reply, filter: EventFilter, endsWith: TaskID?, until: EventPosition?, position: EventPosition, catchingUp: Bool,
             group: SharedFrames.Group?) {
            self.reply = reply
            self.filter = filter
            self.endsWith = endsWith
            self.until = until
            self.position = position
            self.catchingUp = catchingUp
            self.group = group
        }
    }

    /// The most events one read of the history takes; the next waits for the reader.
    static let historyReadLimit = 500
    /// The most events one step of dropping the history past its time deletes.
    static let trimLimit = 10_000

    private let feed: ClusterEventFeed
    private let read: Read
    private let scheduler: EngineScheduler
    private let subscribers: StreamSubscribers<Subscriber>
    private let shared = SharedFrames()
    /// How long the history keeps an event (`--event-history-seconds`).
    private let historyMilliseconds: Int64
    private var trimming: ScheduledAction?
    /// Streams waiting for the feed to know where it is, each until its deadline.
    private var waiting: [ObjectIdentifier: Waiter] = [:]

    private final class Waiter {
        let serve: (Bool) -> Void
        var deadline: ScheduledAction?

        init(serve: @escaping (Bool) -> Void) {
            self.serve = serve
        }
    }

    /// `read`: reads of the history (the cell host's reading connection), and its trimming.
    init(loop: EventLoop, feed settings: ClusterEventFeed.Settings, read: @escaping Read, clientBufferBytes: Int,
         historyMilliseconds: Int64, scheduler: EngineScheduler) throws(UVError) {
        feed = try ClusterEventFeed(loop: loop, settings: settings, from: .now)
        self.read = read
        subscribers = StreamSubscribers(clientBufferBytes: clientBufferBytes, scheduler: scheduler)
        self.historyMilliseconds = historyMilliseconds
        self.scheduler = scheduler
        feed.onEvents = { [weak self] events in self?.deliver(events) }
        feed.onPositioned = { [weak self] in self?.serveWaiting() }
        // At rest as soon as the last stream ends, with no linger: a stream waits for a resume
        // only one round trip, while a lingering feed would read at every commit for streams
        // that may never come, and streams are long-lived anyway.
        subscribers.onEmpty = { [weak self] in self?.restIfUnneeded() }
        // Connected, so the first stream waits for no connect; at rest until it comes.
        feed.start(following: false)
        // The history is dropped by time whether or not the feed follows.
        scheduleTrim(after: Self.trimInterval(historyMilliseconds))
    }

    static func trimInterval(_ historyMilliseconds: Int64) -> UInt64 {
        UInt64(max(1_000, min(60_000, historyMilliseconds / 4)))
    }

    /// Every replica drops the events past the history's time, in bounded steps, a step at
    /// once after a full one: two replicas deleting the same rows wait for each other, and the
    /// rows go once.
    private func scheduleTrim(after delay: UInt64) {
        trimming = scheduler.schedule(after: delay) { [weak self] in
            guard let self else { return }
            read([ClusterEvents.trim(before: scheduler.wallClock - historyMilliseconds, limit: Self.trimLimit)]) {
                [weak self] result in
                guard let self, trimming != nil else { return }
                let full = (try? result.get())?.first?.affectedRows == Self.trimLimit
                scheduleTrim(after: full ? 0 : Self.trimInterval(historyMilliseconds))
            }
        }
    }

    var subscriberCount: Int { subscribers.count }
    /// Streams disconnected so far because their reader fell behind (`--event-client-buffer-bytes`).
    var disconnectedBehind: Int { subscribers.disconnectedBehind }
    /// Whether the feed follows the cluster's events, and how many reads it has sent (tests).
    var feedIsFollowing: Bool { feed.isFollowing }
    /// Told when the feed starts or stops following (`CellKeeper.followsEvents`: committers
    /// announce events only while some replica follows them).
    var onFollowing: ((Bool) -> Void)?
    var feedReadsSent: Int { feed.readsSent }

    /// Calls `serve(true)` once the feed knows where it is (at once if it does), to `subscribe`
    /// there and then; a feed at rest follows again for it. `serve(false)` if that does not
    /// come within `milliseconds`. Streams arriving meanwhile all wait for the same resume.
    func whenFollowing(within milliseconds: UInt64, _ serve: @escaping (Bool) -> Void) {
        if feed.position != nil { return serve(true) }
        let waiter = Waiter(serve: serve)
        let key = ObjectIdentifier(waiter)
        waiting[key] = waiter
        waiter.deadline = scheduler.schedule(after: milliseconds) { [weak self] in
            guard let self, waiting.removeValue(forKey: key) != nil else { return }
            serve(false)
            restIfUnneeded()
        }
        feed.follow()
        onFollowing?(true)
    }

    private func serveWaiting() {
        let served = waiting.values
        waiting.removeAll()
        for waiter in served {
            waiter.deadline?.cancel()
            waiter.serve(true)
        }
        // A reader may have gone meanwhile, or have been answered without a stream.
        restIfUnneeded()
    }

    private func restIfUnneeded() {
        guard subscribers.isEmpty, waiting.isEmpty, feed.isFollowing else { return }
        feed.pause()
        onFollowing?(false)
    }

    private func deliver(_ read: [ClusterEvents.Read]) {
        guard !subscribers.isEmpty, let position = feed.position else { return }
        let events = read.compactMap(ClusterStreamEvent.init)
        // Live streams with one filter share one rendering of the read (`SharedFrames`).
        let first = events.first?.position
        let through = max(position, events.last?.position ?? position)
        shared.deliver(events) { frames in
            for subscriber in subscribers.all.values where !subscriber.catchingUp && !subscriber.ending {
                if let group = subscriber.group, let first, subscriber.position < first {
                    let bytes = frames(group)
                    if subscriber.pending.isEmpty { subscriber.pending = bytes } else { subscriber.pending += bytes }
                    subscriber.position = through
                } else {
                    add(events, to: subscriber, through: position)
                }
                if !subscriber.pending.isEmpty || subscriber.ending { subscribers.markDirty(subscriber) }
            }
        }
    }

    /// Gives `subscriber` the events after its position that match its filter, up to its
    /// `until` and its task's end; `through`: where the events given end (none after it).
    private func add(_ events: [ClusterStreamEvent], to subscriber: Subscriber, through last: EventPosition) {
        for event in events where event.position > subscriber.position {
            if let until = subscriber.until, event.position > until {
                subscriber.ending = true
                return
            }
            subscriber.position = event.position
            guard subscriber.filter.matches(event) else { continue }
            subscriber.pending += event.frame(for: subscriber.filter)
            if let task = subscriber.endsWith, event.taskID == task, event.endsTask {
                subscriber.ending = true
                return
            }
        }
        subscriber.position = max(subscriber.position, last)
        if let until = subscriber.until, subscriber.position >= until { subscriber.ending = true }
    }

    /// Writes what the turn gave the streams; called once per loop turn.
    func flushPending() {
        subscribers.flushPending()
    }

    // MARK: catching up

    /// Reads the next part of what a resuming stream missed, writes it, and once the reader has
    /// taken it reads on; caught up with the feed, the stream follows it.
    private func catchUp(_ subscriber: Subscriber) {
        var queries = [ClusterEvents.read(after: subscriber.position, limit: Self.historyReadLimit)]
        if !subscriber.lookedForReset { queries.insert(ClusterEvents.oldest(), at: 0) }
        // Every event up to here was readable before this read was sent.
        let readable = feed.position
        read(queries) { [weak self] result in
            guard let self, subscribers.contains(subscriber) else { return }
            guard case .success(let results) = result, let live = feed.position else {
                // The history cannot be read now: the stream ends, and its reader resumes.
                subscriber.ending = true
                return subscribers.flush(subscriber)
            }
            if !subscriber.lookedForReset {
                subscriber.lookedForReset = true
                let oldest = ClusterEvents.position(of: results[0])
                // `.start` asks for everything kept; an id older than the oldest kept event was
                // followed by events the history no longer has.
                if oldest != .start, subscriber.position != .start, subscriber.position < oldest {
                    subscriber.pending += Self.reset(oldest: oldest)
                }
            }
            let read = ClusterEvents.events(of: results[results.count - 1])
            add(read.compactMap(ClusterStreamEvent.init), to: subscriber, through: read.last?.position ?? subscriber.position)
            if read.isEmpty, let readable, subscriber.position < readable {
                // What lay between was dropped from the history since (kept by time).
                add([], to: subscriber, through: readable)
            }
            // Caught up with the feed, which has the rest. (Behind it, with nothing more read:
            // this read's snapshot came before the feed's last one, and the next one reads on.)
            if subscriber.position >= live {
                subscriber.catchingUp = false
                add([], to: subscriber, through: live)
            }
            subscribers.flush(subscriber)
            guard subscriber.catchingUp, subscribers.contains(subscriber) else { return }
            subscriber.reply.responder.onDrained { [weak self] in
                guard let self, subscribers.contains(subscriber) else { return }
                catchUp(subscriber)
            }
        }
    }

    private static func reset(oldest: EventPosition) -> [UInt8] {
        Array("event: reset\ndata: {\"oldest\":\"\(oldest)\"}\n\n".utf8)
    }

    // MARK: subscribing

    /// Starts a stream: `retry:`, then `snapshot` if given, then (with `since`) what was
    /// committed after it, or `reset` and everything kept when that is gone, then every new
    /// matching event, up to `until` if given. Its head's `Event-Seq` is the feed's position:
    /// what follows it is live. Only from `whenFollowing`'s `serve(true)`, before the loop
    /// turns: the feed rests again once no stream needs it.
    func subscribe(_ reply: Reply, filter: EventFilter, since: EventPosition?, until: EventPosition? = nil,
                   snapshot: [UInt8]? = nil, endsWith: TaskID? = nil) {
        guard let live = feed.position else { preconditionFailure("a stream before the feed knows where it is") }
        let position = since ?? live
        let subscriber = Subscriber(reply: reply, filter: filter, endsWith: endsWith, until: until,
                                    position: position, catchingUp: position < live,
                                    group: endsWith == nil && until == nil ? shared.group(for: filter) : nil)
        subscribers.subscribe(subscriber, eventSeq: live.description, snapshot: snapshot) {
            if subscriber.catchingUp {
                catchUp(subscriber)
            } else {
                add([], to: subscriber, through: live)
            }
        }
    }

    /// Ends every stream (shutdown) and the feed: clients resume on another replica with
    /// Last-Event-ID.
    func finishAll() {
        feed.close()
        trimming?.cancel()
        trimming = nil
        let unserved = waiting.values
        waiting.removeAll()
        for waiter in unserved {
            waiter.deadline?.cancel()
            waiter.serve(false)
        }
        subscribers.finishAll()
    }
}
