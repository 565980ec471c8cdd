import TaskloopEngine
import TaskloopHTTP
import TaskloopJSON

/// Lease calls (`POST /queues/{name}/lease`), held with `wait_s` until the engine grants them
/// tasks. Like `TaskWaiters`, a waiting call is a reply, a timer entry and its place in the
/// queue's line (`LeaseRequest`): no thread, no handle, memory only. It is answered once: with
/// tasks as soon as the engine leases it some, with none when its time is up, when its client
/// ends its side of the connection, or at shutdown; a client that hangs up leaves the line, and
/// tasks leased to a call whose client has just gone are released at once instead of waiting
/// for their leases to expire.
///
/// Threading: loop thread only.
final class LeaseCalls {
    private final class Call {
        let reply: Reply
        let started: UInt64
        var request: LeaseRequest?
        var timer: ScheduledAction?

        init(reply: Reply, started: UInt64) {
            self.reply = reply
            self.started = started
        }
    }

    struct Terms {
        var worker: String
        var kinds: Set<String>?
        var maxTasks = 1
        var milliseconds: UInt64 = 30_000
        var waitMilliseconds: UInt64 = 0
    }

    private var waiting: [ObjectIdentifier: Call] = [:]
    private let scheduler: EngineScheduler
    private let metrics: () -> ServiceMetrics

    init(scheduler: EngineScheduler, metrics: @escaping () -> ServiceMetrics) {
        self.scheduler = scheduler
        self.metrics = metrics
    }

    /// Lease calls waiting now.
    var count: Int { waiting.count }

    func lease(from queue: String, _ terms: Terms, reply: Reply) throws(EngineError) {
        let call = Call(reply: reply, started: TaskloopApplication.monotonicNanoseconds())
        let request = LeaseRequest(worker: terms.worker, kinds: terms.kinds, maxTasks: terms.maxTasks,
                                   milliseconds: terms.milliseconds) { [weak self, unowned call] tasks in
            self?.answer(call, with: tasks)
        }
        let tasks = try reply.engine.lease(request, from: queue, waiting: terms.waitMilliseconds > 0)
        guard tasks.isEmpty && terms.waitMilliseconds > 0 else { return answer(call, with: tasks) }
        let key = ObjectIdentifier(call)
        call.request = request
        waiting[key] = call
        call.timer = scheduler.schedule(after: terms.waitMilliseconds) { [weak self] in self?.giveUp(key, answering: true) }
        reply.onClose { [weak self] in self?.giveUp(key, answering: false) }
        // A worker that stops or dies while its call waits ends its side of the connection:
        // the call is answered (with nothing) at once, so no task is leased to nobody.
        reply.onPeerEnded { [weak self] in self?.giveUp(key, answering: true) }
    }

    /// Answers every waiting call with no tasks (shutdown).
    func answerAll() {
        for key in Array(waiting.keys) { giveUp(key, answering: true) }
    }

    private func answer(_ call: Call, with tasks: [TaskRecord]) {
        waiting.removeValue(forKey: ObjectIdentifier(call))
        call.timer?.cancel()
        guard call.reply.responder.isOpen else {
            for task in tasks { _ = try? call.reply.engine.release(task.id, token: task.lease?.token) }
            return
        }
        if !tasks.isEmpty {
            metrics().leaseAnswered(seconds: Double(TaskloopApplication.monotonicNanoseconds() - call.started) / 1e9)
        }
        var json = JSONWriter(capacity: 1_024 * (tasks.count + 1))
        json.beginObject()
        json.key(static: "tasks")
        json.beginArray()
        for task in tasks { Representation.write(task, into: &json, forLessee: true, workflow: call.reply.engine.workflowID(of: task)) }
        json.endArray()
        json.endObject()
        call.reply.send(.json(.ok, json.bytes))
    }

    private func giveUp(_ key: ObjectIdentifier, answering: Bool) {
        guard let call = waiting.removeValue(forKey: key) else { return }
        call.timer?.cancel()
        if let request = call.request { call.reply.engine.withdraw(request) }
        if answering { answer(call, with: []) }
    }
}
