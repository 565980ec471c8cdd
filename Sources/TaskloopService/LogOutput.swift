import Glibc
import Logging
import TaskloopJSON

/// How log lines look on standard error.
public enum LogFormat: String, Sendable, CaseIterable {
    /// swift-log's stream format: `2026-11-22T14:50:00+0000 info taskloop : ... message`.
    case text
    /// One JSON object per line: `{"time","level","label","message", ...metadata}`.
    case json

    /// A handler for `LoggingSystem.bootstrap`.
    public func makeHandler(label: String, level: Logger.Level) -> LogHandler {
        switch self {
        case .text:
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        case .json:
            return JSONLogHandler(label: label, logLevel: level)
        }
    }
}

/// Writes each event as one JSON line to standard error, whole, with one `write`.
public struct JSONLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level
    private let label: String

    public init(label: String, logLevel: Logger.Level) {
        self.label = label
        self.logLevel = logLevel
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var json = JSONWriter()
        json.beginObject()
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        json.field("time", Representation.rfc3339(Int64(now.tv_sec) * 1_000 + Int64(now.tv_nsec) / 1_000_000))
        json.field("level", event.level.rawValue)
        json.field("label", label)
        json.field("message", event.message.description)
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        for key in merged.keys.sorted() {
            json.key(key)
            Self.write(merged[key]!, into: &json)
        }
        json.endObject()
        var line = json.bytes
        line.append(UInt8(ascii: "\n"))
        line.withUnsafeBytes { _ = Glibc.write(STDERR_FILENO, $0.baseAddress, $0.count) }
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
