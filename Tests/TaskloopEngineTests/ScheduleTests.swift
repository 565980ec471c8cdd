import Synchronization
import Testing
import TaskloopJSON
import TaskloopTime
@testable import TaskloopEngine

/// Schedules (cron) on the virtual clock: slots fire at their times across DST changes, catch-up
/// after a restart, pauses, overlap, jitter, bounds, triggers, deletion, clock jumps, and a
/// restore that never fires a slot twice.
@Suite struct ScheduleTests {
    /// An engine whose runs (the schedule marks of the tasks it makes) are recorded in order.
    final class Harness {
        let h: EngineHarness
        let manual: ManualExecutor
        var runs: [ScheduleSlot] = []
        var scheduleEvents = 0

        init(at origin: String, manual: ManualExecutor = ManualExecutor(),
             configure: (inout EngineConfiguration) -> Void = { _ in }) {
            self.manual = manual
            h = EngineHarness(configure: { configuration in
                // Days pass in these tests: the wall clock is not moved by hand, so a long check suffices.
                configuration.wallClockCheckMilliseconds = 3_600_000
                configure(&configuration)
            }, extra: ["manual": manual], clock: VirtualScheduler(wallClockOrigin: RFC3339.milliseconds(origin)!))
            observe()
        }

        private init(restoring original: Harness, later: Int64, manual: ManualExecutor) throws {
            self.manual = manual
            h = EngineHarness(configure: { $0.wallClockCheckMilliseconds = 3_600_000 }, extra: ["manual": manual],
                              clock: VirtualScheduler(wallClockOrigin: original.h.clock.wallClock + later))
            runs = original.runs
            observe()
            let saved = RestoreTests.saved(original.h.engine)
            try h.engine.restore(queues: saved.queues, workflows: saved.workflows, tasks: saved.tasks,
                                 schedules: original.h.engine.allSchedules.map { original.h.engine.snapshot(of: $0) })
        }

        private func observe() {
            h.engine.addObserver { [unowned self] settled in
                for event in settled {
                    switch event {
                    case .submitted(let record): if let mark = record.schedule { runs.append(mark) }
                    case .scheduleChanged, .scheduleDeleted: scheduleEvents += 1
                    default: break
                    }
                }
            }
        }

        /// A new engine restored from what a store would hold of this one, `later` ms of wall time on.
        func restored(later: Int64, manual: ManualExecutor = ManualExecutor()) throws -> Harness {
            try Harness(restoring: self, later: later, manual: manual)
        }

        var engine: Engine { h.engine }

        func create(_ cron: String, zone: String = "UTC", kind: String = "noop", overlap: ScheduleOverlap = .allow,
                    catchup: ScheduleCatchup = .none, maxCatchup: Int = 10, jitter: UInt64 = 0,
                    startAt: String? = nil, endAt: String? = nil) throws -> ScheduleRecord {
            // As the service does before a request reaches the engine (off its loop).
            _ = try engine.configuration.zones.load(named: zone)
            return try engine.createSchedule(ScheduleSpec(
                name: "every \(cron)", cron: cron, timezone: zone, template: .task(TaskSpec(kind: kind, name: "run")),
                overlap: overlap, catchup: catchup, maxCatchup: maxCatchup, jitterMilliseconds: jitter,
                startAt: startAt.map { RFC3339.milliseconds($0)! }, endAt: endAt.map { RFC3339.milliseconds($0)! }))
        }

        func advance(by milliseconds: UInt64) { h.clock.advance(by: milliseconds) }

        /// The slots that ran, as RFC 3339 UTC times.
        var ranAt: [String] { runs.map { Self.text($0.slot) } }

        /// `2026-01-01T00:01:00Z` (whole seconds, UTC), for readable expectations.
        static func text(_ milliseconds: Int64) -> String {
            let seconds = milliseconds / 1000
            let days = seconds / 86_400, second = seconds % 86_400
            let (year, month, day) = CivilTime.date(days: days)
            func two(_ value: Int64) -> String { value < 10 ? "0\(value)" : "\(value)" }
            return "\(year)-\(two(month))-\(two(day))T\(two(second / 3600)):\(two(second / 60 % 60)):\(two(second % 60))Z"
        }
    }

    static func ms(_ text: String) -> Int64 { RFC3339.milliseconds(text)! }

    @Test func eachSlotFiresAtItsTimeAndOnlyThen() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *")
        #expect(s.engine.nextRuns(of: schedule).map(Harness.text) == [
            "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z", "2026-01-01T00:04:00Z", "2026-01-01T00:05:00Z",
        ])
        s.advance(by: 29_999)
        #expect(s.runs.isEmpty)
        s.advance(by: 1)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z"])
        #expect(s.runs[0].id == schedule.id)
        #expect(schedule.lastSlot == Self.ms("2026-01-01T00:01:00Z"))
        let run = try #require(schedule.lastRuns.last)
        #expect(run.slot == Self.ms("2026-01-01T00:01:00Z") && run.at == run.slot)
        let task = try #require(run.target.id.flatMap { s.engine.task($0) })
        #expect(task.schedule == ScheduleSlot(id: schedule.id, slot: run.slot))
        #expect(s.engine.state(of: run) == "succeeded")
        s.advance(by: 180_000)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z", "2026-01-01T00:04:00Z"])
        #expect(schedule.firedCount == 4 && s.engine.scheduleTotals.fired == 4 && schedule.missedCount == 0)
    }

    /// 02:30 on the night New York jumps from 02:00 to 03:00 runs at 03:00; 01:30 on the night
    /// it passes twice runs once, at the first.
    @Test func newYorkGapRunsAtItsEndAndARepeatedTimeRunsOnce() throws {
        let gap = Harness(at: "2026-03-07T17:00:00Z")
        let daily = try gap.create("30 2 * * *", zone: "America/New_York")
        #expect(gap.engine.nextRuns(of: daily, count: 2).map(Harness.text) == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"])
        gap.advance(by: 2 * 86_400_000)
        #expect(gap.ranAt == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"])

        let repeated = Harness(at: "2026-10-31T12:00:00Z")
        _ = try repeated.create("30 1 * * *", zone: "America/New_York")
        repeated.advance(by: 2 * 86_400_000)
        #expect(repeated.ranAt == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"])
    }

    @Test func berlinGapRunsAtItsEndAndARepeatedTimeRunsOnce() throws {
        let gap = Harness(at: "2026-03-28T12:00:00Z")
        _ = try gap.create("30 2 * * *", zone: "Europe/Berlin")
        gap.advance(by: 2 * 86_400_000)
        #expect(gap.ranAt == ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"])

        let repeated = Harness(at: "2026-10-24T12:00:00Z")
        _ = try repeated.create("30 2 * * *", zone: "Europe/Berlin")
        repeated.advance(by: 2 * 86_400_000)
        #expect(repeated.ranAt == ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"])
    }

    /// Down from 00:01:30 to 00:11:30: ten slots (00:02 ... 00:11) passed unseen.
    @Test(arguments: [ScheduleCatchup.none, .latest, .all])
    func slotsMissedWhileDownFollowCatchup(_ catchup: ScheduleCatchup) throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", catchup: catchup, maxCatchup: 3)
        s.advance(by: 60_000)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z"])
        let r = try s.restored(later: 600_000)
        let restored = try #require(r.engine.schedule(schedule.id))
        let caughtUp = Array(r.ranAt.dropFirst())
        switch catchup {
        case .none:
            #expect(caughtUp.isEmpty && restored.missedCount == 10)
        case .latest:
            #expect(caughtUp == ["2026-01-01T00:11:00Z"] && restored.missedCount == 9)
        case .all:
            #expect(caughtUp == ["2026-01-01T00:09:00Z", "2026-01-01T00:10:00Z", "2026-01-01T00:11:00Z"])
            #expect(restored.missedCount == 7)
        }
        #expect(restored.lastSlot == Self.ms("2026-01-01T00:11:00Z"))
        #expect(r.engine.scheduleTotals.missed == restored.missedCount)
        r.advance(by: 30_000)
        #expect(r.ranAt.last == "2026-01-01T00:12:00Z")
    }

    /// Catch-up runs obey `overlap`: with `skip`, the first makes a task still unfinished when
    /// the next comes, so the next two are skipped.
    @Test func catchUpRunsObeyOverlap() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", kind: "manual", overlap: .skip, catchup: .all, maxCatchup: 3)
        let r = try s.restored(later: 600_000)
        let restored = try #require(r.engine.schedule(schedule.id))
        #expect(r.ranAt == ["2026-01-01T00:08:00Z"])
        #expect(restored.lastRuns.map { r.engine.state(of: $0) } == ["running", "skipped", "skipped"])
        #expect(restored.skippedCount == 2 && restored.missedCount == 7 && restored.firedCount == 1)
    }

    @Test func slotsPassedWhilePausedAreNotCaughtUp() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        var spec = try s.create("* * * * *", catchup: .all).spec
        let id = s.runs.isEmpty ? s.engine.allSchedules[0].id : s.runs[0].id
        spec.paused = true
        let schedule = try s.engine.updateSchedule(id, to: spec)
        #expect(s.engine.nextRuns(of: schedule).isEmpty)
        s.advance(by: 600_000)
        #expect(s.runs.isEmpty)
        spec.paused = false
        try s.engine.updateSchedule(id, to: spec)
        s.advance(by: 1_000)
        #expect(s.runs.isEmpty && schedule.missedCount == 0)
        s.advance(by: 29_000)
        #expect(s.ranAt == ["2026-01-01T00:11:00Z"])
        // Paused across a restart as well: resumed after it, nothing of the time between runs.
        spec.paused = true
        try s.engine.updateSchedule(id, to: spec)
        let r = try s.restored(later: 600_000)
        #expect(r.ranAt == ["2026-01-01T00:11:00Z"])
        spec.paused = false
        try r.engine.updateSchedule(id, to: spec)
        r.advance(by: 60_000)
        #expect(r.ranAt == ["2026-01-01T00:11:00Z", "2026-01-01T00:22:00Z"])
    }

    @Test func overlapSkipRecordsTheSlotAsSkipped() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", kind: "manual", overlap: .skip)
        s.advance(by: 120_000)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z"])
        #expect(schedule.lastRuns.map { s.engine.state(of: $0) } == ["running", "skipped"])
        #expect(schedule.lastRuns[1].target == .none && schedule.lastRuns[1].slot == Self.ms("2026-01-01T00:02:00Z"))
        #expect(s.engine.scheduleTotals.skipped == 1)
        s.manual.runs[0].succeed()
        s.advance(by: 60_000)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z", "2026-01-01T00:03:00Z"])
    }

    @Test func overlapAllowRunsAlongside() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", kind: "manual", overlap: .allow)
        s.advance(by: 120_000)
        #expect(s.ranAt.count == 2 && s.manual.runs.count == 2)
        #expect(schedule.lastRuns.map { s.engine.state(of: $0) } == ["running", "running"])
    }

    @Test func overlapCancelPreviousCancelsThenRuns() throws {
        let manual = ManualExecutor()
        manual.confirmsCancel = true
        let s = Harness(at: "2026-01-01T00:00:30Z", manual: manual)
        let schedule = try s.create("* * * * *", kind: "manual", overlap: .cancelPrevious)
        s.advance(by: 120_000)
        #expect(s.ranAt.count == 2)
        #expect(schedule.lastRuns.map { s.engine.state(of: $0) } == ["cancelled", "running"])
        #expect(schedule.lastRuns[0].endedAs == .cancelled)
    }

    @Test func jitterStaysWithinItsBoundAndIsTheSameAfterARestore() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", jitter: 30_000)
        let slots = (1...50).map { Self.ms("2026-01-01T00:00:00Z") + Int64($0) * 60_000 }
        let jitters = slots.map { schedule.jitter(of: $0) }
        #expect(jitters.allSatisfy { (0...30_000).contains($0) })
        #expect(Set(jitters).count > 10)
        let firstSlot = slots[0]
        let due = firstSlot + schedule.jitter(of: firstSlot)
        // Restored before the jittered time, it fires at that same instant.
        let r = try s.restored(later: 29_000)
        let wait = UInt64(due - r.h.clock.wallClock)
        r.advance(by: wait - 1)
        #expect(r.runs.isEmpty)
        r.advance(by: 1)
        #expect(r.runs == [ScheduleSlot(id: schedule.id, slot: firstSlot)])
        let task = try #require(r.engine.task(r.engine.schedule(schedule.id)!.lastRuns[0].target.id!))
        #expect(task.createdAt == due)
    }

    @Test func startAndEndBoundTheSlots() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", startAt: "2026-01-01T00:05:00Z", endAt: "2026-01-01T00:07:00Z")
        #expect(s.engine.nextRuns(of: schedule).map(Harness.text) == [
            "2026-01-01T00:05:00Z", "2026-01-01T00:06:00Z", "2026-01-01T00:07:00Z",
        ])
        s.advance(by: 3_600_000)
        #expect(s.ranAt == ["2026-01-01T00:05:00Z", "2026-01-01T00:06:00Z", "2026-01-01T00:07:00Z"])
        #expect(s.engine.nextRuns(of: schedule).isEmpty)
    }

    @Test func triggerRunsNowEvenPausedAndObeysOverlap() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        var spec = try s.create("0 * * * *", kind: "manual", overlap: .skip).spec
        let id = s.engine.allSchedules[0].id
        spec.paused = true
        let schedule = try s.engine.updateSchedule(id, to: spec)
        let lastSlot = schedule.lastSlot
        let run = try s.engine.triggerSchedule(id)
        #expect(run.slot == s.h.clock.wallClock && s.runs == [ScheduleSlot(id: id, slot: run.slot)])
        #expect(schedule.lastSlot == lastSlot && schedule.lastRuns == [run])
        #expect(s.engine.task(run.target.id!)?.state == .running)
        #expect(throws: EngineError.self) { try s.engine.triggerSchedule(id) }
        do {
            try s.engine.triggerSchedule(id)
        } catch {
            #expect(error.code == .previousRunUnfinished && error.existing == run.target.id)
        }
        #expect(schedule.lastRuns.count == 1 && s.runs.count == 1)
        #expect(throws: EngineError.self) { try s.engine.triggerSchedule(TaskID(high: 1, low: 1)) }
    }

    /// With `cancel_previous`, a trigger cancels the unfinished previous run, then runs.
    @Test func triggerCancelsThePreviousRunUnderCancelPrevious() throws {
        let manual = ManualExecutor()
        manual.confirmsCancel = true
        let s = Harness(at: "2026-01-01T00:00:30Z", manual: manual)
        let schedule = try s.create("0 0 1 1 *", kind: "manual", overlap: .cancelPrevious)
        let first = try s.engine.triggerSchedule(schedule.id)
        let second = try s.engine.triggerSchedule(schedule.id)
        #expect(s.engine.task(first.target.id!)?.state == .cancelled)
        #expect(s.engine.task(second.target.id!)?.state == .running)
        #expect(schedule.lastRuns.map { s.engine.state(of: $0) } == ["cancelled", "running"])
    }

    /// A trigger the moment refuses (the template's unique key is held) changes nothing.
    @Test func aRefusedTriggerChangesNothing() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.engine.createSchedule(ScheduleSpec(
            name: "keyed", cron: "@yearly", template: .task(TaskSpec(kind: "manual", uniqueKey: "one")), overlap: .allow))
        _ = try s.engine.triggerSchedule(schedule.id)
        do {
            _ = try s.engine.triggerSchedule(schedule.id)
            Issue.record("a second run with a held key was made")
        } catch {
            #expect(error.code == .duplicateTask)
        }
        #expect(schedule.lastRuns.count == 1 && schedule.firedCount == 1)
    }

    @Test func aDeletedScheduleStopsFiringAndLeavesItsRunsAlone() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", kind: "manual")
        s.advance(by: 30_000)
        let run = try #require(schedule.lastRuns.first?.target.id)
        try s.engine.deleteSchedule(schedule.id)
        #expect(s.engine.schedule(schedule.id) == nil && s.engine.allSchedules.isEmpty)
        #expect(s.engine.nextRuns(of: schedule).isEmpty)
        s.advance(by: 600_000)
        #expect(s.runs.count == 1 && s.engine.task(run)?.state == .running)
        #expect(throws: EngineError.self) { try s.engine.deleteSchedule(schedule.id) }
    }

    /// A clock set forward past several slots is a late wake-up (catch-up rule); one set back
    /// fires nothing again: slots go on after the last dealt with.
    @Test func aClockJumpForwardCatchesUpAndOneBackRepeatsNothing() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z") { $0.wallClockCheckMilliseconds = 1_000 }
        let schedule = try s.create("* * * * *", catchup: .latest)
        s.advance(by: 30_000)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z"])
        s.h.clock.wallClockSkew = 600_000
        s.advance(by: 1_000)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z", "2026-01-01T00:11:00Z"])
        #expect(schedule.missedCount == 9)
        s.h.clock.wallClockSkew = -3_600_000
        s.advance(by: 30 * 60_000)
        #expect(s.ranAt == ["2026-01-01T00:01:00Z", "2026-01-01T00:11:00Z"])
        #expect(schedule.lastSlot == Self.ms("2026-01-01T00:11:00Z"))
    }

    /// Restored right after a slot fired (the store wrote the run and `lastSlot` together), the
    /// slot does not fire again; the next one does, once.
    @Test func aRestoreAfterAFireNeverFiresThatSlotAgain() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.create("* * * * *", catchup: .all)
        s.advance(by: 30_000)
        let r = try s.restored(later: 10)
        #expect(r.ranAt == ["2026-01-01T00:01:00Z"])
        r.advance(by: 60_000)
        #expect(r.ranAt == ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"])
        #expect(try #require(r.engine.schedule(schedule.id)).firedCount == 2)
    }

    /// Retention forgets a run's task: `last_runs` keeps the state it ended with.
    @Test func aForgottenRunKeepsItsEndState() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z") { $0.retentionMilliseconds = 1_000 }
        let schedule = try s.create("0 * * * *")
        s.advance(by: 3_600_000)
        let run = try #require(schedule.lastRuns.first)
        #expect(s.engine.task(run.target.id!) == nil)
        #expect(run.endedAs == .succeeded && s.engine.state(of: run) == "succeeded")
    }

    @Test func aWorkflowTemplateRunsAsOneWorkflowAndEndsAsIt() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        let schedule = try s.engine.createSchedule(ScheduleSpec(
            name: "nightly", cron: "* * * * *", template: .workflow(name: "pipeline", tasks: [
                .init(key: "a", spec: TaskSpec(kind: "noop")),
                .init(key: "b", spec: TaskSpec(kind: "noop", dependencies: [.sibling(key: "a")])),
            ])))
        s.advance(by: 30_000)
        #expect(s.runs.count == 2 && Set(s.runs).count == 1)
        let run = try #require(schedule.lastRuns.first)
        guard case .workflow(let id) = run.target else { Issue.record("not a workflow: \(run)"); return }
        #expect(s.engine.workflow(id)?.tasks.count == 2)
        #expect(s.engine.state(of: run) == "succeeded")
        #expect(schedule.lastRuns[0].endedAs == .succeeded)
    }

    /// The engine reads no tzdata file: it has a zone only loaded already, from its catalog
    /// (the service loads it off the loop first). A zone not loaded is refused naming
    /// `timezone`, and so is a restore of a schedule in it, changing nothing; the engine never
    /// calls the catalog's loader.
    @Test func theEngineUsesOnlyZonesLoadedBeforeItIsAsked() throws {
        let loads = Mutex(0)
        let catalog = TimeZoneCatalog { name throws(TimeZoneError) in
            loads.withLock { $0 += 1 }
            return try TimeZoneRules.load(named: name)
        }
        let s = Harness(at: "2026-01-01T00:00:30Z") { $0.zones = catalog }
        let spec = ScheduleSpec(name: "tokyo", cron: "0 3 * * *", timezone: "Asia/Tokyo", template: .task(TaskSpec(kind: "noop")))
        do {
            try s.engine.createSchedule(spec)
            Issue.record("a zone not loaded was used")
        } catch {
            #expect(error.field == "timezone" && error.message.contains("not loaded"), "\(error.message)")
        }
        #expect(s.engine.scheduleCount == 0)
        #expect(loads.withLock { $0 } == 0)

        _ = try catalog.load(named: "Asia/Tokyo")
        let schedule = try s.engine.createSchedule(spec)
        #expect(s.engine.nextRuns(of: schedule, count: 1).map(Harness.text) == ["2026-01-01T18:00:00Z"])
        #expect(loads.withLock { $0 } == 1)

        let saved = s.engine.snapshot(of: schedule)
        let elsewhere = TimeZoneCatalog { name throws(TimeZoneError) in
            loads.withLock { $0 += 1 }
            return try TimeZoneRules.load(named: name)
        }
        let restored = Harness(at: "2026-01-01T00:01:00Z") { $0.zones = elsewhere }
        #expect(throws: EngineError.self) { try restored.engine.restore(queues: [], workflows: [], tasks: [], schedules: [saved]) }
        #expect(restored.engine.scheduleCount == 0)
        #expect(loads.withLock { $0 } == 1)
        try elsewhere.load(zonesOf: [saved])
        try restored.engine.restore(queues: [], workflows: [], tasks: [], schedules: [saved])
        #expect(restored.engine.schedule(schedule.id)?.cron.zone.name == "Asia/Tokyo")
        #expect(loads.withLock { $0 } == 2)
    }

    @Test func badFieldsAreRefusedNamingTheFieldAndChangeNothing() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        func refusal(_ change: (inout ScheduleSpec) -> Void) -> String? {
            var spec = ScheduleSpec(name: "n", cron: "* * * * *", template: .task(TaskSpec(kind: "noop")))
            change(&spec)
            do {
                try s.engine.createSchedule(spec)
                return nil
            } catch {
                return error.field
            }
        }
        #expect(refusal { $0.cron = "61 * * * *" } == "cron")
        #expect(refusal { $0.cron = "* * *" } == "cron")
        #expect(refusal { $0.timezone = "Mars/Olympus" } == "timezone")
        #expect(refusal { $0.timezone = "../etc/passwd" } == "timezone")
        #expect(refusal { $0.name = "" } == "name")
        #expect(refusal { $0.maxCatchup = 0 } == "max_catchup")
        #expect(refusal { $0.jitterMilliseconds = 3_600_001 } == "jitter_ms")
        #expect(refusal { $0.startAt = 2_000; $0.endAt = 1_000 } == "end_at")
        #expect(refusal { $0.template = .task(TaskSpec(kind: "nope")) } == "task.kind")
        #expect(refusal { $0.template = .task(TaskSpec(kind: "noop", runAt: .at(5))) } == "task.run_at")
        #expect(refusal { $0.template = .task(TaskSpec(kind: "noop", dependencies: [.task(TaskID(high: 1, low: 2))])) }
                == "task.dependencies[0]")
        #expect(refusal { $0.template = .workflow(name: nil, tasks: [.init(key: "a", spec: TaskSpec(kind: "nope"))]) }
                == "workflow.tasks[0].kind")
        #expect(refusal { $0.template = .workflow(name: nil, tasks: []) } == "workflow.tasks")
        #expect(s.engine.scheduleCount == 0 && s.scheduleEvents == 0)
        #expect(refusal { _ in } == nil)
    }

    @Test func theScheduleLimitHolds() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z") { $0.maxSchedules = 2 }
        _ = try s.create("* * * * *")
        _ = try s.create("* * * * *")
        do {
            _ = try s.create("* * * * *")
            Issue.record("a third schedule was made")
        } catch let error as EngineError {
            #expect(error.code == .tooManySchedules)
        }
    }

    /// An event keeps the schedule as its change left it: a later pause or firing does not
    /// change what an earlier moment shows, however late it is rendered.
    @Test func aMomentShowsTheScheduleAsItWasThen() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        var spec = try s.create("* * * * *").spec
        let schedule = s.engine.allSchedules[0]
        let before = schedule.moment()
        spec.paused = true
        try s.engine.updateSchedule(schedule.id, to: spec)
        #expect(before.nextRuns(count: 2).map(Harness.text) == ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"])
        #expect(!before.spec.paused && before.lastRuns.isEmpty)
        #expect(schedule.moment().nextRuns().isEmpty)
        #expect(schedule.moment(deleted: true).deleted && before.deleted == false)
    }

    /// A turn in which ten thousand schedules fire hands the store each schedule once, in the
    /// order they fired (the collector's membership is a set past a few, not a scan).
    @Test func aTurnOfManyFiringsCollectsEachScheduleOnce() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        for _ in 0..<2_000 { _ = try s.create("* * * * * *") }
        var collector = ChangeCollector()
        s.engine.addObserver { collector.add($0) }
        s.advance(by: 1_000)
        let changes = collector.take(from: s.engine)
        #expect(s.runs.count == 2_000)
        #expect(changes.schedules.map(\.id) == s.runs.map(\.id))
    }

    /// Ten thousand schedules: one heap entry each, and each slot costs a pop and a push.
    @Test func manySchedulesKeepOneEntryEach() throws {
        let s = Harness(at: "2026-01-01T00:00:30Z")
        for _ in 0..<10_000 { _ = try s.create("* * * * * *") }
        #expect(s.engine.wallTimers.scheduleEntryCount == 10_000)
        s.advance(by: 3_000)
        #expect(s.runs.count == 30_000)
        #expect(s.engine.wallTimers.scheduleEntryCount == 10_000)
    }
}
