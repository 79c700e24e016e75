"""The host side of the confinement battery: canaries, cells, verdicts.

A *cell* is one way of running untrusted code: a brokered command
(``broker-server`` + ``broker-client``) or the agent's session
(``agent-sandbox run``), on bwrap or nono (Landlock), as root or as an
ordinary user (:mod:`as_user`).  :func:`run_cell` plants fresh canaries on the
host, each with its own secret, runs ``probe.py`` once inside the cell, then
looks on the host side for what arrived, and returns one verdict per check.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import platform
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from as_user import OrdinaryUser, ordinary_user

PROBE = Path(__file__).with_name("probe.py")
BIN = os.path.dirname(sys.executable)
PYTHON = os.path.realpath(sys.executable)

CHECKS = (
    "udp_v4", "udp_v6", "tcp_v4", "tcp_v6",
    "unix_stream_home", "unix_dgram_home", "unix_stream_tmp", "unix_dgram_tmp",
    "unix_dgram_pair", "unix_abstract",
    "netlink_sock_diag", "raw_icmp", "capabilities", "cap_bounding",
    "keyring_read", "keyring_write", "shm_read", "shm_write",
    "proc_argv", "proc_environ", "signal", "ptrace", "pty_other",
    "home_file", "write_outside", "environment",
)  # fmt: skip
"""Every refusal the battery asks of every cell."""

CONTROLS = ("workdir_write", "socketpair", "netlink_route", "broker_client")
"""What must keep working in a cell (broker_client: sessions only)."""


@dataclass(frozen=True)
class Cell:
    who: str  # "root" | "user"
    path: str  # "session" | "broker" | "host" (no sandbox: calibration)
    backend: str  # "bwrap" | "nono" | "none"

    def __str__(self) -> str:
        return f"{self.who}-{self.path}-{self.backend}"


@dataclass
class Verdict:
    reached: bool
    detail: str


@dataclass
class CellResult:
    cell: Cell
    verdicts: dict[str, Verdict]
    works: dict[str, Verdict]
    seconds: float
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why not run here


# --- keyring (ctypes: no keyutils needed) ---------------------------------------------

_KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}  # add_key, keyctl
KEY_SPEC_USER_KEYRING, KEYCTL_SEARCH, KEYCTL_INVALIDATE = -4, 10, 21


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def add_user_key(name: str, secret: str) -> int:
    """``keyctl add user NAME SECRET @u``; 0 on success (a fork's exit status)."""
    add_key, _ = _KEYCTL[platform.machine()]
    data = secret.encode()
    key = _libc().syscall(add_key, b"user", name.encode(), data, len(data), KEY_SPEC_USER_KEYRING)
    return 0 if key > 0 else 1


def find_user_key(name: str) -> int:
    """0 if ``@u`` holds a user key ``name`` (``keyctl search @u user NAME``), else 1."""
    _, keyctl = _KEYCTL[platform.machine()]
    key = _libc().syscall(keyctl, KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user", name.encode(), 0)
    return 0 if key > 0 else 1


def drop_user_key(name: str) -> int:
    _, keyctl = _KEYCTL[platform.machine()]
    libc = _libc()
    key = libc.syscall(keyctl, KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user", name.encode(), 0)
    if key > 0:
        libc.syscall(keyctl, KEYCTL_INVALIDATE, key)
    return 0


# --- listeners ---------------------------------------------------------------------


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _arrived(sock: socket.socket) -> str:
    """What reached a listener, without waiting: '' when nothing did (host_side gave
    every listener its grace at once before)."""
    ready, _, _ = select.select([sock], [], [], 0)
    if not ready:
        return ""
    if sock.type == socket.SOCK_DGRAM:
        data = sock.recv(4096)
        return f"datagram {data[:40]!r}"
    conn, _ = sock.accept()
    with conn:
        conn.settimeout(0.5)
        with contextlib.suppress(OSError):
            return f"connection, sent {conn.recv(4096)[:40]!r}"
    return "connection"


@dataclass
class Canaries:
    """Everything planted on the host for one cell, and how to read it back."""

    base: Path
    home: Path
    workdir: Path
    runtime: Path
    user: OrdinaryUser | None  # None: root's own canaries
    secrets: dict[str, str]
    listeners: dict[str, socket.socket] = field(default_factory=dict)
    unix: dict[str, tuple[str, str]] = field(default_factory=dict)  # check -> (address, kind)
    files: list[Path] = field(default_factory=list)  # removed at the end
    key_name: str = ""
    planted_key_name: str = ""
    canary: subprocess.Popen[bytes] | None = None
    outside: list[str] = field(default_factory=list)
    shm_file: str = ""
    shm_plant: str = ""
    pty: str = ""  # another terminal of the user's: its slave's path
    skipped: dict[str, str] = field(default_factory=dict)

    def as_owner(self, fn: Callable[[], int]) -> int:
        """``fn()`` with the canaries' owner's credentials (the user's keyring)."""
        return self.user.call(fn) if self.user else fn()

    def probe_input(self, session: bool) -> dict[str, object]:
        ports = {
            k: s.getsockname()[1]
            for k, s in self.listeners.items()
            if k.startswith(("udp_", "tcp_"))
        }
        return {
            "secrets": self.secrets | {"env": [self.secrets["env"], self.secrets["token"]]},
            "ports": ports,
            "unix": self.unix,
            "key_name": self.key_name,
            "planted_key_name": self.planted_key_name,
            "shm_file": self.shm_file,
            "shm_plant": self.shm_plant,
            "pty": self.pty,
            "home_file": str(self.home / ".ssh" / "id_rsa"),
            "outside": self.outside,
            "canary_pid": self.canary.pid if self.canary else 0,
            "inside": str(self.workdir / "inside.txt"),
            "session": session,
        }

    def host_side(self) -> dict[str, str]:
        """What the host saw, per check: '' where nothing arrived."""
        # The probe has ended: what it sent over loopback or a unix socket is queued
        # by now.  One grace for every listener at once (0.2 s each, one after the
        # other, was 2 s of every cell, spent where nothing arrives).
        time.sleep(0.2)
        seen = {name: _arrived(sock) for name, sock in self.listeners.items()}
        seen["keyring_write"] = (
            "the planted key is in the host's @u"
            if self.as_owner(lambda: find_user_key(self.planted_key_name)) == 0
            else ""
        )
        seen["shm_write"] = f"{self.shm_plant} exists" if os.path.exists(self.shm_plant) else ""
        landed = [p for p in self.outside if os.path.exists(p)]
        seen["write_outside"] = f"landed: {landed}" if landed else ""
        if self.canary is not None and self.canary.poll() is not None:
            seen["signal"] = f"the canary process died (status {self.canary.returncode})"
        return seen


def _unix_listener(address: str, kind: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, kind)
    sock.bind("\0" + address[1:] if address.startswith("@") else address)
    if kind == socket.SOCK_STREAM:
        sock.listen(8)
    return sock


@contextlib.contextmanager
def canaries(user: OrdinaryUser | None) -> Iterator[Canaries]:
    """Fresh canaries for one cell, owned by ``user`` (None: by root, the caller)."""
    tag = secrets.token_hex(6)
    sec = {
        k: f"as-canary-{k}-{secrets.token_hex(8)}"
        for k in ("payload", "argv", "proc_env", "env", "token", "key", "shm", "home")
    }
    base = Path(tempfile.mkdtemp(prefix="as-bat-", dir="/tmp"))  # short: sun_path
    c = Canaries(base, base / "home", base / "work", base / "rt", user, sec)
    ptys: list[int] = []
    try:
        (c.home / ".ssh").mkdir(parents=True)
        (c.home / ".ssh" / "id_rsa").write_text(
            f"-----BEGIN OPENSSH PRIVATE KEY----- {sec['home']}\n"
        )
        (c.home / ".config").mkdir()
        (c.home / ".config" / "token").write_text(sec["token"] + "\n")
        c.workdir.mkdir()
        c.runtime.mkdir(mode=0o700)
        shutil.copy(PROBE, c.workdir / "probe.py")
        families = [("v4", socket.AF_INET, "127.0.0.1")]
        if has_ipv6_loopback():
            families.append(("v6", socket.AF_INET6, "::1"))
        else:
            for check in ("udp_v6", "tcp_v6"):
                c.skipped[check] = "no IPv6 loopback (::1) on this host"
        for fam, af, host in families:
            udp = socket.socket(af, socket.SOCK_DGRAM)
            udp.bind((host, 0))
            tcp = socket.socket(af, socket.SOCK_STREAM)
            tcp.bind((host, 0))
            tcp.listen(8)
            c.listeners[f"udp_{fam}"], c.listeners[f"tcp_{fam}"] = udp, tcp
        for where, directory in (("home", c.home), ("tmp", Path("/tmp"))):
            for kind_name, kind in (("stream", socket.SOCK_STREAM), ("dgram", socket.SOCK_DGRAM)):
                path = str(directory / f".as-{tag}-{kind_name}.sock")
                c.listeners[f"unix_{kind_name}_{where}"] = _unix_listener(path, kind)
                c.unix[f"unix_{kind_name}_{where}"] = (path, kind_name)
                c.files.append(Path(path))
        # a datagram pair's sendto() by path, past a refused socket() (found in review)
        pair = str(c.home / f".as-{tag}-pair.sock")
        c.listeners["unix_dgram_pair"] = _unix_listener(pair, socket.SOCK_DGRAM)
        c.unix["unix_dgram_pair"] = (pair, "pair")
        c.files.append(Path(pair))
        abstract = f"@as-canary-{tag}"
        c.listeners["unix_abstract"] = _unix_listener(abstract, socket.SOCK_STREAM)
        c.unix["unix_abstract"] = (abstract, "stream")
        # /dev/shm: a secret to read, and a name the probe tries to create.
        c.shm_file = f"/dev/shm/as-canary-{tag}"
        Path(c.shm_file).write_text(sec["shm"] + "\n")
        os.chmod(c.shm_file, 0o600)
        c.shm_plant = f"/dev/shm/as-planted-{tag}"
        c.files += [Path(c.shm_file), Path(c.shm_plant)]
        c.outside = [
            str(c.home / f"planted-{tag}"), f"/tmp/as-planted-{tag}",
            str(c.base / f"outside-{tag}"), f"/var/tmp/as-planted-{tag}",
        ]  # fmt: skip
        c.files += [Path(p) for p in c.outside]
        # Another terminal of the user's (a shell where a password is typed).
        master, slave = os.openpty()
        c.pty = os.ttyname(slave)
        os.close(slave)
        ptys.append(master)
        if user is not None:
            user.own(c.base, c.shm_file, *(p for p, _ in c.unix.values() if p[0] == "/"))
            os.chown(c.pty, user.uid, user.gid)
        # The user's keyring and another process of the same user.
        c.key_name, c.planted_key_name = f"as-canary-{tag}", f"as-planted-{tag}"
        if c.as_owner(lambda: add_user_key(c.key_name, sec["key"])) != 0:
            c.skipped["keyring_read"] = "add_key failed on the host (keyrings unavailable?)"
        script = f"sleep 300; : {sec['argv']}"  # sh stays, its argv holds the secret
        argv = ["sh", "-c", script]
        if user is not None and os.geteuid() == 0:
            argv = [
                "setpriv",
                f"--reuid={user.uid}",
                f"--regid={user.gid}",
                "--clear-groups",
                *argv,
            ]
        env = {"PATH": "/usr/bin:/bin", "AS_CANARY_SECRET": sec["proc_env"]}
        c.canary = subprocess.Popen(argv, env=env, start_new_session=True)
        _wait_exec(c.canary.pid, sec["argv"])
        yield c
    finally:
        for fd in ptys:
            os.close(fd)
        if c.canary is not None:
            with contextlib.suppress(OSError):
                os.killpg(c.canary.pid, signal.SIGKILL)
            c.canary.wait()
        for name in (c.key_name, c.planted_key_name):
            if name:
                c.as_owner(functools.partial(drop_user_key, name))
        for sock in c.listeners.values():
            sock.close()
        for planted in c.files:
            with contextlib.suppress(OSError):
                planted.unlink()
        shutil.rmtree(base, ignore_errors=True)


def _wait_exec(pid: int, text: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        time.sleep(0.01)
    raise AssertionError("the canary process did not start")


# --- running a cell ------------------------------------------------------------------


def _env(c: Canaries, user: OrdinaryUser | None) -> dict[str, str]:
    """The launcher's or server's environment: secrets it must not pass on."""
    keep = ("PATH", "LANG", "TERM", "TZ")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = BIN + ":" + env.get("PATH", "/usr/bin:/bin")
    if user is not None:
        env = user.env(c.home) | {"PATH": env["PATH"]}
    env |= {"HOME": str(c.home), "XDG_RUNTIME_DIR": str(c.runtime)}
    env |= {"SECRET_CANARY": c.secrets["env"], "GITHUB_TOKEN": c.secrets["token"]}
    return env


def _wrap(user: OrdinaryUser | None, argv: list[str]) -> list[str]:
    return user.argv(argv) if user is not None else argv


def _parse(out: str, err: str, status: int) -> dict[str, dict[str, dict[str, object]]]:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            parsed: dict[str, dict[str, dict[str, object]]] = json.loads(line)
            return parsed
    raise AssertionError(f"the probe printed no result (exit {status}):\n{out}\n{err}")


def _session(c: Canaries, backend: str, user: OrdinaryUser | None) -> tuple[str, str, int]:
    config = c.base / "config.toml"
    config.write_text(
        f'workdir = "{c.workdir}"\ntoken_command = "cat {c.home}/.config/token"\n'
        "start_timeout = 60\n"
    )
    if user is not None:
        user.own(config)
    argv = ["agent-sandbox", "run", f"--sandbox={backend}", f"--config={config}", "--"]
    argv += [PYTHON, "-I", "-S", str(c.workdir / "probe.py"), str(c.workdir / "input.json")]
    done = subprocess.run(
        _wrap(user, argv), env=_env(c, user), cwd=c.workdir, capture_output=True, text=True,
        timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return done.stdout, done.stderr, done.returncode


def _brokered(c: Canaries, backend: str, user: OrdinaryUser | None) -> tuple[str, str, int]:
    sock = c.runtime / "broker.sock"
    server_argv = ["broker-server", f"--socket={sock}", f"--workdir={c.workdir}"]
    server = subprocess.Popen(
        _wrap(user, [*server_argv, f"--sandbox={backend}"]), env=_env(c, user),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.base,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("listening unix:"):
            server.kill()
            _, err = server.communicate()
            raise AssertionError(f"broker-server did not start: {line!r} {err}")
        client_env = _env(c, user) | {"AGENT_SANDBOX_BROKER_SOCKET": str(sock)}
        for name in ("SECRET_CANARY", "GITHUB_TOKEN"):
            del client_env[name]  # the server's environment is what is tested
        argv = ["broker-client", "--", PYTHON, "-I", "-S", "probe.py", "input.json"]
        done = subprocess.run(
            _wrap(user, argv), env=client_env, cwd=c.workdir, capture_output=True, text=True,
            timeout=90, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        return done.stdout, done.stderr, done.returncode
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _unsandboxed(c: Canaries, backend: str, user: OrdinaryUser | None) -> tuple[str, str, int]:
    """The probe with no sandbox at all: the battery's own calibration."""
    argv = [PYTHON, "-I", "-S", "probe.py", "input.json"]
    done = subprocess.run(
        _wrap(user, argv), env=_env(c, user), cwd=c.workdir, capture_output=True, text=True,
        timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return done.stdout, done.stderr, done.returncode


def run_cell(cell: Cell, user: OrdinaryUser | None) -> CellResult:
    """Plant canaries, run the probe once in ``cell``, and judge every check."""
    started = time.monotonic()
    with canaries(user) as c:
        session = cell.path == "session"
        (c.workdir / "input.json").write_text(json.dumps(c.probe_input(session)))
        if user is not None:
            user.own(c.workdir)
        run = {"session": _session, "broker": _brokered, "host": _unsandboxed}[cell.path]
        out, err, status = run(c, cell.backend, user)
        probe = _parse(out, err, status)
        seen = c.host_side()
        verdicts = {}
        for check in CHECKS:
            inside = probe["results"].get(check, {"reached": False, "detail": "not tried"})
            host = seen.get(check, "")
            reached = bool(inside["reached"]) or bool(host)
            detail = f"probe: {inside['detail']}" + (f"; host saw: {host}" if host else "")
            verdicts[check] = Verdict(reached, detail)
        works = {
            name: Verdict(bool(v["ok"]), str(v["detail"])) for name, v in probe["works"].items()
        }
        inside_file = c.workdir / "inside.txt"
        if "workdir_write" in works and not inside_file.exists():
            works["workdir_write"] = Verdict(False, "the probe's write never reached the workdir")
        return CellResult(cell, verdicts, works, time.monotonic() - started, dict(c.skipped))


# --- what this machine allows -----------------------------------------------------


@functools.cache
def the_user() -> OrdinaryUser:
    return ordinary_user()


def landlock_missing() -> str:
    try:
        lsms = Path("/sys/kernel/security/lsm").read_text()
    except OSError:
        return ""  # securityfs not mounted: let the sandbox itself say
    return "" if "landlock" in lsms else "Landlock is not an enabled LSM on this kernel"


@functools.cache
def cannot_run(cell: Cell) -> str:
    """Why ``cell`` cannot run on this machine ('' when it can)."""
    if cell.who == "root" and os.geteuid() != 0:
        return "the root cells need a root test run (CI's)"
    if cell.who == "user" and the_user().unavailable:
        return f"cannot run as an ordinary user here: {the_user().unavailable}"
    if cell.backend == "bwrap":
        if shutil.which("bwrap") is None:
            return "bwrap (bubblewrap) is not installed"
        if cell.who == "user" and not the_user().works(
            ["bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"]
        ):
            return "bwrap cannot create a user namespace as an ordinary user here"
    if cell.backend == "nono" and (why := landlock_missing()):
        return why
    return ""


@functools.cache
def pid_namespace_possible(who: str) -> bool:
    """Can a process of this kind get a PID namespace (root: always; a user: only
    through an unprivileged user namespace)?"""
    if who == "root":
        return os.geteuid() == 0
    argv = ["unshare", "--user", "--pid", "--fork", "true"]
    return shutil.which("unshare") is not None and the_user().works(argv)
