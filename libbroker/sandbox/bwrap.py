"""bubblewrap: a shape's argv (pure), and the facts about the host it needs.

:func:`argv` is the one place a bwrap command line is built, for brokered
commands and for the agent's session.  Every sandbox gets all namespaces
unshared (``--unshare-all``: user, pid, net, ipc, uts, cgroup), no
capabilities (``--cap-drop ALL`` clears the bounding set too, so even a root
user holds nothing inside, and cannot ``umount`` what guards ``.git/hooks``),
a fresh /proc, /dev and /tmp, and nothing of the host's filesystem but what
the shape grants.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from libbroker.paths import under_any
from libbroker.sandbox.shape import Shape


@dataclass(frozen=True)
class Facts:
    """What exists on the host among a shape's paths, and merged-/usr links."""

    dirs: frozenset[str]
    files: frozenset[str]  # anything that exists and is not a directory
    links: Mapping[str, str]  # /bin -> usr/bin: recreated as a symlink, not bound


def facts(paths: Iterable[str]) -> Facts:
    """Stat each of ``paths`` once (following links, as bwrap's binds do)."""
    dirs: set[str] = set()
    files: set[str] = set()
    links: dict[str, str] = {}
    for path in set(paths):
        if os.path.islink(path):
            target = os.readlink(path)
            if not target.startswith("/") and os.path.dirname(path) == "/":
                links[path] = target  # a top-level relative link: /bin -> usr/bin
        if os.path.isdir(path):
            dirs.add(path)
        elif os.path.exists(path):
            files.add(path)
    return Facts(frozenset(dirs), frozenset(files), links)


def shape_paths(shape: Shape) -> list[str]:
    """Every path whose existence :func:`argv` asks about."""
    return [*shape.read, *shape.write, *shape.protect, *shape.deny, *shape.masked]


def argv(
    shape: Shape,
    host: Facts,
    *,
    info_fd: int | None = None,
    block_fd: int | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """bwrap's options (everything before ``--``) for ``shape``.  Pure."""
    out = ["--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
    if shape.new_session:
        out.append("--new-session")
    if shape.hostname:
        out += ["--hostname", shape.hostname]
    if info_fd is not None:
        out += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        out += ["--block-fd", str(block_fd)]
    # The private /tmp and the empty dirs come first: a grant that lives
    # under them (a venv in /tmp, ~/.cargo) is bound on top, not hidden beneath.
    out += ["--proc", "/proc", "--dev", "/dev"]
    if shape.tmp_size is not None:
        out += ["--size", str(shape.tmp_size)]  # applies to the next --tmpfs only
    out += ["--tmpfs", "/tmp", "--dir", "/var/tmp"]
    for path in shape.empty:
        out += ["--tmpfs", path]
    exists = host.dirs | host.files
    for path in shape.read:
        if under_any(path, shape.deny):
            continue
        if path in host.links:
            out += ["--symlink", host.links[path], path]
        elif path in exists:
            out += ["--ro-bind", path, path]
    for path in shape.masked:
        if path in host.files:
            out += ["--ro-bind", "/dev/null", path]
    for path in shape.write:
        if path in exists and not under_any(path, shape.deny):
            out += ["--bind", path, path]
    for path in shape.protect:
        if path in exists:
            out += ["--ro-bind", path, path]
    # Denials come last so that they cover whatever was bound above them.
    for path in shape.deny:
        if path in host.dirs:
            out += ["--tmpfs", path, "--remount-ro", path]
        elif path in host.files:
            out += ["--ro-bind", "/dev/null", path]
    out += ["--chdir", shape.cwd]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    return out


def seccomp_pipe(prog: bytes) -> int:
    """A pipe's read end holding ``prog``, for ``--seccomp FD`` (the caller closes it)."""
    r, w = os.pipe()
    try:
        os.write(w, prog)  # a few hundred bytes: well under a pipe's buffer
    finally:
        os.close(w)
    return r
