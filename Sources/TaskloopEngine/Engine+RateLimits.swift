/// Rate limits: a queue's token bucket (`TokenBucket`) gates every start, the server's and a
/// worker's lease alike. A queue without one pays a nil check in dispatch and in leasing.
///
/// With no token left and tasks ready to start, the queue's dispatch stops and one timer per
/// queue wakes it when the next token is due; held lease calls wait for it the same way.
/// Setting a limit gives a full bucket (`burst` tokens) at once, and so does a restart or a
/// cell's move to another replica: the fill level is not kept, the limit is.
///
/// `TaskQueue.delayedByRateLimit` counts the starts and leases made while the queue was
/// throttled: from the moment its dispatch (or a lease call) found tasks ready and room to
/// start them but no token, until a dispatch of it stops for another reason (nothing ready, no
/// room, paused, a lease call served in full) or, on a worker queue, a token comes due with no
/// lease call waiting. So each task that had to wait for a token counts once, when it starts;
/// the burst that emptied the bucket does not count, nor do tasks a removed limit released.
extension Engine {
    /// Sets or removes (`nil`) the rate limit of `queue`, with a full bucket.
    func setRateLimit(_ limit: RateLimit?, of queue: TaskQueue) {
        queue.rateBucket?.wake?.cancel()
        queue.rateBucket = limit.map { TokenBucket($0, now: scheduler.now) }
    }

    /// Dispatch of a server queue with a rate limit: starts queued tasks while it has room and
    /// tokens.
    func startRateLimited(_ queue: TaskQueue, _ bucket: TokenBucket) {
        let now = scheduler.now
        while !queue.paused && queue.running < queue.maxConcurrency && queue.counts[.queued] > 0 {
            guard bucket.hasToken(at: now) else { return waitForToken(queue, bucket) }
            guard let record = queue.popForServer() else { break }
            if start(record) { tookToken(queue, bucket, at: now) }
        }
        bucket.throttled = false
    }

    /// The queue's tasks start, or are leased, once a token is due.
    func waitForToken(_ queue: TaskQueue, _ bucket: TokenBucket) {
        bucket.throttled = true
        guard bucket.wake == nil else { return }
        bucket.wake = scheduler.schedule(after: bucket.millisecondsUntilToken(at: scheduler.now)) { [link, queue, bucket] in
            bucket.wake = nil
            guard let engine = link.engine, queue.rateBucket === bucket else { return }
            engine.settling {
                // Tokens due with no lease call waiting pile up unused: the rate holds nothing back.
                if queue.dispatch == .workers && queue.waitingLessees == 0 { bucket.throttled = false }
                engine.needsDispatch(queue)
                engine.dispatch()
            }
        }
    }

    func tookToken(_ queue: TaskQueue, _ bucket: TokenBucket, at now: UInt64) {
        bucket.take(at: now)
        if bucket.throttled { queue.delayedByRateLimit += 1 }
    }
}
