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

import ctypes
import os
import platform
import struct

AF_UNIX = 1
_EACCES = 13
_ENOSYS = 38

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0_LOW = 16  # args[0], low 32 bits (little endian)

# machine -> (audit arch, socket syscall number)
_NATIVE = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
_X32_BIT = 0x40000000

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one); None when unsupported."""
    native = _NATIVE.get(machine or platform.machine())
    if native is None:
        return None
    arch, socket_nr = native
    insns = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),  # 0
        _insn(_JEQ_K, 1, 0, arch),  # 1: native -> 3
        _insn(_RET_K, 0, 0, _RET_ERRNO | _ENOSYS),  # 2: foreign ABI
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),  # 3
        _insn(_JGE_K, 5, 0, _X32_BIT),  # 4: x32 numbers -> 10
        _insn(_JEQ_K, 0, 3, socket_nr),  # 5: socket? -> 6, else -> 9
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),  # 6
        _insn(_JEQ_K, 2, 0, AF_UNIX),  # 7: AF_UNIX -> 10
        _insn(_RET_K, 0, 0, _RET_ALLOW),  # 8
        _insn(_RET_K, 0, 0, _RET_ALLOW),  # 9
        _insn(_RET_K, 0, 0, _RET_ERRNO | _EACCES),  # 10
    ]
    return b"".join(insns)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PROGRAM = program()
_BUFFER = ctypes.create_string_buffer(_PROGRAM or b"")
_FPROG = _SockFprog(len(_PROGRAM or b"") // 8, ctypes.addressof(_BUFFER))
_libc = ctypes.CDLL(None, use_errno=True)


def supported() -> bool:
    """Whether this machine has a filter (x86_64, aarch64)."""
    return _PROGRAM is not None


def install() -> None:
    """Load the filter into this process (irreversible; needs no_new_privs)."""
    if _PROGRAM is None:
        raise OSError(_ENOSYS, "no unix-socket filter for this architecture")
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_FPROG), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
