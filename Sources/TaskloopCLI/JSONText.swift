import TaskloopJSON

/// JSON for a person: two-space indentation, members in the server's order, numbers and
/// strings written exactly as the API's own writer writes them.
public enum JSONText {
    public static func pretty(_ value: JSONValue) -> String {
        var text = ""
        write(value, indent: "", into: &text)
        return text
    }

    private static func write(_ value: JSONValue, indent: String, into text: inout String) {
        let inner = indent + "  "
        switch value {
        case .object(let object) where !object.isEmpty:
            text += "{\n"
            for (position, member) in object.enumerated() {
                text += inner + compact(.string(member.key)) + ": "
                write(member.value, indent: inner, into: &text)
                text += position == object.count - 1 ? "\n" : ",\n"
            }
            text += indent + "}"
        case .array(let elements) where !elements.isEmpty:
            text += "[\n"
            for (position, element) in elements.enumerated() {
                text += inner
                write(element, indent: inner, into: &text)
                text += position == elements.count - 1 ? "\n" : ",\n"
            }
            text += indent + "]"
        default:
            text += compact(value)
        }
    }

    static func compact(_ value: JSONValue) -> String {
        String(decoding: value.encoded, as: UTF8.self)
    }
}
