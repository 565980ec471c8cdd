/// An event as a stream writes it: its `id:`, `event:` and `data:` lines, rendered once.
protocol FramedEvent: FilterableEvent {
    var frame: [UInt8] { get }
    /// The frame of a stream with `?progress_body=brief`: a `task.progress` with the task's
    /// `id, queue, workflow, state, attempt, progress` only; `frame` for any other event.
    var briefFrame: [UInt8] { get }
}

extension FramedEvent {
    /// The frame a stream with `filter` sends.
    func frame(for filter: EventFilter) -> [UInt8] {
        filter.briefProgress ? briefFrame : frame
    }
}

/// The streams that follow live with the same filter (most often none, or one type) are given
/// one rendering of what a delivery brought them: the matching frames concatenated once, then
/// the same bytes (one array, shared by reference) queued on each of those streams and written
/// from there without a copy (`HTTPResponder.write` copies only what a socket does not take at
/// once). With 100 streams that is one filter pass and one concatenation per delivery instead
/// of 100 of each.
///
/// A stream belongs to the group of its filter from its start (`group(for:)`); a group lives as
/// long as one of its streams does.
///
/// Threading: loop thread only.
final class SharedFrames {
    final class Group {
        let filter: EventFilter
        /// The delivery `bytes` was rendered for.
        fileprivate var delivery: UInt64 = 0
        fileprivate var bytes: [UInt8] = []

        fileprivate init(filter: EventFilter) {
            self.filter = filter
        }
    }

    private struct WeakGroup {
        weak var group: Group?
    }

    private var groups: [EventFilter: WeakGroup] = [:]
    private var delivery: UInt64 = 0
    /// Groups rendered in the current delivery: their bytes are let go when it ends.
    private var rendered: [Group] = []

    /// The group of streams with `filter`.
    func group(for filter: EventFilter) -> Group {
        if let group = groups[filter]?.group { return group }
        // The filters of ended streams go whenever the table has doubled since it was last swept.
        if groups.count >= sweepAt {
            groups = groups.filter { $0.value.group != nil }
            sweepAt = max(64, 2 * groups.count)
        }
        let group = Group(filter: filter)
        groups[filter] = WeakGroup(group: group)
        return group
    }

    private var sweepAt = 64

    /// Renders `events` for the streams of each group as they ask (`frames`), then lets the
    /// renderings go: a delivery's bytes live as long as a stream still has them to write.
    func deliver<Event: FramedEvent>(_ events: some Collection<Event>, _ body: (_ frames: (Group) -> [UInt8]) -> Void) {
        delivery &+= 1
        body { group in
            if group.delivery != delivery {
                group.delivery = delivery
                var bytes: [UInt8] = []
                for event in events where group.filter.matches(event) { bytes += event.frame(for: group.filter) }
                group.bytes = bytes
                rendered.append(group)
            }
            return group.bytes
        }
        for group in rendered { group.bytes = [] }
        rendered.removeAll(keepingCapacity: true)
    }
}
