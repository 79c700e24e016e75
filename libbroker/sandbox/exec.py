"""Replace this process with a sandboxed command, with the shell's exit statuses.

127 when the command is found nowhere, 126 when it is found but cannot run.
Both Landlock paths use it in their forked child, after the rules are on:
the broker's per-command sandbox and the launcher's session helper.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

_TOP = 1 << 20  # the kernel's default nr_open: no descriptor lies above it


def keep_only(keep: Iterable[int]) -> None:
    """Close every descriptor of this process but ``keep``: a forked child's close_fds,
    so that nothing of its parent's reaches it or what it runs."""
    low = 0
    for fd in sorted(set(keep)):
        if low < fd:  # closerange(0, 0) would be close_range(0, ~0): every one
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _TOP)


def exec_or_exit(argv: Sequence[str], env: Mapping[str, str], prog: str = "") -> NoReturn:
    """execvpe with the shell's statuses; ``prog`` (``"name: "``) starts the messages.

    Not os.execvpe: it reports a PATH directory the sandbox hides (EACCES) as
    the failure even when the command exists nowhere, which would be 126.
    """
    name = argv[0]
    if "/" in name:
        candidates = [name]
    else:
        path = env.get("PATH", os.defpath)
        candidates = [os.path.join(d or ".", name) for d in path.split(":")]
    denied: OSError | None = None
    for candidate in candidates:
        try:
            os.execve(candidate, list(argv), dict(env))  # noqa: S606 - the sandboxed command
        except OSError as exc:
            if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                continue
            if denied is None and os.path.lexists(candidate):
                denied = exc
    if denied is None:
        report_and_exit(f"{prog}{name}: command not found", 127)
    report_and_exit(f"{prog}{name}: cannot execute: {denied.strerror}", 126)


def report_and_exit(message: str, status: int) -> NoReturn:
    """One line on stderr (if it is still there), then ``_exit(status)``."""
    with contextlib.suppress(OSError):
        os.write(2, message.encode("utf-8", "replace") + b"\n")
    os._exit(status)
