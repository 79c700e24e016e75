"""What the request ops may start, decided apart from the connection's I/O.

``exec`` runs in the executor's sandbox, only inside the workdir; ``sign``
runs the host's gpg for an enabled key, outside any sandbox, with nothing
from the request on its command line but that key.
"""

from __future__ import annotations

import os
import subprocess

from libbroker.broker.executor import Child, killpg_quietly
from libbroker.errors import RequestRefused, SpawnError
from libbroker.paths import under


def checked_cwd(cwd: str, workdir: str) -> str:
    """``cwd`` with symlinks resolved, if it is ``workdir`` or inside it; else RequestRefused."""
    real = os.path.realpath(cwd)
    if not under(real, workdir):
        raise RequestRefused(f"cwd {cwd} is outside the workdir {workdir}")
    if not os.path.isdir(real):
        raise RequestRefused(f"cwd {cwd} is not a directory")
    return real


class PlainChild(Child):
    """A host process outside any sandbox (the gpg of the sign op)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def send_signal(self, signum: int) -> None:
        killpg_quietly(self.pid, signum)

    def kill(self) -> None:
        killpg_quietly(self.pid, 9)


def sign_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a ``--sign-key``, or None when it can.

    A key id, a fingerprint or a user id: git's default signing key (no
    user.signingkey) is the committer, ``Name <email>``, spaces included.
    It becomes one argument of gpg's command line, so it must not look like
    an option, and it holds no control character (nothing a log line or a
    terminal would show differently from what it is).
    """
    if not key:
        return "is empty"
    if key.startswith("-"):
        return "starts with '-' (it would read as an option)"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in key):
        return "holds a control character"
    return None


def not_enabled(key: str | None, sign_keys: frozenset[str]) -> str:
    """The refusal of ``key``, on one line, naming the key enabled and how to change it.

    gpg-shim prints it inside the sandbox, where the agent reads it: the fix
    is the person's (the key is fixed when the session starts), never the
    sandbox's to make.
    """
    enabled = ", ".join(repr(k) for k in sorted(sign_keys)) or "none"
    return (f"signing key {key!r} is not enabled on this broker (enabled: {enabled}); "
            "agent-sandbox enables the key git would use in the workdir when the session "
            "starts (user.signingkey, else the committer's name and email) or the config's "
            "sign_key: set it there and start a new session")


def gpg_argv(gpg: str, key: str) -> list[str]:
    """git's signing call: detached, armored, status lines on fd 2, as ``key``."""
    return [gpg, "--status-fd=2", "-bsau", key]


def spawn_gpg(
    gpg: str | None, sign_keys: frozenset[str], key: str | None, stdio: tuple[int, int, int]
) -> Child:
    """Start the host's gpg for ``key``; RequestRefused unless the key is exactly enabled."""
    if key is None or key not in sign_keys:
        raise RequestRefused(not_enabled(key, sign_keys))
    if gpg is None:
        raise SpawnError("gpg is not installed on the host")
    try:
        proc = subprocess.Popen(
            gpg_argv(gpg, key),
            stdin=stdio[0], stdout=stdio[1], stderr=stdio[2],
            start_new_session=True, cwd="/",
        )  # fmt: skip
    except OSError as exc:
        raise SpawnError(f"cannot start gpg: {exc.strerror}") from None
    proc.returncode = 0  # the connection reaps it through a pidfd; silence Popen.__del__
    return PlainChild(proc.pid)
