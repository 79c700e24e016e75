"""A seccomp filter that refuses the terminal-injection ioctls (pure).

An interactive session keeps the user's terminal as its controlling tty, so
that shells keep job control.  That tty is also a way out: ``ioctl(TIOCSTI)``
pushes bytes into the terminal's input queue, which the user's own shell reads
after the session ends (a sandboxed command "types" a command on the host).
bwrap's ``--new-session`` defends by dropping the controlling tty, which breaks
job control; this filter defends instead by refusing TIOCSTI and TIOCLINUX
(the Linux console's selection paste) with EPERM, and is installed in every
session, tty or not.  Everything else is allowed: it is a tripwire, not a
general syscall policy.

The program is classic BPF over ``struct seccomp_data``, built here as bytes
for bwrap's ``--seccomp FD`` and for ``prctl(PR_SET_SECCOMP)``.
"""

from __future__ import annotations

import os

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

TIOCSTI = 0x5412
TIOCLINUX = 0x541C
_EPERM = 1

_RET_EPERM = RET_ERRNO | _EPERM

# (audit arch, ioctl syscall number) per machine, plus the 32-bit compat ABI.
_ARCHES: dict[str, list[tuple[int, int]]] = {
    "x86_64": [(0xC000003E, 16), (0x40000003, 54)],
    "aarch64": [(0xC00000B7, 29), (0x40000028, 54)],
}
def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one), None when unsupported."""
    machine = machine or os.uname().machine  # not platform: it compiles regexes on import
    arches = _ARCHES.get(machine)
    if arches is None:
        return None
    # One block per arch: check the arch, load the syscall number, send ioctl
    # to the shared argument check (`tail`), allow the rest.  The native
    # x86_64 block also refuses the x32 ABI's numbers.
    sizes = [6 if (i == 0 and machine == "x86_64") else 5 for i in range(len(arches))]
    errno_at = sum(sizes)
    tail_at = errno_at + 1
    out: list[bytes] = []
    start = 0
    for i, (arch, ioctl_nr) in enumerate(arches):
        end = start + sizes[i]
        out.append(insn(LD_W_ABS, 0, 0, OFF_ARCH))
        out.append(insn(JEQ_K, 0, end - (start + 1) - 1, arch))
        out.append(insn(LD_W_ABS, 0, 0, OFF_NR))
        if sizes[i] == 6:
            here = start + 3
            out.append(insn(JGE_K, errno_at - here - 1, 0, X32_BIT))
        here = end - 2
        out.append(insn(JEQ_K, tail_at - here - 1, 0, ioctl_nr))
        out.append(insn(RET_K, 0, 0, RET_ALLOW))
        start = end
    out.append(insn(RET_K, 0, 0, _RET_EPERM))  # an arch this filter does not know
    out += [
        insn(LD_W_ABS, 0, 0, arg_low(1)),
        insn(JEQ_K, 2, 0, TIOCSTI),
        insn(JEQ_K, 1, 0, TIOCLINUX),
        insn(RET_K, 0, 0, RET_ALLOW),
        insn(RET_K, 0, 0, _RET_EPERM),
    ]
    return b"".join(out)
