#include <uv.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
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

// glibc declares these only under _GNU_SOURCE, which the Swift importer does not define; they
// are in glibc since 2.26 (SETSID), 2.29 (addchdir_np) and 2.34 (addclosefrom_np).
#ifndef POSIX_SPAWN_SETSID
#define POSIX_SPAWN_SETSID 0x80
#endif
extern int posix_spawn_file_actions_addchdir_np(posix_spawn_file_actions_t *__restrict, const char *__restrict);
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *, int);

// Starts `path` (already searched for: posix_spawnp would search the server's PATH, not the
// program's) with exactly `argv` and `envp`, in `directory` unless NULL, as the leader of a new
// session and process group from its first instruction. Its stdin is /dev/null, its stdout and
// stderr `out` and `err`, and it holds no other descriptor: whatever other libraries opened
// without O_CLOEXEC (libcurl 7.88's socketpair and sockets among them) is closed in the child,
// whatever thread opened it when. Its signal mask is empty and every signal has its default
// disposition (the server ignores SIGPIPE, and a parent may have blocked anything).
// glibc's posix_spawn runs the child with clone(CLONE_VM|CLONE_VFORK): nothing of the server is
// copied (fork copies its page tables, slow for a big server), and the exec's failure comes
// back as the result. Returns 0 with *pid set, or an errno.
static inline int taskloop_spawn(pid_t *pid, const char *path, char *const argv[], char *const envp[],
                                 const char *directory, int out, int err) {
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    int status = posix_spawn_file_actions_init(&actions);
    if (status != 0) return status;
    status = posix_spawnattr_init(&attributes);
    if (status != 0) {
        posix_spawn_file_actions_destroy(&actions);
        return status;
    }
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    if ((status = posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)) == 0
        && (status = posix_spawnattr_setsigmask(&attributes, &none)) == 0
        && (status = posix_spawnattr_setsigdefault(&attributes, &all)) == 0
        && (status = posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)) == 0
        && (status = posix_spawn_file_actions_adddup2(&actions, out, 1)) == 0
        && (status = posix_spawn_file_actions_adddup2(&actions, err, 2)) == 0
        && (directory == NULL || (status = posix_spawn_file_actions_addchdir_np(&actions, directory)) == 0)
        && (status = posix_spawn_file_actions_addclosefrom_np(&actions, 3)) == 0) {
        status = posix_spawn(pid, path, &actions, &attributes, argv, envp);
    }
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    return status;
}

// A pipe whose two ends are close-on-exec (pipe2 is declared only under _GNU_SOURCE too).
// Returns 0, or -1 with errno set.
static inline int taskloop_pipe_cloexec(int ends[2]) {
    return (int)syscall(SYS_pipe2, ends, O_CLOEXEC);
}

// A descriptor that becomes readable once process `pid` (a child not yet waited for, so its
// pid cannot have been reused) has exited: how the loop hears of its own children's exits
// without SIGCHLD (Linux 5.3). Close-on-exec. Returns it, or -1 with errno set.
static inline int taskloop_pidfd_open(pid_t pid) {
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

// The exit of child `pid` if it has exited (reaped then), as libuv reports one: *status the
// exit status (0 when killed), *signal the killing signal (0 when it exited). Returns 1 when
// reaped, 0 when it is still running, -1 with errno set when it is not a child to wait for.
static inline int taskloop_reap_child(pid_t pid, long long *status, int *signal) {
    int raw = 0;
    pid_t reaped;
    do {
        reaped = waitpid(pid, &raw, WNOHANG);
    } while (reaped < 0 && errno == EINTR);
    if (reaped <= 0) return reaped;
    *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 0;
    *signal = WIFSIGNALED(raw) ? WTERMSIG(raw) : 0;
    return 1;
}
