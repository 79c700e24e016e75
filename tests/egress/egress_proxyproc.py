"""Run egress-proxy as a real subprocess and read its `listening` lines."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ProxyProc:
    proc: subprocess.Popen[bytes]
    http: str  # http://127.0.0.1:PORT
    socks: str | None  # 127.0.0.1:PORT
    log: Path | None
    egress_dir: Path | None = None

    @property
    def port(self) -> int:
        return int(self.http.rsplit(":", 1)[1])

    def log_text(self) -> str:
        return self.log.read_text() if self.log and self.log.exists() else ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_proxy(args: list[str], log: Path | None = None, socks: bool = False,
                prefix: list[str] | None = None, timeout: float = 15.0) -> ProxyProc:
    """Start egress-proxy with ``args`` (plus --listen/--socks/--log)."""
    argv = [*(prefix or []), "egress-proxy", "--listen", "127.0.0.1:0", *args]
    if socks:
        argv += ["--socks", "127.0.0.1:0"]
    if log is not None:
        argv += ["--log", str(log)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ})
    assert proc.stdout is not None
    want = 2 if socks else 1
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    buf = b""
    while len(lines) < want:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
        if not ready:
            proc.kill()
            raise AssertionError("egress-proxy did not print its listening lines")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"egress-proxy exited: {proc.wait()} {err}")
        buf += chunk
        *done, buf = buf.split(b"\n")
        lines += [d.decode() for d in done]
    http = next(line for line in lines if line.startswith("listening http://"))
    sock = next((line for line in lines if line.startswith("listening socks5://")), None)
    return ProxyProc(proc, http.split(" ", 1)[1],
                     sock.split("://", 1)[1] if sock else None, log)
