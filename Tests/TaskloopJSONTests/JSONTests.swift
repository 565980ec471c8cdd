import Foundation
import Testing
import TaskloopJSON

@Suite struct JSONTests {
    @Test func parsesEveryKindOfValueInOrder() throws {
        let value = try JSONParser.parse(#" {"b": [1, -2.5e2, true, false, null], "a": {"x": "y"}, "n": 0, "big": 12345678901234} "#)
        guard case .object(let object) = value else { Issue.record("not an object"); return }
        #expect(object.keys == ["b", "a", "n", "big"])
        #expect(object["b"] == [1, -250.0, true, false, nil])
        #expect(object["a"]?.objectValue?["x"]?.stringValue == "y")
        #expect(object["n"] == .int(0))
        #expect(object["big"]?.intValue == 12_345_678_901_234)
    }

    @Test func decodesEscapesAndUnicode() throws {
        let value = try JSONParser.parse(#""a\"b\\c\/d\n\t\u00e9\ud83d\ude00 é""#)
        #expect(value == .string("a\"b\\c/d\n\té😀 é"))
    }

    @Test func rejectsMalformedDocumentsWithOffsets() {
        let cases: [(String, Int)] = [
            ("", 0), ("{", 1), (#"{"a" 1}"#, 5), ("[1,]", 3), ("01", 1), ("1.", 2), ("-", 1), ("tru", 0),
            (#""\x""#, 3), (#""\ud800""#, 7), ("\"a\u{01}\"", 2), ("[1] [2]", 4), ("1e999", 5), ("{'a':1}", 1),
        ]
        for (text, offset) in cases {
            do {
                _ = try JSONParser.parse(text)
                Issue.record("accepted \(text.debugDescription)")
            } catch {
                #expect(error.offset == offset, "\(text.debugDescription): \(error)")
            }
        }
    }

    /// RFC 8259 leaves a repeated name's meaning open: one parser keeps the first, another the
    /// last, so the same bytes would mean two requests. Refused, naming the member.
    @Test func refusesRepeatedMemberNames() throws {
        for (text, name, offset) in [(#"{"kind":"noop","kind":"exec"}"#, "kind", 15),
                                     (#"{"a":{"b":1,"b":2}}"#, "b", 12),
                                     ("{" + (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + #","k39":0}"#, "k39", 0)] {
            do {
                _ = try JSONParser.parse(text)
                Issue.record("accepted \(text)")
            } catch {
                #expect(error.reason == "duplicate member name \"\(name)\"")
                if offset > 0 { #expect(error.offset == offset) }
            }
        }
        // The same name in sibling or nested objects is fine, and escapes are compared decoded.
        #expect(throws: Never.self) { try JSONParser.parse(#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#) }
        #expect(throws: JSONParseError.self) { try JSONParser.parse(#"{"a":1,"\u0061":2}"#) }
    }

    @Test func refusesDeepNesting() {
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        #expect(throws: JSONParseError.self) { try JSONParser.parse(deep) }
        let fine = String(repeating: "[", count: 64) + String(repeating: "]", count: 64)
        #expect(throws: Never.self) { try JSONParser.parse(fine) }
    }

    @Test func rejectsInvalidUTF8() {
        #expect(throws: JSONParseError.self) { try JSONParser.parse([0x22, 0xFF, 0x22]) }
    }

    @Test func writesCompactEscapedJSON() {
        let value: JSONValue = ["s": "q\"\\\n\u{1}é", "i": -3, "d": 1.5, "w": 2.0, "a": [true, nil], "o": [:]]
        #expect(String(decoding: value.encoded, as: UTF8.self)
            == #"{"s":"q\"\\\n\u0001é","i":-3,"d":1.5,"w":2,"a":[true,null],"o":{}}"#)
    }

    @Test func roundTripsAgreeWithFoundation() throws {
        let samples = [
            #"{"kind":"sleep","params":{"duration_ms":1500,"steps":10},"priority":-2,"tags":["a","b"],"x":null}"#,
            #"[0.1,1e-7,123456789012345678,"\u2028",{"":""}]"#,
        ]
        for sample in samples {
            let ours = try JSONParser.parse(sample)
            let reparsed = try JSONSerialization.jsonObject(with: Data(ours.encoded), options: [.fragmentsAllowed])
            let reference = try JSONSerialization.jsonObject(with: Data(sample.utf8), options: [.fragmentsAllowed])
            #expect(NSDictionary(dictionary: ["v": reparsed]).isEqual(to: ["v": reference]), "\(sample)")
        }
    }

    @Test func objectSubscriptSetsReplacesAndRemoves() {
        var object: JSONObject = ["a": 1, "b": 2]
        object["a"] = 3
        object["c"] = 4
        object["b"] = nil
        #expect(object.keys == ["a", "c"])
        #expect(object["a"] == 3)
    }

    @Test func decimalDigitsMatchDescription() {
        for value: Int64 in [0, 7, -7, 10, 99, 100, -12345, 1 << 40, .max, .min] {
            var bytes: [UInt8] = []
            bytes.appendDecimal(value)
            #expect(String(decoding: bytes, as: UTF8.self) == String(value))
        }
    }
}
