import Testing
@testable import TaskloopHTTP

@Suite struct RouterTests {
    private func router() -> Router<String> {
        var router = Router<String>()
        router.add(.GET, "/healthz", "health")
        router.add(.GET, "/tasks", "list")
        router.add(.POST, "/tasks", "submit")
        router.add(.GET, "/tasks/{id}", "get")
        router.add(.DELETE, "/tasks/{id}", "cancel")
        router.add(.POST, "/tasks/{id}/progress", "progress")
        router.add(.GET, "/tasks/count", "count")
        router.add(.GET, "/", "root")
        return router
    }

    private func found(_ match: Router<String>.Match?) -> (String, PathParameters)? {
        if case .found(let handler, let parameters, _)? = match { return (handler, parameters) }
        return nil
    }

    @Test func literalRoutesMatchByMethod() {
        let router = router()
        #expect(found(router.match(.GET, rawPath: "/tasks"))?.0 == "list")
        #expect(found(router.match(.POST, rawPath: "/tasks"))?.0 == "submit")
        #expect(found(router.match(.GET, rawPath: "/"))?.0 == "root")
    }

    @Test func parametersAreCapturedAndDecoded() {
        let router = router()
        let match = found(router.match(.GET, rawPath: "/tasks/ab%2Fc%20d"))
        #expect(match?.0 == "get")
        #expect(match?.1["id"] == "ab/c d")
        #expect(found(router.match(.POST, rawPath: "/tasks/42/progress"))?.1["id"] == "42")
    }

    @Test func literalSegmentsWinOverParameters() {
        #expect(found(router().match(.GET, rawPath: "/tasks/count"))?.0 == "count")
        #expect(found(router().match(.GET, rawPath: "/tasks/counts"))?.0 == "get")
        // The literal path owns its methods; it does not fall through to the parameter route.
        guard case .methodNotAllowed(let allowed)? = router().match(.DELETE, rawPath: "/tasks/count") else {
            Issue.record("expected 405")
            return
        }
        #expect(Set(allowed) == [.GET, .HEAD])
    }

    @Test func headFallsBackToGet() {
        #expect(found(router().match(.HEAD, rawPath: "/healthz"))?.0 == "health")
    }

    @Test func unknownPathsAreNotFound() {
        let router = router()
        for path in ["/nope", "/tasks/1/2", "/healthz/", "/tasks/", "//healthz"] {
            guard case .notFound? = router.match(.GET, rawPath: path) else {
                Issue.record("\(path) should be 404")
                continue
            }
        }
    }

    @Test func wrongMethodListsAllowedMethods() throws {
        guard case .methodNotAllowed(let allowed)? = router().match(.PUT, rawPath: "/tasks/7") else {
            Issue.record("expected 405")
            return
        }
        #expect(Set(allowed) == [.GET, .HEAD, .DELETE])
    }

    @Test func malformedEscapesAreRejected() {
        #expect(router().match(.GET, rawPath: "/tasks/%zz") == nil)
        #expect(router().match(.GET, rawPath: "/tasks/%C3") == nil)
    }
}

@Suite struct HTTPValueTests {
    @Test func headerLookupIgnoresCaseAndKeepsRepeats() {
        var headers: HTTPHeaders = ["Content-Type": "text/plain", "X-Tag": "a"]
        headers.add("x-tag", "b")
        #expect(headers["content-type"] == "text/plain")
        #expect(headers["CONTENT-TYPE"] == "text/plain")
        #expect(headers.values(for: "X-TAG") == ["a", "b"])
        #expect(headers["missing"] == nil)
        headers.set("X-Tag", "c")
        #expect(headers.values(for: "x-tag") == ["c"])
        headers.remove("X-TAG")
        #expect(!headers.contains("x-tag"))
    }

    @Test func headerTokensAreFoundInLists() {
        let headers: HTTPHeaders = ["Connection": "keep-alive, Upgrade"]
        #expect(headers.containsToken("upgrade", in: "connection"))
        #expect(headers.containsToken("Keep-Alive", in: "Connection"))
        #expect(!headers.containsToken("close", in: "Connection"))
    }

    @Test func theFirstValueIsTestedOnItsBytes() {
        var headers: HTTPHeaders = ["Host": "localhost:8080"]
        headers.add("host", "example.com")
        let isLocal = { (bytes: UnsafeBufferPointer<UInt8>) in bytes.starts(with: "localhost".utf8) }
        #expect(headers.firstValue(of: "HOST", satisfies: isLocal) == true)
        #expect(headers.firstValue(of: "Host", satisfies: { $0.elementsEqual("example.com".utf8) }) == false)
        #expect(headers.firstValue(of: "Origin", satisfies: isLocal) == nil)
    }

    @Test func targetsSplitIntoDecodedPathAndQuery() throws {
        let request = try HTTPRequest(method: .GET, target: "/a%20b/c?x=1&y=hello+world&z=%26&flag&x=2")
        #expect(request.path == "/a b/c")
        #expect(request.rawPath == "/a%20b/c")
        #expect(request.query("x") == "1")
        #expect(request.queryItems.filter { $0.name == "x" }.map(\.value) == ["1", "2"])
        #expect(request.query("y") == "hello world")
        #expect(request.query("z") == "&")
        #expect(request.query("flag") == "")
    }

    @Test func absoluteFormTargetsKeepPathAndQuery() throws {
        let request = try HTTPRequest(method: .GET, target: "http://example.com:8080/tasks?state=running")
        #expect(request.path == "/tasks")
        #expect(request.query("state") == "running")
        #expect(try HTTPRequest(method: .GET, target: "http://example.com").path == "/")
    }

    @Test func malformedTargetsAreRejected() {
        #expect(throws: RequestTargetError.self) { try HTTPRequest(method: .GET, target: "/a%2") }
        #expect(throws: RequestTargetError.self) { try HTTPRequest(method: .GET, target: "/a?b=%G1") }
        #expect(throws: RequestTargetError.self) { try HTTPRequest(method: .GET, target: "nonsense") }
        #expect(throws: RequestTargetError.self) { try HTTPRequest(method: .GET, target: "/%FF") }
    }

    @Test func problemsRenderAsProblemJSON() {
        let problem = HTTPProblem(.unprocessableContent, detail: "bad \"input\"\n\\ \u{1}é", headers: ["Retry-After": "1"])
        let response = problem.response()
        #expect(response.status.code == 422)
        #expect(response.headers["Content-Type"] == "application/problem+json")
        #expect(response.headers["Retry-After"] == "1")
        #expect(String(decoding: response.body, as: UTF8.self) ==
            #"{"type":"about:blank","title":"Unprocessable Content","status":422,"detail":"bad \"input\"\n\\ \u0001é","code":"invalid"}"#)
        let extended = problem.response(extraMembers: Array(#""keys":["a"]"#.utf8))
        #expect(String(decoding: extended.body, as: UTF8.self).hasSuffix(#""code":"invalid","keys":["a"]}"#))
    }

    @Test func dateHeaderIsIMFFixdate() {
        #expect(String(decoding: HTTPDateCache.format(784_111_777), as: UTF8.self) == "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n")
    }
}
