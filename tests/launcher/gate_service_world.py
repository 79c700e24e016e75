"""A real ``agent-sandbox gate-service`` (root) for the tests, and a raw client of it.

The service runs as the test's root with its socket in a fresh 0755 directory
under /tmp (an ordinary user must reach it) and a short patience, with only the
capabilities its unit keeps (``CapabilityBoundingSet`` of
contrib/systemd/agent-sandbox-gate.service, through ``setpriv``): what passes
here passes as installed; its log (stderr) is kept.  :func:`ask` talks to it
as an ordinary user from a forked child (:meth:`as_user.OrdinaryUser.call`:
the same mount namespace as the service, no interpreter to start) and brings
back the service's reply.
"""

from __future__ import annotations

import contextlib
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))

from as_user import OrdinaryUser

PATIENCE = 2  # seconds: the service's --patience in these tests
UNIT = Path(__file__).resolve().parents[2] / "contrib/systemd/agent-sandbox-gate.service"


def unit_caps() -> list[str]:
    """The capabilities the service's unit keeps, as setpriv names them."""
    for line in UNIT.read_text().splitlines():
        if line.startswith("CapabilityBoundingSet="):
            return [c.lower().removeprefix("cap_") for c in line.split("=", 1)[1].split()]
    raise AssertionError(f"no CapabilityBoundingSet in {UNIT}")


@dataclass
class Service:
    base: Path  # 0755, root's: the socket, the records
    proc: subprocess.Popen[bytes]
    log_path: Path
    said: list[str] = field(default_factory=list)

    @property
    def socket(self) -> str:
        return str(self.base / "gate.sock")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.log() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert text in self.log(), self.log()
        return self.log()


def start(base: Path) -> Service:
    log = base.parent / f"{base.name}.log"
    out = open(log, "ab")  # noqa: SIM115 (the child's stderr)
    caps = ",".join(["-all", *(f"+{c}" for c in unit_caps())])
    proc = subprocess.Popen(["setpriv", f"--bounding-set={caps}", "--inh-caps=-all",
                             "--no-new-privs", "--", "agent-sandbox", "gate-service",
                             f"--socket={base}/gate.sock", f"--patience={PATIENCE}"],
                            stdin=subprocess.DEVNULL,
                            stdout=out, stderr=out)
    out.close()
    found = Service(base, proc, log)
    found.wait_log("listening on")
    return found


@contextlib.contextmanager
def running() -> Iterator[Service]:
    top = Path(tempfile.mkdtemp(prefix="gate-service-", dir="/tmp"))
    top.chmod(0o755)
    base = top / "run"
    service = start(base)
    try:
        yield service
    finally:
        if service.proc.poll() is None:
            service.proc.send_signal(signal.SIGTERM)
            service.proc.wait(timeout=30)
        shutil.rmtree(top, ignore_errors=True)


def frame(obj: bytes) -> bytes:
    return len(obj).to_bytes(4, "big") + obj


def ask(user: OrdinaryUser, path: str, data: bytes, open_fds: Callable[[], list[int]],
        meanwhile: Callable[[], None] | None = None, *, shut: bool = False) -> bytes:
    """As ``user`` (a forked child): connect, send ``data`` with the fds ``open_fds()``
    opens, read the service's first reply (b"" on end of file); ``meanwhile()`` runs here
    while the child still holds the connection, which it closes after."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.close(go_w)
            os.setgroups([])
            os.setresgid(user.gid, user.gid, user.gid)
            os.setresuid(user.uid, user.uid, user.uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(15)
            sock.connect(path)
            fds = open_fds()
            rest = data
            with contextlib.suppress(OSError):
                if fds:
                    socket.send_fds(sock, [data[:1]], fds)
                    rest = data[1:]
                sock.sendall(rest)
                if shut:  # end of file after the request: a frame cut short
                    sock.shutdown(socket.SHUT_WR)
            os.write(w, _reply_of(sock))
            os.close(w)
            os.read(go_r, 1)  # the parent's meanwhile
            sock.close()
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.close(go_r)
    with os.fdopen(r, "rb") as fh:
        out = fh.read()
    try:
        if meanwhile is not None:
            meanwhile()
    finally:
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def _reply_of(sock: socket.socket) -> bytes:
    reply = b""
    with contextlib.suppress(OSError):
        head = sock.recv(4)
        if len(head) == 4:
            n = int.from_bytes(head, "big")
            while len(reply) < n:
                chunk = sock.recv(n - len(reply))
                if not chunk:
                    break
                reply += chunk
    return reply


def mounts(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [line for line in fh if str(path) in line.split()[4]]


def user_sh(user: OrdinaryUser, script: str, cwd: Path, env: dict[str, str], *,
            capture: bool = False) -> subprocess.Popen[str]:
    """``sh -c script`` as ``user`` in *this* mount namespace (no interpreter needed: a
    person's terminal beside the session)."""
    argv = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
            "--inh-caps=-all", "--", "sh", "-c", script]
    out = subprocess.PIPE if capture else None
    return subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=out, stderr=out,
                            stdin=subprocess.DEVNULL)
