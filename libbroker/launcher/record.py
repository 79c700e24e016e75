"""The session record: one JSON-lines file per session, hash-chained, written by the launcher.

Where: ``$XDG_STATE_HOME/agent-sandbox/sessions/<id>.jsonl`` (default
``~/.local/state``), the file 0600 and its directory 0700.  Nothing of that
directory is granted to either backend's sandbox (:func:`exposed` checks the
session's shape before it starts).

One writer.  egress-proxy (``--record=/dev/stdout``) and broker-server
(``--audit=/dev/stdout``) print their events as JSON lines on their stdout,
a pipe only the launcher holds; the launcher already polls it (their
``listening`` line comes that way), checks each line (:func:`from_server`),
numbers it, chains it and appends it (:class:`Record`).  No line from inside
the sandbox reaches the record except through what a server decided.

The chain: every line is a JSON object whose last key ``prev`` is the
SHA-256 (hex) of the previous line's bytes (without its newline); the first
line's is that of ``GENESIS`` followed by the session id.  ``seq`` counts
lines from 0.  The first line is the ``start`` event, the last the ``end``
event: :func:`verify` finds a line changed, removed, added, reordered, or a
record cut short.  It is evidence against accidents and partial edits, not
a signature: whoever can write the file as you can also rewrite the chain.

Events (``ev``): ``start`` (id, workdir, backend, config digest, cmd, learn,
inject hosts, the launcher's pid, the configured domains),
``egress`` (host, port, kind, verdict, reason, up, down, dur; method, path,
status for HTTP requests; ``learn`` where the allow list would have refused),
``broker`` (argv, cwd, exit or refused, dur), ``sign`` (key, exit or refused,
dur), ``end`` (exit, dur).  Never a header value, a body or a token: the
servers never print one.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from libbroker.server_lines import parse_event

GENESIS = "agent-sandbox session record v1\n"
SUFFIX = ".jsonl"
_SERVER_EVENTS = {"egress-proxy": ("egress",)}
_MAX_LINE = 64 * 1024


class RecordError(Exception):
    """A record cannot be read or does not verify."""


def sessions_dir(home: str = "") -> str:
    """``$XDG_STATE_HOME/agent-sandbox/sessions`` (default ``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        home or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "agent-sandbox", "sessions")


def new_id() -> str:
    """A session id that sorts by start time: ``20250102-150405-1f4a2c``.

    The last six hex digits are the millisecond (three digits, 000-3e7) and
    three random ones: two sessions started in one second still sort in the
    order they started ("the newest" is the last), and two in one millisecond
    differ by chance, else :meth:`SessionRecord.start` draws again.
    """
    now = time.time()
    ms = int(now * 1000) % 1000
    return (time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + "-"
            + f"{ms:03x}" + os.urandom(2).hex()[:3])


def digest(data: bytes) -> str:
    # hashlib's sha256 from its C module (hostrun_fs.sha256): hashlib's import (OpenSSL's
    # _hashlib, _blake2: ~2.5 ms of CPU) came right after go, while a short command runs.
    from libbroker.launcher.hostrun_fs import sha256

    return sha256(data).hexdigest()


def genesis(session_id: str) -> str:
    """What the first line's ``prev`` is: the hash of GENESIS and the id."""
    return digest((GENESIS + session_id).encode())


def config_digest(cfg: Any) -> str:
    """SHA-256 of the effective config (a NamedTuple), canonical JSON."""
    body = cfg._asdict() if hasattr(cfg, "_asdict") else cfg
    return digest(json.dumps(body, sort_keys=True, default=repr).encode())


def exposed(directory: str, grants: tuple[str, ...]) -> str | None:
    """The granted path that contains ``directory``, if any (then the sandbox could reach it)."""
    from libbroker.paths import under

    real = os.path.realpath(directory)
    for grant in grants:
        if grant and (under(directory, grant) or under(real, os.path.realpath(grant))):
            return grant
    return None


def encode(obj: Mapping[str, object]) -> bytes:
    """One line's bytes (no newline): compact JSON, ASCII only (no line can split)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode()


class Record:
    """The appending end of one session's record; the launcher holds the only one."""

    def __init__(self, path: str, session_id: str, fd: int) -> None:
        self.path = path
        self.id = session_id
        self._fd = fd
        self._prev = genesis(session_id)
        self._seq = 0
        self.broken: str | None = None

    @classmethod
    def create(cls, directory: str, session_id: str) -> Record:
        """A new record file (0600, O_EXCL) in ``directory`` (made 0700); OSError."""
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
        if st.st_uid != os.getuid() or not os.path.isdir(directory) or os.path.islink(directory):
            raise OSError(f"{directory} is not a directory of ours")
        if st.st_mode & 0o077:
            os.chmod(directory, 0o700)
        path = os.path.join(directory, session_id + SUFFIX)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        return cls(path, session_id, os.open(path, flags, 0o600))

    def append(self, ev: str, fields: Mapping[str, object]) -> bool:
        """Chain and write one event; False (and :attr:`broken` says why) if it failed."""
        if self._fd < 0:
            return False
        body: dict[str, object] = {"seq": self._seq, "t": round(time.time(), 3), "ev": ev}
        body.update((k, v) for k, v in fields.items() if k not in ("seq", "ev", "prev"))
        body["prev"] = self._prev
        line = encode(body)
        try:
            data = line + b"\n"
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            self.broken = exc.strerror or str(exc)
            return False
        self._prev = digest(line)
        self._seq += 1
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def from_server(name: str, line: str) -> tuple[str, dict[str, Any]] | None:
    """A server's stdout line as (ev, fields) for the record, or None to skip.

    egress-proxy prints ``{"ev": "egress", ...}``; broker-server prints its
    audit lines (``--audit``): ``op`` exec becomes ``broker``, sign ``sign``;
    ping (a health check) is skipped.  Anything else (the ``listening`` line)
    is not an event.
    """
    obj = parse_event(line, _MAX_LINE)
    if obj is None:
        return None
    if name == "egress-proxy":
        ev = obj.pop("ev", None)
        return (ev, obj) if ev in _SERVER_EVENTS[name] else None
    if name == "broker-server":
        op = obj.get("op")
        if op == "ping":
            return None
        fields: dict[str, Any] = {}
        if op == "sign":
            fields["key"] = obj.get("key")
        else:
            fields["argv"] = obj.get("argv")
            fields["cwd"] = obj.get("cwd")
        if "refused" in obj:
            fields["refused"] = obj["refused"]
        else:
            fields["exit"] = obj.get("exit")
        fields["dur"] = obj.get("duration")
        fields["pid"] = obj.get("peer_pid")
        if obj.get("client_gone"):
            fields["client_gone"] = True
        return ("sign" if op == "sign" else "broker"), fields
    return None


# --- reading ---------------------------------------------------------------


def find(directory: str, which: str | None, *, last: bool = False) -> str:
    """The record named ``which`` (an id, a unique id prefix, or a path), else the newest."""
    if which and (os.sep in which or which.endswith(SUFFIX)) and os.path.isfile(which):
        return which
    names = listing(directory)
    if not names:
        raise RecordError(f"no session records in {directory}")
    if not which or last:
        return os.path.join(directory, names[-1] + SUFFIX)
    hits = [n for n in names if n.startswith(which)]
    if len(hits) != 1:
        raise RecordError(
            f"{'no' if not hits else 'more than one'} session record matches {which!r} "
            "(agent-sandbox report --list)"
        )
    return os.path.join(directory, hits[0] + SUFFIX)


def listing(directory: str) -> list[str]:
    """Session ids with a record in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RecordError(f"cannot read {directory}: {exc.strerror}") from None
    return sorted(n[: -len(SUFFIX)] for n in names if n.endswith(SUFFIX))


def read_lines(path: str) -> list[bytes]:
    """The record's raw lines (the last one may lack its newline: a cut)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror}") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def events(path: str) -> list[dict[str, Any]]:
    """Every event of the record that parses (for the report; :func:`verify` is stricter)."""
    out = []
    for raw in read_lines(path):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def verify(path: str) -> list[str]:
    """Problems with the record's chain and shape; empty when it is whole."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return [f"cannot read {path}: {exc.strerror}"]
    if not data:
        return ["the record is empty"]
    problems: list[str] = []
    if not data.endswith(b"\n"):
        problems.append("the last line is cut short (no newline)")
    lines = data.rstrip(b"\n").split(b"\n") if data.endswith(b"\n") else data.split(b"\n")
    prev: str | None = None
    for number, raw in enumerate(lines, 1):
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError
        except ValueError:
            problems.append(f"line {number}: not a JSON object")
            prev = digest(raw)
            continue
        if number == 1:
            sid = obj.get("id")
            if obj.get("ev") != "start" or not isinstance(sid, str):
                problems.append("line 1: not the session's start event")
                prev = obj.get("prev") if isinstance(obj.get("prev"), str) else ""
            else:
                prev = genesis(sid)
                name = os.path.basename(path)
                if name.endswith(SUFFIX) and name[: -len(SUFFIX)] != sid:
                    problems.append(f"line 1: the session id {sid} is not the file's name")
        if obj.get("prev") != prev:
            problems.append(f"line {number}: the chain breaks (a line before it was changed, "
                            "removed or added)")
        if obj.get("seq") != number - 1:
            problems.append(f"line {number}: seq is {obj.get('seq')!r}, expected {number - 1}")
        prev = digest(raw)
        if obj.get("ev") == "end" and number != len(lines):
            problems.append(f"line {number}: lines follow the end event")
    last = lines[-1] if lines else b""
    try:
        ended = json.loads(last).get("ev") == "end"
    except (ValueError, AttributeError):
        ended = False
    if not ended:
        problems.append("no end event: the record was cut, or the session is still running "
                        "(or its launcher was killed)")
    return problems


# --- the launcher's side ---------------------------------------------------------


def session_grants(cfg: Any, host: Any, rt_root: str) -> tuple[str, ...]:
    """Every tree the session's sandbox may read or write (as the shapes of
    ``agent_sandbox.bwrap_shape`` and ``landlock_shape`` grant)."""
    from libbroker.sandbox.shape import SYSTEM_READ

    return (*SYSTEM_READ, *host.python_dirs, host.project_dir, *cfg.read, rt_root,
            *cfg.write, cfg.workdir)


def check_private(cfg: Any, host: Any, rt_root: str) -> str:
    """The sessions directory, refused (LaunchError) when the sandbox could reach it."""
    from libbroker.errors import LaunchError

    directory = sessions_dir(cfg.home if cfg.home != "/" else "")
    grant = exposed(directory, session_grants(cfg, host, rt_root))
    if grant is not None:
        raise LaunchError(
            f"the session record's directory {directory} is inside {grant}, which the "
            "sandbox can reach: narrow that path, set XDG_STATE_HOME elsewhere, or "
            "record = false in config.toml"
        )
    return directory


class SessionRecord:
    """The launcher's record of one session: start, the servers' lines, end."""

    def __init__(self, rec: Record) -> None:
        from libbroker.launcher.refusals import Refusals

        self.rec = rec
        self.went = time.monotonic()
        self.said = False  # the one line about a record that cannot be written
        self.refusals = Refusals()  # said at the end, on stderr

    @classmethod
    def start(cls, directory: str, cfg: Any, cmd: list[str], backend: str,
              domains: tuple[str, ...] | None = None) -> SessionRecord:
        """Create the file and write the start event; OSError when it cannot be made.

        ``domains`` is the allow list as configured, before an agent's own
        hosts joined it: what ``report --propose`` merges into.
        """
        for _ in range(8):  # O_EXCL: an id taken in the same millisecond is drawn again
            sid = new_id()
            try:
                rec = Record.create(directory, sid)
                break
            except FileExistsError:
                continue
        else:
            raise OSError(f"no free session id in {directory}")
        made = cls(rec)
        made.add("start", {
            "id": sid, "workdir": cfg.workdir, "backend": backend,
            "config": config_digest(cfg), "cmd": list(cmd), "learn": bool(cfg.learn),
            "inject": list(cfg.inject), "pid": os.getpid(),
            "domains": list(cfg.domains if domains is None else domains),
        })
        return made

    def add(self, ev: str, fields: Mapping[str, object]) -> bool:
        """Append; the first failure is said on stderr once (then False each time)."""
        if self.rec.append(ev, fields):
            return True
        if not self.said:
            self.said = True
            os.write(2, f"agent-sandbox: cannot write the session record {self.rec.path}: "
                        f"{self.rec.broken}; brokered commands are refused from now on\n"
                        .encode())
        return False

    def server(self, name: str, line: str) -> bool | None:
        """A server's stdout line: recorded (True), failed (False), not an event (None)."""
        found = from_server(name, line)
        if found is None:
            return None
        self.refusals.add(*found)
        return self.add(*found)

    def end(self, status: int, error: str | None = None) -> None:
        """The end event; then, if anything was refused, one line on stderr that says so."""
        fields: dict[str, object] = {"exit": status,
                                     "dur": round(time.monotonic() - self.went, 3)}
        if error:
            fields["error"] = error
        self.add("end", fields)
        self.rec.close()
        line = self.refusals.line(self.rec.id)
        if line is not None:  # (with no stderr left to say it on, the record still holds it)
            with contextlib.suppress(OSError):
                os.write(2, (line + "\n").encode())
