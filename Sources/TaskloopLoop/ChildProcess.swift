import CLibUV
import Glibc

/// A program run with `uv_spawn` in a process group of its own, its stdout and stderr read as
/// they come. Loop thread only.
///
/// The child and everything it starts carry `cookie` (`NAME=value` entries added to its
/// environment), so `signalTree` reaches its whole tree: its process group, and through
/// `ProcessTreeKiller` every descendant that left the group (`setsid`, double forks). Given a
/// `cgroup`, the child runs in it from its first instruction, and so does everything it starts,
/// environment cleared or not: `signalTree` reaches that too, and SIGKILL kills it whole.
///
/// Lifecycle: three handles (the process and two pipes), each freed in its close callback.
/// `onExit` is called once, after the child has been reaped *and* both pipes reached EOF (or
/// `stopReading()` gave up on them), so all output has been delivered before it. When the
/// child itself exits, whatever is left of its tree is killed: nothing outlives the run, and a
/// descendant holding the pipes open cannot hold the run open.
public final class ChildProcess {
    public enum Stream: Sendable { case stdout, stderr }

    public let pid: Int32
    public let cookie: [String]
    public let cgroup: Cgroup?
    private let process: UnsafeMutablePointer<uv_process_t>
    private let pipes: [UnsafeMutablePointer<uv_pipe_t>]
    private var onOutput: ((Stream, UnsafeRawBufferPointer) -> Void)?
    private var onExit: ((_ status: Int64, _ signal: Int32) -> Void)?
    private var exit: (status: Int64, signal: Int32)?
    private var openPipes = 2
    private var closedPipes: [UnsafeMutablePointer<uv_pipe_t>] = []
    fileprivate let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16 * 1024, alignment: 1)

    /// Starts `arguments[0]` (searched in the `PATH` of `environment`) with exactly
    /// `environment` and `cookie` (`NAME=value` entries; the cookie's win) in `directory`, inside
    /// `cgroup` when one is given. Throws if it cannot be started.
    public init(
        loop: EventLoop, arguments: [String], environment: [String], cookie: [String], directory: String?,
        cgroup: Cgroup? = nil,
        onOutput: @escaping (Stream, UnsafeRawBufferPointer) -> Void,
        onExit: @escaping (_ status: Int64, _ signal: Int32) -> Void
    ) throws(UVError) {
        precondition(!arguments.isEmpty, "a program to run")
        // libuv learns that a child exited from SIGCHLD. A process started by a parent that
        // blocks it (Foundation's Process does) inherits the blocked mask, and then no exit is
        // ever reported; found by the binary tests.
        unblock(SIGCHLD)
        let cookieNames = Set(cookie.map { $0.prefix { $0 != "=" } })
        let environment = environment.filter { !cookieNames.contains($0.prefix { $0 != "=" }) } + cookie
        var command = arguments
        if let cgroup {
            // The trampoline would report a program it cannot run as its own exit status 127:
            // looked for first, like uv_spawn's exec, it fails to start instead.
            do {
                try Self.checkExecutable(arguments[0], environment: environment, directory: directory)
            } catch {
                readBuffer.deallocate()
                throw error
            }
            command = Self.joiningCgroup(cgroup, arguments)
        }
        var pipes: [UnsafeMutablePointer<uv_pipe_t>] = []
        do {
            for _ in 0..<2 {
                pipes.append(try UVHandle.make(uv_pipe_t.self, "uv_pipe_init") { uv_pipe_init(loop.uvLoop, $0, 0) })
            }
        } catch {
            for pipe in pipes { UVHandle.close(pipe) }
            readBuffer.deallocate()
            throw error
        }
        let process = UnsafeMutablePointer<uv_process_t>.allocate(capacity: 1)
        process.withMemoryRebound(to: uv_handle_t.self, capacity: 1) { $0.pointee.data = nil }
        let status = Self.spawn(loop: loop, process: process, pipes: pipes, arguments: command, environment: environment,
                                directory: directory)
        self.cookie = cookie
        self.cgroup = cgroup
        self.process = process
        self.pipes = pipes
        self.onOutput = onOutput
        self.onExit = onExit
        pid = status == 0 ? uv_process_get_pid(process) : 0
        // uv_spawn initialises the process handle even when it fails; it must be closed either way.
        for pipe in pipes { UVHandle.adopt(pipe, owner: self) }
        UVHandle.adopt(process, owner: self)
        guard status == 0 else {
            self.onOutput = nil
            self.onExit = nil
            closeAll()
            try UVError.check(status, "uv_spawn")
            return
        }
        Self.startedHere.withLock { _ = $0.insert(pid) }
        for pipe in pipes {
            pipe.withMemoryRebound(to: uv_stream_t.self, capacity: 1) { stream in
                if uv_read_start(stream, provideChildReadBuffer, childReadCompleted) != 0 { pipeFinished(pipe) }
            }
        }
    }

    /// Children started here and not yet reaped: libuv waits for these; `OrphanReaper` leaves
    /// them alone.
    private static let startedHere = PThreadLocked<Set<Int32>>([])

    static func isStartedHere(_ pid: Int32) -> Bool {
        startedHere.withLock { $0.contains(pid) }
    }

    deinit {
        readBuffer.deallocate()
    }

    /// `arguments` run through a shell that first moves itself into `cgroup` (writing 0 to
    /// `cgroup.procs` moves the writer), then becomes the program with `exec`, same pid, same
    /// process group. libuv has no hook between its fork and exec, and moving the child once
    /// uv_spawn returns would be too late for a program that double-forks at once. The shell
    /// searches `PATH` as uv_spawn would; the arguments are its positional parameters, never
    /// parsed. Should the move fail (the probe at start makes that unlikely), the program does
    /// not run: the child exits with 125, the shell's message on its stderr.
    static func joiningCgroup(_ cgroup: Cgroup, _ arguments: [String]) -> [String] {
        [CgroupParent.shell, "-c", #"echo 0 > "$1" || exit 125; shift; exec "$@""#, "taskloop-exec", cgroup.path + "/cgroup.procs"]
            + arguments
    }

    /// Throws what uv_spawn would when `program` cannot be run: not found (ENOENT) in `PATH` of
    /// `environment` (or at its path, relative to `directory`, when it names one), or found but
    /// not an executable file (EACCES).
    static func checkExecutable(_ program: String, environment: [String], directory: String?) throws(UVError) {
        func status(_ candidate: String) -> Int32 {
            let path = candidate.hasPrefix("/") ? candidate : (directory.map { $0 + "/" } ?? "") + candidate
            var info = stat()
            guard stat(path, &info) == 0 else { return errno }
            guard info.st_mode & S_IFMT == S_IFREG else { return EACCES }
            return access(path, X_OK) == 0 ? 0 : errno
        }
        var denied = false
        if program.contains("/") {
            let found = status(program)
            guard found != 0 else { return }
            denied = found == EACCES
        } else {
            let searchPath = environment.last { $0.hasPrefix("PATH=") }.map { String($0.dropFirst(5)) } ?? "/usr/bin:/bin"
            for entry in searchPath.split(separator: ":", omittingEmptySubsequences: false) {
                switch status(entry.isEmpty ? program : "\(entry)/\(program)") {
                case 0: return
                case EACCES: denied = true
                default: continue
                }
            }
        }
        throw UVError(code: denied ? -EACCES : -ENOENT, operation: "uv_spawn")
    }

    private static func spawn(
        loop: EventLoop, process: UnsafeMutablePointer<uv_process_t>, pipes: [UnsafeMutablePointer<uv_pipe_t>],
        arguments: [String], environment: [String], directory: String?
    ) -> Int32 {
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = environment.map { strdup($0) } + [nil]
        let cwd = directory.map { strdup($0) } ?? nil
        defer {
            for pointer in argv + envp { free(pointer) }
            free(cwd)
        }
        var stdio = [uv_stdio_container_t](repeating: uv_stdio_container_t(), count: 3)
        stdio[0].flags = UV_IGNORE
        for (index, pipe) in pipes.enumerated() {
            stdio[index + 1].flags = uv_stdio_flags(UV_CREATE_PIPE.rawValue | UV_WRITABLE_PIPE.rawValue)
            stdio[index + 1].data.stream = UnsafeMutableRawPointer(pipe).assumingMemoryBound(to: uv_stream_t.self)
        }
        return argv.withUnsafeBufferPointer { argvBuffer in
            envp.withUnsafeBufferPointer { envpBuffer in
                stdio.withUnsafeMutableBufferPointer { stdioBuffer in
                    var options = uv_process_options_t()
                    options.exit_cb = childExited
                    options.file = UnsafePointer(argv[0])
                    options.args = UnsafeMutablePointer(mutating: argvBuffer.baseAddress)
                    options.env = UnsafeMutablePointer(mutating: envpBuffer.baseAddress)
                    options.cwd = UnsafePointer(cwd)
                    // Detached: the child leads a new session and process group, so the whole
                    // group can be signalled.
                    options.flags = UInt32(UV_PROCESS_DETACHED.rawValue)
                    options.stdio_count = 3
                    options.stdio = stdioBuffer.baseAddress
                    // The program gets descriptors 0, 1 and 2 only: what other libraries opened
                    // without O_CLOEXEC (curl's sockets) must not leak into it (see the shim).
                    taskloop_mark_descriptors_cloexec()
                    return uv_spawn(loop.uvLoop, process, &options)
                }
            }
        }
    }

    /// Sends `signal` to the child's whole tree: its process group and its cgroup now, and every
    /// process carrying its cookie within milliseconds.
    public func signalTree(_ signal: Int32) {
        guard pid > 0 else { return }
        if exit == nil { kill(-pid, signal) }
        if signal == SIGKILL { cgroup?.kill() } else { cgroup?.signal(signal) }
        ProcessTreeKiller.shared.signal(signal, carrying: cookie)
    }

    /// Stops waiting for output: what a process holding the pipes open still writes is lost,
    /// and `onExit` comes as soon as the child has been reaped.
    public func stopReading() {
        for pipe in pipes where !closedPipes.contains(pipe) {
            pipe.withMemoryRebound(to: uv_stream_t.self, capacity: 1) { _ = uv_read_stop($0) }
            pipeFinished(pipe)
        }
    }

    fileprivate func didRead(_ pipe: UnsafeMutablePointer<uv_stream_t>, _ count: Int, _ base: UnsafeMutablePointer<CChar>?) {
        let stream: Stream = UnsafeMutableRawPointer(pipe) == UnsafeMutableRawPointer(pipes[0]) ? .stdout : .stderr
        if count > 0, let base {
            onOutput?(stream, UnsafeRawBufferPointer(start: base, count: count))
        } else if count < 0 {
            // EOF or a read error: either way this stream is done.
            uv_read_stop(pipe)
            pipeFinished(UnsafeMutableRawPointer(pipe).assumingMemoryBound(to: uv_pipe_t.self))
        }
    }

    private func pipeFinished(_ pipe: UnsafeMutablePointer<uv_pipe_t>) {
        guard !closedPipes.contains(pipe) else { return }
        closedPipes.append(pipe)
        UVHandle.close(pipe)
        openPipes -= 1
        finishIfDone()
    }

    /// Called when the child has been reaped while its pipes are still open: something it
    /// left behind holds them (the tree is being killed by then). The owner may give up on
    /// them after a while with `stopReading()`.
    public var onReapedWithPipesOpen: (() -> Void)?

    fileprivate func exited(status: Int64, signal: Int32) {
        Self.startedHere.withLock { _ = $0.remove(pid) }
        // Whatever the child left running, in its group or escaped from it, goes with it.
        kill(-pid, SIGKILL)
        cgroup?.kill()
        exit = (status, signal)
        ProcessTreeKiller.shared.signal(SIGKILL, carrying: cookie)
        if openPipes > 0 { onReapedWithPipesOpen?() }
        finishIfDone()
    }

    private func finishIfDone() {
        guard openPipes == 0, let exit else { return }
        UVHandle.close(process)
        let onExit = self.onExit
        self.onExit = nil
        onOutput = nil
        onReapedWithPipesOpen = nil
        onExit?(exit.status, exit.signal)
    }

    private func closeAll() {
        for pipe in pipes { UVHandle.close(pipe) }
        UVHandle.close(process)
    }
}

private let childExited: uv_exit_cb = { process, status, signal in
    UVHandle.owner(process, as: ChildProcess.self).exited(status: status, signal: signal)
}

private let provideChildReadBuffer: uv_alloc_cb = { handle, _, buffer in
    let readBuffer = UVHandle.owner(handle, as: ChildProcess.self).readBuffer
    buffer!.pointee = uv_buf_init(readBuffer.baseAddress!.assumingMemoryBound(to: CChar.self), UInt32(readBuffer.count))
}

private let childReadCompleted: uv_read_cb = { stream, count, buffer in
    UVHandle.owner(stream, as: ChildProcess.self).didRead(stream!, count, buffer?.pointee.base)
}
