import TaskloopJSON

/// Runs tasks of one kind. The one narrow interface between work and the engine: the executor
/// starts an attempt and reports through its `TaskRun`; the engine alone changes states.
///
/// Threading: engine thread only. Work that blocks runs elsewhere and reports back on the
/// engine thread.
public protocol TaskExecutor: AnyObject {
    /// Checks `params` at submission; a throw refuses the submission (field paths are relative
    /// to `params`, e.g. `duration_ms`).
    func validate(_ params: JSONValue) throws(EngineError)

    /// Starts an attempt. The executor must eventually call exactly one of `succeed`, `fail` or
    /// `cancelled` on `run` (later calls are ignored), and should stop the work when `run`'s
    /// `onCancel` is called. It may report synchronously, before returning.
    func start(_ run: TaskRun)

    /// After a restart (or a cell's takeover): an attempt of task `id` was running when its
    /// server died. Whatever of it may still run must be stopped before the task runs again, so
    /// that one task never runs twice at once: the executor's next `start` of the task waits for
    /// that. Called from `Engine.restore`, on the loop: it must not block.
    func stopInterrupted(_ id: TaskID)

    /// The work is done by someone outside this process, who reports it (`external`): a
    /// shutdown neither waits for it nor stops it, and a restart finds it still running.
    var runsOutsideTheProcess: Bool { get }

    /// Starting an attempt does something a failed commit cannot take back (a program spawned,
    /// a request sent): with `EngineConfiguration.startsAfterCommit` the engine holds the start
    /// until the change that made the task running is durable.
    var startHasEffects: Bool { get }
}

extension TaskExecutor {
    public var runsOutsideTheProcess: Bool { false }

    public var startHasEffects: Bool { false }

    /// Work that lives only in this process died with it: nothing to stop.
    public func stopInterrupted(_ id: TaskID) {}
}

/// A kind of task this engine runs, made once per kind: every record of the kind points at it,
/// one word where the name and the executor took four.
///
/// Threading: immutable.
@usableFromInline
final class TaskKind {
    @usableFromInline let name: String
    let executor: TaskExecutor

    init(name: String, executor: TaskExecutor) {
        self.name = name
        self.executor = executor
    }
}

/// One attempt of one task, as its executor sees it.
public final class TaskRun {
    public let taskID: TaskID
    public let kind: String
    public let params: JSONValue
    public let attempt: Int
    let link: EngineLink
    let record: TaskRecord
    /// Called (once) when the engine wants this attempt to stop: cancellation or timeout.
    public var onCancel: (() -> Void)?
    /// How long this attempt may take to stop once asked, when its kind has its own rule: the
    /// executor sets it at start (an `exec` attempt: its `grace_ms`, then the kill and reap).
    /// The engine finishes a cancelled task without the executor's confirmation only after
    /// this, or after `EngineConfiguration.cancelGraceMilliseconds` when it is nil: one grace
    /// per attempt, stated by whoever knows it.
    public var stopGraceMilliseconds: UInt64?
    public private(set) var stopRequested = false

    init(link: EngineLink, record: TaskRecord) {
        self.link = link
        self.record = record
        taskID = record.id
        kind = record.kind
        params = record.resolvedParams ?? record.params
        attempt = record.attempt
    }

    /// True while the engine still listens to this attempt.
    public var isCurrent: Bool { record.run === self }

    /// Reports progress; `fraction` is clamped to 0...1 and never moves backwards. Returns false
    /// if the engine no longer listens to this attempt.
    @discardableResult
    public func progress(fraction: Double? = nil, message: String? = nil, details: JSONValue? = nil) -> Bool {
        guard let engine = link.engine else { return false }
        return engine.attemptProgressed(self, fraction: fraction, message: message, details: details)
    }

    public func succeed(_ result: JSONValue? = nil) {
        guard let engine = link.engine else { return }
        engine.attemptSucceeded(self, result: result)
    }

    public func fail(_ error: TaskError) {
        guard let engine = link.engine else { return }
        engine.attemptFailed(self, error: error)
    }

    /// Confirms that the work stopped after `onCancel`.
    public func cancelled() {
        guard let engine = link.engine else { return }
        engine.attemptCancelled(self)
    }

    func requestStop() {
        guard !stopRequested else { return }
        stopRequested = true
        let handler = onCancel
        onCancel = nil
        handler?()
    }
}
