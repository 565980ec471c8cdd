import CLibUV
import Glibc

/// A program run with `posix_spawn` in a session and process group of its own, its stdout and
/// stderr read as they come. Loop thread only.
///
/// posix_spawn, not libuv's `uv_spawn`: libuv 1.44 forks, and a fork copies the page tables of
/// the whole server, so starting a program took four times as long in a server holding 100,000
/// tasks. glibc's posix_spawn shares the server's memory with the child until it execs
/// (`clone(CLONE_VM|CLONE_VFORK)`). libuv watches only the children it spawned, so this one
/// watches its own: a pidfd, readable once the child has exited, polled on the loop, then
/// `waitpid` on that pid alone. libuv waits for no pid it does not know, and `OrphanReaper`
/// leaves alone the pids started here, so each exit is seen once, by its `ChildProcess`.
///
/// The child and everything it starts carry `cookie` (`NAME=value` entries added to its
/// environment), so `signalTree` reaches its whole tree: its process group, and through
/// `ProcessTreeKiller` every descendant that left the group (`setsid`, double forks). Given a
/// `cgroup`, the child runs in it from its first instruction, and so does everything it starts,
/// environment cleared or not: `signalTree` reaches that too, and SIGKILL kills it whole.
///
/// Lifecycle: three handles (the pidfd's poll and two pipes), each freed in its close callback.
/// `onExit` is called once, after the child has been reaped *and* both pipes reached EOF (or
/// `stopReading()` gave up on them), so all output has been delivered before it. When the
/// child itself exits, whatever is left of its tree is killed: nothing outlives the run, and a
/// descendant holding the pipes open cannot hold the run open.
public final class ChildProcess {
    public enum Stream: Sendable { case stdout, stderr }

    public let pid: Int32
    public let cookie: [String]
    public let cgroup: Cgroup?
    /// The child's pidfd, open until the child has been reaped.
    private var pidfd: Int32
    private let exitWatch: UnsafeMutablePointer<uv_poll_t>
    private let pipes: [UnsafeMutablePointer<uv_pipe_t>]
    private var onOutput: ((Stream, UnsafeRawBufferPointer) -> Void)?
    private var onExit: ((_ status: Int64, _ signal: Int32) -> Void)?
    private var exit: (status: Int64, signal: Int32)?
    private var openPipes = 2
    private var closedPipes: [UnsafeMutablePointer<uv_pipe_t>] = []
    fileprivate let readBuffer: UnsafeMutableRawBufferPointer

    /// Starts `arguments[0]` (searched in the `PATH` of `environment`) with exactly
    /// `environment` and `cookie` (`NAME=value` entries; the cookie's win) in `directory`, inside
    /// `cgroup` when one is given. Throws if it cannot be started: ENOENT when the program is
    /// not found, EACCES when what was found cannot be run.
    public init(
        loop: EventLoop, arguments: [String], environment: [String], cookie: [String], directory: String?,
        cgroup: Cgroup? = nil,
        onOutput: @escaping (Stream, UnsafeRawBufferPointer) -> Void,
        onExit: @escaping (_ status: Int64, _ signal: Int32) -> Void
    ) throws(UVError) {
        precondition(!arguments.isEmpty, "a program to run")
        let cookieNames = Set(cookie.map { $0.prefix { $0 != "=" } })
        let environment = environment.filter { !cookieNames.contains($0.prefix { $0 != "=" }) } + cookie
        // Searched here, in the program's PATH and relative to its directory, as execvp in
        // uv_spawn's child did; the trampoline searches again, the same PATH, but a program it
        // cannot run would be its own exit status 127, so it is looked for first either way.
        let program = try Self.executablePath(arguments[0], environment: environment, directory: directory)
        let started = try Self.start(
            loop: loop, program: cgroup == nil ? program : CgroupParent.shell,
            arguments: cgroup.map { Self.joiningCgroup($0, arguments) } ?? arguments,
            environment: environment, directory: directory)
        pid = started.pid
        pidfd = started.pidfd
        exitWatch = started.exitWatch
        pipes = started.pipes
        self.cookie = cookie
        self.cgroup = cgroup
        self.onOutput = onOutput
        self.onExit = onExit
        readBuffer = .allocate(byteCount: 16 * 1024, alignment: 1)
        // Before the loop's next turn, so before any callback of these handles can come.
        UVHandle.adopt(exitWatch, owner: self)
        for pipe in pipes { UVHandle.adopt(pipe, owner: self) }
        for pipe in pipes {
            pipe.withMemoryRebound(to: uv_stream_t.self, capacity: 1) { stream in
                if uv_read_start(stream, provideChildReadBuffer, childReadCompleted) != 0 { pipeFinished(pipe) }
            }
        }
    }

    /// Children started here and not yet reaped: each `ChildProcess` waits for its own;
    /// `OrphanReaper` leaves them alone.
    private static let startedHere = PThreadLocked<Set<Int32>>([])

    static func isStartedHere(_ pid: Int32) -> Bool {
        startedHere.withLock { $0.contains(pid) }
    }

    deinit {
        readBuffer.deallocate()
    }

    private struct Started {
        let pid: Int32
        let pidfd: Int32
        let exitWatch: UnsafeMutablePointer<uv_poll_t>
        let pipes: [UnsafeMutablePointer<uv_pipe_t>]
    }

    /// The pipes (the loop's ends open in uv_pipe handles, the child's given to it), the child,
    /// and the watch on its exit, started; on a failure, everything made so far is undone (a
    /// child already running is killed and waited for) and the failure thrown.
    private static func start(
        loop: EventLoop, program: String, arguments: [String], environment: [String], directory: String?
    ) throws(UVError) -> Started {
        var pipes: [UnsafeMutablePointer<uv_pipe_t>] = []
        var childEnds: [Int32] = []
        var pid: Int32 = 0
        var pidfd: Int32 = -1
        var exitWatch: UnsafeMutablePointer<uv_poll_t>?
        var succeeded = false
        defer {
            for fd in childEnds { close(fd) }
            if !succeeded {
                if let exitWatch { UVHandle.close(exitWatch) }
                if pidfd >= 0 { close(pidfd) }
                for pipe in pipes { UVHandle.close(pipe) }
                if pid > 0 {
                    abandon(pid)
                    startedHere.withLock { _ = $0.remove(pid) }
                }
            }
        }
        for _ in 0..<2 {
            let pipe = try UVHandle.make(uv_pipe_t.self, "uv_pipe_init") { uv_pipe_init(loop.uvLoop, $0, 0) }
            pipes.append(pipe)
            var ends: [Int32] = [-1, -1]
            guard taskloop_pipe_cloexec(&ends) == 0 else { throw UVError(code: -errno, operation: "pipe2") }
            childEnds.append(ends[1])
            let opened = uv_pipe_open(pipe, ends[0])
            if opened != 0 { close(ends[0]) }
            try UVError.check(opened, "uv_pipe_open")
        }
        // Counted as started here from the moment it exists: a shutdown's sweep on another
        // thread (`OrphanReaper.killAndReapAdopted`) would kill it as an orphan otherwise.
        let status = startedHere.withLock { started -> Int32 in
            var spawned: Int32 = 0
            let status = spawn(program: program, arguments: arguments, environment: environment, directory: directory,
                               stdout: childEnds[0], stderr: childEnds[1], pid: &spawned)
            // A failed posix_spawn has waited for its child already: that pid may be anyone's now.
            if status == 0 {
                started.insert(spawned)
                pid = spawned
            }
            return status
        }
        guard status == 0 else { throw UVError(code: -status, operation: "posix_spawn") }
        pidfd = taskloop_pidfd_open(pid)
        guard pidfd >= 0 else { throw UVError(code: -errno, operation: "pidfd_open") }
        let watch = try UVHandle.make(uv_poll_t.self, "uv_poll_init") { uv_poll_init(loop.uvLoop, $0, pidfd) }
        exitWatch = watch
        try UVError.check(uv_poll_start(watch, Int32(UV_READABLE.rawValue), childExitReady), "uv_poll_start")
        succeeded = true
        return Started(pid: pid, pidfd: pidfd, exitWatch: watch, pipes: pipes)
    }

    /// posix_spawn of `program`; a file the kernel cannot execute (ENOEXEC: a script without
    /// `#!`) is run by /bin/sh, as execvp in uv_spawn's child did. Returns 0 or an errno.
    private static func spawn(
        program: String, arguments: [String], environment: [String], directory: String?, stdout: Int32, stderr: Int32,
        pid: inout Int32
    ) -> Int32 {
        func attempt(_ program: String, _ arguments: [String]) -> Int32 {
            let argv = arguments.map { strdup($0) } + [nil]
            let envp = environment.map { strdup($0) } + [nil]
            defer { for pointer in argv + envp { free(pointer) } }
            return taskloop_spawn(&pid, program, argv, envp, directory, stdout, stderr)
        }
        let status = attempt(program, arguments)
        guard status == ENOEXEC else { return status }
        return attempt("/bin/sh", ["/bin/sh", program] + arguments.dropFirst())
    }

    /// A child started but not to be watched (the watch could not be set up): killed with its
    /// group and waited for, which a SIGKILL makes quick.
    private static func abandon(_ pid: Int32) {
        kill(-pid, SIGKILL)
        kill(pid, SIGKILL)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    }

    /// `arguments` run through a shell that first moves itself into `cgroup` (writing 0 to
    /// `cgroup.procs` moves the writer), then becomes the program with `exec`, same pid, same
    /// process group. posix_spawn has no step that joins a cgroup (glibc 2.36 has no
    /// `posix_spawnattr_setcgroup_np`; clone3's CLONE_INTO_CGROUP without copying the process
    /// would need a hand-made clone on a stack of its own), and moving the child once it runs
    /// would be too late for a program that double-forks at once. The shell is spawned the
    /// same way, without a copy; it searches `PATH` as execvp would; the arguments are its
    /// positional parameters, never parsed. Should the move fail (the probe at start makes that
    /// unlikely), the program does not run: the child exits with 125, the shell's message on
    /// its stderr.
    static func joiningCgroup(_ cgroup: Cgroup, _ arguments: [String]) -> [String] {
        [CgroupParent.shell, "-c", #"echo 0 > "$1" || exit 125; shift; exec "$@""#, "taskloop-exec", cgroup.path + "/cgroup.procs"]
            + arguments
    }

    /// Where `program` is, as execvp finds it: at its path (relative to `directory`) when it
    /// names one, else in the `PATH` of `environment`; the path to run, relative to the child's
    /// working directory. Throws ENOENT when it is nowhere, EACCES when what was found is not
    /// an executable file.
    static func executablePath(_ program: String, environment: [String], directory: String?) throws(UVError) -> String {
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
            guard found != 0 else { return program }
            denied = found == EACCES
        } else {
            let searchPath = environment.last { $0.hasPrefix("PATH=") }.map { String($0.dropFirst(5)) } ?? "/usr/bin:/bin"
            for entry in searchPath.split(separator: ":", omittingEmptySubsequences: false) {
                let candidate = entry.isEmpty ? program : "\(entry)/\(program)"
                switch status(candidate) {
                case 0: return candidate
                case EACCES: denied = true
                default: continue
                }
            }
        }
        throw UVError(code: denied ? -EACCES : -ENOENT, operation: "posix_spawn")
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

    /// The pidfd is readable: the child has exited, and is reaped here (a pidfd is readable only
    /// once the whole process has exited, so `waitpid` finds it).
    fileprivate func exitReady() {
        var status: Int64 = 0
        var signal: Int32 = 0
        switch taskloop_reap_child(pid, &status, &signal) {
        case 0:
            return
        case 1:
            break
        default:
            // Waited for by someone else (only a shutdown's last sweep waits for any child):
            // its status is lost; never reported as a success.
            status = 0
            signal = SIGKILL
        }
        // uv_close stops the poll at once; the descriptor is closed after it, so libuv never
        // touches a number that may already be another's.
        UVHandle.close(exitWatch)
        close(pidfd)
        pidfd = -1
        exited(status: status, signal: signal)
    }

    private func exited(status: Int64, signal: Int32) {
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
        let onExit = self.onExit
        self.onExit = nil
        onOutput = nil
        onReapedWithPipesOpen = nil
        onExit?(exit.status, exit.signal)
    }
}

private let childExitReady: uv_poll_cb = { handle, _, _ in
    UVHandle.owner(handle, as: ChildProcess.self).exitReady()
}

private let provideChildReadBuffer: uv_alloc_cb = { handle, _, buffer in
    let readBuffer = UVHandle.owner(handle, as: ChildProcess.self).readBuffer
    buffer!.pointee = uv_buf_init(readBuffer.baseAddress!.assumingMemoryBound(to: CChar.self), UInt32(readBuffer.count))
}

private let childReadCompleted: uv_read_cb = { stream, count, buffer in
    UVHandle.owner(stream, as: ChildProcess.self).didRead(stream!, count, buffer?.pointee.base)
}
