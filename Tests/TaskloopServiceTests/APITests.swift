import Foundation
import Testing
import TaskloopTestSupport
@testable import TaskloopService

/// The contract's endpoints end to end: a real service on a real socket.
@Suite(.serialized) struct TaskAPITests {
    @Test func healthzSpecAndUnknownPaths() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        #expect(try client.call("GET", "/healthz").json["status"] as? String == "ok")
        let head = try client.call("HEAD", "/healthz")
        #expect(head.status == 200 && head.body.isEmpty)
        let spec = try client.call("GET", "/openapi.yaml")
        #expect(spec.status == 200 && spec.text.hasPrefix("openapi: 3.1"))
        let missing = try client.call("GET", "/nothing")
        #expect(missing.status == 404 && missing.header("Content-Type") == "application/problem+json")
        let wrongMethod = try client.call("PUT", "/tasks")
        #expect(wrongMethod.status == 405 && wrongMethod.header("Allow")?.contains("POST") == true)
        try service.stop()
    }

    @Test func submitReturnsTheTaskAndItsLocation() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let response = try client.call("POST", "/tasks", json: #"""
            {"kind":"noop","name":"join","priority":3,"queue":"q-1","metadata":{"b":1,"a":[true]},"timeout_ms":500,
             "retry":{"max_attempts":2,"backoff_ms":10,"backoff_factor":1.5}}
            """#)
        #expect(response.status == 201)
        let task = response.json
        let id = try #require(task["id"] as? String)
        #expect(response.header("Location") == "/tasks/\(id)")
        #expect(id.count == 26)
        #expect(task["name"] as? String == "join" && task["priority"] as? Int == 3 && task["queue"] as? String == "q-1")
        #expect(response.text.contains(#""metadata":{"b":1,"a":[true]}"#), "metadata comes back as given")
        #expect(task["max_attempts"] as? Int == 2 && task["timeout_ms"] as? Int == 500)
        let done = try client.waitForState(id, "succeeded")
        #expect((done["progress"] as? [String: Any])?["fraction"] as? Double == 1)
        #expect(done["attempt"] as? Int == 1 && done["started_at"] is String && done["finished_at"] is String)
        for field in ["id", "name", "kind", "params", "queue", "priority", "state", "cancel_requested", "dependencies",
                      "on_dependency_failure", "progress", "attempt", "max_attempts", "timeout_ms", "created_at",
                      "started_at", "finished_at", "result", "error", "metadata", "workflow"] {
            #expect(done.keys.contains(field), "task has \(field)")
        }
        let created = try #require(done["created_at"] as? String)
        #expect(created.count == 24 && created.hasSuffix("Z"), "RFC 3339 with milliseconds: \(created)")
        try service.stop()
    }

    @Test func badSubmissionsAreRefusedAndChangeNothing() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let invalid = try client.call("POST", "/tasks", json: #"{"kind":"sleep","params":{"duration_ms":-1},"priority":9,"extra":1}"#)
        #expect(invalid.status == 422)
        let fields = (invalid.json["errors"] as? [[String: Any]])?.compactMap { $0["field"] as? String } ?? []
        #expect(fields.contains("priority") && fields.contains("extra"), "\(invalid.text)")
        let params = try client.call("POST", "/tasks", json: #"{"kind":"sleep","params":{"duration_ms":-1}}"#)
        #expect(params.status == 422 && params.text.contains(#""field":"params.duration_ms""#), "\(params.text)")
        let unknownKind = try client.call("POST", "/tasks", json: #"{"kind":"teleport"}"#)
        #expect(unknownKind.status == 422 && unknownKind.json["code"] as? String == "unknown_kind")
        let exec = try client.call("POST", "/tasks", json: #"{"kind":"exec","params":{"argv":["true"]}}"#)
        #expect(exec.status == 422 && exec.json["code"] as? String == "exec_not_allowed")
        let malformed = try client.call("POST", "/tasks", json: #"{"kind":"#)
        #expect(malformed.status == 400 && malformed.header("Content-Type") == "application/problem+json")
        #expect(malformed.json["code"] as? String == "malformed_json")
        // A repeated member would be read as either value by different parsers: refused, named.
        let repeated = try client.call("POST", "/tasks", json: #"{"kind":"noop","params":{},"kind":"exec"}"#)
        #expect(repeated.status == 400 && repeated.json["code"] as? String == "malformed_json")
        #expect((repeated.json["detail"] as? String)?.contains(#"duplicate member name "kind""#) == true, "\(repeated.text)")
        let notJSON = try client.call("POST", "/tasks", json: "kind=noop", contentType: "application/x-www-form-urlencoded")
        #expect(notJSON.status == 415)
        let notObject = try client.call("POST", "/tasks", json: "[1]")
        #expect(notObject.status == 422)
        let unknownDependency = try client.call("POST", "/tasks", json: #"{"kind":"noop","dependencies":["01M828BSW3R7M430WYJG0ZMMW5"]}"#)
        #expect(unknownDependency.status == 422 && unknownDependency.text.contains(#""field":"dependencies[0]""#))
        let list = try client.call("GET", "/tasks")
        #expect((list.json["tasks"] as? [Any])?.isEmpty == true, "nothing was created")
        try service.stop()
    }

    /// `null` is accepted exactly where the spec says a field is nullable (and means "not
    /// given"); lengths count characters, as JSON Schema does, not bytes.
    @Test func nullsAndLengthsFollowTheSpec() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        for (body, field) in [(#"{"kind":"noop","queue":null}"#, "queue"), (#"{"kind":"noop","priority":null}"#, "priority"),
                              (#"{"kind":"noop","retry":null}"#, "retry"), (#"{"kind":"noop","dependencies":null}"#, "dependencies"),
                              (#"{"kind":"noop","on_dependency_failure":null}"#, "on_dependency_failure"),
                              (#"{"kind":"noop","retry":{"max_attempts":null}}"#, "retry.max_attempts"),
                              (#"{"kind":"noop","params":{"x":1}}"#, "params.x")] {
            let refused = try client.call("POST", "/tasks", json: body)
            #expect(refused.status == 422 && refused.text.contains(#""field":"\#(field)""#), "\(body): \(refused.text)")
        }
        let nullable = try client.call("POST", "/tasks", json: #"{"kind":"noop","name":null,"timeout_ms":null,"metadata":null}"#)
        #expect(nullable.status == 201, "\(nullable.text)")
        let patched = try client.call("PATCH", "/queues/default", json: #"{"paused":null}"#)
        #expect(patched.status == 422 && patched.text.contains(#""field":"paused""#))
        // 256 characters of four bytes each are 256 characters: within the limit.
        let wide = String(repeating: "\u{1F600}", count: 256)
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop","name":"\#(wide)"}"#).status == 201)
        #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop","name":"\#(wide)x"}"#).status == 422)
        try service.stop()
    }

    @Test func waitHoldsTheAnswerUntilTheTaskEnds() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try #require(try client.submit(#"{"kind":"sleep","params":{"duration_ms":300,"steps":3}}"#)["id"] as? String)
        let started = Date()
        let answer = try client.call("GET", "/tasks/\(id)?wait=20", timeout: 10)
        #expect(answer.json["state"] as? String == "succeeded")
        #expect(Date().timeIntervalSince(started) < 10)
        let immediate = try client.call("GET", "/tasks/\(id)?wait=0")
        #expect(immediate.status == 200)
        let bad = try client.call("GET", "/tasks/\(id)?wait=61")
        #expect(bad.status == 400)
        #expect(try client.call("GET", "/tasks/nope").status == 404)
        try service.stop()
    }

    @Test func waitTimesOutWithTheCurrentState() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try #require(try client.submit(#"{"kind":"external"}"#)["id"] as? String)
        let answer = try client.call("GET", "/tasks/\(id)?wait=0.2")
        #expect(answer.json["state"] as? String == "running")
        try service.stop()
    }

    @Test func cancellingCascadesToDependents() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let root = try #require(try client.submit(#"{"kind":"sleep","params":{"duration_ms":60000}}"#)["id"] as? String)
        let child = try #require(try client.submit(#"{"kind":"noop","dependencies":["\#(root)"]}"#)["id"] as? String)
        let tolerant = try #require(try client.submit(
            #"{"kind":"noop","dependencies":["\#(root)"],"on_dependency_failure":"run"}"#)["id"] as? String)
        #expect(try client.task(child)["state"] as? String == "pending")
        try client.expectCancelled(client.call("DELETE", "/tasks/\(root)"), root)
        let cascaded = try client.waitForState(child, "cancelled")
        let error = try #require(cascaded["error"] as? [String: Any])
        #expect(error["code"] as? String == "dependency_failed" && error["dependency"] as? String == root)
        _ = try client.waitForState(tolerant, "succeeded")
        #expect(try client.call("DELETE", "/tasks/\(root)").status == 409)
        #expect(try client.call("DELETE", "/tasks/01M828BSW3R7M430WYJG0ZMMW5").status == 404)
        let late = try client.call("POST", "/tasks", json: #"{"kind":"noop","dependencies":["\#(root)"]}"#)
        #expect(late.status == 201)
        #expect(try client.waitForState(late.json["id"] as! String, "cancelled")["state"] as? String == "cancelled")
        try service.stop()
    }

    @Test func externalWorkersReportAndLearnOfCancellationByConflict() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try #require(try client.submit(#"{"kind":"external"}"#)["id"] as? String)
        let progress = try client.call("POST", "/tasks/\(id)/progress", json: #"{"fraction":0.5,"message":"half","details":{"n":1}}"#)
        #expect(progress.status == 200)
        #expect((progress.json["progress"] as? [String: Any])?["fraction"] as? Double == 0.5)
        #expect(try client.call("POST", "/tasks/\(id)/progress", json: #"{"fraction":2}"#).status == 422)
        let done = try client.call("POST", "/tasks/\(id)/complete", json: #"{"result":{"rows":3}}"#)
        #expect(done.status == 200 && done.json["state"] as? String == "succeeded")
        #expect((done.json["result"] as? [String: Any])?["rows"] as? Int == 3)
        #expect(try client.call("POST", "/tasks/\(id)/complete").status == 409)

        let failing = try #require(try client.submit(#"{"kind":"external"}"#)["id"] as? String)
        #expect(try client.call("POST", "/tasks/\(failing)/fail", json: #"{"error":{}}"#).status == 422)
        let failed = try client.call("POST", "/tasks/\(failing)/fail", json: #"{"error":{"code":"disk_full","message":"no space"}}"#)
        #expect(failed.json["state"] as? String == "failed")
        #expect((failed.json["error"] as? [String: Any])?["code"] as? String == "disk_full")

        let cancelled = try #require(try client.submit(#"{"kind":"external"}"#)["id"] as? String)
        let request = try client.call("DELETE", "/tasks/\(cancelled)")
        #expect(request.status == 202 && request.json["cancel_requested"] as? Bool == true)
        #expect(try client.call("POST", "/tasks/\(cancelled)/progress", json: #"{"fraction":0.1}"#).status == 409)
        #expect(try client.task(cancelled)["state"] as? String == "cancelled")

        let noop = try #require(try client.submit(#"{"kind":"noop"}"#)["id"] as? String)
        #expect(try client.call("POST", "/tasks/\(noop)/complete").status == 409)
        try service.stop()
    }

    @Test func listingFiltersAndPagesNewestFirst() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        #expect(try client.call("PATCH", "/queues/held", json: #"{"paused":true}"#).status == 200)
        var held: [String] = []
        for _ in 0..<5 { held.append(try client.submit(#"{"kind":"noop","queue":"held"}"#)["id"] as! String) }
        for _ in 0..<3 { _ = try client.submit(#"{"kind":"noop"}"#) }
        var seen: [String] = []
        var cursor: String?
        repeat {
            let page = try client.call("GET", "/tasks?queue=held&limit=2" + (cursor.map { "&after=\($0)" } ?? "")).json
            seen += (page["tasks"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
            cursor = page["next"] as? String
        } while cursor != nil
        #expect(seen == held.reversed())
        let queued = try client.call("GET", "/tasks?state=queued").json["tasks"] as? [[String: Any]]
        #expect(queued?.count == 5)
        let succeeded = try client.call("GET", "/tasks?state=succeeded&limit=1000").json["tasks"] as? [[String: Any]]
        #expect(succeeded?.count == 3)
        #expect(try client.call("GET", "/tasks?state=sleeping").status == 400)
        #expect(try client.call("GET", "/tasks?limit=0").status == 400)
        #expect(try client.call("GET", "/tasks?after=garbage").status == 400)
        #expect((try client.call("GET", "/tasks?queue=none").json["tasks"] as? [Any])?.isEmpty == true)
        try service.stop()
    }

    @Test func metricsCountTasksRequestsAndConnections() throws {
        // One server: each replica counts what it did.
        let service = try ServiceHarness(replicas: 1)
        let client = try service.client()
        _ = try client.submit(#"{"kind":"noop"}"#)
        _ = try client.submit(#"{"kind":"noop","queue":"side"}"#)
        _ = try client.call("POST", "/tasks", json: #"{"kind":"bogus"}"#)
        let metrics = try client.call("GET", "/metrics")
        #expect(metrics.status == 200 && metrics.header("Content-Type")?.hasPrefix("text/plain") == true)
        let text = metrics.text
        for line in [#"taskloop_tasks_submitted_total{kind="noop"} 2"#,
                     #"taskloop_tasks_finished_total{kind="noop",state="succeeded"} 2"#,
                     #"taskloop_tasks{queue="side",state="succeeded"} 1"#,
                     #"taskloop_http_requests_total{route="/tasks",method="POST",status="422"} 1"#,
                     #"taskloop_http_requests_total{route="/tasks",method="POST",status="201"} 2"#,
                     "taskloop_http_open_connections 1",
                     #"taskloop_task_run_seconds_count{kind="noop"} 2"#,
                     #"taskloop_http_request_duration_seconds_count{route="/tasks"} 3"#] {
            #expect(text.contains(line), "metrics show \(line)")
        }
        try service.stop()
    }

    /// swift-prometheus declares a labelled series when it is first used; every family with its
    /// known label values is declared at start, so a fresh server's dashboards show zeros.
    @Test func metricsDeclareEveryFamilyFromTheFirstScrape() throws {
        let service = try ServiceHarness()
        let text = try service.allMetrics()
        for line in [#"taskloop_tasks_submitted_total{kind="sleep"} 0"#,
                     #"taskloop_tasks_finished_total{kind="http",state="failed"} 0"#,
                     #"taskloop_tasks_finished_total{kind="external",state="cancelled"} 0"#,
                     #"taskloop_task_run_seconds_count{kind="noop"} 0"#,
                     #"taskloop_http_requests_total{route="/tasks",method="POST",status="201"} 0"#,
                     #"taskloop_http_requests_total{route="/tasks",method="POST",status="429"} 0"#,
                     #"taskloop_http_requests_total{route="/tasks/{id}",method="DELETE",status="409"} 0"#,
                     #"taskloop_http_request_duration_seconds_count{route="/workflows/{id}"} 0"#,
                     #"taskloop_tasks{queue="default",state="pending"} 0"#,
                     "taskloop_log_lines_dropped_total 0"] {
            #expect(text.contains(line), "metrics show \(line)")
        }
        // Methods outside HTTP's general-purpose ones share one label value.
        let brew = try service.client().call("BREW", "/tasks")
        #expect(brew.status == 501)
        #expect(try service.client().call("GET", "/metrics").text
            .contains(#"taskloop_http_requests_total{route="unmatched",method="OTHER",status="501"} 1"#))
        try service.stop()
    }

    /// On cells each cell's engine has the cap (`--max-queues` bounds what one engine holds).
    @Test(.disabled(if: ServiceHarness.replicaCount > 1, "the cap is per cell on cells"))
    func queuesAreCappedAndForgottenOnesLeaveTheMetrics() throws {
        let service = try ServiceHarness { $0.engine.maxQueues = 2 }
        let client = try service.client()
        #expect(try client.call("PATCH", "/queues/busy", json: #"{"max_concurrency":7}"#).status == 200)
        // default and busy: no room for a third, whether named by PATCH or by a submission.
        let patched = try client.call("PATCH", "/queues/more", json: #"{"paused":true}"#)
        #expect(patched.status == 422 && patched.json["code"] as? String == "too_many_queues")
        let submitted = try client.call("POST", "/tasks", json: #"{"kind":"noop","queue":"more"}"#)
        #expect(submitted.status == 422 && submitted.text.contains(#""field":"queue""#), "\(submitted.text)")
        #expect(try client.call("GET", "/queues/more").status == 404)
        #expect(try client.call("GET", "/metrics").text.contains(#"taskloop_tasks{queue="busy",state="queued"} 0"#))
        // Back to default settings with no task, busy is idle: it is forgotten to make room.
        let defaults = #"{"max_concurrency":\#(ServiceConfiguration().engine.defaultConcurrency)}"#
        #expect(try client.call("PATCH", "/queues/busy", json: defaults).status == 200)
        // Forgotten by the engine that needed the room.
        let first = try APIClient(port: service.port)
        #expect(try first.call("POST", "/tasks", json: #"{"kind":"noop","queue":"more"}"#).status == 201)
        #expect(try first.call("GET", "/queues/busy").status == 404)
        // Through replicas, each replica's metrics follow once it has caught up.
        try pollUntil("busy to leave the metrics and more to count its task") {
            let metrics = try client.call("GET", "/metrics").text
            return !metrics.contains(#"queue="busy""#) && metrics.contains(#"taskloop_tasks{queue="more",state="succeeded"} 1"#)
        }
        try service.stop()
    }

    /// A log reader that does not read (a full pipe) must not slow the loop: lines beyond the
    /// sink's buffer are dropped and counted, and every request is answered meanwhile.
    @Test func aStalledLogReaderNeverBlocksTheServer() throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        defer { close(ends[0]); close(ends[1]) }
        let sink = LogSink(fd: ends[1], capacity: 8_192)
        let service = try ServiceHarness(logHandler: LogFormat.text.makeHandler(label: "test", level: .debug, sink: sink)) {
            $0.logSink = sink
        }
        let client = try service.client()
        // Each request logs lines at debug: far more than the pipe (64 KiB) and the buffer hold.
        for _ in 0..<2_000 { #expect(try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#, timeout: 2).status == 201) }
        #expect(sink.dropped > 0)
        let metrics = try client.call("GET", "/metrics").text
        let counted = metrics.split(separator: "\n").first { $0.hasPrefix("taskloop_log_lines_dropped_total ") }
            .flatMap { Int($0.split(separator: " ")[1]) }
        #expect((counted ?? 0) > 0, "\(String(describing: counted))")
        try service.stop()
        // Once the reader reads again, the writer catches up and says what was lost.
        let reader = FileHandle(fileDescriptor: ends[0], closeOnDealloc: false)
        var text = ""
        try pollUntil("the drop notice") {
            text += String(decoding: reader.availableData, as: UTF8.self)
            return text.contains("log line(s) dropped: the log's reader was too slow.")
        }
        #expect(text.contains(" debug test: POST /tasks 201"))
    }

    @Test func cursorsStayCorrectWhileTasksAreAddedAndEvicted() throws {
        let service = try ServiceHarness { $0.engine.maxRetainedTasks = 8 }
        let client = try service.client()
        for _ in 0..<6 { _ = try client.submit(#"{"kind":"noop"}"#) }
        let first = try client.call("GET", "/tasks?limit=2").json
        let firstIDs = (first["tasks"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        let cursor = try #require(first["next"] as? String)
        // Four more: the two oldest are evicted, the cursor's task stays, newer ones sort above it.
        for _ in 0..<4 { _ = try client.submit(#"{"kind":"noop"}"#) }
        let second = try client.call("GET", "/tasks?limit=10&after=\(cursor)").json
        let secondIDs = (second["tasks"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        #expect(secondIDs.count == 2, "only the two older survivors: \(secondIDs)")
        #expect(secondIDs.allSatisfy { $0 < cursor } && Set(secondIDs).isDisjoint(with: firstIDs))
        #expect(second["next"] is NSNull)
        // Evicting the cursor's own task does not break the next page either.
        for _ in 0..<6 { _ = try client.submit(#"{"kind":"noop"}"#) }
        let third = try client.call("GET", "/tasks?after=\(cursor)")
        #expect(third.status == 200 && (third.json["tasks"] as? [Any])?.isEmpty == true)
        try service.stop()
    }

    @Test func tooManyUnfinishedTasksIs429WithRetryAfter() throws {
        let service = try ServiceHarness { $0.engine.maxUnfinishedTasks = 2 }
        let client = try service.client()
        _ = try client.submit(#"{"kind":"external"}"#)
        _ = try client.submit(#"{"kind":"external"}"#)
        let refused = try client.call("POST", "/tasks", json: #"{"kind":"noop"}"#)
        #expect(refused.status == 429 && refused.header("Retry-After") != nil)
        #expect(refused.json["code"] as? String == "too_many_unfinished_tasks")
        try service.stop()
    }

    @Test func bearerTokenGuardsEverythingButHealthz() throws {
        let service = try ServiceHarness { $0.authToken = "s3cret-0123456789" }
        let client = try service.client()
        #expect(try client.call("GET", "/healthz").status == 200)
        let refused = try client.call("GET", "/tasks")
        #expect(refused.status == 401 && refused.header("WWW-Authenticate") == "Bearer")
        #expect(try client.call("GET", "/openapi.yaml").status == 401)
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearer s3cret-0123456789X"]).status == 401)
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearer s3cret-0123456789"]).status == 200)
        // The scheme is case-insensitive (RFC 9110 section 11.1); the token is not.
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "bearer s3cret-0123456789"]).status == 200)
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "BEARER   s3cret-0123456789"]).status == 200)
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Basic s3cret-0123456789"]).status == 401)
        #expect(try client.call("GET", "/tasks", headers: ["Authorization": "Bearers3cret-0123456789"]).status == 401)
        // Methods implemented nowhere are 501 before anything else, token or not.
        let brew = try client.call("BREW", "/tasks")
        #expect(brew.status == 501 && brew.json["code"] as? String == "not_implemented")
        try service.stop()
    }

    @Test func shutdownAnswersLongPollsAndStopsClean() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let id = try #require(try client.submit(#"{"kind":"sleep","params":{"duration_ms":60000}}"#)["id"] as? String)
        let poller = try service.client()
        let answer = Locked<RawResponse?>(nil)
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            answer.withLock { $0 = try? poller.call("GET", "/tasks/\(id)?wait=60", timeout: 20) }
            done.signal()
        }
        thread.start()
        try pollUntil("the long poll to wait") { service.replicas.contains { $0.onLoop { $0.waiters.count } == 1 } }
        try service.stop()
        #expect(done.wait(timeout: .now() + 20) == .success)
        let state = answer.withLock { $0?.json["state"] as? String }
        // In memory shutdown cancels the work; durable, a deploy is not a failure: the task is
        // still running when the poll is answered, and is queued again for the next start.
        let expected = ServiceHarness.defaultDurability == .memory ? "cancelled" : "running"
        #expect(state == expected, "the poll was answered at shutdown: \(String(describing: state))")
    }
}

@Suite(.serialized) struct WorkflowAndQueueAPITests {
    @Test func workflowsResolveKeysRunInOrderAndCancelTogether() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let response = try client.call("POST", "/workflows", json: #"""
            {"name":"build","tasks":[
              {"key":"fetch","kind":"noop"},
              {"key":"compile","kind":"noop","dependencies":["fetch"]},
              {"key":"wait","kind":"sleep","params":{"duration_ms":60000},"dependencies":["compile"]},
              {"key":"ship","kind":"noop","dependencies":["wait","fetch"]}]}
            """#)
        #expect(response.status == 201, "\(response.text)")
        let workflow = response.json
        let id = try #require(workflow["id"] as? String)
        #expect(response.header("Location") == "/workflows/\(id)")
        let keys = try #require(workflow["keys"] as? [String: String])
        let tasks = try #require(workflow["tasks"] as? [[String: Any]])
        #expect(tasks.count == 4 && Set(keys.keys) == ["fetch", "compile", "wait", "ship"])
        let ship = try #require(tasks.first { $0["id"] as? String == keys["ship"] })
        #expect(ship["dependencies"] as? [String] == [keys["wait"]!, keys["fetch"]!])
        #expect(ship["workflow"] as? String == id)
        _ = try client.waitForState(keys["wait"]!, "running")
        let running = try client.call("GET", "/workflows/\(id)").json
        #expect(running["state"] as? String == "running")
        #expect(((running["progress"] as? [String: Any])?["fraction"] as? Double) == 0.5)
        let listed = try client.call("GET", "/tasks?workflow=\(id)").json["tasks"] as? [[String: Any]]
        #expect(listed?.count == 4)
        let cancelled = try client.call("DELETE", "/workflows/\(id)")
        #expect(cancelled.status == 200)
        _ = try client.waitForState(keys["ship"]!, "cancelled")
        #expect(try client.call("GET", "/workflows/\(id)").json["state"] as? String == "cancelled")
        #expect(try client.call("GET", "/workflows/\(keys["fetch"]!)").status == 404)
        try service.stop()
    }

    @Test func badWorkflowsAreRefusedWhole() throws {
        let service = try ServiceHarness()
        let client = try service.client()
        let cycle = try client.call("POST", "/workflows", json: #"""
            {"tasks":[{"key":"a","kind":"noop","dependencies":["c"]},{"key":"b","kind":"noop","dependencies":["a"]},
                      {"key":"c","kind":"noop","dependencies":["b"]}]}
            """#)
        #expect(cycle.status == 422 && cycle.json["code"] as? String == "cycle")
        #expect(Set(cycle.json["keys"] as? [String] ?? []) == ["a", "b", "c"])
        let unknown = try client.call("POST", "/workflows", json: #"{"tasks":[{"key":"a","kind":"noop","dependencies":["zzz"]}]}"#)
        #expect(unknown.status == 422 && unknown.text.contains(#""field":"tasks[0].dependencies[0]""#))
        let twice = try client.call("POST", "/workflows", json: #"{"tasks":[{"key":"a","kind":"noop"},{"key":"a","kind":"noop"}]}"#)
        #expect(twice.status == 422)
        let keyless = try client.call("POST", "/workflows", json: #"{"tasks":[{"kind":"noop"}]}"#)
        #expect(keyless.status == 422 && keyless.text.contains("tasks[0].key"))
        #expect(try client.call("POST", "/workflows", json: #"{"tasks":[]}"#).status == 422)
        #expect((try client.call("GET", "/tasks").json["tasks"] as? [Any])?.isEmpty == true)
        try service.stop()
    }

    @Test func queuesAreCreatedChangedAndCancelled() throws {
        let service = try ServiceHarness { $0.engine.defaultConcurrency = 3 }
        let client = try service.client()
        let queues = try client.call("GET", "/queues").json["queues"] as? [[String: Any]]
        #expect(queues?.map { $0["name"] as? String } == ["default"])
        #expect(try client.call("GET", "/queues/ingest").status == 404)
        let created = try client.call("PATCH", "/queues/ingest", json: #"{"max_concurrency":1,"paused":true}"#)
        #expect(created.status == 200 && created.json["max_concurrency"] as? Int == 1 && created.json["paused"] as? Bool == true)
        #expect(try client.call("PATCH", "/queues/ingest", json: #"{"max_concurrency":0}"#).status == 422)
        #expect(try client.call("PATCH", "/queues/bad%20name", json: #"{"paused":false}"#).status == 422)
        for _ in 0..<3 { _ = try client.submit(#"{"kind":"noop","queue":"ingest"}"#) }
        let counts = try client.call("GET", "/queues/ingest").json["counts"] as? [String: Int]
        #expect(counts?["queued"] == 3)
        let cancelled = try client.call("POST", "/queues/ingest/cancel")
        #expect(cancelled.json["cancelled"] as? Int == 3)
        #expect((try client.call("GET", "/queues/ingest").json["counts"] as? [String: Int])?["cancelled"] == 3)
        let fresh = try client.submit(#"{"kind":"noop","queue":"fresh"}"#)
        #expect(fresh["queue"] as? String == "fresh")
        #expect(try client.call("GET", "/queues/fresh").json["max_concurrency"] as? Int == 3)
        try service.stop()
    }

    @Test func tenThousandSubmissionsFromSeveralConnectionsAllFinish() throws {
        let service = try ServiceHarness()
        let connections = 8, each = 1_250
        let failures = Locked(0)
        let group = DispatchGroup()
        for _ in 0..<connections {
            group.enter()
            Thread {
                defer { group.leave() }
                guard let client = try? service.client() else { return failures.withLock { $0 += 1 } }
                for _ in 0..<each {
                    let response = try? client.call("POST", "/tasks", json: #"{"kind":"noop"}"#)
                    if response?.status != 201 { failures.withLock { $0 += 1 } }
                }
            }.start()
        }
        #expect(group.wait(timeout: .now() + 120) == .success)
        #expect(failures.withLock { $0 } == 0)
        let counts = try service.client().call("GET", "/queues/default").json["counts"] as? [String: Int]
        #expect(counts?["succeeded"] == connections * each)
        try service.stop()
    }
}
