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

What their answers mean is pure and lives in :mod:`.git_answers`, so every
rule is tested without git.
"""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING

from libbroker.launcher.git_answers import GIT_TIMEOUT as GIT_TIMEOUT
from libbroker.launcher.git_answers import Located, parse_located
from libbroker.which import which

if TYPE_CHECKING:
    from libbroker.launcher.child import Proc

MAX_OUTPUT = 1 << 20  # what git may print for these questions (a key, a few paths)
_SIGN_KEYS = "^(user\\.(signingkey|name|email)|committer\\.(name|email)|gpg\\.format)$"


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
    if not which("git"):
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
    """Ask git for its signing settings in ``workdir`` (:func:`.git_answers.parse_signing`)."""
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
