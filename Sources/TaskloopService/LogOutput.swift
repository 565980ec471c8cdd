import Glibc
import Logging
import TaskloopJSON

/// How log lines look on standard error.
public enum LogFormat: String, Sendable, CaseIterable {
    /// `2026-11-22T14:50:00.123Z info taskloop: message key=value ...`
    case text
    /// One JSON object per line: `{"time","level","label","message", ...metadata}`.
    case json

    /// A handler for `LoggingSystem.bootstrap`, writing to `sink`.
    public func makeHandler(label: String, level: Logger.Level, sink: LogSink) -> LogHandler {
        LineLogHandler(label: label, logLevel: level, format: self, sink: sink)
    }
}

/// Where log lines go without ever blocking the thread that logs: lines are copied into a
/// bounded buffer and a writer thread of the sink's own writes them out. When the reader is
/// slower than the logging (a full pipe, a stalled collector), lines beyond the buffer are
/// dropped and counted, and a line saying how many follows once the writer catches up; the
/// event loop never waits for a log consumer.
///
/// Threading: `append` and the counters may be used from any thread (a mutex guards the
/// buffer; it is held for a copy, never across a write).
public final class LogSink: @unchecked Sendable {
    private let fd: Int32
    private let capacity: Int
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let wake = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private let drained = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    // Guarded by `mutex`.
    private var buffer: [UInt8] = []
    private var writing = false
    private var droppedLines = 0
    private var reportedDrops = 0

    /// A sink writing to `fd` (standard error by default) through at most `capacity` bytes of
    /// buffered lines. It lives as long as the process.
    public init(fd: Int32 = STDERR_FILENO, capacity: Int = 1 << 20) {
        self.fd = fd
        self.capacity = capacity
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(wake, nil)
        pthread_cond_init(drained, nil)
        buffer.reserveCapacity(min(capacity, 64 * 1_024))
        var thread = pthread_t()
        let started = pthread_create(&thread, nil, { context in
            Unmanaged<LogSink>.fromOpaque(context!).takeUnretainedValue().writeForever()
        }, Unmanaged.passRetained(self).toOpaque())
        precondition(started == 0, "cannot start the log writer thread")
        pthread_detach(thread)
    }

    /// Queues one line (ending in a newline); drops it if the buffer is full.
    public func append(_ line: UnsafeRawBufferPointer) {
        pthread_mutex_lock(mutex)
        if buffer.count + line.count <= capacity {
            buffer.append(contentsOf: line)
            pthread_cond_signal(wake)
        } else {
            droppedLines += 1
        }
        pthread_mutex_unlock(mutex)
    }

    /// Lines dropped since start because the reader fell behind.
    public var dropped: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return droppedLines
    }

    /// Waits (at most `milliseconds`) until everything queued has been written: the last step
    /// before the process exits.
    public func flush(milliseconds: Int = 1_000) {
        var deadline = timespec()
        clock_gettime(CLOCK_REALTIME, &deadline)
        let nanoseconds = Int(deadline.tv_nsec) + milliseconds % 1_000 * 1_000_000
        deadline.tv_sec += milliseconds / 1_000 + nanoseconds / 1_000_000_000
        deadline.tv_nsec = nanoseconds % 1_000_000_000
        pthread_mutex_lock(mutex)
        while !buffer.isEmpty || writing {
            if pthread_cond_timedwait(drained, mutex, &deadline) == ETIMEDOUT { break }
        }
        pthread_mutex_unlock(mutex)
    }

    private func writeForever() -> Never {
        var batch: [UInt8] = []
        while true {
            pthread_mutex_lock(mutex)
            while buffer.isEmpty && droppedLines == reportedDrops {
                writing = false
                pthread_cond_broadcast(drained)
                pthread_cond_wait(wake, mutex)
            }
            writing = true
            swap(&batch, &buffer)
            let newlyDropped = droppedLines - reportedDrops
            reportedDrops = droppedLines
            pthread_mutex_unlock(mutex)
            write(batch)
            batch.removeAll(keepingCapacity: true)
            if newlyDropped > 0 {
                write(Array("\(newlyDropped) log line(s) dropped: the log's reader was too slow.\n".utf8))
            }
        }
    }

    private func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let written = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                if written > 0 {
                    offset += written
                } else if written < 0 && errno == EINTR {
                    continue
                } else {
                    return  // the reader is gone (EPIPE, with SIGPIPE ignored): nothing to be done
                }
            }
        }
    }
}

/// Formats each event as one line (text or JSON) and hands it to a `LogSink`. Time stamps are
/// UTC with milliseconds, formatted here from the clock (a vDSO call, no system call), not with
/// strftime and the time zone file.
struct LineLogHandler: LogHandler {
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level
    let label: String
    let format: LogFormat
    let sink: LogSink

    init(label: String, logLevel: Logger.Level, format: LogFormat, sink: LogSink) {
        self.label = label
        self.logLevel = logLevel
        self.format = format
        self.sink = sink
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let milliseconds = Int64(now.tv_sec) * 1_000 + Int64(now.tv_nsec) / 1_000_000
        let merged = metadata.isEmpty ? event.metadata ?? [:] : metadata.merging(event.metadata ?? [:]) { $1 }
        var line = format == .json ? jsonLine(event, milliseconds, merged) : textLine(event, milliseconds, merged)
        line.append(UInt8(ascii: "\n"))
        line.withUnsafeBytes { sink.append($0) }
    }

    private func textLine(_ event: LogEvent, _ milliseconds: Int64, _ metadata: Logger.Metadata) -> [UInt8] {
        var line = [UInt8](repeating: 0, count: 24)
        _ = line.withUnsafeMutableBufferPointer { Representation.writeRFC3339(milliseconds, to: $0.baseAddress!) }
        line.append(contentsOf: " \(event.level.rawValue) \(label): \(event.message)".utf8)
        for key in metadata.keys.sorted() {
            line.append(contentsOf: " \(key)=\(metadata[key]!)".utf8)
        }
        return line
    }

    private func jsonLine(_ event: LogEvent, _ milliseconds: Int64, _ metadata: Logger.Metadata) -> [UInt8] {
        var json = JSONWriter()
        json.beginObject()
        json.key(static: "time")
        json.asciiString(maxLength: 24) { Representation.writeRFC3339(milliseconds, to: $0) }
        json.field("level", event.level.rawValue)
        json.field("label", label)
        json.field("message", event.message.description)
        for key in metadata.keys.sorted() {
            json.key(key)
            Self.write(metadata[key]!, into: &json)
        }
        json.endObject()
        return json.bytes
    }

    private static func write(_ value: Logger.Metadata.Value, into json: inout JSONWriter) {
        switch value {
        case .string(let text): json.string(text)
        case .stringConvertible(let convertible): json.string(convertible.description)
        case .array(let values):
            json.beginArray()
            for element in values { write(element, into: &json) }
            json.endArray()
        case .dictionary(let dictionary):
            json.beginObject()
            for key in dictionary.keys.sorted() {
                json.key(key)
                write(dictionary[key]!, into: &json)
            }
            json.endObject()
        }
    }
}
