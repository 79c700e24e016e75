"""The confinement probe: runs *inside* a sandbox and tries to reach the host's canaries.

Standard library only (it runs as ``python3 -I -S probe.py INPUT.json``, copied
into the cell's workdir).  ``INPUT.json`` names every canary (paths, ports,
pids, key name) and the secrets to look for; the secrets travel in that file,
never in this process's argv or environment, so that scanning ``/proc`` cannot
find the probe itself.

Each attempt runs in a forked child, so that a seccomp filter that kills
instead of failing (SIGSYS) shows up as one refusal and not as a lost probe.
Prints exactly one JSON line on stdout: ``{"results": {check: {"reached": bool,
"detail": str}}, "works": {control: {"ok": bool, "detail": str}}}``.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

Outcome = tuple[bool, str]

# keyctl(2) and friends: there is no libc wrapper without libkeyutils.
SYSCALLS = {
    "x86_64": {"add_key": 248, "request_key": 249, "keyctl": 250, "ptrace": 101},
    "aarch64": {"add_key": 217, "request_key": 218, "keyctl": 219, "ptrace": 117},
}
KEYCTL_SEARCH, KEYCTL_READ = 10, 11
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -3, -4, -5
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
WALL = 0x40000000
NETLINK_SOCK_DIAG = 4

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long


def syscall(name: str, *args: Any) -> tuple[int, int]:
    """(result, errno) of a raw system call by name."""
    number = SYSCALLS[platform.machine()][name]
    ctypes.set_errno(0)
    result = LIBC.syscall(ctypes.c_long(number), *args)
    return int(result), ctypes.get_errno()


def err(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno)) + f" ({exc.strerror})"


def isolated(attempt: Callable[[], Outcome], timeout: float = 8.0) -> Outcome:
    """Run ``attempt`` in a forked child; a child killed by a signal is a refusal."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                reached, detail = attempt()
            except OSError as exc:
                reached, detail = False, err(exc)
            except Exception as exc:
                reached, detail = False, f"probe error {exc!r}"
            os.write(w, json.dumps([reached, detail]).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        while chunk := os.read(r, 65536):
            data += chunk
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return False, f"killed by signal {os.WTERMSIG(status)} (refused)"
    if not data:
        return False, "no answer from the attempt"
    reached, detail = json.loads(data)
    return bool(reached), str(detail)


# --- the attempts ------------------------------------------------------------------


def udp(host: str, port: int, payload: bytes) -> Outcome:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.sendto(payload, (host, port))
    # Sending is no proof (a private namespace swallows it too): the host decides.
    return False, "sendto returned (the host side says whether it arrived)"


def tcp(host: str, port: int, payload: bytes) -> Outcome:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect((host, port))
        s.sendall(payload)
    return True, "connected"


def unix(address: str, kind: int, payload: bytes) -> Outcome:
    target = "\0" + address[1:] if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, kind) as s:
        s.settimeout(3)
        if kind == socket.SOCK_DGRAM:
            s.sendto(payload, target)
            return True, "datagram sent"
        s.connect(target)
        s.sendall(payload)
        return True, "connected"


def open_terminal(path: str) -> Outcome:
    """Another terminal of the user's, opened for reading: its keystrokes."""
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    os.close(fd)
    return True, f"opened {path}"


def unix_pair(address: str, payload: bytes) -> Outcome:
    """socket() may be refused; a datagram socketpair's sendto() names any path."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        a.sendto(payload, address)
        return True, "datagram sent from a socketpair"


def create_socket(family: int, kind: int, proto: int) -> Outcome:
    with socket.socket(family, kind, proto):
        return True, "created"


def sock_diag(port: int) -> Outcome:
    """Create a NETLINK_SOCK_DIAG socket and dump TCP sockets: reached when the
    host's canary listener is listed (creation alone, in a private network
    namespace, lists only that namespace's sockets)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as s:
        s.settimeout(3)
        req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
        req += bytes(48)  # inet_diag_sockid: any
        s.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req)
        ports: set[int] = set()
        try:
            while True:
                data = s.recv(1 << 16)
                while len(data) >= 16:
                    length, kind = struct.unpack_from("=IH", data)
                    if kind in (2, 3):  # NLMSG_ERROR, NLMSG_DONE
                        raise StopIteration
                    ports.add(struct.unpack_from(">H", data, 20)[0])
                    data = data[(length + 3) & ~3 :]
        except StopIteration:
            pass
        except OSError as exc:
            return True, f"created; dump failed ({err(exc)}): counted as reached"
    listed = port in ports
    return listed, f"created; {len(ports)} TCP sockets listed" + (
        ", the host's canary among them" if listed else ", not the host's canary"
    )


def capabilities(names: tuple[str, ...]) -> Outcome:
    with open("/proc/self/status") as fh:
        found = {k: v.strip() for k, v in (line.split(":", 1) for line in fh) if k in names}
    held = {k: v for k, v in found.items() if int(v, 16)}
    return bool(held), json.dumps(found)


def keyring_read(name: str, secret: str) -> Outcome:
    notes = []
    desc, ktype = name.encode(), b"user"
    for label, ring in (
        ("@u", KEY_SPEC_USER_KEYRING),
        ("@us", KEY_SPEC_USER_SESSION_KEYRING),
        ("@s", KEY_SPEC_SESSION_KEYRING),
    ):
        key, e = syscall("keyctl", KEYCTL_SEARCH, ring, ktype, desc, 0)
        notes.append(f"search {label}: " + (f"key {key}" if key >= 0 else errno.errorcode[e]))
        if key >= 0:
            buf = ctypes.create_string_buffer(4096)
            n, e = syscall("keyctl", KEYCTL_READ, key, buf, len(buf))
            if n >= 0 and secret.encode() in buf.raw[:n]:
                return True, "; ".join([*notes, f"read the secret through {label}"])
            notes.append(f"read: {errno.errorcode.get(e, e)}")
    key, e = syscall("request_key", ktype, desc, None, 0)
    notes.append("request_key: " + (f"key {key}" if key >= 0 else errno.errorcode[e]))
    if key >= 0:
        buf = ctypes.create_string_buffer(4096)
        n, _ = syscall("keyctl", KEYCTL_READ, key, buf, len(buf))
        if n >= 0 and secret.encode() in buf.raw[:n]:
            return True, "; ".join([*notes, "read the secret through request_key"])
    return False, "; ".join(notes)


def keyring_write(name: str) -> Outcome:
    data = b"planted"
    key, e = syscall("add_key", b"user", name.encode(), data, len(data), KEY_SPEC_USER_KEYRING)
    # A key added to a private namespace's keyring is harmless: the host decides.
    return False, f"add_key: key {key}" if key >= 0 else f"add_key: {errno.errorcode[e]}"


def read_secret(path: str, secret: str) -> Outcome:
    with open(path, "rb") as fh:
        found = secret.encode() in fh.read()
    return found, "read the secret" if found else "read, but not the secret"


def write_file(path: str) -> Outcome:
    with open(path, "w") as fh:
        fh.write("planted by the probe\n")
    return False, "written (the host side says whether it landed on the host)"


def scan_proc(entry: str, secrets: list[str]) -> Outcome:
    me = str(os.getpid())
    hits, readable, denied = [], 0, 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            with open(f"/proc/{pid}/{entry}", "rb") as fh:
                data = fh.read()
        except OSError:
            denied += 1
            continue
        readable += 1
        for secret in secrets:
            if secret.encode() in data:
                hits.append(f"pid {pid} ({_comm(pid)}) holds secret #{secrets.index(secret)}")
    detail = f"{readable} readable, {denied} refused; secret in: {hits or 'none'}"
    return bool(hits), detail


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def signal_host(pid: int) -> Outcome:
    os.kill(pid, 0)
    os.kill(pid, signal.SIGTERM)
    return True, "kill(pid, 0) and SIGTERM succeeded"


def ptrace_host(pid: int) -> Outcome:
    result, e = syscall("ptrace", PTRACE_ATTACH, pid, None, None)
    if result != 0:
        return False, f"PTRACE_ATTACH: {errno.errorcode.get(e, e)}"
    os.waitpid(pid, WALL)  # a tracee reports its attach stop to its tracer
    syscall("ptrace", PTRACE_DETACH, pid, None, None)
    os.kill(pid, signal.SIGCONT)
    return True, "PTRACE_ATTACH succeeded"


def environment(secrets: list[str]) -> Outcome:
    hits = sorted(k for k, v in os.environ.items() if any(s in v for s in secrets))
    return bool(hits), f"variables holding a secret: {hits or 'none'}"


# --- what must keep working -----------------------------------------------------------


def socketpair() -> Outcome:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"ok")
        return b.recv(2) == b"ok", "socketpair"


def own_unix_socket(directory: str) -> Outcome:
    path = os.path.join(directory, f"own-{os.getpid()}.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        try:
            server.listen()
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(path)
                peer, _ = server.accept()
                with peer:
                    client.sendall(b"ok")
                    return peer.recv(2) == b"ok", f"bound and connected in {directory}"
        finally:
            os.unlink(path)


def broker_client() -> Outcome:
    # Python's default close_fds=True: the way to the broker must not be an
    # inherited descriptor (agents' tool runners close them).
    done = subprocess.run(
        ["broker-client", "--", "true"], capture_output=True, text=True, timeout=30,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return done.returncode == 0, f"exit {done.returncode} {done.stderr.strip()[:200]}"


def workdir_write(path: str) -> Outcome:
    with open(path, "w") as fh:
        fh.write("inside\n")
    return True, "written"


def main() -> None:
    with open(sys.argv[1]) as fh:
        cfg = json.load(fh)
    s = cfg["secrets"]
    mark = s["payload"].encode()
    checks: dict[str, Callable[[], Outcome]] = {
        # /proc first: nothing of ours runs yet but this process.
        "proc_argv": lambda: scan_proc("cmdline", [s["argv"]]),
        "proc_environ": lambda: scan_proc("environ", [s["proc_env"], *s["env"]]),
    }
    for family, host in (("v4", "127.0.0.1"), ("v6", "::1")):
        if f"udp_{family}" in cfg["ports"]:
            port_u, port_t = cfg["ports"][f"udp_{family}"], cfg["ports"][f"tcp_{family}"]
            checks[f"udp_{family}"] = functools.partial(udp, host, port_u, mark)
            checks[f"tcp_{family}"] = functools.partial(tcp, host, port_t, mark)
    for name, (address, kind) in cfg["unix"].items():
        if kind == "pair":
            checks[name] = functools.partial(unix_pair, address, mark)
            continue
        sock_kind = socket.SOCK_DGRAM if kind == "dgram" else socket.SOCK_STREAM
        checks[name] = functools.partial(unix, address, sock_kind, mark)
    checks |= {
        "netlink_sock_diag": lambda: sock_diag(cfg["ports"]["tcp_v4"]),
        "raw_icmp": lambda: create_socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "capabilities": lambda: capabilities(("CapInh", "CapPrm", "CapEff", "CapAmb")),
        "cap_bounding": lambda: capabilities(("CapBnd",)),
        "keyring_read": lambda: keyring_read(cfg["key_name"], s["key"]),
        "keyring_write": lambda: keyring_write(cfg["planted_key_name"]),
        "shm_read": lambda: read_secret(cfg["shm_file"], s["shm"]),
        "pty_other": lambda: open_terminal(cfg["pty"]),
        "shm_write": lambda: write_file(cfg["shm_plant"]),
        "home_file": lambda: read_secret(cfg["home_file"], s["home"]),
        "write_outside": lambda: _write_all(cfg["outside"]),
        "environment": lambda: environment([*s["env"], s["proc_env"], s["argv"]]),
        # ptrace before signal: the signal attempt ends the canary when it works.
        "ptrace": lambda: ptrace_host(cfg["canary_pid"]),
        "signal": lambda: signal_host(cfg["canary_pid"]),
    }
    results = {}
    for name, attempt in checks.items():
        reached, detail = isolated(attempt)
        results[name] = {"reached": reached, "detail": detail}
    controls: dict[str, Callable[[], Outcome]] = {
        "workdir_write": lambda: workdir_write(cfg["inside"]),
        "socketpair": socketpair,
        "netlink_route": lambda: create_socket(socket.AF_NETLINK, socket.SOCK_RAW, 0),
        "own_unix_socket": lambda: own_unix_socket(os.environ.get("TMPDIR") or "/tmp"),
    }
    if cfg["session"]:
        controls["broker_client"] = broker_client
    works = {}
    for name, attempt in controls.items():
        ok, detail = isolated(attempt, timeout=40)
        works[name] = {"ok": ok, "detail": detail}
    print(json.dumps({"results": results, "works": works}), flush=True)


def _write_all(paths: list[str]) -> Outcome:
    notes = []
    for path in paths:
        try:
            write_file(path)
            notes.append(f"{path}: written")
        except OSError as exc:
            notes.append(f"{path}: {err(exc)}")
    # bwrap's private /tmp and home take writes that never reach the host.
    return False, "; ".join(notes)


if __name__ == "__main__":
    main()
