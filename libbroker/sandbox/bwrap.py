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

import json
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from libbroker.named_tuple import NamedTuple
from libbroker.paths import under, under_any
from libbroker.sandbox.shape import Shape

# Where a directory rebuilt for an overlay keeps the host's original, bound
# read-only: its entries in the rebuilt directory are symlinks into it.
HIDDEN = "/.agent-sandbox-host"
# bwrap dies ("Exceeded maximum number of arguments 9000") past this many
# arguments, its own argv included (bubblewrap.c, parse_args_recurse).
MAX_ARGS = 9000


class Facts(NamedTuple):
    """What exists on the host among a shape's paths, and merged-/usr links."""

    dirs: frozenset[str]
    files: frozenset[str]  # anything that exists and is not a directory
    links: Mapping[str, str]  # /bin -> usr/bin: recreated as a symlink, not bound
    # An overlay's deepest existing directory (when its path does not exist),
    # with the names in it: the directory is rebuilt to hold the overlay.
    listings: Mapping[str, tuple[str, ...]] = MappingProxyType({})  # shared: read-only


def facts(paths: Iterable[str], overlays: Iterable[str] = ()) -> Facts:
    """Stat each of ``paths`` once (following links, as bwrap's binds do).

    For each of ``overlays`` (paths inside) that does not exist, its deepest
    existing directory is listed.
    """
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
    listings: dict[str, tuple[str, ...]] = {}
    for path in overlays:
        if os.path.exists(path):
            files.add(path)
            continue
        parent = os.path.dirname(path)
        while parent != "/" and not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        try:
            listings[parent] = tuple(sorted(os.listdir(parent)))
        except OSError:
            continue
    return Facts(frozenset(dirs), frozenset(files), links, listings)


def shape_paths(shape: Shape) -> list[str]:
    """Every path whose existence :func:`argv` asks about (overlays: :func:`shape_facts`)."""
    return [*shape.read, *shape.write, *shape.protect, *shape.deny, *shape.masked]


def shape_facts(shape: Shape) -> Facts:
    """:func:`facts` for everything :func:`argv` asks about in ``shape``."""
    return facts(shape_paths(shape), [inside for _, inside in shape.overlays])


def _overlays(shape: Shape, host: Facts) -> list[str]:
    """The overlays' options, after the read-only binds they may lie in.

    A path that exists on the host is simply bound over.  One that does not
    would need its directories made, which a read-only bind refuses: its
    deepest existing directory D, when it lies in a tree bound from the host,
    is rebuilt.  The host's D is bound read-only at HIDDEN/D, a tmpfs covers D,
    each of D's entries becomes a relative symlink into HIDDEN/D (so what follows in
    the argv, as the masked files, lands on the host's entry), the overlay is
    bound in, and D is made read-only again.  Symlinks, not binds: a bind per
    entry of /etc costs ~0.13 ms each, 141 of them ~19 ms; the links ~0.6 ms.
    """
    out: list[str] = []
    bound = [*shape.read, *shape.write]
    rebuilt: dict[str, list[tuple[str, str]]] = {}
    for src, inside in shape.overlays:
        bases = [d for d in host.listings if under(inside, d) and d != inside]
        base = max(bases, key=len) if bases else None
        if inside in host.files or base is None or not under_any(base, bound):
            out += ["--ro-bind", src, inside]  # bwrap makes any directory in its own tmpfs
        else:
            rebuilt.setdefault(base, []).append((src, inside))
    for base, pairs in rebuilt.items():
        hidden = HIDDEN + base
        out += ["--ro-bind", base, hidden, "--tmpfs", base]
        for name in host.listings[base]:
            # Relative: bwrap resolves links as it builds the root under its
            # own mount point, where an absolute one would name the host's.
            target = os.path.relpath(os.path.join(hidden, name), base)
            out += ["--symlink", target, os.path.join(base, name)]
        for src, inside in pairs:
            out += ["--ro-bind", src, inside]
        out += ["--remount-ro", base]
    return out


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
    out += _overlays(shape, host)
    for path in shape.masked:
        if path in host.files:
            out += ["--ro-bind", "/dev/null", path]
    for path in shape.write:
        if path in exists and not under_any(path, shape.deny):
            out += ["--bind", path, path]
    for src, inside in shape.binds:  # bwrap makes the directories in its own tmpfs
        out += ["--bind", src, inside]
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


def read_info(fd: int) -> int | None:
    """The sandbox's pid (as the host sees it) from bwrap's ``--info-fd``; None if bwrap
    ended first.  Blocks until bwrap has made the namespaces."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        data += chunk
        pid = info_pid(data)
        if pid is not None or not chunk:
            return pid


def info_pid(data: bytes) -> int | None:
    """The sandbox's pid in what bwrap wrote on its ``--info-fd``; None while it is not whole
    (or not what bwrap writes)."""
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def seccomp_pipe(prog: bytes) -> int:
    """A pipe's read end holding ``prog``, for ``--seccomp FD`` (the caller closes it)."""
    r, w = os.pipe()
    try:
        os.write(w, prog)  # a few hundred bytes: well under a pipe's buffer
    finally:
        os.close(w)
    return r
