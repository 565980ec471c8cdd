import Foundation
import Testing
import TaskloopHTTPClient
import TaskloopLoop
import TaskloopLoopTestSupport
import TaskloopTestSupport

/// Streamed bodies (`HTTPClient.start(_:streamingTo:onComplete:)`) and the request timeout,
/// against the scripted origin over real sockets, the client on a loop thread of its own.
@Suite struct StreamedBodyTests {
    /// A client on a loop of its own; `close()` closes both and checks the loop closed clean.
    final class ClientOnLoop: Sendable {
        let thread: LoopThread
        let client: LoopBound<HTTPClient>

        init() throws {
            let loop = try EventLoop()
            thread = LoopThread(loop, name: "client-loop")
            client = thread.run { LoopBound(try! HTTPClient(loop: loop), loop: loop) }
        }

        /// Runs `body` with the client on the loop thread.
        func run<T: Sendable>(_ body: @escaping @Sendable (HTTPClient) -> T) -> T {
            let client = self.client
            return thread.run { body(client.value) }
        }

        func close() throws {
            let client = self.client
            thread.run {
                client.value.close()
                client.loop.finish()
            }
            try thread.waitForExit(timeout: 5)
        }
    }

    /// What a streamed transfer reported, shared between the loop and the test.
    final class Observed: Sendable {
        let head = Locked<Int?>(nil)
        let body = Locked<[UInt8]>([])
        let chunks = Locked(0)
        let outcome = Locked<Result<HTTPClientResponse, HTTPClientError>?>(nil)

        var stream: HTTPBodyStream {
            HTTPBodyStream(onHead: { [head] status, _ in head.withLock { $0 = status } },
                           onChunk: { [body, chunks] bytes in
                               body.withLock { $0 += bytes }
                               chunks.withLock { $0 += 1 }
                           })
        }

        func complete(_ result: Result<HTTPClientResponse, HTTPClientError>) { outcome.withLock { $0 = result } }
    }

    static func request(_ url: String) throws -> HTTPClientRequest {
        HTTPClientRequest(method: "GET", url: try HTTPURL(url))
    }

    /// Each piece of a chunked body reaches the callback before the origin sends the next one
    /// (it waits for the test's release), and the response keeps none of it.
    @Test func piecesArriveAsTheyAreSentAndNoneIsKept() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let client = try ClientOnLoop()
        let observed = Observed()
        let request = try Self.request(origin.url("/gated-unknown/3000/3"))
        client.run { client in
            _ = try! client.start(request, streamingTo: observed.stream) { observed.complete($0) }
        }
        for (released, expected) in [(0, 1_000), (1, 2_000), (1, 3_000)] {
            origin.release(released)
            try pollUntil("\(expected) body bytes streamed (have \(observed.body.value.count))") {
                observed.body.value.count == expected
            }
            #expect(observed.outcome.value == nil || expected == 3_000)
        }
        try pollUntil("the stream to end") { observed.outcome.value != nil }
        let response = try #require(try? observed.outcome.value?.get())
        #expect(observed.head.value == 200)
        #expect(observed.body.value == OriginServer.text(3_000))
        #expect(response.body.isEmpty && response.bytes == 3_000 && response.streamed && !response.truncated)
        try client.close()
    }

    /// A consumer may start another request from inside a chunk's callback (it joins once
    /// curl returns) and may cancel its own transfer there (nothing more is called back).
    @Test func aChunkCallbackMayStartAnotherRequestAndCancelItsOwn() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let client = try ClientOnLoop()
        let followUp = Observed()
        let followUpRequest = try Self.request(origin.url("/text/10"))
        let chunks = Locked(0)
        let streamOutcome = Locked<Result<HTTPClientResponse, HTTPClientError>?>(nil)
        let request = try Self.request(origin.url("/gated-unknown/3000/3"))
        client.run { client in
            let transfer = Locked<HTTPTransfer?>(nil)
            let stream = HTTPBodyStream(onHead: { _, _ in }, onChunk: { _ in
                chunks.withLock { $0 += 1 }
                _ = try! client.start(followUpRequest, streamingTo: followUp.stream) { followUp.complete($0) }
                transfer.value?.cancel()
            })
            transfer.withLock { $0 = try! client.start(request, streamingTo: stream) { result in streamOutcome.withLock { $0 = result } } }
        }
        try pollUntil("the follow-up request to complete") { followUp.outcome.value != nil }
        #expect(followUp.body.value == OriginServer.text(10))
        // The cancelled stream is gone from the client, so nothing more can be called back.
        #expect(client.run { $0.activeTransfers } == 0)
        #expect(chunks.value == 1 && streamOutcome.value == nil)
        try client.close()
    }

    /// `timeoutMilliseconds` bounds the whole exchange and is told apart from a connect timeout.
    @Test func aRequestTimeoutEndsAnExchangeThatNeverAnswers() throws {
        let origin = try OriginServer()
        defer { origin.stop() }
        let client = try ClientOnLoop()
        var request = try Self.request(origin.url("/hang"))
        request.timeoutMilliseconds = 200
        let outcome = Locked<Result<HTTPClientResponse, HTTPClientError>?>(nil)
        client.run { [request] client in
            _ = try! client.start(request, onProgress: { _, _ in }) { result in outcome.withLock { $0 = result } }
        }
        try pollUntil("the request to time out") { outcome.value != nil }
        guard case .failure(let error) = try #require(outcome.value) else {
            Issue.record("a request that never got an answer succeeded")
            return
        }
        #expect(error.code == .timedOut, "\(error)")
        try pollUntil("the origin to see the hang-up") { origin.hangUps.value == ["/hang"] }
        try client.close()
    }
}
