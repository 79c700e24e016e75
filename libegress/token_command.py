"""``--token-command``'s argv: split with shlex, never given to a shell.

Apart from :mod:`libegress.tokens` (which runs it, with asyncio) so that
egress-proxy checks its options without loading the event loop, which it loads
after its ``listening`` line (docs/fast-start.md).
"""

from __future__ import annotations

import shlex

from libbroker.errors import UsageError


def token_argv(command: str) -> list[str]:
    """The argv of ``--token-command``; refused when empty or unbalanced."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--token-command cannot be split: {exc}") from None
    if not argv:
        raise UsageError("--token-command is empty")
    return argv
