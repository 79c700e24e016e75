"""What a sandbox grants, as data: one :class:`Shape` for every sandbox we start.

Two producers (the broker's ``--profile`` for each brokered command, and the
launcher's plan for the agent's session) describe their sandbox as a Shape;
the backends turn it into bwrap's argv (:mod:`.bwrap`) or a Landlock ruleset
(:mod:`.landlock`).  The Shape knows no config file and no policy: callers
bring those (nono's cut: the sandbox library is mechanism).

Pure data; :meth:`Shape.to_json` / :func:`from_json` carry it to the
Landlock session helper, a separate process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

from libbroker.named_tuple import NamedTuple

SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
"""System directories every sandbox may read (those that exist are granted)."""

MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
"""Readable system files that hold secrets when the sandbox's user is root."""

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
"""Device nodes every Landlock sandbox may open (bwrap makes its own /dev)."""

TERMINAL_DEVICES = ("/dev/tty", "/dev/ptmx", "/dev/pts")
"""What an interactive session adds: its terminal, and new ptys for shells and tmux.

Never /dev/shm: under Landlock it is the host's, shared with every process
of the user (bwrap's /dev has a private one)."""


class Shape(NamedTuple):
    """Everything one sandbox grants.  Paths are absolute and normalized.

    Each field is an intent; how each backend realises it, or why it cannot,
    is that backend's :attr:`~.backend.Backend.realises` (both say something
    of every field: tests/sandbox/test_backends.py).  In short:

    ``read`` and ``write`` are trees (or single files) granted read-only and
    read-write; the later wins where they nest (``write`` after ``read``).
    ``protect`` holds existing paths inside a writable tree read-only (bwrap;
    Landlock cannot take rights back inside a granted tree: the session's
    helper binds them read-only in a mount namespace of its own, or refuses).  ``deny`` hides a
    path even inside a grant (bwrap); Landlock refuses a deny inside a grant.
    ``masked`` files read as empty.  ``empty`` directories are replaced by an
    empty writable tmpfs (bwrap: the home directory, before grants under it).
    ``tcp_connect`` are the only TCP ports a Landlock sandbox may connect to
    (bwrap has a network namespace of its own: nothing but what is relayed in).
    ``tmp`` is a private directory granted read-write and named by TMPDIR
    (Landlock); bwrap mounts a fresh /tmp instead, of at most ``tmp_size``
    bytes when that is set (a tmpfs is memory: unbounded, it can take the
    host's).  ``overlays`` are ``(host file, path inside)`` pairs: the file is
    mounted read-only at that path, over whatever the host has there, even
    where the path's directory does not exist (bwrap; Landlock mounts nothing
    and ignores them).  ``binds`` are ``(host directory, path inside)`` pairs
    bound read-write (bwrap only): the session's private copy of a repository's
    config lives there (:mod:`libbroker.launcher.hostrun_gitconfig`).
    """

    read: tuple[str, ...] = SYSTEM_READ
    write: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    protect: tuple[str, ...] = ()
    masked: tuple[str, ...] = MASKED_FILES
    empty: tuple[str, ...] = ()
    devices: tuple[str, ...] = DEVICES
    tcp_connect: tuple[int, ...] = ()
    cwd: str = "/"
    env: Mapping[str, str] = MappingProxyType({})  # shared: read-only
    tmp: str = ""
    tmp_size: int | None = None
    new_session: bool = True
    hostname: str = ""
    overlays: tuple[tuple[str, str], ...] = ()
    binds: tuple[tuple[str, str], ...] = ()
    links: tuple[str, ...] = ()  # symlinks made mount points (Landlock; bwrap: the launcher)

    def early(self) -> Shape:
        """What the Landlock session's helper makes before go, and nothing else: the
        session flag and the mount namespace's binds, links and holds (the rest default)."""
        return Shape(new_session=self.new_session, binds=self.binds, links=self.links,
                     protect=self.protect)

    def to_json(self) -> str:
        body = self._asdict()
        body["env"] = dict(self.env)
        return json.dumps(body)


def from_json(text: str | bytes) -> Shape:
    """The Shape :meth:`Shape.to_json` wrote; ValueError for anything else."""
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("a shape is a JSON object")
    fields = Shape._fields
    unknown = set(body) - set(fields)
    if unknown:
        raise ValueError(f"unknown shape field {sorted(unknown)[0]!r}")
    args: dict[str, object] = {}
    for name, value in body.items():
        if isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        args[name] = value
    return Shape(**args)  # type: ignore[arg-type]
