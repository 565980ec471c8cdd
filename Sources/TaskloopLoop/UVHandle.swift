import CLibUV

/// Allocation and release of libuv handles.
///
/// A handle's memory belongs to the handle until libuv calls its close callback: it is allocated
/// here, its `data` field holds a retained reference to the Swift object that owns it, and both
/// are released only in `closeCallback`. So an owner can never be deinitialised while libuv
/// still points at its handle, and every handle must be closed (`close`) to be freed.
package enum UVHandle {
    /// Allocates a handle and runs its `uv_*_init`; on failure frees it again and throws.
    /// The owner is attached afterwards with `adopt`.
    package static func make<Handle>(
        _: Handle.Type, _ operation: StaticString, initialize: (UnsafeMutablePointer<Handle>) -> Int32
    ) throws(UVError) -> UnsafeMutablePointer<Handle> {
        let handle = UnsafeMutablePointer<Handle>.allocate(capacity: 1)
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) { $0.pointee.data = nil }
        do {
            try UVError.check(initialize(handle), operation)
        } catch {
            // A handle whose init failed was never registered with the loop.
            handle.deallocate()
            throw error
        }
        return handle
    }

    /// Makes `owner` the handle's owner, retained until the close callback. `uv_*_init` leaves
    /// `data` alone, so this comes after it.
    package static func adopt<Handle>(_ handle: UnsafeMutablePointer<Handle>, owner: AnyObject) {
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) {
            precondition($0.pointee.data == nil, "handle already owned")
            $0.pointee.data = Unmanaged.passRetained(owner).toOpaque()
        }
    }

    package static func close<Handle>(_ handle: UnsafeMutablePointer<Handle>) {
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) { raw in
            if uv_is_closing(raw) == 0 { uv_close(raw, closeCallback) }
        }
    }

    package static func owner<Owner: AnyObject>(_ handle: UnsafeMutableRawPointer?, as _: Owner.Type) -> Owner {
        let data = handle!.assumingMemoryBound(to: uv_handle_t.self).pointee.data!
        return Unmanaged<Owner>.fromOpaque(data).takeUnretainedValue()
    }
}

/// Implemented by owners that need to hear that their handle is gone (e.g. to drop bookkeeping).
package protocol UVHandleClosing: AnyObject {
    func handleDidClose()
}

private let closeCallback: uv_close_cb = { raw in
    guard let raw else { return }
    if let data = raw.pointee.data {
        let owner = Unmanaged<AnyObject>.fromOpaque(data)
        raw.pointee.data = nil
        (owner.takeUnretainedValue() as? UVHandleClosing)?.handleDidClose()
        owner.release()
    }
    UnsafeMutableRawPointer(raw).deallocate()
}
