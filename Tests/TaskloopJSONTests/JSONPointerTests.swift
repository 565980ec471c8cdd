import Testing
import TaskloopJSON

@Suite struct JSONPointerTests {
    /// RFC 6901 section 5: every pointer of the example against its document.
    @Test func resolvesTheRFCExamples() throws {
        let document = try JSONParser.parse(#"""
            {"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8}
            """#)
        let cases: [(String, JSONValue)] = [
            ("", document), ("/foo", ["bar", "baz"]), ("/foo/0", "bar"), ("/", 0), ("/a~1b", 1), ("/c%d", 2),
            ("/e^f", 3), ("/g|h", 4), ("/i\\j", 5), ("/k\"l", 6), ("/ ", 7), ("/m~0n", 8),
        ]
        for (text, expected) in cases {
            let pointer = try JSONPointer(text)
            #expect(pointer.resolve(in: document) == expected, "\(text.debugDescription)")
            #expect(pointer.description == text)
        }
    }

    @Test func unescapesLeftToRight() throws {
        #expect(try JSONPointer("/~01").tokens == ["~1"])
        #expect(try JSONPointer("/~10").tokens == ["/0"])
        #expect(try JSONPointer("/~0~1/x~1~0y").tokens == ["~/", "x/~y"])
        #expect(try JSONPointer("//").tokens == ["", ""])
        #expect(try JSONPointer("/é~1ü").tokens == ["é/ü"])
        #expect(JSONPointer(tokens: ["~1", "a/b", ""]).description == "/~01/a~1b/")
    }

    @Test func refusesMalformedPointersWithOffsets() {
        let cases: [(String, Int)] = [
            ("foo", 0), ("#/foo", 0), (" /a", 0), ("/a~2b", 2), ("/ab~", 3), ("/~", 1), ("/a/~~0", 3), ("/é~x", 3),
        ]
        for (text, offset) in cases {
            do {
                _ = try JSONPointer(text)
                Issue.record("accepted \(text.debugDescription)")
            } catch {
                #expect(error.offset == offset, "\(text.debugDescription): \(error)")
            }
        }
    }

    @Test func boundsLengthAndTokens() throws {
        let longest = "/" + String(repeating: "a", count: JSONPointer.maxLength - 1)
        #expect(try JSONPointer(longest).tokens.count == 1)
        #expect(throws: JSONPointerError.self) { try JSONPointer(longest + "a") }
        let deepest = String(repeating: "/a", count: JSONPointer.maxTokens)
        #expect(try JSONPointer(deepest).tokens.count == JSONPointer.maxTokens)
        do {
            _ = try JSONPointer(deepest + "/a")
            Issue.record("accepted \(JSONPointer.maxTokens + 1) tokens")
        } catch {
            #expect(error.reason == "pointer with more than \(JSONPointer.maxTokens) tokens")
            #expect(error.offset == 2 * JSONPointer.maxTokens)
        }
    }

    @Test func indexesArraysOnlyByPlainDigits() throws {
        let document: JSONValue = ["a": [10, 20, ["b": [true]]], "0": "zero", "01": "leading"]
        let cases: [(String, JSONValue?)] = [
            ("/a/0", 10), ("/a/1", 20), ("/a/2/b/0", true), ("/0", "zero"), ("/01", "leading"),
            ("/a/3", nil), ("/a/-", nil), ("/a/01", nil), ("/a/00", nil), ("/a/-1", nil), ("/a/+1", nil), ("/a/", nil),
            ("/a/1e0", nil), ("/a/ 1", nil), ("/a/99999999999999999999999", nil), ("/a/0/x", nil), ("/a/2/c", nil),
            ("/missing", nil), ("/0/0", nil),
        ]
        for (text, expected) in cases {
            #expect(try JSONPointer(text).resolve(in: document) == expected, "\(text)")
        }
        #expect(try JSONPointer("/0").resolve(in: "scalar") == nil)
        #expect(JSONPointer.wholeDocument.resolve(in: nil) == .null)
    }
}
