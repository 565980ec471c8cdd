import Testing
import TaskloopLoop

/// Finding this process's cgroup directory from /proc/self/mountinfo, as the machines it runs on
/// mount cgroup2: beside v1 (hybrid), alone at /sys/fs/cgroup, inside a container.
@Suite struct CgroupTests {
    static let hybrid = """
        31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
        """
    static let unified = """
        25 20 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
        30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
        """
    /// A container without a cgroup namespace: its mount shows the hierarchy from its own cgroup.
    static let container = """
        600 590 0:26 /docker/abc /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw
        """

    @Test func findsTheCgroupUnderTheMountThatReachesIt() {
        #expect(CgroupParent.mountedDirectory(of: "/", in: Self.hybrid) == "/sys/fs/cgroup/unified")
        #expect(CgroupParent.mountedDirectory(of: "/user.slice/user-1000.slice/session-2.scope", in: Self.unified)
            == "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope")
        #expect(CgroupParent.mountedDirectory(of: "/docker/abc", in: Self.container) == "/sys/fs/cgroup")
        #expect(CgroupParent.mountedDirectory(of: "/docker/abc/inner", in: Self.container) == "/sys/fs/cgroup/inner")
    }

    @Test func noMountThatReachesItIsNone() {
        #expect(CgroupParent.mountedDirectory(of: "/docker/other", in: Self.container) == nil)
        #expect(CgroupParent.mountedDirectory(of: "/docker/abcd", in: Self.container) == nil)
        #expect(CgroupParent.mountedDirectory(of: "/", in: "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw") == nil)
    }

    @Test func readsEscapedMountPoints() {
        let escaped = #"41 31 0:38 / /mnt/cgroup\040two rw,relatime - cgroup2 cgroup2 rw"#
        #expect(CgroupParent.mountedDirectory(of: "/a", in: escaped) == "/mnt/cgroup two/a")
    }
}
