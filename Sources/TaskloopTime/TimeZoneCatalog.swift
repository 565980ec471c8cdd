import Synchronization

/// The zones a process has loaded, by name. Loading one reads its tzdata file, which blocks:
/// it happens off the event loop (a request's zone before the engine sees the request, a
/// store's zones before an engine restores them). Looking a zone up never touches a file, and
/// that is all an engine does with it.
///
/// Threading: any thread. `load` blocks on the file system the first time a name is asked;
/// `loaded` only takes a lock. Only zones that loaded are kept (a few hundred at most), never
/// names that failed, so clients naming zones at random cannot grow it.
public final class TimeZoneCatalog: Sendable {
    public typealias Loader = @Sendable (String) throws(TimeZoneError) -> TimeZoneRules

    /// The system's tzdata (`TimeZoneRules.load`), shared by the process's engines.
    public static let system = TimeZoneCatalog()

    private let loader: Loader
    private let zones = Mutex<[String: TimeZoneRules]>(["UTC": .utc])

    /// `loader` reads a zone (a test's may count the calls or note their thread).
    public init(loader: @escaping Loader = { name throws(TimeZoneError) in try TimeZoneRules.load(named: name) }) {
        self.loader = loader
    }

    /// The zone named `name`, read with the loader unless it is loaded already: may block.
    /// The name is checked first, as `TimeZoneRules.load` checks it.
    public func load(named name: String) throws(TimeZoneError) -> TimeZoneRules {
        if let zone = loaded(named: name) { return zone }
        guard TimeZoneRules.isValidName(name) else { throw .invalidName(name) }
        let zone = try loader(name)
        return zones.withLock { zones in
            if let raced = zones[name] { return raced }
            zones[name] = zone
            return zone
        }
    }

    /// The zone named `name` if it is loaded; never reads a file.
    public func loaded(named name: String) -> TimeZoneRules? {
        zones.withLock { $0[name] }
    }
}
