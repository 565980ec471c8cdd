import Foundation
import Testing
import TaskloopLoop

/// `ChildProcess` on a loop of its own: what a program starts with (descriptors, signals, its
/// process group and session), the errors of a program that cannot start, and exits reported
/// once each, beside an `OrphanReaper` waiting for everything else.
@Suite struct ChildProcessTests {
    enum Outcome: Equatable {
        case exited(status: Int64, signal: Int32, stdout: String, stderr: String)
        case failed(code: Int32)

        var stdout: String? {
            if case .exited(_, _, let stdout, _) = self { stdout } else { nil }
        }
    }

    static let environment = ["PATH=/usr/bin:/bin"]

    /// Starts each of `programs` on a new loop, runs the loop until every one has ended (or
    /// `timeout` seconds have passed: then the unfinished are missing from the answer), and
    /// returns how each ended, in order. `aroundStarts` wraps the starts, on the loop's thread
    /// (for a signal mask); `withLoop` runs once the loop is made and returns what closes what
    /// it added (an orphan reaper) when the loop is done.
    static func run(
        _ programs: [[String]], directory: String? = nil, timeout: UInt64 = 20_000,
        aroundStarts: (() -> Void) -> Void = { $0() }, withLoop: (EventLoop) throws -> (() -> Void)? = { _ in nil }
    ) throws -> [Outcome?] {
        let loop = try EventLoop()
        var outcomes = [Outcome?](repeating: nil, count: programs.count)
        var running = 0
        let watchdog = try LoopTimer(loop: loop)
        let closeExtra = try withLoop(loop)
        // Unique to this run: a child's exit signals every process carrying its cookie, and
        // the tests of this suite run at the same time.
        let run = UUID()
        func finishIfDone() {
            guard running == 0 else { return }
            watchdog.close()
            closeExtra?()
            loop.finish()
        }
        aroundStarts {
            for (index, arguments) in programs.enumerated() {
                var stdout: [UInt8] = [], stderr: [UInt8] = []
                do {
                    _ = try ChildProcess(
                        loop: loop, arguments: arguments, environment: environment, cookie: ["TASKLOOP_TEST_CHILD=\(run)-\(index)"],
                        directory: directory,
                        onOutput: { stream, bytes in
                            if stream == .stdout { stdout += bytes } else { stderr += bytes }
                        },
                        onExit: { status, signal in
                            #expect(outcomes[index] == nil, "an exit reported twice")
                            outcomes[index] = .exited(status: status, signal: signal, stdout: String(decoding: stdout, as: UTF8.self),
                                                      stderr: String(decoding: stderr, as: UTF8.self))
                            running -= 1
                            finishIfDone()
                        })
                    running += 1
                } catch {
                    outcomes[index] = .failed(code: (error as? UVError)?.code ?? 0)
                }
            }
        }
        watchdog.start(after: timeout) { running = 0; finishIfDone() }
        if running == 0 { finishIfDone() }
        try loop.run()
        return outcomes
    }

    @Test func exitStatusAndSignalAreReported() throws {
        let outcomes = try Self.run([["sh", "-c", "echo out; echo err >&2; exit 7"], ["sh", "-c", "kill -TERM $$"], ["true"]])
        #expect(outcomes == [
            .exited(status: 7, signal: 0, stdout: "out\n", stderr: "err\n"),
            .exited(status: 0, signal: SIGTERM, stdout: "", stderr: ""),
            .exited(status: 0, signal: 0, stdout: "", stderr: ""),
        ])
    }

    /// The program leads a session and process group of its own from its start, so the whole
    /// group can be signalled and no terminal's signals reach it.
    @Test func theProgramLeadsItsOwnSessionAndProcessGroup() throws {
        let check = "import os; p = os.getpid(); print(os.getpgid(0) == p, os.getsid(0) == p, os.getppid() == \(getpid()))"
        let outcomes = try Self.run([["python3", "-c", check]])
        #expect(outcomes.first??.stdout == "True True True\n", "\(outcomes)")
    }

    /// Descriptors 0, 1 and 2 only: one this process opened without O_CLOEXEC is not inherited,
    /// and stdin is /dev/null.
    @Test func onlyTheStandardDescriptorsAreInherited() throws {
        let leaky = open("/dev/null", O_RDONLY)
        #expect(leaky > 2)
        defer { close(leaky) }
        let listing = """
            import os
            print(sorted(int(fd) for fd in os.listdir('/proc/self/fd') if os.path.exists('/proc/self/fd/' + fd)))
            print(os.readlink('/proc/self/fd/0'))
            """
        let outcomes = try Self.run([["python3", "-c", listing]])
        #expect(outcomes.first??.stdout == "[0, 1, 2]\n/dev/null\n", "\(outcomes)")
    }

    /// A mask blocked and a signal ignored on the thread that starts the program are not its:
    /// it starts with nothing blocked and every disposition the default.
    @Test func theProgramStartsWithAnEmptyMaskAndDefaultDispositions() throws {
        _ = signal(SIGPIPE, SIG_IGN)   // as a server does, for good (one may run beside this test)
        let outcomes = try Self.run([["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]], aroundStarts: { start in
            var blocked = sigset_t(), previous = sigset_t()
            sigemptyset(&blocked)
            for signal in [SIGUSR1, SIGTERM, SIGINT] { sigaddset(&blocked, signal) }
            pthread_sigmask(SIG_BLOCK, &blocked, &previous)
            start()
            pthread_sigmask(SIG_SETMASK, &previous, nil)
        })
        let output = outcomes.first??.stdout ?? ""
        #expect(output.contains("SigBlk:\t0000000000000000"), "\(output)")
        let ignored = output.split(separator: "\n").first { $0.hasPrefix("SigIgn:") }
            .flatMap { UInt64($0.dropFirst(7).trimmingCharacters(in: .whitespaces), radix: 16) }
        #expect(ignored.map { $0 & (1 << UInt64(SIGPIPE - 1)) } == 0, "\(output)")
    }

    /// Not found anywhere in the program's PATH: ENOENT; found but not an executable file (a
    /// directory, a file without x): EACCES. A file the kernel cannot run (no `#!`) runs with
    /// /bin/sh, as execvp runs it.
    @Test func aProgramThatCannotStartThrowsWhatExecvpWould() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("child-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        FileManager.default.createFile(atPath: directory + "/plain", contents: Data("echo plain\n".utf8),
                                       attributes: [.posixPermissions: 0o644])
        FileManager.default.createFile(atPath: directory + "/script", contents: Data("echo scripted \"$1\"\n".utf8),
                                       attributes: [.posixPermissions: 0o755])
        let outcomes = try Self.run(
            [["no-such-program-anywhere"], [directory + "/missing"], [directory], [directory + "/plain"], ["./script", "one"]],
            directory: directory)
        #expect(outcomes[0] == .failed(code: -ENOENT))
        #expect(outcomes[1] == .failed(code: -ENOENT))
        #expect(outcomes[2] == .failed(code: -EACCES))
        #expect(outcomes[3] == .failed(code: -EACCES))
        #expect(outcomes[4]?.stdout == "scripted one\n", "\(String(describing: outcomes[4]))")
    }

    /// Each child's exit reaches its own `ChildProcess` exactly once, with its own status, while
    /// an orphan reaper waits on the same loop for every child it did not start (here a
    /// grandchild each program leaves behind, adopted by this process as a subreaper would).
    @Test func everyExitIsReportedOnceBesideTheOrphanReaper() throws {
        let programs = (0..<40).map { ["sh", "-c", "sleep 0.0$(( $1 % 5 )) & exit $1", "child", "\($0)"] }
        let outcomes = try Self.run(programs, withLoop: { loop in
            let reaper = try OrphanReaper(loop: loop)
            return { reaper.close() }
        })
        for (index, outcome) in outcomes.enumerated() {
            guard case .exited(let status, let signal, _, _)? = outcome else {
                Issue.record("child \(index): \(String(describing: outcome))")
                continue
            }
            #expect(status == Int64(index) && signal == 0, "child \(index)")
        }
    }
}
