"""The bwrap backend: whether bwrap can run here (cheaply, and as doctor tries it), and
what it makes of a Shape."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from typing import ClassVar

from libbroker.sandbox.backend import FAIL, OK, Backend, Finding
from libbroker.sandbox.kinds import BWRAP, LANDLOCK

_ALTERNATIVE = f"or use --sandbox={LANDLOCK}"
_TRY = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"]


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


class BwrapBackend(Backend):
    """bubblewrap: every namespace unshared, the shape's paths bound (:func:`.bwrap.argv`)."""

    name = BWRAP
    executor = "libbroker.broker.bwrap_executor"
    realises: ClassVar[Mapping[str, str]] = {
        "read": "read-only binds", "write": "read-write binds",
        "deny": "an empty read-only tmpfs (or /dev/null) over it, even inside a grant",
        "protect": "read-only binds over the writable tree",
        "masked": "/dev/null bound over each", "empty": "a tmpfs over each",
        "devices": "ignored: bwrap's own /dev holds the same nodes",
        "tcp_connect": "nothing but these ports in its own network namespace, each bridged "
                       "to the host's (BwrapStart)",
        "cwd": "--chdir", "env": "the caller's environment for bwrap",
        "tmp": "ignored: a fresh /tmp instead", "tmp_size": "the size of that /tmp",
        "new_session": "--new-session", "hostname": "--hostname",
        "overlays": "read-only binds over the path", "binds": "read-write binds",
        "links": "not needed: the session holds the links (sandbox.holdlink)",
    }  # fmt: skip

    def unavailable(self) -> str | None:
        if shutil.which("bwrap"):
            return None
        return f"bwrap is not installed (apt-get install bubblewrap), {_ALTERNATIVE}"

    def diagnose(self) -> Finding:
        if not shutil.which("bwrap"):
            return Finding(FAIL, "bwrap: not installed",
                           f"`apt-get install bubblewrap`, {_ALTERNATIVE}", "sandbox", "bwrap")
        try:
            done = subprocess.run(_TRY, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            code, err = 127, str(exc)
        else:
            code, err = done.returncode, (done.stderr or done.stdout).strip()
        if code == 0:
            return Finding(OK, "bwrap: user, network and pid namespaces work", group="sandbox",
                           short="bwrap")
        return Finding(FAIL, *_why_not(err))


def _why_not(err: str) -> tuple[str, str]:
    """What stops bwrap here, and the fix."""
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            f"bwrap: cannot create namespaces ({err}); "
            "Ubuntu's AppArmor restricts unprivileged user namespaces",
            "add an AppArmor profile for /usr/bin/bwrap allowing userns "
            f"(see /etc/apparmor.d/bwrap-userns-restrict), {_ALTERNATIVE}",
        )
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return ("bwrap: user namespaces are disabled",
                f"`sysctl -w user.max_user_namespaces=15000` (as root), {_ALTERNATIVE}")
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return ("bwrap: unprivileged user namespaces are off",
                f"`sysctl -w kernel.unprivileged_userns_clone=1` (as root), {_ALTERNATIVE}")
    return (f"bwrap: does not run ({err})",
            "run `bwrap --unshare-all --die-with-parent --ro-bind / / true` to see why, "
            + _ALTERNATIVE)
