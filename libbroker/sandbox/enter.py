"""The one hardening sequence a forked child runs before it execs into a sandbox.

Both Landlock paths (a brokered command, and the agent's session) call
:func:`enter`; bwrap does the same steps itself (``--cap-drop ALL``,
``--seccomp``, namespaces).  In order:

1. capabilities: the bounding set dropped (else root would get them back at
   the next execve), the ambient set cleared, then the effective, permitted
   and inheritable sets emptied.  Landlock stops file access even for root,
   but not what capabilities allow beside it (raw sockets, reading other
   processes' memory with CAP_SYS_PTRACE, mounts);
2. no_new_privs: no setuid binary or file capability gives anything back;
3. the seccomp filter (:mod:`.seccomp`);
4. the Landlock ruleset (:mod:`.landlock`), last, so that it covers the
   process that execs.

Irreversible; any failure raises OSError and the caller must not exec.
"""

from __future__ import annotations

import ctypes
import os

from libbroker.sandbox import landlock, seccomp
from libbroker.sandbox.libc import check, libc

_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 63


def drop_capabilities() -> None:
    """No capability now or after any exec, and no_new_privs (the user may be root)."""
    c = libc()
    for cap in range(_last_cap() + 1):
        # EPERM without CAP_SETPCAP: then there is nothing to drop (an
        # unprivileged bounding set is inert under no_new_privs).
        if c.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    c.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    check(c.capset(ctypes.byref(header), data), "capset")
    check(c.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def enter(rules: landlock.Ruleset, abi: int, seccomp_filter: seccomp.Filter) -> None:
    """Steps 1-4 of the module doc, in this process."""
    drop_capabilities()
    prog = seccomp.program(seccomp_filter)
    if prog is None:
        raise OSError(38, f"no seccomp filter for {os.uname().machine}")
    seccomp.install(prog)
    landlock.restrict_self(rules, abi)
