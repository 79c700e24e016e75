"""The directories a launcher hands the gate service, judged by their fds, never by its words.

The launcher passes ``O_PATH`` descriptors (``SCM_RIGHTS``): its workdir, then
each ``.git``.  The service (root) binds and marks only what it proves here:

- each is a directory owned by the peer's uid (``fstat`` of the fd it sent);
- the workdir's kernel name (``/proc/self/fd``: the kernel's, not the client's)
  opens, from the service's own root with no link followed (openat2
  ``RESOLVE_NO_SYMLINKS``), to that very inode: the service's fd, not the
  client's, is what gets bound, so the place cannot change between the check
  and the mount; ``/`` is refused;
- each ``.git`` opens *beneath* the service's workdir fd, on its mount, with no
  link followed (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV``), to
  the very inode the client sent, and is named ``.git``;
- none is a mount point already (its mount's id against its parent's), and the
  workdir neither lies in nor holds a workdir the service gates now.

The rule itself is :func:`libpolicy.hostrun_gate_service.dir_refusal`; this
gathers the facts.  On a refusal every fd opened here is closed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable

from libbroker.launcher.hostrun_binds import open_beneath
from libpolicy import hostrun_gate_service as proto

_O_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """One line: why the service binds nothing for this launcher."""


class Verified:
    """The service's own fds on the workdir and each ``.git`` (close with :meth:`close`)."""

    def __init__(self, workdir: str, workdir_fd: int) -> None:
        self.workdir = workdir  # the kernel's name, in the service's namespace
        self.opened: dict[str, int] = {"": workdir_fd}
        self.gits: list[str] = []  # relative to the workdir

    def close(self) -> None:
        for fd in self.opened.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.opened = {}


def _name(fd: int) -> str:
    name = os.readlink(f"/proc/self/fd/{fd}")
    if not name.startswith("/") or name.endswith(" (deleted)"):
        return ""
    return name


def _mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
        for line in fh:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    return -1


def _is_mount_point(fd: int) -> bool:
    """Whether a mount lies on ``fd``'s directory: ``..`` from a mount's root crosses to
    the mount beneath (and ``/``'s is itself)."""
    up = os.open("..", _O_PATH_DIR, dir_fd=fd)
    try:
        return _mount_id(up) != _mount_id(fd)
    finally:
        os.close(up)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _judge(mine: int, theirs: os.stat_result, peer_uid: int,
           facts: Callable[[bool], proto.Dir], *, workdir: bool) -> None:
    """Refused (``mine`` closed) unless the pure rule accepts the directory's facts;
    ``facts`` gets whether the service's own fd (``mine``, -1 for none) is the client's."""
    try:
        here = mine >= 0 and _same(os.fstat(mine), theirs)
        why = proto.dir_refusal(facts(here), workdir=workdir, peer_uid=peer_uid)
        if why is not None:
            raise Refused(why)
    except BaseException:
        if mine >= 0:
            os.close(mine)
        raise


def verify(fds: list[int], peer_uid: int, gated: list[str]) -> Verified:
    """The service's fds on the directories ``fds`` (the client's: the caller closes them)
    name; :class:`Refused` with one line when any is refused.  ``gated``: the workdirs
    the service gates now."""
    theirs = os.fstat(fds[0])
    name = _name(fds[0])
    mine = -1
    if name and name != "/":
        top = os.open("/", _O_PATH_DIR)
        try:
            with contextlib.suppress(OSError):
                mine = open_beneath(top, name.lstrip("/"), _O_PATH_DIR)
        finally:
            os.close(top)
    _judge(mine, theirs, peer_uid, lambda here: proto.Dir(
        is_dir=stat.S_ISDIR(theirs.st_mode), owner=theirs.st_uid, here=here,
        beneath=True, named_git=True, root=name == "/",
        mount_point=here and _is_mount_point(mine),
        in_gated=any(g == name or g.startswith(name + "/") or name.startswith(g + "/")
                     for g in gated)), workdir=True)
    found = Verified(name, mine)
    try:
        for fd in fds[1:]:
            rel, git = _git(fd, found, peer_uid)
            if rel in found.opened:
                raise Refused("a .git passed twice")
            found.opened[rel] = git
            found.gits.append(rel)
    except BaseException:
        found.close()
        raise
    return found


def _git(fd: int, found: Verified, peer_uid: int) -> tuple[str, int]:
    """One ``.git``: (its path relative to the workdir, the service's fd on it)."""
    theirs = os.fstat(fd)
    name = _name(fd)
    rel = name[len(found.workdir) + 1:] if name.startswith(found.workdir + "/") else ""
    mine = -1
    if rel:
        with contextlib.suppress(OSError):
            mine = open_beneath(found.opened[""], rel, _O_PATH_DIR, same_mount=True)
    _judge(mine, theirs, peer_uid, lambda here: proto.Dir(
        is_dir=stat.S_ISDIR(theirs.st_mode), owner=theirs.st_uid, here=here or not rel,
        beneath=here, named_git=rel.rsplit("/", 1)[-1] == ".git", root=False,
        mount_point=here and _is_mount_point(mine), in_gated=False), workdir=False)
    return rel, mine
