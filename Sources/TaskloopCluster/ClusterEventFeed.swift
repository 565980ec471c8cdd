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
/// Lifecycle: `start`, then `close` (the loop is left with no handle of the feed's).
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
    /// The last event delivered, or where the feed started; nil until a start from `now` has
    /// read where that is.
    public private(set) var position: EventPosition?

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

    public func start() {
        precondition(connection == nil && !isClosed, "start once")
        connect()
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
            // Listening first: an event committed after the start is then either read by the
            // first read or announced after it.
            connection.execute([PGQuery("LISTEN \(ClusterEvents.channel)")] + (position == nil ? [ClusterEvents.now()] : [])) {
                [weak self, unowned connection] result in
                guard let self, self.connection === connection else { return }
                switch result {
                case .failure(let error):
                    restart(connection, error)
                case .success(let results):
                    if position == nil { position = ClusterEvents.position(of: results[1]) }
                    isReady = true
                    pollTimer.start(after: settings.pollMilliseconds, every: settings.pollMilliseconds) { [weak self] in self?.wake() }
                    read()
                }
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
        let limit = settings.readLimit
        connection.execute([ClusterEvents.read(after: position, limit: limit)]) { [weak self, unowned connection] result in
            guard let self, self.connection === connection else { return }
            isReading = false
            switch result {
            case .failure(let error):
                restart(connection, error)
            case .success(let results):
                let events = ClusterEvents.events(of: results[0])
                if let last = events.last {
                    self.position = last.position
                    onEvents?(events)
                    // The delivery may have closed the feed.
                    guard self.connection === connection else { return }
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
    }
}
