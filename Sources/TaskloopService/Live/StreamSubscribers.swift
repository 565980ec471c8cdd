import TaskloopEngine
import TaskloopHTTP

/// A stream's reader as `StreamSubscribers` keeps it; where it is and what it wants are its
/// owner's.
protocol StreamSubscriber: AnyObject {
    var reply: Reply { get }
    var pending: [UInt8] { get set }
    /// Waiting in `dirty` for the end of the loop turn.
    var isDirty: Bool { get set }
    /// The stream ends once what is pending is written.
    var ending: Bool { get set }
}

/// The event streams of one source of events (the single server's `EventLog`, a replica's
/// `ClusterEventStreams` on cells), whatever each is sent: their head, `retry:` and snapshot,
/// writes once per loop turn (`flushPending`, from a `LoopCheck`), a reader whose unsent bytes
/// pass `clientBufferBytes` when more is to be written disconnected (it resumes with
/// `Last-Event-ID`, so a slow reader never holds memory without bound or slows anyone else),
/// a keep-alive comment, and their end.
///
/// Threading: loop thread only.
final class StreamSubscribers<Subscriber: StreamSubscriber> {
    private let clientBufferBytes: Int
    private let scheduler: EngineScheduler
    private(set) var all: [ObjectIdentifier: Subscriber] = [:] {
        didSet { if all.isEmpty { onEmpty?() } }
    }
    /// Subscribers with bytes to write: written once per loop turn (`flushPending`), so a turn
    /// that publishes many batches costs each stream one write, not one per batch.
    private var dirty: [Subscriber] = []
    private var keepAlive: ScheduledAction?
    private var wake: ScheduledAction?
    /// A stream that resumes from what its owner keeps in memory gets its next chunk here, just
    /// before it is written; true while more is to come: the stream is written again once its
    /// reader has taken this chunk.
    var nextChunk: ((Subscriber) -> Bool)?
    /// The last stream has ended (or none was left to end).
    var onEmpty: (() -> Void)?

    init(clientBufferBytes: Int, scheduler: EngineScheduler) {
        self.clientBufferBytes = clientBufferBytes
        self.scheduler = scheduler
    }

    var count: Int { all.count }
    /// Some stream has bytes waiting for `flushPending`.
    var hasPending: Bool { !dirty.isEmpty }
    /// Streams disconnected so far because their reader fell behind.
    private(set) var disconnectedBehind = 0
    var isEmpty: Bool { all.isEmpty }

    func contains(_ subscriber: Subscriber) -> Bool {
        all[ObjectIdentifier(subscriber)] === subscriber
    }

    /// Starts `subscriber`'s stream: its head, whose `Event-Seq` is `eventSeq` (what follows it
    /// is live), `retry:`, then `snapshot`; `start` gives it what comes before the live events.
    /// Nothing when the reader has gone.
    func subscribe(_ subscriber: Subscriber, eventSeq: String, snapshot: [UInt8]?, start: () -> Void) {
        let reply = subscriber.reply
        var headers = EventLog.streamHeaders
        headers.add("Event-Seq", eventSeq)
        guard reply.responder.startStream(headers: headers) else { return }
        let key = ObjectIdentifier(subscriber)
        all[key] = subscriber
        reply.onClose { [weak self] in self?.all.removeValue(forKey: key) }
        // A reader that ends its side has gone (a browser aborts a fetch by closing): a stream
        // is only ever read, so waiting for a write to fail would keep it until the keep-alive.
        reply.onPeerEnded { [weak self] in
            guard self?.all.removeValue(forKey: key) != nil else { return }
            reply.responder.finish()
        }
        subscriber.pending += Array("retry: \(EventLog.retryMilliseconds)\n\n".utf8)
        if let snapshot { subscriber.pending += snapshot }
        start()
        markDirty(subscriber)
        scheduleKeepAlive()
    }

    func markDirty(_ subscriber: Subscriber) {
        guard !subscriber.isDirty else { return }
        subscriber.isDirty = true
        dirty.append(subscriber)
    }

    /// Writes what the turn gave the streams; called once per loop turn.
    func flushPending() {
        guard !dirty.isEmpty else { return }
        let writing = dirty
        dirty.removeAll(keepingCapacity: true)
        for subscriber in writing {
            subscriber.isDirty = false
            if contains(subscriber) { flush(subscriber) }
        }
    }

    func flush(_ subscriber: Subscriber) {
        let key = ObjectIdentifier(subscriber)
        let moreToCome = nextChunk?(subscriber) ?? false
        if !subscriber.pending.isEmpty {
            if subscriber.reply.responder.unsentBytes > clientBufferBytes {
                // It cannot keep up: it reconnects with Last-Event-ID and catches up from what is kept.
                all.removeValue(forKey: key)
                disconnectedBehind += 1
                subscriber.reply.responder.abort()
                return
            }
            // Often the bytes every stream with its filter shares (`SharedFrames`): handed over
            // as they are, never emptied in place.
            let bytes = subscriber.pending
            subscriber.pending = []
            guard subscriber.reply.responder.write(bytes) else {
                all.removeValue(forKey: key)
                return
            }
        }
        if moreToCome {
            subscriber.reply.responder.onDrained { [weak self, weak subscriber] in
                guard let self, let subscriber, contains(subscriber) else { return }
                markDirty(subscriber)
                wakeForDirty()
            }
            return
        }
        if subscriber.ending {
            all.removeValue(forKey: key)
            subscriber.reply.responder.finish()
        }
    }

    /// Dirty streams are written at the end of a loop turn; a drained socket may be the only
    /// thing that happened, so a zero timer makes sure the turn ends with a check.
    private func wakeForDirty() {
        guard wake == nil else { return }
        wake = scheduler.schedule(after: 0) { [weak self] in
            self?.wake = nil
            self?.flushPending()
        }
    }

    /// Ends every stream (shutdown): clients resume with Last-Event-ID.
    func finishAll() {
        keepAlive?.cancel()
        keepAlive = nil
        wake?.cancel()
        wake = nil
        let subscribers = Array(all.values)
        for subscriber in subscribers { flush(subscriber) }
        all.removeAll()
        dirty.removeAll()
        for subscriber in subscribers { subscriber.reply.responder.finish() }
    }

    private func scheduleKeepAlive() {
        guard keepAlive == nil, !all.isEmpty else { return }
        keepAlive = scheduler.schedule(after: EventLog.keepAliveMilliseconds) { [weak self] in
            guard let self else { return }
            keepAlive = nil
            for subscriber in Array(all.values) {
                subscriber.pending += EventLog.keepAliveComment
                flush(subscriber)
            }
            scheduleKeepAlive()
        }
    }
}
