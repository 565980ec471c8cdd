import Foundation
import Testing
import TaskloopCluster
@testable import TaskloopService
import TaskloopTestSupport

/// Replicas on cells for the cell tests (`CellServiceTests.cellCount` cells, `full` durability,
/// in-process), and the wait until none of their cells moves: a request for a moving cell may
/// wait or be refused.
extension CellServiceTests {
    static func cellReplica(_ url: String, name: String, _ configure: (inout ServiceConfiguration) -> Void = { _ in })
        throws -> ServiceHarness {
        try ServiceHarness(replicas: 1) { configuration in
            var settings = SharedDatabaseSettings(url: url, replica: name)
            settings.cells = cellCount
            configuration.sharedDatabase = settings
            configuration.durability = .full
            configure(&configuration)
        }
    }

    /// Replicas named `names` on the cells of `url` (a new database when nil), once each serves
    /// the cells rendezvous hashing gives it.
    static func startCellReplicas(_ names: String..., on url: String? = nil,
                                  configure: (inout ServiceConfiguration) -> Void = { _ in })
        throws -> (url: String, replicas: [ServiceHarness]) {
        try startCellReplicas(named: names, on: url, configure: configure)
    }

    static func startCellReplicas(named names: [String], on url: String? = nil,
                                  configure: (inout ServiceConfiguration) -> Void = { _ in })
        throws -> (url: String, replicas: [ServiceHarness]) {
        let url = try url ?? PostgresCluster.shared().makeDatabase()
        let replicas = try names.map { try cellReplica(url, name: $0, configure) }
        try waitForEveryCell(replicas)
        return (url, replicas)
    }

    /// The replica among `replicas` that serves the cell of `queue`, and one that does not
    /// (the two cell-move tests start: stop the first, and the second takes the cell).
    static func ownerOfQueue(_ queue: String, among replicas: [ServiceHarness])
        throws -> (owner: ServiceHarness, survivor: ServiceHarness) {
        let owner = try #require(replicas.first { replica in
            replica.onLoop { application in
                let host = application.cellHost!
                return host.hostedCells.contains(host.cell(ofQueue: queue))
            }
        })
        return (owner, try #require(replicas.first { $0 !== owner }))
    }

    /// Until each replica serves exactly the cells rendezvous hashing gives it: no cell moves.
    static func waitForEveryCell(_ services: [ServiceHarness], timeout: Double = 20) throws {
        let names = services.map { service in service.onLoop { $0.configuration.sharedDatabase!.replica } }
        try pollUntil("the cells to spread over \(services.count) replicas", timeout: timeout) {
            services.allSatisfy { service in
                service.onLoop { application in
                    guard let host = application.cellHost else { return false }
                    let mine = application.configuration.sharedDatabase!.replica
                    let assigned = Rendezvous.assignment(host.layout, among: names).filter { $0.value == mine }.keys.sorted()
                    return host.openEngines.compactMap(\.cell).map(Cell.init) == assigned && host.hostedCells == assigned
                }
            }
        }
    }
}

/// A session of `psql` that holds the row of one cell in `taskloop.cells` (`FOR UPDATE`), so
/// the commits and claims of that cell wait on it, or another lock `locking` takes, until
/// `release`.
final class CellRowLock {
    private let psql = Process()
    private let input = Pipe()

    convenience init(_ cell: UInt16, url: String) throws {
        try self.init(locking: "SELECT 1 FROM taskloop.cells WHERE cell = \(cell) FOR UPDATE", url: url)
    }

    init(locking statement: String, url: String) throws {
        psql.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
        psql.arguments = [url, "-qAt", "-v", "ON_ERROR_STOP=1"]
        psql.standardInput = input
        psql.standardOutput = FileHandle.nullDevice
        try psql.run()
        input.fileHandleForWriting.write(Data("BEGIN;\n\(statement);\n".utf8))
    }

    /// Commits, which lets the row go, and waits for `psql` to end.
    func release() throws {
        input.fileHandleForWriting.write(Data("COMMIT;\n".utf8))
        try input.fileHandleForWriting.close()
        _ = try psql.waitForExit("psql holding a cell's row to end", timeout: 10)
    }
}
