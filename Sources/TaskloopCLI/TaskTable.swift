import TaskloopJSON
import TaskloopTime

/// `taskloop ls` on a terminal: a table with a header, one task per line, columns as wide as
/// their widest cell, the name last and the lines fitted to the terminal's width.
public enum TaskTable {
    static let headings = ["ID", "STATE", "KIND", "QUEUE", "PROGRESS", "AGE", "NAME"]

    public static func lines(_ tasks: [JSONObject], width: Int, now: Int64) -> [String] {
        let rows = tasks.map { task -> [String] in
            let state = task["state"]?.stringValue ?? "?"
            let shownState = state == "running" && task["cancel_requested"]?.boolValue == true ? "cancelling" : state
            let fraction = state == "succeeded" ? 1 : task["progress"]?.objectValue?["fraction"]?.doubleValue
            let created = task["created_at"]?.stringValue.flatMap(RFC3339.milliseconds)
            return [
                task["id"]?.stringValue ?? "?", shownState, task["kind"]?.stringValue ?? "?", task["queue"]?.stringValue ?? "?",
                ProgressFrame.percentage(fraction).trimmingLeadingSpaces, created.map { Timestamp.span(now - $0) } ?? "",
                task["name"]?.stringValue ?? "",
            ].map(TerminalText.sanitized)
        }
        let widths = headings.indices.map { column in
            ([headings[column]] + rows.map { $0[column] }).map(TerminalText.columns(of:)).max() ?? 0
        }
        return ([headings] + rows).map { cells in
            let line = cells.indices.map { column in
                column == cells.count - 1 ? cells[column] : TerminalText.padded(cells[column], to: widths[column])
            }.joined(separator: "  ")
            return TerminalText.fitted(line.trimmingTrailingSpaces, to: max(1, width - 1))
        }
    }
}

extension String {
    var trimmingLeadingSpaces: String { String(drop { $0 == " " }) }
    var trimmingTrailingSpaces: String {
        var text = self
        while text.last == " " { text.removeLast() }
        return text
    }
}
