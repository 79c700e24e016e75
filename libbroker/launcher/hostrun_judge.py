"""The live gate's judgement of a host open, whoever holds the open: the launcher or the service.

Two gates hold host opens of the workdir's files: the launcher's own, when it
may use fanotify (:class:`.hostrun_gate.Gate`, root), and the gate service's,
which holds them for an ordinary user's launcher and asks it
(:class:`.hostrun_gate_client.ServiceGate`).  Both judge here, in one thread
of the launcher:

1. the open waits until the watcher has caught up (:meth:`Watcher.synced`:
   inotify queues an event in the very system call that made the change, so a
   plant the open could have reached is judged, and moved aside, first); at
   most :data:`PATIENCE`, then refused;
2. refused when the watcher neutralized anything in the last second and the
   open is git's or an exec (it may have gone through a planted link to an
   innocent-looking file), when the file was moved out of the workdir
   meanwhile, or when the pure rule (:func:`libpolicy.hostrun_live.verdict`)
   says it is a host-run entry that is not what the start recorded, or lies in
   a git directory the session made;
3. allowed otherwise.  Any failure refuses.

A subclass brings the opens (:meth:`Judge._incoming`) and their facts (the
kernel's name, exec or not, the opener's pid and name, the file's stat and
digest) and answers them (:meth:`Judge._answer`).
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import time
from typing import TYPE_CHECKING, Generic, TypeVar

from libbroker.quick_thread import QuickThread
from libbroker.shellquote import shown
from libpolicy import hostrun_live as rules

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_fingerprint import Node, Snapshot
    from libbroker.launcher.hostrun_live import Watcher

RECENT = 1.0  # seconds after a neutralization during which every open is refused
PATIENCE = 10.0  # seconds an open may wait for the watcher to catch up; then refused
SHOWN = 10  # refused paths named at the end; the rest counted

T = TypeVar("T")


class Judge(Generic[T]):
    """The thread that judges the opens a subclass brings (each a ``T``)."""

    def __init__(self, snap: Snapshot, watcher: Watcher) -> None:
        self.snap = snap
        self.watcher = watcher
        self.workdir = os.path.realpath(snap.workdir)  # what the kernel names the files by
        self.refused: dict[str, int] = {}
        self.asked = 0  # host opens judged (for the bench)
        self.errors: list[str] = []
        self.died = ""
        self._held: list[tuple[T, float]] = []
        self._seen_lines = 0
        self._changed_at = -RECENT
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: QuickThread | None = None

    # --- what a subclass brings ---------------------------------------------------------

    def _source(self) -> int:
        """The fd whose readability means opens to take."""
        raise NotImplementedError

    def _incoming(self) -> list[T] | None:
        """The opens readable now; None once the source has ended."""
        raise NotImplementedError

    def _own(self, item: T) -> bool:
        """An open of the launcher's own (allowed at once)."""
        return False

    def _facts(self, item: T) -> tuple[str, bool, int]:
        """(the kernel's name of the file, whether an exec, the opener's pid)."""
        raise NotImplementedError

    def _comm(self, item: T) -> str:
        raise NotImplementedError

    def _stat(self, item: T, rel: str) -> os.stat_result:
        raise NotImplementedError

    def _digest(self, item: T, rel: str) -> str:
        """The sha256 of the opened file's bytes ("" when it cannot be read)."""
        raise NotImplementedError

    def _answer(self, item: T, allow: bool) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """The thread ends (what waited was refused)."""

    # --- the thread ---------------------------------------------------------------------

    def start_thread(self, name: str) -> None:
        self._thread = QuickThread(self._run, name=name)  # (its start: no wait)
        self._thread.start()

    def wake(self) -> None:
        """(The watcher, after each batch) opens waiting on it may be judged now."""
        if self._held:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def _run(self) -> None:
        poller = select.poll()
        for fd in (self._source(), self._stop_r, self._wake_r):
            poller.register(fd, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll(100 if self._held else None)}
                if self._stop_r in ready:
                    return
                if self._wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                if self._source() in ready:
                    items = self._incoming()
                    if items is None:
                        return
                    for item in items:
                        self._take(item)
                if self._held:
                    self._release()
        except BaseException as exc:  # the marks go with the fd: the watcher and sweep stay
            self.died = f"{type(exc).__name__}: {exc}"
        finally:
            for item, _ in self._held:
                self._answer(item, False)
            self._held = []
            self._closed()

    def _take(self, item: T) -> None:
        if self._own(item):
            self._answer(item, True)
            return
        self._held.append((item, time.monotonic()))

    def _release(self) -> None:
        """Judge what waits once the watcher has caught up; refuse what waited too long."""
        synced = self.watcher.synced()
        now = time.monotonic()
        keep = []
        for item, since in self._held:
            if synced:
                self._judge(item)
            elif now - since > PATIENCE:
                self._refuse(item, "", "the guard could not catch up in time")
            else:
                keep.append((item, since))
        self._held = keep

    def _judge(self, item: T) -> None:
        self.asked += 1
        rel = ""
        try:
            rel, why = self._decide(item)
        except Exception as exc:  # fail closed
            why = f"could not be judged: {type(exc).__name__}: {exc}"
        if why is None:
            self._answer(item, True)
        else:
            self._refuse(item, rel, why)

    def _decide(self, item: T) -> tuple[str, str | None]:
        lines = len(self.watcher.sweeper.lines)
        if lines != self._seen_lines:
            self._seen_lines = lines
            self._changed_at = time.monotonic()
        path, is_exec, _ = self._facts(item)
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if not path.startswith(self.workdir + "/"):
            return path, "moved aside by the guard"
        rel = path[len(self.workdir) + 1:]
        if time.monotonic() - self._changed_at < RECENT and (is_exec or self._comm(item) == "git"):
            return rel, "the guard neutralized a plant a moment ago"
        git = rules.git_dir_of(rel, self.snap.repos)
        if git is None:
            for probe in rules.probes(rel):
                if _is_git_dir(os.path.join(self.workdir, probe)):
                    git = probe
                    break
        recorded = git is not None and git in self.snap.repos
        why = rules.verdict(rel, self.snap.table, git_dir=git, recorded=recorded,
                            unchanged=False)
        if why is not None and rules.verdict(rel, self.snap.table, git_dir=git,
                                             recorded=recorded, unchanged=True) is None:
            why = None if self._unchanged(rel, item) else why  # only then: stat, bytes
        return rel, why

    def _unchanged(self, rel: str, item: T) -> bool:
        """Whether the file opened is the one the start recorded at ``rel`` (by stat, else by
        its bytes: a restored file is a new inode)."""
        node = _recorded(self.snap, rel)
        if node is None or node.kind != "file":
            return False
        st = self._stat(item, rel)
        if node.same_stat(st):
            return True
        if not node.digest or st.st_size != node.size or st.st_mode != node.mode:
            return False
        return self._digest(item, rel) == node.digest

    def _refuse(self, item: T, rel: str, why: str) -> None:
        self._answer(item, False)
        key = f"{rel or '?'} ({why})"
        self.refused[key] = self.refused.get(key, 0) + 1

    # --- the end ------------------------------------------------------------------------

    def stop_thread(self, wait: float | None = None) -> None:
        """The thread told to end (what waits is refused) and joined; the pipes closed."""
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        self.join_thread(wait)

    def join_thread(self, wait: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(wait)
            self._thread = None
        for fd in (self._stop_r, self._stop_w, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def lines(self) -> list[str]:
        """What the end says about the gate: the refusals, its death, its failures."""
        lines = []
        if self.refused:
            total = sum(self.refused.values())
            named = sorted(self.refused.items(), key=lambda kv: -kv[1])
            lines.append(f"agent-sandbox: the live guard refused {total} opens by host "
                         f"processes of planted entries while the session ran: " + "; ".join(
                             f"{shown(k)} x{n}" for k, n in named[:SHOWN])
                         + (f"; and {len(named) - SHOWN} more" if len(named) > SHOWN else ""))
        if self.died:
            lines.append(f"agent-sandbox: the live gate stopped during the session "
                         f"({self.died}); from then on only the watcher guarded")
        lines += [f"agent-sandbox: the live gate failed once: {e}" for e in self.errors[:3]]
        return lines


def git_dirs_to_bind(repos: frozenset[str] | set[str] | dict[str, int]) -> list[str]:
    """The repositories' ``.git`` directories a gate binds: not one inside another git dir
    (a module's: reached by absolute paths, never a working directory)."""
    return [g for g in repos if g.rsplit("/", 1)[-1] == ".git" and ".git/" not in g]


def _is_git_dir(path: str) -> bool:
    """git's own test, by lstat only (no open: nothing reaches the gate): HEAD, objects/,
    refs/."""
    try:
        head = os.lstat(os.path.join(path, "HEAD"))
        objects = os.stat(os.path.join(path, "objects"))
        refs = os.stat(os.path.join(path, "refs"))
    except OSError:
        return False
    return (stat.S_ISREG(head.st_mode) or stat.S_ISLNK(head.st_mode)) and stat.S_ISDIR(
        objects.st_mode) and stat.S_ISDIR(refs.st_mode)


def _recorded(snap: Snapshot, rel: str) -> Node | None:
    """The start's fingerprint of ``rel``: its own entry, or inside a recorded directory's."""
    found = snap.entries.get(rel)
    if found is not None:
        return found[1]
    parts = rel.split("/")
    for i in range(len(parts) - 1, 0, -1):
        above = snap.entries.get("/".join(parts[:i]))
        if above is None:
            continue
        node = above[1]
        for name in parts[i:]:
            if node is None or node.children is None:
                return None
            node = node.children.get(name)
        return node
    return None
