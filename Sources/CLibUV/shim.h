#include <uv.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

// Two process calls libuv does not wrap, typed for Swift: prctl is a C variadic function,
// which Swift cannot call, and siginfo_t's pid sits in a union Swift reads awkwardly.

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
