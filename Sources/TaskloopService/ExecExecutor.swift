import Glibc
import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON

/// `exec`: `{argv, env?, cwd?, grace_ms = 5000}`. Runs a program (no shell unless argv names
/// one) in its own process group with a minimal environment plus `env`. Stdout lines
/// `PROGRESS <fraction|percent%> [message]` report progress; the last 64 KiB of each stream is
/// kept. Exit 0 succeeds, anything else fails. Cancellation and timeouts send SIGTERM to the
/// group, then SIGKILL after `grace_ms`; the attempt confirms only once the child is reaped.
///
/// Threading: loop thread only.
final class ExecExecutor: TaskExecutor {
    private let loop: EventLoop
    private let scheduler: EngineScheduler

    init(loop: EventLoop, scheduler: EngineScheduler) {
        self.loop = loop
        self.scheduler = scheduler
    }

    struct Params {
        var arguments: [String]
        var environment: [(String, String)]
        var directory: String?
        var grace: UInt64
    }

    static func parse(_ params: JSONValue) throws(EngineError) -> Params {
        guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
        for key in object.keys where !["argv", "env", "cwd", "grace_ms"].contains(key) {
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
        var environment: [(String, String)] = []
        if let env = object.nonNull("env") {
            guard let members = env.objectValue else { throw EngineError(.invalid, "env must be an object of strings.", field: "env") }
            for member in members {
                guard let value = member.value.stringValue, !member.key.isEmpty, !member.key.contains("="),
                      !member.key.utf8.contains(0), !value.utf8.contains(0) else {
                    throw EngineError(.invalid, "env.\(member.key) must be a string (names without '=').", field: "env.\(member.key)")
                }
                environment.append((member.key, value))
            }
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
        return Params(arguments: arguments, environment: environment, directory: directory, grace: grace)
    }

    func validate(_ params: JSONValue) throws(EngineError) {
        _ = try Self.parse(params)
    }

    func start(_ run: TaskRun) {
        let params: Params
        do {
            params = try Self.parse(run.params)
        } catch {
            return run.fail(TaskError(code: "invalid_params", message: error.message))
        }
        ExecAttempt(run: run, params: params, loop: loop, scheduler: scheduler).begin()
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
    private let loop: EventLoop
    private let scheduler: EngineScheduler
    private var child: ChildProcess?
    private var killTimer: ScheduledAction?
    private var stdout = OutputTail()
    private var stderr = OutputTail()
    /// The stdout line being assembled, for PROGRESS lines; capped so a newline-free flood
    /// cannot grow it.
    private var line: [UInt8] = []
    private let started: UInt64

    typealias Params = ExecExecutor.Params

    init(run: TaskRun, params: Params, loop: EventLoop, scheduler: EngineScheduler) {
        self.run = run
        self.params = params
        self.loop = loop
        self.scheduler = scheduler
        started = scheduler.now
    }

    func begin() {
        do {
            // The attempt keeps itself alive through the child's callbacks until it exits.
            child = try ChildProcess(
                loop: loop, arguments: params.arguments, environment: ExecExecutor.environment(adding: params.environment),
                directory: params.directory,
                onOutput: { [self] stream, bytes in received(stream, bytes) },
                onExit: { [self] status, signal in exited(status: status, signal: signal) })
        } catch {
            return run.fail(TaskError(code: "spawn_failed", message: "Could not start \(params.arguments[0]): \(error).",
                                      details: ["argv0": .string(params.arguments[0])]))
        }
        run.onCancel = { [self] in stop() }
    }

    /// SIGTERM to the group now, SIGKILL after the grace period.
    private func stop() {
        guard let child else { return }
        child.signalGroup(SIGTERM)
        killTimer = scheduler.schedule(after: params.grace) { [weak child] in child?.signalGroup(SIGKILL) }
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
        child = nil
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
