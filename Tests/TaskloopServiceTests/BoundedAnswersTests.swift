import Foundation
import Testing
@testable import TaskloopService
import TaskloopTestSupport

/// Contract v3 "Safe by default", bounded answers: no single answer or event grows without
/// bound, a large one never wedges a stream, and a resume is written at the reader's pace.
@Suite struct BoundedAnswersTests {
    typealias Stream = EventStreamTests.Stream

    @Test func aPageOfLargeTasksStopsEarlyAndNextGoesOn() throws {
        let service = try ServiceHarness { $0.maxResponseBytes = 64 * 1024 }
        let client = try service.client()
        let padding = String(repeating: "m", count: 20_000)
        var submitted: [String] = []
        for index in 0..<10 {
            let task = try client.submit(#"{"kind":"noop","name":"t\#(index)","metadata":{"pad":"\#(padding)"}}"#)
            submitted.append(try #require(task["id"] as? String))
        }
        var seen: [String] = []
        var cursor = ""
        var pages = 0
        repeat {
            let page = try client.call("GET", "/tasks?limit=100\(cursor.isEmpty ? "" : "&after=\(cursor)")")
            #expect(page.status == 200 && page.body.count < 64 * 1024 + 30_000, "a page is cut once past the limit: \(page.body.count)")
            let tasks = try #require(page.json["tasks"] as? [[String: Any]])
            #expect(!tasks.isEmpty)
            seen += tasks.compactMap { $0["id"] as? String }
            cursor = page.json["next"] as? String ?? ""
            pages += 1
        } while !cursor.isEmpty && pages < 20
        #expect(pages >= 3)
        #expect(seen == submitted.reversed(), "every task once, newest first, across the pages")
        try service.stop()
    }

    /// A 300 KB result reaches an event stream cut to 64 KiB (and says so); the task itself
    /// keeps all of it. A stream whose buffer is smaller than one event still gets it.
    @Test func aLargeResultTravelsCutInEventsAndWholeInTheTask() throws {
        let service = try ServiceHarness { $0.eventClientBufferBytes = 65_536; $0.http.parserLimits.maxBodyBytes = 4 << 20 }
        let client = try service.client()
        let big = String(repeating: "r", count: 300_000)
        let pad = String(repeating: "p", count: 200_000)
        let id = try #require(try client.submit(#"{"kind":"external","metadata":{"pad":"\#(pad)"}}"#)["id"] as? String)
        let stream = try Stream(port: service.port, "/tasks/\(id)/events")
        _ = try stream.connection.readUntil { String(decoding: $0, as: UTF8.self).contains("retry:") }
        let done = try client.call("POST", "/tasks/\(id)/complete", json: #"{"result":{"status":200,"body":"\#(big)"}}"#)
        #expect(done.status == 200)
        let events = Stream.parse(try stream.connection.readUntilClosed(timeout: 10)).events
        let ended = try #require(events.last { $0.type == "task.state" }?.data["task"] as? [String: Any])
        #expect(ended["state"] as? String == "succeeded" && ended["result_truncated"] as? Bool == true)
        let result = try #require(ended["result"] as? [String: Any])
        #expect(result["status"] as? Int == 200)
        let body = try #require(result["body"] as? String)
        #expect(body.count < 64 * 1024 && body.count > 1_000 && big.hasPrefix(body))
        #expect((ended["metadata"] as? [String: Any])?["pad"] as? String == pad, "an event larger than the client buffer arrives whole")
        let whole = try client.task(id)
        #expect((whole["result"] as? [String: Any])?["body"] as? String == big && whole["result_truncated"] == nil)
        try service.stop()
    }

    /// Resuming from the start of a long history with a 64 KiB client buffer: before, the whole
    /// history was copied into the reader's buffer at once, and the reader was disconnected
    /// for holding too much, for ever. Now it is written as the reader takes it.
    @Test(.numbersEventsAsOneServer) func aResumeIsWrittenAtTheReadersPace() throws {
        let service = try ServiceHarness { $0.eventClientBufferBytes = 65_536 }
        let client = try service.client()
        let pad = String(repeating: "h", count: 1_000)
        for _ in 0..<250 { _ = try client.submit(#"{"kind":"noop","metadata":{"pad":"\#(pad)"}}"#) }
        let last = service.onLoop { $0.eventLog.lastPublished }
        #expect(last >= 750)
        let stream = try Stream(port: service.port, "/events", headers: ["Last-Event-ID": "0"])
        let events = try stream.waitFor(Int(last), timeout: 30)
        #expect(events.count == Int(last) && events.last?.id == last)
        #expect(events.map { $0.id ?? 0 } == Array(1...last), "every event once, in order")
        try service.stop()
    }

    @Test(.numbersEventsAsOneServer) func theHistoryIsBoundedInBytes() throws {
        let service = try ServiceHarness { $0.eventBufferBytes = 1 << 20 }
        let client = try service.client()
        // A stream renders every event as it is published.
        let stream = try Stream(port: service.port, "/events")
        let pad = String(repeating: "b", count: 2_000)
        // Read as it goes, so the stream never falls behind.
        for batch in 1...10 {
            for _ in 0..<30 { _ = try client.submit(#"{"kind":"noop","metadata":{"pad":"\#(pad)"}}"#) }
            _ = try stream.waitFor(batch * 90, timeout: 30)
        }
        let (bytes, oldest) = service.onLoop { ($0.eventLog.ringBytes, $0.eventLog.oldestKept) }
        #expect(bytes <= 1 << 20 && oldest > 1, "kept \(bytes) bytes from \(oldest)")
        let resumed = try Stream(port: service.port, "/events", headers: ["Last-Event-ID": "0"])
        let first = try resumed.waitFor(1)
        #expect(first.first?.type == "reset")
        try service.stop()
    }
}
