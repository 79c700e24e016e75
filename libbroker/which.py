"""The one PATH lookup: ``shutil.which``'s rule without shutil.

shutil's import loads fnmatch, bz2, lzma and zlib (~3 ms of CPU), and the
launcher looks up bwrap, git and gh on every session's start, before go.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the base is light)
if TYPE_CHECKING:
    from collections.abc import Mapping


def which(program: str, env: Mapping[str, str] | None = None) -> str | None:
    """``program``'s path, or None: the first executable, not a directory, of that name
    on PATH (``env``'s, else this process's; os.defpath without one).  A name with a
    slash is checked as given."""
    if "/" in program:
        return program if _runnable(program) else None
    if (os.environ if env is None else env).get("PATH") == "":
        return None  # as shutil.which: an empty PATH names no directory, not the cwd
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, program)
        if _runnable(path):
            return path
    return None


def _runnable(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)
