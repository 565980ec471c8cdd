import CLibUV
import Dispatch
import Glibc

/// Signals every process that carries an environment cookie, wherever it has gone: a process
/// group catches what a program starts, but not a descendant that called `setsid` (a daemon)
/// or was double-forked away. Like Jenkins' ProcessTreeKiller, the cookie (`NAME=value`
/// entries the child was started with, inherited by everything it starts) finds them all in
/// /proc, whoever their parent now is.
///
/// Threading: `signal` may be called from any thread. The /proc scans run on a queue of their
/// own, never on an event loop (a scan reads every process's environment); requests that
/// arrive while one runs share the next scan.
public final class ProcessTreeKiller: Sendable {
    public static let shared = ProcessTreeKiller()

    private struct Request {
        let entries: [[UInt8]]
        let signal: Int32
    }

    private let queue = DispatchQueue(label: "taskloop.process-tree-killer")
    private let pending = PThreadLocked<[Request]>([])

    /// Sends `signal` to every process but this one whose environment holds each of `cookie`'s
    /// `NAME=value` entries. Asynchronous: the signals go out within milliseconds.
    public func signal(_ signal: Int32, carrying cookie: [String]) {
        precondition(!cookie.isEmpty, "a cookie names at least one entry")
        let request = Request(entries: cookie.map { Array($0.utf8) }, signal: signal)
        let first = pending.withLock { pending -> Bool in
            pending.append(request)
            return pending.count == 1
        }
        if first { queue.async { self.sweep() } }
    }

    /// Returns once every request made before the call has been carried out.
    public func waitUntilIdle() {
        queue.sync {}
    }

    private func sweep() {
        let requests = pending.withLock { pending -> [Request] in
            defer { pending = [] }
            return pending
        }
        guard !requests.isEmpty, let proc = opendir("/proc") else { return }
        defer { closedir(proc) }
        let me = getpid()
        var environment: [UInt8] = []
        while let entry = readdir(proc) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard let pid = Int32(name), pid != me, Self.readEnvironment(of: pid, into: &environment) else { continue }
            for request in requests where Self.holds(environment, every: request.entries) {
                kill(pid, request.signal)
            }
        }
    }

    /// The processes whose parent is `parent`, from /proc/PID/stat.
    static func children(of parent: Int32) -> [Int32] {
        guard let proc = opendir("/proc") else { return [] }
        defer { closedir(proc) }
        var found: [Int32] = []
        while let entry = readdir(proc) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard let pid = Int32(name), let stat = readSmallFile("/proc/\(pid)/stat"),
                  let fields = stat.split(separator: ")").last?.split(separator: " "), fields.count > 2,
                  Int32(fields[1]) == parent else { continue }
            found.append(pid)
        }
        return found
    }

    private static func readSmallFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4_096)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        return count > 0 ? String(decoding: buffer[..<count], as: UTF8.self) : nil
    }

    /// /proc/PID/environ: the environment the process was started with, `NAME=value` entries
    /// each ended by a NUL. False for a process that is gone or not ours to read.
    private static func readEnvironment(of pid: Int32, into buffer: inout [UInt8]) -> Bool {
        let fd = open("/proc/\(pid)/environ", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        buffer.removeAll(keepingCapacity: true)
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while buffer.count < 4 * 1024 * 1024 {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            buffer.append(contentsOf: chunk[..<count])
        }
        return !buffer.isEmpty
    }

    private static func holds(_ environment: [UInt8], every entries: [[UInt8]]) -> Bool {
        entries.allSatisfy { entry in
            var start = 0
            while start < environment.count {
                let end = environment[start...].firstIndex(of: 0) ?? environment.count
                if end - start == entry.count && environment[start..<end].elementsEqual(entry) { return true }
                start = end + 1
            }
            return false
        }
    }
}

/// Waits for the orphans a child subreaper inherits. With `becomeChildSubreaper()`, a process
/// that a task's program left behind (a daemon, a double fork) becomes a child of this one when
/// its parent exits, so the process-tree killer's signals reach processes that stay ours; and
/// once dead, each must be waited for or it stays a zombie. Each `ChildProcess` waits only for
/// its own child, by pid, so the rest are waited for here after every SIGCHLD.
///
/// Threading: loop thread only. `close()` frees its handles.
public final class OrphanReaper {
    private let watcher: SignalWatcher
    private let timer: LoopTimer

    /// Makes this process a child subreaper (Linux's PR_SET_CHILD_SUBREAPER). Process-wide and
    /// permanent; a server that runs programs calls it once at start.
    public static func becomeChildSubreaper() throws(UVError) {
        guard taskloop_become_child_subreaper() == 0 else { throw UVError(code: -errno, operation: "prctl(PR_SET_CHILD_SUBREAPER)") }
    }

    public init(loop: EventLoop) throws(UVError) {
        let timer = try LoopTimer(loop: loop)
        self.timer = timer
        do {
            // Reaping a turn later gives the children `ChildProcess` started, whose pidfds are
            // readable by then, to their own watch first.
            watcher = try SignalWatcher(loop: loop, signal: SIGCHLD) { timer.start(after: 0) { Self.reap(retry: timer) } }
        } catch {
            timer.close()
            throw error
        }
    }

    public func close() {
        watcher.close()
        timer.close()
    }

    /// The last step of a shutdown, once every child `ChildProcess` started has been reaped:
    /// whatever children are left were adopted from stopped tasks; they are killed and waited
    /// for (at most `timeout` milliseconds), so none outlives the server or is left a zombie.
    /// Each is waited for by its pid, never `waitpid(-1)`: a child a `ChildProcess` still
    /// watches (another loop's, in a process running several) keeps its exit for its watch.
    /// Blocks the calling thread for that long at most.
    public static func killAndReapAdopted(timeout: UInt64) {
        ProcessTreeKiller.shared.waitUntilIdle()
        var waited: UInt64 = 0
        var killed = false
        while true {
            // Looked for again each round: an orphan of a killed one comes back to this process.
            let adopted = ProcessTreeKiller.children(of: getpid()).filter { !ChildProcess.isStartedHere($0) }
            if !killed {
                for pid in adopted { kill(pid, SIGKILL) }
                killed = true
            }
            var status: Int32 = 0
            let running = adopted.filter { waitpid($0, &status, WNOHANG) == 0 }
            guard !running.isEmpty, waited < timeout else { return }
            usleep(2_000)
            waited += 2
        }
    }

    /// Waits for every exited child that `ChildProcess` did not start. One of those that has not
    /// been reaped yet hides the ones behind it from `waitid`, so then it looks again shortly.
    private static func reap(retry timer: LoopTimer) {
        while true {
            let pid = taskloop_peek_exited_child()
            guard pid > 0 else { return }
            if ChildProcess.isStartedHere(pid) {
                timer.start(after: 10) { reap(retry: timer) }
                return
            }
            var status: Int32 = 0
            waitpid(pid, &status, WNOHANG)
        }
    }
}
