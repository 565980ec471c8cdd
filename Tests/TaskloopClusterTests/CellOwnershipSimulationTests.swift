import Testing
import TaskloopTestSupport
@testable import TaskloopCluster

/// Replicas that own cells under `CellOwnership`'s rules, against a simulated cells table, on a
/// simulated clock: messages late or lost, replicas cut off, paused (SIGSTOP), killed and
/// restarted under the same name, joining and leaving. Whatever happens, no cell's engine runs
/// on two running replicas at once, a commit is accepted only under the cell's current epoch
/// (so a deposed owner's commits change nothing), and once the trouble ends every cell is run
/// by the one live replica rendezvous names.
@Suite struct CellOwnershipSimulationTests {
    static let layout = CellLayout(count: 32)
    static let settings = CellOwnership.Settings(leaseMilliseconds: 4_000, marginMilliseconds: 500)
    static let step: UInt64 = 10

    /// The cells table and the replicas' rows; its clock is the simulation's.
    struct Database {
        var owners: [Cell: (owner: ReplicaIdentity?, epoch: UInt64, leaseUntil: UInt64)] = [:]
        var replicas: [String: (incarnation: String, expiresAt: UInt64)] = [:]
        /// Per cell, the epochs of accepted commits in the order accepted, with who made them.
        var commits: [Cell: [(epoch: UInt64, by: ReplicaIdentity)]] = [:]

        init() {
            for cell in layout.cells { owners[cell] = (nil, 0, 0) }
        }

        mutating func renew(_ me: ReplicaIdentity, now: UInt64) -> RenewalAnswer {
            guard replicas[me.name]?.incarnation == me.incarnation else {
                return RenewalAnswer(isRegistered: false, live: [], cells: [])
            }
            replicas[me.name]!.expiresAt = now + settings.leaseMilliseconds
            for (cell, row) in owners where row.owner == me {
                owners[cell]!.leaseUntil = now + settings.leaseMilliseconds
            }
            let live = replicas.filter { $0.value.expiresAt > now }.map(\.key).sorted()
            let rows = layout.cells.map { cell in
                let row = owners[cell]!
                return CellRow(cell: cell, owner: row.owner, epoch: row.epoch,
                               expired: row.owner != nil && row.leaseUntil + settings.marginMilliseconds < now)
            }
            return RenewalAnswer(isRegistered: true, live: live, cells: rows)
        }

        mutating func claim(_ cell: Cell, from epoch: UInt64, by me: ReplicaIdentity, now: UInt64) -> UInt64? {
            let row = owners[cell]!
            guard row.epoch == epoch,
                  row.owner == nil || row.owner == me || row.leaseUntil + settings.marginMilliseconds < now else { return nil }
            owners[cell] = (me, epoch + 1, now + settings.leaseMilliseconds)
            return epoch + 1
        }

        mutating func release(_ cell: Cell, epoch: UInt64, by me: ReplicaIdentity) {
            if owners[cell]!.owner == me && owners[cell]!.epoch == epoch { owners[cell]!.owner = nil }
        }

        mutating func commit(_ cell: Cell, epoch: UInt64, by me: ReplicaIdentity) {
            guard owners[cell]!.owner == me && owners[cell]!.epoch == epoch else { return }
            commits[cell, default: []].append((epoch, me))
        }
    }

    enum Message {
        case renew(sentAt: UInt64)
        case claim(Cell, UInt64)
        case release(Cell, UInt64)
        case commit(Cell, UInt64)
        case renewed(sentAt: UInt64, RenewalAnswer)
        case claimed(Cell, UInt64?)
        case released(Cell)

        /// What the driver is told when the request or its answer is lost: the connection's
        /// error, at its statement timeout.
        var failure: Message? {
            switch self {
            case .claim(let cell, _): .claimed(cell, nil)
            case .release(let cell, _): .released(cell)
            case .renew, .commit, .renewed, .claimed, .released: nil
            }
        }
    }

    struct InFlight {
        var at: UInt64
        var replica: Int
        /// Which process sent it or is to get it: a message to a killed process is dropped.
        var incarnation: String
        var toDatabase: Bool
        var message: Message
    }

    struct Replica {
        var ownership: CellOwnership
        var clockOffset: UInt64
        var pausedUntil: UInt64 = 0
        var cutOffUntil: UInt64 = 0
        /// While cut off, the share of messages lost each way, in percent.
        var lossPercent = 100
        var drainsDue: [Cell: UInt64] = [:]
        var isAlive = true
        var stopsAt: UInt64?
        /// A renewal without an answer by then failed (the driver's statement timeout).
        var renewalTimesOutAt: UInt64?

        init(_ identity: ReplicaIdentity, clockOffset: UInt64) {
            ownership = CellOwnership(me: identity, layout: layout, settings: settings)
            self.clockOffset = clockOffset
        }
    }

    @Test(arguments: propertySeeds(base: 9_100, count: 12))
    func ownershipHoldsThroughFailures(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        var database = Database()
        var replicas: [Replica] = []
        var inFlight: [InFlight] = []
        let troubleEnds: UInt64 = 40_000, end: UInt64 = 70_000

        func start(_ name: String, incarnation: String, at now: UInt64) {
            database.replicas[name] = (incarnation, now + Self.settings.leaseMilliseconds)
            replicas.append(Replica(ReplicaIdentity(name: name, incarnation: incarnation), clockOffset: random.next() % 1_000_000))
        }
        func latency() -> UInt64 { random.below(10) == 0 ? 100 + UInt64(random.below(900)) : 1 + UInt64(random.below(30)) }
        func send(_ message: Message, from index: Int, now: UInt64) {
            let replica = replicas[index]
            // Cut off: the request is lost on the way, or done by the database and its answer
            // lost on the way back.
            if now < replica.cutOffUntil && random.below(100) < replica.lossPercent {
                if let failure = message.failure {
                    inFlight.append(InFlight(at: now + 1_000, replica: index, incarnation: replica.ownership.me.incarnation,
                                             toDatabase: false, message: failure))
                }
                return
            }
            inFlight.append(InFlight(at: now + latency(), replica: index, incarnation: replica.ownership.me.incarnation,
                                     toDatabase: true, message: message))
        }
        func perform(_ actions: [CellOwnership.Action], at index: Int, now: UInt64) {
            let local = now + replicas[index].clockOffset
            for action in actions {
                switch action {
                case .renew:
                    replicas[index].renewalTimesOutAt = now + 1_000
                    send(.renew(sentAt: local), from: index, now: now)
                case .claim(let cell, let epoch): send(.claim(cell, epoch), from: index, now: now)
                case .release(let cell, let epoch): send(.release(cell, epoch), from: index, now: now)
                case .drain(let cell): replicas[index].drainsDue[cell] = now + UInt64(random.below(300))
                case .open, .close(_, _): break
                }
            }
        }

        for (index, name) in ["a", "b", "c"].enumerated() { start(name, incarnation: "\(name)0", at: UInt64(index) * 700) }
        var now: UInt64 = 0
        var restarts = 0
        var joined = false
        while now < end {
            now += Self.step
            // Trouble, while it lasts.
            if now < troubleEnds {
                let roll = random.below(4_000)
                let index = random.below(replicas.count)
                switch roll {
                case 0:
                    replicas[index].cutOffUntil = now + 1_000 + UInt64(random.below(10_000))
                    replicas[index].lossPercent = [100, 50, 90][random.below(3)]
                case 1: replicas[index].pausedUntil = now + 1_000 + UInt64(random.below(10_000))
                case 2 where replicas[index].isAlive && restarts < 3:
                    // kill -9, and a new process under the same name a moment later.
                    restarts += 1
                    replicas[index].isAlive = false
                    let name = replicas[index].ownership.me.name
                    start(name, incarnation: "\(name)\(restarts)", at: now + 200)
                case 3 where !joined:
                    joined = true
                    start("d", incarnation: "d0", at: now)
                case 4 where replicas.filter({ $0.isAlive && $0.stopsAt == nil }).count > 2 && replicas[index].isAlive:
                    replicas[index].stopsAt = now
                default: break
                }
            }
            // Each running replica looks at its clock before anything else it was told.
            for index in replicas.indices where replicas[index].isAlive && now >= replicas[index].pausedUntil {
                let local = now + replicas[index].clockOffset
                if replicas[index].stopsAt.map({ now >= $0 }) == true && !replicas[index].ownership.isStopping {
                    perform(replicas[index].ownership.stop(), at: index, now: now)
                }
                if let timeout = replicas[index].renewalTimesOutAt, now >= timeout {
                    replicas[index].renewalTimesOutAt = nil
                    replicas[index].ownership.renewalFailed()
                }
                perform(replicas[index].ownership.tick(now: local), at: index, now: now)
                for (cell, due) in replicas[index].drainsDue where due <= now {
                    replicas[index].drainsDue[cell] = nil
                    perform(replicas[index].ownership.drained(cell), at: index, now: now)
                }
                if replicas[index].ownership.isStopped {
                    replicas[index].isAlive = false
                    database.replicas[replicas[index].ownership.me.name] = nil
                    continue
                }
                for (cell, epoch) in replicas[index].ownership.openCells where random.below(20) == 0 {
                    send(.commit(cell, epoch), from: index, now: now)
                }
            }
            // Deliveries due.
            let due = inFlight.filter { $0.at <= now }
            inFlight.removeAll { $0.at <= now }
            for delivery in due.sorted(by: { $0.at < $1.at }) {
                let index = delivery.replica
                let me = replicas[index].ownership.me
                if delivery.toDatabase {
                    // A dead process's requests already sent still arrive (they were on the wire).
                    let sender = ReplicaIdentity(name: me.name, incarnation: delivery.incarnation)
                    var answer: Message?
                    switch delivery.message {
                    case .renew(let sentAt): answer = .renewed(sentAt: sentAt, database.renew(sender, now: now))
                    case .claim(let cell, let epoch): answer = .claimed(cell, database.claim(cell, from: epoch, by: sender, now: now))
                    case .release(let cell, let epoch):
                        database.release(cell, epoch: epoch, by: sender)
                        answer = .released(cell)
                    case .commit(let cell, let epoch): database.commit(cell, epoch: epoch, by: sender)
                    case .renewed, .claimed, .released: break
                    }
                    if let answer {
                        let isLost = now < replicas[index].cutOffUntil && random.below(100) < replicas[index].lossPercent
                        guard let answer = isLost ? delivery.message.failure : answer else { continue }
                        inFlight.append(InFlight(at: now + (isLost ? 1_000 : latency()), replica: index,
                                                 incarnation: delivery.incarnation, toDatabase: false, message: answer))
                    }
                } else {
                    guard replicas[index].isAlive, delivery.incarnation == me.incarnation else { continue }
                    guard now >= replicas[index].pausedUntil else {
                        var later = delivery
                        later.at = replicas[index].pausedUntil
                        inFlight.append(later)
                        continue
                    }
                    let local = now + replicas[index].clockOffset
                    switch delivery.message {
                    case .renewed(let sentAt, let answer):
                        replicas[index].renewalTimesOutAt = nil
                        perform(replicas[index].ownership.renewed(sentAt: sentAt, now: local, answer), at: index, now: now)
                    case .claimed(let cell, let epoch?):
                        perform(replicas[index].ownership.claimed(cell, epoch: epoch, now: local), at: index, now: now)
                    case .claimed(let cell, nil):
                        replicas[index].ownership.claimFailed(cell)
                    case .released(let cell):
                        replicas[index].ownership.released(cell)
                    case .renew, .claim, .release, .commit: break
                    }
                }
            }

            // No cell runs on two running replicas.
            var runners: [Cell: [String]] = [:]
            for replica in replicas where replica.isAlive && now >= replica.pausedUntil {
                for cell in replica.ownership.openCells.keys { runners[cell, default: []].append(replica.ownership.me.description) }
            }
            for (cell, names) in runners where names.count > 1 {
                Issue.record("seed \(seed), \(now) ms: \(cell) runs on \(names)")
                return
            }
        }

        // Commits: per cell, epochs never go back, and each epoch is one replica's.
        for (cell, commits) in database.commits {
            var owners: [UInt64: ReplicaIdentity] = [:]
            for (previous, next) in zip(commits, commits.dropFirst()) where next.epoch < previous.epoch {
                Issue.record("seed \(seed): \(cell) accepted epoch \(next.epoch) after \(previous.epoch)")
            }
            for commit in commits {
                if let owner = owners[commit.epoch], owner != commit.by {
                    Issue.record("seed \(seed): \(cell) epoch \(commit.epoch) committed by \(owner) and \(commit.by)")
                }
                owners[commit.epoch] = commit.by
            }
        }
        // Settled: each cell runs on exactly the live replica rendezvous names.
        let live = replicas.filter { $0.isAlive }
        let owners = Rendezvous.assignment(Self.layout, among: live.map(\.ownership.me.name))
        for cell in Self.layout.cells {
            let runners = live.filter { $0.ownership.openCells[cell] != nil }.map(\.ownership.me.name)
            #expect(runners == [owners[cell]!], "seed \(seed): \(cell) runs on \(runners), rendezvous says \(owners[cell]!); its row: \(database.owners[cell]!)")
        }
    }
}
