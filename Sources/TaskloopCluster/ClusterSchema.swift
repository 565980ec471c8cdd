import TaskloopPostgres
import TaskloopStore

/// The cluster's tables in schema `taskloop` and the statements of `CellKeeper`. Every time in
/// them is the database's `clock_timestamp()` (the moment of the statement, not of its
/// transaction's start): leases are compared on one clock, the database's.
public enum ClusterSchema {
    /// Bumped when replicas must not own cells together with older ones. 2: task records and
    /// cell messages may hold the `scheduled` state, run and expiry times, and unique keys.
    /// 3: and concurrency keys. 4: and the schedule that made a task; cells keep schedules.
    /// 5: workflow records and cell messages' members carry the schedule that made them; events
    /// name their schedule (`cell_events.schedule`).
    public static let protocolVersion = 5

    /// Serialises the creation of the tables ("TLCELLS" would read better in a lock listing;
    /// the number only has to be fixed and unlikely to collide).
    static let setUpLock: Int64 = 7_361_000_000_003

    /// Among `setUp`'s results, the cluster's row (cells, protocol).
    static func clusterRow(amongSetUp results: [PGResult]) -> PGResult { results[3] }

    /// The channel a replica's arrival, departure or release of a cell is announced on: the
    /// others renew at once, so cells move in a round trip instead of a renewal interval. The
    /// payload names the announcing process, which ignores its own.
    static let membershipChannel = "taskloop_members"

    static func announceChange(_ settings: CellKeeper.Settings) -> PGQuery {
        PGQuery("SELECT pg_notify('\(membershipChannel)', $1)", [.text(settings.identity.incarnation)])
    }

    /// The SQLSTATE a commit of a deposed owner fails with.
    public static let deposedState = "TL001"

    /// The first statement of every commit of `cell` (inside its transaction): see
    /// `fence_commits` in `setUp`. `token` names the commit, unique per cell.
    public static func fenceCommit(_ cell: Cell, epoch: UInt64, by owner: ReplicaIdentity, token: String) -> PGQuery {
        fenceCommit([(cell, epoch)], by: owner, token: token)
    }

    /// The first statement of a commit of several cells at once, each under its epoch: it
    /// fails unless every one is still held, and leaves `token` in each one's row.
    public static func fenceCommit(_ cells: [(cell: Cell, epoch: UInt64)], by owner: ReplicaIdentity, token: String) -> PGQuery {
        PGQuery(fenceCommitStatement, [.text("{" + cells.map { String($0.cell.index) }.joined(separator: ",") + "}"),
                                       .text("{" + cells.map { String($0.epoch) }.joined(separator: ",") + "}"),
                                       .text(owner.name), .text(owner.incarnation), .text(token)])
    }

    static let fenceCommitStatement = PGStatement("cells_fence_commits",
                                                  "SELECT taskloop.fence_commits($1::int[], $2::bigint[], $3, $4, $5)")

    /// The cells a deposed commit's error names (`fence_commits` lists them as `{3,5}`).
    static func deposedCells(in message: String) -> [Cell] {
        guard let open = message.firstIndex(of: "{"), let close = message[open...].firstIndex(of: "}") else { return [] }
        return message[message.index(after: open)..<close].split(separator: ",").compactMap { UInt16($0).map(Cell.init) }
    }

    /// Moves each of `cells` still held by `owner` to a new epoch, after any commit still
    /// running on them, and returns (cell, new epoch, token of the last commit that went
    /// through): `CellCommitter` resolves commits whose answer a lost connection took.
    static func refence(_ cells: [Cell], by owner: ReplicaIdentity) -> PGQuery {
        PGQuery("""
            UPDATE taskloop.cells SET epoch = epoch + 1 WHERE cell IN (SELECT cell FROM taskloop.cells
                WHERE cell = ANY($1::int[]) AND owner = $2 AND incarnation = $3 ORDER BY cell FOR UPDATE)
                AND owner = $2 AND incarnation = $3
            RETURNING cell, epoch, commit_token
            """, [.text("{" + cells.map { String($0.index) }.joined(separator: ",") + "}"), .text(owner.name), .text(owner.incarnation)])
    }

    static func milliseconds(_ value: UInt64) -> PGValue { .int(Int64(value)) }

    /// The layout of the cluster's tables, kept in `taskloop.cluster.schema`. Each migration
    /// runs once, in order, in one transaction with the version's update; a replica refuses a
    /// cluster whose tables are newer than it knows. The newest migration's: a version kept by
    /// hand fell behind its migrations once, and a cluster at it never ran the newer ones.
    public static let schemaVersion = migrations[migrations.count - 1].version

    struct Migration {
        let version: Int
        let statements: [PGQuery]
    }

    static let migrations = [
        Migration(version: 1, statements: [
            PGQuery("""
                CREATE TABLE IF NOT EXISTS taskloop.members (name text PRIMARY KEY, incarnation text NOT NULL,
                    address text NOT NULL, protocol int NOT NULL, started_at timestamptz NOT NULL, expires_at timestamptz NOT NULL)
                """),
            PGQuery("""
                CREATE TABLE IF NOT EXISTS taskloop.cells (cell int PRIMARY KEY, owner text, incarnation text,
                    epoch bigint NOT NULL DEFAULT 0, lease_until timestamptz, commit_token text)
                """),
            PGQuery("INSERT INTO taskloop.cells (cell) SELECT generate_series(0, cells - 1) FROM taskloop.cluster "
                    + "ON CONFLICT (cell) DO NOTHING"),
            // A cell's commit starts with this: it fails (and with it the transaction) unless the
            // row still names the committer under its epoch, and it leaves the commit's token in
            // the row. The row lock makes a claim wait for commits under way and commits wait for
            // a claim under way, so no write of a deposed owner lands after the claim that
            // deposed it; the token tells, after a connection lost during a commit, whether it
            // committed (a cell's commits are in order: the row shows the last that did).
            PGQuery("""
                CREATE OR REPLACE FUNCTION taskloop.fence_commits(p_cells int[], p_epochs bigint[], p_owner text,
                    p_incarnation text, p_token text) RETURNS void LANGUAGE plpgsql AS $$
                DECLARE
                    marked int;
                    lost int[];
                BEGIN
                    -- One statement locks the rows (in the cells' order, as every statement that
                    -- locks several of them: no deadlock), checks and marks them: it runs in every
                    -- commit. Only a commit that finds a cell lost looks further.
                    UPDATE taskloop.cells SET commit_token = p_token
                    WHERE cell = ANY(p_cells) AND cell IN (SELECT cell FROM taskloop.cells WHERE cell = ANY(p_cells) ORDER BY cell FOR UPDATE)
                        AND owner = p_owner AND incarnation = p_incarnation AND (cell, epoch) IN (SELECT * FROM unnest(p_cells, p_epochs));
                    GET DIAGNOSTICS marked = ROW_COUNT;
                    IF marked < cardinality(p_cells) THEN
                        SELECT array_agg(f.cell ORDER BY f.cell) INTO lost FROM unnest(p_cells, p_epochs) AS f(cell, epoch)
                        WHERE NOT EXISTS (SELECT 1 FROM taskloop.cells c WHERE c.cell = f.cell AND c.owner = p_owner
                            AND c.incarnation = p_incarnation AND c.epoch = f.epoch);
                        RAISE EXCEPTION 'cells % are no longer held by %', lost, p_owner USING ERRCODE = '\(ClusterSchema.deposedState)';
                    END IF;
                END $$
                """),
        ] + ClusterEvents.setUp + ClusterMessages.setUp + CellSchema.setUp),
        // The webhooks version (`ClusterWebhooks`): raised by each change of the webhooks, and
        // the one each member has read.
        Migration(version: 2, statements: [
            PGQuery("ALTER TABLE taskloop.cluster ADD COLUMN IF NOT EXISTS webhooks bigint NOT NULL DEFAULT 0"),
            PGQuery("ALTER TABLE taskloop.members ADD COLUMN IF NOT EXISTS webhooks bigint NOT NULL DEFAULT 0"),
        ]),
        // Whether the member follows the cluster's events (`CellKeeper.followsEvents`):
        // committers announce their events only while one does.
        Migration(version: 3, statements: [
            PGQuery("ALTER TABLE taskloop.members ADD COLUMN IF NOT EXISTS follows_events boolean NOT NULL DEFAULT false"),
        ]),
        // The unique keys of tasks retention forgot (`CellSchema.uniqueKeysSetUp`).
        Migration(version: 4, statements: CellSchema.uniqueKeysSetUp),
        // A queue's cap on running tasks per concurrency key (NULL: none).
        Migration(version: 5, statements: CellSchema.keyConcurrencySetUp),
        // Queues' rate limits (`CellSchema.rateLimitsSetUp`).
        Migration(version: 6, statements: CellSchema.rateLimitsSetUp),
        // The cells' schedules (`CellSchema.schedulesSetUp`).
        Migration(version: 7, statements: CellSchema.schedulesSetUp),
        // Which schedule each event is of (`ClusterEvents.scheduleSetUp`).
        Migration(version: 8, statements: ClusterEvents.scheduleSetUp),
    ]

    /// Whether the cluster's tables exist; then `schemaState` reads their version.
    static let clusterExists = PGQuery("SELECT to_regclass('taskloop.cluster') IS NOT NULL")
    static let schemaState = PGQuery("SELECT schema FROM taskloop.cluster")

    /// The first half of a migration, on a connection of its own use: a transaction that holds
    /// the set-up lock (so replicas starting together migrate once), makes the cluster's row if
    /// there is none, and reads the tables' version; `migrate(from:)` finishes it.
    static func beginMigration(_ settings: CellKeeper.Settings) -> [PGQuery] {
        [
            PGQuery("BEGIN"),
            PGQuery("SELECT pg_advisory_xact_lock(\(setUpLock))"),
            PGQuery("CREATE SCHEMA IF NOT EXISTS taskloop"),
            PGQuery("CREATE TABLE IF NOT EXISTS taskloop.cluster (id int PRIMARY KEY CHECK (id = 1), cells int NOT NULL, "
                    + "protocol int NOT NULL, schema int NOT NULL)"),
            PGQuery("INSERT INTO taskloop.cluster VALUES (1, $1, $2, 0) ON CONFLICT (id) DO NOTHING",
                    [.int(settings.cells), .int(settings.protocolVersion)]),
            turnTablesExist,
            schemaState,
        ]
    }

    /// Replicas of v2 took turns and kept their tasks in `taskloop.tasks` beside `taskloop.state`;
    /// cells never read those tables. A cluster is not made over unfinished tasks of theirs
    /// (they would be lost to every client): v2 replicas finish them first.
    static let turnTablesExist = PGQuery("SELECT to_regclass('taskloop.state') IS NOT NULL AND to_regclass('taskloop.tasks') IS NOT NULL")
    static let turnTasks = PGQuery("SELECT record FROM taskloop.tasks", binaryResults: true)


    /// The migrations after `version` up to this replica's, the version's update and the commit.
    static func migrate(from version: Int) -> [PGQuery] {
        migrations.filter { $0.version > version }.flatMap(\.statements)
            + [PGQuery("UPDATE taskloop.cluster SET schema = $1", [.int(schemaVersion)]), PGQuery("COMMIT")]
    }

    /// Registers the replica in a cluster whose tables are current. A replica of a newer
    /// protocol raises the cluster's: the older replicas then hand their cells over and leave
    /// (`RenewalAnswer.isSuperseded`), and an older one can no longer join.
    static func setUp(_ settings: CellKeeper.Settings, takingTheNameOver: Bool) -> [PGQuery] {
        let me = settings.identity
        let lease = milliseconds(settings.ownership.leaseMilliseconds)
        // A reconnect refreshes the row only while it is still this process's. A new process
        // has read no webhooks version yet (`ClusterWebhooks`).
        let takeOver = takingTheNameOver ? "" : " WHERE taskloop.members.incarnation = excluded.incarnation"
        return [
            // A renewal that cannot finish within a renewal interval is as good as lost; the
            // ownership rules then decide, on time.
            PGQuery("SET statement_timeout = \(settings.ownership.renewalInterval)"),
            PGQuery("SET idle_in_transaction_session_timeout = \(settings.ownership.renewalInterval)"),
            PGQuery("UPDATE taskloop.cluster SET protocol = $1 WHERE protocol < $1", [.int(settings.protocolVersion)]),
            PGQuery("SELECT cells, protocol FROM taskloop.cluster"),
            PGQuery("""
                INSERT INTO taskloop.members (name, incarnation, address, protocol, started_at, expires_at)
                VALUES ($1, $2, $3, $4, clock_timestamp(), clock_timestamp() + $5 * interval '1 millisecond')
                ON CONFLICT (name) DO UPDATE SET incarnation = excluded.incarnation, address = excluded.address,
                    protocol = excluded.protocol, started_at = excluded.started_at, expires_at = excluded.expires_at,
                    webhooks = CASE WHEN taskloop.members.incarnation = excluded.incarnation THEN taskloop.members.webhooks ELSE 0 END\(takeOver)
                """, [.text(me.name), .text(me.incarnation), .text(settings.address), .int(settings.protocolVersion), lease]),
            announceChange(settings),
        ]
    }

    static let renewMember = PGStatement("cells_renew_member", """
        UPDATE taskloop.members SET expires_at = clock_timestamp() + $3 * interval '1 millisecond', follows_events = $4
        WHERE name = $1 AND incarnation = $2
        """)
    static let markFollowing = PGStatement("cells_mark_following", """
        UPDATE taskloop.members SET follows_events = true WHERE name = $1 AND incarnation = $2
        """)
    static let renewCells = PGStatement("cells_renew_cells", """
        UPDATE taskloop.cells SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
        WHERE cell IN (SELECT cell FROM taskloop.cells WHERE owner = $1 AND incarnation = $2 ORDER BY cell FOR UPDATE)
            AND owner = $1 AND incarnation = $2 AND EXISTS (SELECT 1 FROM taskloop.members WHERE name = $1 AND incarnation = $2)
        """)
    static let liveMembers = PGStatement("cells_live_members", """
        SELECT name, address, protocol, follows_events FROM taskloop.members WHERE expires_at > clock_timestamp() ORDER BY name
        """)
    static let clusterProtocol = PGStatement("cells_cluster_protocol", "SELECT protocol, webhooks FROM taskloop.cluster")
    static let cellRows = PGStatement("cells_rows", """
        SELECT cell, owner, incarnation, epoch,
            owner IS NOT NULL AND lease_until + $1 * interval '1 millisecond' < clock_timestamp()
        FROM taskloop.cells ORDER BY cell
        """)
    static let claimCell = PGStatement("cells_claim", """
        UPDATE taskloop.cells SET owner = $2, incarnation = $3, epoch = epoch + 1,
            lease_until = clock_timestamp() + $4 * interval '1 millisecond'
        WHERE cell = $1 AND epoch = $5
            AND (owner IS NULL OR (owner = $2 AND incarnation = $3) OR lease_until + $6 * interval '1 millisecond' < clock_timestamp())
        RETURNING epoch
        """)
    static let releaseCell = PGStatement("cells_release", """
        UPDATE taskloop.cells SET owner = NULL, incarnation = NULL, lease_until = NULL
        WHERE cell = $1 AND owner = $2 AND incarnation = $3 AND epoch = $4
        """)
    static let removeMember = PGStatement("cells_remove_member", "DELETE FROM taskloop.members WHERE name = $1 AND incarnation = $2")

    /// One transaction: this replica's row and its cells' leases, then who is live and every
    /// cell's row.
    static func renewal(_ settings: CellKeeper.Settings, followsEvents: Bool) -> [PGQuery] {
        let me = [PGValue.text(settings.identity.name), .text(settings.identity.incarnation),
                  milliseconds(settings.ownership.leaseMilliseconds)]
        return [
            PGQuery("BEGIN"),
            PGQuery(renewMember, me + [.bool(followsEvents)]),
            PGQuery(renewCells, me),
            PGQuery(liveMembers),
            PGQuery(cellRows, [milliseconds(settings.ownership.marginMilliseconds)]),
            PGQuery(clusterProtocol),
            PGQuery("COMMIT"),
        ]
    }

    struct Renewal {
        var answer: RenewalAnswer
        var addresses: [String: String]
        var owners: [Cell: ReplicaIdentity]
        var clusterProtocol: Int
        var webhooksVersion: Int64
        /// Some live member follows the cluster's events.
        var eventsFollowed: Bool
    }

    /// Marks this replica as following the cluster's events at once (a renewal keeps the mark
    /// after), and has the others renew now, so that they learn it.
    static func markFollowingEvents(_ settings: CellKeeper.Settings) -> [PGQuery] {
        [PGQuery(markFollowing, [.text(settings.identity.name), .text(settings.identity.incarnation)]), announceChange(settings)]
    }

    static func readRenewal(_ results: [PGResult], protocolVersion: Int) -> Renewal {
        let isRegistered = results[1].affectedRows == 1
        let members = results[3], rows = results[4]
        // Only replicas of this one's protocol own cells with it; a live one of an older
        // protocol is still handing its cells over, and none may be claimed until it is gone.
        var addresses: [String: String] = [:]
        var olderMembersLive = false
        var eventsFollowed = false
        for row in 0..<members.rowCount {
            guard let name = members.text(row, 0) else { continue }
            if members.bool(row, 3) == true { eventsFollowed = true }
            let version = Int(members.int(row, 2) ?? 0)
            if version == protocolVersion { addresses[name] = members.text(row, 1) ?? "" }
            if version < protocolVersion { olderMembersLive = true }
        }
        let clusterProtocol = Int(results[5].int(0, 0) ?? 0)
        var cells: [CellRow] = []
        var owners: [Cell: ReplicaIdentity] = [:]
        cells.reserveCapacity(rows.rowCount)
        for row in 0..<rows.rowCount {
            guard let index = rows.int(row, 0), let epoch = rows.int(row, 3) else { continue }
            let cell = Cell(UInt16(truncatingIfNeeded: index))
            var owner: ReplicaIdentity?
            if let name = rows.text(row, 1), let incarnation = rows.text(row, 2) {
                owner = ReplicaIdentity(name: name, incarnation: incarnation)
                owners[cell] = owner
            }
            cells.append(CellRow(cell: cell, owner: owner, epoch: UInt64(epoch), expired: rows.bool(row, 4) ?? false))
        }
        var answer = RenewalAnswer(isRegistered: isRegistered, live: addresses.keys.sorted(), cells: cells)
        answer.isSuperseded = clusterProtocol > protocolVersion
        answer.olderMembersLive = olderMembersLive
        return Renewal(answer: answer, addresses: addresses, owners: owners, clusterProtocol: clusterProtocol,
                       webhooksVersion: results[5].int(0, 1) ?? 0, eventsFollowed: eventsFollowed)
    }

    static func claim(_ cell: Cell, from epoch: UInt64, _ settings: CellKeeper.Settings) -> PGQuery {
        PGQuery(claimCell, [.int(Int(cell.index)), .text(settings.identity.name), .text(settings.identity.incarnation),
                            milliseconds(settings.ownership.leaseMilliseconds), .int(Int64(epoch)),
                            milliseconds(settings.ownership.marginMilliseconds)])
    }

    static func release(_ cell: Cell, epoch: UInt64, _ settings: CellKeeper.Settings) -> PGQuery {
        PGQuery(releaseCell, [.int(Int(cell.index)), .text(settings.identity.name), .text(settings.identity.incarnation),
                              .int(Int64(epoch))])
    }

    static func deregister(_ settings: CellKeeper.Settings) -> PGQuery {
        PGQuery(removeMember, [.text(settings.identity.name), .text(settings.identity.incarnation)])
    }
}
