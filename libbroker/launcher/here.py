"""Where the launcher stands: the current directory, found again by $PWD if its mount went away.

A shell that entered the workdir while a session's live gate had it bound onto
itself (docs/hostrun-gate.md) keeps its working directory on that bind; once the
bind is detached, the kernel can no longer name it (``getcwd``: ENOENT), although
the very same directory is still there by its path.  ``$PWD`` names it: when it
is the directory we stand in (same device and inode), the launcher steps onto it,
as ``cd "$PWD"`` would, and goes on.  A directory really removed is a clear
error, never a traceback.
"""

from __future__ import annotations

import os

from libbroker.errors import ConfigError

GONE = ("the current directory was removed, or can no longer be reached by its path: "
        "cd to the directory you mean (cd \"$PWD\" if it is still there) and run again")


def recover() -> None:
    """Step back onto the current directory by ``$PWD`` if only its path was lost; never raises."""
    try:
        os.getcwd()
        return
    except OSError:
        pass
    pwd = os.environ.get("PWD", "")
    try:
        here, there = os.stat("."), os.stat(pwd)
        if pwd.startswith("/") and (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
            os.chdir(pwd)
    except (OSError, ValueError):  # ValueError: a NUL byte in $PWD; here() then says it
        return


def here() -> str:
    """The current directory's path (after :func:`recover`); ConfigError when it has none."""
    recover()
    try:
        return os.getcwd()
    except OSError as exc:
        raise ConfigError(GONE) from exc
