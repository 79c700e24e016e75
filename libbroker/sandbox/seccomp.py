"""The one seccomp filter of every sandbox, built as classic BPF bytes (pure).

Landlock and namespaces leave a few kernel doors open that a filter on
system call numbers and their integer arguments can close.  :func:`program`
builds one filter from a :class:`Filter` (what to refuse), for bwrap's
``--seccomp FD`` and for :func:`install` in a forked child before exec
(:mod:`libbroker.sandbox.enter`).  It refuses, each with an errno (never a
kill, so programs see an ordinary failure):

- always: ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)`` (EPERM).  A session
  keeps the user's terminal for job control; those two push bytes into its
  input queue, which the user's own shell reads after the session ends;
- always: ``keyctl``, ``add_key``, ``request_key`` (EPERM).  The user keyring
  (``@u``) is reachable from any process of the same uid, whatever session
  keyring it has;
- always: io_uring (EPERM).  Its operations (``IORING_OP_SOCKET``,
  ``IORING_OP_CONNECT``...) would create sockets without the ``socket`` call
  this filter inspects;
- always: syscalls of a foreign ABI (32-bit compat, x32: ENOSYS).  Their
  numbers differ, so each check below would need a twin; nothing we sandbox
  is a 32-bit program;
- with ``sockets`` (Landlock, which has no network namespace): ``socket()``
  for anything but TCP over IPv4/IPv6 and NETLINK_ROUTE (EACCES).  So no UDP
  (the host's DNS resolver would be a way out), no raw or packet sockets, no
  netlink sock_diag (a list of every socket on the host), and no unix socket:
  Landlock does not mediate ``connect()`` to a path-named unix socket, so the
  user's ssh-agent, gpg-agent, D-Bus or docker socket would be reachable by
  name.  ``socketpair()`` stays allowed (pipes between the command's own
  processes) for stream and seqpacket pairs only: a datagram pair could
  still ``sendto()`` a host socket by path.  TCP is Landlock's: connect only
  to the ports the shape names.

Stdlib only; ctypes is imported only when a filter is installed.
"""

from __future__ import annotations

import os
import struct

from libbroker.named_tuple import NamedTuple

# linux/bpf_common.h opcodes, as combined by seccomp filters.
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
AND_K = 0x54
RET_K = 0x06
# linux/seccomp.h return values.
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000  # | errno

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
# (little endian, so the low 32 bits of args[n] are at 16 + 8n).
OFF_NR = 0
OFF_ARCH = 4
X32_BIT = 0x40000000  # syscall numbers of the x32 ABI carry this bit

EPERM = 1
EACCES = 13
ENOSYS = 38

TIOCSTI = 0x5412
TIOCLINUX = 0x541C
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM = 1
SOCK_SEQPACKET = 5
SOCK_TYPE_MASK = 0xF  # the rest of socket()'s type is SOCK_NONBLOCK / SOCK_CLOEXEC
IPPROTO_TCP = 6
NETLINK_ROUTE = 0


class Arch(NamedTuple):
    """One machine's audit arch and the syscall numbers the filter looks at."""

    audit: int
    socket: int
    socketpair: int
    ioctl: int
    keyring: tuple[int, ...]  # add_key, request_key, keyctl
    io_uring: tuple[int, ...] = (425, 426, 427)  # the same on every 64-bit arch


ARCHES = {
    "x86_64": Arch(audit=0xC000003E, socket=41, socketpair=53, ioctl=16, keyring=(248, 249, 250)),
    "aarch64": Arch(
        audit=0xC00000B7, socket=198, socketpair=199, ioctl=29, keyring=(217, 218, 219)
    ),
}


class Filter(NamedTuple):
    """What a sandbox refuses beyond the fixed list; see the module doc."""

    sockets: bool = False  # only TCP and NETLINK_ROUTE may be created


def arg_low(n: int) -> int:
    """Offset of the low 32 bits of syscall argument ``n``."""
    return 16 + 8 * n


def insn(code: int, jt: int, jf: int, k: int) -> bytes:
    """One ``struct sock_filter``."""
    return struct.pack("<HBBI", code, jt, jf, k)


class _Asm:
    """A few lines of BPF with named jump targets, resolved when assembled."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.lines)

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.lines.append((code, jt, jf, k))

    def ret(self, value: int) -> None:
        self.op(RET_K, value)

    def bytes(self) -> bytes:
        out = []
        for at, (code, jt, jf, k) in enumerate(self.lines):
            out.append(insn(code, self._rel(at, jt), self._rel(at, jf), k))
        return b"".join(out)

    def _rel(self, at: int, target: str | int) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[target] - at - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"jump to {target} out of reach")
        return offset


def program(spec: Filter | None = None, machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one); None when the machine has none."""
    spec = spec or Filter()
    arch = ARCHES.get(machine or os.uname().machine)  # not platform: it compiles regexes
    if arch is None:
        return None
    a = _Asm()
    a.op(LD_W_ABS, OFF_ARCH)
    a.op(JEQ_K, arch.audit, jt=0, jf="nosys")
    a.op(LD_W_ABS, OFF_NR)
    a.op(JGE_K, X32_BIT, jt="nosys")
    a.op(JEQ_K, arch.ioctl, jt="ioctl")
    for nr in (*arch.keyring, *arch.io_uring):
        a.op(JEQ_K, nr, jt="eperm")
    if spec.sockets:
        a.op(JEQ_K, arch.socket, jt="socket")
        a.op(JEQ_K, arch.socketpair, jt="socketpair")
    a.ret(RET_ALLOW)  # every other call
    a.label("ioctl")
    a.op(LD_W_ABS, arg_low(1))
    a.op(JEQ_K, TIOCSTI, jt="eperm")
    a.op(JEQ_K, TIOCLINUX, jt="eperm", jf="allow")
    if spec.sockets:
        a.label("socket")
        a.op(LD_W_ABS, arg_low(0))
        a.op(JEQ_K, AF_NETLINK, jt="netlink")
        a.op(JEQ_K, AF_INET, jt="inet")
        a.op(JEQ_K, AF_INET6, jt="inet", jf="eacces")
        a.label("inet")
        a.op(LD_W_ABS, arg_low(1))
        a.op(AND_K, SOCK_TYPE_MASK)
        a.op(JEQ_K, SOCK_STREAM, jt=0, jf="eacces")
        a.op(LD_W_ABS, arg_low(2))
        a.op(JEQ_K, 0, jt="allow")
        a.op(JEQ_K, IPPROTO_TCP, jt="allow", jf="eacces")
        a.label("netlink")
        a.op(LD_W_ABS, arg_low(2))
        a.op(JEQ_K, NETLINK_ROUTE, jt="allow", jf="eacces")
        # A datagram socket from socketpair() is connected to its twin, yet
        # sendto() with a path still reaches any datagram socket on the host
        # (/dev/log, an app's): only stream and seqpacket pairs, which ignore
        # or refuse an address.
        a.label("socketpair")
        a.op(LD_W_ABS, arg_low(0))
        a.op(JEQ_K, AF_UNIX, jt=0, jf="eacces")
        a.op(LD_W_ABS, arg_low(1))
        a.op(AND_K, SOCK_TYPE_MASK)
        a.op(JEQ_K, SOCK_STREAM, jt="allow")
        a.op(JEQ_K, SOCK_SEQPACKET, jt="allow", jf="eacces")
    # The verdicts, last: classic BPF jumps only forward.
    a.label("allow")
    a.ret(RET_ALLOW)
    a.label("nosys")
    a.ret(RET_ERRNO | ENOSYS)
    a.label("eperm")
    a.ret(RET_ERRNO | EPERM)
    a.label("eacces")
    a.ret(RET_ERRNO | EACCES)
    return a.bytes()


_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def install(prog: bytes) -> None:
    """Load ``prog`` into this process (irreversible; needs no_new_privs or CAP_SYS_ADMIN)."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    from libbroker.sandbox.libc import check, libc

    fprog = SockFprog(len(prog) // 8, prog)
    check(libc().prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
          "prctl(PR_SET_SECCOMP)")
