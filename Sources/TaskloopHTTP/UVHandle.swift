import CLibUV

/// Allocation and release of libuv handles.
///
/// A handle's memory belongs to the handle until libuv calls its close callback: it is allocated
/// here, its `data` field holds a retained reference to the Swift object that owns it, and both
/// are released only in `closeCallback`. So an owner can never be deinitialised while libuv
/// still points at its handle, and every handle must be closed (`close`) to be freed.
enum UVHandle {
    static func allocate<Handle>(_: Handle.Type, owner: AnyObject? = nil) -> UnsafeMutablePointer<Handle> {
        let handle = UnsafeMutablePointer<Handle>.allocate(capacity: 1)
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) { $0.pointee.data = nil }
        if let owner { adopt(handle, owner: owner) }
        return handle
    }

    /// Makes `owner` the handle's owner (retained until the close callback). For owners that
    /// can only name themselves after their own initialisation. Call after `uv_*_init`, which
    /// leaves `data` alone.
    static func adopt<Handle>(_ handle: UnsafeMutablePointer<Handle>, owner: AnyObject) {
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) {
            precondition($0.pointee.data == nil, "handle already owned")
            $0.pointee.data = Unmanaged.passRetained(owner).toOpaque()
        }
    }

    /// Frees memory of a handle whose `uv_*_init` failed; such a handle was never registered.
    static func deallocateUninitialised<Handle>(_ handle: UnsafeMutablePointer<Handle>) {
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) { raw in
            if let data = raw.pointee.data { Unmanaged<AnyObject>.fromOpaque(data).release() }
        }
        handle.deallocate()
    }

    static func close<Handle>(_ handle: UnsafeMutablePointer<Handle>) {
        handle.withMemoryRebound(to: uv_handle_t.self, capacity: 1) { raw in
            if uv_is_closing(raw) == 0 { uv_close(raw, closeCallback) }
        }
    }

    static func owner<Owner: AnyObject>(_ handle: UnsafeMutableRawPointer?, as _: Owner.Type) -> Owner {
        let data = handle!.assumingMemoryBound(to: uv_handle_t.self).pointee.data!
        return Unmanaged<Owner>.fromOpaque(data).takeUnretainedValue()
    }
}

/// Implemented by owners that need to hear that their handle is gone (e.g. to drop bookkeeping).
protocol UVHandleClosing: AnyObject {
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
