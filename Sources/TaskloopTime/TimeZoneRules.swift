#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why a time zone could not be had: the name refused before any file was opened, no such zone,
/// or a file that is not a zone this reads.
public enum TimeZoneError: Error, Equatable, Sendable, CustomStringConvertible {
    case invalidName(String)
    case unknownZone(String)
    case malformed(String, reason: String)

    public var description: String {
        switch self {
        case .invalidName(let name): "\(name.debugDescription) is not an IANA zone name (letters, digits, _ + - and /)"
        case .unknownZone(let name): "no zone named \(name) in the system's tzdata"
        case .malformed(let name, let reason): "the zone \(name) cannot be read: \(reason)"
        }
    }
}

/// What a local wall time is in a zone: one instant, two (the clock was set back over it; the
/// first one comes first), or none (the clock jumped over it; `gapEnd` is the instant it jumped,
/// the first after the gap).
public enum LocalTimeResolution: Equatable, Sendable {
    case unique(Int64)
    case repeated(first: Int64, second: Int64)
    case skipped(gapEnd: Int64)

    public var instants: [Int64] {
        switch self {
        case .unique(let instant): [instant]
        case .repeated(let first, let second): [first, second]
        case .skipped: []
        }
    }

    /// The instant a schedule runs this wall time: the only one, the first of two, or the end of
    /// the gap.
    public var firstInstant: Int64 {
        switch self {
        case .unique(let instant), .repeated(first: let instant, second: _), .skipped(gapEnd: let instant): instant
        }
    }
}

/// A zone's offsets from UTC, read from the system's tzdata (TZif, RFC 8536, versions 1 to 3): its
/// table of transitions, and past the last one the POSIX TZ rule of the file's footer. Instants
/// and local wall times are seconds from 1970-01-01T00:00:00 (local ones as if the wall clock were
/// UTC); offsets are seconds east of UTC. Instants are meant within `CronSchedule.supportedInstants`
/// (years 1 to 9999), where none of the arithmetic can overflow.
public final class TimeZoneRules: Sendable {
    public static let maximumNameLength = 64
    /// Zone files are a few kilobytes; the largest in tzdata 2025 is under 4 KiB.
    static let maximumFileSize = 256 * 1024

    public let name: String
    /// Ascending UTC instants at which the offset may change.
    let transitions: [Int64]
    /// The offset in force from each transition on.
    let offsetsAfter: [Int64]
    /// The offset before the first transition (the file's time type 0).
    let initialOffset: Int64
    let footer: PosixTimeZone?

    init(name: String, transitions: [Int64], offsetsAfter: [Int64], initialOffset: Int64, footer: PosixTimeZone?) {
        self.name = name
        self.transitions = transitions
        self.offsetsAfter = offsetsAfter
        self.initialOffset = initialOffset
        self.footer = footer
    }

    public static let utc = TimeZoneRules(name: "UTC", transitions: [], offsetsAfter: [], initialOffset: 0, footer: nil)

    /// `TZDIR` when set, as for the C library; else the Debian place.
    public static var defaultDirectory: String {
        getenv("TZDIR").map { String(cString: $0) } ?? "/usr/share/zoneinfo"
    }

    /// The zone named `name` (IANA style, `Europe/Berlin`), read from its file each call: a
    /// `TimeZoneCatalog` keeps what it loads. The name is checked before any file is touched:
    /// letters, digits, `_ + - /` only, no `..`, no leading, trailing or doubled `/`, at most
    /// `maximumNameLength` bytes. "UTC" needs no file.
    public static func load(named name: String, directory: String = defaultDirectory) throws(TimeZoneError) -> TimeZoneRules {
        guard isValidName(name) else { throw .invalidName(name) }
        if name == "UTC" { return utc }
        return try parse(readFile(directory + "/" + name, name: name), name: name)
    }

    public static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard !bytes.isEmpty, bytes.count <= maximumNameLength, bytes.first != UInt8(ascii: "/"),
              bytes.last != UInt8(ascii: "/"), !name.contains("//"), !name.contains("..") else { return false }
        return bytes.allSatisfy { byte in
            (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
                || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "/")
        }
    }

    private static func readFile(_ path: String, name: String) throws(TimeZoneError) -> [UInt8] {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw .unknownZone(name) }
        defer { close(descriptor) }
        var bytes = [UInt8](repeating: 0, count: maximumFileSize + 1)
        var filled = 0
        while filled < bytes.count {
            let count = bytes.withUnsafeMutableBytes { buffer in
                read(descriptor, buffer.baseAddress! + filled, buffer.count - filled)
            }
            if count < 0 && errno == EINTR { continue }
            // A directory (`America`) fails here with EISDIR: not a zone either.
            guard count >= 0 else { throw .unknownZone(name) }
            if count == 0 { break }
            filled += count
        }
        guard filled <= maximumFileSize else { throw .malformed(name, reason: "larger than \(maximumFileSize) bytes") }
        return Array(bytes[..<filled])
    }

    /// Reads version 1's 32-bit data, or skips it for version 2 and 3's 64-bit data and footer.
    static func parse(_ bytes: [UInt8], name: String) throws(TimeZoneError) -> TimeZoneRules {
        var reader = TZifReader(bytes: bytes)
        guard let header = reader.header() else { throw .malformed(name, reason: "no TZif header") }
        var counts = header.counts
        var timeSize = 4
        if header.version >= 2 {
            guard reader.skip(counts.dataSize(timeSize: 4)), let second = reader.header() else {
                throw .malformed(name, reason: "truncated version 1 data")
            }
            counts = second.counts
            timeSize = 8
        }
        guard counts.leapCount == 0 else { throw .malformed(name, reason: "leap-second zones are not supported") }
        guard counts.typeCount >= 1 else { throw .malformed(name, reason: "no local time types") }
        guard let transitions = reader.integers(count: counts.timeCount, size: timeSize),
              let typeIndices = reader.integers(count: counts.timeCount, size: 1) else {
            throw .malformed(name, reason: "truncated transitions")
        }
        var typeOffsets: [Int64] = []
        for _ in 0..<counts.typeCount {
            guard let offset = reader.integers(count: 1, size: 4)?.first, reader.skip(2) else {
                throw .malformed(name, reason: "truncated local time types")
            }
            // RFC 8536: -2^31 is not a valid offset, and real ones are within a day.
            guard offset > -90_000 && offset < 90_000 else { throw .malformed(name, reason: "offset \(offset) out of range") }
            typeOffsets.append(offset)
        }
        guard zip(transitions, transitions.dropFirst()).allSatisfy({ $0 < $1 }) else {
            throw .malformed(name, reason: "transitions out of order")
        }
        guard typeIndices.allSatisfy({ $0 < Int64(counts.typeCount) }) else {
            throw .malformed(name, reason: "a transition names a missing time type")
        }
        var footer: PosixTimeZone?
        if header.version >= 2 {
            guard reader.skip(counts.charCount + counts.isStandardCount + counts.isUTCCount), let text = reader.footer() else {
                throw .malformed(name, reason: "truncated footer")
            }
            if !text.isEmpty {
                guard let parsed = PosixTimeZone(text) else { throw .malformed(name, reason: "footer \(text) is not a TZ string") }
                footer = parsed
            }
        }
        return TimeZoneRules(name: name, transitions: transitions, offsetsAfter: typeIndices.map { typeOffsets[Int($0)] },
                             initialOffset: typeOffsets[0], footer: footer)
    }

    /// Seconds east of UTC in force at `instant`.
    public func offset(at instant: Int64) -> Int64 {
        guard let last = transitions.last, instant >= transitions[0] else { return footerOrInitial(at: instant) }
        if instant >= last, let footer { return footer.offset(at: instant) }
        return offsetsAfter[lastTransitionIndex(atOrBefore: instant)!]
    }

    private func footerOrInitial(at instant: Int64) -> Int64 {
        // A file with no transitions at all is all footer (or all its one type).
        if transitions.isEmpty, let footer { return footer.offset(at: instant) }
        return initialOffset
    }

    /// The local wall time at `instant`.
    public func localTime(at instant: Int64) -> Int64 {
        instant + offset(at: instant)
    }

    /// The first instant after `instant` at which the offset may change.
    public func transition(after instant: Int64) -> Int64? {
        if let last = transitions.last, instant < last {
            var low = 0
            var high = transitions.count - 1
            while low < high {
                let middle = (low + high) / 2
                if transitions[middle] > instant { high = middle } else { low = middle + 1 }
            }
            return transitions[low]
        }
        guard let footer else { return nil }
        let floor = transitions.last ?? Int64.min
        return footer.changes(around: instant).first { $0 > instant && $0 > floor }
    }

    /// The last instant at or before `instant` at which the offset may have changed.
    public func transition(atOrBefore instant: Int64) -> Int64? {
        if let footer, instant > (transitions.last ?? Int64.min) {
            let floor = transitions.last ?? Int64.min
            if let change = footer.changes(around: instant).last(where: { $0 <= instant && $0 > floor }) { return change }
        }
        return lastTransitionIndex(atOrBefore: instant).map { transitions[$0] }
    }

    private func lastTransitionIndex(atOrBefore instant: Int64) -> Int? {
        guard let first = transitions.first, instant >= first else { return nil }
        var low = 0
        var high = transitions.count - 1
        while low < high {
            let middle = (low + high + 1) / 2
            if transitions[middle] <= instant { low = middle } else { high = middle - 1 }
        }
        return low
    }

    /// The instants whose local wall time is `local`. Offsets within a day either side are the
    /// only candidates (no zone is further than that from UTC), and each is kept if it is the
    /// offset in force at the instant it gives.
    public func resolve(localTime local: Int64) -> LocalTimeResolution {
        let windowStart = local - CivilTime.secondsPerDay
        var offsets = [offset(at: windowStart)]
        var changes: [Int64] = []
        var cursor = windowStart
        while let change = transition(after: cursor), change <= local + CivilTime.secondsPerDay {
            changes.append(change)
            offsets.append(offset(at: change))
            cursor = change
        }
        var instants = Set(offsets).map { local - $0 }.filter { offset(at: $0) == local - $0 }
        instants.sort()
        switch instants.count {
        case 0:
            // In a gap: the change whose wall times before and after straddle `local`.
            let gapEnd = changes.first { change in
                change + offset(at: change - 1) <= local && local < change + offset(at: change)
            }
            return .skipped(gapEnd: gapEnd ?? local - offsets.last!)
        case 1: return .unique(instants[0])
        default: return .repeated(first: instants[0], second: instants[instants.count - 1])
        }
    }
}

private struct TZifReader {
    struct Counts {
        var isUTCCount = 0, isStandardCount = 0, leapCount = 0, timeCount = 0, typeCount = 0, charCount = 0

        func dataSize(timeSize: Int) -> Int {
            timeCount * timeSize + timeCount + typeCount * 6 + charCount + leapCount * (timeSize + 4) + isStandardCount + isUTCCount
        }
    }

    let bytes: [UInt8]
    var index = 0

    mutating func header() -> (version: Int, counts: Counts)? {
        guard index + 44 <= bytes.count, bytes[index..<index + 4].elementsEqual("TZif".utf8) else { return nil }
        let versionByte = bytes[index + 4]
        let version = versionByte == 0 ? 1 : Int(versionByte) - Int(UInt8(ascii: "0"))
        guard version >= 1 && version <= 9 else { return nil }
        index += 20
        guard let values = integers(count: 6, size: 4), values.allSatisfy({ $0 >= 0 && $0 < 1 << 20 }) else { return nil }
        let counts = Counts(isUTCCount: Int(values[0]), isStandardCount: Int(values[1]), leapCount: Int(values[2]),
                            timeCount: Int(values[3]), typeCount: Int(values[4]), charCount: Int(values[5]))
        return (version, counts)
    }

    mutating func skip(_ count: Int) -> Bool {
        guard count >= 0, index + count <= bytes.count else { return false }
        index += count
        return true
    }

    /// Big-endian signed integers of `size` bytes (1 is unsigned: type indices).
    mutating func integers(count: Int, size: Int) -> [Int64]? {
        guard index + count * size <= bytes.count else { return nil }
        var values: [Int64] = []
        values.reserveCapacity(count)
        for _ in 0..<count {
            var value: UInt64 = 0
            for byte in bytes[index..<index + size] { value = value << 8 | UInt64(byte) }
            index += size
            switch size {
            case 1: values.append(Int64(value))
            case 4: values.append(Int64(Int32(truncatingIfNeeded: value)))
            default: values.append(Int64(bitPattern: value))
            }
        }
        return values
    }

    /// The text between the two newlines that end a version 2+ file.
    mutating func footer() -> String? {
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\n") else { return nil }
        guard let end = bytes[(index + 1)...].firstIndex(of: UInt8(ascii: "\n")) else { return nil }
        return String(decoding: bytes[(index + 1)..<end], as: UTF8.self)
    }
}
