/*
 * gpg-shim's signing fast path, without a Python start.
 *
 * git runs its gpg.program once per signature as exactly
 *     PROGRAM --status-fd=2 -bsau KEY      (payload on stdin)
 * and waits for it: an interpreter's start-up is most of what the Python
 * gpg-shim costs a commit.  This program answers that one form the way
 * libbroker/gpg_shim.py does, byte for byte on the wire: op "sign" through the
 * broker named by AGENT_SANDBOX_BROKER_SOCKET, gpg's stdout to fd 1 and its
 * stderr (status lines included, since the status fd is 2) to fd 2, gpg's
 * exit status as its own.
 *
 * Everything else is not handled here but by the full gpg-shim, executed in
 * this process's place: verification, other spellings of the options,
 * --help, a key or working directory that is not plain ASCII, an unset socket
 * variable, a broker that cannot be reached.  It is python/gpg-shim beside
 * this program (the launcher puts both in the session's runtime directory),
 * and it gives the canonical message and exit status for each of those.
 * Only after the payload has been read (it cannot be read twice) does this
 * program report failures itself, with the Python shim's messages and statuses:
 *     1    the broker refused to sign (an error frame)
 *     2    the payload exceeds 64 MiB, or stdin cannot be read
 *     125  the broker connection was lost or broke the wire format
 *     127  the full gpg-shim beside this program cannot be run
 *     141  fd 1 or 2 was closed by its reader
 *
 * Nothing from the sandbox is trusted more than the Python shim trusts it,
 * and nothing from the broker is trusted at all: every frame header is
 * checked (a known server channel, at most 1 MiB) before its payload is
 * read, and every buffer is bounded.  No allocation depends on a length the
 * broker sent.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

/* The wire format (docs/DESIGN.md 2.2): tests/signing/test_gpg_native.py holds this
   program to the Python shim on every channel and length limit. */
enum { CH_STDIN = 0, CH_STDOUT = 1, CH_STDERR = 2, CH_EXIT = 3, CH_ERROR = 4, CH_REQUEST = 5 };
#define HEADER_SIZE 5
#define MAX_PAYLOAD (1u << 20)
#define CHANNEL_COUNT 7 /* stdin ... signal */

#define MAX_SIGN_PAYLOAD (64u << 20) /* as libbroker.signing.shim.MAX_SIGN_PAYLOAD */
#define MAX_FIELD 4096               /* a longer key or cwd: the full shim's case */
#define SOCKET_ENV "AGENT_SANDBOX_BROKER_SOCKET"
#define DOOR_ENV "AGENT_SANDBOX_BROKER_DOOR" /* libbroker/launcher/door.py */
#define FULL_SHIM "python/gpg-shim" /* beside this program: the Python gpg-shim */

static const char *const channel_names[CHANNEL_COUNT] = {
    "stdin", "stdout", "stderr", "exit", "error", "request", "signal"};

/* Write ``line`` to git's own stderr too, when git started this program with its
   stderr captured: git runs gpg.program with stderr in a pipe (the status fd
   is 2) and before 2.40 drops what it said, so a refusal's reason would never
   reach the agent.  As libbroker.signing.shim.tell_git: only when the parent
   is git and its fd 2 is another file than ours; non-blocking; best effort. */
static void tell_git(const char *line, size_t len)
{
    char path[64], comm[64];
    struct stat theirs, ours;
    pid_t parent = getppid();
    snprintf(path, sizeof path, "/proc/%d/comm", (int)parent);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, comm, sizeof comm);
    close(fd);
    if (n < 3 || memcmp(comm, "git", 3) != 0)
        return;
    snprintf(path, sizeof path, "/proc/%d/fd/2", (int)parent);
    if (stat(path, &theirs) < 0 || fstat(2, &ours) < 0)
        return;
    if (theirs.st_dev == ours.st_dev && theirs.st_ino == ours.st_ino)
        return;
    fd = open(path, O_WRONLY | O_APPEND | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    (void)!write(fd, line, len);
    close(fd);
}

static void fail(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

static void fail(int status, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    (void)!write(2, "gpg-shim: ", 10);
    (void)!write(2, line, (size_t)n);
    char told[1040];
    int m = snprintf(told, sizeof told, "gpg-shim: %.*s", n, line);
    if (m > 0)
        tell_git(told, (size_t)m < sizeof told ? (size_t)m : sizeof told - 1);
    _exit(status);
}

/* Replace this process with the full gpg-shim, python/gpg-shim beside this
   program (never returns).  git runs gpg.program by the path configured, so
   argv[0] names this program's directory; a bare name (run from PATH) has
   none, and no guess is made. */
static void full_shim(char **argv) __attribute__((noreturn));

static void full_shim(char **argv)
{
    char path[PATH_MAX];
    const char *self = argv[0] ? argv[0] : "";
    const char *slash = strrchr(self, '/');
    if (slash == NULL)
        fail(127, "run this program by its path: the full gpg-shim is found beside it");
    int n = snprintf(path, sizeof path, "%.*s/%s", (int)(slash - self), self, FULL_SHIM);
    if (n < 0 || (size_t)n >= sizeof path)
        fail(127, "cannot run the full gpg-shim: the path beside %s is too long", self);
    execv(path, argv);
    fail(127, "cannot run the full gpg-shim %s: %s", path, strerror(errno));
}

/* ---- the request: the bytes libbroker.signing.shim.sign_request makes -------- */

struct buf {
    unsigned char *data;
    size_t len, cap;
};

static void grow(struct buf *b, size_t more)
{
    if (more > SIZE_MAX - b->len)
        fail(2, "out of memory");
    size_t need = b->len + more;
    if (need <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    unsigned char *data = realloc(b->data, cap);
    if (data == NULL)
        fail(2, "out of memory");
    b->data = data;
    b->cap = cap;
}

static void put(struct buf *b, const void *data, size_t len)
{
    grow(b, len);
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

static void put_str(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* Whether this program can quote ``s`` as the Python shim does: ASCII only. */
static int plain_ascii(const char *s)
{
    size_t n = 0;
    for (; *s; s++, n++)
        if ((unsigned char)*s >= 0x80 || n >= MAX_FIELD)
            return 0;
    return 1;
}

/* A JSON string exactly as Python's json.encoder.encode_basestring_ascii writes it. */
static void put_json_string(struct buf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    put_str(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[7];
        switch (c) {
        case '"': put_str(b, "\\\""); continue;
        case '\\': put_str(b, "\\\\"); continue;
        case '\b': put_str(b, "\\b"); continue;
        case '\f': put_str(b, "\\f"); continue;
        case '\n': put_str(b, "\\n"); continue;
        case '\r': put_str(b, "\\r"); continue;
        case '\t': put_str(b, "\\t"); continue;
        default: break;
        }
        if (c < 0x20 || c == 0x7f) { /* everything outside " " to "~", as Python */
            esc[0] = '\\'; esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
            esc[4] = hex[c >> 4]; esc[5] = hex[c & 15]; esc[6] = 0;
            put_str(b, esc);
        } else {
            put(b, &c, 1);
        }
    }
    put_str(b, "\"");
}

static void put_header(struct buf *b, unsigned channel, size_t len)
{
    unsigned char h[HEADER_SIZE] = {(unsigned char)channel, (unsigned char)(len >> 24),
                                    (unsigned char)(len >> 16), (unsigned char)(len >> 8),
                                    (unsigned char)len};
    put(b, h, sizeof h);
}

/* Everything gpg-shim sends: the request, the payload as stdin frames, EOF. */
static void sign_frames(struct buf *out, const char *key, const char *cwd, const struct buf *payload)
{
    struct buf req = {0};
    put_str(&req, "{\"argv\":[\"gpg\",\"--status-fd=2\",\"-bsau\",");
    put_json_string(&req, key);
    put_str(&req, "],\"cwd\":");
    put_json_string(&req, cwd);
    put_str(&req, ",\"with_stdin\":true,\"op\":\"sign\",\"key\":");
    put_json_string(&req, key);
    put_str(&req, "}");
    /* key and cwd are at most MAX_FIELD bytes, 6 bytes each escaped: < MAX_PAYLOAD */
    put_header(out, CH_REQUEST, req.len);
    put(out, req.data, req.len);
    free(req.data);
    for (size_t start = 0; start < payload->len; start += MAX_PAYLOAD) {
        size_t n = payload->len - start < MAX_PAYLOAD ? payload->len - start : MAX_PAYLOAD;
        put_header(out, CH_STDIN, n);
        put(out, payload->data + start, n);
    }
    put_header(out, CH_STDIN, 0);
}

/* ---- I/O ------------------------------------------------------------------ */

static void read_payload(struct buf *payload)
{
    for (;;) {
        grow(payload, 1 << 16);
        ssize_t n = read(0, payload->data + payload->len, payload->cap - payload->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail(2, "cannot read the payload to sign: %s", strerror(errno));
        if (n == 0)
            return;
        payload->len += (size_t)n;
        if (payload->len > MAX_SIGN_PAYLOAD)
            fail(2, "the payload to sign exceeds %u MiB", MAX_SIGN_PAYLOAD >> 20);
    }
}

static void write_all(int fd, const unsigned char *data, size_t len)
{
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EPIPE)
            _exit(141); /* the shell's status for SIGPIPE, as the Python shim's */
        if (n < 0 && fd != 2)
            fail(1, "cannot write to fd %d: %s", fd, strerror(errno));
        if (n < 0)
            _exit(1); /* stderr itself is gone: nowhere to say so */
        data += n;
        len -= (size_t)n;
    }
}

/* A socket of ``family`` connected to ``addr``, or -1. */
static int connected(int family, const struct sockaddr *addr, socklen_t len)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    while (connect(fd, addr, len) < 0) {
        if (errno == EINTR)
            continue;
        close(fd);
        return -1;
    }
    return fd;
}

/* A connected unix socket to the broker, or -1 (the full shim then says why). */
static int dial(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return -1;
    memcpy(addr.sun_path, path, strlen(path) + 1);
    return connected(AF_UNIX, (struct sockaddr *)&addr, sizeof addr);
}

/* A connection to the broker through the session's door (a Landlock session
   may create no unix socket: libbroker/launcher/door.py relays a loopback
   TCP port to the broker's socket), or -1 (the full shim then says why). */
static int through_door(const char *door_env)
{
    char *end;
    errno = 0;
    long port = strtol(door_env, &end, 10);
    if (errno != 0 || end == door_env || *end != '\0' || port <= 0 || port > 65535)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = connected(AF_INET, (struct sockaddr *)&addr, sizeof addr);
    if (fd < 0)
        return -1;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* One server frame, complete: act on it.  Returns only for stdout and stderr. */
static void dispatch(unsigned channel, const unsigned char *payload, size_t len)
{
    switch (channel) {
    case CH_STDOUT:
        write_all(1, payload, len);
        return;
    case CH_STDERR: /* the status fd is 2: gpg's lines as they are */
        write_all(2, payload, len);
        return;
    case CH_ERROR: { /* the message's bytes as they are, NULs included, as the Python shim */
        static const char head[] = "gpg-shim: the broker refused to sign: ";
        (void)!write(2, head, sizeof head - 1);
        (void)!write(2, payload, len);
        (void)!write(2, "\n", 1);
        char told[2048];
        size_t shown = len < sizeof told - sizeof head ? len : sizeof told - sizeof head;
        memcpy(told, head, sizeof head - 1);
        memcpy(told + sizeof head - 1, payload, shown);
        told[sizeof head - 1 + shown] = '\n';
        tell_git(told, sizeof head + shown);
        _exit(1);
    }
    default: { /* CH_EXIT, the only other channel the header check lets through */
        if (len != 4)
            fail(125, "the broker sent a malformed frame: exit frame payload is %zu bytes, expected 4",
                 len);
        uint32_t status = ((uint32_t)payload[0] << 24) | ((uint32_t)payload[1] << 16) |
                          ((uint32_t)payload[2] << 8) | (uint32_t)payload[3];
        _exit((int)(status & 0xFF)); /* a signed status's low byte, as the Python shim's & 0xFF */
    }
    }
}

/* The header's channel and length, or a failure naming what is wrong with it. */
static void check_header(const unsigned char *h, unsigned *channel, size_t *len)
{
    *channel = h[0];
    *len = ((size_t)h[1] << 24) | ((size_t)h[2] << 16) | ((size_t)h[3] << 8) | (size_t)h[4];
    if (*channel >= CHANNEL_COUNT)
        fail(125, "the broker sent a malformed frame: unknown channel %u", *channel);
    if (*channel != CH_STDOUT && *channel != CH_STDERR && *channel != CH_EXIT && *channel != CH_ERROR)
        fail(125, "the broker sent a malformed frame: channel %s is not allowed here",
             channel_names[*channel]);
    if (*len > MAX_PAYLOAD)
        fail(125, "the broker sent a malformed frame: frame length %zu exceeds the %u-byte limit",
             *len, MAX_PAYLOAD);
}

/* Send everything while reading whatever comes back, until the exit frame. */
static void exchange(int sock, const struct buf *out)
{
    static unsigned char frame[HEADER_SIZE + MAX_PAYLOAD];
    size_t have = 0, need = HEADER_SIZE, sent = 0;
    unsigned channel = 0;
    size_t len = 0;
    if (fcntl(sock, F_SETFL, O_NONBLOCK) < 0)
        fail(125, "lost the broker connection: %s", strerror(errno));
    for (;;) {
        struct pollfd p = {.fd = sock, .events = POLLIN | (sent < out->len ? POLLOUT : 0)};
        if (poll(&p, 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            fail(125, "lost the broker connection: %s", strerror(errno));
        }
        if (sent < out->len && (p.revents & POLLOUT)) {
            ssize_t n = send(sock, out->data + sent, out->len - sent, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EINTR)
                sent = out->len; /* gone: its error or exit frame may still be readable */
        }
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        ssize_t n = recv(sock, frame + have, need - have, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n < 0)
            fail(125, "lost the broker connection: %s", strerror(errno));
        if (n == 0)
            fail(125, "the broker closed the connection before gpg finished");
        have += (size_t)n;
        if (have < need)
            continue;
        if (need == HEADER_SIZE) { /* a whole header: check it before its payload */
            check_header(frame, &channel, &len);
            need = HEADER_SIZE + len;
            if (have < need)
                continue;
        }
        dispatch(channel, frame + HEADER_SIZE, len);
        have = 0;
        need = HEADER_SIZE;
    }
}

int main(int argc, char **argv)
{
    if (argc != 4 || strcmp(argv[1], "--status-fd=2") != 0 || strcmp(argv[2], "-bsau") != 0)
        full_shim(argv);
    const char *key = argv[3];
    const char *path = getenv(SOCKET_ENV);
    char cwd[PATH_MAX];
    struct stat st;
    if (key[0] == '\0' || !plain_ascii(key) || path == NULL || path[0] == '\0' || fstat(2, &st) < 0)
        full_shim(argv);
    if (getcwd(cwd, sizeof cwd) == NULL)
        strcpy(cwd, "/"); /* as the Python shim: the broker then refuses the cwd */
    if (!plain_ascii(cwd))
        full_shim(argv);
    /* The broker is reached before stdin is read, so that an unreachable one is
       the full shim's to report, whatever is (or is not) on stdin. */
    const char *door = getenv(DOOR_ENV);
    int sock = door != NULL && door[0] != '\0' ? through_door(door) : dial(path);
    if (sock < 0)
        full_shim(argv);
    signal(SIGPIPE, SIG_IGN);
    struct buf payload = {0}, out = {0};
    read_payload(&payload);
    sign_frames(&out, key, cwd, &payload);
    free(payload.data);
    exchange(sock, &out);
    return 125; /* not reached: exchange ends the process */
}
