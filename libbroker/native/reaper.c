/*
 * The reaper's side, small: libbroker/reaper.py's supervise(), in C.
 *
 *     reaper COMMAND CONTROL_FD GROUP
 *
 * The broker's Landlock backend forks a reaper per command (a fork of the
 * warm server, a child subreaper outside the sandbox), which forks the
 * command and then has nothing left to do in Python but wait.  A forked copy
 * of the server living as long as its command keeps every page the server
 * writes meanwhile twice (copy on write: ~2 MiB per command here); so the
 * reaper execs this program instead, and is a process of a few hundred KiB.
 * The subreaper attribute survives exec, and so does the command, our child.
 *
 * What it does is reaper.py's supervise(), which the tests hold it to, side
 * by side: until COMMAND (our child) ends, each byte read from CONTROL_FD is
 * a signal number for the command's process group (GROUP 1) or the command
 * alone (GROUP 0), sent from here because only this process knows the
 * command is not yet reaped, so its id cannot have been reused; end of file
 * on CONTROL_FD (the server is gone) kills it.  Orphans that die meanwhile
 * are reaped.  Then every process still below us is killed, each through a
 * pidfd opened after it was found and checked again to still be below us,
 * so that a reused pid is never signalled; and we exit as the command did.
 *
 * Exit 125 on bad arguments or when the command cannot be watched.
 */

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

struct proc {
    pid_t pid, ppid;
    int below; /* has a chain of parents to us */
};

static void fail(const char *what)
{
    dprintf(2, "agent-sandbox reaper: %s: %s\n", what, strerror(errno));
    _exit(125);
}

static int number(const char *s, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

static int pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static int pidfd_kill(int fd, int sig) { return (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0); }

/* ``pid``'s parent from /proc, or -1 once it is gone or unreadable. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* The name (field 2) may hold any byte, ")" included: read after the last. */
    char *close_paren = strrchr(buf, ')');
    char state;
    int ppid;
    if (close_paren == NULL || sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2)
        return -1;
    return (pid_t)ppid;
}

/* Every process /proc shows, with its parent; *count set. */
static struct proc *process_table(size_t *count)
{
    DIR *dir = opendir("/proc");
    if (dir == NULL)
        return NULL;
    size_t n = 0, cap = 256;
    struct proc *table = malloc(cap * sizeof *table);
    struct dirent *entry;
    while (table != NULL && (entry = readdir(dir)) != NULL) {
        long pid;
        if (number(entry->d_name, 1L << 30, &pid) < 0)
            continue;
        pid_t ppid = parent_of((pid_t)pid);
        if (ppid < 0)
            continue;
        if (n == cap) {
            struct proc *bigger = realloc(table, 2 * cap * sizeof *table);
            if (bigger == NULL) {
                free(table);
                table = NULL;
                break;
            }
            table = bigger;
            cap *= 2;
        }
        table[n++] = (struct proc){(pid_t)pid, ppid, 0};
    }
    closedir(dir);
    *count = n;
    return table;
}

static int by_pid(const void *a, const void *b)
{
    pid_t x = ((const struct proc *)a)->pid, y = ((const struct proc *)b)->pid;
    return (x > y) - (x < y);
}

/* Whether ``pid`` is ``root`` or marked below it (``table`` sorted by pid). */
static int below_us(const struct proc *table, size_t n, pid_t root, pid_t pid)
{
    if (pid == root)
        return 1;
    struct proc key = {pid, 0, 0};
    const struct proc *found = bsearch(&key, table, n, sizeof *table, by_pid);
    return found != NULL && found->below;
}

/* SIGKILL every process below ``root`` (this process) and reap our children;
   returns once we have none left. */
static void kill_below(pid_t root)
{
    for (;;) {
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
            ; /* reap what has ended already */
        if (pid < 0 && errno == ECHILD)
            return; /* no child at all, so nothing below us: the usual end, no /proc scan */
        size_t n = 0;
        struct proc *table = process_table(&n);
        if (table == NULL)
            return; /* no /proc (or no memory): nothing to go by, as reaper.py gives up too */
        qsort(table, n, sizeof *table, by_pid);
        /* Mark everything whose parent is marked, until nothing changes. */
        for (int changed = 1; changed;) {
            changed = 0;
            for (size_t i = 0; i < n; i++)
                if (!table[i].below && below_us(table, n, root, table[i].ppid)) {
                    table[i].below = 1;
                    changed = 1;
                }
        }
        for (size_t i = 0; i < n; i++) {
            if (!table[i].below || table[i].pid == root)
                continue;
            int fd = pidfd_open(table[i].pid);
            if (fd < 0)
                continue; /* gone already */
            if (below_us(table, n, root, parent_of(table[i].pid)))
                pidfd_kill(fd, SIGKILL);
            close(fd);
        }
        free(table);
        if (waitpid(-1, &status, 0) < 0 && errno == ECHILD)
            return; /* one of ours has died (orphans below are ours now), or none is left */
    }
}

static void exit_as(int status) __attribute__((noreturn));

static void exit_as(int status)
{
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        sigset_t set;
        signal(sig, SIG_DFL);
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        kill(getpid(), sig);
        _exit(128 + sig); /* a signal that does not end a process */
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 255);
}

/* Reap every child that has ended; 1 and the command's status if it was one. */
static int reaped(pid_t command, int *status)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0) {
            *status = 255 << 8; /* the command is not ours after all: a failure */
            return 1;
        }
        if (pid == 0)
            return 0;
        if (pid == command) {
            *status = st;
            return 1;
        }
    }
}

int main(int argc, char **argv)
{
    long command_l, control_l, group;
    if (argc != 4 || number(argv[1], 1L << 30, &command_l) < 0 ||
        number(argv[2], 1L << 20, &control_l) < 0 || number(argv[3], 1, &group) < 0) {
        dprintf(2, "usage: reaper COMMAND CONTROL_FD GROUP(0|1)\n");
        return 125;
    }
    pid_t command = (pid_t)command_l;
    int control = (int)control_l;
    int pidfd = pidfd_open(command);
    if (pidfd < 0) { /* fail closed: a command nobody watches does not run on */
        int saved = errno;
        kill(command, SIGKILL); /* our unreaped child: the pid is still its own */
        kill_below(getpid());
        errno = saved;
        fail("cannot watch the command");
    }
    struct pollfd fds[2] = {{.fd = control, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    int status = 0;
    while (!reaped(command, &status)) {
        if (poll(fds, 2, 1000) < 0 && errno != EINTR) /* the timeout reaps orphans of a long command */
            fail("poll");
        if (fds[0].fd < 0 || !(fds[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        unsigned char data[256];
        ssize_t n = read(control, data, sizeof data);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) { /* the server is gone: so is the command */
            fds[0].fd = -1;
            data[0] = SIGKILL;
            n = 1;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (group)
                killpg(command, data[i]);
            else
                kill(command, data[i]);
        }
    }
    kill_below(getpid());
    exit_as(status);
}
