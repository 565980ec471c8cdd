import Foundation
import Testing
@testable import TaskloopHTTP

/// The admission check on a request's head, without sockets: a refusal is answered before any
/// of the body is read, with no `100 Continue`, and the connection closes; an admission may
/// annotate the request and add fields to its answer.
@Suite struct AdmissionTests {
    @Test func aRefusedHeadIsAnsweredAtOnceAndItsBodyNeverRead() {
        let harness = ConnectionHarness(limits: HTTPParserLimits(maxBodyBytes: 100 << 20))
        var heads: [String] = []
        var handled = 0
        harness.admission = { request in
            heads.append("\(request.method) \(request.path) \(request.headers["Authorization"] ?? "-") body:\(request.body.count)")
            return .refuse(HTTPResponse(status: .unauthorized, headers: ["WWW-Authenticate": "Bearer"]))
        }
        harness.handler = { _, responder in
            handled += 1
            responder.respond(HTTPResponse())
        }
        harness.receive("POST /tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\nExpect: 100-continue\r\n\r\n")
        #expect(heads == ["POST /tasks - body:0"])
        #expect(harness.transport.statusLines == ["HTTP/1.1 401 Unauthorized"], "no 100 Continue before the refusal")
        #expect(harness.transport.sentText.contains("Connection: close\r\n"))
        #expect(harness.transport.closeRequest == true)
        // What the client goes on sending is neither parsed nor answered.
        harness.receive(String(repeating: "x", count: 100_000) + "GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(handled == 0 && harness.transport.statusLines.count == 1)
        #expect(harness.connection.pendingInputBytes == 0)
    }

    @Test func anAdmittedHeadGoesOnWithItsNotesAndFields() {
        let harness = ConnectionHarness()
        harness.admission = { request in
            request.matchedRoute = 7
            return .admitAnswering(with: ["Access-Control-Allow-Origin": "https://app.example"])
        }
        var routes: [Int] = []
        var bodies: [String] = []
        harness.handler = { request, responder in
            routes.append(request.matchedRoute)
            bodies.append(String(decoding: request.body, as: UTF8.self))
            responder.respond(HTTPResponse(status: .created))
        }
        harness.receive("POST /tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        #expect(harness.transport.statusLines == ["HTTP/1.1 100 Continue"])
        harness.receive("hello")
        #expect(routes == [7] && bodies == ["hello"])
        #expect(harness.transport.statusLines.last == "HTTP/1.1 201 Created")
        #expect(harness.transport.sentText.contains("Access-Control-Allow-Origin: https://app.example\r\n"))
        #expect(harness.transport.closeRequest == nil)
    }

    @Test func aRefusedHeadRequestGetsNoBody() {
        let harness = ConnectionHarness()
        harness.admission = { _ in .refuse(HTTPResponse(status: .misdirectedRequest, body: Array("no".utf8))) }
        harness.receive("HEAD /healthz HTTP/1.1\r\nHost: evil\r\n\r\n")
        #expect(harness.transport.statusLines == ["HTTP/1.1 421 Misdirected Request"])
        #expect(harness.transport.sentText.hasSuffix("\r\n\r\n"))
    }
}
