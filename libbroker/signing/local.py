"""gpg-shim's verification path: the local gpg, with git's arguments untouched.

Verifying needs only public keys, which the sandbox may hold, so ``git
verify-commit``, ``verify-tag`` and ``log --show-signature`` (one call per
commit shown) run the local gpg directly: no broker, and none of the broker's
modules imported.
"""

from __future__ import annotations

import os
import sys

from libbroker.errors import UsageError

# Set while exec'ing the local gpg: if that gpg is itself a wrapper that runs
# gpg-shim again, the second shim stops instead of looping.
_LOOP_GUARD = "AGENT_SANDBOX_GPG_SHIM_EXEC"


def exec_local_gpg(args: tuple[str, ...]) -> None:
    """Replace this process with the local gpg running ``args`` (never returns)."""
    if os.environ.get(_LOOP_GUARD):
        raise UsageError("the local gpg runs gpg-shim again: put the real gpg first on PATH")
    gpg = find_local_gpg()
    os.environ[_LOOP_GUARD] = "1"
    sys.stdout.flush()
    try:
        os.execv(gpg, ["gpg", *args])  # noqa: S606 - argv exactly as git gave it, no shell
    except OSError as exc:
        raise UsageError(f"cannot run the local gpg {gpg}: {exc.strerror}") from None


def find_local_gpg() -> str:
    """The first ``gpg`` on PATH that is not this program under another name."""
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", "gpg")
        if (
            os.path.isfile(candidate)
            and os.access(candidate, os.X_OK)
            and os.path.realpath(candidate) != me
        ):
            return candidate
    raise UsageError("no gpg found on PATH to verify with")
