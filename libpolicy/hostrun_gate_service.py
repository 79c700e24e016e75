"""The gate service's protocol and decisions (docs/hostrun-gate.md, "The service").

Pure: ``agent-sandbox gate-service`` (root, :mod:`libbroker.launcher.gate_service`)
and the launcher's side (:mod:`libbroker.launcher.hostrun_gate_client`) move
the bytes and bring the facts; this says what a frame is, what a request may
hold, which directories the service binds, and who judges each open.

Frames: a 4-byte big-endian length, then one JSON object in UTF-8, at most
:data:`MAX_FRAME` bytes.  The conversation:

- launcher: ``{"op": "gate", "dirs": N}`` with N ``O_PATH`` descriptors
  (``SCM_RIGHTS``, on the frame's first byte): the workdir, then each ``.git``;
- service: ``{"op": "ready", "workdir": PATH, "gits": N}`` once bound and
  marked, or ``{"op": "refused", "why": LINE}`` and the end;
- service: ``{"op": "ask", "id": N, "pid": P, "comm": C, "exec": B, "path": PATH,
  "stat": [dev, ino, mode, size, mtime_ns, ctime_ns]}`` for an open by the
  session's user; launcher: ``{"op": "answer", "id": N, "allow": B}``;
- launcher: ``{"op": "stop"}``; service: ``{"op": "stopped", "lines": [...], "locks":
  [[path, dev, ino, comm], ...]}``: the empty lock files that creates it refused left
  (libbroker's ``hostrun_locks``), pinned until the launcher, which removes them
  with its own credentials, says ``{"op": "done", "removed": [path, ...]}``.

The service never hands the launcher a descriptor: only names and numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from libbroker.named_tuple import NamedTuple

MAX_FRAME = 64 * 1024  # any frame; a request's path is at most PATH_MAX
MAX_DIRS = 200  # the workdir and 199 .git (SCM_RIGHTS carries at most 253 fds at once)
HEADER = 4

ALLOW, ASK, REFUSE = "allow", "ask", "refuse"

DEFAULT_SOCKET = "/run/agent-sandbox/gate.sock"
SOCKET_ENV = "AGENT_SANDBOX_GATE_SOCKET"  # the launcher's and the tests' override; "off"


def socket_path(environ: Mapping[str, str]) -> str:
    """Where a launcher looks for the service ("" when told not to)."""
    named = environ.get(SOCKET_ENV)
    if named is None:
        return DEFAULT_SOCKET
    return "" if named in ("", "off") else named


class FrameError(ValueError):
    """A frame that is not one: the connection ends, with this line logged."""


def encode(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"a frame of {len(body)} bytes (at most {MAX_FRAME})")
    return len(body).to_bytes(HEADER, "big") + body


def length(header: bytes) -> int:
    """The body's length a header announces; FrameError over :data:`MAX_FRAME` or 0."""
    n = int.from_bytes(header, "big")
    if n == 0 or n > MAX_FRAME:
        raise FrameError(f"a frame length of {n} (1 to {MAX_FRAME} bytes)")
    return n


def decode(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise FrameError("a frame that is not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("op"), str):
        raise FrameError("a frame that is not an object with an \"op\"")
    return obj


_SHAPES: dict[str, dict[str, type]] = {
    "gate": {"dirs": int},
    "answer": {"id": int, "allow": bool},
    "stop": {},
    "done": {"removed": list},
}


def request(obj: dict[str, Any], expected: tuple[str, ...]) -> dict[str, Any]:
    """``obj`` checked as one of the launcher's requests in ``expected``; FrameError else."""
    op = obj["op"]
    if op not in expected:
        raise FrameError(f"a request {op[:40]!r} here (expected {' or '.join(expected)})")
    shape = _SHAPES[op]
    extra = sorted(set(obj) - set(shape) - {"op"})
    if extra:
        raise FrameError(f"an unknown key {extra[0][:40]!r} in {op!r}")
    for key, kind in shape.items():
        value = obj.get(key)
        # bool is an int in Python: an "id" of true is not an id
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise FrameError(f"{op!r}: {key!r} must be {kind.__name__}")
    if op == "gate" and not 1 <= obj["dirs"] <= MAX_DIRS:
        raise FrameError(f"'gate': {obj['dirs']} directories (1 to {MAX_DIRS})")
    return obj


def route(*, fsuid: int | None, tgid: int | None, session_uid: int, launcher: int) -> str:
    """Who answers an open through a gated mount.

    Another uid's open (root's, another user's) is allowed at once: the session's
    user must not be able to deny it, and git refuses a repository another user owns
    anyway.  The launcher's own opens, at once: it never waits on itself.  Every
    other open by the session's user goes to the launcher.  An opener the service
    cannot identify is refused (it is being killed, or its /proc cannot be read).
    """
    if fsuid is None or tgid is None:
        return REFUSE
    if fsuid != session_uid:
        return ALLOW
    if tgid == launcher:
        return ALLOW
    return ASK


class Dir(NamedTuple):
    """What the service found out about one directory the launcher passed."""

    is_dir: bool
    owner: int
    here: bool  # its kernel name opens, without links, to this very inode in our namespace
    beneath: bool  # (a .git) that inode lies beneath the workdir, on its mount
    named_git: bool  # (a .git) its name is .git
    root: bool  # it is "/"
    mount_point: bool  # a mount lies on it already (another session's gate, or any)
    in_gated: bool  # it lies inside, or holds, a workdir the service gates now


def dir_refusal(d: Dir, *, workdir: bool, peer_uid: int) -> str | None:
    """Why the service does not bind this directory (None: it does).  In this order: the
    cheapest facts first, each refusal one line."""
    what = "the workdir" if workdir else "a .git"
    if not d.is_dir:
        return f"{what} is not a directory"
    if d.owner != peer_uid:
        return f"{what} is owned by uid {d.owner}, not by the peer's uid {peer_uid}"
    if workdir and d.root:
        return "the workdir is /"
    if not d.here:
        return (f"{what}'s path passes through a link, or names another directory in the "
                "service's mount namespace")
    if not workdir and not d.beneath:
        return "a .git does not lie beneath the workdir (on its mount)"
    if not workdir and not d.named_git:
        return "a directory passed as a .git is not named .git"
    if d.mount_point:
        return f"{what} is a mount point already (another session's live gate?)"
    if d.in_gated:
        return f"{what} lies inside, or holds, a workdir gated now"
    return None
