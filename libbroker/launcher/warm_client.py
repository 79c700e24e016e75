"""A scripted ``agent-sandbox run`` handed to the resident service's launcher zygote.

The launcher's own start (interpreter, imports, config: 100-150 ms of CPU)
is paid once by the service's launcher zygote (:mod:`.launcher_zygote`),
which forks a child that becomes this very run: our argv, environment,
working directory, umask, limits, nice value, signal settings and stdin,
stdout and stderr.  This process only relays: the signals it gets go to the
child (by the pidfd its parent made), and it exits with the child's status.

Only when no terminal is involved: a run on a terminal needs it as its
controlling terminal (job control, Ctrl-Z, the foreground group), which a
child of the service cannot have; those runs start here, cold.  So does any
run when the service's socket (the one :func:`.serve_link.default_socket`
names: ``AGENT_SANDBOX_SERVE``, ``off`` for none) does not answer as ours,
or refuses: before the child has started, any failure means "run cold",
silently (one line under ``AGENT_SANDBOX_TRACE``).  Once the child may have
started, never: the command would run twice.  The child starts only on our
``go``, sent after its answer (pid and pidfd) has arrived.

Light on purpose (``os``, ``_socket``, ``_signal``, ``_json``): every ms here
is paid by each scripted run.  ``json`` itself would import ``re`` and
``enum`` (4 ms of CPU); its C encoder and scanner do the work without them.
"""

from __future__ import annotations

import _json
import _socket
import contextlib
import os

from libbroker.launcher import serve_link, warm_request
from libbroker.launcher.trace import trace

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import signal as _signal
else:  # signal's enums cost every run ~4 ms of CPU; _signal has the same functions
    import _signal

WARM_ENV = "AGENT_SANDBOX_WARM"  # "off": the run starts here (the service still serves it)
RELAYED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)
REPLY_TIMEOUT = 10.0
GONE = ("agent-sandbox: the resident service (agent-sandbox serve) went away during the "
        "run: its exit status is unknown\n")
_NOT_SETTABLE = (_signal.SIGKILL, _signal.SIGSTOP, _signal.SIGPIPE, _signal.SIGXFSZ)
_NLIMITS = 16  # RLIMIT_CPU .. RLIMIT_RTTIME on Linux


class _Scanning:
    """What ``_json``'s scanner asks of its decoder (json.decoder.JSONDecoder's fields)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        raise ValueError(f"{name} in an answer")


def _no_default(value: object) -> object:
    raise TypeError(f"{type(value).__name__} in a request")


_ENCODE = _json.make_encoder(None, _no_default, _json.encode_basestring_ascii, None, ":", ",",
                             False, False, False)
_SCAN = _json.make_scanner(_Scanning())  # type: ignore[arg-type]  # (typeshed: a JSONDecoder)


def dumps(value: object) -> bytes:
    """``json.dumps(value, separators=(",", ":")).encode()``, by ``_json`` alone."""
    return "".join(_ENCODE(value, 0)).encode()


def loads(data: bytes) -> object:
    """``json.loads(data)`` for one value, by ``_json`` alone; ValueError when it is none."""
    try:
        text = data.decode()
        value, end = _SCAN(text, 0)
    except Exception:  # the C scanner reports through json.decoder, which we do not import
        raise ValueError("not one JSON value") from None
    if text[end:].strip():
        raise ValueError("not one JSON value")
    return value


def _cold(why: str) -> int | None:
    """None, after one trace line saying why the run starts here."""
    trace(f"warm launch not taken ({why}): the run starts here")
    return None


def request(argv: list[str]) -> bytes:
    """The ``launch`` request line for this process (:mod:`.warm_request`)."""
    import resource

    ignored = [s for s in range(1, _signal.NSIG) if s not in _NOT_SETTABLE
               and _signal.getsignal(s) == _signal.SIG_IGN]
    umask = os.umask(0o077)
    os.umask(umask)
    frame = {
        "op": "launch", "argv": argv, "env": dict(os.environ), "umask": umask,
        "rlimits": [[r, *resource.getrlimit(r)] for r in range(_NLIMITS)],
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "ids": warm_request.ids(),
        "signals": {"ignored": ignored,
                    "blocked": sorted(_signal.pthread_sigmask(_signal.SIG_BLOCK, []))},
        "install": warm_request.install(),
        "privs": warm_request.privs(),
    }
    return dumps(frame) + b"\n"


def _line(sock: _socket.socket, buf: bytearray, fds: list[int]) -> bytes:
    """The next reply line (b"" at end of file); descriptors that come with it into ``fds``."""
    while b"\n" not in buf:
        data, anc, _, _ = sock.recvmsg(warm_request.MAX_REPLY, _socket.CMSG_SPACE(4))
        for level, kind, payload in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [int.from_bytes(payload[i:i + 4], "little")
                        for i in range(0, len(payload) - 3, 4)]
        if not data:
            return b""
        buf += data
        if len(buf) > warm_request.MAX_REPLY:
            raise ValueError("an answer over the limit")
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def _start(sock: _socket.socket, line: bytes) -> tuple[int, bytearray] | str:
    """Hand the run over: the child's pidfd once it waits for our go, else why not."""
    here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    fds: list[int] = []
    buf = bytearray()
    try:
        sock.settimeout(REPLY_TIMEOUT)
        sock.sendmsg([line], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                               b"".join(fd.to_bytes(4, "little") for fd in (0, 1, 2, here)))])
        answer = loads(_line(sock, buf, fds) or b"null")
    except (OSError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        return f"the service: {exc}"
    finally:
        os.close(here)
    ok = isinstance(answer, dict) and answer.get("ok") is True and len(fds) == 1
    if not ok:
        for fd in fds:
            os.close(fd)
        error = answer.get("error") if isinstance(answer, dict) else None
        return f"refused: {error}" if error else "no answer"
    return fds[0], buf


def try_run(argv: list[str]) -> int | None:
    """The run's exit code, run by the service's launcher zygote; None: run it cold here."""
    if os.environ.get(WARM_ENV) == "off":
        return _cold(f"{WARM_ENV}=off")
    if any(os.isatty(fd) for fd in (0, 1, 2)):
        return _cold("a terminal")
    link = serve_link.connect()
    if link is None:
        return _cold("no service answers")
    sock = link.sock
    try:
        line = request(argv)
        if len(line) > warm_request.MAX_REQUEST:
            return _cold("argv and environment over the request's limit")
        started = _start(sock, line)
        if isinstance(started, str):
            return _cold(started)
        pidfd, buf = started
        trace("handed over to the service's launcher zygote")
        return _relay(sock, pidfd, buf)
    finally:
        sock.close()


def _relay(sock: _socket.socket, pidfd: int, buf: bytearray) -> int | None:
    """Say go, pass our signals on, and wait for the child's status."""
    def relay(sig: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            _signal.pidfd_send_signal(pidfd, sig)

    before = {sig: _signal.getsignal(sig) for sig in RELAYED}
    try:
        for sig in RELAYED:
            _signal.signal(sig, relay)
        sock.settimeout(None)
        sock.sendall(b"go\n")
    except OSError as exc:
        # Not said: the child ends on our end of file, having run nothing.
        os.close(pidfd)
        for sig, handler in before.items():
            _signal.signal(sig, handler)
        return _cold(f"the service: {exc}")
    code: int | None = None
    while True:
        try:
            line = _line(sock, buf, [])
        except (OSError, ValueError):
            line = b""
        if not line:
            break
        with contextlib.suppress(ValueError):
            said = loads(line)
            if isinstance(said, dict) and isinstance(said.get("status"), int):
                code = warm_request.exit_code(said["status"])  # the reaper's: exact
            elif isinstance(said, dict) and isinstance(said.get("exit"), int) and code is None:
                code = said["exit"]  # the run's own, should its reaper be gone
    os.close(pidfd)
    if code is None:
        os.write(2, GONE.encode())
        return 1
    return code
