"""The host-run guard while the session runs: no window for a concurrent host ``git``.

The sweep (:mod:`.hostrun_guard`) puts everything back at the end, and bwrap
holds what existed at the start read-only; but a person watching the agent
runs ``git status`` in another terminal *during* the session.  Then a
``.git/commondir`` or a ``sub/.git`` file that appeared (bwrap), or any
planted hook or config key (Landlock, which holds nothing), would run.

:class:`Watcher` is a thread owned by the session: inotify watches on every
directory of the workdir (inside git directories only the directory itself,
``hooks/``, ``modules/`` and ``worktrees/``; never objects or refs), and on
each event that names a host-run entry it applies the sweep's own judgement
to that one entry at once (restore it, move it aside, clean a new
repository), and the repositories' configs are merged by key
(:mod:`.hostrun_gitconfig`).  New directories are watched as they appear,
and what they already hold is judged.  A lost event (queue overflow) or a
directory that cannot be watched (the watch limit) is said in one line; the
end sweep still judges everything.  Where the launcher may use fanotify, the
gate (:mod:`.hostrun_gate`) holds each host open until :meth:`Watcher.synced`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import sys
import time
from collections.abc import Callable
from typing import Any

from libbroker.launcher import hostrun_gitconfig as gitconfig
from libbroker.launcher import hostrun_gitmerge as gitmerge
from libbroker.launcher import inotify
from libbroker.launcher.hostrun_backlog import Backlog
from libbroker.launcher.hostrun_fingerprint import Snapshot, parent_of
from libbroker.launcher.hostrun_newrepo import check_new_gitlink, check_new_repo
from libbroker.launcher.hostrun_sweep import Sweeper
from libbroker.launcher.hostrun_walk import _GIT_SKIP as GIT_SKIP
from libbroker.launcher.hostrun_walk import _is_git_dir as is_git_dir
from libbroker.launcher.hostrun_watches import GIT_MARKS, O_DIR, Watches, join
from libbroker.quick_thread import QuickThread
from libbroker.shellquote import shown
from libpolicy.hostrun import NESTED_GIT

LIVE_RETRIES = 5  # looks at an entry that vanished under a check (a repository being made)


class Watcher(Watches):
    """One session's live guard; :meth:`start` before go, :meth:`stop` on every path."""

    def __init__(self, snap: Snapshot, state: str, configs: gitmerge.LiveConfigs) -> None:
        self.configs = configs
        self.by_rel = {repo.rel: repo for repo in configs.repos}
        self.sweeper = Sweeper(snap, state)
        super().__init__(snap)
        self.overflows = 0
        self.handled = 0  # entries judged (for the bench)
        self.errors: list[str] = []
        self._logged = 0  # sweeper.lines already in sweep.log
        self._seen_repos: dict[str, tuple[object, ...]] = {}  # new repo -> state judged
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread: QuickThread | None = None

    # --- watches ------------------------------------------------------------------

    def start(self) -> None:
        """Watch the whole workdir, then handle events, in a thread (the walk overlaps the
        servers' start); :meth:`wait_ready` before anything of the session runs."""
        # Opened now: the two threads' moves aside share it (its lazy open would race).
        os.makedirs(self.sweeper.quarantine, mode=0o700, exist_ok=True)
        self.sweeper.qfd = os.open(self.sweeper.quarantine, O_DIR)
        self._backlog = Backlog(lambda exc: self.errors.append(f"{type(exc).__name__}: {exc}"))
        # The fast lane must not wait the default 5 ms for the GIL while the backlog
        # parses a config in Python: 0.5 ms (restored at stop).
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, 0.0005))
        self._thread = QuickThread(self._run, name="hostrun-live")  # (its start: no wait)
        self._thread.start()

    def wait_ready(self) -> None:
        """Until every directory is watched (events meanwhile wait in the queue)."""
        self._ready.wait()

    def _run(self) -> None:
        try:
            self._watch_tree(self._root, "", judge=False)
            self._initial = dict(self.dirs)
            for repo in self.configs.repos:
                if repo.swapped:  # the session's copy, merged as it is written
                    self._watch_path(self.configs.inside_dir(repo), "inside:" + repo.rel)
        except Exception as exc:  # the end sweep still judges everything; the person is told
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self._ready.set()
        self._loop()

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._ino.fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            self.busy = True  # before the read: synced() never sees an empty queue too early
            try:
                while events := self._ino.read():
                    self.handle(events)
            except Exception as exc:  # the end sweep still runs; the person is told
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self.busy = False
            self._log()
            if self.on_batch is not None:
                self.on_batch()

    def _log(self) -> None:
        """New lines into the quarantine's sweep.log at once: a launcher killed later still
        leaves them (the end sweep appends its own)."""
        new = self.sweeper.lines[self._logged:]
        if not new:
            return
        self._logged += len(new)
        with contextlib.suppress(OSError):
            os.makedirs(self.sweeper.quarantine, mode=0o700, exist_ok=True)
            with open(os.path.join(self.sweeper.quarantine, "sweep.log"), "a") as log:
                log.write("".join(line + "\n" for line in new))

    def handle(self, events: list[inotify.Event]) -> None:
        """Judge each entry the events name, once per batch."""
        todo = self._pending
        self._touched.update(ev.wd for ev in events)
        for ev in events:
            if ev.mask & inotify.Q_OVERFLOW:
                self.overflows += 1
                self._recheck_all()
                continue
            where = self.dirs.get(ev.wd)
            if where is None or ev.mask & inotify.IGNORED:
                self.dirs.pop(ev.wd, None)
                continue
            rel, kind = where
            if kind == "inside":
                if ev.name == "config":
                    todo[rel] = None
                continue
            if not ev.name:
                continue
            path = join(rel, ev.name)
            if ev.mask & inotify.ISDIR and ev.mask & (inotify.CREATE | inotify.MOVED_TO):
                self._new_dir(rel, kind, ev.name)
            if self._relevant(rel, kind, ev.name):
                todo[path] = None
        self._drain()

    def _drain(self) -> None:
        """Judge what is pending, each entry once: what redirects git (a commondir, a
        gitlink, a hook or config of a recorded repository: one rename to move aside)
        first; new repositories (git parses their config: milliseconds) after, once each
        and only when their state changed since the last look."""
        while self._pending:
            paths = list(self._pending)
            self._pending.clear()
            keys: dict[str, None] = {}
            new_repos: dict[str, None] = {}
            for path in paths:
                git = None if path.startswith("inside:") else self._git_of(path)
                if git is not None and git not in self.snap.repos:
                    new_repos[git] = None
                    if path in (f"{git}/config", f"{git}/config.worktree"):  # the payload
                        self._guard(path, gitmerge.clean_new, self.configs, self._root, path)
                else:
                    keys[self._recorded_above(path) or path] = None
            # Redirects (a commondir, a gitlink, a config: one rename or merge) before
            # a held directory's restore, which writes it back whole (hooks/: a dozen files).
            for key in sorted(keys, key=lambda k: k in self.snap.entries and not k.endswith(
                    ("/commondir", "/config", ".git", "/config.worktree"))):
                self._judge(key)
            for git in new_repos:
                self._backlog.submit("repo:" + git, functools.partial(self._new_repo, git))

    def _new_repo(self, git: str) -> None:
        """(In the backlog) a new repository's hooks, config and commondir, when changed."""
        if self._seen_repos.get(git) != self._repo_state(git):
            self.handled += 1
            self._guard(git, check_new_repo, self.sweeper, self._root, git)
            self._seen_repos[git] = self._repo_state(git)

    def _repo_state(self, git: str) -> tuple[object, ...]:
        """What check_new_repo looks at in a git dir, by lstat: its result holds while
        this is unchanged."""
        out: list[object] = []
        with parent_of(self._root, git + "/hooks") as (gfd, _):
            if gfd < 0:
                return ()
            for name in ("config", "config.worktree", "commondir", "hooks"):
                try:
                    st = os.stat(name, dir_fd=gfd, follow_symlinks=False)
                    out.append((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
                except OSError:
                    out.append(name)
            with contextlib.suppress(OSError):
                hfd = os.open("hooks", O_DIR, dir_fd=gfd)
                try:
                    with os.scandir(hfd) as it:
                        for item in it:
                            st = item.stat(follow_symlinks=False)
                            out.append((item.name, st.st_ino, st.st_size, st.st_mtime_ns,
                                        st.st_mode))
                finally:
                    os.close(hfd)
        return tuple(out)

    def _new_dir(self, rel: str, kind: str, name: str) -> None:
        if kind == "git" and name not in ("hooks", *NESTED_GIT):
            return
        if "/.git/" in f"/{rel}/" and name in GIT_SKIP:
            return
        with parent_of(self._root, join(rel, name)) as (pfd, last):
            if pfd < 0:
                return
            try:
                fd = os.open(last, O_DIR, dir_fd=pfd)
            except OSError:
                return
            try:
                self._watch_tree(fd, join(rel, name), judge=True)
            finally:
                os.close(fd)

    def _recheck_all(self) -> None:
        """After lost events: every recorded entry and every git dir, judged again."""
        for rel in list(self.snap.entries):
            self._pending[rel] = None
        for rel in list(self.git_dirs):
            self._pending[rel + "/config"] = None
        self._seen_repos.clear()

    # --- judging ------------------------------------------------------------------

    def _judge(self, path: str) -> None:
        """The sweep's judgement of the one entry ``path`` is (or lies in), applied now."""
        self.handled += 1
        if path.startswith("inside:"):
            self._backlog.submit(path, functools.partial(
                gitmerge.sync, self.configs, self.by_rel[path[len("inside:"):]]))
            return
        repo = self.by_rel.get(path)
        if repo is not None and not repo.swapped:  # Landlock: the plant itself, at once
            self._guard(repo.rel, gitmerge.neutralize, self.configs, repo)
            return
        if repo is not None:
            self._config(repo)
            return
        git = self._git_of(path)
        if git is not None and git not in self.snap.repos:
            self._guard(git, check_new_repo, self.sweeper, self._root, git)
            return
        held = self._recorded_above(path)
        if held is not None:
            rule, node = self.snap.entries[held]
            self._guard(held, self.sweeper.check, self._root, held, rule, node)
            return
        entry = self.table.match(path)
        if entry is None:
            if path.rsplit("/", 1)[-1] in GIT_MARKS:
                self._maybe_new_git_dir(path.rpartition("/")[0])
            return
        if path.endswith(".git") and entry.rule == "git-dir":
            self._guard(path, check_new_gitlink, self.sweeper, self._root, path, self.snap)
            self._maybe_new_git_dir(path)
        else:
            self._guard(path, self.sweeper.check, self._root, path, entry.rule, None)

    def _git_of(self, path: str) -> str | None:
        """The git dir ``path`` lies in: a known one, or a ``.git`` directory being made.

        ``git init`` and ``git clone`` write the templates (hooks/, info/) and
        the config before HEAD, objects and refs make the directory a git dir
        by git's own test: an entry under a ``.git`` that is no recorded
        repository is judged as the new repository it becomes (sample hooks and
        safe keys stay), never as a recorded entry that appeared (moved aside
        whole, which broke every clone into the workdir).
        """
        known = self._git_dir_of(path)
        if known is not None:
            return known
        parts = path.split("/")
        for i in range(len(parts) - 1, 0, -1):  # the innermost .git with something below it
            if parts[i - 1] == ".git":
                return "/".join(parts[:i])
        return None

    def _config(self, repo: gitmerge.Repo) -> None:
        # bwrap: the link must stay; anything else in its place goes aside, the link back.
        ours = os.path.join(self.configs.host_dir(repo), "config")
        with parent_of(self._root, repo.rel) as (gfd, name):
            if gfd < 0:
                return
            try:
                if os.readlink(name, dir_fd=gfd) == ours:
                    return
            except OSError:
                pass
            with contextlib.suppress(FileNotFoundError):
                self.sweeper.move_aside(gfd, name, repo.rel)
            tmp = ".config.agent-sandbox-link"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=gfd)
            os.symlink(ours, tmp, dir_fd=gfd)
            os.rename(tmp, name, src_dir_fd=gfd, dst_dir_fd=gfd)
            self.sweeper.say(repo.rel, "git-config", "replaced in the session; moved aside, "
                             "the session's config is its private copy", "")

    def _maybe_new_git_dir(self, rel: str) -> None:
        with parent_of(self._root, rel + "/x") as (gfd, _):
            if gfd < 0:
                return
            with contextlib.suppress(OSError):
                if rel not in self.git_dirs and is_git_dir(set(os.listdir(gfd))):
                    self.git_dirs.add(rel)
                    self._watch_tree(gfd, rel, judge=False)
                    if rel not in self.snap.repos:
                        self._guard(rel, check_new_repo, self.sweeper, self._root, rel)

    def _guard(self, rel: str, step: Any, *args: Any) -> None:
        # A repository being made right now (git init, clone) has entries that come
        # and go between the listing and the move (config.lock, a sample hook): an
        # ENOENT is looked at again, not said. What stays unchecked is said; the end
        # sweep judges every new git dir again in any case.
        for attempt in range(LIVE_RETRIES):
            try:
                step(*args)
                return
            except FileNotFoundError as exc:
                if attempt + 1 == LIVE_RETRIES:
                    why = exc.strerror or str(exc)
                else:
                    time.sleep(0.01 * (attempt + 1))
            except OSError as exc:
                why = exc.strerror or str(exc)
                break
        self.sweeper.lines.append(f"agent-sandbox: {shown(rel)}: could not be "
                                  f"checked during the session: {why}")

    # --- the end ------------------------------------------------------------------

    def stop(self, *, close: bool = True) -> list[str]:
        """End the thread and close everything (the inotify group: ``close``, else the
        caller's :meth:`close_group`); the lines of what was neutralized."""
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        self._stopped = True  # the session is gone: nothing more to catch up with
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._backlog.stop()
            self._log()
            sys.setswitchinterval(self._switch)
            self.overflows += self.drain_queue()
        for fd in (self._stop_r, self._stop_w, self._root):
            with contextlib.suppress(OSError):
                os.close(fd)
        if close:
            self.close_group()
        lines = list(self.sweeper.lines)
        if self.sweeper.qfd >= 0:
            os.close(self.sweeper.qfd)
            self.sweeper.qfd = -1
        if self.unwatched:
            lines.append(f"agent-sandbox: {self.unwatched} directories of the workdir could not "
                         "be watched during the session (the inotify limit?); the end sweep "
                         "judged them")
        if self.overflows:
            lines.append("agent-sandbox: the live guard lost events (queue overflow) and "
                         "judged every entry again")
        lines += [f"agent-sandbox: the live guard failed once: {e}" for e in self.errors]
        return lines

    def quiet_dirs(self) -> frozenset[str] | None:
        """The directories no event named (:meth:`Watches.quiet`), for the end sweep's walk;
        None (it looks at every directory) after a lost event, an error, or before
        :meth:`stop` drained the queue."""
        if self._thread is not None or self.overflows or self.errors or not self._initial:
            return None
        return self.quiet()


def begin(snap: Snapshot, state: str, runtime_dir: str, *, swap: bool) -> Watcher:
    """The session's live guard, configs copied (``swap``: bwrap's links in place); not
    watching until :meth:`Watcher.start`."""
    configs = gitconfig.start(snap, state, runtime_dir, swap=swap)
    try:
        return Watcher(snap, state, configs)
    except BaseException:
        gitconfig.finish(configs, snap)
        raise


def end(watcher: Watcher, snap: Snapshot | None, under: dict[str, int] | None = None,
        mark: Callable[[str], None] = lambda _: None, *, keep_group: bool = False,
        stopped: Callable[[], None] = lambda: None) -> list[str]:
    """Stop watching, merge the configs a last time (not the copies no write reached,
    unless an event was lost) and put them back; every line to say.  ``under``: the live
    gate's :attr:`.hostrun_binds.Binds.under`; ``mark``: the trace's; ``keep_group``: the
    caller closes the inotify group (:meth:`Watcher.close_group`); ``stopped``: called
    once nothing is watched any more, before the put-back removes the private copies."""
    lines = watcher.stop(close=not keep_group)
    stopped()
    mark("live guard stopped")
    unwritten = frozenset() if watcher.overflows or watcher.errors else watcher.unwritten()
    lines += gitconfig.finish(watcher.configs, snap, under, unwritten)
    mark("git configs put back")
    return lines
