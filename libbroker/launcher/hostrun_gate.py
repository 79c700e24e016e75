"""The live gate: a host process never opens a planted host-run file while the session runs.

The watcher (:mod:`.hostrun_live`) neutralizes after the fact, so a person's
``git status`` looping in another terminal could read a plant before it
acted.  The gate closes that window where the launcher may use fanotify
permission events (CAP_SYS_ADMIN): the workdir, and each repository's
``.git``, are bound onto themselves in the host's mount namespace
(:mod:`.hostrun_binds`), those mounts are marked, and every open or exec of
a file through them waits for this thread's answer.  The sandbox's own
view is another mount: the session's work never waits here.

For each open by a host process (the launcher's own are allowed at once: a
thread of ours waiting on its own gate would never be answered):

1. the watcher first catches up with every change queued before the open
   (inotify queues an event in the very system call that made the change,
   so a plant the open could have reached is judged, and moved aside, before
   the answer);
2. refused when the watcher neutralized anything in the last second and
   the open is git's or an exec (it may have gone through a planted link to
   an innocent-looking file: git reads a gitlink, commondir or config, an
   exec runs a hook; other programs, an editor saving a file, go on),
   when the file was moved out of the workdir meanwhile, or when the pure
   rule (:func:`libpolicy.hostrun_live.verdict`) says the file is a host-run
   entry that is not what the start recorded, or lies in a git directory
   the session made;
3. allowed otherwise.

A refused open fails with EPERM: the host's git stops with an error, and
never runs the plant.  Any failure here refuses.  If the thread ends, the
group's fd is closed, so the kernel allows what waits and drops the marks:
the watcher and the end sweep remain, and a line says so.  The gate stays
up through the end sweep and is the last to go (:meth:`Gate.stop`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import stat
import threading
import time
from typing import TYPE_CHECKING

from libbroker.launcher import fanotify
from libbroker.launcher.hostrun_binds import Binds
from libbroker.shellquote import shown
from libpolicy import hostrun_live as rules

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_fingerprint import Node, Snapshot
    from libbroker.launcher.hostrun_live import Watcher

RECENT = 1.0  # seconds after a neutralization during which every open is refused
PATIENCE = 10.0  # seconds an open may wait for the watcher to catch up; then refused
SHOWN = 10  # refused paths named at the end; the rest counted


class Gate:
    """One session's gate: :meth:`start` before the sandbox exists, :meth:`stop` last."""

    def __init__(self, snap: Snapshot, watcher: Watcher, record_dir: str) -> None:
        self.snap = snap
        self.watcher = watcher
        self.workdir = os.path.realpath(snap.workdir)  # what the kernel names the files by
        git_dirs = [g for g in snap.repos if g.rsplit("/", 1)[-1] == ".git" and not _below_git(g)]
        self.binds = Binds(self.workdir, git_dirs, record_dir)
        self.fan: fanotify.Fanotify | None = None
        self.pid = os.getpid()
        self.refused: dict[str, int] = {}
        self.asked = 0  # host opens judged (for the bench)
        self.own = 0  # the launcher's own opens that reached the gate (a round trip each)
        self.errors: list[str] = []
        self.died = ""
        self._held: list[tuple[fanotify.Event, float]] = []
        self._seen_lines = 0
        self._changed_at = -RECENT
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """The group, its thread, the binds, the marks; OSError (nothing left) if any fails."""
        self.fan = fanotify.Fanotify()
        self._thread = threading.Thread(target=self._run, name="hostrun-gate", daemon=True)
        self._thread.start()
        try:
            self.binds.make()
            for fd in self.binds.mark_fds:
                self.fan.mark_mount(fd)
            self.binds.marked()
        except BaseException:
            self.stop()
            raise
        self.watcher.on_batch = self.wake

    def wake(self) -> None:
        """(The watcher, after each batch) opens waiting on it may be judged now."""
        if self._held:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    # --- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        assert self.fan is not None
        poller = select.poll()
        for fd in (self.fan.fd, self._stop_r, self._wake_r):
            poller.register(fd, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll(100 if self._held else None)}
                if self._stop_r in ready:
                    return
                if self._wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                if self.fan.fd in ready:
                    for ev in self.fan.read():
                        self._take(ev)
                if self._held:
                    self._release()
        except BaseException as exc:  # the marks go with the fd: the watcher and sweep stay
            self.died = f"{type(exc).__name__}: {exc}"
        finally:
            for ev, _ in self._held:
                self._answer(ev, False)
            self._held = []
            self.fan.close()

    def _take(self, ev: fanotify.Event) -> None:
        if ev.fd < 0:  # FAN_Q_OVERFLOW (no fd): nothing to answer
            return
        if ev.pid == self.pid:  # our own threads (the watcher, the sweep): never waited on
            self.own += 1
            self._answer(ev, True)
            return
        self._held.append((ev, time.monotonic()))

    def _release(self) -> None:
        """Judge what waits once the watcher has caught up; refuse what waited too long."""
        synced = self.watcher.synced()
        now = time.monotonic()
        keep = []
        for ev, since in self._held:
            if synced:
                self._judge(ev)
            elif now - since > PATIENCE:
                self._refuse(ev, "", "the guard could not catch up in time")
            else:
                keep.append((ev, since))
        self._held = keep

    def _judge(self, ev: fanotify.Event) -> None:
        self.asked += 1
        rel = ""
        try:
            rel, why = self._decide(ev)
        except Exception as exc:  # fail closed
            why = f"could not be judged: {type(exc).__name__}: {exc}"
        if why is None:
            self._answer(ev, True)
        else:
            self._refuse(ev, rel, why)

    def _decide(self, ev: fanotify.Event) -> tuple[str, str | None]:
        lines = len(self.watcher.sweeper.lines)
        if lines != self._seen_lines:
            self._seen_lines = lines
            self._changed_at = time.monotonic()
        path = os.readlink(f"/proc/self/fd/{ev.fd}")
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if not path.startswith(self.workdir + "/"):
            return path, "moved aside by the guard"
        rel = path[len(self.workdir) + 1:]
        if time.monotonic() - self._changed_at < RECENT and (
                ev.mask & fanotify.OPEN_EXEC_PERM or _comm(ev.pid) == "git"):
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
            why = None if self._unchanged(rel, ev.fd) else why  # only then: fstat, bytes
        return rel, why

    def _unchanged(self, rel: str, fd: int) -> bool:
        """Whether the file opened is the one the start recorded at ``rel`` (by stat, else by
        its bytes: a restored file is a new inode)."""
        node = _recorded(self.snap, rel)
        if node is None or node.kind != "file":
            return False
        st = os.fstat(fd)
        if node.same_stat(st):
            return True
        if not node.digest or st.st_size != node.size or st.st_mode != node.mode:
            return False
        digest = hashlib.sha256()
        at = 0
        while chunk := os.pread(fd, 1 << 16, at):
            digest.update(chunk)
            at += len(chunk)
        return digest.hexdigest() == node.digest

    def _refuse(self, ev: fanotify.Event, rel: str, why: str) -> None:
        self._answer(ev, False)
        key = f"{rel or '?'} ({why})"
        self.refused[key] = self.refused.get(key, 0) + 1

    def _answer(self, ev: fanotify.Event, allow: bool) -> None:
        assert self.fan is not None
        try:
            self.fan.answer(ev, allow)
        except OSError as exc:
            self.errors.append(f"answer: {exc.strerror or exc}")

    # --- the end ------------------------------------------------------------------

    def stop(self) -> list[str]:
        """End the thread (pending opens refused), close the group, unbind; lines to say."""
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        # The thread closes the group (the kernel waits for an SRCU grace period there)
        # while the binds go (an RCU grace period per detach): at once, both at the end.
        lines = self.binds.remove()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        elif self.fan is not None:
            self.fan.close()
        for fd in (self._stop_r, self._stop_w, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
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


def describe() -> tuple[bool, str]:
    """(whether sessions here get the gate, the line ``doctor`` prints about it)."""
    if os.environ.get("AGENT_SANDBOX_LIVE_GATE") == "off":
        return False, ("live guard: the watcher only (AGENT_SANDBOX_LIVE_GATE=off): a host "
                       "git looping while a session plants can run a plant before it acts")
    if not fanotify.available():
        return False, ("live guard: the watcher only (the fanotify gate needs CAP_SYS_ADMIN): "
                       "a host git looping while a session plants can run a plant before it "
                       "acts (docs/hostrun-live.md has the measured window)")
    return True, ("live guard: the fanotify gate: host processes never open a planted "
                  "host-run file while a session runs (bwrap; Landlock with its own mount "
                  "namespace)")


def _comm(pid: int) -> str:
    """The process's name (it waits on us: its pid cannot be reused meanwhile)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _below_git(rel: str) -> bool:
    """A git dir inside another one (a module's): reached by absolute paths, never a cwd."""
    return ".git/" in rel


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
