import Foundation
import Testing
import TaskloopTestSupport

/// Why tests wait for their programs with `Process.waitForExit`, not `isRunning` or
/// `waitUntilExit`: Foundation learns of an exit when a socket the child inherited closes, and
/// once one child has lost that socket (as a concurrent libuv spawn, which marks every
/// descriptor close-on-exec, can make happen), Foundation waits for that child alone and notices
/// no other exit until it ends.
@Suite(.inTheDefaultStageOnly) struct ProcessExitTests {
    @Test func exitsAreSeenWhileFoundationWaitsForAnotherChild() throws {
        // A child that closes every descriptor above 2, Foundation's socket among them, and lives on.
        let blocker = Process()
        blocker.executableURL = URL(fileURLWithPath: "/bin/bash")
        blocker.arguments = ["-c", #"for fd in /proc/$$/fd/*; do n=${fd##*/}; if [ "$n" -gt 2 ]; then eval "exec $n>&-"; fi; done 2>/dev/null; exec sleep 20"#]
        try blocker.run()
        defer { if blocker.exitStatus == nil { kill(blocker.processIdentifier, SIGKILL) } }
        try pollUntil("the child to close its descriptors and sleep", every: 5_000) {
            (try? String(contentsOfFile: "/proc/\(blocker.processIdentifier)/comm", encoding: .utf8)) == "sleep\n"
        }
        let quick = Process()
        quick.executableURL = URL(fileURLWithPath: "/bin/sh")
        quick.arguments = ["-c", "exit 7"]
        try quick.run()
        #expect(try quick.waitForExit("sh -c 'exit 7'", timeout: 10) == 7)
        #expect(blocker.exitStatus == nil)
        kill(blocker.processIdentifier, SIGKILL)
        #expect(try blocker.waitForExit("the killed child", timeout: 10) == SIGKILL)
    }
}
