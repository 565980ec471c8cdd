import TaskloopClient
import TaskloopHTTPClient
import TaskloopLoop

/// Follows a task or a workflow to its end through the event stream, and wins the stream back
/// when it is lost.
///
/// - A task: `GET /tasks/{id}/events` sends the task as it is (`task.snapshot`), then its
///   events, and ends after the terminal one. A resumed stream starts with a fresh snapshot,
///   so it needs no event id.
/// - A workflow: `GET /workflows/{id}` (its `Event-Seq` says which event it reflects), then
///   `GET /events?workflow={id}&since={seq}`. A resumed stream sends `Last-Event-ID` (the last
///   event taken) and gets what it missed; `event: reset` (the server no longer has those
///   events) means the workflow is fetched again and streamed from its new `Event-Seq`.
/// - An id that is not known yet is tried as a task first, then as a workflow.
///
/// A stream that breaks off, ends early (a server stopping), or stays silent past
/// `streamIdleTimeoutMilliseconds` is opened again after a backoff (the first step the
/// server's `retry:`), until `reconnectTimeoutMilliseconds` pass without a stream; a server
/// that was never reached, an unknown id and a refusal end the watch at once.
///
/// Threading: loop thread only (its calls, timers and callbacks run there).
final class Watcher {
    private unowned let session: ClientSession
    private let id: String
    private let display: WatchDisplay
    private let onEnd: (_ state: String) -> Void
    /// The model, read by the display when it draws; changed in place.
    private let state = WatchState()
    private var parser: ServerSentEventParser
    private var call: ServerCall?
    private let idleTimer: LoopTimer
    private let retryTimer: LoopTimer
    private var backoff: Backoff?
    /// When the current outage began (loop milliseconds); nil while a stream is open.
    private var lostSince: UInt64?
    /// The stream open now, or being opened, follows a workflow.
    private var followsWorkflow = false
    private var ended = false

    /// The `retry:` the server sends; used until a stream says otherwise.
    static let defaultRetryMilliseconds: UInt64 = 2_000

    init(session: ClientSession, id: String, display: WatchDisplay, onEnd: @escaping (_ state: String) -> Void) throws(UVError) {
        self.session = session
        self.id = id
        self.display = display
        self.onEnd = onEnd
        parser = ServerSentEventParser(maxEventBytes: session.settings.maxAnswerBytes)
        idleTimer = try LoopTimer(loop: session.loop)
        do {
            retryTimer = try LoopTimer(loop: session.loop)
        } catch {
            idleTimer.close()
            throw error
        }
        session.onFinish { [unowned self] in stop() }
    }

    /// Starts following: a workflow when the caller knows it is one (it just submitted it),
    /// else the id is tried as a task first.
    func start(isWorkflow: Bool) {
        if isWorkflow { fetchWorkflow() } else { openTaskStream() }
    }

    // MARK: the streams

    private var encodedID: String { URLText.encoded(id) }

    private func openTaskStream() {
        followsWorkflow = false
        parser.restart()
        call = session.server.stream("/tasks/\(encodedID)/events", onOpen: { [unowned self] _ in opened() },
                                     onChunk: { [unowned self] in received($0) }) { [unowned self] reply in
            call = nil
            streamEnded(reply)
        }
    }

    private func fetchWorkflow() {
        followsWorkflow = true
        call = session.server.call("GET", "/workflows/\(encodedID)") { [unowned self] reply in
            call = nil
            guard let response = response(reply) else { return }
            guard response.isSuccess, let object = response.json?.objectValue else {
                if response.status == 404 { return session.failUnknown(id) }
                return refusedOrLost(response)
            }
            // Without it, no stream could start where this answer ends.
            guard let seq = response.header("Event-Seq"), !seq.isEmpty,
                  seq.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else {
                return session.failUnreadable("the answer to GET /workflows/\(id) has no Event-Seq")
            }
            let changes = state.model.load(workflow: object, seq: seq)
            display.show(state, changes)
            if state.model.outcome != nil { return end() }
            openWorkflowStream(resuming: false)
        }
    }

    private func openWorkflowStream(resuming: Bool) {
        followsWorkflow = true
        parser.restart()
        let headers = resuming ? [HTTPHeaderField("Last-Event-ID", state.model.lastSeq)] : []
        call = session.server.stream("/events?workflow=\(encodedID)&since=\(state.model.lastSeq)", headers: headers,
                                     onOpen: { [unowned self] _ in opened() },
                                     onChunk: { [unowned self] in received($0) }) { [unowned self] reply in
            call = nil
            streamEnded(reply)
        }
    }

    private func opened() {
        session.hasReachedServer = true
        if lostSince != nil {
            lostSince = nil
            backoff = nil
            display.note(nil)
        }
        idleTimer.start(after: session.settings.streamIdleTimeoutMilliseconds) { [unowned self] in silent() }
    }

    /// A piece of the stream (called from inside the HTTP client).
    private func received(_ bytes: UnsafeRawBufferPointer) {
        guard !ended else { return }
        idleTimer.start(after: session.settings.streamIdleTimeoutMilliseconds) { [unowned self] in silent() }
        let events: [ServerSentEvent]
        do {
            events = try parser.feed(bytes)
        } catch {
            return session.failUnreadable("\(error)")
        }
        for event in events {
            switch state.model.apply(event) {
            case .changed(let changes):
                display.show(state, changes)
            case .unchanged:
                continue
            case .reset:
                // Events were lost for good: the workflow as it is now, then what follows it.
                dropStream()
                return fetchWorkflow()
            }
            if state.model.outcome != nil { return end() }
        }
    }

    private func streamEnded(_ reply: ServerReply) {
        idleTimer.stop()
        guard let response = response(reply) else { return }
        if response.isSuccess {
            // The server ended the stream before the end (it is stopping): come back.
            return state.model.outcome != nil ? end() : lost("the server ended the event stream")
        }
        if response.status == 404, !followsWorkflow {
            // Not a task (or no longer one): perhaps a workflow.
            return state.model.subject == nil ? fetchWorkflow() : session.failUnknown(id)
        }
        refusedOrLost(response)
    }

    /// The answer, or nil once a failed exchange has been taken as a lost stream.
    private func response(_ reply: ServerReply) -> ServerResponse? {
        switch reply {
        case .failed(let reason):
            lost(reason)
            return nil
        case .answered(let response):
            session.hasReachedServer = true
            return response
        }
    }

    /// Statuses that say "later" are an outage; any other refusal ends the watch.
    private func refusedOrLost(_ response: ServerResponse) {
        switch response.status {
        case 200...299: session.failUnreadable("the answer to GET /workflows/\(id) is not a workflow")
        case 408, 429, 500...: lost(response.problem?.description ?? "status \(response.status)")
        default: session.fail(response)
        }
    }

    private func silent() {
        dropStream()
        lost("no data for \(session.settings.streamIdleTimeoutMilliseconds / 1_000) s")
    }

    private func dropStream() {
        idleTimer.stop()
        call?.cancel()
        call = nil
    }

    // MARK: winning it back

    private func lost(_ reason: String) {
        guard !ended else { return }
        guard session.hasReachedServer else { return session.failUnreachable(reason) }
        let now = session.loop.now
        let since = lostSince ?? now
        lostSince = since
        let limit = session.settings.reconnectTimeoutMilliseconds
        guard now - since < limit else {
            return session.failUnreachable("\(reason); gave up after \(limit / 1_000) s without the event stream")
        }
        if backoff == nil {
            let first = parser.retryMilliseconds.map { UInt64($0) } ?? Self.defaultRetryMilliseconds
            backoff = Backoff(initialMilliseconds: first, maximumMilliseconds: session.settings.maxBackoffMilliseconds)
        }
        let delay = min(backoff!.nextDelay(), limit - (now - since))
        display.note("lost the event stream (\(reason)); trying again in \(Timestamp.span(Int64(delay) + 999))")
        retryTimer.start(after: delay) { [unowned self] in resume() }
    }

    private func resume() {
        switch state.model.subject {
        case .workflow: openWorkflowStream(resuming: true)
        case .task: openTaskStream()
        case nil: followsWorkflow ? fetchWorkflow() : openTaskStream()
        }
    }

    // MARK: the end

    private func end() {
        guard !ended, let outcome = state.model.outcome else { return }
        stop()
        onEnd(outcome)
    }

    /// Stops everything; the display keeps its last picture.
    private func stop() {
        guard !ended else { return }
        ended = true
        dropStream()
        idleTimer.close()
        retryTimer.close()
        display.close()
    }
}
