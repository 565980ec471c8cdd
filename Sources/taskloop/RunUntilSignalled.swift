import Dispatch
import Glibc
import TaskloopLoop

/// The process's life on its loop, as the server and the worker both live it: run until
/// SIGTERM or SIGINT, then the ordered stop (`stop`, which calls `finished` once everything is
/// closed, and the loop then ends). Whatever the stop does, the process never outlives the
/// grace by more than a second: a watchdog thread ends it at grace + 0.95 s. With `reload`,
/// SIGHUP calls it (until the stop begins).
///
/// Threading: called on the main thread, which runs the loop; the signal handlers run on it.
func runUntilSignalled(_ loop: EventLoop, program: String, grace: Double, stopping: String, started: String,
                       reload: (() -> Void)? = nil, stop: @escaping (_ finished: @escaping () -> Void) -> Void) throws {
    var watchers: [SignalWatcher] = []
    let beginStop = {
        guard !watchers.isEmpty else { return }
        print("stopping: \(stopping) (grace \(grace)s)")
        fflush(nil)
        for watcher in watchers { watcher.close() }
        watchers = []
        DispatchQueue.global().asyncAfter(deadline: .now() + grace + 0.95) {
            print("\(program): shutdown did not finish within the grace period; exiting anyway")
            fflush(nil)
            _exit(1)
        }
        stop { loop.finish() }
    }
    watchers = try [SIGTERM, SIGINT].map { try SignalWatcher(loop: loop, signal: $0, beginStop) }
    if let reload { watchers.append(try SignalWatcher(loop: loop, signal: SIGHUP, reload)) }
    print(started)
    fflush(nil)
    try loop.run()
}
