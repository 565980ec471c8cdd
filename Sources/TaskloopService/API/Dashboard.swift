import Crypto
import TaskloopBytes
import TaskloopHTTP

/// The dashboard: plain HTML, CSS and JavaScript modules from Resources/ui, compiled into the
/// binary (SwiftPM `embedInCode`) and served at /ui and /ui/{file}. Every file has a strong
/// ETag (its content's SHA-256) and `Cache-Control: no-cache`: a browser keeps its copy and
/// revalidates it with one 304, so a new build is picked up at once and an old one costs no
/// bytes. The page talks to the server only through the public API, and its Content Security
/// Policy lets it load nothing from anywhere else.
///
/// Threading: immutable after first use; built once, on whichever thread asks first.
enum Dashboard {
    struct File {
        let body: [UInt8]
        let contentType: String
        let etag: String

        init(_ body: [UInt8], _ contentType: String) {
            self.body = body
            self.contentType = contentType
            etag = "\"" + Hex.encode(Array(SHA256.hash(data: body).prefix(16))) + "\""
        }
    }

    static let files: [String: File] = [
        "index.html": File(PackageResources.index_html, "text/html; charset=utf-8"),
        "style.css": File(PackageResources.style_css, "text/css; charset=utf-8"),
        "icon.svg": File(PackageResources.icon_svg, "image/svg+xml"),
        "app.js": File(PackageResources.app_js, "text/javascript; charset=utf-8"),
        "api.js": File(PackageResources.api_js, "text/javascript; charset=utf-8"),
        "dom.js": File(PackageResources.dom_js, "text/javascript; charset=utf-8"),
        "queues.js": File(PackageResources.queues_js, "text/javascript; charset=utf-8"),
        "tasks.js": File(PackageResources.tasks_js, "text/javascript; charset=utf-8"),
        "task.js": File(PackageResources.task_js, "text/javascript; charset=utf-8"),
        "workflow.js": File(PackageResources.workflow_js, "text/javascript; charset=utf-8"),
        "graph.js": File(PackageResources.graph_js, "text/javascript; charset=utf-8"),
        "schedules.js": File(PackageResources.schedules_js, "text/javascript; charset=utf-8"),
    ]

    /// Everything from this origin and nothing else: no inline script or style, no frames.
    static let contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        + "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

    /// The answer for file `name`, or nil when there is no such file: 200 with the file, or
    /// 304 when the request's If-None-Match already names its ETag.
    static func response(for name: String, _ request: HTTPRequest) -> HTTPResponse? {
        guard let file = files[name] else { return nil }
        var headers: HTTPHeaders = [
            "Content-Type": file.contentType,
            "ETag": file.etag,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
        ]
        if name == "index.html" {
            headers.add("Content-Security-Policy", contentSecurityPolicy)
            headers.add("Referrer-Policy", "no-referrer")
        }
        if let condition = request.headers["If-None-Match"], matches(condition, file.etag) {
            return HTTPResponse(status: HTTPStatus(code: 304), headers: headers)
        }
        return HTTPResponse(status: .ok, headers: headers, body: file.body)
    }

    /// RFC 9110 13.1.2: `*`, or a list of entity tags compared weakly (a `W/` prefix ignored).
    static func matches(_ condition: String, _ etag: String) -> Bool {
        condition.split(separator: ",").contains { candidate in
            var tag = candidate.drop { $0 == " " || $0 == "\t" }
            while tag.last == " " || tag.last == "\t" { tag = tag.dropLast() }
            if tag == "*" { return true }
            if tag.hasPrefix("W/") { tag = tag.dropFirst(2) }
            return tag == etag
        }
    }
}
