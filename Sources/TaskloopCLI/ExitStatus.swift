/// How a command of the command-line client ends, as its process's exit status. Scripts
/// branch on these, so they are part of the interface (`taskloop <command> --help` lists them).
public struct ExitStatus: Equatable, Sendable {
    public let code: Int32

    public init(code: Int32) { self.code = code }

    /// Done: the command did what it was asked, or what it followed succeeded.
    public static let succeeded = ExitStatus(code: 0)
    /// What it followed (a task or workflow) failed.
    public static let failed = ExitStatus(code: 1)
    /// What it followed was cancelled.
    public static let cancelled = ExitStatus(code: 2)
    /// No task or workflow has the id, or the server could not be reached or was unavailable
    /// (no connection, no answer in time, 5xx).
    public static let unknownOrUnreachable = ExitStatus(code: 3)
    /// The server refused the request as it was given (400, 401, 409, 413, 415, 422, 429: its
    /// problem's detail is printed).
    public static let refused = ExitStatus(code: 4)
    /// Stopped by a signal (SIGINT, SIGTERM) before the end: 128 + the signal, as shells report.
    public static func stopped(by signal: Int32) -> ExitStatus { ExitStatus(code: 128 + signal) }

    /// The status for what a followed task or workflow ended as; nil while it has not ended.
    public static func forTerminalState(_ state: String) -> ExitStatus? {
        switch state {
        case "succeeded": .succeeded
        case "failed": .failed
        case "cancelled": .cancelled
        default: nil
        }
    }

    /// The status for an answer of `status` that was not a success: 404 means the id is
    /// unknown; the server's own trouble (5xx) is being unavailable; any other 4xx is a refusal.
    public static func forFailedAnswer(status: Int) -> ExitStatus {
        switch status {
        case 404, 500...: .unknownOrUnreachable
        default: .refused
        }
    }

    /// The table for `--help`. 64 is ArgumentParser's own status for a command line it
    /// refuses, which includes a file that cannot be read or is not JSON.
    public static let help = """
        Exit status: 0 done (or what was followed succeeded), 1 it failed, 2 it was cancelled, \
        3 unknown id or server unreachable or unavailable, 4 the server refused the request (its \
        problem is printed on standard error), 64 a wrong command line or unreadable file, \
        130/143 stopped by SIGINT/SIGTERM.
        """
}
