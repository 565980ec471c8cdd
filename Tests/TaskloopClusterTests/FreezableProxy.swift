import Foundation
import TaskloopTestSupport

/// A TCP proxy on 127.0.0.1 to `targetPort` that can freeze: while frozen it forwards nothing
/// either way and closes nothing, as a network partition looks to both ends. One thread per
/// direction of each connection.
final class FreezableProxy: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let targetPort: Int
    private let frozenToServer = Locked(false)
    private let frozenToClient = Locked(false)
    private let closed = Locked(false)
    private let sockets = Locked<[Int32]>([])

    init(targetPort: Int) throws {
        (listener, port) = try loopbackListener(backlog: 16)
        self.targetPort = targetPort
        Thread { [self] in accept() }.start()
    }

    var isFrozen: Bool {
        get { frozenToServer.value && frozenToClient.value }
        set {
            frozenToServer.withLock { $0 = newValue }
            frozenToClient.withLock { $0 = newValue }
        }
    }

    /// Holds back only what goes to the server (requests) or only what comes back (answers).
    func freeze(toServer: Bool, toClient: Bool) {
        frozenToServer.withLock { $0 = toServer }
        frozenToClient.withLock { $0 = toClient }
    }

    /// Ends every connection made so far, both sides, as a dropped network does for the
    /// client; what was held back is lost.
    func cutConnections() {
        for socket in sockets.withLock({ taken in defer { taken = [] }; return taken }) { shutdown(socket, Int32(SHUT_RDWR)) }
    }

    func close() {
        closed.withLock { $0 = true }
        shutdown(listener, Int32(SHUT_RDWR))
        Glibc.close(listener)
    }

    private func accept() {
        while !closed.value {
            let client = Glibc.accept(listener, nil, nil)
            guard client >= 0 else { return }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = UInt16(targetPort).bigEndian
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0 else {
                Glibc.close(server)
                Glibc.close(client)
                continue
            }
            sockets.withLock { $0 += [client, server] }
            Thread { [self] in pump(from: client, to: server, frozen: frozenToServer) }.start()
            Thread { [self] in pump(from: server, to: client, frozen: frozenToClient) }.start()
        }
    }

    private func pump(from source: Int32, to destination: Int32, frozen: Locked<Bool>) {
        defer {
            shutdown(destination, Int32(SHUT_WR))
            shutdown(source, Int32(SHUT_RD))
        }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while !closed.value {
            if frozen.value {
                usleep(5_000)
                continue
            }
            var descriptor = pollfd(fd: source, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 20) >= 0 else { return }
            guard descriptor.revents != 0 else { continue }
            // Frozen between the poll and the read: the bytes wait in the kernel.
            if frozen.value { continue }
            let count = read(source, &buffer, buffer.count)
            guard count > 0 else { return }
            var sent = 0
            while sent < count {
                // Not write(2): a peer gone (a cut) must not raise SIGPIPE in the test process.
                let written = buffer.withUnsafeBytes { send(destination, $0.baseAddress! + sent, count - sent, Int32(MSG_NOSIGNAL)) }
                guard written > 0 else { return }
                sent += written
            }
        }
    }
}
