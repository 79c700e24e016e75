"""The walk that makes an agent's private config copy: by rule, bounded, never through a link.

An agent's config directory is also where it keeps what is no config at
all: Codex links its own 315 MB binary under ``~/.codex/tmp/arg0*``, Gemini
CLI downloads ripgrep to ``~/.gemini/tmp/bin``, every agent keeps caches,
logs and a year of transcripts there.  A list of names to skip always misses
the next one, so what is copied is decided by rule:

- a link is never followed.  One whose target stays inside the copied
  directory is made again as a link (so the copy means what the original
  does); one leading out of it is left out and counted;
- a directory named like a cache, a temp or a log directory (``tmp``,
  ``temp``, ``cache``, ``.cache``, ``caches``, ``log``, ``logs``, ``*-cache``,
  ``*_cache``, ``node_modules``, ``__pycache__``) is not entered, unless the
  profile names it (Gemini's ``tmp`` holds its chats: :attr:`Profile.per_workdir`);
- a program (an ELF file), a file over :data:`MAX_FILE`, a socket, a fifo or
  a device is left out;
- the copy is bounded by :data:`MAX_TOTAL` bytes and :data:`MAX_SECONDS`:
  the files are copied shallowest first, then newest first (the config files
  at the top, then the latest transcripts), and what does not fit is left out.

The copy is made anew only for an agent's first session: the next ones take
the last one's and bring it up to date by its bytes (:mod:`.agent_reuse`).
Entries the profile names as files (``~/.claude.json``) may be as large as
:data:`MAX_NAMED`: the agent cannot start as the user's without them.
What was left out is counted in a :class:`Report`, whose :meth:`Report.line`
says it in one line.  The entry itself (``~/.codex``) may be the user's link
(a dotfiles checkout): that one is followed, nothing below it.

Standard library only (the janitor imports :mod:`.agent_home`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections import Counter
from collections.abc import Callable

from libbroker.launcher import agent_reuse
from libbroker.named_tuple import NamedTuple

MAX_FILE = 4 << 20  # a file larger than this is not config: a log, a dump, a model
MAX_NAMED = 64 << 20  # an entry the profile names as a file (Claude Code's state)
MAX_TOTAL = 8 << 20  # the whole copy of one agent (the newest transcripts fill it)
MAX_SECONDS = 2.0  # a slow or huge tree: what is copied by then is the copy
_SKIP_DIRS = frozenset(
    {"tmp", "temp", ".tmp", "cache", ".cache", "caches", "log", "logs", "node_modules",
     "__pycache__"}
)
_SKIP_SUFFIXES = ("-cache", "_cache", ".cache")
_ELF = b"\x7fELF"
_CHUNK = 1 << 20


def skipped_dir(name: str) -> bool:
    """A directory kept for speed or scratch, never for config: not copied."""
    low = name.lower()
    return low in _SKIP_DIRS or low.endswith(_SKIP_SUFFIXES)


class Report:
    """What one copy did: copied files and bytes, and what it left out, by reason.

    (A plain class: a dataclass imports dataclasses and inspect, ~7 ms of CPU on an
    agent session's start, which nothing else of the launcher loads.)"""

    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0
        self.seconds = 0.0
        self.dirs: Counter[str] = Counter()  # by rule, by name
        self.links_out = 0
        self.links_in = 0
        self.special = 0  # sockets, fifos, devices
        self.programs = 0
        self.programs_bytes = 0
        self.large = 0
        self.large_bytes = 0
        self.over = 0  # past MAX_TOTAL
        self.over_bytes = 0
        self.cut_short = False  # MAX_SECONDS reached
        self.reused = False  # the last session's copy, brought up to date (agent_reuse)
        self.unchanged = 0  # of the files copied: equal to the host's already
        self.known = 0  # of those: known so by both files' identities, unread (agent_reuse)
        self.pruned = 0  # entries of the last session's copy the host no longer has
        self.named: list[str] = []  # the first few links out and large files

    def notable(self) -> bool:
        """Something of the user's own the agent may miss, said on stderr.

        Not caches or programs, nor the older transcripts past the bound: a
        year of use always has those, and the line would be at every start.
        """
        return bool(self.links_out or self.large or self.cut_short)

    def line(self, agent: str) -> str:
        """One line: what was copied, what was left out and why."""
        out = []
        if self.dirs:
            names = ", ".join(f"{n}/" + (f" x{c}" if c > 1 else "") for n, c in
                              sorted(self.dirs.items()))
            out.append(f"{sum(self.dirs.values())} cache/temp/log dirs ({names})")
        if self.programs:
            out.append(f"{self.programs} programs ({_size(self.programs_bytes)})")
        if self.large:
            out.append(f"{self.large} files over {_size(MAX_FILE)} ({_size(self.large_bytes)})")
        if self.over:
            out.append(f"{self.over} older files past the {_size(MAX_TOTAL)} bound "
                       f"({_size(self.over_bytes)})")
        if self.links_out:
            out.append(f"{self.links_out} links leading out of it")
        if self.named:  # which of the user's own, so that a missing setting can be found
            out.append("among them " + ", ".join(self.named))
        if self.special:
            out.append(f"{self.special} sockets/fifos/devices")
        if self.cut_short:
            out.append(f"the rest after {MAX_SECONDS:g} s")
        left = "; left out: " + ", ".join(out) if out else ""
        unread = f" ({self.known} unread)" if self.known else ""
        kept = (f", {self.unchanged} unchanged{unread} and {self.pruned} removed since the last "
                "session" if self.reused else "")
        return (f"{agent}'s private config: {self.files} files ({_size(self.bytes)}{kept}) "
                f"in {self.seconds * 1000:.0f} ms{left}")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


class _File(NamedTuple):
    """A file to copy; tuples sort in C: shallowest, then newest first."""

    depth: int
    age: int  # -mtime
    size: int
    src: str
    dst: str
    rel: str
    named: bool = False
    host: os.stat_result | None = None  # as the walk saw it (never compared: src is unique)


def identity(st: os.stat_result) -> list[int]:
    """What a file's bytes are known by without reading them (agent_reuse.Record)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def fs_now(path: str) -> int:
    """The time (ns) by the clock that stamps ctimes on ``path``'s filesystem (a chmod to
    what it is moves the ctime on): a file there changed later gets a later ctime."""
    os.chmod(path, 0o700)  # the copy's root: a directory of ours (agent_home.make_root)
    return os.lstat(path).st_ctime_ns


class Copier:
    """One agent's copy: :meth:`tree` and :meth:`file` gather, :meth:`finish` copies."""

    def __init__(self, skip: Callable[[str, str], bool], keep_dirs: frozenset[str]) -> None:
        """``skip(rel, name)``: the profile leaves ``rel`` out; ``keep_dirs``: rels never
        left out by the directory rule."""
        self.skip = skip
        self.keep_dirs = keep_dirs
        self.report = Report()
        self.copied: dict[str, list[int]] = {}
        self._files: list[_File] = []
        self._made: set[str] = set()  # directories of the copy made so far
        self._t0 = time.monotonic()
        self._start_ns = 0  # before any host file is read (0: nothing recorded)
        self._deadline = self._t0 + MAX_SECONDS
        self._old: agent_reuse.Old | None = None  # the last session's copy, sanitized
        self._spared: list[str] = []
        # Files whose bytes are known equal to the host's by their identities alone
        # (agent_reuse.Record): the last session's, to trust; this copy's, to keep.
        self._trusted = agent_reuse.Record()
        self.verified = agent_reuse.Record()

    def reuse(self, root: str, trusted: agent_reuse.Record | None = None) -> None:
        """Before anything is gathered: ``root`` may hold the last session's copy
        (:func:`.agent_reuse.claim`); it is sanitized now and brought up to date by
        :meth:`finish`, or emptied when it cannot be.  ``trusted``: its record of the
        files it held equal to the host's (:func:`.agent_reuse.take_record`)."""
        # A time by the filesystem's clock before any host file is read: root's ctime
        # (made or renamed just now; an older one only records fewer files).
        self._start_ns = os.lstat(root).st_ctime_ns
        try:
            old = agent_reuse.Old(root)
        except (OSError, agent_reuse.Unusable):
            agent_reuse.renew(root)
            return
        if old.files or old.dirs:
            self._old = old
            self._trusted = trusted or agent_reuse.Record()
            self.report.reused = True

    def seal(self, root: str) -> None:
        """After :meth:`finish`, before anything else writes the copy: only a file whose
        ctime is older than now stays recorded, so that any later change to it (ours
        or the session's) shows as a later ctime."""
        now = fs_now(root)
        self.verified = agent_reuse.Record(
            {rel: ids for rel, ids in self.verified.items() if ids[9] < now})

    def file(self, src: str, dst: str, rel: str) -> None:
        """An entry the profile names as a file (the user's own link there is followed)."""
        try:
            st = os.stat(src)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode):
            self._files.append(_File(0, -st.st_mtime_ns, st.st_size, src, dst, rel, True, st))

    def spare(self, path: str) -> None:
        """The file at ``path``, which the caller writes after :meth:`finish`, is not
        removed to be made again: the last session's, if the host has none, is emptied."""
        self._spared.append(path)

    def tree(self, src: str, dst: str, rel: str) -> None:
        """Gather what of the directory ``src`` (its own link followed) goes to ``dst``."""
        try:
            real = os.path.realpath(src)
            if not os.path.isdir(real):
                return
        except OSError:
            return
        os.makedirs(dst, mode=0o700, exist_ok=True)
        self._made.add(dst)
        self._walk(real, dst, rel, real, dst, rel.count("/") + 1)

    def _walk(self, src: str, dst: str, rel: str, top: str, top_dst: str, depth: int) -> None:
        try:
            with os.scandir(src) as it:
                entries = list(it)
        except OSError:
            return
        for entry in entries:
            if time.monotonic() > self._deadline:
                self.report.cut_short = True
                return
            sub = f"{rel}/{entry.name}"
            if self.skip(sub, rel):
                continue
            d = dst + "/" + entry.name
            # The kind from the directory entry (no system call); a file's size and
            # time from lstat.  A file swapped since is caught by the copy's fstat.
            try:
                if entry.is_symlink():
                    self._link(entry.path, d, top, top_dst, sub)
                elif entry.is_dir(follow_symlinks=False):
                    # keep_dirs and their entries (the workdir's, named after it: a
                    # workdir ~/src/web-cache has a Claude Code project -...-web-cache).
                    if skipped_dir(entry.name) and sub not in self.keep_dirs \
                            and rel not in self.keep_dirs:
                        self.report.dirs[entry.name] += 1
                        continue
                    if dst == top_dst:  # the config dir's own layout; deeper ones as filled
                        self._mkdir(d)
                    self._walk(entry.path, d, sub, top, top_dst, depth + 1)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    self._files.append(_File(depth, -st.st_mtime_ns, st.st_size, entry.path,
                                             d, sub, False, st))
                else:
                    self.report.special += 1
            except OSError:
                continue

    def _link(self, src: str, dst: str, top: str, top_dst: str, rel: str) -> None:
        """A link made again when what it names is inside ``top``; else left out."""
        try:
            target = os.readlink(src)
        except OSError:
            return
        here = os.path.dirname(src)
        resolved = os.path.normpath(os.path.join(here, target))
        if resolved != top and not resolved.startswith(top.rstrip("/") + "/"):
            self.report.links_out += 1
            if len(self.report.named) < 3:
                self.report.named.append(rel)
            return
        if os.path.isabs(target):  # the same file, in the copy
            target = os.path.relpath(os.path.join(top_dst, os.path.relpath(resolved, top)),
                                     os.path.dirname(dst))
        try:
            self._mkdir(os.path.dirname(dst))
            if self._old is not None:
                self._old.drop(dst)
            os.symlink(target, dst)
            self.report.links_in += 1
        except OSError:
            pass

    def _mkdir(self, path: str) -> None:
        """Make ``path`` (0700) and its parents once: a directory only where something goes."""
        if path not in self._made:
            os.makedirs(path, mode=0o700, exist_ok=True)
            self._made.add(path)

    def _known(self, f: _File, old: os.stat_result | None, cap: int) -> _Done | None:
        """The last session's file at ``f.dst``, kept unread: its identity and the
        host's are those recorded when the bytes were last found equal (neither
        changed since: a write, a truncate, a chmod or a utime moves the ctime on,
        which nothing unprivileged can set back).  Else None: the bytes decide."""
        if old is None or f.host is None or f.size > cap:
            return None
        ids = [*identity(f.host), *identity(old)]
        if self._trusted.get(f.rel) != ids or stat.S_IMODE(old.st_mode) != _mode(f.host):
            return None
        return _Done(old.st_size, old.st_mtime_ns, True, ids)

    def finish(self) -> Report:
        """Copy what was gathered: shallowest, then newest first, within the bounds."""
        total = 0
        for f in sorted(self._files):
            if time.monotonic() > self._deadline:
                self.report.cut_short = True
                break
            cap = MAX_NAMED if f.named else MAX_FILE
            if f.size > cap:
                self.report.large += 1
                self.report.large_bytes += f.size
                if len(self.report.named) < 3:
                    self.report.named.append(f.rel)
                continue
            if total + f.size > MAX_TOTAL and not f.named:
                self.report.over += 1
                self.report.over_bytes += f.size
                continue
            try:
                self._mkdir(os.path.dirname(f.dst))
                old = self._old.take(f.dst) if self._old is not None else None
            except OSError:
                continue
            done = self._known(f, old, cap)
            if done is not None:
                self.report.known += 1
            else:
                done = _copy_file(f.src, f.dst, cap, old)
            if done is None or done.size < 0:
                if old is not None:  # the last session's file goes with the host's
                    _unlink(f.dst)
                if done is not None:
                    self.report.programs += 1
                    self.report.programs_bytes += f.size
                continue
            if done.unchanged:
                self.report.unchanged += 1
            total += done.size
            self.copied[f.rel] = [done.size, done.mtime_ns]  # the write-back's baseline
            self.report.files += 1
            if done.ids and done.ids[4] < self._start_ns:  # not changed while it was read
                self.verified[f.rel] = done.ids
        if self._old is not None:  # what a fresh copy would not hold
            for path in self._spared:
                self._old.empty(path)
            self.report.pruned = self._old.prune(self._made)
        self.report.bytes = total
        self.report.seconds = time.monotonic() - self._t0
        return self.report


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class _Done(NamedTuple):
    """A file copied: the copy's size and mtime, whether the last session's was kept,
    and both files' identities once its bytes are the host's whole (else [])."""

    size: int
    mtime_ns: int
    unchanged: bool
    ids: list[int]


def _mode(st: os.stat_result) -> int:
    """The copy's mode: the owner's bits of the host file's, and always read-write."""
    return stat.S_IMODE(st.st_mode) & 0o700 | 0o600


def _copy_file(
    src: str, dst: str, cap: int, old: os.stat_result | None = None
) -> _Done | None:
    """Copy one regular file, never through a link: the copy's (size, mtime_ns, unchanged,
    identities).

    ``old``: the last session's plain file at ``dst`` (:class:`.agent_reuse.Old`),
    kept when its bytes are the host's, else rewritten in place.
    (-1, 0, False) for a program (left out); None when it cannot be copied.
    """
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # unreadable, or gone: the agent does without it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if os.pread(fd, 4, 0) == _ELF:
            return _Done(-1, 0, False, [])
        mode = _mode(st)
        want = min(st.st_size, cap)  # as it was when opened, at most the cap
        try:
            out = _reopen(dst, old) if old is not None else -1
            if out < 0:
                out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, mode)
        except OSError:
            return None
        try:
            if old is not None:
                ost = os.fstat(out)
                if stat.S_IMODE(ost.st_mode) != mode:
                    os.fchmod(out, mode)
                if ost.st_size == want and agent_reuse.same(fd, out, want):
                    return _Done(want, ost.st_mtime_ns, True, _ids(st, os.fstat(out), want))
                os.ftruncate(out, 0)
            done = 0
            while done < want:
                n = os.sendfile(out, fd, done, min(_CHUNK, want - done))
                if n == 0:
                    break
                done += n
            cst = os.fstat(out)
            return _Done(done, cst.st_mtime_ns, False, _ids(st, cst, done))
        finally:
            os.close(out)
    except OSError:
        return None
    finally:
        os.close(fd)


def _ids(host: os.stat_result, copy: os.stat_result, done: int) -> list[int]:
    """Both identities, when the copy holds the host file whole (else [])."""
    return [*identity(host), *identity(copy)] if done == host.st_size == copy.st_size else []


def _reopen(dst: str, old: os.stat_result) -> int:
    """The last session's file at ``dst``, read-write, if it is still the one sanitized
    (a plain file with one name, never through a link); else removed: -1."""
    try:
        fd = os.open(dst, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        _unlink(dst)
        return -1
    st = os.fstat(fd)
    if os.path.samestat(st, old) and stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        return fd
    os.close(fd)
    _unlink(dst)
    return -1
