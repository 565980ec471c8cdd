/// Objects in the order first inserted, each once. A settled batch usually names one or two,
/// looked for by a scan; past `scanLimit` a set answers, so a turn that fires 10,000 schedules
/// or settles thousands of workflows costs linear time, not quadratic. Inlinable: it sits on
/// every request's path in other modules, where an unspecialised generic would cost more than
/// the scan.
public struct OrderedObjects<Element: AnyObject> {
    @usableFromInline var stored: [Element] = []
    @usableFromInline var members: Set<ObjectIdentifier>?
    @usableFromInline static var scanLimit: Int { 16 }

    @inlinable public init() {}

    @inlinable public var elements: [Element] { stored }

    @inlinable public var isEmpty: Bool { stored.isEmpty }

    @inlinable public func contains(_ element: Element) -> Bool {
        if let members { return members.contains(ObjectIdentifier(element)) }
        return stored.contains { $0 === element }
    }

    @inlinable public mutating func insert(_ element: Element) {
        guard !contains(element) else { return }
        stored.append(element)
        if members != nil {
            members!.insert(ObjectIdentifier(element))
        } else if stored.count > Self.scanLimit {
            members = Set(stored.lazy.map(ObjectIdentifier.init))
        }
    }

    /// Removals are rare (a schedule deleted, a workflow emptied): a scan, only when it is here.
    @inlinable public mutating func remove(_ element: Element) {
        guard contains(element) else { return }
        stored.removeAll { $0 === element }
        members?.remove(ObjectIdentifier(element))
    }

    @inlinable public mutating func removeAll(where shouldRemove: (Element) -> Bool) {
        stored.removeAll { element in
            guard shouldRemove(element) else { return false }
            members?.remove(ObjectIdentifier(element))
            return true
        }
    }
}
