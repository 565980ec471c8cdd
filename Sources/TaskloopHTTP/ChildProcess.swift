import CLibUV
import Glibc

/// A program run with `uv_spawn` in a process group of its own, its stdout and stderr read as
/// they come. Loop thread only.
///
/// Lifecycle: three handles (the process and two pipes), each freed in its close callback.
/// `onExit` is called once, after the child has been reaped *and* both pipes reached EOF, so all
/// output has been delivered before it. When the child itself exits, whatever is left of its
/// group (a grandchild it started in the background) is killed: nothing outlives the run, and
/// a grandchild holding the pipes open cannot hold the run open.
public final class ChildProcess {
    public enum Stream: Sendable { case stdout, stderr }

    public let pid: Int32
    private let process: UnsafeMutablePointer<uv_process_t>
    private let pipes: [UnsafeMutablePointer<uv_pipe_t>]
    private var onOutput: ((Stream, UnsafeRawBufferPointer) -> Void)?
    private var onExit: ((_ status: Int64, _ signal: Int32) -> Void)?
    private var exit: (status: Int64, signal: Int32)?
    private var openPipes = 2
    fileprivate let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16 * 1024, alignment: 1)

    /// Starts `arguments[0]` (searched in the `PATH` of `environment`) with exactly
    /// `environment` (`NAME=value` entries) in `directory`. Throws if it cannot be started.
    public init(
        loop: EventLoop, arguments: [String], environment: [String], directory: String?,
        onOutput: @escaping (Stream, UnsafeRawBufferPointer) -> Void,
        onExit: @escaping (_ status: Int64, _ signal: Int32) -> Void
    ) throws(UVError) {
        precondition(!arguments.isEmpty, "a program to run")
        // libuv learns that a child exited from SIGCHLD. A process started by a parent that
        // blocks it (Foundation's Process does) inherits the blocked mask, and then no exit is
        // ever reported; found by the binary tests.
        unblock(SIGCHLD)
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
        let status = Self.spawn(loop: loop, process: process, pipes: pipes, arguments: arguments,
                                environment: environment, directory: directory)
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
        for pipe in pipes {
            pipe.withMemoryRebound(to: uv_stream_t.self, capacity: 1) { stream in
                if uv_read_start(stream, provideChildReadBuffer, childReadCompleted) != 0 { pipeFinished(pipe) }
            }
        }
    }

    deinit {
        readBuffer.deallocate()
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
                    return uv_spawn(loop.uvLoop, process, &options)
                }
            }
        }
    }

    /// Sends `signal` to the child's whole process group (it and everything it started).
    public func signalGroup(_ signal: Int32) {
        guard exit == nil, pid > 0 else { return }
        kill(-pid, signal)
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
        UVHandle.close(pipe)
        openPipes -= 1
        finishIfDone()
    }

    fileprivate func exited(status: Int64, signal: Int32) {
        // Whatever the child left running in its group goes with it.
        kill(-pid, SIGKILL)
        exit = (status, signal)
        finishIfDone()
    }

    private func finishIfDone() {
        guard openPipes == 0, let exit else { return }
        UVHandle.close(process)
        let onExit = self.onExit
        self.onExit = nil
        onOutput = nil
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
