import Testing
import TaskloopJSON

@Suite struct OutputReferenceTests {
    @Test func findsReferencesNestedAnywhereInDocumentOrder() throws {
        let params = try JSONParser.parse(#"""
            {"url": {"$from": "fetch", "pointer": "/url"},
             "items": [1, {"$from": "list"}, {"nested": {"pointer": "", "$from": "b"}}],
             "a/b": {"$from": "c", "pointer": "/x~1y"},
             "plain": {"pointer": "/x", "from": "d", "$From": "e"}, "text": "$from"}
            """#)
        let found = try OutputReference.references(in: params)
        #expect(found.map(\.location.description) == ["/url", "/items/1", "/items/2/nested", "/a~1b"])
        #expect(found.map(\.reference) == [
            OutputReference(from: "fetch", pointer: JSONPointer(tokens: ["url"])),
            OutputReference(from: "list"),
            OutputReference(from: "b"),
            OutputReference(from: "c", pointer: JSONPointer(tokens: ["x/y"])),
        ])
        #expect(try OutputReference.references(in: ["$from": "a"])
            == [OutputReference.Occurrence(location: .wholeDocument, reference: OutputReference(from: "a"))])
    }

    @Test func namesWhereEachMalformedReferenceSits() throws {
        let cases: [(String, String, String)] = [
            (#"{"a": [{"$from": 1}]}"#, "/a/0", "$from must be a string (a dependency's key or id), not a number"),
            (#"{"a": {"$from": null, "pointer": "/x"}}"#, "/a", "$from must be a string (a dependency's key or id), not null"),
            (#"{"a": {"$from": "x", "pointer": 5}}"#, "/a", "pointer must be a string (a JSON Pointer such as /items/0), not a number"),
            (#"{"a": {"$from": "x", "pointer": "items"}}"#, "/a",
             "pointer is not a JSON Pointer: pointer must be empty or start with '/' at byte 0"),
            (#"{"a": {"$from": "x", "pointer": "/~2"}}"#, "/a", "pointer is not a JSON Pointer: '~' must be followed by 0 or 1 at byte 1"),
            (#"{"b": {"$from": "x", "default": 1}}"#, "/b", "an output reference has only $from and pointer, not default"),
            (#"[{"$from": "ok"}, {"k/~": {"$from": "x", "pointer": "/a~"}}]"#, "/1/k~1~0",
             "pointer is not a JSON Pointer: '~' must be followed by 0 or 1 at byte 2"),
            (#"{"$from": ["x"]}"#, "", "$from must be a string (a dependency's key or id), not an array"),
        ]
        for (text, location, reason) in cases {
            let params = try JSONParser.parse(text)
            do {
                _ = try OutputReference.references(in: params)
                Issue.record("accepted \(text)")
            } catch {
                #expect(error.location.description == location, "\(text)")
                #expect(error.reason == reason, "\(text)")
                #expect(error.description == "params\(location): \(reason)")
            }
        }
    }

    @Test func boundsTheNumberOfReferences() throws {
        let three: JSONValue = ["steps": [["$from": "a"], ["$from": "b"], ["$from": "c"]]]
        #expect(try OutputReference.references(in: three, maxCount: 3).count == 3)
        do {
            _ = try OutputReference.references(in: three, maxCount: 2)
            Issue.record("accepted 3 references with at most 2")
        } catch {
            #expect(error.location.description == "/steps/2")
            #expect(error.reason == "more than 2 output references")
        }
        let many = JSONValue.array(Array(repeating: ["$from": "a"], count: OutputReference.defaultMaxCount + 1))
        #expect(throws: OutputReferenceError.self) { try OutputReference.references(in: many) }
    }

    @Test func resolvesInDocumentOrderKeepingEverythingElse() throws {
        let results: [String: JSONValue] = [
            "fetch": ["url": "http://example.test", "items": [1, 2]],
            "list": [1, 2, 3],
            "raw": ["$from": "list"],
        ]
        let params = try JSONParser.parse(#"""
            {"u": {"$from": "fetch", "pointer": "/url"}, "keep": "x",
             "l": [{"$from": "list"}, 7, {"$from": "fetch", "pointer": "/items/1"}],
             "data": {"$from": "raw"}, "last": null}
            """#)
        var asked: [String] = []
        let resolved = OutputReference.resolving(params) { reference in
            asked.append("\(reference.from)\(reference.pointer)")
            return results[reference.from].flatMap(reference.pointer.resolve)
        }
        let expected: JSONValue = [
            "u": "http://example.test", "keep": "x", "l": [[1, 2, 3], 7, 2], "data": ["$from": "list"], "last": nil,
        ]
        #expect(try resolved.get() == expected)
        // A result that itself looks like a reference is data: it is not resolved again.
        #expect(asked == ["fetch/url", "list", "fetch/items/1", "raw"])
    }

    @Test func reportsTheFirstMissingInputAndAsksNoFurther() {
        let results: [String: JSONValue] = ["a": ["x": 1], "c": 3]
        let params: JSONValue = ["steps": [["$from": "a"], ["$from": "a", "pointer": "/y"], ["$from": "b"], ["$from": "c"]]]
        var asked: [String] = []
        let resolved = OutputReference.resolving(params) { reference in
            asked.append("\(reference.from)\(reference.pointer)")
            return results[reference.from].flatMap(reference.pointer.resolve)
        }
        guard case .failure(let missing) = resolved else {
            Issue.record("resolved \(resolved)")
            return
        }
        #expect(missing.location.description == "/steps/1")
        #expect(missing.reference == OutputReference(from: "a", pointer: JSONPointer(tokens: ["y"])))
        #expect(missing.description == "params/steps/1: nothing at /y in the result of a")
        #expect(asked == ["a", "a/y"])

        let whole = OutputReference.resolving(["input": ["$from": "b"]]) { _ in nil }
        guard case .failure(let missingResult) = whole else {
            Issue.record("resolved \(whole)")
            return
        }
        #expect(missingResult.description == "params/input: no result from b")
    }

    @Test func paramsWithoutReferencesComeBackUnasked() throws {
        let samples: [JSONValue] = [
            [:], nil, "$from",
            try JSONParser.parse(#"{"pointer": "/x", "$From": "a", "list": [{"from": "b"}, "$from", ["$from"]], "n": 1.5}"#),
            // Malformed ones were refused at submission, so one here is old plain data.
            ["kept": ["$from": 1]],
        ]
        for params in samples {
            var asked = 0
            let resolved = OutputReference.resolving(params) { _ in
                asked += 1
                return nil
            }
            #expect(try resolved.get() == params)
            #expect(asked == 0)
        }
        #expect(try OutputReference.references(in: samples[3]).isEmpty)
    }
}
