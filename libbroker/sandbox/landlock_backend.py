"""The Landlock backend: whether the kernel has it, what it makes of a Shape, and the
line to the reaper that both of its callers keep.

Its callers start the command differently: broker-server's executor forks
itself for each brokered command (:mod:`libbroker.broker.landlock_executor`),
the session starts :mod:`.landlock_helper` and sends it the spec.  Both end
the same way: the command runs below a reaper outside the sandbox
(:mod:`.reaper`, :mod:`.pidns`), and a :class:`ReaperLine` carries the
command's signals to that reaper, whose end of file kills what is left.
"""

from __future__ import annotations

import contextlib
import os

from libbroker.sandbox.backend import FAIL, OK, WARN, Backend, Finding
from libbroker.sandbox.kinds import BWRAP, LANDLOCK


class LandlockBackend(Backend):
    """Landlock: the process restricts itself (:func:`.enter.enter`), the kernel's, no program."""

    name = LANDLOCK
    executor = "libbroker.broker.landlock_executor"

    def unavailable(self) -> str | None:
        return None  # the kernel's: applying it tells (the helper exits 125)

    def diagnose(self) -> Finding:
        from libbroker.errors import SandboxUnavailable
        from libbroker.sandbox import landlock

        try:
            version = landlock.require()
        except SandboxUnavailable as exc:
            return Finding(FAIL, f"Landlock: {exc}",
                           f"a kernel >= 6.12 with landlock in its lsm= list, or use "
                           f"--sandbox={BWRAP}")
        from libbroker.sandbox import pidns

        what = f"Landlock: ABI {version} (network rules, signal and socket scoping)"
        if pidns.supported():
            return Finding(OK, what + "; a PID namespace and /proc of its own", group="sandbox",
                           short=f"Landlock ABI {version}")
        return Finding(
            WARN,
            what + "; no user namespaces for this user, so other processes' command lines "
            "stay visible in /proc under Landlock",
            "`sysctl -w kernel.unprivileged_userns_clone=1` (as root; where the kernel has it, "
            f"else the AppArmor userns rule), or use --sandbox={BWRAP}",
        )


class ReaperLine:
    """The write end of a Landlock command's pipe to its reaper
    (:func:`libbroker.sandbox.reaper.supervise`): a byte a signal number, which
    the reaper sends to the command's group while that group is still the
    command's; its end of file (:meth:`release`) kills whatever is still running.
    A :class:`~.backend.Started`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def signal(self, sig: int) -> bool:
        """``sig`` for the command; False when the line is closed (nothing was sent)."""
        if self.fd < 0:
            return False
        if 0 < sig < 256:
            # Gone (EPIPE) or a full pipe (a flood): nothing to deliver it to, or one of many.
            with contextlib.suppress(OSError):
                os.write(self.fd, bytes([sig]))
        return True

    def release(self) -> None:
        """End of file for the reaper; idempotent."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
