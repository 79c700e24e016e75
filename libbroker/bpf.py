"""Classic BPF for seccomp filters: opcodes, one instruction, and loading one.

Two filters are built from these pieces: :mod:`libbroker.seccomp_unix` (no
unix sockets under the broker's Landlock backend) and
:mod:`libbroker.launcher.seccomp` (no terminal injection in a session).  Each
program is pure bytes; :func:`install` is the one place that loads one.
Stdlib only, and ctypes is imported only when a filter is installed: the
launcher imports this module to build bytes for bwrap's ``--seccomp FD``.
"""

from __future__ import annotations

import os
import struct

# linux/bpf_common.h opcodes, as combined by seccomp filters.
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
RET_K = 0x06
# linux/seccomp.h return values.
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000  # | errno

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
# (little endian, so the low 32 bits of args[n] are at 16 + 8n).
OFF_NR = 0
OFF_ARCH = 4
X32_BIT = 0x40000000  # syscall numbers of the x32 ABI carry this bit

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def arg_low(n: int) -> int:
    """Offset of the low 32 bits of syscall argument ``n``."""
    return 16 + 8 * n


def insn(code: int, jt: int, jf: int, k: int) -> bytes:
    """One ``struct sock_filter``."""
    return struct.pack("<HBBI", code, jt, jf, k)


def install(program: bytes) -> None:
    """Load ``program`` into this process (irreversible; needs no_new_privs or CAP_SYS_ADMIN)."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    fprog = SockFprog(len(program) // 8, program)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
