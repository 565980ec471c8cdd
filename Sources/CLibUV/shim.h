#include <uv.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

// Process calls libuv does not wrap, typed for Swift: prctl, fcntl and syscall are C variadic
// functions, which Swift cannot call, and siginfo_t's pid sits in a union Swift reads awkwardly.

// Makes this process a child subreaper: orphaned descendants of its children become its own
// children instead of init's. Returns 0, or -1 with errno set.
static inline int taskloop_become_child_subreaper(void) {
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

// The pid of a child that has exited and waits to be reaped, without reaping it; 0 if none,
// -1 (errno ECHILD) if this process has no children.
static inline pid_t taskloop_peek_exited_child(void) {
    siginfo_t info;
    info.si_pid = 0;
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return -1;
    return info.si_pid;
}

// Marks every descriptor above 2 close-on-exec, so a program started next inherits only its
// stdin, stdout and stderr. libuv opens its own descriptors with O_CLOEXEC, but other libraries
// do not (libcurl 7.88's socketpair and sockets among them), uv_spawn has no hook in the child
// to close them, and a child holding a connection's socket keeps it open after the server
// closed it. One syscall since Linux 5.11; before that, the descriptors /proc lists; without
// /proc, every possible one.
static inline void taskloop_set_cloexec(int fd) {
    int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

static inline void taskloop_mark_descriptors_cloexec(void) {
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
    DIR *listing = opendir("/proc/self/fd");
    if (listing != NULL) {
        struct dirent *entry;
        while ((entry = readdir(listing)) != NULL) {
            int fd = atoi(entry->d_name);
            if (fd > 2 && fd != dirfd(listing)) taskloop_set_cloexec(fd);
        }
        closedir(listing);
        return;
    }
    long limit = sysconf(_SC_OPEN_MAX);
    for (int fd = 3; fd < limit; fd++) taskloop_set_cloexec(fd);
}
