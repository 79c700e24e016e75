"""Run a command of this project as an ordinary (non-root) user, from a root test run.

CI runs as root, but a sandbox must hold for an ordinary user too: without
root, bwrap needs unprivileged user namespaces, capabilities start empty,
/proc and keyrings behave differently.  :func:`ordinary_user` gives a
throwaway uid (no passwd entry, no groups) and :meth:`OrdinaryUser.argv` wraps
any argv so that it runs as that uid::

    user = ordinary_user()               # skip-worthy reason in user.unavailable
    user.own(home, workdir, runtime)     # chown what it must write
    subprocess.run(user.argv(["agent-sandbox", "run", "--", "true"]), env=...)

How: the interpreter lives under a directory the other uid cannot traverse
(here /root/.pyenv, /root being 0700).  Nothing on the machine is changed.
The wrapper is ``unshare --mount`` (a private mount namespace, propagation
private, so nothing leaks to the host) running a short shell script that,
for each such hidden directory A (e.g. /root) and each needed child C of it
(e.g. /root/.pyenv):

1. bind-mounts C aside, onto a fresh directory in a staging tmpfs;
2. mounts an empty tmpfs of mode 0755 over A (hiding the rest of A, which the
   user could not read anyway);
3. creates C's name in it and moves the bind back there (``mount --move``);

then ``exec setpriv --reuid=U --regid=U --clear-groups --inh-caps=-all``
runs the command, so that the pid the caller holds is the command's own.
The process runs with the uid's empty capability sets, the root's
environment as given by the caller (set HOME, USER, XDG_RUNTIME_DIR yourself
to dirs it owns), and the real kernel otherwise: same network namespace
(loopback canaries reachable), same /tmp, /dev/shm and keyring subsystem.

When the test run is not root, the "ordinary user" is the caller itself and
:meth:`argv` returns the argv unchanged.
"""

from __future__ import annotations

import os
import pwd
import shlex
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def _hidden_parent(path: Path) -> tuple[Path, Path] | None:
    """(A, C): the top-most ancestor A of ``path`` that others cannot traverse and
    its child C on the way to ``path``; None when every ancestor is traversable."""
    parts = path.parts
    for i in range(1, len(parts)):
        ancestor = Path(*parts[:i])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor, Path(*parts[: i + 1])
    return None


def needed_paths() -> list[Path]:
    """What a project executable needs to reach: the interpreter, its prefix, the
    site-packages holding the console scripts' dependencies, and the project."""
    found = {
        Path(os.path.realpath(sys.executable)).parent,
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sysconfig.get_paths()["purelib"]),
        PROJECT,
        *(Path(p) for p in site.getsitepackages()),
    }
    return sorted(Path(os.path.realpath(p)) for p in found if os.path.exists(p))


def _reveal_script(hidden: dict[Path, set[Path]]) -> str:
    """The shell script that makes each hidden child reachable (see the module doc)."""
    lines = ["set -eu", "stage=$(mktemp -d /tmp/as-user-stage-XXXXXX)"]
    lines.append('mount -t tmpfs -o mode=0700,size=64k as-user-stage "$stage"')
    moves = []
    for n, (ancestor, children) in enumerate(sorted(hidden.items())):
        for m, child in enumerate(sorted(children)):
            aside = f'"$stage"/{n}-{m}'
            lines += [f"mkdir {aside}", f"mount --rbind {shlex.quote(str(child))} {aside}"]
            moves.append((ancestor, child, aside))
        lines.append(
            f"mount -t tmpfs -o mode=0755,size=64k as-user-view {shlex.quote(str(ancestor))}"
        )
        for a, child, aside in moves:
            if a == ancestor:
                target = shlex.quote(str(child))
                lines += [f"mkdir -p {target}", f"mount --move {aside} {target}"]
    lines += ['umount "$stage"', 'rmdir "$stage"']
    return "\n".join(lines)


@dataclass(frozen=True)
class OrdinaryUser:
    uid: int
    gid: int
    prefix: tuple[str, ...]  # the wrapper argv, () when already unprivileged
    unavailable: str = ""  # why this user cannot be used here ("" when it can)

    @property
    def name(self) -> str:
        return f"as-test-{self.uid}"

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as this user (with the interpreter made reachable)."""
        return [*self.prefix, *argv]

    def env(self, home: str | os.PathLike[str], **extra: str) -> dict[str, str]:
        """A login-like environment for this user: the caller's PATH, LANG and TERM."""
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TZ")}
        env.update(HOME=str(home), USER=self.name, LOGNAME=self.name)
        env.update(extra)
        return env

    def own(self, *paths: str | os.PathLike[str]) -> None:
        """chown ``paths`` (recursively) to this user; no-op when not root."""
        if os.geteuid() != 0:
            return
        for top in paths:
            os.chown(top, self.uid, self.gid)
            for root, dirs, files in os.walk(top):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)

    def call(self, fn: Callable[[], int]) -> int:
        """``fn()`` in a forked child with this user's credentials; its int result
        (0..255) comes back as the child's exit status.  For short ctypes work
        (keyring set-up) where no interpreter needs starting."""
        if os.geteuid() != 0:
            return fn()
        pid = os.fork()
        if pid == 0:
            code = 255
            try:
                os.setgroups([])
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
                code = fn()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    def works(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` exits 0 as this user (a feature probe, e.g. user namespaces)."""
        done = subprocess.run(
            self.argv(argv), capture_output=True, timeout=30, env=self.env("/"), cwd="/"
        )
        return done.returncode == 0


def _owners() -> set[int]:
    """The uids of the processes now running (one may exit while we look)."""
    used = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                used.add(os.stat(f"/proc/{p}").st_uid)
            except FileNotFoundError:
                continue
    return used


def _free_uid(candidates: Iterable[int]) -> int:
    used = _owners()
    for uid in candidates:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in used:
                return uid
    raise RuntimeError("no free uid found for a throwaway user")


def ordinary_user() -> OrdinaryUser:
    """A throwaway unprivileged uid and the wrapper that runs commands as it.

    Not root: the caller itself, unwrapped.  Root: a free uid (no passwd
    entry, no process) in 61000-61999, with ``unavailable`` set when the
    tools the wrapper needs (unshare, setpriv) are missing.
    """
    if os.geteuid() != 0:
        return OrdinaryUser(os.getuid(), os.getgid(), ())
    uid = _free_uid(range(61000 + os.getpid() % 500, 62000))
    for tool in ("unshare", "setpriv", "mount"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/bin", "/bin")):
            return OrdinaryUser(uid, uid, (), unavailable=f"{tool} (util-linux) is missing")
    hidden: dict[Path, set[Path]] = {}
    for path in needed_paths():
        found = _hidden_parent(path)
        if found is None:
            continue
        ancestor, child = found
        hidden.setdefault(ancestor, set()).add(child)
        # Only one level is revealed: below the child, every directory must be traversable.
        for below in [path, *path.parents]:
            if below == child:
                break
            if below.is_dir() and not os.stat(below).st_mode & 0o001:
                why = f"{below} is not traversable by other users (only {ancestor} is handled)"
                return OrdinaryUser(uid, uid, (), unavailable=why)
    script = (
        _reveal_script(hidden)
        + "\n"
        + (f'exec setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all -- "$@"')
    )
    return OrdinaryUser(uid, uid, ("unshare", "--mount", "--", "sh", "-c", script, "as-user"))
