"""Landlock: the ruleset of a shape (pure), and its system calls (ctypes, no nono-py).

:func:`ruleset` turns a :class:`~libbroker.sandbox.shape.Shape` into the
rules Landlock enforces: read-only trees, read-write trees, and TCP connect
to named ports; :func:`restrict_self` applies them to this process.  Talking
to the kernel directly costs a ctypes import (~5 ms), where nono-py cost a
32 MB extension (~190 ms) on the session's start path.

What Landlock is asked to handle (everything this kernel's ABI knows):
every file right, TCP bind and connect, and (ABI 6) the scoping of abstract
unix sockets and signals to the sandbox's own domain.  Below ABI 6 a
sandboxed process could signal any process of the same user, so the backend
refuses to start (fail closed): :func:`require` says so.

Limits, stated once:

- grants are hierarchical and cannot subtract: a ``deny`` inside a granted
  tree cannot be enforced, so :func:`ruleset` refuses it (ConfigError);
  a grant inside a denied tree is simply not made;
- a TCP rule names a port, not an address: connect to the proxy's port is
  allowed on every address;
- connect() to a path-named unix socket is not mediated (up to ABI 7): the
  seccomp filter (:mod:`.seccomp`) refuses creating unix sockets instead.
"""

from __future__ import annotations

import os

from libbroker.errors import ConfigError, SandboxUnavailable
from libbroker.named_tuple import NamedTuple
from libbroker.paths import under
from libbroker.sandbox.libc import check, fail, libc
from libbroker.sandbox.shape import Shape

# linux/landlock.h
_FS = {
    "execute": 1 << 0,
    "write_file": 1 << 1,
    "read_file": 1 << 2,
    "read_dir": 1 << 3,
    "remove_dir": 1 << 4,
    "remove_file": 1 << 5,
    "make_char": 1 << 6,
    "make_dir": 1 << 7,
    "make_reg": 1 << 8,
    "make_sock": 1 << 9,
    "make_fifo": 1 << 10,
    "make_block": 1 << 11,
    "make_sym": 1 << 12,
    "refer": 1 << 13,  # ABI 2
    "truncate": 1 << 14,  # ABI 3
    "ioctl_dev": 1 << 15,  # ABI 5
}
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
READ = _FS["execute"] | _FS["read_file"] | _FS["read_dir"]
FILE_ONLY = (
    _FS["execute"] | _FS["write_file"] | _FS["read_file"] | _FS["truncate"] | _FS["ioctl_dev"]
)
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX = 1 << 0
SCOPE_SIGNAL = 1 << 1
MIN_ABI = 6

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2


class Rule(NamedTuple):
    """``path`` (a directory tree, or one file) with ``writable`` or read-only rights."""

    path: str
    writable: bool
    is_dir: bool


class Ruleset(NamedTuple):
    rules: tuple[Rule, ...]
    tcp_connect: tuple[int, ...]


def shape_paths(shape: Shape) -> list[str]:
    """Every path whose kind :func:`ruleset` needs to know."""
    return [*shape.read, "/proc", *shape.devices, *shape.write, *shape.deny]


def kinds(paths: list[str]) -> dict[str, bool]:
    """For each of ``paths`` that exists (links followed): whether it is a directory."""
    out: dict[str, bool] = {}
    for path in paths:
        if os.path.exists(path):
            out[path] = os.path.isdir(path)
    return out


def ruleset(shape: Shape, is_dir: dict[str, bool]) -> Ruleset:
    """The rules of ``shape``; ``is_dir`` tells, for each path that exists, what it is.

    Paths missing from ``is_dir`` do not exist and get no rule.  Besides the
    shape's grants: /proc read-only (what matters in it, the environ, mem and
    fd/ of processes outside the sandbox, is behind ptrace checks, which
    Landlock scopes to the sandbox's own domain) and the shape's devices.
    ConfigError for a deny inside a grant (see the module doc).
    """
    grants = [(p, False) for p in (*shape.read, "/proc")]
    grants += [(p, True) for p in (*shape.devices, *shape.write)]
    rules: list[Rule] = []
    for path, writable in grants:
        if any(under(path, d) for d in shape.deny):
            continue  # deny wins: a grant inside a denied tree is not made
        inside = [d for d in shape.deny if under(d, path) and d in is_dir]
        if inside:
            raise ConfigError(
                f"Landlock cannot deny {inside[0]} inside the granted {path}; "
                "use the bwrap backend or change the configuration"
            )
        if path in is_dir:
            rules.append(Rule(path, writable, is_dir[path]))
    return Ruleset(tuple(rules), tuple(shape.tcp_connect))


def shape_ruleset(shape: Shape) -> Ruleset:
    """:func:`ruleset` for ``shape``, its paths looked at on this host."""
    return ruleset(shape, kinds(shape_paths(shape)))


# --- the kernel ---------------------------------------------------------------


def abi() -> int:
    """This kernel's Landlock ABI version; 0 when Landlock is off or missing."""
    version = libc().syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def require() -> int:
    """The ABI version, or SandboxUnavailable when it cannot confine a command (below 6)."""
    version = abi()
    if version == 0:
        raise SandboxUnavailable("Landlock is not enabled in this kernel (lsm= boot parameter)")
    if version < MIN_ABI:
        raise SandboxUnavailable(
            f"Landlock ABI {version} cannot keep signals and abstract unix sockets "
            f"inside the sandbox (needs ABI {MIN_ABI}, Linux 6.12); use bwrap"
        )
    return version


def restrict_self(rs: Ruleset, version: int) -> None:
    """Apply ``rs`` to this process and its future children (irreversible).

    Landlock needs no_new_privs from an unprivileged caller: :func:`.enter.enter`
    sets it before.  OSError when the kernel refuses.
    """
    import ctypes

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    class NetPort(ctypes.Structure):
        _fields_ = [("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64)]

    c = libc()
    handled = _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= version)]
    attr = RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    fd = c.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if fd < 0:
        fail("landlock_create_ruleset")
    try:
        for rule in rs.rules:
            allowed = handled if rule.writable else READ & handled
            if not rule.is_dir:
                allowed &= FILE_ONLY
            try:  # the host's own paths: a link the policy names is followed
                parent = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot open {rule.path}: {exc.strerror}") from None
            try:
                beneath = PathBeneath(allowed, parent)
                check(c.syscall(_SYS_ADD_RULE, fd, _RULE_PATH_BENEATH, ctypes.byref(beneath), 0),
                      f"landlock_add_rule({rule.path})")
            finally:
                os.close(parent)
        for port in rs.tcp_connect:
            net = NetPort(NET_CONNECT_TCP, port)
            check(c.syscall(_SYS_ADD_RULE, fd, _RULE_NET_PORT, ctypes.byref(net), 0),
                  f"landlock_add_rule(tcp connect {port})")
        check(c.syscall(_SYS_RESTRICT_SELF, fd, 0), "landlock_restrict_self")
    finally:
        os.close(fd)
