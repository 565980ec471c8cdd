/// One event of a `text/event-stream`.
public struct ServerSentEvent: Equatable, Sendable {
    /// The stream's last event id when this event was dispatched (`id:` lines stick until
    /// the next one), nil while the stream has not named one.
    public var id: String?
    /// `event:`, or `message` when the event named none.
    public var type: String
    /// The `data:` lines joined with line feeds.
    public var data: String

    public init(id: String?, type: String, data: String) {
        self.id = id
        self.type = type
        self.data = data
    }
}

/// An event larger than the parser takes: the stream is not one this client can follow.
public struct ServerSentEventTooLarge: Error, CustomStringConvertible {
    public let limit: Int
    public var description: String { "the event stream sent an event larger than \(limit) bytes" }
}

/// Reads a `text/event-stream` (the WHATWG HTML standard's "event stream interpretation") from
/// byte chunks as they arrive, whatever their boundaries: lines end with CR LF, LF or CR (a CR
/// LF split between two chunks is one line end); `data:` lines accumulate, joined with line
/// feeds; a blank line dispatches; lines starting with `:` are comments; one space after a
/// field's colon is dropped; `id:` sticks for later events (but an id with NUL is ignored);
/// `retry:` with only digits sets the reconnection delay; an event with no data is not
/// dispatched; a leading byte order mark is skipped; what follows the last blank line when
/// the stream ends is discarded. A value type with no I/O, so it is tested with plain bytes.
public struct ServerSentEventParser {
    /// Largest event taken, its data or any one line (a task's JSON can be large; a peer that
    /// never ends a line or an event must not make the client buffer without bound).
    public let maxEventBytes: Int
    /// The id named last, sent back as `Last-Event-ID` to resume after it.
    public private(set) var lastEventID: String?
    /// The last `retry:` the stream gave, in milliseconds.
    public private(set) var retryMilliseconds: Int?

    private var line: [UInt8] = []
    private var lineEndedWithCR = false
    private var atStart = true
    private var type: String?
    private var data: [UInt8] = []
    private var hasData = false

    public init(maxEventBytes: Int = 64 << 20) {
        self.maxEventBytes = maxEventBytes
    }

    /// The events the chunk completes, in order.
    public mutating func feed(_ chunk: some Sequence<UInt8>) throws(ServerSentEventTooLarge) -> [ServerSentEvent] {
        var events: [ServerSentEvent] = []
        for byte in chunk {
            if lineEndedWithCR {
                lineEndedWithCR = false
                if byte == 0x0A { continue }
            }
            switch byte {
            case 0x0D:
                lineEndedWithCR = true
                if let event = try endLine() { events.append(event) }
            case 0x0A:
                if let event = try endLine() { events.append(event) }
            default:
                guard line.count < maxEventBytes else { throw ServerSentEventTooLarge(limit: maxEventBytes) }
                line.append(byte)
            }
        }
        return events
    }

    /// Forgets a half-received event, keeping the last id and retry: a stream reconnects
    /// with what it had.
    public mutating func restart() {
        line.removeAll()
        lineEndedWithCR = false
        atStart = true
        type = nil
        data.removeAll()
        hasData = false
    }

    private static let byteOrderMark: [UInt8] = [0xEF, 0xBB, 0xBF]

    private mutating func endLine() throws(ServerSentEventTooLarge) -> ServerSentEvent? {
        defer { line.removeAll(keepingCapacity: true) }
        if atStart {
            atStart = false
            if line.starts(with: Self.byteOrderMark) { line.removeFirst(Self.byteOrderMark.count) }
        }
        guard !line.isEmpty else { return dispatch() }
        guard line[0] != UInt8(ascii: ":") else { return nil }
        let colon = line.firstIndex(of: UInt8(ascii: ":"))
        let name = line[..<(colon ?? line.endIndex)]
        var value = colon.map { line[($0 + 1)...] } ?? []
        if value.first == UInt8(ascii: " ") { value = value.dropFirst() }
        switch String(decoding: name, as: UTF8.self) {
        case "event":
            type = String(decoding: value, as: UTF8.self)
        case "data":
            guard data.count + value.count < maxEventBytes else { throw ServerSentEventTooLarge(limit: maxEventBytes) }
            if hasData { data.append(0x0A) }
            data += value
            hasData = true
        case "id":
            if !value.contains(0) { lastEventID = String(decoding: value, as: UTF8.self) }
        case "retry":
            if !value.isEmpty, value.allSatisfy({ (0x30...0x39).contains($0) }) {
                retryMilliseconds = Int(String(decoding: value, as: UTF8.self))
            }
        default:
            break
        }
        return nil
    }

    private mutating func dispatch() -> ServerSentEvent? {
        defer {
            type = nil
            data.removeAll()
            hasData = false
        }
        guard hasData else { return nil }
        let eventType = type.flatMap { $0.isEmpty ? nil : $0 } ?? "message"
        return ServerSentEvent(id: lastEventID, type: eventType, data: String(decoding: data, as: UTF8.self))
    }
}
