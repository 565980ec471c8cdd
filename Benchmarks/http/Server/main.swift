// The HTTP benchmark's server: TaskloopHTTP with two routes shaped like the service's hottest
// calls. GET /task answers ~300 bytes of JSON; POST /tasks parses and checks a ~150-byte JSON
// submission and answers 201 with ~300 bytes of JSON. Prints `listening on http://HOST:PORT`.
import Glibc
import TaskloopHTTP
import TaskloopLoop
import TaskloopJSON

struct Submission {
    var kind: String
    var params: JSONValue
    var queue: String
    var priority: Int64
    var name: String?
    var dependencies: [String]

    init(_ body: [UInt8]) throws(HTTPProblem) {
        let document: JSONValue
        do {
            document = try JSONParser.parse(body)
        } catch {
            throw HTTPProblem(.badRequest, detail: "The body is not JSON: \(error).")
        }
        guard let object = document.objectValue else { throw HTTPProblem(.unprocessableContent, detail: "Expected an object.") }
        guard let kind = object["kind"]?.stringValue else { throw HTTPProblem(.unprocessableContent, detail: "kind is required.") }
        self.kind = kind
        params = object["params"] ?? [:]
        queue = object["queue"]?.stringValue ?? "default"
        priority = object["priority"]?.intValue ?? 0
        name = object["name"]?.stringValue
        dependencies = object["dependencies"]?.arrayValue?.compactMap(\.stringValue) ?? []
    }
}

func taskJSON(id: String, name: String?, kind: String, params: JSONValue, queue: String, priority: Int64,
              state: String, dependencies: [String]) -> [UInt8] {
    var json = JSONWriter(capacity: 320)
    json.beginObject()
    json.field("id", id)
    json.field("name", name)
    json.field("kind", kind)
    json.field("params", params)
    json.field("queue", queue)
    json.key(static: "priority")
    json.int(priority)
    json.field("state", state)
    json.field("cancel_requested", false)
    json.key(static: "dependencies")
    json.beginArray()
    for dependency in dependencies { json.string(dependency) }
    json.endArray()
    json.field("attempt", 1)
    json.field("created_at", "2026-11-22T14:50:00.000Z")
    json.endObject()
    return json.bytes
}

let cachedTask = taskJSON(
    id: "01JD3V8Q4W6F6M2K9T7B5R3N1X", name: "resize-images", kind: "sleep",
    params: ["duration_ms": 1500, "steps": 10], queue: "default", priority: 0, state: "running",
    dependencies: ["01JD3V8Q4W6F6M2K9T7B5R3N1A"])
var counter = 0

var router = Router<HTTPHandler>()
router.add(.GET, "/task") { _, responder in
    responder.respond(.json(.ok, cachedTask))
}
router.add(.POST, "/tasks") { request, responder in
    let submission = try Submission(request.body)
    counter += 1
    let id = "01JD3V8Q4W6F6M2K\(counter)"
    let body = taskJSON(
        id: id, name: submission.name, kind: submission.kind, params: submission.params, queue: submission.queue,
        priority: submission.priority, state: "queued", dependencies: submission.dependencies)
    responder.respond(.json(.created, body, headers: ["Location": "/tasks/\(id)"]))
}

var configuration = HTTPServerConfiguration()
configuration.host = getenv("BENCH_HOST").map { String(cString: $0) } ?? "127.0.0.1"
configuration.port = getenv("BENCH_PORT").flatMap { Int(String(cString: $0)) } ?? 0
let loop = try EventLoop()
let server = HTTPServer(loop: loop, configuration: configuration) { request, responder in
    router.handle(request, responder)
}
let address = try server.start()
print("listening on http://\(address)")
fflush(nil)
var stopWatcher: SignalWatcher?
stopWatcher = try SignalWatcher(loop: loop, signal: SIGTERM) {
    stopWatcher?.close()
    server.shutdown(gracePeriodMilliseconds: 1_000) { loop.finish() }
}
try loop.run()
