/// The live display's picture: one line per task (a workflow's first line sums it up), each
/// with its bar, percentage, state, elapsed time and message, fitted to the terminal's width
/// and, when there are more tasks than rows, the ones that matter most now. A pure function
/// of the model, the terminal's size and the time, so it is tested without a terminal.
public enum ProgressFrame {
    /// The frame's lines, none wider than `width - 1` columns (a line that filled the last
    /// column would leave the cursor waiting to wrap, and erasing from there eats that last
    /// column), and at most `height - 1` of them (the cursor sits on the line below the frame,
    /// and moving up cannot reach above the screen's top). `note` (a reconnection under way)
    /// takes the last line.
    public static func lines(_ model: WatchModel, note: String?, width: Int, height: Int, now: Int64) -> [String] {
        let columns = max(1, width - 1)
        var rows = max(1, height - 1)
        var lines: [String] = []
        if note != nil { rows -= 1 }
        if let workflow = model.workflow, case .workflow = model.subject, rows > 1 {
            lines.append(workflowLine(workflow, fraction: model.workflowFraction, tasks: model.tasks, columns: columns, now: now))
            rows -= 1
        }
        let shown = visible(model.tasks, rows: rows)
        let layout = Layout(tasks: shown.map { model.tasks[$0] }, columns: columns)
        for index in shown { lines.append(taskLine(model.tasks[index], layout, now: now)) }
        if shown.count < model.tasks.count {
            lines.append(TerminalText.fitted(hiddenSummary(model.tasks, shown: shown), to: columns))
        }
        if let note { lines.append(TerminalText.fitted(TerminalText.sanitized(note), to: columns)) }
        return lines
    }

    /// Column widths shared by the task lines of one frame.
    struct Layout {
        let label: Int
        let bar: Int
        let state = 10
        let columns: Int

        init(tasks: [WatchedTask], columns: Int) {
            self.columns = columns
            let longest = tasks.map { TerminalText.columns(of: TerminalText.sanitized($0.label)) }.max() ?? 0
            label = min(longest, max(8, columns / 4))
            // The bar goes first when the width is short, then the label shrinks.
            bar = columns >= 80 ? 20 : columns >= 56 ? 10 : 0
        }
    }

    static func taskLine(_ task: WatchedTask, _ layout: Layout, now: Int64) -> String {
        var line = TerminalText.padded(TerminalText.sanitized(task.label), to: layout.label)
        let fraction = task.state == "succeeded" ? 1 : task.fraction
        if layout.bar > 0 { line += "  " + bar(fraction, width: layout.bar) }
        line += " " + percentage(fraction)
        line += "  " + TerminalText.padded(task.shownState, to: layout.state)
        line += " " + TerminalText.rightAligned(elapsed(task, now: now), to: 6)
        let detail = TerminalText.sanitized(task.detail)
        if !detail.isEmpty { line += "  " + detail }
        return TerminalText.fitted(line.trimmingTrailingSpaces, to: layout.columns)
    }

    static func workflowLine(_ workflow: WatchedWorkflow, fraction: Double?, tasks: [WatchedTask], columns: Int, now: Int64) -> String {
        let done = tasks.filter(\.isTerminal).count
        let end = WatchModel.terminalStates.contains(workflow.state) ? tasks.compactMap(\.finishedAt).max() : nil
        let since = workflow.createdAt.map { Timestamp.span((end ?? now) - $0) }
        let name = workflow.name.map { TerminalText.sanitized($0) + " " } ?? ""
        var line = "workflow \(name)(\(workflow.id))  \(percentage(fraction))  \(workflow.state)  \(done)/\(tasks.count) done"
        if let since { line += "  " + since }
        return TerminalText.fitted(line, to: columns)
    }

    /// `[=========>          ]`: `width` columns in all; empty when the fraction is unknown.
    static func bar(_ fraction: Double?, width: Int) -> String {
        let inside = max(1, width - 2)
        guard let fraction else { return "[" + String(repeating: " ", count: inside) + "]" }
        let filled = Int((min(1, max(0, fraction)) * Double(inside)).rounded(.down))
        let head = filled < inside && filled > 0 ? ">" : ""
        let body = String(repeating: "=", count: filled - head.count) + head
        return "[" + body + String(repeating: " ", count: inside - filled) + "]"
    }

    /// `  7%`, ` 42%`, `100%`, or ` --%` when unknown; always four columns, rounded down so
    /// `100%` means done.
    static func percentage(_ fraction: Double?) -> String {
        guard let fraction else { return " --%" }
        return TerminalText.rightAligned("\(Int((min(1, max(0, fraction)) * 100).rounded(.down)))%", to: 4)
    }

    /// Time running so far (or in all, once ended); nothing before it started.
    static func elapsed(_ task: WatchedTask, now: Int64) -> String {
        guard let started = task.startedAt else { return "" }
        return Timestamp.span((task.finishedAt ?? now) - started)
    }

    /// The positions of the tasks that fit in `rows`, in submission order: all when they fit;
    /// else running ones first, then those that ended badly, then those waiting, then the
    /// rest, with a row kept for the summary of those left out.
    static func visible(_ tasks: [WatchedTask], rows: Int) -> [Int] {
        guard tasks.count > rows else { return Array(tasks.indices) }
        func rank(_ task: WatchedTask) -> Int {
            switch task.state {
            case "running": 0
            case "failed", "cancelled": 1
            case "queued", "pending", "scheduled": 2
            default: 3
            }
        }
        let room = max(0, rows - 1)
        let chosen = tasks.indices.sorted { (rank(tasks[$0]), $0) < (rank(tasks[$1]), $1) }.prefix(room)
        return chosen.sorted()
    }

    static func hiddenSummary(_ tasks: [WatchedTask], shown: [Int]) -> String {
        let shownSet = Set(shown)
        var counts: [String: Int] = [:]
        for index in tasks.indices where !shownSet.contains(index) { counts[tasks[index].shownState, default: 0] += 1 }
        let order = ["running", "cancelling", "queued", "pending", "scheduled", "failed", "cancelled", "succeeded"]
        let parts = counts.sorted { (order.firstIndex(of: $0.key) ?? order.count, $0.key) < (order.firstIndex(of: $1.key) ?? order.count, $1.key) }
            .map { "\($0.value) \($0.key)" }
        return "+ \(tasks.count - shown.count) more: " + parts.joined(separator: ", ")
    }
}

/// Turns successive frames into what is written to the terminal: the first hides the cursor;
/// each later one moves up over the last and rewrites every line in place, erasing what the
/// old line had beyond the new one, then erases below, in case the frame shrank. Nothing
/// clears the screen, so nothing flickers; each frame is one write.
public struct FrameWriter: Sendable {
    /// Lines the last frame left on the screen, above the cursor.
    public private(set) var linesOnScreen = 0
    private var started = false

    public init() {}

    static let hideCursor = "\u{1B}[?25l"
    static let showCursor = "\u{1B}[?25h"
    static let eraseToEndOfLine = "\u{1B}[K"
    static let eraseBelow = "\u{1B}[J"

    /// The bytes that replace the last frame with `lines`.
    public mutating func frame(_ lines: [String]) -> String {
        var text = started ? "" : Self.hideCursor
        started = true
        if linesOnScreen > 0 { text += "\r\u{1B}[\(linesOnScreen)A" }
        for line in lines { text += line + Self.eraseToEndOfLine + "\n" }
        text += Self.eraseBelow
        linesOnScreen = lines.count
        return text
    }

    /// What ends the display: the cursor shown again, below the last frame.
    public func end() -> String { started ? Self.showCursor : "" }
}
