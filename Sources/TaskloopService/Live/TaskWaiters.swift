import TaskloopEngine
import TaskloopHTTP

/// Long polls (`GET /tasks/{id}?wait=S`) waiting for their task to finish. A waiter is a
/// reply and a timer entry in the loop's timer queue: no thread and no handle of its own, so
/// thousands of waiters cost only memory. It is answered once: when its task becomes terminal,
/// when its time is up, or at shutdown; a client that hangs up is forgotten.
///
/// Threading: loop thread only.
final class TaskWaiters {
    private struct Waiter {
        let token: Int
        let reply: Reply
        let timer: ScheduledAction
    }

    private var waiting: [TaskID: [Waiter]] = [:]
    private var nextToken = 0
    private let scheduler: EngineScheduler
    /// Renders the task's current state; nil if it is gone.
    private let answer: (TaskID) -> HTTPResponse

    init(scheduler: EngineScheduler, answer: @escaping (TaskID) -> HTTPResponse) {
        self.scheduler = scheduler
        self.answer = answer
    }

    var count: Int { waiting.values.reduce(0) { $0 + $1.count } }

    func wait(for id: TaskID, reply: Reply, milliseconds: UInt64) {
        nextToken += 1
        let token = nextToken
        let timer = scheduler.schedule(after: milliseconds) { [weak self] in
            self?.answer(id, token: token)
        }
        waiting[id, default: []].append(Waiter(token: token, reply: reply, timer: timer))
        reply.onClose { [weak self] in
            self?.forget(id, token: token)
        }
    }

    /// Answers everyone waiting on `id`.
    func finished(_ id: TaskID) {
        guard !waiting.isEmpty, let waiters = waiting.removeValue(forKey: id) else { return }
        let response = answer(id)
        for waiter in waiters {
            waiter.timer.cancel()
            waiter.reply.send(response)
        }
    }

    /// Answers every waiter with its task as it is now (shutdown).
    func answerAll() {
        for id in Array(waiting.keys) { finished(id) }
    }

    private func answer(_ id: TaskID, token: Int) {
        guard let waiter = remove(id, token: token) else { return }
        waiter.reply.send(answer(id))
    }

    private func forget(_ id: TaskID, token: Int) {
        remove(id, token: token)?.timer.cancel()
    }

    @discardableResult
    private func remove(_ id: TaskID, token: Int) -> Waiter? {
        guard var waiters = waiting[id], let index = waiters.firstIndex(where: { $0.token == token }) else { return nil }
        let waiter = waiters.remove(at: index)
        waiting[id] = waiters.isEmpty ? nil : waiters
        return waiter
    }
}
