"""The mechanism that makes :class:`~.limits.Limits` real: cgroups, else rlimits (I/O).

A :class:`Group` is one sandbox's limits made real: made with
:func:`create`, joined by the sandboxed child itself before it execs
(:func:`join_self`: it writes ``0``, "me", to each ``cgroup.procs``), or by
its parent for a process tree that waits (:func:`move_tree`), read for what
was hit (:func:`.cgroup_report.report`) and removed with what is left in it
(:func:`remove`).
Group names carry their creator's pid (``agent-sandbox-PID-TAG``) so that
the groups of a process killed by SIGKILL are found again (:func:`reclaim`).
Which mechanism, strongest first, is :mod:`.limits`' module doc.

Only ``os`` and ``resource``: the launcher imports this on its start path.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from typing import TYPE_CHECKING

from libbroker.named_tuple import NamedTuple
from libbroker.sandbox.limits import (
    CPU_PERIOD_US,
    PREFIX,
    Limits,
)

if TYPE_CHECKING:
    from collections.abc import Iterable


class Mechanism(NamedTuple):
    """How limits are made real here: a cgroup kind and where groups go, or rlimits.

    ``bases`` are (controllers, directory) pairs: one for cgroup v2, one per
    hierarchy for v1 (memory, pids, and cpu when it is mounted).  ``why``
    says why nothing stronger applies (doctor shows it with a fix).
    """

    kind: str  # "cgroup2" | "cgroup1" | "rlimit"
    bases: tuple[tuple[str, str], ...] = ()
    delegated: bool = False
    why: str = ""

    def describe(self) -> str:
        if self.kind == "cgroup2":
            how = "a delegated cgroup v2 subtree" if self.delegated else "a cgroup v2 child group"
            return f"{how} under {self.bases[0][1]}"
        if self.kind == "cgroup1":
            where = ", ".join(base for _, base in self.bases)
            names = ", ".join(name for name, _ in self.bases)
            return f"cgroup v1 child groups ({names}) under {where}"
        return "rlimits (RLIMIT_NPROC, RLIMIT_DATA, RLIMIT_FSIZE): " + self.why


def read_text(path: str) -> str:
    """A small kernel file's text; "" when it cannot be read (gone, not ours)."""
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _writable(directory: str) -> bool:
    return os.access(directory, os.W_OK | os.X_OK) and os.access(
        os.path.join(directory, "cgroup.procs"), os.W_OK
    )


def discover(mounts: str, cgroups: str) -> Mechanism:
    """The strongest mechanism, from /proc/self/mounts and /proc/self/cgroup text."""
    v2_mount = ""
    v1_mounts: dict[str, str] = {}
    for line in mounts.splitlines():
        words = line.split()
        if len(words) < 4:
            continue
        if words[2] == "cgroup2" and not v2_mount:
            v2_mount = words[1]
        elif words[2] == "cgroup":
            for option in words[3].split(","):
                v1_mounts.setdefault(option, words[1])
    v2_path = ""
    v1_paths: dict[str, str] = {}
    for line in cgroups.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":
            v2_path = path
        for name in controllers.split(","):
            v1_paths[name] = path
    why = "no cgroup v2 subtree with the memory and pids controllers is writable here"
    if v2_mount and v2_path.startswith("/"):
        directory = os.path.normpath(v2_mount + v2_path)
        while True:
            enabled = read_text(os.path.join(directory, "cgroup.subtree_control")).split()
            if "memory" in enabled and "pids" in enabled and _writable(directory):
                return Mechanism(
                    "cgroup2",
                    (("memory,pids" + (",cpu" if "cpu" in enabled else ""), directory),),
                    delegated=os.geteuid() != 0,
                )
            if directory == os.path.normpath(v2_mount):
                break
            directory = os.path.dirname(directory)
    bases = []
    for name in ("memory", "pids", "cpu"):
        if name in v1_mounts and name in v1_paths:
            directory = os.path.normpath(v1_mounts[name] + v1_paths[name])
            if _writable(directory):
                bases.append((name, directory))
    if {"memory", "pids"} <= {name for name, _ in bases}:
        return Mechanism("cgroup1", tuple(bases))
    if v1_mounts.keys() & {"memory", "pids"}:
        why += "; the cgroup v1 memory and pids hierarchies are root's"
    return Mechanism("rlimit", why=why)


_chosen: Mechanism | None = None


def mechanism() -> Mechanism:
    """This process's mechanism, looked up once (``AGENT_SANDBOX_LIMITS=rlimit``: the fallback)."""
    global _chosen
    if _chosen is None:
        if os.environ.get("AGENT_SANDBOX_LIMITS") == "rlimit":
            _chosen = Mechanism("rlimit", why="AGENT_SANDBOX_LIMITS=rlimit")
        else:
            _chosen = discover(read_text("/proc/self/mounts"), read_text("/proc/self/cgroup"))
    return _chosen


# --- one sandbox's limits -----------------------------------------------------------


class Group(NamedTuple):
    """One sandbox's limits, made real.

    ``dirs``: the cgroup directories made for it (none under rlimits).
    ``rlimits``: (resource, value) pairs set as both soft and hard limits,
    so nothing inside can raise them again.  ``userns``: the creator's user
    namespace (RLIMIT_NPROC counts per namespace: see :func:`join_self`).
    Plain data: the Landlock session helper gets it as JSON (:meth:`entry`).
    """

    limits: Limits
    kind: str
    dirs: tuple[str, ...] = ()
    rlimits: tuple[tuple[int, int], ...] = ()
    userns: int = 0

    def entry(self) -> dict[str, object]:
        """What :func:`join_self` needs, as JSON-able data."""
        return {
            "dirs": list(self.dirs),
            "rlimits": [list(r) for r in self.rlimits],
            "tasks": self.limits.tasks,
            "userns": self.userns,
        }


def user_tasks(uid: int) -> int:
    """How many tasks (threads included) ``uid`` runs now: RLIMIT_NPROC counts those."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if os.stat(f"/proc/{name}").st_uid == uid:
                stat = read_text(f"/proc/{name}/stat")
                count += int(stat.rsplit(")", 1)[1].split()[17])  # num_threads
    return count


def _rlimits(limits: Limits, tasks_above: int) -> tuple[tuple[int, int], ...]:
    out = []
    if limits.tasks is not None:
        out.append((resource.RLIMIT_NPROC, tasks_above + limits.tasks))
    if limits.memory is not None:
        out.append((resource.RLIMIT_DATA, limits.memory))
    if limits.tmp is not None:
        out.append((resource.RLIMIT_FSIZE, limits.tmp))
    return tuple(out)


def _write(directory: str, name: str, value: str) -> None:
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def create(limits: Limits, tag: str, mech: Mechanism | None = None) -> Group:
    """The group for one sandbox, limits written; OSError if it cannot be made.

    ``tag`` tells the groups of one process apart (``session``, a counter).
    Under rlimits nothing is made: the values are computed for the child.
    """
    mech = mech or mechanism()
    if _pending:
        flush_pending()
    if mech.kind == "rlimit":
        above = user_tasks(os.getuid()) if limits.tasks is not None else 0
        return Group(limits, "rlimit", rlimits=_rlimits(limits, above), userns=_userns(0))
    if limits.tasks is None and limits.memory is None and limits.cpu is None:
        return Group(limits, mech.kind)  # every limit off: no group to make
    name = f"{PREFIX}{os.getpid()}-{tag}"
    made: list[str] = []
    try:
        for controllers, base in mech.bases:
            if controllers == "cpu" and limits.cpu is None:
                continue
            directory = os.path.join(base, name)
            os.mkdir(directory, 0o755)
            made.append(directory)
            _configure(mech.kind, controllers.split(","), directory, limits)
    except OSError:
        remove(Group(limits, mech.kind, tuple(made)))
        raise
    return Group(limits, mech.kind, tuple(made))


def _configure(kind: str, controllers: list[str], directory: str, limits: Limits) -> None:
    v2 = kind == "cgroup2"
    if "memory" in controllers and limits.memory is not None:
        _write(directory, "memory.max" if v2 else "memory.limit_in_bytes", str(limits.memory))
        # Swap counts too: a hog that may swap takes the host's disk and
        # responsiveness with it instead of ending.
        swap = "memory.swap.max" if v2 else "memory.memsw.limit_in_bytes"
        if os.path.exists(os.path.join(directory, swap)):
            _write(directory, swap, "0" if v2 else str(limits.memory))
    if "pids" in controllers and limits.tasks is not None:
        _write(directory, "pids.max", str(limits.tasks))
    if "cpu" in controllers and limits.cpu is not None:
        quota = max(1000, int(limits.cpu * CPU_PERIOD_US))
        if v2:
            _write(directory, "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            _write(directory, "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(directory, "cpu.cfs_quota_us", str(quota))


def join_self(entry: dict[str, object]) -> None:
    """In the sandboxed child, before it execs: into each group, under each rlimit.

    ``entry`` is :meth:`Group.entry`.  ``0`` written to ``cgroup.procs`` is
    "the writer", so the child moves itself: everything it starts afterwards
    is born inside.  RLIMIT_NPROC counts the tasks of the user *in the
    task's user namespace*: in a namespace of its own (the Landlock PID
    namespace's) that count starts near zero, so the limit is the task limit
    itself rather than the creator's count plus it.  OSError if any step
    fails (the caller must not exec).
    """
    for directory in entry.get("dirs", ()):  # type: ignore[attr-defined]
        _write(str(directory), "cgroup.procs", "0")
    rlimits = [(int(w), int(v)) for w, v in entry.get("rlimits", ())]  # type: ignore[attr-defined]
    if entry.get("userns", 0) != _userns(0):
        tasks = entry.get("tasks")
        rlimits = inner_rlimits(rlimits, tasks if isinstance(tasks, int) else None)
    for which, value in rlimits:
        resource.setrlimit(which, (value, value))


def inner_rlimits(rlimits: Iterable[tuple[int, int]], tasks: int | None) -> list[tuple[int, int]]:
    """``rlimits`` for a process in a user namespace other than their maker's.

    RLIMIT_NPROC counts the tasks of the user in the task's own user
    namespace: in a new one (bwrap's, the Landlock PID namespace's) that count
    starts near zero, so the limit is the task limit itself rather than the
    maker's count plus it.  The others mean the same everywhere.
    """
    return [
        (which, tasks if which == resource.RLIMIT_NPROC and tasks else value)
        for which, value in rlimits
    ]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                out += [int(p) for p in read_text(f"/proc/{pid}/task/{task}/children").split()]
    return out


def move_tree(group: Group, root: int) -> int:
    """Put ``root`` and every process below it into ``group``; how many there are.

    For a tree that waits (bwrap's, before the session's go byte).  Top
    down: a process is moved before its children are listed, so a child it
    forks meanwhile is born inside, and one forked before is listed (a
    migration waits for every fork in flight: the threadgroup rwsem).  A
    process already in a cgroup is not written again: the first write after
    a quiet spell waits a kernel grace period (that rwsem's, 5-30 ms), so a
    session moves its tree early, in a thread, and again at go, where
    nothing is left to write.

    Under rlimits each process gets them by prlimit (:func:`inner_rlimits`
    inside another user namespace), but nothing orders a prlimit with a
    fork in flight: a child whose limits were copied just before it, and
    which joins its parent's children just after they were listed, keeps
    the old ones (shown by hand: a process forking in a loop, one child
    escaped a prlimit and listing of its parent in five runs of eight).  So
    this walk is only the second line for rlimits: the process that starts
    the command sets its own first (bwrap's forwarder, ``--rlimit``; a
    Landlock or brokered command: :func:`join_self`).
    """
    own_ns = _userns(os.getpid())
    inside = [frozenset(_members(directory)) for directory in group.dirs]
    queue, seen = [root], set()
    while queue:
        pid = queue.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        try:
            if group.kind == "rlimit":
                rlimits = group.rlimits
                if _userns(pid) != own_ns:
                    rlimits = tuple(inner_rlimits(rlimits, group.limits.tasks))
                for which, value in rlimits:
                    resource.prlimit(pid, which, (value, value))
            else:
                for directory, members in zip(group.dirs, inside, strict=True):
                    if pid not in members:
                        _write(directory, "cgroup.procs", str(pid))
        except ProcessLookupError:
            continue  # gone meanwhile: nothing to hold
        queue += _children(pid)
    return len(seen)


def _userns(pid: int) -> int:
    """The inode of ``pid``'s user namespace (0: this process's own)."""
    try:
        return os.stat(f"/proc/{pid or 'self'}/ns/user").st_ino
    except OSError:
        return 0


# --- the end ----------------------------------------------------------------------


def _members(directory: str) -> list[int]:
    procs = read_text(os.path.join(directory, "cgroup.procs"))
    return [int(p) for p in procs.split() if p.isdigit()]


def _kill_members(directory: str) -> None:
    """SIGKILL what is left in a group (each pid checked, through a pidfd, to still be in it)."""
    if os.path.exists(os.path.join(directory, "cgroup.kill")):
        with contextlib.suppress(OSError):
            _write(directory, "cgroup.kill", "1")
            return
    name = os.path.basename(directory)
    for pid in _members(directory):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if f"/{name}\n" in read_text(f"/proc/{pid}/cgroup"):
                import signal

                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


_pending: list[str] = []  # groups whose last tasks were still exiting: retried later


def remove(group: Group, timeout: float = 2.0) -> None:
    """Remove the group's directories, killing what is left in them; never raises.

    With ``timeout=0`` (a server's event loop must not wait) a group whose
    tasks are still exiting (bwrap's pid namespace dies asynchronously) is
    retried by the next :func:`create` and by :func:`flush_pending`.
    """
    for directory in reversed(group.dirs):
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.rmdir(directory)
                break
            except FileNotFoundError:
                break
            except OSError:
                _kill_members(directory)
                if time.monotonic() >= deadline:
                    if timeout == 0 and directory not in _pending:
                        _pending.append(directory)
                    break  # else reclaim() takes it later
                time.sleep(0.005)


def flush_pending(timeout: float = 0.0) -> None:
    """Retry the groups :func:`remove` could not remove at once."""
    dirs = tuple(_pending)
    _pending.clear()
    for directory in dirs:
        remove(Group(Limits(), "pending", (directory,)), timeout)


RECORD = "cgroups"
"""The file, in a session's runtime directory, naming its groups (for the janitor)."""


def record(group: Group, directory: str) -> None:
    """Name ``group``'s directories in ``directory``/cgroups, for :func:`remove_recorded`."""
    if group.dirs:
        with open(os.path.join(directory, RECORD), "w") as fh:
            fh.write("".join(d + "\n" for d in group.dirs))


def remove_recorded(directory: str) -> None:
    """Remove the groups :func:`record` named in ``directory`` (the janitor's part)."""
    dirs = [d for d in read_text(os.path.join(directory, RECORD)).splitlines() if PREFIX in d]
    remove(Group(Limits(), "recorded", tuple(dirs)))


def reclaim(mech: Mechanism | None = None, pids: tuple[int, ...] = ()) -> int:
    """Remove the groups of processes that are gone (and of ``pids``, gone or not).

    Groups are named after the pid that made them; one whose pid no longer
    exists was left by a process killed before it could clean up.  The
    janitor passes the launcher's pid (it is gone when the janitor works).
    """
    mech = mech or mechanism()
    removed = 0
    for _, base in mech.bases:
        with contextlib.suppress(OSError), os.scandir(base) as entries:
            for entry in entries:
                owner = entry.name[len(PREFIX) :].split("-", 1)[0]
                if not entry.name.startswith(PREFIX) or not owner.isdigit():
                    continue
                if int(owner) in pids or not os.path.exists(f"/proc/{owner}"):
                    remove(Group(Limits(), mech.kind, (entry.path,)))
                    removed += not os.path.exists(entry.path)
    return removed
