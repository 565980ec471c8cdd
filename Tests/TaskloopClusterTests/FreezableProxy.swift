import Foundation
import TaskloopTestSupport

/// A TCP proxy on 127.0.0.1 to `targetPort` that can freeze: while frozen it forwards nothing
/// either way and closes nothing, as a network partition looks to both ends. One thread per
/// direction of each connection.
final class FreezableProxy: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let targetPort: Int
    private let frozen = Locked(false)
    private let closed = Locked(false)

    init(targetPort: Int) throws {
        (listener, port) = try loopbackListener(backlog: 16)
        self.targetPort = targetPort
        Thread { [self] in accept() }.start()
    }

    var isFrozen: Bool {
        get { frozen.value }
        set { frozen.withLock { $0 = newValue } }
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
            Thread { [self] in pump(from: client, to: server) }.start()
            Thread { [self] in pump(from: server, to: client) }.start()
        }
    }

    private func pump(from source: Int32, to destination: Int32) {
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
                let written = buffer.withUnsafeBytes { write(destination, $0.baseAddress! + sent, count - sent) }
                guard written > 0 else { return }
                sent += written
            }
        }
    }
}
