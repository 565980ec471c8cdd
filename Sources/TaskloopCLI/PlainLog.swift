/// The display without a terminal: one line per change a reader would notice (a state, the
/// whole percentage, the message), each with the time of the change, so the output of a
/// watch piped to a file or another program reads as a log:
///
///     2026-11-24T19:55:33.837Z 01M8J1FJDYT04TGJ5QX9MXV2Z download running 40% rendering
///
/// Fields are separated by one space: the time, the task's (or workflow's) id, its label
/// (quoted when it holds a space or is empty), its state, its percentage (`--` when unknown),
/// then the message, which runs to the end of the line.
public struct PlainLog: Sendable {
    /// What was printed last for each id, so a change nobody would see prints nothing.
    private var printed: [String: String] = [:]

    public init() {}

    /// The lines for `changes` of `model`; `now` stands in for changes the server did not date
    /// (the state a watch starts from).
    public mutating func lines(for changes: [WatchModel.Change], in model: WatchModel, now: Int64) -> [String] {
        var lines: [String] = []
        for change in changes {
            switch change {
            case .task(let index, let time):
                let task = model.tasks[index]
                let fraction = task.state == "succeeded" ? 1 : task.fraction
                append(id: task.id, label: task.label, state: task.shownState, fraction: fraction, detail: task.detail,
                       time: time ?? now, to: &lines)
            case .workflow(let time):
                guard let workflow = model.workflow else { continue }
                append(id: workflow.id, label: workflow.name ?? "workflow", state: workflow.state, fraction: model.workflowFraction,
                       detail: "", time: time ?? now, to: &lines)
            }
        }
        return lines
    }

    private mutating func append(id: String, label: String, state: String, fraction: Double?, detail: String, time: Int64,
                                 to lines: inout [String]) {
        let percent = fraction.map { "\(Int((min(1, max(0, $0)) * 100).rounded(.down)))%" } ?? "--"
        var cleanLabel = TerminalText.sanitized(label)
        if cleanLabel.isEmpty || cleanLabel.contains(" ") { cleanLabel = "\"\(cleanLabel)\"" }
        var seen = "\(cleanLabel) \(state) \(percent)"
        let cleanDetail = TerminalText.sanitized(detail)
        if !cleanDetail.isEmpty { seen += " " + cleanDetail }
        guard printed[id] != seen else { return }
        printed[id] = seen
        lines.append("\(Timestamp.text(time)) \(id) \(seen)")
    }
}
