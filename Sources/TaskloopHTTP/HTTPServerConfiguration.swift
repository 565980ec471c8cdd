/// Everything a server needs to know before it listens. Every limit has a safe default.
public struct HTTPServerConfiguration: Sendable {
    /// An IPv4 or IPv6 address or a host name; `[::1]` brackets are accepted.
    public var host: String = "127.0.0.1"
    /// 0 picks a free port (see `HTTPServer.localAddress`).
    public var port: Int = 8080
    public var parserLimits = HTTPParserLimits()
    /// The whole head of a request must arrive within this...
    public var headerTimeoutMilliseconds: UInt64 = 10_000
    /// ...and then its whole body within this; both answer 408 and close.
    public var bodyTimeoutMilliseconds: UInt64 = 30_000
    public var idleTimeoutMilliseconds: UInt64 = 60_000
    /// Connections beyond this are answered 503 and closed at once.
    public var maxConnections = 10_000
    /// Per connection: past this many unsent response bytes the server stops reading and
    /// parsing for that client until half of them have gone out.
    public var outputHighWaterBytes = 256 * 1024
    /// Per connection: unparsed pipelined input kept while a request is answered.
    public var maxPendingInputBytes = 64 * 1024
    /// After a final answer the write side is closed and input drained this long, so the
    /// client reads the answer instead of a connection reset.
    public var lingerMilliseconds: UInt64 = 2_000
    public var maxLingerDiscardBytes = 1024 * 1024
    public var listenBacklog: Int32 = 1024

    public init() {}
}
