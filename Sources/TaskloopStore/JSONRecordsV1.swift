import TaskloopEngine
import TaskloopJSON

/// Records as schema version 1 kept them, a JSON object per row: read only by the migration to
/// version 2, which rewrites them in `RecordCodec`'s binary form.
enum JSONRecordsV1 {
    static func decodeTask(_ bytes: [UInt8]) throws(RecordDecodingError) -> TaskSnapshot {
        let reader = try Reader(bytes, table: "tasks")
        let retry = try reader.object("retry")
        let error = try reader.optionalObject("error")
        let progress = try reader.optionalObject("progress")
        return TaskSnapshot(
            id: try reader.id("id"), sequence: UInt64(try reader.integer("sequence")), kind: try reader.string("kind"),
            params: reader.value("params") ?? .object([:]), name: try reader.optionalString("name"),
            queue: try reader.string("queue"), priority: Int(try reader.integer("priority")),
            dependencies: try reader.ids("dependencies"),
            onDependencyFailure: try reader.enumeration("on_dependency_failure"),
            timeoutMilliseconds: try reader.optionalInteger("timeout_ms").map { UInt64($0) },
            retry: RetryPolicy(maxAttempts: Int(try retry.integer("max_attempts")),
                               backoffMilliseconds: UInt64(try retry.integer("backoff_ms")),
                               backoffFactor: try retry.number("backoff_factor")),
            metadata: reader.value("metadata"), workflow: try reader.optionalID("workflow"),
            createdAt: try reader.integer("created_at"), state: try reader.enumeration("state"),
            cancelRequested: reader.value("cancel_requested")?.boolValue ?? false,
            attempt: Int(try reader.integer("attempt")), startedAt: try reader.optionalInteger("started_at"),
            finishedAt: try reader.optionalInteger("finished_at"), result: reader.value("result"),
            error: try error.map { error throws(RecordDecodingError) in
                TaskError(code: try error.string("code"), message: try error.string("message"),
                          details: error.value("details")?.objectValue ?? [:])
            },
            progress: try progress.map { progress throws(RecordDecodingError) in
                TaskProgress(fraction: progress.value("fraction")?.doubleValue, message: try progress.optionalString("message"),
                             details: progress.value("details"), updatedAt: try progress.optionalInteger("updated_at"))
            } ?? TaskProgress(),
            notBefore: try reader.optionalInteger("not_before"))
    }

    static func decodeWorkflow(_ bytes: [UInt8]) throws(RecordDecodingError) -> WorkflowSnapshot {
        let reader = try Reader(bytes, table: "workflows")
        guard let pairs = reader.value("keys")?.arrayValue else { throw reader.failure("keys is missing") }
        var keys: [WorkflowSnapshot.WorkflowKey] = []
        keys.reserveCapacity(pairs.count)
        for pair in pairs {
            guard let items = pair.arrayValue, items.count == 2, let key = items[0].stringValue,
                  let text = items[1].stringValue, let id = TaskID(text) else { throw reader.failure("a key is malformed") }
            keys.append(WorkflowSnapshot.WorkflowKey(key: key, id: id))
        }
        return WorkflowSnapshot(id: try reader.id("id"), name: try reader.optionalString("name"),
                                createdAt: try reader.integer("created_at"), keys: keys)
    }

    /// Typed reads of one stored object, each failing with the field it could not read.
    struct Reader {
        let object: JSONObject
        let table: String

        init(_ bytes: [UInt8], table: String) throws(RecordDecodingError) {
            self.table = table
            do {
                guard let object = try JSONParser.parse(bytes).objectValue else {
                    throw RecordDecodingError(table: table, reason: "not a JSON object")
                }
                self.object = object
            } catch let error as RecordDecodingError {
                throw error
            } catch {
                throw RecordDecodingError(table: table, reason: "\(error)")
            }
        }

        private init(object: JSONObject, table: String) {
            self.object = object
            self.table = table
        }

        func failure(_ reason: String) -> RecordDecodingError { RecordDecodingError(table: table, reason: reason) }

        func value(_ key: String) -> JSONValue? { object.nonNull(key) }

        func string(_ key: String) throws(RecordDecodingError) -> String {
            guard let text = value(key)?.stringValue else { throw failure("\(key) is not a string") }
            return text
        }

        func optionalString(_ key: String) throws(RecordDecodingError) -> String? {
            guard value(key) != nil else { return nil }
            return try string(key)
        }

        func integer(_ key: String) throws(RecordDecodingError) -> Int64 {
            guard let number = value(key)?.intValue else { throw failure("\(key) is not an integer") }
            return number
        }

        func optionalInteger(_ key: String) throws(RecordDecodingError) -> Int64? {
            guard value(key) != nil else { return nil }
            return try integer(key)
        }

        func number(_ key: String) throws(RecordDecodingError) -> Double {
            guard let number = value(key)?.doubleValue else { throw failure("\(key) is not a number") }
            return number
        }

        func id(_ key: String) throws(RecordDecodingError) -> TaskID {
            guard let id = TaskID(try string(key)) else { throw failure("\(key) is not a task id") }
            return id
        }

        func optionalID(_ key: String) throws(RecordDecodingError) -> TaskID? {
            guard value(key) != nil else { return nil }
            return try id(key)
        }

        func ids(_ key: String) throws(RecordDecodingError) -> [TaskID] {
            guard let list = value(key)?.arrayValue else { throw failure("\(key) is not a list") }
            var ids: [TaskID] = []
            ids.reserveCapacity(list.count)
            for item in list {
                guard let text = item.stringValue, let id = TaskID(text) else { throw failure("\(key) holds a bad id") }
                ids.append(id)
            }
            return ids
        }

        func enumeration<Value: RawRepresentable>(_ key: String) throws(RecordDecodingError) -> Value
            where Value.RawValue == String {
            guard let value = Value(rawValue: try string(key)) else { throw failure("\(key) has an unknown value") }
            return value
        }

        func object(_ key: String) throws(RecordDecodingError) -> Reader {
            guard let nested = value(key)?.objectValue else { throw failure("\(key) is not an object") }
            return Reader(object: nested, table: table)
        }

        func optionalObject(_ key: String) throws(RecordDecodingError) -> Reader? {
            guard value(key) != nil else { return nil }
            return try object(key)
        }
    }
}
