"""What git itself says about where the person stands: the repository, the signing key.

Two questions, each answered by one git process on the host, with the
user's real configuration (system, global, local and worktree scopes,
includes followed), as git would answer them in the session:

- :func:`start_locate`: ``git rev-parse`` from the launcher's cwd: the
  repository's top level, its git directory and its common git directory
  (a linked worktree's and a submodule's live elsewhere), as git resolves
  them (``.git`` files, ``core.worktree``, ``safe.directory``);
- :func:`start_signing`: ``git config --get-regexp`` in the workdir: the
  key git would hand gpg (``user.signingkey``, else the committer's
  ``Name <email>``), where it was set, and ``gpg.format``.

Safely: both commands only read files.  Neither runs hooks, fsmonitor, a
pager, an editor, a credential helper or any other command a config may name
(``rev-parse`` and ``config`` never refresh the index or contact a remote),
stdin is /dev/null, and a git that does not answer within
:data:`GIT_TIMEOUT` (a config including a FIFO) is killed.  The environment
is neutral: HOME and PATH, no ``GIT_*`` variable of the launcher's (the
session's git has none either), no prompt, no optional locks.

The parsing is pure (:func:`parse_located`, :func:`parse_signing`), so every
rule is tested without git.
"""

from __future__ import annotations

import os
import select
import shutil
import time
from typing import TYPE_CHECKING, NamedTuple

from libbroker.paths import under

if TYPE_CHECKING:
    from libbroker.launcher.child import Proc

GIT_TIMEOUT = 5.0
MAX_OUTPUT = 1 << 20  # what git may print for these questions (a key, a few paths)
# gpg.format values signing in a session serves: gpg-shim speaks gpg's protocol only.
SIGN_FORMATS = ("", "openpgp")
_SIGN_KEYS = "^(user\\.(signingkey|name|email)|committer\\.(name|email)|gpg\\.format)$"
# What git strips from both ends of a name or email (ident.c, strbuf_addstr_without_crud).
_CRUD = ".,:;<>\"\\'"


class Located(NamedTuple):
    """Where git says the repository containing a directory is (absolute, clean paths)."""

    top: str  # the working tree's top level
    git_dir: str  # its git directory (a linked worktree's own, a submodule's in modules/)
    common_dir: str  # the common git directory (the main repository's .git for a worktree)


class Signing(NamedTuple):
    """The key git would sign with in the workdir, and where that came from."""

    key: str  # what git passes to ``gpg -bsau``; "" when none can be enabled
    origin: str  # e.g. "user.signingkey (local, /r/.git/config)"; "" when no key
    problem: str = ""  # why no key is enabled though git would sign (gpg.format)


def git_env(home: str) -> dict[str, str]:
    """The neutral environment of the launcher's git questions."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": home,
        "LC_ALL": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
    }


def _start(args: list[str], cwd: str, home: str) -> Proc | None:
    """``git -C cwd ARGS`` started, or None when git is not installed or cannot start."""
    if not shutil.which("git"):
        return None
    from libbroker.launcher.child import start

    try:
        return start(["git", "-C", cwd, *args], env=git_env(home), stdin="devnull",
                     output="pipe", stderr="devnull")
    except OSError:
        return None


def start_locate(cwd: str, home: str) -> Proc | None:
    """Ask git where the repository holding ``cwd`` is (:func:`collect`, :func:`parse_located`)."""
    return _start(["rev-parse", "--path-format=absolute", "--show-toplevel",
                   "--absolute-git-dir", "--git-common-dir"], cwd, home)


# Questions asked before the config is read (prestart, while the servers
# start), by the directory asked about: taken by config_file.load.
_early: dict[str, Proc] = {}


def start_dir(value: object, cwd: str, home: str) -> str:
    """The directory git is asked about for a workdir ``value``; "" when it is no path."""
    if not isinstance(value, str) or "\0" in value or not value.strip():
        return ""  # the config check says what is wrong with it
    if value == "~" or value.startswith("~/"):
        value = home + value[1:]
    return os.path.normpath(os.path.join(cwd, value))


def ask_early(directory: str, home: str) -> None:
    """Start :func:`start_locate` for ``directory`` now; :func:`take_early` collects it."""
    proc = start_locate(directory, home) if directory else None
    if proc is not None:
        _early[directory] = proc


def take_early(directory: str) -> Proc | None:
    """The early question about ``directory``, if one was asked; any other is ended."""
    proc = _early.pop(directory, None)
    discard_early()
    return proc


def discard_early() -> None:
    """End the early questions nobody took (a run that ended before its config was read)."""
    while _early:
        discard(_early.popitem()[1])


def start_signing(workdir: str, home: str) -> Proc | None:
    """Ask git for its signing settings in ``workdir`` (:func:`parse_signing`)."""
    return _start(["config", "-z", "--includes", "--show-scope", "--show-origin",
                   "--get-regexp", _SIGN_KEYS], workdir, home)


def collect(proc: Proc | None, timeout: float = GIT_TIMEOUT) -> tuple[int, bytes]:
    """What ``proc`` printed and its status; (-1, b"") when it had to be killed or is None."""
    if proc is None:
        return -1, b""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while len(out) <= MAX_OUTPUT:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                return proc.wait(), bytes(out)
            out += chunk
        os.kill(proc.pid, 9)  # too slow or too much: no answer
        proc.wait()
        return -1, b""
    finally:
        proc.stdout.close()


def located(proc: Proc | None) -> Located | None:
    """The answer of :func:`start_locate`: None outside any repository (or without git)."""
    status, out = collect(proc)
    return parse_located(out) if status == 0 else None


def locate(cwd: str, home: str) -> Located | None:
    """The repository holding ``cwd``, as git resolves it."""
    return located(start_locate(cwd, home))


def discard(proc: Proc | None) -> None:
    """End a question whose answer is not needed any more (killed and reaped)."""
    if proc is None:
        return
    import contextlib

    with contextlib.suppress(OSError):
        os.kill(proc.pid, 9)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def parse_located(out: bytes) -> Located | None:
    """``rev-parse``'s three lines; None for a bare repository (no top level) or garbage."""
    lines = out.decode("utf-8", "surrogateescape").split("\n")
    if len(lines) != 4 or lines[3] != "":
        return None  # a bare repository prints no top level: two lines
    paths = [os.path.normpath(p) for p in lines[:3]]
    if not all(os.path.isabs(p) for p in paths):
        return None
    return Located(*paths)


def default_workdir(cwd: str, home: str, repo: Located | None) -> tuple[str, str]:
    """The workdir when none is named, and why: the top level of the repository holding ``cwd``.

    Started in a repository's subdirectory, the session grants the whole
    repository (git inside needs its ``.git``) and the command starts where
    the person stands.  A repository holding the home directory (a dotfiles
    repository at ~, or one at /) is never granted because of that: the
    workdir is then ``cwd`` itself, as outside any repository.
    """
    cwd = os.path.normpath(cwd)
    if repo is None or not under(cwd, repo.top):
        return cwd, "the current directory (no git repository holds it)"
    if under(home, repo.top):
        return cwd, (f"the current directory: its repository {repo.top} holds the home "
                     "directory, which is never granted (--workdir=DIR to choose)")
    if repo.top == cwd:
        return cwd, "the current directory, a repository's top level"
    return repo.top, (f"the top level of the repository holding the current directory "
                      f"({os.path.relpath(cwd, repo.top)}, where the command starts)")


def outside_git_dirs(repo: Located | None, workdir: str, home: str) -> tuple[str, ...]:
    """The workdir repository's git directories outside the workdir (outermost only).

    A linked worktree's own git dir and its common dir (the main repository's
    ``.git``), a submodule's (in its superproject's ``.git/modules``): git
    inside writes objects, refs and the index there, or commits fail.
    ValueError for one at / or holding the home directory: never granted.
    """
    if repo is None or repo.top != workdir:
        return ()
    out: list[str] = []
    for path in sorted({repo.common_dir, repo.git_dir}, key=len):
        if under(path, workdir) or any(under(path, d) for d in out):
            continue
        if under(home, path):
            raise ValueError(f"the git directory {path} of {workdir} holds the home "
                             "directory, which is never granted (--workdir=DIR elsewhere)")
        out.append(path)
    return tuple(out)


def _without_crud(text: str) -> str:
    return text.strip("".join(chr(c) for c in range(33)) + _CRUD)


def parse_signing(status: int, out: bytes, workdir: str) -> Signing:
    """The key from ``git config -z --show-scope --show-origin --get-regexp`` output.

    git uses each key's last value.  Without ``user.signingkey`` git signs as
    the committer, ``Name <email>`` (``committer.*`` over ``user.*``, crud
    stripped as git strips it).  Status 1 is git's "nothing matched".
    """
    if status == -1:
        return Signing("", "", f"git did not answer within {GIT_TIMEOUT:g} s reading its "
                               f"configuration in {workdir}: run `git -C {workdir} config --list`")
    if status not in (0, 1):
        return Signing("", "", "git cannot read its configuration here (git config exits "
                               f"{status}): run `git -C {workdir} config --list` to see why")
    values: dict[str, tuple[str, str]] = {}
    fields = out.decode("utf-8", "surrogateescape").split("\0")
    for i in range(0, len(fields) - 2, 3):
        scope, origin, entry = fields[i : i + 3]
        key, _, value = entry.partition("\n")
        where = origin.removeprefix("file:")
        if where and not where.startswith("/") and origin.startswith("file:"):
            where = os.path.normpath(os.path.join(workdir, where))
        values[key] = (value, f"{scope}, {where}" if where else scope)
    fmt, fmt_where = values.get("gpg.format", ("", ""))
    if fmt.lower() not in SIGN_FORMATS:
        return Signing("", "", f"gpg.format is {fmt} ({fmt_where}): sessions sign with "
                               "OpenPGP keys only (through gpg-shim), so signing inside will fail; "
                               "git config gpg.format openpgp, or commit with --no-gpg-sign")
    if "user.signingkey" in values:
        key, where = values["user.signingkey"]
        return Signing(key.strip(), f"user.signingkey ({where})" if key.strip() else "")
    name = _without_crud(values.get("committer.name", values.get("user.name", ("", "")))[0])
    email = _without_crud(values.get("committer.email", values.get("user.email", ("", "")))[0])
    if name and email:
        return Signing(f"{name} <{email}>", "the committer's name and email "
                                            "(no user.signingkey: git signs as the committer)")
    return Signing("", "")
