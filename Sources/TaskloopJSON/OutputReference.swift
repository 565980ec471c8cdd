/// A part of a dependency's result that a task's params take: written in them as
/// `{"$from": "<dependency key or id>", "pointer": "/json/pointer"}` and replaced by that value
/// when the task starts. Which dependencies `from` may name is the engine's rule; this is the
/// shape alone. The walks recurse as deep as the params nest, which the parser bounds.
public struct OutputReference: Sendable, Equatable {
    /// Each reference may copy a whole result into the params when the task starts, so their
    /// number bounds how far params can grow.
    public static let defaultMaxCount = 64

    public let from: String
    public let pointer: JSONPointer

    public init(from: String, pointer: JSONPointer = .wholeDocument) {
        self.from = from
        self.pointer = pointer
    }

    /// A reference and where it sits, as a pointer relative to the params.
    public struct Occurrence: Sendable, Equatable {
        public let location: JSONPointer
        public let reference: OutputReference

        public init(location: JSONPointer, reference: OutputReference) {
            self.location = location
            self.reference = reference
        }
    }

    /// Every reference in `params`, in document order, or the first malformed one (or the one
    /// past `maxCount`) with where it sits.
    public static func references(in params: JSONValue, maxCount: Int = defaultMaxCount) throws(OutputReferenceError) -> [Occurrence] {
        guard mayHoldReferences(params) else { return [] }
        var found: [Occurrence] = []
        var path: [String] = []
        try collect(params, path: &path, into: &found, maxCount: maxCount)
        return found
    }

    /// `params` with each reference replaced by what `resolve` gives for it, visited in document
    /// order; the first it has nothing for is the failure, and `resolve` is not asked again.
    /// An object with `$from` that is not a well-formed reference stays as it is: submission
    /// refuses those, so one met here was stored as plain data before references existed.
    public static func resolving(_ params: JSONValue, with resolve: (OutputReference) -> JSONValue?) -> Result<JSONValue, MissingInput> {
        guard mayHoldReferences(params) else { return .success(params) }
        var path: [String] = []
        do {
            return .success(try replacing(params, path: &path, resolve) ?? params)
        } catch {
            return .failure(error)
        }
    }

    private static let fromKey = "$from"
    private static let pointerKey = "pointer"

    /// Whether any object under `value` has a `$from` member; no allocation, so params without
    /// references cost one walk.
    private static func mayHoldReferences(_ value: JSONValue) -> Bool {
        switch value {
        case .object(let object): object.members.contains { $0.key == fromKey || mayHoldReferences($0.value) }
        case .array(let elements): elements.contains(where: mayHoldReferences)
        default: false
        }
    }

    private enum Reading {
        case data
        case reference(OutputReference)
        case malformed(String)
    }

    private static func read(_ object: JSONObject) -> Reading {
        guard let from = object[fromKey] else { return .data }
        if let extra = object.members.first(where: { $0.key != fromKey && $0.key != pointerKey }) {
            return .malformed("an output reference has only $from and pointer, not \(extra.key)")
        }
        guard let name = from.stringValue else {
            return .malformed("$from must be a string (a dependency's key or id), not \(from.kindDescription)")
        }
        guard let pointerValue = object[pointerKey] else { return .reference(OutputReference(from: name)) }
        guard let text = pointerValue.stringValue else {
            return .malformed("pointer must be a string (a JSON Pointer such as /items/0), not \(pointerValue.kindDescription)")
        }
        do {
            return .reference(OutputReference(from: name, pointer: try JSONPointer(text)))
        } catch {
            return .malformed("pointer is not a JSON Pointer: \(error)")
        }
    }

    private static func collect(_ value: JSONValue, path: inout [String], into found: inout [Occurrence],
                                maxCount: Int) throws(OutputReferenceError) {
        switch value {
        case .object(let object):
            switch read(object) {
            case .reference(let reference):
                guard found.count < maxCount else {
                    throw OutputReferenceError(location: JSONPointer(tokens: path), reason: "more than \(maxCount) output references")
                }
                found.append(Occurrence(location: JSONPointer(tokens: path), reference: reference))
            case .malformed(let reason):
                throw OutputReferenceError(location: JSONPointer(tokens: path), reason: reason)
            case .data:
                for member in object.members {
                    path.append(member.key)
                    try collect(member.value, path: &path, into: &found, maxCount: maxCount)
                    path.removeLast()
                }
            }
        case .array(let elements):
            for (index, element) in elements.enumerated() {
                path.append(String(index))
                try collect(element, path: &path, into: &found, maxCount: maxCount)
                path.removeLast()
            }
        default:
            return
        }
    }

    /// The value with its references replaced, or nil when none is under it: only containers on
    /// the way to a reference are copied.
    private static func replacing(_ value: JSONValue, path: inout [String],
                                  _ resolve: (OutputReference) -> JSONValue?) throws(MissingInput) -> JSONValue? {
        switch value {
        case .object(let object):
            switch read(object) {
            case .reference(let reference):
                guard let resolved = resolve(reference) else {
                    throw MissingInput(location: JSONPointer(tokens: path), reference: reference)
                }
                return resolved
            case .malformed:
                return nil
            case .data:
                var replaced: [JSONObject.Member]?
                for (index, member) in object.members.enumerated() {
                    path.append(member.key)
                    if let value = try replacing(member.value, path: &path, resolve) {
                        if replaced == nil { replaced = object.members }
                        replaced![index].value = value
                    }
                    path.removeLast()
                }
                return replaced.map { .object(JSONObject($0)) }
            }
        case .array(let elements):
            var replaced: [JSONValue]?
            for (index, element) in elements.enumerated() {
                path.append(String(index))
                if let value = try replacing(element, path: &path, resolve) {
                    if replaced == nil { replaced = elements }
                    replaced![index] = value
                }
                path.removeLast()
            }
            return replaced.map { .array($0) }
        default:
            return nil
        }
    }
}

/// A `$from` object in params that is not a well-formed reference (the API answers 422).
public struct OutputReferenceError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Relative to the params: `""` is the params themselves, `/steps/0` an element under them.
    public let location: JSONPointer
    public let reason: String
    public var description: String { "params\(location): \(reason)" }
}

/// The first reference whose value was not there when the task started (it fails with
/// `input_missing`).
public struct MissingInput: Error, Equatable, Sendable, CustomStringConvertible {
    public let location: JSONPointer
    public let reference: OutputReference

    public var description: String {
        if reference.pointer == .wholeDocument { return "params\(location): no result from \(reference.from)" }
        return "params\(location): nothing at \(reference.pointer) in the result of \(reference.from)"
    }
}
