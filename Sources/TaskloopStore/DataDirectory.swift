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
    /// The directory is writable by its group or by others, who could replace the database.
    case writableByOthers(path: String, mode: UInt32)

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
        case .writableByOthers(let path, let mode):
            "data dir \(path) is writable by its group or by others (mode \(String(mode, radix: 8))), who could replace the "
                + "database; run chmod 700 \(path)"
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

    /// Files of the directory that others could read or write, made 0600 by `init` (the server
    /// logs them).
    public let tightened: [String]

    /// Creates the directory (0700) if needed and takes its lock, or throws naming the holder.
    /// A directory others may write to is refused; the lock and the database are made 0600, and
    /// SQLite gives its log and shared-memory files the database's mode.
    public init(path: String) throws(DataDirectoryError) {
        if mkdir(path, 0o700) != 0 && errno != EEXIST {
            throw .unusable(path: path, reason: String(cString: strerror(errno)))
        }
        var status = stat()
        guard stat(path, &status) == 0 else { throw .unusable(path: path, reason: String(cString: strerror(errno))) }
        guard status.st_mode & S_IFMT == S_IFDIR else { throw .unusable(path: path, reason: "it is not a directory") }
        guard status.st_mode & 0o022 == 0 else { throw .writableByOthers(path: path, mode: status.st_mode & 0o7777) }
        var tightened: [String] = []
        let lockPath = path + "/lock"
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw .unusable(path: path, reason: "\(lockPath): \(String(cString: strerror(errno)))") }
        do throws(DataDirectoryError) {
            if try Self.makePrivate(descriptor, lockPath, in: path) { tightened.append(lockPath) }
        } catch {
            close(descriptor)
            throw error
        }
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
        // Made before SQLite opens it: SQLite would create it 0644 less the umask, and gives the
        // log, shared-memory and journal files the database's mode. Those left by an older
        // server are made private too.
        let database = path + "/taskloop.db"
        do throws(DataDirectoryError) {
            for (file, create) in [(database, true), (database + "-wal", false), (database + "-shm", false),
                                   (database + "-journal", false)] {
                let fileDescriptor = open(file, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0o600)
                guard fileDescriptor >= 0 else {
                    if errno == ENOENT && !create { continue }
                    throw .unusable(path: path, reason: "\(file): \(String(cString: strerror(errno)))")
                }
                defer { close(fileDescriptor) }
                if try Self.makePrivate(fileDescriptor, file, in: path) { tightened.append(file) }
            }
        } catch {
            close(descriptor)
            throw error
        }
        self.path = path
        lockDescriptor = descriptor
        self.tightened = tightened
    }

    /// Makes the open file 0600 if its group or others may use it (files an older server made
    /// 0640 or 0644); true if it had to.
    private static func makePrivate(_ descriptor: Int32, _ file: String, in path: String) throws(DataDirectoryError) -> Bool {
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { throw .unusable(path: path, reason: "\(file): \(String(cString: strerror(errno)))") }
        guard status.st_mode & 0o077 != 0 else { return false }
        guard fchmod(descriptor, 0o600) == 0 else {
            throw .unusable(path: path, reason: "\(file) is mode \(String(status.st_mode & 0o777, radix: 8)) and cannot be made 0600: "
                + String(cString: strerror(errno)))
        }
        return true
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
