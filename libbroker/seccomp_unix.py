"""A seccomp filter refusing ``socket(AF_UNIX, ...)``, for the Landlock backend.

Landlock (ABI 6) does not mediate connect() to a path-named unix socket: a
sandboxed command could reach the person's gpg-agent, ssh-agent or docker
socket by name even though it cannot read the directory.  bwrap hides them
(only bound paths exist); under Landlock this filter refuses creating a unix
socket at all (EACCES).  ``socketpair`` stays allowed, so pipes-like IPC
between the command's own processes keeps working.  Syscalls of a foreign
ABI (32-bit compat, x32) are refused outright: they would bypass the check.

The program is classic BPF over ``struct seccomp_data``; :func:`program` is
pure and :func:`install` loads it with ``prctl(PR_SET_SECCOMP)`` (after
no_new_privs, which :func:`~libbroker.sandbox_landlock.drop_privileges` sets).
"""

from __future__ import annotations

import platform

from libbroker import bpf
from libbroker.bpf import (
    JEQ_K,
    JGE_K,
    LD_W_ABS,
    OFF_ARCH,
    OFF_NR,
    RET_ALLOW,
    RET_ERRNO,
    RET_K,
    X32_BIT,
    arg_low,
    insn,
)

AF_UNIX = 1
_EACCES = 13
_ENOSYS = 38

# machine -> (audit arch, socket syscall number)
_NATIVE = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one); None when unsupported."""
    native = _NATIVE.get(machine or platform.machine())
    if native is None:
        return None
    arch, socket_nr = native
    insns = [
        insn(LD_W_ABS, 0, 0, OFF_ARCH),  # 0
        insn(JEQ_K, 1, 0, arch),  # 1: native -> 3
        insn(RET_K, 0, 0, RET_ERRNO | _ENOSYS),  # 2: foreign ABI
        insn(LD_W_ABS, 0, 0, OFF_NR),  # 3
        insn(JGE_K, 5, 0, X32_BIT),  # 4: x32 numbers -> 10
        insn(JEQ_K, 0, 3, socket_nr),  # 5: socket? -> 6, else -> 9
        insn(LD_W_ABS, 0, 0, arg_low(0)),  # 6
        insn(JEQ_K, 2, 0, AF_UNIX),  # 7: AF_UNIX -> 10
        insn(RET_K, 0, 0, RET_ALLOW),  # 8
        insn(RET_K, 0, 0, RET_ALLOW),  # 9
        insn(RET_K, 0, 0, RET_ERRNO | _EACCES),  # 10
    ]
    return b"".join(insns)


_PROGRAM = program()


def supported() -> bool:
    """Whether this machine has a filter (x86_64, aarch64)."""
    return _PROGRAM is not None


def install() -> None:
    """Load the filter into this process (irreversible; needs no_new_privs)."""
    if _PROGRAM is None:
        raise OSError(_ENOSYS, "no unix-socket filter for this architecture")
    bpf.install(_PROGRAM)
