import Glibc
/// Routes as plain data: a method and a path pattern map to a handler. A pattern is literal
/// segments and `{name}` segments (`/tasks/{id}/cancel`). Literal segments win over parameters.
/// Matching decodes each segment on its own, so `%2F` inside a parameter stays part of it.
///
/// The generic part is only the handler array; matching runs in the non-generic `RouteTable`,
/// which the compiler optimises fully even when the router is used from another module
/// (generic code across modules runs unspecialised, through metadata at every step).
public struct Router<Handler> {
    private var table = RouteTable()
    private var handlers: [Handler] = []

    public init() {}

    public enum Match {
        case found(Handler, parameters: PathParameters, pattern: String)
        /// The path exists but not for this method; `allowed` is what the `Allow` header lists.
        case methodNotAllowed(allowed: [HTTPMethod])
        case notFound
    }

    public mutating func add(_ method: HTTPMethod, _ pattern: String, _ handler: Handler) {
        table.add(method, pattern, handler: handlers.count)
        handlers.append(handler)
    }

    /// Finds the handler for `method` on `rawPath` (still percent-encoded). Returns nil when a
    /// segment has a malformed escape.
    public func match(_ method: HTTPMethod, rawPath: String) -> Match? {
        switch table.match(method, rawPath: rawPath) {
        case nil: nil
        case .found(let handler, let parameters, let pattern): .found(handlers[handler], parameters: parameters, pattern: pattern)
        case .methodNotAllowed(let allowed): .methodNotAllowed(allowed: allowed)
        case .notFound: .notFound
        }
    }
}

/// The path trie behind `Router`: handlers are indexes.
struct RouteTable {
    private struct Route {
        var method: HTTPMethod
        var pattern: String
        var handler: Int
    }

    private struct Node {
        /// Literal children. A node has a handful, and comparing short strings beats hashing them.
        var literals: [Literal] = []
        var parameter: (name: String, child: Int)?
        var routes: [Route] = []
    }

    private struct Literal {
        /// The segment as it must read once percent-decoded.
        var bytes: [UInt8]
        var child: Int
    }

    private var nodes: [Node] = [Node()]

    enum Match {
        case found(Int, parameters: PathParameters, pattern: String)
        case methodNotAllowed(allowed: [HTTPMethod])
        case notFound
    }

    mutating func add(_ method: HTTPMethod, _ pattern: String, handler: Int) {
        precondition(pattern.hasPrefix("/"), "route pattern must start with /: \(pattern)")
        var current = 0
        for segment in pattern.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            if segment.hasPrefix("{") && segment.hasSuffix("}") && segment.count > 2 {
                let name = String(segment.dropFirst().dropLast())
                if let existing = nodes[current].parameter {
                    precondition(existing.name == name, "conflicting parameter names at \(pattern)")
                    current = existing.child
                } else {
                    nodes.append(Node())
                    nodes[current].parameter = (name, nodes.count - 1)
                    current = nodes.count - 1
                }
            } else if let literal = nodes[current].literals.first(where: { $0.bytes.elementsEqual(segment.utf8) }) {
                current = literal.child
            } else {
                nodes.append(Node())
                nodes[current].literals.append(Literal(bytes: Array(segment.utf8), child: nodes.count - 1))
                current = nodes.count - 1
            }
        }
        precondition(!nodes[current].routes.contains { $0.method == method }, "duplicate route \(method) \(pattern)")
        nodes[current].routes.append(Route(method: method, pattern: pattern, handler: handler))
    }

    /// Walks the trie over the path's bytes, segment by segment, without building strings:
    /// only a parameter's value becomes one. Nil when a segment has a malformed escape.
    func match(_ method: HTTPMethod, rawPath: String) -> Match? {
        var rawPath = rawPath
        return rawPath.withUTF8 { path -> Match? in
            if path.contains(UInt8(ascii: "%")) && !Self.hasWellFormedEscapes(path) { return nil }
            var parameters = PathParameters()
            let start = path.first == UInt8(ascii: "/") ? 1 : 0
            guard let node = find(path, from: start, node: 0, parameters: &parameters) else { return .notFound }
            let routes = nodes[node].routes
            if let route = routes.first(where: { $0.method == method })
                ?? (method == .HEAD ? routes.first(where: { $0.method == .GET }) : nil) {
                return .found(route.handler, parameters: parameters, pattern: route.pattern)
            }
            var allowed = routes.map(\.method)
            if allowed.contains(.GET) && !allowed.contains(.HEAD) { allowed.append(.HEAD) }
            return .methodNotAllowed(allowed: allowed)
        }
    }

    /// Every segment decodes (each `%` starts two hex digits, and the result is UTF-8).
    private static func hasWellFormedEscapes(_ path: UnsafeBufferPointer<UInt8>) -> Bool {
        var start = 0
        while start <= path.count {
            var end = start
            while end < path.count && path[end] != UInt8(ascii: "/") { end += 1 }
            guard percentDecode(UnsafeBufferPointer(rebasing: path[start..<end]), plusIsSpace: false) != nil else { return false }
            start = end + 1
        }
        return true
    }

    /// The node reached by the segment starting at `start` and those after it, or nil.
    /// Literals are tried before the parameter, backtracking when a branch leads nowhere.
    private func find(_ path: UnsafeBufferPointer<UInt8>, from start: Int, node: Int, parameters: inout PathParameters) -> Int? {
        var end = start
        while end < path.count && path[end] != UInt8(ascii: "/") { end += 1 }
        let segment = UnsafeBufferPointer(rebasing: path[start..<end])
        let isLast = end >= path.count
        func descend(_ child: Int) -> Int? {
            if isLast { return nodes[child].routes.isEmpty ? nil : child }
            return find(path, from: end + 1, node: child, parameters: &parameters)
        }
        for literal in nodes[node].literals where Self.segment(segment, reads: literal.bytes) {
            if let found = descend(literal.child) { return found }
        }
        if let (name, child) = nodes[node].parameter, !segment.isEmpty,
           let value = percentDecode(segment, plusIsSpace: false) {
            parameters.append(name, value)
            if let found = descend(child) { return found }
            parameters.removeLast()
        }
        return nil
    }

    private static func segment(_ raw: UnsafeBufferPointer<UInt8>, reads literal: [UInt8]) -> Bool {
        if !raw.contains(UInt8(ascii: "%")) {
            return raw.count == literal.count
                && (raw.isEmpty || literal.withUnsafeBufferPointer { memcmp($0.baseAddress!, raw.baseAddress!, raw.count) == 0 })
        }
        return percentDecode(raw, plusIsSpace: false).map { $0.utf8.elementsEqual(literal) } ?? false
    }
}

/// What a route runs: it answers through the responder, now or later (on the loop thread), and
/// may throw an `HTTPResponseError` instead.
public typealias HTTPHandler = (HTTPRequest, HTTPResponder) throws -> Void

extension Router {
    /// The problem answer for a request no route takes: 501 for a method that is not one of
    /// HTTP's general-purpose ones (implemented nowhere, RFC 9110 section 9.1), 400 for a
    /// malformed percent-encoding, 404, or 405 with `Allow`. Nil when `match` found a route.
    public static func problem(for match: Match?, _ request: HTTPRequest) -> HTTPProblem? {
        if case .found = match { return nil }
        if !request.method.isGeneralPurpose { return notImplemented(request.method) }
        switch match {
        case nil:
            return HTTPProblem(.badRequest, detail: "The path has a malformed percent-encoding.")
        case .notFound:
            return HTTPProblem(.notFound, detail: "No resource at \(request.path).")
        case .methodNotAllowed(let allowed):
            return HTTPProblem(.methodNotAllowed, detail: "\(request.method) is not allowed on \(request.path).",
                               headers: ["Allow": allowed.map(\.description).joined(separator: ", ")])
        case .found:
            return nil
        }
    }

    /// 501 for a method this server implements on no resource.
    public static func notImplemented(_ method: HTTPMethod) -> HTTPProblem {
        HTTPProblem(.notImplemented, detail: "The method \(method) is not implemented by this server.")
    }
}

extension Router where Handler == HTTPHandler {
    /// Dispatches a request: 404 and 405 (with `Allow`) as problem responses, path parameters
    /// filled in, and thrown errors turned into their responses (anything unknown is a 500).
    public func handle(_ request: HTTPRequest, _ responder: HTTPResponder) {
        let match = match(request.method, rawPath: request.rawPath)
        guard case .found(let handler, let parameters, _) = match else {
            return responder.respond(Self.problem(for: match, request)!.response())
        }
        var request = request
        request.parameters = parameters
        do {
            try handler(request, responder)
        } catch {
            responder.respond(errorResponse(for: error))
        }
    }
}
