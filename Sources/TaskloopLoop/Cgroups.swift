import Glibc

/// Where the `exec` programs of this process get cgroups (cgroup v2) of their own: one per
/// attempt, under `path`, so that everything an attempt started can be killed at once with
/// `cgroup.kill`, whatever its processes did to leave their process group or to shed the
/// environment cookie. Membership is the kernel's: it passes to every child a process forks,
/// and only a process allowed to write to an ancestor's `cgroup.procs` can leave.
///
/// `path` is `<this process's cgroup>/taskloop`, named by nothing of this process: a server
/// started again after a crash (in the same cgroup, as a service manager or a shell starts it
/// again) finds there the cgroups of the attempts its predecessor left running. Servers in one
/// cgroup share it; the cgroups under it are named by task and attempt, unique across servers.
/// It is never removed: another server may be making a cgroup in it at that moment.
///
/// Threading: a value; its methods touch only the cgroup file system, from any thread.
public struct CgroupParent: Sendable {
    public let path: String

    /// The program that moves itself into the attempt's cgroup and then becomes the task's
    /// program (`ChildProcess`). A shell, found where POSIX puts one.
    static let shell = "/bin/sh"

    /// Finds the cgroup v2 hierarchy and this process's place in it, makes (or finds) the
    /// parent, and checks that programs can be moved into cgroups under it and killed whole.
    /// Throws why not, in words for the log: not mounted (cgroup v1 only), read-only (a
    /// container), not delegated to this user, or a kernel without `cgroup.kill` (before 5.14).
    public static func probe() throws(CgroupError) -> CgroupParent {
        guard access(shell, X_OK) == 0 else { throw CgroupError("\(shell) is missing: it moves each program into its cgroup") }
        guard let own = readFile("/proc/self/cgroup")?.split(separator: "\n").first(where: { $0.hasPrefix("0::") })
            .map({ String($0.dropFirst(3)) }) else {
            throw CgroupError("this process is in no cgroup v2 hierarchy (/proc/self/cgroup has no 0:: line)")
        }
        guard let directory = readFile("/proc/self/mountinfo").flatMap({ mountedDirectory(of: own, in: $0) }) else {
            throw CgroupError("no cgroup2 file system is mounted where this process's cgroup \(own) can be reached")
        }
        let parent = CgroupParent(path: directory == "/" ? "/taskloop" : directory + "/taskloop")
        if mkdir(parent.path, 0o755) != 0 && errno != EEXIST {
            throw CgroupError("cannot create \(parent.path): \(String(cString: strerror(errno)))")
        }
        guard access(parent.path + "/cgroup.kill", W_OK) == 0 else {
            throw CgroupError("\(parent.path)/cgroup.kill is missing or not writable (it needs Linux 5.14 or later)")
        }
        // Moving a process between two cgroups takes write access to both ends' cgroup.procs
        // and to that of their common ancestor: this process's own cgroup.
        for procs in [directory + "/cgroup.procs", parent.path + "/cgroup.procs"] where access(procs, W_OK) != 0 {
            throw CgroupError("cannot move processes through \(procs): \(String(cString: strerror(errno)))")
        }
        return parent
    }

    /// The directory of cgroup `path` (as /proc/self/cgroup writes it) in a mounted cgroup2 file
    /// system, from `mountInfo` (/proc/self/mountinfo). A mount shows the hierarchy from its root
    /// (field 4) down, so the path is taken relative to it; a mount whose root is not above the
    /// cgroup (another container's) cannot reach it.
    package static func mountedDirectory(of path: String, in mountInfo: String) -> String? {
        for line in mountInfo.split(separator: "\n") {
            let halves = line.split(separator: " - ", maxSplits: 1)
            guard halves.count == 2, halves[1].split(separator: " ").first == "cgroup2" else { continue }
            let fields = halves[0].split(separator: " ")
            guard fields.count >= 5 else { continue }
            let root = unescape(fields[3]), mountPoint = unescape(fields[4])
            let below: Substring
            if root == "/" {
                below = path[...]
            } else if path == root || path.hasPrefix(root + "/") {
                below = path.dropFirst(root.count)
            } else {
                continue
            }
            let directory = mountPoint == "/" ? String(below) : mountPoint + (below == "/" ? "" : below)
            return directory.isEmpty ? "/" : directory
        }
        return nil
    }

    /// mountinfo writes space, tab, newline and backslash in paths as `\ooo`.
    private static func unescape(_ field: Substring) -> String {
        var bytes: [UInt8] = []
        var rest = Array(field.utf8)[...]
        while let byte = rest.popFirst() {
            if byte == UInt8(ascii: "\\"), rest.count >= 3, let value = UInt8(String(decoding: rest.prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(value)
                rest = rest.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Makes the cgroup `name` (no `/`) for one attempt. One of that name already there was left
    /// by an earlier run of the same attempt (its server stopped before its processes were gone):
    /// what is still in it is killed, and it is used again.
    public func makeCgroup(named name: String) throws(CgroupError) -> Cgroup {
        precondition(!name.isEmpty && !name.contains("/") && name != "." && name != "..", "a cgroup name")
        let cgroup = Cgroup(path: path + "/" + name)
        if mkdir(cgroup.path, 0o755) != 0 {
            guard errno == EEXIST else { throw CgroupError("cannot create \(cgroup.path): \(String(cString: strerror(errno)))") }
            cgroup.kill()
        }
        return cgroup
    }

    /// Kills every cgroup here whose name starts with `prefix` (the attempts of one task a dead
    /// server or worker left behind); returns them, to be removed once empty.
    public func killCgroups(prefix: String) -> [Cgroup] {
        guard let directory = opendir(path) else { return [] }
        defer { closedir(directory) }
        var killed: [Cgroup] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard entry.pointee.d_type == UInt8(DT_DIR), name.hasPrefix(prefix) else { continue }
            let cgroup = Cgroup(path: path + "/" + name)
            cgroup.kill()
            killed.append(cgroup)
        }
        return killed
    }
}

/// One attempt's cgroup. Threading: any thread; it holds only a path.
public final class Cgroup: Sendable {
    public let path: String

    init(path: String) {
        self.path = path
    }

    /// SIGKILL to every process in it, and to any forked while that goes on.
    public func kill() {
        _ = Self.write("1", to: path + "/cgroup.kill")
    }

    /// Sends `signal` to every process in it now (SIGKILL is `kill()`, which misses none).
    public func signal(_ signal: Int32) {
        guard let text = readFile(path + "/cgroup.procs") else { return }
        for line in text.split(separator: "\n") {
            if let pid = Int32(line), pid > 0 { Glibc.kill(pid, signal) }
        }
    }

    /// Removes it if it is empty (a process that has exited, even unreaped, no longer counts).
    /// True once it is gone, or when it never can be by this process (not ours to remove):
    /// false only while processes are still in it.
    public func remove() -> Bool {
        rmdir(path) == 0 || errno != EBUSY
    }

    private static func write(_ text: String, to file: String) -> Bool {
        let fd = open(file, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return text.withCString { Glibc.write(fd, $0, strlen($0)) } > 0
    }
}

public struct CgroupError: Error, CustomStringConvertible, Sendable {
    public let description: String

    init(_ description: String) {
        self.description = description
    }
}

/// A small kernel-made file (/proc, cgroupfs) whole; nil when it cannot be read.
private func readFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 16 * 1024)
    while true {
        let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { break }
        bytes.append(contentsOf: chunk[..<count])
    }
    return String(decoding: bytes, as: UTF8.self)
}
