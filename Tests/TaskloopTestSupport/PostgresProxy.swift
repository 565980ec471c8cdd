import Foundation

/// A TCP proxy on 127.0.0.1 in front of a PostgreSQL server, for what a network does to a
/// database connection:
/// - lose the answer to a COMMIT: once armed (`cutNextCommit`), the next client bytes holding a
///   `COMMIT` statement go to the server, the server's answers after them are held back until
///   its `COMMIT` command tag has arrived (the transaction committed), and then both sides are
///   closed. The client never learns the outcome.
/// - a partition: while frozen one way or both (`freeze`), nothing is forwarded that way and
///   nothing is closed; `cutConnections` then ends every connection, and what was held is lost.
/// Otherwise bytes pass both ways untouched; connections made after a cut are served as usual.
///
/// Blocking sockets, two threads per connection.
public final class PostgresProxy: @unchecked Sendable {
    public let port: Int
    private let target: (host: String, port: UInt16)
    private let listener: Int32
    private let armed = Locked(false)
    private let frozenToServer = Locked(false)
    private let frozenToClient = Locked(false)
    /// How many COMMITs' answers were cut.
    public let cuts = Locked(0)
    private let descriptors = Locked<Set<Int32>>([])
    private let stopped = Locked(false)

    /// A proxy to the server of `url` (`postgres://user@host:port/database`).
    public init(forwardingTo url: String) throws {
        guard let authority = Self.authority(of: url), let colon = url[authority].lastIndex(of: ":"),
              let port = UInt16(url[url.index(after: colon)..<authority.upperBound]) else {
            throw ClientError.malformed("no host:port in \(url)")
        }
        target = (String(url[authority.lowerBound..<colon]), port)
        (listener, self.port) = try loopbackListener(backlog: 64)
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "commit-cutting-proxy"
        thread.start()
    }

    /// `url` with its host and port replaced by the proxy's.
    public func url(through url: String) -> String {
        guard let authority = Self.authority(of: url) else { return url }
        return url.replacingCharacters(in: authority, with: "127.0.0.1:\(port)")
    }

    /// The next COMMIT a client sends reaches the server, and its answer is lost.
    public func cutNextCommit() {
        armed.withLock { $0 = true }
    }

    /// Holds back what goes to the server (requests), what comes back (answers), or both.
    public func freeze(toServer: Bool, toClient: Bool) {
        frozenToServer.withLock { $0 = toServer }
        frozenToClient.withLock { $0 = toClient }
    }

    /// Ends every connection made so far, both sides, as a dropped network does; what a freeze
    /// held back is lost.
    public func cutConnections() {
        let cut = descriptors.withLock { descriptors in
            defer { descriptors = [] }
            return descriptors
        }
        for descriptor in cut { shutdown(descriptor, Int32(SHUT_RDWR)) }
    }

    public func stop() {
        stopped.withLock { $0 = true }
        shutdown(listener, Int32(SHUT_RDWR))
        cutConnections()
    }

    private static func authority(of url: String) -> Range<String.Index>? {
        guard let scheme = url.range(of: "://") else { return nil }
        let start = url[scheme.upperBound...].firstIndex(of: "@").map { url.index(after: $0) } ?? scheme.upperBound
        let end = url[start...].firstIndex { $0 == "/" || $0 == "?" } ?? url.endIndex
        return start..<end
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0, !stopped.value else {
                if client >= 0 { close(client) }
                close(listener)
                return
            }
            guard let server = connectToTarget() else {
                close(client)
                continue
            }
            descriptors.withLock { $0.formUnion([client, server]) }
            let connection = Connection(client: client, server: server)
            for upstream in [true, false] {
                let thread = Thread { [self] in
                    if upstream { forwardFromClient(connection) } else { forwardFromServer(connection) }
                    connection.finishOneSide { descriptors.withLock { $0.subtract([client, server]) } }
                }
                thread.name = upstream ? "proxy-up" : "proxy-down"
                thread.start()
            }
        }
    }

    private func connectToTarget() -> Int32? {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = target.port.bigEndian
        address.sin_addr.s_addr = inet_addr(target.host == "localhost" ? "127.0.0.1" : target.host)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(descriptor)
            return nil
        }
        return descriptor
    }

    /// One client's connection and the server connection made for it.
    private final class Connection: @unchecked Sendable {
        let client: Int32
        let server: Int32
        /// A COMMIT went to the server: its answers are held back until the COMMIT's tag.
        let cutting = Locked(false)
        private let sidesLeft = Locked(2)

        init(client: Int32, server: Int32) {
            self.client = client
            self.server = server
        }

        func closeBoth() {
            shutdown(client, Int32(SHUT_RDWR))
            shutdown(server, Int32(SHUT_RDWR))
        }

        /// The descriptors are closed once both pumps have ended.
        func finishOneSide(_ finished: () -> Void) {
            let last = sidesLeft.withLock { left in
                left -= 1
                return left == 0
            }
            guard last else { return }
            close(client)
            close(server)
            finished()
        }
    }

    private static let commitStatement = Array("COMMIT\0".utf8)

    private func forwardFromClient(_ connection: Connection) {
        // The end of the previous read, so a statement split between two reads is still seen.
        var tail: [UInt8] = []
        while let bytes = read(connection.client) {
            let seen = tail + bytes
            tail = Array(seen.suffix(Self.commitStatement.count - 1))
            if !connection.cutting.value && seen.holds(Self.commitStatement) {
                let take = armed.withLock { armed in
                    defer { armed = false }
                    return armed
                }
                if take { connection.cutting.withLock { $0 = true } }
            }
            guard holdWhile(frozenToServer, connection), write(bytes, to: connection.server) else { break }
        }
        connection.closeBoth()
    }

    private func forwardFromServer(_ connection: Connection) {
        var held: [UInt8] = []
        while let bytes = read(connection.server) {
            if connection.cutting.value {
                held += bytes
                // CommandComplete's tag for the COMMIT: the server has committed.
                if held.holds(Self.commitStatement) {
                    cuts.withLock { $0 += 1 }
                    break
                }
                continue
            }
            guard holdWhile(frozenToClient, connection), write(bytes, to: connection.client) else { break }
        }
        connection.closeBoth()
    }

    /// Waits while `frozen`; false once the connection was cut meanwhile.
    private func holdWhile(_ frozen: Locked<Bool>, _ connection: Connection) -> Bool {
        while frozen.value {
            guard descriptors.value.contains(connection.client) else { return false }
            usleep(5_000)
        }
        return descriptors.value.contains(connection.client)
    }

    private func read(_ descriptor: Int32) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        return Array(buffer[0..<count])
    }

    private func write(_ bytes: [UInt8], to descriptor: Int32) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent > 0 else { return false }
            offset += sent
        }
        return true
    }
}

extension Array where Element == UInt8 {
    fileprivate func holds(_ needle: [UInt8]) -> Bool {
        guard needle.count <= count else { return false }
        return (0...(count - needle.count)).contains { start in self[start..<(start + needle.count)].elementsEqual(needle) }
    }
}
