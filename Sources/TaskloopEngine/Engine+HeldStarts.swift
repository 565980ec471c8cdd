/// Work starts only after the commit that started it (`EngineConfiguration.startsAfterCommit`).
///
/// A start with effects (`TaskExecutor.startHasEffects`) is made as any other: the task is
/// `running`, its timers run, its events go out with its batch. Only the executor's `start`
/// waits. The journal marks what is held when it takes a batch (`markHeldStarts`); once that
/// batch is durable it releases the starts up to the mark, in the order they were made. When
/// a batch cannot commit and the journal starts over from what the store holds (several
/// replicas), it drops them: the store's state replaces those attempts. A journal that writes
/// a failed batch again later (SQLite) keeps them until a later batch commits.
///
/// What happened to an attempt while it waited decides its release: an attempt no longer
/// current (timed out, suspended, taken over, replaced) is not started; one whose task was
/// asked to cancel is confirmed cancelled at once, since nothing of it ran.

/// The starts held up to some moment: what a batch taken then may release.
public struct HeldStartsMark: Comparable, Sendable {
    let count: UInt64

    public static func < (lhs: HeldStartsMark, rhs: HeldStartsMark) -> Bool { lhs.count < rhs.count }
}

extension Engine {
    func hold(_ run: TaskRun) {
        heldStarts.append(run)
        startsHeld += 1
    }

    /// Attempts made and not yet started.
    public var heldStartCount: Int { heldStarts.count }

    /// What is held now: a batch taken now holds the changes that made these attempts.
    public func markHeldStarts() -> HeldStartsMark {
        HeldStartsMark(count: startsHeld)
    }

    /// Starts, in order, the attempts held up to `mark` (their batch is durable).
    public func releaseStarts(through mark: HeldStartsMark) {
        guard startsTaken < mark.count else { return }
        settling {
            while startsTaken < mark.count, let run = heldStarts.popFirst() {
                startsTaken += 1
                guard run.isCurrent else { continue }
                if run.stopRequested {
                    run.cancelled()
                } else {
                    run.record.executor.start(run)
                }
            }
        }
    }

    /// Forgets every held start: their batches will not commit, and the store's state replaces
    /// the attempts.
    public func dropHeldStarts() {
        startsTaken += UInt64(heldStarts.count)
        heldStarts.removeAll()
    }
}
