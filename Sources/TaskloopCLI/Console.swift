import Glibc

/// Standard output and error as the client uses them: whole writes, whether each is a
/// terminal, and the terminal's size.
enum Console {
    static let output: Int32 = STDOUT_FILENO
    static let errors: Int32 = STDERR_FILENO

    /// Writes all of `text` to `fd` (a terminal or pipe may take it in parts), one write(2)
    /// when it can: a frame of the live display is one write, so a terminal never shows half
    /// of one. False when the descriptor refuses (its reader has gone).
    @discardableResult
    static func write(_ text: String, to fd: Int32) -> Bool {
        let bytes = Array(text.utf8)
        var offset = 0
        return bytes.withUnsafeBytes { buffer in
            while offset < buffer.count {
                let written = Glibc.write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    if errno == EAGAIN {
                        // A descriptor someone made non-blocking: wait until it takes more.
                        var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                        poll(&ready, 1, -1)
                        continue
                    }
                    return false
                }
                offset += written
            }
            return true
        }
    }

    /// A line on standard output.
    static func print(_ line: String) { write(line + "\n", to: output) }

    /// `taskloop: message` on standard error.
    static func complain(_ message: String) { write("taskloop: \(message)\n", to: errors) }

    /// Whether `fd` is a terminal that understands cursor movement (TERM=dumb does not).
    static func isCapableTerminal(_ fd: Int32) -> Bool {
        guard isatty(fd) == 1 else { return false }
        let term = getenv("TERM").map { String(cString: $0) } ?? ""
        return !term.isEmpty && term != "dumb"
    }

    static func isTerminal(_ fd: Int32) -> Bool { isatty(fd) == 1 }

    /// Columns and rows of the terminal on `fd` (TIOCGWINSZ), or 80 by 24 when it does not say.
    static func size(of fd: Int32) -> (columns: Int, rows: Int) {
        var size = winsize()
        guard ioctl(fd, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0, size.ws_row > 0 else { return (80, 24) }
        return (Int(size.ws_col), Int(size.ws_row))
    }

    /// Everything `fd` holds until its end (a file, or standard input's pipe); `name` says
    /// what it is in a message.
    static func readAll(_ fd: Int32, name: String) throws(UsageError) -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count == 0 { return bytes }
            if count < 0 {
                if errno == EINTR { continue }
                throw UsageError("cannot read \(name): \(String(cString: strerror(errno)))")
            }
            bytes += chunk[..<count]
        }
    }

    /// The contents of `path`, or of standard input for `-`.
    static func contents(of path: String) throws(UsageError) -> [UInt8] {
        if path == "-" { return try readAll(STDIN_FILENO, name: "standard input") }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw UsageError("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        return try readAll(fd, name: path)
    }
}
