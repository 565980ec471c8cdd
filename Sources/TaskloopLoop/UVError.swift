import CLibUV

/// A failed libuv call. Every `uv_*` return code is checked once, here, and carried upward as
/// this type; nothing above the shim sees a raw libuv status.
public struct UVError: Error, Equatable, CustomStringConvertible {
    public let code: Int32
    public let operation: StaticString

    /// libuv's symbolic name for the code, e.g. `EADDRINUSE`.
    public var name: String { String(cString: uv_err_name(code)) }

    public var description: String {
        "\(operation) failed: \(name) (\(String(cString: uv_strerror(code))))"
    }

    public static func == (lhs: UVError, rhs: UVError) -> Bool { lhs.code == rhs.code }

    @inline(__always)
    @discardableResult
    package static func check(_ status: Int32, _ operation: StaticString) throws(UVError) -> Int32 {
        if status < 0 { throw UVError(code: status, operation: operation) }
        return status
    }
}
