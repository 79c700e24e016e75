"""The one sandbox's pure builders: the seccomp program (run by a tiny BPF
interpreter), the Shape's JSON form, and the Landlock ruleset."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.errors import ConfigError
from libbroker.sandbox import bwrap, landlock, seccomp
from libbroker.sandbox.shape import Shape, from_json

ALLOW = seccomp.RET_ALLOW
EPERM = seccomp.RET_ERRNO | seccomp.EPERM
EACCES = seccomp.RET_ERRNO | seccomp.EACCES
ENOSYS = seccomp.RET_ERRNO | seccomp.ENOSYS


def run_bpf(prog: bytes, nr: int, arch: int, *args: int) -> int:
    """What the kernel would answer for syscall ``nr`` with ``args`` (classic BPF subset)."""
    insns = [struct.unpack("<HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    full = [*args, *[0] * (6 - len(args))]
    data = struct.pack("<iIQ6Q", nr, arch, 0, *full)
    pc, acc = 0, 0
    for _ in range(len(insns) + 1):
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code == 0x15:
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x54:
            acc, pc = acc & k, pc + 1
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unknown opcode {code:#x}")
    raise AssertionError("the program does not end")


MACHINES = list(seccomp.ARCHES)


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("sockets", [False, True])
@given(nr=st.integers(0, 0x3FFFFFFF), arg=st.integers(0, 2**64 - 1))
def test_only_the_listed_calls_are_refused(machine: str, sockets: bool, nr: int, arg: int) -> None:
    arch = seccomp.ARCHES[machine]
    prog = seccomp.program(seccomp.Filter(sockets=sockets), machine)
    assert prog is not None
    got = run_bpf(prog, nr, arch.audit, arg, arg, arg)
    low = arg & 0xFFFFFFFF
    injecting = nr == arch.ioctl and low in (seccomp.TIOCSTI, seccomp.TIOCLINUX)
    if injecting or nr in (*arch.keyring, *arch.io_uring):
        assert got == EPERM
    elif nr in (arch.socket, arch.socketpair) and sockets:
        assert got in (ALLOW, EACCES)
    else:
        assert got == ALLOW


@pytest.mark.parametrize(
    ("domain", "kind", "proto", "allowed"),
    [
        (2, 1, 0, True),  # TCP over IPv4
        (10, 1 | 0o4000 | 0o2000000, 6, True),  # TCP over IPv6, NONBLOCK|CLOEXEC
        (2, 1, 262, False),  # MPTCP: not what Landlock's TCP rules see
        (2, 2, 0, False),  # UDP: the host's DNS resolver would be a way out
        (10, 2, 17, False),
        (2, 3, 1, False),  # raw ICMP
        (1, 1, 0, False),  # unix stream: connect() by path is not mediated
        (1, 2, 0, False),  # unix datagram
        (1, 5, 0, False),  # unix seqpacket
        (16, 3, 0, True),  # NETLINK_ROUTE: getifaddrs, node
        (16, 3, 4, False),  # NETLINK_SOCK_DIAG: every socket of the host
        (16, 2, 9, False),  # NETLINK_AUDIT
        (17, 3, 0, False),  # AF_PACKET
        (40, 1, 0, False),  # AF_VSOCK
        (38, 5, 0, False),  # AF_ALG
    ],
)
@pytest.mark.parametrize("machine", MACHINES)
def test_socket_families(machine: str, domain: int, kind: int, proto: int, allowed: bool) -> None:
    arch = seccomp.ARCHES[machine]
    prog = seccomp.program(seccomp.Filter(sockets=True), machine)
    assert prog is not None
    assert run_bpf(prog, arch.socket, arch.audit, domain, kind, proto) == (
        ALLOW if allowed else EACCES
    )
    # without the socket rules (bwrap: a network namespace of its own) all pass
    assert run_bpf(seccomp.program(None, machine) or b"", arch.socket, arch.audit, domain) == ALLOW


@pytest.mark.parametrize(
    ("domain", "kind", "allowed"),
    [
        (1, 1, True),  # unix stream pair: pipes between the command's own processes
        (1, 5 | 0o2000000, True),  # seqpacket (an address is ignored there)
        (1, 2, False),  # datagram: sendto() by path would reach the host's sockets
        (1, 2 | 0o4000, False),
        (2, 1, False),  # not unix at all
    ],
)
@pytest.mark.parametrize("machine", MACHINES)
def test_socketpair_kinds(machine: str, domain: int, kind: int, allowed: bool) -> None:
    arch = seccomp.ARCHES[machine]
    prog = seccomp.program(seccomp.Filter(sockets=True), machine)
    assert prog is not None
    assert run_bpf(prog, arch.socketpair, arch.audit, domain, kind, 0) == (
        ALLOW if allowed else EACCES
    )


def test_foreign_abis_are_refused() -> None:
    prog = seccomp.program(seccomp.Filter(sockets=True), "x86_64")
    assert prog is not None
    assert run_bpf(prog, 0x40000029, 0xC000003E, 1) == ENOSYS  # x32 socket()
    assert run_bpf(prog, 102, 0x40000003, 1) == ENOSYS  # i386 socketcall
    assert seccomp.program(None, "riscv64") is None


def test_shape_json_round_trip_and_refusals() -> None:
    shape = Shape(write=("/w",), tcp_connect=(1, 2), env={"A": "b"}, cwd="/w",
                  overlays=(("/run/s.json", "/etc/x/s.json"),))
    assert from_json(shape.to_json()) == shape
    with pytest.raises(ValueError, match="unknown shape field"):
        from_json('{"read": [], "evil": 1}')
    with pytest.raises(ValueError):
        from_json("[]")


def test_landlock_ruleset(tmp_path) -> None:
    w = tmp_path / "w"
    w.mkdir()
    (w / "f").write_text("x")
    shape = Shape(read=("/usr", "/nope"), write=(str(w),), tcp_connect=(3128,))
    rs = landlock.ruleset(shape, landlock.kinds(landlock.shape_paths(shape)))
    assert landlock.Rule("/usr", False, True) in rs.rules
    assert landlock.Rule(str(w), True, True) in rs.rules
    assert landlock.Rule("/proc", False, True) in rs.rules
    assert landlock.Rule("/dev/null", True, False) in rs.rules
    assert not any(r.path in ("/nope", "/dev/shm") for r in rs.rules)
    assert rs.tcp_connect == (3128,)
    deny_inside = Shape(write=(str(w),), deny=(str(w / "f"),))
    with pytest.raises(ConfigError, match="cannot deny"):
        landlock.ruleset(deny_inside, landlock.kinds(landlock.shape_paths(deny_inside)))


# --- overlays: a host file mounted read-only at a path inside (bwrap) ----------------

MANAGED = "/etc/claude-code/managed-settings.d/agent-sandbox.json"


def bwrap_works() -> bool:
    import shutil
    import subprocess

    if shutil.which("bwrap") is None:
        return False
    done = subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True,
                          check=False)
    return done.returncode == 0


def _pairs(argv: list[str], option: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == option]


def test_an_overlay_over_an_existing_file_is_one_read_only_bind() -> None:
    shape = Shape(read=("/usr", "/etc"), overlays=(("/run/rt/m.json", MANAGED),))
    host = bwrap.Facts(frozenset({"/usr", "/etc"}), frozenset({MANAGED}), {})
    argv = bwrap.argv(shape, host)
    assert ("/run/rt/m.json", MANAGED) in _pairs(argv, "--ro-bind")
    # After the read-only bind of /etc it lies in, before the masked files.
    assert argv.index("/run/rt/m.json") > argv.index("/etc")
    assert "--tmpfs" not in argv[argv.index("/etc"):argv.index("/run/rt/m.json")]


def test_an_overlay_whose_directory_is_missing_rebuilds_the_deepest_existing_one() -> None:
    shape = Shape(read=("/usr", "/etc"), overlays=(("/run/rt/m.json", MANAGED),))
    host = bwrap.Facts(frozenset({"/usr", "/etc"}), frozenset({"/etc/shadow"}), {},
                       {"/etc": ("hosts", "passwd", "shadow")})
    argv = bwrap.argv(shape, host)
    hidden = bwrap.HIDDEN + "/etc"
    at = argv.index(hidden)
    assert argv[at - 2:at + 1] == ["--ro-bind", "/etc", hidden]
    assert argv[at + 1:at + 3] == ["--tmpfs", "/etc"]
    assert _pairs(argv, "--symlink") == [(f"..{hidden}/{n}", f"/etc/{n}")
                                         for n in ("hosts", "passwd", "shadow")]
    bind = argv.index("/run/rt/m.json")
    assert argv[bind + 1] == MANAGED and argv[bind + 2:bind + 4] == ["--remount-ro", "/etc"]
    # The masked file still lands on the host's entry (through its link): after.
    assert argv.index("/dev/null") > bind
    # Outside any tree bound from the host, bwrap makes the directories itself.
    loose = Shape(read=("/usr",), overlays=(("/run/rt/m.json", "/opt/x/m.json"),))
    argv = bwrap.argv(loose, bwrap.Facts(frozenset({"/usr"}), frozenset(), {}, {"/": ("usr",)}))
    assert ("/run/rt/m.json", "/opt/x/m.json") in _pairs(argv, "--ro-bind")
    assert "--symlink" not in argv


def test_facts_list_an_overlays_deepest_existing_directory(tmp_path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "a").write_text("x")
    (tmp_path / "etc" / "b").mkdir()
    found = bwrap.facts([], [str(tmp_path / "etc" / "c" / "d" / "m.json"),
                             str(tmp_path / "etc" / "a")])
    assert found.listings == {str(tmp_path / "etc"): ("a", "b")}
    assert str(tmp_path / "etc" / "a") in found.files


@pytest.mark.skipif(not bwrap_works(), reason="bwrap cannot start here")
def test_a_real_bwrap_sees_the_overlay_and_the_rest_of_etc(tmp_path) -> None:
    import subprocess

    managed = tmp_path / "m.json"
    managed.write_text('{"session": true}')
    shape = Shape(read=("/usr", "/bin", "/lib", "/lib64", "/etc"),
                  overlays=((str(managed), MANAGED),))
    argv = ["bwrap", *bwrap.argv(shape, bwrap.shape_facts(shape)), "--", "sh", "-c",
            f"cat {MANAGED}; head -c 5 /etc/passwd; echo; cat /etc/shadow | wc -c; "
            f"echo x > /etc/new 2>/dev/null || echo ro; echo y > {MANAGED} 2>/dev/null || echo ro"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ['{"session": true}root:', "0", "ro", "ro", ""], done.stdout
