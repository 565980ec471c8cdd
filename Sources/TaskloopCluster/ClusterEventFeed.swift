import TaskloopLoop
import TaskloopPostgres

/// The cluster's events for one reader, in their one order (`EventPosition`), each once: on a
/// connection of its own it listens on `ClusterEvents.channel` and reads the events after the
/// last one it delivered, in bounded reads, until it has caught up; again on each
/// notification, and every `pollMilliseconds` besides, since an event becomes readable only
/// once every older transaction has ended, which nothing announces (and a notification may be
/// coalesced or lost with a connection).
///
/// A lost connection or a failed read is retried on a new connection after
/// `reconnectMilliseconds`, from the last event delivered: a read whose answer was lost
/// delivered nothing, so nothing is delivered twice and nothing is skipped.
///
/// A feed nobody needs rests (`pause`): it keeps its connection but stops listening (so its
/// session is not signalled at every commit of the cluster) and reading, and forgets where it
/// was; `follow` starts it again from `ClusterEvents.now`, as a start from `.now` does.
///
/// Lifecycle: `start` (following, or at rest), any number of `pause` and `follow`, then `close`
/// (the loop is left with no handle of the feed's).
///
/// Threading: the loop's thread only, callbacks included.
public final class ClusterEventFeed {
    public struct Settings: Sendable {
        public var url: String
        public var timeouts: PGTimeouts?
        /// How often to read without a notification.
        public var pollMilliseconds: UInt64 = 100
        /// The most events a read takes, and so a delivery holds.
        public var readLimit = 500
        public var reconnectMilliseconds: UInt64 = 500

        public init(url: String, timeouts: PGTimeouts? = nil) {
            self.url = url
            self.timeouts = timeouts
        }
    }

    /// Where the feed starts.
    public enum Start: Sendable, Equatable {
        /// After the events committed before it started (`ClusterEvents.now`).
        case now
        /// After the event at this position (a stream's `Last-Event-ID`).
        case after(EventPosition)
    }

    public let settings: Settings
    private let loop: EventLoop
    private let pollTimer: LoopTimer
    private let reconnectTimer: LoopTimer
    private var connection: PGConnection?
    /// `connection` has connected: statements may be sent on it.
    private var isConnected = false
    /// Wanted by its reader: listening and reading, or getting there.
    public private(set) var isFollowing = false
    /// `LISTEN` was sent on `connection`, and no `UNLISTEN` after it.
    private var isListening = false
    /// Counts the pauses: an answer to what was sent before the last one is stale, and dropped.
    private var pauses = 0
    /// Listening, and the start known: reads may go.
    private var isReady = false
    private var isReading = false
    /// A wake-up came while a read was under way: read again after it.
    private var readAgain = false
    private var isClosed = false

    /// The events after the last delivery, in order, at most `readLimit` at a time.
    public var onEvents: (([ClusterEvents.Read]) -> Void)?
    /// A connection was lost or a read failed; the feed goes on by itself.
    public var onTrouble: ((PGError) -> Void)?
    /// The feed has read where it starts from `now` (`position` is no longer nil), after its
    /// `start` or a `follow`; before its first read.
    public var onPositioned: (() -> Void)?
    /// The last event delivered, or where the feed started; nil until a start from `now` has
    /// read where that is, and at rest.
    public private(set) var position: EventPosition?
    /// The reads of events sent, for the tests: a feed at rest sends none.
    public private(set) var readsSent = 0

    public init(loop: EventLoop, settings: Settings, from start: Start) throws(UVError) {
        self.loop = loop
        self.settings = settings
        pollTimer = try LoopTimer(loop: loop)
        do {
            reconnectTimer = try LoopTimer(loop: loop)
        } catch {
            pollTimer.close()
            throw error
        }
        if case .after(let position) = start { self.position = position }
    }

    /// Connects, and follows the cluster's events unless `following` is false (then `follow`,
    /// which starts from now).
    public func start(following: Bool = true) {
        precondition(connection == nil && !isClosed, "start once")
        precondition(following || position == nil, "a feed at rest has no position")
        isFollowing = following
        connect()
    }

    /// Follows the cluster's events again after a `pause`, from `ClusterEvents.now`:
    /// `onPositioned` tells when that is read.
    public func follow() {
        guard !isFollowing, !isClosed else { return }
        isFollowing = true
        if let connection, isConnected { listen(on: connection) }
    }

    /// Rests: no reads, no poll, no notifications, and no position (a `follow` starts from
    /// now). The connection stays open, so the next `follow` costs one round trip, not a
    /// connect. A read or a `LISTEN` still under way is answered after this, and dropped.
    public func pause() {
        guard isFollowing, !isClosed else { return }
        isFollowing = false
        pauses += 1
        position = nil
        isReady = false
        isReading = false
        readAgain = false
        pollTimer.stop()
        guard let connection, isListening else { return }
        isListening = false
        connection.execute([PGQuery("UNLISTEN \(ClusterEvents.channel)")]) { [weak self, unowned connection] result in
            guard let self, case .failure(let error) = result else { return }
            restart(connection, error)
        }
    }

    private func connect() {
        let connection = PGConnection(loop: loop)
        self.connection = connection
        connection.onClosed = { [weak self, unowned connection] error in self?.restart(connection, error) }
        connection.onNotification = { [weak self] channel, _ in
            if channel == ClusterEvents.channel { self?.wake() }
        }
        connection.connect(settings.url, timeouts: settings.timeouts) { [weak self, unowned connection] result in
            guard let self, self.connection === connection else { return }
            if case .failure(let error) = result { return restart(connection, error) }
            isConnected = true
            if isFollowing { listen(on: connection) }
        }
    }

    private func listen(on connection: PGConnection) {
        isListening = true
        let pauses = self.pauses
        // Listening first: an event committed after the start is then either read by the
        // first read or announced after it.
        connection.execute([PGQuery("LISTEN \(ClusterEvents.channel)")] + (position == nil ? [ClusterEvents.now()] : [])) {
            [weak self, unowned connection] result in
            guard let self, self.connection === connection, self.pauses == pauses else { return }
            switch result {
            case .failure(let error):
                restart(connection, error)
            case .success(let results):
                isReady = true
                pollTimer.start(after: settings.pollMilliseconds, every: settings.pollMilliseconds) { [weak self] in self?.wake() }
                if position == nil {
                    position = ClusterEvents.position(of: results[1])
                    onPositioned?()
                    // Its reader may have paused or closed it.
                    guard self.connection === connection, self.pauses == pauses else { return }
                }
                read()
            }
        }
    }

    private func wake() {
        guard isReady else { return }
        if isReading { readAgain = true } else { read() }
    }

    private func read() {
        guard let connection, let position else { return }
        isReading = true
        readAgain = false
        readsSent += 1
        let limit = settings.readLimit, pauses = self.pauses
        connection.execute([ClusterEvents.read(after: position, limit: limit)]) { [weak self, unowned connection] result in
            guard let self, self.connection === connection, self.pauses == pauses else { return }
            isReading = false
            switch result {
            case .failure(let error):
                restart(connection, error)
            case .success(let results):
                let events = ClusterEvents.events(of: results[0])
                if let last = events.last {
                    self.position = last.position
                    onEvents?(events)
                    // The delivery may have paused or closed the feed.
                    guard self.connection === connection, self.pauses == pauses else { return }
                }
                if results[0].rowCount == limit || readAgain { read() }
            }
        }
    }

    /// Drops `failed` (if it is still the feed's connection) and connects again a little later.
    private func restart(_ failed: PGConnection, _ error: PGError) {
        guard connection === failed, !isClosed else { return }
        drop(failed)
        onTrouble?(error)
        reconnectTimer.start(after: settings.reconnectMilliseconds) { [weak self] in self?.connect() }
    }

    private func drop(_ connection: PGConnection) {
        self.connection = nil
        isConnected = false
        isListening = false
        isReady = false
        isReading = false
        readAgain = false
        pollTimer.stop()
        connection.onClosed = nil
        connection.onNotification = nil
        // Fails what is in flight: those answers find the connection no longer the feed's.
        connection.close()
    }

    /// Stops for good: nothing more is delivered.
    public func close() {
        guard !isClosed else { return }
        isClosed = true
        if let connection { drop(connection) }
        pollTimer.close()
        reconnectTimer.close()
        onEvents = nil
        onTrouble = nil
        onPositioned = nil
    }
}
