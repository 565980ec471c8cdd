import CLibPQ

/// How long the server and PostgreSQL wait on each other before giving a silent peer up, so
/// that nothing waits for ever on a process that stopped (SIGSTOP, a paused VM) or a machine or
/// network that vanished:
///
/// - the session's `statement_timeout` and `lock_timeout`, and `idle_in_transaction_session_timeout`:
///   a replica frozen inside a transaction has its session ended by the server after `seconds`,
///   and what it held (the turn lock) is free again;
/// - TCP keepalives and `tcp_user_timeout` on both ends of the socket: a peer that answers
///   nothing any more is noticed within about twice `seconds`, by libpq (a replica waiting on a
///   lock or a notification) and by the server (a session that is not in a transaction).
public struct PGTimeouts: Sendable, Equatable {
    public var seconds: Int

    public init(seconds: Int) {
        self.seconds = seconds
    }

    private var keepaliveInterval: Int { max(1, seconds / 3) }
    private var keepaliveCount: Int { 3 }
    private var unacknowledgedMilliseconds: Int { seconds * 2_000 }

    /// libpq's parameters for the socket; the connection string's own win.
    public var connectionParameters: [(keyword: String, value: String)] {
        [("keepalives", "1"), ("keepalives_idle", "\(seconds)"), ("keepalives_interval", "\(keepaliveInterval)"),
         ("keepalives_count", "\(keepaliveCount)"), ("tcp_user_timeout", "\(unacknowledgedMilliseconds)")]
    }

    /// The session's settings, set once connected (not as a startup `options`: poolers such as
    /// PgBouncer refuse or drop those).
    public var sessionSettings: [(name: String, value: String)] {
        [("statement_timeout", "\(seconds * 1_000)"), ("lock_timeout", "\(seconds * 1_000)"),
         ("idle_in_transaction_session_timeout", "\(seconds * 1_000)"),
         ("tcp_keepalives_idle", "\(seconds)"), ("tcp_keepalives_interval", "\(keepaliveInterval)"),
         ("tcp_keepalives_count", "\(keepaliveCount)"), ("tcp_user_timeout", "\(unacknowledgedMilliseconds)")]
    }

    /// What `connectionString` (a `postgres://` URL or `key=value` pairs) gives, read as libpq
    /// reads it, followed by each of `defaults` it does not give.
    public static func parameters(of connectionString: String, adding defaults: [(keyword: String, value: String)])
        -> Result<[(keyword: String, value: String)], PGError> {
        var problem: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(connectionString, &problem) else {
            let message = problem.map { String(cString: $0).trimmingTrailingNewlines() } ?? "libpq could not read the connection string"
            if let problem { PQfreemem(problem) }
            return .failure(PGError(message: message, isConnectionLost: true))
        }
        defer { PQconninfoFree(options) }
        var given: [(keyword: String, value: String)] = []
        var option = options
        while let keyword = option.pointee.keyword {
            if let value = option.pointee.val { given.append((String(cString: keyword), String(cString: value))) }
            option += 1
        }
        let keywords = Set(given.map(\.keyword))
        return .success(given + defaults.filter { !keywords.contains($0.keyword) })
    }
}
