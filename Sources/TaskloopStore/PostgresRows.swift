import TaskloopEngine
import TaskloopPostgres

/// The records of the cluster's tables as rows come back from PostgreSQL: each read lists the
/// columns in the order these take them.
enum PostgresRows {
    static func tasks(_ rows: PGResult) throws -> [TaskSnapshot] {
        var tasks: [TaskSnapshot] = []
        tasks.reserveCapacity(rows.rowCount)
        for row in 0..<rows.rowCount {
            let bytes = rows.bytes(row, 1) ?? []
            let sequence = UInt64(rows.int(row, 0) ?? 0)
            tasks.append(try bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) in
                try RecordCodec.decodeTask(buffer, sequence: sequence)
            })
        }
        return tasks
    }

    static func workflows(_ rows: PGResult) throws -> [WorkflowSnapshot] {
        try (0..<rows.rowCount).map { row in
            guard let id = rows.text(row, 0).flatMap({ TaskID($0) }) else { throw RecordDecodingError(table: "workflows", reason: "a bad id") }
            let bytes = rows.bytes(row, 1) ?? []
            return try bytes.withUnsafeBytes { (buffer) throws(RecordDecodingError) in try RecordCodec.decodeWorkflow(buffer, id: id) }
        }
    }

    static func queues(_ rows: PGResult) -> [QueueSnapshot] {
        (0..<rows.rowCount).map { row in
            QueueSnapshot(name: rows.text(row, 0) ?? "", maxConcurrency: Int(rows.int(row, 1) ?? 1), paused: rows.bool(row, 2) ?? false,
                          dispatch: QueueDispatch(rawValue: rows.text(row, 3) ?? "") ?? .server,
                          keyConcurrency: rows.int(row, 4).map { Int($0) },
                          rateLimit: rows.text(row, 5).flatMap(Double.init).map { RateLimit(perSecond: $0, burst: Int(rows.int(row, 6) ?? 1)) })
        }
    }

    static func keys(_ rows: PGResult) -> [IdempotencyRecord] {
        (0..<rows.rowCount).map { row in
            IdempotencyRecord(key: rows.text(row, 0) ?? "", requestHash: rows.bytes(row, 1) ?? [], status: Int(rows.int(row, 2) ?? 0),
                              resource: rows.text(row, 3) ?? "", expiresAt: rows.int(row, 4) ?? 0)
        }
    }

    static func uniqueKeys(_ rows: PGResult) throws -> [UniqueKeyTombstone] {
        try (0..<rows.rowCount).map { row in
            guard let id = rows.text(row, 2).flatMap({ TaskID($0) }) else { throw RecordDecodingError(table: "unique_keys", reason: "a bad id") }
            return UniqueKeyTombstone(queue: rows.text(row, 0) ?? "", key: rows.text(row, 1) ?? "", id: id,
                                      finishedAt: rows.int(row, 3) ?? 0)
        }
    }
}
