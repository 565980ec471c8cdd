import Dispatch
import Glibc
import TaskloopEngine
import TaskloopLoop
import TaskloopJSON

/// `exec`: `{argv, env?, secret_env?, cwd?, grace_ms = 5000}`. Runs a program (no shell unless
/// argv names one) in its own process group with a minimal environment plus `env` and
/// `secret_env`, marked with the cookie `TASKLOOP_TASK_ID` and `TASKLOOP_TASK_ATTEMPT`, and,
/// where cgroups can be made (`ProcessIsolation`), in a cgroup of its own named by task and
/// attempt. Stdout lines `PROGRESS <fraction|percent%> [message]` report progress; the last
/// 64 KiB of each stream is kept. Exit 0 succeeds, anything else fails. Cancellation and timeouts
/// send SIGTERM to the process tree (the group, the cgroup and every process carrying the
/// cookie), then SIGKILL after `grace_ms` (the cgroup killed whole); the attempt confirms only
/// once the child is reaped. When the child exits, what is left of its tree is killed, and its
/// cgroup is removed once empty.
///
/// Threading: loop thread only.
public final class ExecExecutor: TaskExecutor {
    let loop: EventLoop
    let scheduler: EngineScheduler
    private var live: [ObjectIdentifier: ExecAttempt] = [:]
    /// Set when the server stops: no kill waits past it (an attempt's own `grace_ms` is cut short).
    private(set) var stopDeadline: UInt64?

    /// How long a reaped child's pipes may stay open (held by something it left behind that the
    /// tree kill did not reach) before its output is given up.
    static let exitDrainMilliseconds: UInt64 = 2_000

    /// Variables set like `env` whose values no answer, event, webhook or log shows (contract
    /// v3, Secrets in params): `Representation` masks them.
    public static let secretParameter = "secret_env"

    /// The names of the cookie every program and its descendants carry.
    static let cookieNames: Set<String> = ["TASKLOOP_TASK_ID", "TASKLOOP_TASK_ATTEMPT"]

    /// Cgroups or the cookie alone; chosen once, at start.
    public let isolation: ProcessIsolation
    /// Cgroups of ended attempts that still held processes when last tried; tried again, more
    /// and more slowly, until they are empty and removed.
    private var cgroupsToRemove: [Cgroup] = []
    private var removalRetry: ScheduledAction?
    /// Tasks whose earlier attempts' leftovers are being killed, off the loop, with the starts
    /// that wait for it (`stopInterrupted`).
    private var clearing: [TaskID: [TaskRun]] = [:]

    public init(loop: EventLoop, scheduler: EngineScheduler, isolation: ProcessIsolation) {
        self.loop = loop
        self.scheduler = scheduler
        self.isolation = isolation
    }

    /// Attempts whose child has not been reaped yet.
    public var liveAttempts: Int { live.count }

    /// The server is stopping: stops are cut to end by `deadline`.
    public func stopBy(_ deadline: UInt64) {
        stopDeadline = deadline
    }

    /// The end of the shutdown grace: every tree still running is killed now.
    public func killAll() {
        for attempt in live.values { attempt.kill() }
    }

    /// Past the end: stop waiting for output that killed trees still hold open.
    public func abandonOutput() {
        for attempt in live.values { attempt.abandonOutput() }
    }

    fileprivate func began(_ attempt: ExecAttempt) { live[ObjectIdentifier(attempt)] = attempt }

    fileprivate func ended(_ attempt: ExecAttempt) {
        live.removeValue(forKey: ObjectIdentifier(attempt))
        onIdle?()
    }

    /// Called whenever an attempt's child has been reaped (the application waits for the last
    /// one when it stops).
    public var onIdle: (() -> Void)?

    /// The task and attempt a run's cookie names: on a server, the run's own. A worker runs a
    /// local copy of each task it leases and names the server's task and attempt instead: they
    /// are what the program should see, and what finds a dead worker's leftovers later.
    public var cookieIdentity: (TaskRun) -> (task: String, attempt: Int) = { ($0.taskID.description, $0.attempt) }

    struct Params {
        var arguments: [String]
        var environment: [(String, String)]
        var directory: String?
        var grace: UInt64
    }

    static func parse(_ params: JSONValue) throws(EngineError) -> Params {
        guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
        for key in object.keys where !["argv", "env", secretParameter, "cwd", "grace_ms"].contains(key) {
            throw EngineError(.invalid, "Unknown parameter \(key).", field: key)
        }
        guard let list = object["argv"]?.arrayValue, !list.isEmpty, list.count <= 1_024 else {
            throw EngineError(.invalid, "argv must be a non-empty array of strings (the program, then its arguments).",
                              field: "argv")
        }
        var arguments: [String] = []
        for (index, element) in list.enumerated() {
            guard let text = element.stringValue, !text.utf8.contains(0), index > 0 || !text.isEmpty else {
                throw EngineError(.invalid, "argv[\(index)] must be a string without NUL bytes.", field: "argv[\(index)]")
            }
            arguments.append(text)
        }
        let given = try variables(object, "env")
        let secret = try variables(object, secretParameter)
        for (name, _) in secret where given.contains(where: { $0.0 == name }) {
            throw EngineError(.invalid, "\(secretParameter).\(name) is also in env: give each variable once.",
                              field: "\(secretParameter).\(name)")
        }
        var directory: String?
        if let cwd = object.nonNull("cwd") {
            guard let text = cwd.stringValue, !text.isEmpty, !text.utf8.contains(0) else {
                throw EngineError(.invalid, "cwd must be a directory path.", field: "cwd")
            }
            directory = text
        }
        var grace: UInt64 = 5_000
        if let value = object.nonNull("grace_ms") {
            guard let milliseconds = value.intValue, (0...600_000).contains(milliseconds) else {
                throw EngineError(.invalid, "grace_ms must be an integer from 0 to 600000.", field: "grace_ms")
            }
            grace = UInt64(milliseconds)
        }
        return Params(arguments: arguments, environment: given + secret, directory: directory, grace: grace)
    }

    /// `env` or `secret_env`: names without `=` (nor the cookie's), string values, no NUL.
    /// Messages name the variable, never its value (it may be a secret).
    private static func variables(_ object: JSONObject, _ parameter: String) throws(EngineError) -> [(String, String)] {
        guard let env = object.nonNull(parameter) else { return [] }
        guard let members = env.objectValue else {
            throw EngineError(.invalid, "\(parameter) must be an object of strings.", field: parameter)
        }
        var variables: [(String, String)] = []
        for member in members {
            let field = "\(parameter).\(member.key)"
            guard let value = member.value.stringValue, !member.key.isEmpty, !member.key.contains("="),
                  !member.key.utf8.contains(0), !value.utf8.contains(0) else {
                throw EngineError(.invalid, "\(field) must be a string (names without '=').", field: field)
            }
            guard !cookieNames.contains(member.key) else {
                throw EngineError(.invalid, "\(field) is set by the server: it marks the task's processes.", field: field)
            }
            variables.append((member.key, value))
        }
        return variables
    }

    public func validate(_ params: JSONValue) throws(EngineError) {
        _ = try Self.parse(params)
    }

    /// A program spawned cannot be taken back.
    public var startHasEffects: Bool { true }

    public func start(_ run: TaskRun) {
        if clearing[run.taskID] != nil {
            // A cancel while it waits ends it with nothing started.
            run.onCancel = { [weak run] in run?.cancelled() }
            return clearing[run.taskID]!.append(run)
        }
        let params: Params
        do {
            params = try Self.parse(run.params)
        } catch {
            return run.fail(TaskError(code: "invalid_params", message: error.message))
        }
        // The attempt confirms a stop by itself: SIGKILL at `grace_ms`, the reap, at most the
        // exit drain; the engine's backstop waits for that, and a second more.
        run.stopGraceMilliseconds = params.grace + Self.exitDrainMilliseconds + 1_000
        ExecAttempt(run: run, params: params, executor: self).begin()
    }

    /// A program of an attempt that was running when its server died may outlive it (it runs
    /// detached, and orphans go to init): it is killed before the task can run again. The kill
    /// scans /proc and waits for cgroups to empty, so it runs off the loop (a cell taken over
    /// while the server serves has as many to kill as it had attempts running), and a start of
    /// the task meanwhile waits for it.
    public func stopInterrupted(_ id: TaskID) {
        guard clearing[id] == nil else { return }
        clearing[id] = []
        let isolation = isolation
        let executor = LoopBound(self, loop: loop)
        DispatchQueue.global().async {
            let left = Self.killLeftovers(ofTask: id.description, isolation: isolation)
            _ = executor.loop.execute {
                let executor = executor.value
                executor.removeWhenEmpty(left)
                for run in executor.clearing.removeValue(forKey: id) ?? [] where run.isCurrent && !run.stopRequested {
                    run.onCancel = nil
                    executor.start(run)
                }
            }
        }
    }

    /// Kills whatever earlier attempts of task `task` left running on this machine (a server or
    /// worker killed with -9 leaves its programs behind): the cgroups of its attempts, whole,
    /// and every process carrying its cookie (the only mark in cookie mode, and a second one
    /// for a process that moved itself out of its cgroup). Returns once the signals are sent
    /// and the cgroups have emptied (or a second has passed), with those still in use, for
    /// `removeWhenEmpty`. Blocks: any thread but the loop's.
    public static func killLeftovers(ofTask task: String, isolation: ProcessIsolation) -> [Cgroup] {
        var killed: [Cgroup] = []
        if case .cgroup(let parent) = isolation { killed = parent.killCgroups(prefix: cgroupName(task: task, attempt: nil)) }
        ProcessTreeKiller.shared.signal(SIGKILL, carrying: ["TASKLOOP_TASK_ID=\(task)"])
        ProcessTreeKiller.shared.waitUntilIdle()
        // Gone, not only signalled, before the task runs again; a killed process takes a moment.
        removeAsTheyEmpty(&killed, waitingAtMost: 1_000)
        return killed
    }

    /// Removes each of `cgroups` once empty, blocking for at most `milliseconds`; those still in
    /// use then stay in the list.
    private static func removeAsTheyEmpty(_ cgroups: inout [Cgroup], waitingAtMost milliseconds: Int) {
        var waited = 0
        while true {
            cgroups.removeAll { $0.remove() }
            guard !cgroups.isEmpty, waited < milliseconds else { return }
            usleep(1_000)
            waited += 1
        }
    }

    /// `<task>:<attempt>`, or the prefix of all of a task's attempts. Ids hold no `:` (a server's
    /// are Crockford base 32, a worker takes only URL-safe ones), so one task's prefix never
    /// matches another's cgroups.
    static func cgroupName(task: String, attempt: Int?) -> String {
        "\(task):" + (attempt.map { "\($0)" } ?? "")
    }

    /// Removes each of `cgroups` once no process is left in it. A killed process takes a moment
    /// to go (one in uninterruptible sleep, longer): those still in use are tried again later.
    public func removeWhenEmpty(_ cgroups: [Cgroup]) {
        cgroupsToRemove += cgroups.filter { !$0.remove() }
        retryRemovals(after: 5)
    }

    private func retryRemovals(after delay: UInt64) {
        guard removalRetry == nil, !cgroupsToRemove.isEmpty else { return }
        removalRetry = scheduler.schedule(after: delay) { [weak self] in
            guard let self else { return }
            removalRetry = nil
            cgroupsToRemove.removeAll { $0.remove() }
            retryRemovals(after: min(delay * 2, 1_000))
        }
    }

    /// The end of a stop: waits for the cgroups of killed attempts to empty, at most `timeout`
    /// milliseconds, blocking, and removes them. One still in use then is left behind; the same
    /// attempt run again after the restart takes it over.
    func removeCgroupsLeft(timeout: Int) {
        removalRetry?.cancel()
        removalRetry = nil
        Self.removeAsTheyEmpty(&cgroupsToRemove, waitingAtMost: timeout)
    }

    /// `PATH`, `HOME` and `LANG`, then the task's own `env` on top.
    static func environment(adding extra: [(String, String)]) -> [String] {
        var variables: [(String, String)] = [
            ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            ("HOME", getenv("HOME").map { String(cString: $0) } ?? "/"),
            ("LANG", "C.UTF-8"),
        ]
        for (name, value) in extra {
            if let index = variables.firstIndex(where: { $0.0 == name }) { variables[index].1 = value } else {
                variables.append((name, value))
            }
        }
        return variables.map { "\($0.0)=\($0.1)" }
    }
}

/// One run of one exec task.
private final class ExecAttempt {
    private let run: TaskRun
    private let params: Params
    private unowned let executor: ExecExecutor
    private var child: ChildProcess?
    private var cgroup: Cgroup?
    private var killTimer: ScheduledAction?
    private var drainTimer: ScheduledAction?
    private var stdout = OutputTail()
    private var stderr = OutputTail()
    /// The stdout line being assembled, for PROGRESS lines; capped so a newline-free flood
    /// cannot grow it.
    private var line: [UInt8] = []
    private let started: UInt64

    typealias Params = ExecExecutor.Params

    private var scheduler: EngineScheduler { executor.scheduler }

    init(run: TaskRun, params: Params, executor: ExecExecutor) {
        self.run = run
        self.params = params
        self.executor = executor
        started = executor.scheduler.now
    }

    func begin() {
        let identity = executor.cookieIdentity(run)
        let child: ChildProcess
        do {
            if case .cgroup(let parent) = executor.isolation {
                cgroup = try parent.makeCgroup(named: ExecExecutor.cgroupName(task: identity.task, attempt: identity.attempt))
            }
            // The attempt keeps itself alive through the child's callbacks until it exits.
            child = try ChildProcess(
                loop: executor.loop, arguments: params.arguments,
                environment: ExecExecutor.environment(adding: params.environment),
                cookie: ["TASKLOOP_TASK_ID=\(identity.task)", "TASKLOOP_TASK_ATTEMPT=\(identity.attempt)"],
                directory: params.directory, cgroup: cgroup,
                onOutput: { [self] stream, bytes in received(stream, bytes) },
                onExit: { [self] status, signal in exited(status: status, signal: signal) })
        } catch {
            if let cgroup { executor.removeWhenEmpty([cgroup]) }
            return run.fail(TaskError(code: "spawn_failed", message: "Could not start \(params.arguments[0]): \(error).",
                                      details: ["argv0": .string(params.arguments[0])]))
        }
        self.child = child
        executor.began(self)
        child.onReapedWithPipesOpen = { [unowned self] in
            drainTimer = scheduler.schedule(after: ExecExecutor.exitDrainMilliseconds) { [weak self] in self?.abandonOutput() }
        }
        run.onCancel = { [self] in stop() }
    }

    /// SIGTERM to the tree now, SIGKILL after the grace period (cut short when the server stops).
    private func stop() {
        guard let child else { return }
        child.signalTree(SIGTERM)
        var grace = params.grace
        if let deadline = executor.stopDeadline { grace = min(grace, deadline > scheduler.now ? deadline - scheduler.now : 0) }
        killTimer = scheduler.schedule(after: grace) { [weak self] in self?.kill() }
    }

    func kill() {
        killTimer?.cancel()
        child?.signalTree(SIGKILL)
    }

    func abandonOutput() {
        child?.stopReading()
    }

    private func received(_ stream: ChildProcess.Stream, _ bytes: UnsafeRawBufferPointer) {
        switch stream {
        case .stderr:
            stderr.append(bytes)
        case .stdout:
            stdout.append(bytes)
            for byte in bytes {
                if byte == UInt8(ascii: "\n") {
                    progressLine()
                    line.removeAll(keepingCapacity: true)
                } else if line.count < 4_096 {
                    line.append(byte)
                }
            }
        }
    }

    /// `PROGRESS 0.4 message` or `PROGRESS 40% message`.
    private func progressLine() {
        let text = String(decoding: line, as: UTF8.self)
        guard text.hasPrefix("PROGRESS ") else { return }
        let rest = text.dropFirst(9).drop { $0 == " " }
        let token = rest.prefix { $0 != " " }
        let message = rest.dropFirst(token.count).drop { $0 == " " }
        var fraction: Double?
        if token.hasSuffix("%") {
            fraction = Double(token.dropLast()).map { $0 / 100 }
        } else {
            fraction = Double(token)
        }
        guard let fraction, fraction.isFinite else { return }
        run.progress(fraction: fraction, message: message.isEmpty ? nil : String(message))
    }

    private func exited(status: Int64, signal: Int32) {
        killTimer?.cancel()
        drainTimer?.cancel()
        child = nil
        // The child's exit killed the cgroup; the last of it goes a moment later.
        if let cgroup { executor.removeWhenEmpty([cgroup]) }
        defer { executor.ended(self) }
        if !line.isEmpty { progressLine() }
        var result: JSONObject = [
            "exit_code": signal == 0 ? .int(status) : .null,
            "signal": signal == 0 ? .null : .string(Self.signalName(signal)),
            "stdout": .string(stdout.text), "stderr": .string(stderr.text),
            "stdout_truncated": .bool(stdout.truncated), "stderr_truncated": .bool(stderr.truncated),
            "duration_ms": .int(Int64(scheduler.now - started)),
        ]
        if run.stopRequested {
            run.cancelled()
        } else if status == 0 && signal == 0 {
            run.succeed(.object(result))
        } else {
            let reason = signal == 0 ? "exited with status \(status)" : "was killed by \(Self.signalName(signal))"
            result["argv0"] = .string(params.arguments[0])
            run.fail(TaskError(code: signal == 0 ? "exit_status" : "signal", message: "The program \(reason).", details: result))
        }
    }

    static func signalName(_ signal: Int32) -> String {
        switch signal {
        case SIGTERM: "SIGTERM"
        case SIGKILL: "SIGKILL"
        case SIGINT: "SIGINT"
        case SIGSEGV: "SIGSEGV"
        case SIGABRT: "SIGABRT"
        case SIGPIPE: "SIGPIPE"
        case SIGHUP: "SIGHUP"
        default: "signal \(signal)"
        }
    }
}

/// The last 64 KiB of a stream.
private struct OutputTail {
    static let limit = 64 * 1_024
    private(set) var bytes: [UInt8] = []
    private(set) var truncated = false

    mutating func append(_ chunk: UnsafeRawBufferPointer) {
        bytes.append(contentsOf: chunk)
        if bytes.count > Self.limit {
            bytes.removeFirst(bytes.count - Self.limit)
            truncated = true
        }
    }

    /// As text; a cut through a multi-byte character becomes U+FFFD.
    var text: String { String(decoding: bytes, as: UTF8.self) }
}

/// `exec` on a server started without `--allow-exec`. Such tasks are accepted only into queues
/// that workers lease (there the worker's own flag decides); one that comes to run here anyway
/// (its queue was switched back to server dispatch) fails instead of running.
public final class ExecRefusingExecutor: TaskExecutor {
    public init() {}

    public func validate(_ params: JSONValue) throws(EngineError) {
        _ = try ExecExecutor.parse(params)
    }

    public func start(_ run: TaskRun) {
        run.fail(TaskError(code: "exec_not_allowed",
                           message: "exec tasks are disabled on this server (--allow-exec); its queue is no longer leased by workers."))
    }
}

/// The last step of stopping a process that may have run programs (the server, a worker): the
/// tree kills sent so far are carried out, then the children adopted from stopped tasks are
/// killed and reaped, so none outlives the process or is left a zombie, and the attempts'
/// emptied cgroups removed.
public func finishProcessTrees(exec: ExecExecutor?, orphanReaper: OrphanReaper?) {
    if exec != nil { ProcessTreeKiller.shared.waitUntilIdle() }
    if let orphanReaper {
        orphanReaper.close()
        OrphanReaper.killAndReapAdopted(timeout: 300)
    }
    exec?.removeCgroupsLeft(timeout: 300)
}

/// `--exec-isolation`: what holds together everything an `exec` attempt starts, so that all of
/// it can be stopped.
public enum ExecIsolationMode: String, Sendable, CaseIterable {
    /// A cgroup per attempt where this process can make them, else `cookie`.
    case auto
    /// A cgroup per attempt, or no start at all: for a deployment that counts on it.
    case cgroup
    /// The process group and the environment cookie only (contract v2): for a service manager
    /// that does not want cgroups made inside its own.
    case cookie
}

/// What holds a server's (or worker's) `exec` programs together; `GET /healthz` names it
/// (`process_isolation`).
public enum ProcessIsolation: Sendable {
    /// Each attempt in a cgroup of its own under this parent (plus the group and cookie).
    case cgroup(CgroupParent)
    /// The process group and the cookie only, and why (for the log).
    case cookie(reason: String)

    public var name: String {
        switch self {
        case .cgroup: "cgroup"
        case .cookie: "cookie"
        }
    }

    /// How it will be here; throws only when `cgroup` was asked for and cannot be had.
    public static func choose(_ mode: ExecIsolationMode) throws(ExecIsolationUnavailable) -> ProcessIsolation {
        guard mode != .cookie else { return .cookie(reason: "--exec-isolation cookie") }
        do {
            return .cgroup(try CgroupParent.probe())
        } catch {
            guard mode == .auto else { throw ExecIsolationUnavailable(reason: error.description) }
            return .cookie(reason: error.description)
        }
    }

    /// One line for the start's log.
    public var summary: String {
        switch self {
        case .cgroup(let parent): "exec attempts run in cgroups of their own under \(parent.path)"
        case .cookie(let reason): "exec attempts are held by process group and environment cookie only (\(reason))"
        }
    }
}

public struct ExecIsolationUnavailable: Error, CustomStringConvertible {
    let reason: String
    public var description: String { "--exec-isolation cgroup: this process cannot run programs in cgroups: \(reason)" }
}
