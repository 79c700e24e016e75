/*
 * bwrap's forwarder, small: libbroker/sandbox/forwarder.py in C.
 *
 *     forwarder --control FD [--own-group] [--rlimit RESOURCE=VALUE]... -- CMD...
 *
 * The first process of a bwrap session (bwrap execs it once the sandbox is
 * built) waits there for the launcher's go byte, then starts the command.  A
 * Python forwarder's start (interpreter, its modules) is ~15 ms of CPU on
 * every session, on the two cores the launcher and egress-proxy start on,
 * and it was often not done when go came: the command waited for it.  This
 * program does the same work, which the tests hold it to, side by side:
 *
 * 0. each --rlimit as both soft and hard limit on itself, read back; one that
 *    does not take ends it with 125 before go (the command never runs);
 * 1. one byte read from FD: "g" is go; anything else or end of file (the
 *    launcher gave up) is 125, nothing run;
 * 2. the command started (posix_spawnp: default signals, an empty mask, its
 *    own process group with --own-group); FD is not inherited by it; 127 when
 *    it is not found, 126 when it cannot start;
 * 3. every later byte on FD is a signal number for the command (its group
 *    with --own-group); end of file (the launcher is gone) kills it;
 * 4. exit as the command did: its status, or 128+N when signal N ended it.
 *
 * Exit 125 on bad arguments ("agent-sandbox: sandbox start: ...").
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_RLIMITS 64

static const int DEFAULTS[] = {SIGINT, SIGQUIT, SIGPIPE, SIGXFSZ, SIGTERM, SIGHUP, SIGCHLD};

static int wake_w = -1;

static int start_failed(const char *what, const char *arg)
{
    dprintf(2, "agent-sandbox: sandbox start: %s%s\n", what, arg);
    return 125;
}

/* A decimal number of ASCII digits only (as forwarder.py's isdigit() checks), or -1. */
static int digits(const char *s, unsigned long long max, unsigned long long *out)
{
    if (*s == '\0')
        return -1;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno || v > max)
        return -1;
    *out = v;
    return 0;
}

static void on_child(int sig)
{
    (void)sig;
    int saved = errno;
    if (write(wake_w, "c", 1) < 0) {
        /* full: a wake-up is pending already */
    }
    errno = saved;
}

static void send_to(pid_t child, int own_group, int sig)
{
    if (own_group)
        killpg(child, sig);
    else
        kill(child, sig);
}

static int status_of(int st)
{
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

/* The command, started as forwarder.py's _spawn starts it; 0 or an errno. */
static int spawn(char **cmd, int own_group, pid_t *child)
{
    posix_spawnattr_t attr;
    sigset_t defaults, empty;
    int err = posix_spawnattr_init(&attr);
    if (err)
        return err;
    sigemptyset(&defaults);
    for (size_t i = 0; i < sizeof DEFAULTS / sizeof DEFAULTS[0]; i++)
        sigaddset(&defaults, DEFAULTS[i]);
    sigemptyset(&empty);
    short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
    if (own_group)
        flags |= POSIX_SPAWN_SETPGROUP;
    err = posix_spawnattr_setflags(&attr, flags);
    if (!err)
        err = posix_spawnattr_setsigdefault(&attr, &defaults);
    if (!err)
        err = posix_spawnattr_setsigmask(&attr, &empty);
    if (!err && own_group)
        err = posix_spawnattr_setpgroup(&attr, 0);
    if (!err)
        err = posix_spawnp(child, cmd[0], NULL, &attr, cmd, environ);
    posix_spawnattr_destroy(&attr);
    return err;
}

static int serve(int control, int own_group, char **cmd)
{
    unsigned char go;
    ssize_t n;
    do
        n = read(control, &go, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1 || go != 'g')
        return 125; /* the launcher gave up before the session started */
    /* bwrap hands the pipe over inheritable; the command must not get it (it could
       read the signals meant for it, the grace's SIGKILL among them). */
    if (fcntl(control, F_SETFD, FD_CLOEXEC) < 0)
        return start_failed("control descriptor: ", strerror(errno));
    /* The SIGCHLD wake-up: a pipe the handler writes. */
    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) < 0)
        return start_failed("pipe: ", strerror(errno));
    wake_w = wake[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    pid_t child;
    int err = spawn(cmd, own_group, &child);
    if (err == ENOENT) {
        dprintf(2, "agent-sandbox: %s: command not found\n", cmd[0]);
        return 127;
    }
    if (err) {
        dprintf(2, "agent-sandbox: %s: %s\n", cmd[0], strerror(err));
        return 126;
    }
    struct pollfd fds[2] = {{.fd = control, .events = POLLIN}, {.fd = wake[0], .events = POLLIN}};
    for (;;) {
        int st;
        pid_t pid = waitpid(child, &st, WNOHANG);
        if (pid == child)
            return status_of(st);
        if (pid < 0 && errno != EINTR)
            return 255; /* not ours after all (cannot be): a failure */
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return start_failed("poll: ", strerror(errno));
        }
        if (fds[1].revents & POLLIN) {
            char drain[64];
            while (read(wake[0], drain, sizeof drain) > 0)
                ;
        }
        if (fds[0].fd >= 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            unsigned char data[64];
            n = read(control, data, sizeof data);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) { /* the launcher is gone: so is the command */
                send_to(child, own_group, SIGKILL);
                fds[0].fd = -1;
                continue;
            }
            for (ssize_t i = 0; i < n; i++)
                send_to(child, own_group, data[i]);
        }
    }
}

int main(int argc, char **argv)
{
    long control = -1;
    int own_group = 0, nlimits = 0;
    int which[MAX_RLIMITS];
    rlim_t value[MAX_RLIMITS];
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        unsigned long long v;
        if (strcmp(argv[i], "--control") == 0 && i + 1 < argc) {
            if (digits(argv[++i], INT_MAX, &v) < 0)
                return start_failed("--control must be a descriptor number: ", argv[i]);
            control = (long)v;
        } else if (strcmp(argv[i], "--rlimit") == 0 && i + 1 < argc) {
            char *text = argv[++i], *eq = strchr(text, '=');
            unsigned long long w;
            if (eq == NULL || nlimits == MAX_RLIMITS)
                return start_failed("--rlimit expected RESOURCE=VALUE (two numbers): ", text);
            *eq = '\0';
            const char *digit = eq + 1;
            while (*digit >= '0' && *digit <= '9')
                digit++;
            int bad = digits(text, INT_MAX, &w) < 0 || eq[1] == '\0' || *digit != '\0';
            *eq = '=';
            if (bad)
                return start_failed("--rlimit expected RESOURCE=VALUE (two numbers): ", text);
            /* As forwarder.py's setrlimit: a value past a signed 64-bit one is refused
               (not RLIM_INFINITY, nor a huge limit that would lift none). */
            if (digits(eq + 1, LLONG_MAX, &v) < 0) {
                dprintf(2, "agent-sandbox: sandbox start: cannot set the session's limit %d to "
                           "%s: too large\n", (int)w, eq + 1);
                return 125;
            }
            which[nlimits] = (int)w;
            value[nlimits++] = (rlim_t)v;
        } else if (strcmp(argv[i], "--own-group") == 0) {
            own_group = 1;
        } else {
            return start_failed("unexpected argument ", argv[i]);
        }
    }
    if (control < 0 || i + 1 >= argc)
        return start_failed("usage: forwarder --control FD [--own-group] "
                            "[--rlimit RESOURCE=VALUE]... -- CMD...", "");
    /* As Python's start does for forwarder.py: a closed pipe or a file too large
       is an error the write returns, not a signal that ends the forwarder. */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    /* Before go: a sandbox that cannot set them never runs the command. */
    for (int k = 0; k < nlimits; k++) {
        struct rlimit set = {value[k], value[k]}, got;
        if (setrlimit(which[k], &set) < 0) {
            dprintf(2, "agent-sandbox: sandbox start: cannot set the session's limit %d to "
                       "%llu: %s\n", which[k], (unsigned long long)value[k], strerror(errno));
            return 125;
        }
        if (getrlimit(which[k], &got) < 0 || got.rlim_cur != value[k] || got.rlim_max != value[k]) {
            dprintf(2, "agent-sandbox: sandbox start: the session's limit %d reads back other "
                       "than %llu\n", which[k], (unsigned long long)value[k]);
            return 125;
        }
    }
    return serve((int)control, own_group, argv + i + 1);
}
