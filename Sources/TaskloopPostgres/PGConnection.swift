import CLibPQ
import Glibc
import TaskloopLoop

/// One PostgreSQL connection driven by the loop: libpq's asynchronous API in pipeline mode,
/// its socket watched by a `uv_poll`. Calls are batches: the queries of a batch go out back to
/// back with one sync after them, several batches may be in flight, and each batch's results
/// come back in order, in one callback. A statement named in a query is prepared on this
/// connection the first time it is used.
///
/// Why libpq and not postgres-nio: measured on a claim+complete cycle (docs/SCALING.md), libpq
/// on our loop used 6.4x less CPU per cycle and 7x less memory, with no second event loop and
/// no hop; and it builds in seconds.
///
/// Lifecycle: `connect`, then `execute` any number of times, then `close` (or the server goes
/// away: every batch in flight fails with `connectionLost`, `onClosed` is called once, and the
/// connection is done; the owner makes a new one). The `uv_poll` handle is freed in its close
/// callback (`SocketPoll`); the libpq connection when this object goes.
///
/// Threading: the loop's thread only, callbacks included.
public final class PGConnection {
    public let loop: EventLoop
    /// Called with each `NOTIFY` this connection hears (after `LISTEN`).
    public var onNotification: ((_ channel: String, _ payload: String) -> Void)?
    /// Called once when the connection ends other than by `close`.
    public var onClosed: ((PGError) -> Void)?

    private var connection: OpaquePointer?
    private var poll: SocketPoll?
    /// Until the connection is handed over (its handshake and its session's settings).
    private var connecting: ((Result<Void, PGError>) -> Void)?
    /// libpq's handshake is under way: the socket is libpq's to drive.
    private var isHandshaking = false
    private var sessionSettings: [(name: String, value: String)] = []
    private var connectTimer: LoopTimer?
    /// What the server still owes, in order: one entry per query sent, then the batch's sync.
    private var expected: [Expected] = []
    private var expectedHead = 0
    private var batches: [Batch] = []
    private var batchesHead = 0
    private var prepared: Set<String> = []
    private var isClosed = false

    private enum Expected {
        /// A statement being prepared: its result is not the caller's.
        case prepare(String)
        case query
        case sync
    }

    private final class Batch {
        var results: [PGResult] = []
        var error: PGError?
        let completion: (Result<[PGResult], PGError>) -> Void
        init(_ completion: @escaping (Result<[PGResult], PGError>) -> Void) { self.completion = completion }
    }

    public init(loop: EventLoop) {
        self.loop = loop
    }

    deinit {
        // Dropped without `close`: the loop stops watching the socket before libpq closes it,
        // or the next connection given the same descriptor could not be watched (EEXIST).
        poll?.close()
        connectTimer?.close()
        if let connection { PQfinish(connection) }
    }

    /// Opens the connection described by `url` (`postgres://...` or `key=value` pairs, as
    /// libpq reads them), within `timeoutMilliseconds`. With `timeouts`, the socket and the
    /// session give a silent peer up (`PGTimeouts`) before the connection is handed over.
    public func connect(_ url: String, timeouts: PGTimeouts? = nil, timeoutMilliseconds: UInt64 = 10_000,
                        _ completion: @escaping (Result<Void, PGError>) -> Void) {
        precondition(connection == nil && !isClosed, "connect once")
        let started: OpaquePointer?
        if let timeouts {
            switch PGTimeouts.parameters(of: url, adding: timeouts.connectionParameters) {
            case .failure(let error): return fail(error, completion)
            case .success(let parameters): started = Self.connectStart(parameters)
            }
            sessionSettings = timeouts.sessionSettings
        } else {
            started = PQconnectStart(url)
        }
        guard let started else {
            return completion(.failure(PGError(message: "libpq could not allocate a connection", isConnectionLost: true)))
        }
        connection = started
        guard PQstatus(started) != CONNECTION_BAD else {
            return fail(PGError(message: errorMessage(), isConnectionLost: true), completion)
        }
        PQsetnonblocking(started, 1)
        // Notices ("relation already exists, skipping") are the server talking to a person;
        // libpq would print them on stderr.
        PQsetNoticeProcessor(started, { _, _ in }, nil)
        connecting = completion
        do {
            let timer = try LoopTimer(loop: loop)
            connectTimer = timer
            timer.start(after: timeoutMilliseconds) { [unowned self] in
                finishConnecting(.failure(PGError(message: "no connection within \(timeoutMilliseconds) ms", isConnectionLost: true)))
            }
        } catch {
            return fail(PGError(message: "\(error)", isConnectionLost: true), completion)
        }
        isHandshaking = true
        continueConnecting(status: PGRES_POLLING_WRITING)
    }

    private static func connectStart(_ parameters: [(keyword: String, value: String)]) -> OpaquePointer? {
        let keywords = parameters.map { strdup($0.keyword) } + [nil]
        let values = parameters.map { strdup($0.value) } + [nil]
        defer { (keywords + values).forEach { free($0) } }
        return keywords.map { UnsafePointer($0) }.withUnsafeBufferPointer { keywords in
            values.map { UnsafePointer($0) }.withUnsafeBufferPointer { values in
                PQconnectStartParams(keywords.baseAddress, values.baseAddress, 0)
            }
        }
    }

    private func fail(_ error: PGError, _ completion: (Result<Void, PGError>) -> Void) {
        isClosed = true
        completion(.failure(error))
    }

    private func continueConnecting(status: PostgresPollingStatusType) {
        switch status {
        case PGRES_POLLING_OK:
            isHandshaking = false
            guard PQenterPipelineMode(connection) == 1 else {
                return finishConnecting(.failure(PGError(message: "pipeline mode refused: \(errorMessage())", isConnectionLost: true)))
            }
            guard !sessionSettings.isEmpty else { return finishConnecting(.success(())) }
            send(sessionSettings.map { PGQuery("SELECT set_config($1, $2, false)", [.text($0.name), .text($0.value)]) }) {
                [unowned self] result in finishConnecting(result.map { _ in () })
            }
        case PGRES_POLLING_FAILED:
            finishConnecting(.failure(PGError(message: errorMessage(), isConnectionLost: true)))
        case PGRES_POLLING_READING:
            watch(readable: true, writable: false)
        default:
            watch(readable: false, writable: true)
        }
    }

    private func finishConnecting(_ result: Result<Void, PGError>) {
        guard let completion = connecting else { return }
        connecting = nil
        connectTimer?.close()
        connectTimer = nil
        switch result {
        case .success:
            watch(readable: true, writable: false)
        case .failure:
            isClosed = true
            poll?.close()
            poll = nil
        }
        completion(result)
    }

    /// Watches the connection's socket, making a new poll handle if libpq changed socket
    /// (it may, while connecting, when it tries the next address).
    private func watch(readable: Bool, writable: Bool) {
        let socket = PQsocket(connection)
        if poll?.socket != socket {
            poll?.close()
            poll = nil
            do {
                poll = try SocketPoll(loop: loop, socket: socket) { [unowned self] status, readable, writable in
                    socketReady(status: status, readable: readable, writable: writable)
                }
            } catch {
                return lose(PGError(message: "\(error)", isConnectionLost: true))
            }
        }
        poll?.start(readable: readable, writable: writable)
    }

    private func socketReady(status: Int32, readable: Bool, writable: Bool) {
        if isHandshaking { return continueConnecting(status: PQconnectPoll(connection)) }
        guard !isClosed else { return }
        if writable { flush() }
        if readable || status < 0 {
            guard PQconsumeInput(connection) == 1 else { return lose(PGError(message: errorMessage(), isConnectionLost: true)) }
            readResults()
            deliverNotifications()
        }
    }

    // MARK: batches

    /// Sends `queries` as one batch; `completion` gets their results in order, or the first
    /// error (the queries after a failed one do not run; inside a transaction, it is aborted).
    public func execute(_ queries: [PGQuery], _ completion: @escaping (Result<[PGResult], PGError>) -> Void) {
        guard !isClosed, connecting == nil, connection != nil else {
            return completion(.failure(PGError(message: "the connection is closed", isConnectionLost: true)))
        }
        send(queries, completion)
    }

    private func send(_ queries: [PGQuery], _ completion: @escaping (Result<[PGResult], PGError>) -> Void) {
        for query in queries {
            let sent: Bool
            switch query.statement {
            case .text(let sql):
                sent = send(sql: sql, query)
            case .prepared(let statement):
                if !prepared.contains(statement.name) {
                    guard PQsendPrepare(connection, statement.name, statement.sql, 0, nil) == 1 else {
                        return lose(PGError(message: errorMessage(), isConnectionLost: true), andFail: completion)
                    }
                    prepared.insert(statement.name)
                    expected.append(.prepare(statement.name))
                }
                sent = send(prepared: statement.name, query)
            }
            guard sent else { return lose(PGError(message: errorMessage(), isConnectionLost: true), andFail: completion) }
            expected.append(.query)
        }
        guard PQpipelineSync(connection) == 1 else {
            return lose(PGError(message: errorMessage(), isConnectionLost: true), andFail: completion)
        }
        expected.append(.sync)
        batches.append(Batch(completion))
        flush()
    }

    private func send(sql: String, _ query: PGQuery) -> Bool {
        withParameters(query.parameters) { count, values, lengths, formats in
            PQsendQueryParams(connection, sql, count, nil, values, lengths, formats, query.binaryResults ? 1 : 0) == 1
        }
    }

    private func send(prepared name: String, _ query: PGQuery) -> Bool {
        withParameters(query.parameters) { count, values, lengths, formats in
            PQsendQueryPrepared(connection, name, count, values, lengths, formats, query.binaryResults ? 1 : 0) == 1
        }
    }

    /// Parameters as libpq takes them: text (NUL-terminated) or binary bytes with a length,
    /// all copied into one buffer that lives through `body`.
    private func withParameters<Result>(
        _ parameters: [PGValue],
        _ body: (Int32, UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?) -> Result
    ) -> Result {
        guard !parameters.isEmpty else { return body(0, nil, nil, nil) }
        var buffer: [UInt8] = []
        var offsets: [Int] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        for parameter in parameters {
            switch parameter {
            case .null:
                offsets.append(-1)
                lengths.append(0)
                formats.append(0)
            case .text(let text):
                offsets.append(buffer.count)
                buffer += text.utf8
                buffer.append(0)
                lengths.append(0)
                formats.append(0)
            case .bytes(let bytes):
                offsets.append(buffer.count)
                buffer += bytes
                lengths.append(Int32(bytes.count))
                formats.append(1)
            }
        }
        buffer.append(0)
        return buffer.withUnsafeBufferPointer { bytes in
            let base = UnsafeRawPointer(bytes.baseAddress!).assumingMemoryBound(to: CChar.self)
            let values = offsets.map { $0 < 0 ? nil : base + $0 }
            return body(Int32(parameters.count), values, lengths, formats)
        }
    }

    private func flush() {
        switch PQflush(connection) {
        case 0: watch(readable: true, writable: false)
        case 1: watch(readable: true, writable: true)
        default: lose(PGError(message: errorMessage(), isConnectionLost: true))
        }
    }

    private func readResults() {
        while expectedHead < expected.count, PQisBusy(connection) == 0 {
            let result = PQgetResult(connection)
            let batch = batches[batchesHead]
            switch expected[expectedHead] {
            case .prepare, .query:
                guard let result else {
                    // The end of this query's results.
                    expectedHead += 1
                    continue
                }
                let wrapped = PGResult(result)
                switch expected[expectedHead] {
                case .query:
                    batch.results.append(wrapped)
                case .prepare(let name):
                    // Not prepared after all (its SQL was refused, or an earlier query of the batch
                    // failed and the server skipped the rest): prepared again when next used. A
                    // batch sent meanwhile that uses it fails once, as its caller's batches may.
                    if wrapped.error != nil { prepared.remove(name) }
                case .sync:
                    break
                }
                if batch.error == nil, let error = wrapped.error { batch.error = error }
            case .sync:
                guard let result else { continue }
                guard PQresultStatus(result) == PGRES_PIPELINE_SYNC else {
                    // The batch's implicit transaction failed as it committed (a deferred
                    // constraint or trigger, a serialization failure): an error of no query,
                    // before the sync.
                    let wrapped = PGResult(result)
                    if batch.error == nil {
                        batch.error = wrapped.error ?? PGError(message: "an unexpected result at the end of a batch")
                    }
                    continue
                }
                PQclear(result)
                expectedHead += 1
                batchesHead += 1
                compact()
                if let error = batch.error {
                    batch.completion(.failure(error))
                } else {
                    batch.completion(.success(batch.results))
                }
                if isClosed { return }
            }
        }
    }

    /// Drops what was consumed once it is most of the queues.
    private func compact() {
        if expectedHead > 256 && expectedHead * 2 > expected.count {
            expected.removeFirst(expectedHead)
            expectedHead = 0
        }
        if batchesHead > 64 && batchesHead * 2 > batches.count {
            batches.removeFirst(batchesHead)
            batchesHead = 0
        }
    }

    private func deliverNotifications() {
        while let notification = PQnotifies(connection) {
            let channel = String(cString: notification.pointee.relname)
            let payload = String(cString: notification.pointee.extra)
            PQfreemem(notification)
            onNotification?(channel, payload)
        }
    }

    /// Batches in flight, by `batchesHead`; how many have not completed.
    public var batchesInFlight: Int { batches.count - batchesHead }

    /// The server's process id for this session (to end it from another, in tests).
    public var serverProcessID: Int32 { connection.map { PQbackendPID($0) } ?? 0 }

    /// The socket to the server (to read its options, in tests).
    public var socketDescriptor: Int32 { connection.map { PQsocket($0) } ?? -1 }

    // MARK: the end

    private func lose(_ error: PGError, andFail completion: ((Result<[PGResult], PGError>) -> Void)? = nil) {
        guard !isClosed else { return }
        shutDown(error)
        completion?(.failure(error))
        onClosed?(error)
    }

    /// Closes the connection; batches in flight fail with `connectionLost`.
    public func close() {
        guard !isClosed else { return }
        shutDown(PGError(message: "the connection was closed", isConnectionLost: true))
    }

    private func shutDown(_ error: PGError) {
        isClosed = true
        poll?.close()
        poll = nil
        connectTimer?.close()
        connectTimer = nil
        if let connection {
            PQfinish(connection)
            self.connection = nil
        }
        let failed = batches[batchesHead...]
        batches = []
        batchesHead = 0
        expected = []
        expectedHead = 0
        for batch in failed { batch.completion(.failure(error)) }
        if let connecting {
            self.connecting = nil
            connecting(.failure(error))
        }
    }

    public var isOpen: Bool { !isClosed && connecting == nil && connection != nil }

    private func errorMessage() -> String {
        guard let connection, let text = PQerrorMessage(connection) else { return "unknown libpq error" }
        return String(cString: text).trimmingTrailingNewlines()
    }
}

extension String {
    func trimmingTrailingNewlines() -> String {
        var text = Substring(self)
        while text.last == "\n" { text = text.dropLast() }
        return String(text)
    }
}
