import ArgumentParser
import TaskloopStore

/// `taskloop backup`: a consistent copy of a data dir's database, also while its server runs.
struct Backup: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write a consistent copy of a data dir's database, also while the server runs.",
        discussion: "To restore, stop the server and copy the file to taskloop.db in an empty data dir.")

    /// The server's options, `--data-dir` among them (`taskloop backup --data-dir D --to F`).
    @ParentCommand var server: Taskloop

    @Option(help: "The file to write; it must not exist.")
    var to: String

    func run() throws {
        do {
            try SQLiteTaskStore.backup(dataDirectory: server.dataDir, to: to)
        } catch {
            throw ValidationError("backup failed: \(error)")
        }
        print("backed up \(server.dataDir) to \(to)")
    }
}
