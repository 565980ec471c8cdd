import CSQLite
import Glibc

/// Why a data directory cannot be used. Each case is a message for the operator: the start
/// stops with it and nothing in the directory has been changed.
public enum DataDirectoryError: Error, Equatable, CustomStringConvertible {
    /// Another server holds the directory's lock.
    case locked(path: String, holder: String)
    /// The database was written by a newer Taskloop.
    case newerSchema(path: String, found: Int64, supported: Int)
    /// The file is not a SQLite database, or SQLite reports it corrupt.
    case damaged(path: String, reason: String)
    /// The directory or its files cannot be created, opened or locked.
    case unusable(path: String, reason: String)

    public var description: String {
        switch self {
        case .locked(let path, let holder):
            "data dir \(path) is in use by another server (\(holder)); stop it or choose another --data-dir"
        case .newerSchema(let path, let found, let supported):
            "\(path) has schema version \(found), newer than this server's \(supported); run a newer taskloop or restore a backup"
        case .damaged(let path, let reason):
            "\(path) is damaged (\(reason)); restore a backup (taskloop backup) into an empty data dir"
        case .unusable(let path, let reason):
            "data dir \(path) cannot be used: \(reason)"
        }
    }
}

/// A data directory held by this process: `lock` carries an exclusive `flock` for as long as
/// this object lives (the kernel drops it when the process dies, `kill -9` included), and
/// names its holder for whoever finds it taken. `taskloop.db` and its WAL files sit beside it.
public final class DataDirectory: @unchecked Sendable {
    public let path: String
    /// -1 once released. Touched by the thread that opened the store and by `release()`.
    private var lockDescriptor: Int32

    public var databasePath: String { path + "/taskloop.db" }

    /// Creates the directory if needed and takes its lock, or throws naming the holder.
    public init(path: String) throws(DataDirectoryError) {
        if mkdir(path, 0o750) != 0 && errno != EEXIST {
            throw .unusable(path: path, reason: String(cString: strerror(errno)))
        }
        let lockPath = path + "/lock"
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o640)
        guard descriptor >= 0 else { throw .unusable(path: path, reason: "\(lockPath): \(String(cString: strerror(errno)))") }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let reason = errno
            var holder = [UInt8](repeating: 0, count: 256)
            let count = pread(descriptor, &holder, holder.count, 0)
            close(descriptor)
            guard reason == EWOULDBLOCK else { throw .unusable(path: path, reason: String(cString: strerror(reason))) }
            let text = count > 0 ? String(decoding: holder[0..<count], as: UTF8.self) : "an unknown process"
            throw .locked(path: path, holder: text.split(separator: "\n").first.map(String.init) ?? text)
        }
        var host = [UInt8](repeating: 0, count: 256)
        gethostname(&host, host.count - 1)
        let hostName = String(decoding: host.prefix { $0 != 0 }, as: UTF8.self)
        let holder = Array("pid \(getpid()) on \(hostName)\n".utf8)
        ftruncate(descriptor, 0)
        _ = holder.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        fsync(descriptor)
        self.path = path
        lockDescriptor = descriptor
    }

    /// Lets the next server in: the lock is released (and the holder's name left as a trace).
    public func release() {
        guard lockDescriptor >= 0 else { return }
        close(lockDescriptor)
        lockDescriptor = -1
    }

    deinit {
        release()
    }
}
