import CLibUV
import TaskloopLoop

/// One accepted TCP stream: the libuv side of an `HTTPConnection`.
///
/// Lifecycle: `init` (uv_tcp_init) -> accepted by the server -> reading -> `close(linger:)`
/// (flush queued writes, optionally half-close and drain) -> uv_close -> `handleDidClose`, where
/// the server forgets it and the handle's memory is freed. Loop thread only.
final class TCPConnection: HTTPTransport, UVHandleClosing {
    let handle: UnsafeMutablePointer<uv_tcp_t>
    private unowned let server: HTTPServer
    private(set) var http: HTTPConnection?
    private(set) var queuedBytes = 0
    /// Position in the server's connection list, for O(1) removal.
    var slot = -1
    private var reading = false
    private var lingerDiscarded = 0
    private var closeState = CloseState.open

    private enum CloseState {
        case open
        /// Waiting for queued writes before closing.
        case flushing(linger: Bool)
        case shuttingDown
        /// Write side closed; reading and discarding until EOF or `deadline`.
        case lingering(deadline: UInt64)
        case closed

        var acceptsWrites: Bool {
            switch self {
            case .open, .flushing: true
            case .shuttingDown, .lingering, .closed: false
            }
        }
    }

    /// The most one `uv_buf_t` carries here (its length is a UInt32).
    static let largestWrite = 1 << 30

    private var stream: UnsafeMutablePointer<uv_stream_t> {
        UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_stream_t.self)
    }

    init(server: HTTPServer, loop: EventLoop) throws(UVError) {
        self.server = server
        handle = try UVHandle.make(uv_tcp_t.self, "uv_tcp_init") { uv_tcp_init(loop.uvLoop, $0) }
        UVHandle.adopt(handle, owner: self)
    }

    /// Takes the pending connection off `listener`. On failure the caller closes this object.
    func accept(from listener: UnsafeMutablePointer<uv_stream_t>) throws(UVError) {
        try UVError.check(uv_accept(listener, stream), "uv_accept")
        // Small answers should leave at once rather than wait for Nagle's algorithm.
        uv_tcp_nodelay(handle, 1)
    }

    func serve(with context: HTTPConnectionContext) {
        http = HTTPConnection(context: context, transport: self)
        setReading(true)
    }

    /// Answers a connection the server will not serve (over the limit, or stopping) and closes.
    func refuse(with response: [UInt8]) {
        response.withUnsafeBytes { write($0) }
        close(linger: false)
    }

    // MARK: HTTPTransport

    func write(_ bytes: UnsafeRawBufferPointer) {
        guard closeState.acceptsWrites else { return }
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        // libuv's buffers count in UInt32: larger answers go out in pieces.
        if bytes.count > Self.largestWrite {
            var offset = 0
            while offset < bytes.count, closeState.acceptsWrites {
                let end = min(offset + Self.largestWrite, bytes.count)
                write(UnsafeRawBufferPointer(rebasing: bytes[offset..<end]))
                offset = end
            }
            return
        }
        var sent = 0
        if queuedBytes == 0 {
            var buffer = uv_buf_init(UnsafeMutablePointer(mutating: base.assumingMemoryBound(to: CChar.self)),
                                     UInt32(bytes.count))
            let written = uv_try_write(stream, &buffer, 1)
            if written >= 0 {
                sent = Int(written)
            } else if written != UV_EAGAIN.rawValue {
                closeNow()
                return
            }
        }
        if sent < bytes.count { enqueue(UnsafeRawBufferPointer(rebasing: bytes[sent...])) }
    }

    /// One system call for the three parts (a chunk's size line, its bytes shared with other
    /// streams, its end) with nothing copied; only what the socket does not take at once is
    /// copied into the queue.
    func write(_ head: UnsafeRawBufferPointer, _ body: UnsafeRawBufferPointer, _ tail: UnsafeRawBufferPointer) {
        guard closeState.acceptsWrites else { return }
        let total = head.count + body.count + tail.count
        guard total > 0 else { return }
        guard total <= Self.largestWrite else {
            for part in [head, body, tail] { write(part) }
            return
        }
        var sent = 0
        if queuedBytes == 0 {
            let written = withUnsafeTemporaryAllocation(of: uv_buf_t.self, capacity: 3) { buffers in
                var count = 0
                for part in [head, body, tail] where part.count > 0 {
                    buffers[count] = uv_buf_init(UnsafeMutablePointer(mutating: part.baseAddress!.assumingMemoryBound(to: CChar.self)),
                                                 UInt32(part.count))
                    count += 1
                }
                return uv_try_write(stream, buffers.baseAddress, UInt32(count))
            }
            if written >= 0 {
                sent = Int(written)
            } else if written != UV_EAGAIN.rawValue {
                closeNow()
                return
            }
        }
        guard sent < total else { return }
        var unsent: [UnsafeRawBufferPointer] = []
        for part in [head, body, tail] {
            if sent >= part.count {
                sent -= part.count
                continue
            }
            unsent.append(UnsafeRawBufferPointer(rebasing: part[sent...]))
            sent = 0
        }
        enqueue(unsent)
    }

    func setReading(_ wanted: Bool) {
        guard case .open = closeState else { return }
        setStreamReading(wanted)
    }

    func close(linger: Bool) {
        guard case .open = closeState else { return }
        closeState = .flushing(linger: linger)
        setStreamReading(false)
        if queuedBytes == 0 { finishFlushing() }
    }

    // MARK: internals

    private func enqueue(_ bytes: UnsafeRawBufferPointer) {
        enqueue(CollectionOfOne(bytes))
    }

    /// Copies `parts`, in order, into one allocation with its write request:
    /// [uv_write_t | length | bytes].
    private func enqueue(_ parts: some Collection<UnsafeRawBufferPointer>) {
        let count = parts.reduce(0) { $0 + $1.count }
        let memory = UnsafeMutableRawPointer.allocate(
            byteCount: WriteRequest.headerSize + count, alignment: MemoryLayout<uv_write_t>.alignment)
        let request = memory.assumingMemoryBound(to: uv_write_t.self)
        memory.storeBytes(of: count, toByteOffset: WriteRequest.lengthOffset, as: Int.self)
        let payload = memory + WriteRequest.headerSize
        var offset = 0
        for part in parts where part.count > 0 {
            (payload + offset).copyMemory(from: part.baseAddress!, byteCount: part.count)
            offset += part.count
        }
        var buffer = uv_buf_init(payload.assumingMemoryBound(to: CChar.self), UInt32(count))
        let status = uv_write(request, stream, &buffer, 1, writeCompleted)
        guard status == 0 else {
            memory.deallocate()
            closeNow()
            return
        }
        queuedBytes += count
    }

    fileprivate func writeFinished(length: Int, status: Int32) {
        queuedBytes -= length
        if status < 0 {
            closeNow()
            return
        }
        switch closeState {
        case .open:
            http?.transportDrained()
        case .flushing:
            if queuedBytes == 0 { finishFlushing() }
        case .shuttingDown, .lingering, .closed:
            break
        }
    }

    private func finishFlushing() {
        guard case .flushing(let linger) = closeState else { return }
        guard linger else { return closeNow() }
        let request = UnsafeMutablePointer<uv_shutdown_t>.allocate(capacity: 1)
        guard uv_shutdown(request, stream, shutdownCompleted) == 0 else {
            request.deallocate()
            return closeNow()
        }
        closeState = .shuttingDown
    }

    fileprivate func shutdownFinished(status: Int32) {
        guard case .shuttingDown = closeState else { return }
        guard status == 0 else { return closeNow() }
        closeState = .lingering(deadline: server.loop.now + server.configuration.lingerMilliseconds)
        setStreamReading(true)
    }

    fileprivate func didRead(_ count: Int, from base: UnsafeMutablePointer<CChar>?) {
        if count > 0 {
            if case .lingering = closeState {
                lingerDiscarded += count
                if lingerDiscarded > server.configuration.maxLingerDiscardBytes { closeNow() }
                return
            }
            http?.receive(UnsafeRawBufferPointer(start: base, count: count))
        } else if count == Int(UV_EOF.rawValue) {
            if case .open = closeState {
                setStreamReading(false)
                http?.peerClosed()
            } else {
                closeNow()
            }
        } else if count < 0 {
            closeNow()
        }
    }

    func tick(now: UInt64) {
        if case .lingering(let deadline) = closeState {
            if now >= deadline { closeNow() }
            return
        }
        http?.tick(now: now)
    }

    /// Closes at once, dropping queued output (pending writes complete as cancelled).
    func closeNow() {
        if case .closed = closeState { return }
        closeState = .closed
        reading = false
        UVHandle.close(handle)
    }

    private func setStreamReading(_ wanted: Bool) {
        guard wanted != reading else { return }
        reading = wanted
        if wanted {
            if uv_read_start(stream, provideReadBuffer, readCompleted) != 0 { closeNow() }
        } else {
            uv_read_stop(stream)
        }
    }

    func handleDidClose() {
        http?.transportClosed()
        http = nil
        server.connectionDidClose(self)
    }

    fileprivate var readBuffer: uv_buf_t { server.readBuffer }
}

private enum WriteRequest {
    static let lengthOffset = (MemoryLayout<uv_write_t>.size + 7) & ~7
    static let headerSize = lengthOffset + MemoryLayout<Int>.size
}

private func connection(of stream: UnsafeMutablePointer<uv_stream_t>?) -> TCPConnection {
    UVHandle.owner(stream, as: TCPConnection.self)
}

private let provideReadBuffer: uv_alloc_cb = { handle, _, buffer in
    // One buffer serves every connection: read callbacks run one at a time and each consumes
    // (or copies) its bytes before returning.
    buffer!.pointee = UVHandle.owner(handle, as: TCPConnection.self).readBuffer
}

private let readCompleted: uv_read_cb = { stream, count, buffer in
    connection(of: stream).didRead(count, from: buffer?.pointee.base)
}

private let writeCompleted: uv_write_cb = { request, status in
    let memory = UnsafeMutableRawPointer(request!)
    let length = memory.load(fromByteOffset: WriteRequest.lengthOffset, as: Int.self)
    let owner = connection(of: request!.pointee.handle)
    memory.deallocate()
    owner.writeFinished(length: length, status: status)
}

private let shutdownCompleted: uv_shutdown_cb = { request, status in
    let owner = connection(of: request!.pointee.handle)
    request!.deallocate()
    owner.shutdownFinished(status: status)
}
