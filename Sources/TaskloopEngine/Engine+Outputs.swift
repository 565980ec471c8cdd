import TaskloopJSON

/// Outputs flowing to dependents: a task's params may hold `{"$from": ..., "pointer": ...}`
/// (`OutputReference`), naming one of its dependencies (a task id, or inside a workflow a
/// sibling's key), replaced when the task starts by that part of the dependency's result.
///
/// - Submission refuses a malformed reference or one naming no dependency; the executor checks
///   the params with the references left out (`maskingOutputs`), and a refusal where one stood
///   is left to the start (`awaitsOutputs`).
/// - When a dependency releases a task (it ended, here or in another cell, or had ended when
///   the task was linked), the task takes the values its references point at into its record
///   (`TaskRecord.inputs`): the dependency may be forgotten by retention, or live in another
///   cell, before the task starts. The `ended` message of a dependency across cells carries its
///   result for this.
/// - `start` resolves the params from those inputs (`TaskRecord.resolvedParams`, what the task
///   shows from then on and what a worker's lease carries); a value missing fails the task with
///   `input_missing`, resolved params beyond the limits with `input_too_large`, and resolved
///   params the executor refuses with `invalid_params`, none of them retried. The submitted
///   params stay for a later attempt, which resolves again.
public struct TaskInput: Sendable, Equatable {
    /// As the reference names its dependency (an id, or a sibling's key).
    public var from: String
    public var pointer: JSONPointer
    public var value: JSONValue

    public init(from: String, pointer: JSONPointer, value: JSONValue) {
        self.from = from
        self.pointer = pointer
        self.value = value
    }
}

extension TaskError {
    static func inputMissing(_ missing: MissingInput) -> TaskError {
        TaskError(code: "input_missing", message: "The task's input is missing: \(missing).",
                  details: ["reference": reference(missing.reference), "path": .string("params\(missing.location)")])
    }

    static func inputTooLarge(_ reason: String) -> TaskError {
        TaskError(code: "input_too_large", message: "The task's params with its inputs resolved are too large: \(reason).")
    }

    private static func reference(_ reference: OutputReference) -> JSONValue {
        .object(["$from": .string(reference.from), "pointer": .string(reference.pointer.description)])
    }
}

extension Engine {
    /// The levels resolved params may nest: a lease answer holds them two levels down
    /// (`{"tasks": [{"params": ...}]}`), and a worker parses it with the parser's default.
    public static let maxResolvedParamsDepth = JSONParser.defaultMaxDepth - 3

    // MARK: submission

    /// Refuses a malformed reference in `params`, or one that names none of `dependencies`.
    /// `at` prefixes field paths (`tasks[3].`).
    func checkOutputReferences(in params: JSONValue, naming dependencies: [DependencyReference],
                               at: @autoclosure () -> String) throws(EngineError) {
        guard configuration.resolvesOutputs else { return }
        let found: [OutputReference.Occurrence]
        do {
            found = try OutputReference.references(in: params)
        } catch {
            throw EngineError(.invalid, error.reason, field: at() + Self.field(error.location, in: params))
        }
        for occurrence in found {
            let from = occurrence.reference.from
            let named = dependencies.contains { dependency in
                switch dependency {
                case .task(let id): TaskID(from) == id
                case .sibling(let key): key == from
                }
            }
            guard named else {
                throw EngineError(.invalid, "$from names \(from), which is not one of the task's dependencies.",
                                  field: at() + Self.field(occurrence.location, in: params))
            }
        }
    }

    /// `params` for the executor's check at submission: each reference's member left out (an
    /// element of an array made `null`), so that the fields around it are checked; one it
    /// then misses is `awaitsOutputs`.
    func maskingOutputs(in params: JSONValue) -> JSONValue {
        guard configuration.resolvesOutputs, let found = try? OutputReference.references(in: params),
              !found.isEmpty else { return params }
        return found.reduce(params) { masked, occurrence in Self.removing(occurrence.location.tokens[...], from: masked) }
    }

    private static func removing(_ tokens: ArraySlice<String>, from value: JSONValue) -> JSONValue {
        guard let token = tokens.first else { return .object([:]) }
        let rest = tokens.dropFirst()
        switch value {
        case .object(let object):
            var object = object
            if rest.isEmpty { object[token] = nil } else if let member = object[token] { object[token] = removing(rest, from: member) }
            return .object(object)
        case .array(var elements):
            guard let index = Int(token), elements.indices.contains(index) else { return value }
            elements[index] = rest.isEmpty ? .null : removing(rest, from: elements[index])
            return .array(elements)
        default:
            return value
        }
    }

    /// Whether the executor's refusal of `field` (relative to `params`) may be about a value a
    /// reference stands for, at or under or around it: then only the resolved params can say.
    /// Params with a malformed reference are refused for that (`checkOutputReferences`).
    func awaitsOutputs(_ field: String?, in params: JSONValue) -> Bool {
        guard configuration.resolvesOutputs, let field else { return false }
        let found: [OutputReference.Occurrence]
        do {
            found = try OutputReference.references(in: params)
        } catch {
            return true
        }
        let refused = Self.tokens(ofField: field)
        return found.contains { occurrence in
            let location = occurrence.location.tokens
            return location.starts(with: refused) || refused.starts(with: location)
        }
    }

    /// A member sent to another cell names its siblings by id, as its dependencies do: that cell
    /// knows no keys.
    static func namingByID(_ params: JSONValue, keys: [String: TaskID]) -> JSONValue {
        let renamed = OutputReference.resolving(params) { reference in
            var members = [JSONObject.Member("$from", .string(keys[reference.from]?.description ?? reference.from))]
            if reference.pointer != .wholeDocument { members.append(JSONObject.Member("pointer", .string(reference.pointer.description))) }
            return .object(JSONObject(members))
        }
        // Never missing: each reference gives its renamed self.
        guard case .success(let renamedParams) = renamed else { return params }
        return renamedParams
    }

    // MARK: release

    /// `record` no longer waits on `dependency`, which ended with `result`: what its references
    /// to it point at goes into the record, in place of what an earlier end gave.
    func takeInputs(of record: TaskRecord, from dependency: TaskID, result: JSONValue?) {
        guard configuration.resolvesOutputs, !record.state.isTerminal,
              let found = try? OutputReference.references(in: record.params), !found.isEmpty else { return }
        var inputs = record.inputs
        for occurrence in found where names(occurrence.reference.from, dependency, in: record) {
            let reference = occurrence.reference
            inputs.removeAll { $0.from == reference.from && $0.pointer == reference.pointer }
            if let value = result.flatMap({ reference.pointer.resolve(in: $0) }) {
                inputs.append(TaskInput(from: reference.from, pointer: reference.pointer, value: value))
            }
        }
        guard inputs != record.inputs else { return }
        record.inputs = inputs
        // Kept now: the dependency may be forgotten before the task starts.
        emit(.releasedByRetry(record))
    }

    private func names(_ from: String, _ dependency: TaskID, in record: TaskRecord) -> Bool {
        if let sibling = record.workflow?.keys.first(where: { $0.key == from }) { return sibling.id == dependency }
        return TaskID(from) == dependency
    }

    // MARK: start

    /// Sets the params the attempt about to start runs with; false when it cannot start, having
    /// failed the task.
    func resolveInputs(of record: TaskRecord) -> Bool {
        // Params without references cost one walk that allocates nothing.
        guard configuration.resolvesOutputs, let found = try? OutputReference.references(in: record.params),
              !found.isEmpty else { return true }
        let resolved: JSONValue
        switch OutputReference.resolving(record.params, with: { reference in
            record.inputs.first { $0.from == reference.from && $0.pointer == reference.pointer }?.value
        }) {
        case .success(let params): resolved = params
        case .failure(let missing):
            finish(record, as: .failed, error: .inputMissing(missing))
            return false
        }
        if let reason = Self.exceedsLimits(resolved, maxBytes: configuration.maxResolvedParamsBytes) {
            finish(record, as: .failed, error: .inputTooLarge(reason))
            return false
        }
        do {
            try record.executor.validate(resolved)
        } catch {
            let field = error.field.map { $0.isEmpty ? "params" : "params.\($0)" }
            finish(record, as: .failed, error: TaskError(
                code: "invalid_params", message: "With its inputs resolved: \(field.map { "\($0): " } ?? "")\(error.message)",
                details: field.map { ["field": .string($0)] } ?? [:]))
            return false
        }
        record.resolvedParams = resolved
        return true
    }

    private static func exceedsLimits(_ params: JSONValue, maxBytes: Int) -> String? {
        let size = params.encoded.count
        if size > maxBytes { return "\(size) bytes, more than \(maxBytes)" }
        if depth(of: params) > maxResolvedParamsDepth { return "nested deeper than \(maxResolvedParamsDepth) levels" }
        return nil
    }

    private static func depth(of value: JSONValue) -> Int {
        switch value {
        case .object(let object): 1 + (object.members.map { depth(of: $0.value) }.max() ?? 0)
        case .array(let elements): 1 + (elements.map(depth(of:)).max() ?? 0)
        default: 0
        }
    }

    // MARK: field paths

    /// `location` as the API names fields: `.name` for a member, `[index]` for an element.
    static func field(_ location: JSONPointer, in params: JSONValue) -> String {
        var field = "params"
        var value: JSONValue? = params
        for token in location.tokens {
            if case .array(let elements)? = value, let index = Int(token) {
                field += "[\(token)]"
                value = elements.indices.contains(index) ? elements[index] : nil
            } else {
                field += ".\(token)"
                value = value?.objectValue?[token]
            }
        }
        return field
    }

    /// An executor's field (`argv[1]`, `env.NAME`) as a pointer's tokens.
    static func tokens(ofField field: String) -> [String] {
        var tokens: [String] = []
        var current = ""
        for character in field {
            switch character {
            case ".", "[", "]":
                if !current.isEmpty { tokens.append(current) }
                current = ""
            default:
                current.append(character)
            }
        }
        if !current.isEmpty { tokens.append(current) }
        return tokens
    }
}
