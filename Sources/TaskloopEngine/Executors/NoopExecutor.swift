import TaskloopJSON

/// `noop`: finishes at once (a join point, like dispatch_group_notify).
public final class NoopExecutor: TaskExecutor {
    public init() {}

    public func validate(_ params: JSONValue) throws(EngineError) {
        guard let object = params.objectValue else { throw EngineError(.invalid, "params must be an object.", field: "") }
        if let key = object.keys.first { throw EngineError(.invalid, "Unknown parameter \(key): noop takes none.", field: key) }
    }

    public func start(_ run: TaskRun) {
        run.succeed()
    }
}
