"""What both of the service's zygotes share: their start, and the code they imported.

A zygote (:mod:`.broker_zygote`, :mod:`.launcher_zygote`) imports the code
once and forks it for each session for as long as the service lives.  After an
upgrade of the installation it would go on forking the old code: each fork
request first checks that every file it imported is still the one it read,
and refuses otherwise, so the session gets the new code from a cold start
instead (its launcher spawns the broker, or the client runs the launcher).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable

Stamps = dict[str, tuple[int, int, int]]


def sources() -> Stamps:
    """Each imported module's file and its (inode, size, mtime): the code a fork would run."""
    out: Stamps = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            try:
                st = os.stat(path)
            except OSError:
                continue
            out[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def changed(seen: Stamps) -> str:
    """A file of the code imported at the start that is not the same any more ("" if none)."""
    for path, was in seen.items():
        try:
            st = os.stat(path)
        except OSError:
            return path
        if (st.st_ino, st.st_size, st.st_mtime_ns) != was:
            return path
    return ""


def stale_refusal(seen: Stamps) -> str:
    """The refusal of a fork of code changed since ``seen`` was taken ("" when unchanged)."""
    stale = changed(seen)
    if not stale:
        return ""
    return f"{stale} changed since the service started (an upgrade? restart agent-sandbox serve)"


def main(warm: Callable[[], None], serve: Callable[[socket.socket], int]) -> int:
    """A zygote's start: argv[1] is its end of the service's socket (argv[2]: the service's
    pid; ``PR_SET_PDEATHSIG`` is set by the boot); imports warmed, ``ready`` said, then served."""
    fd = int(sys.argv[1])
    warm()
    sock = socket.socket(fileno=fd)
    sock.send(b'{"ready": true}')
    return serve(sock)
