import Testing
@testable import TaskloopCluster

@Suite struct CellOwnershipTests {
    static let layout = CellLayout(count: 16)
    static let settings = CellOwnership.Settings(leaseMilliseconds: 10_000, marginMilliseconds: 1_000)
    static let a = ReplicaIdentity(name: "a", incarnation: "a1")
    static let b = ReplicaIdentity(name: "b", incarnation: "b1")

    static func rows(_ owner: (Cell) -> ReplicaIdentity?, epoch: UInt64 = 0, expired: Bool = false) -> [CellRow] {
        layout.cells.map { CellRow(cell: $0, owner: owner($0), epoch: epoch, expired: expired) }
    }

    /// Owns every cell rendezvous gives `me` among `live`, claimed at epoch 0 -> 1.
    static func owning(_ me: ReplicaIdentity, among live: [String]) -> CellOwnership {
        var ownership = CellOwnership(me: me, layout: layout, settings: settings)
        #expect(ownership.tick(now: 0) == [.renew])
        for action in ownership.renewed(sentAt: 0, now: 0, RenewalAnswer(isRegistered: true, live: live, cells: rows { _ in nil })) {
            guard case .claim(let cell, 0) = action else { Issue.record("unexpected \(action)"); continue }
            #expect(ownership.claimed(cell, epoch: 1, now: 0) == [.open(cell, epoch: 1)])
        }
        return ownership
    }

    @Test func aStartingReplicaClaimsWhatRendezvousGivesIt() {
        var ownership = CellOwnership(me: Self.a, layout: Self.layout, settings: Self.settings)
        #expect(ownership.tick(now: 5) == [.renew])
        #expect(ownership.tick(now: 6) == [], "one renewal at a time")
        let mine = Self.layout.cells.filter { Rendezvous.owner(of: $0, among: ["a", "b"]) == "a" }
        let actions = ownership.renewed(sentAt: 5, now: 5, RenewalAnswer(isRegistered: true, live: ["a", "b"], cells: Self.rows { _ in nil }))
        #expect(actions == mine.map { .claim($0, currentEpoch: 0) })
        #expect(!mine.isEmpty && mine.count < Self.layout.count)
        #expect(ownership.claimed(mine[0], epoch: 1, now: 0) == [.open(mine[0], epoch: 1)])
        ownership.claimFailed(mine[1])
        #expect(ownership.openCells == [mine[0]: 1])
        #expect(ownership.cells[mine[1]] == nil, "a refused claim is tried again at the next renewal")
        #expect(ownership.nextDeadline == 5 + 2_500)
    }

    @Test func aCellHeldByALiveReplicaIsNotClaimedUntilItExpiresOrIsReleased() {
        var ownership = CellOwnership(me: Self.a, layout: Self.layout, settings: Self.settings)
        _ = ownership.tick(now: 0)
        // Everything is b's, alive: a claims nothing even where rendezvous says a.
        #expect(ownership.renewed(sentAt: 0, now: 0, RenewalAnswer(isRegistered: true, live: ["a", "b"], cells: Self.rows { _ in Self.b })) == [])
        _ = ownership.tick(now: 2_500)
        let mine = Self.layout.cells.filter { Rendezvous.owner(of: $0, among: ["a"]) == "a" }
        // b is gone from the live list and its leases have run out (plus the margin).
        #expect(ownership.renewed(sentAt: 2_500, now: 2_500, RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows({ _ in Self.b }, epoch: 4, expired: true)))
                == mine.map { .claim($0, currentEpoch: 4) })
    }

    /// A newer protocol took the cluster over: every cell is drained and released as in a
    /// graceful stop, and nothing is claimed again, whatever rendezvous says.
    @Test func aSupersededReplicaHandsEverythingOverAndClaimsNothingMore() {
        var ownership = Self.owning(Self.a, among: ["a"])
        _ = ownership.tick(now: 2_500)
        var superseded = RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows({ _ in Self.a }, epoch: 1))
        superseded.isSuperseded = true
        #expect(ownership.renewed(sentAt: 2_500, now: 2_500, superseded) == Self.layout.cells.map { .drain($0) })
        #expect(ownership.isSuperseded && !ownership.isStopped)
        for cell in Self.layout.cells {
            #expect(ownership.drained(cell) == [.release(cell, epoch: 1)])
            ownership.released(cell)
        }
        #expect(ownership.isStopped)
        #expect(ownership.tick(now: 10_000) == [], "a replica that left renews nothing")
    }

    /// While a replica of an older protocol is live (handing its cells over), a newer one
    /// claims nothing, not even the cells nobody holds: replicas of two protocols never own
    /// cells together.
    @Test func noCellIsClaimedWhileAReplicaOfAnOlderProtocolIsLive() {
        var ownership = CellOwnership(me: Self.a, layout: Self.layout, settings: Self.settings)
        _ = ownership.tick(now: 0)
        var answer = RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows { _ in nil })
        answer.olderMembersLive = true
        #expect(ownership.renewed(sentAt: 0, now: 0, answer) == [])
        _ = ownership.tick(now: 2_500)
        answer.olderMembersLive = false
        #expect(ownership.renewed(sentAt: 2_500, now: 2_500, answer) == Self.layout.cells.map { .claim($0, currentEpoch: 0) })
    }

    @Test func aJoinDrainsExactlyTheCellsThatMoveThenReleasesThem() {
        var ownership = Self.owning(Self.a, among: ["a"])
        #expect(ownership.openCells.count == Self.layout.count)
        _ = ownership.tick(now: 2_500)
        let moving = Self.layout.cells.filter { Rendezvous.owner(of: $0, among: ["a", "b"]) == "b" }
        let actions = ownership.renewed(sentAt: 2_500, now: 2_500, RenewalAnswer(isRegistered: true, live: ["a", "b"], cells: Self.rows({ _ in Self.a }, epoch: 1)))
        #expect(actions == moving.map { .drain($0) })
        #expect(ownership.openCells.count == Self.layout.count, "a draining cell's engine still runs until it has drained")
        #expect(ownership.drained(moving[0]) == [.release(moving[0], epoch: 1)])
        ownership.released(moving[0])
        #expect(ownership.openCells.count == Self.layout.count - 1)
        #expect(ownership.cells[moving[0]] == nil)
    }

    @Test func withoutAConfirmedRenewalEveryCellIsClosedAtLeaseMinusMargin() {
        var ownership = Self.owning(Self.a, among: ["a"])
        #expect(ownership.tick(now: 2_500) == [.renew])
        ownership.renewalFailed()
        #expect(ownership.tick(now: 8_999) == [.renew], "kept by the renewal sent at 0 until 9,000")
        let closed = ownership.tick(now: 9_000)
        #expect(closed == Self.layout.cells.map { .close($0, .fenced) })
        #expect(ownership.openCells.isEmpty)
        // A renewal that gets through later takes the cells back, each under a new epoch.
        let again = ownership.renewed(sentAt: 8_999, now: 9_100, RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows({ _ in Self.a }, epoch: 1)))
        #expect(again == Self.layout.cells.map { .claim($0, currentEpoch: 1) })
    }

    @Test func aLateAnswerDoesNotExtendTheLeasePastWhatItsSendingTimeAllows() {
        var ownership = Self.owning(Self.a, among: ["a"])
        _ = ownership.tick(now: 2_500)
        // The answer to the renewal sent at 2,500 arrives at 20,000 (a long pause): the cells
        // were closed at 11,500, before it could be read.
        #expect(ownership.tick(now: 20_000).count == Self.layout.count)
        let late = ownership.renewed(sentAt: 2_500, now: 20_000,
                                     RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows({ _ in Self.a }, epoch: 1)))
        #expect(late == [], "nothing is claimed on rows read a lease ago")
        #expect(ownership.keptUntil == 11_500)
        // A claim answered after the lease it ran under is not opened either.
        var claiming = CellOwnership(me: Self.a, layout: Self.layout, settings: Self.settings)
        _ = claiming.tick(now: 0)
        let claims = claiming.renewed(sentAt: 0, now: 10, RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows { _ in nil }))
        #expect(claims.count == Self.layout.count)
        #expect(claiming.claimed(Cell(0), epoch: 1, now: 9_000) == [])
        #expect(claiming.claimed(Cell(1), epoch: 1, now: 8_999) == [.open(Cell(1), epoch: 1)])
        #expect(claiming.cells[Cell(0)] == nil)
    }

    @Test func aCellTakenByAnotherIsClosedAsLost() {
        var ownership = Self.owning(Self.a, among: ["a"])
        _ = ownership.tick(now: 2_500)
        let taken = Cell(3)
        let actions = ownership.renewed(sentAt: 2_500, now: 2_500, RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows({ $0 == taken ? Self.b : Self.a }, epoch: 1)))
        #expect(actions == [.close(taken, .lost)])
        // A newer epoch under the same owner name is another owner too (a restarted process).
        _ = ownership.tick(now: 5_000)
        let restarted = ReplicaIdentity(name: "a", incarnation: "a2")
        let later = ownership.renewed(sentAt: 5_000, now: 5_000, RenewalAnswer(isRegistered: true, live: ["a"], cells: Self.rows({ $0 == Cell(4) ? restarted : Self.a }, epoch: 1)))
        #expect(later.contains(.close(Cell(4), .lost)))
    }

    @Test func aReplicaWhoseNameWasTakenClosesEverything() {
        var ownership = Self.owning(Self.a, among: ["a"])
        _ = ownership.tick(now: 2_500)
        let actions = ownership.renewed(sentAt: 2_500, now: 2_500, RenewalAnswer(isRegistered: false, live: ["a"], cells: []))
        #expect(actions == Self.layout.cells.map { .close($0, .replaced) })
        #expect(ownership.keptUntil == nil)
        #expect(ownership.isReplaced, "the keeper stops: the name is the other process's")
    }

    /// The registration wrote the row's expiry as a renewal does: a replica that has just
    /// joined counts as renewed until its first renewal's answer, never past what its sending
    /// time allows.
    @Test func theRegistrationKeepsTheReplicaUntilTheFirstRenewal() {
        var ownership = CellOwnership(me: Self.a, layout: Self.layout, settings: Self.settings)
        #expect(ownership.keptUntil == nil)
        ownership.registered(sentAt: 100)
        #expect(ownership.keptUntil == 100 + 10_000 - 1_000)
        #expect(!ownership.isReplaced)
    }

    @Test func aGracefulStopDrainsAndReleasesEverythingAndClaimsNothing() {
        var ownership = Self.owning(Self.a, among: ["a", "b"])
        let owned = ownership.openCells.keys.sorted()
        #expect(ownership.stop() == owned.map { .drain($0) })
        for cell in owned {
            #expect(ownership.drained(cell) == [.release(cell, epoch: 1)])
            ownership.released(cell)
        }
        #expect(ownership.isStopped)
        #expect(ownership.tick(now: 100_000) == [], "a stopped replica renews nothing")
        // Another replica's announcement after the stop: nothing is due, so the driver does
        // not wake for it (a deadline that stayed due spun the loop of a stopping replica).
        ownership.renewSoon()
        #expect(ownership.nextDeadline == .max)
        #expect(ownership.tick(now: 100_001) == [])
    }
}

extension CellOwnershipTests {
    @Test func aCellMovedToANewerEpochByItsOwnerStaysItsOwn() {
        var ownership = Self.owning(Self.a, among: ["a"])
        ownership.epochAdvanced(Cell(2), to: 5)
        ownership.epochAdvanced(Cell(3), to: 1)
        #expect(ownership.openCells[Cell(2)] == 5 && ownership.openCells[Cell(3)] == 1)
        _ = ownership.tick(now: 2_500)
        let actions = ownership.renewed(sentAt: 2_500, now: 2_500, RenewalAnswer(isRegistered: true, live: ["a"],
                                                                                 cells: Self.rows({ _ in Self.a }, epoch: 1).map {
            $0.cell == Cell(2) ? CellRow(cell: $0.cell, owner: Self.a, epoch: 5, expired: false) : $0
        }))
        #expect(actions.isEmpty, "nothing is lost: \(actions)")
    }
}
