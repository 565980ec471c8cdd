import Glibc
import TaskloopLoop

/// The watch's model, shared by reference: a display that draws later reads it then instead
/// of keeping a copy, which would make the watcher's next change copy every task (a
/// 10,000-task workflow sends tens of thousands of events). Loop thread only.
final class WatchState {
    var model = WatchModel()
}

/// How a watch shows what it sees. Loop thread only.
protocol WatchDisplay: AnyObject {
    /// The model changed where `changes` say.
    func show(_ state: WatchState, _ changes: [WatchModel.Change])
    /// The stream is lost and being won back (`text` says how it goes), or is back (nil).
    func note(_ text: String?)
    /// The end: the last picture stays, the terminal as it was found.
    func close()
}

/// Live progress bars on a terminal: the frame (`ProgressFrame`) is redrawn in place
/// (`FrameWriter`) at most once per `intervalMilliseconds` however fast events come (the last
/// change always gets its frame), and once a second meanwhile, since elapsed times move. The
/// terminal's size is read again on SIGWINCH. `close()` draws the last frame and shows the
/// cursor again; the session calls it on every way out, signals included.
///
/// Threading: loop thread only (its timer and signal watcher are loop handles).
final class LiveDisplay: WatchDisplay {
    private let loop: EventLoop
    private let intervalMilliseconds: UInt64
    private let timer: LoopTimer
    private var resizeWatcher: SignalWatcher?
    private var size: (columns: Int, rows: Int)
    private var writer = FrameWriter()
    private var state: WatchState?
    private var noteText: String?
    private var lastDrawn: UInt64?
    private var closed = false

    static let tickMilliseconds: UInt64 = 1_000

    init(loop: EventLoop, intervalMilliseconds: UInt64) throws(UVError) {
        self.loop = loop
        self.intervalMilliseconds = intervalMilliseconds
        timer = try LoopTimer(loop: loop)
        size = Console.size(of: Console.output)
        do {
            resizeWatcher = try SignalWatcher(loop: loop, signal: SIGWINCH) { [unowned self] in
                size = Console.size(of: Console.output)
                requestFrame()
            }
        } catch {
            timer.close()
            throw error
        }
    }

    func show(_ state: WatchState, _ changes: [WatchModel.Change]) {
        self.state = state
        requestFrame()
    }

    func note(_ text: String?) {
        noteText = text
        requestFrame()
    }

    func close() {
        guard !closed else { return }
        draw()
        closed = true
        Console.write(writer.end(), to: Console.output)
        timer.close()
        resizeWatcher?.close()
    }

    private func requestFrame() {
        guard !closed else { return }
        if let lastDrawn, loop.now - lastDrawn < intervalMilliseconds {
            timer.start(after: lastDrawn + intervalMilliseconds - loop.now) { [unowned self] in draw() }
        } else {
            draw()
        }
    }

    private func draw() {
        guard !closed, let model = state?.model, model.subject != nil else { return }
        let lines = ProgressFrame.lines(model, note: noteText, width: size.columns, height: size.rows, now: Timestamp.now())
        Console.write(writer.frame(lines), to: Console.output)
        lastDrawn = loop.now
        timer.start(after: Self.tickMilliseconds) { [unowned self] in draw() }
    }
}

/// Without a terminal: a line per change on standard output (`PlainLog`), or nothing at all
/// (`submit --wait`, which prints only the end); either way, trouble with the stream is told
/// on standard error, once when it starts and once when it is over.
///
/// Threading: loop thread only.
final class LineDisplay: WatchDisplay {
    private let printsChanges: Bool
    private var log = PlainLog()
    private var troubled = false

    init(printsChanges: Bool) {
        self.printsChanges = printsChanges
    }

    func show(_ state: WatchState, _ changes: [WatchModel.Change]) {
        guard printsChanges else { return }
        let lines = log.lines(for: changes, in: state.model, now: Timestamp.now())
        if !lines.isEmpty { Console.write(lines.map { $0 + "\n" }.joined(), to: Console.output) }
    }

    func note(_ text: String?) {
        if let text {
            guard !troubled else { return }
            troubled = true
            Console.complain(text)
        } else if troubled {
            troubled = false
            Console.complain("the event stream is back")
        }
    }

    func close() {}
}
