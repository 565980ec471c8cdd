/// Queues: settings, and the bound on how many exist.
extension Engine {
    /// Changes a queue's limit, pause switch, dispatch, cap per concurrency key or rate limit,
    /// creating the queue if needed, with immediate effect. For `keyConcurrency` and
    /// `rateLimit`, `.some(nil)` lifts the setting and `nil` leaves it as it is.
    @discardableResult
    public func updateQueue(_ name: String, maxConcurrency: Int? = nil, paused: Bool? = nil,
                            dispatch newDispatch: QueueDispatch? = nil,
                            keyConcurrency: Int?? = nil, rateLimit: RateLimit?? = nil) throws(EngineError) -> TaskQueue {
        guard SubmissionValidator.isValidQueueName(name) else {
            throw EngineError(.invalid, SubmissionValidator.queueNameRule, field: "name")
        }
        if let maxConcurrency, !SubmissionValidator.maxConcurrency.contains(Int64(maxConcurrency)) {
            throw EngineError(.invalid, "max_concurrency \(SubmissionValidator.rangeRule(SubmissionValidator.maxConcurrency))",
                              field: "max_concurrency")
        }
        if case .some(.some(let cap)) = keyConcurrency, !SubmissionValidator.keyConcurrency.contains(Int64(cap)) {
            throw EngineError(.invalid, "key_concurrency \(SubmissionValidator.rangeRule(SubmissionValidator.keyConcurrency)) or null",
                              field: "key_concurrency")
        }
        if case .some(let limit?) = rateLimit { try SubmissionValidator.check(limit) }
        if queues[name] == nil {
            try makeRoomForQueues(1, field: "name")
            try checkCell(ofQueue: name, field: "name")
        }
        return settling {
            let queue = queue(named: name)
            if let maxConcurrency { queue.maxConcurrency = maxConcurrency }
            if let paused { queue.paused = paused }
            if case .some(let cap) = keyConcurrency { queue.setKeyConcurrency(cap) }
            if let rateLimit { setRateLimit(rateLimit, of: queue) }
            if let newDispatch, newDispatch != queue.dispatch {
                // Leased tasks keep their leases; queued ones wait for the new dispatcher.
                if newDispatch == .server { dismissLessees(queue) }
                queue.switchDispatch(to: newDispatch)
            }
            emit(.queueChanged(queue))
            needsDispatch(queue)
            dispatch()
            return queue
        }
    }

    /// Makes sure `count` more queues fit under `maxQueues`, forgetting idle ones if need be.
    func makeRoomForQueues(_ count: Int, field: String) throws(EngineError) {
        guard queues.count + count > configuration.maxQueues else { return }
        for queue in Array(queues.values) where isIdle(queue) { forget(queue) }
        guard queues.count + count <= configuration.maxQueues else {
            throw EngineError(.tooManyQueues, "The server already holds \(queues.count) queues (limit \(configuration.maxQueues)).",
                              field: field)
        }
    }

    /// A queue that holds no task and has default settings: forgetting it changes nothing.
    func isIdle(_ queue: TaskQueue) -> Bool {
        queue.counts.total == 0 && !queue.paused && queue.maxConcurrency == configuration.defaultConcurrency
            && queue.dispatch == .server && queue.keyConcurrency == nil && queue.rateBucket == nil && queue.name != "default"
    }

    func forget(_ queue: TaskQueue) {
        queues.removeValue(forKey: queue.name)
        emit(.queueForgotten(queue.name))
        if lastQueue === queue { lastQueue = nil }
    }
}
