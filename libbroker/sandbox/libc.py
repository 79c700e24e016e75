"""The C library for the sandbox's system calls, and their failures as OSError.

Loaded on first use, not at import: the launcher imports :mod:`.seccomp` on
its start path only to build bytes, and ctypes costs milliseconds there.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import ctypes

_loaded: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """This process's C library, with errno kept for :func:`fail`."""
    global _loaded
    if _loaded is None:
        import ctypes

        _loaded = ctypes.CDLL(None, use_errno=True)
    return _loaded


def fail(what: str) -> NoReturn:
    """Raise the OSError of the call named ``what`` that just failed."""
    import ctypes

    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def check(result: int, what: str) -> None:
    """:func:`fail` unless ``result`` (a C call's return value) is 0."""
    if result != 0:
        fail(what)
