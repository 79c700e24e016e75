"""Shared pieces of the stress suite: run settings, report tables, process probes.

Everything here is small and synchronous: starting the real console scripts
(broker-server, egress-proxy) as subprocesses and reading their `listening`
lines, and looking at a running process from /proc (RSS, peak RSS, open fds,
descendants) to tell a leak or a lingering child from a clean run.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from libbroker.sandbox import reaper

BIN = os.path.dirname(sys.executable)
ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent


def script(name: str) -> str:
    """The console script ``name`` next to this interpreter (as the tests use it)."""
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else name


@dataclass(frozen=True)
class Mode:
    """How hard and how long each part runs."""

    quick: bool
    broker_clients: int
    broker_seconds: float
    tunnels: int
    inject_clients: int
    proxy_seconds: float
    hypothesis_examples: int
    atheris_seconds: float
    cli_inputs: int
    kill_rounds: int
    reset_rounds: int
    sigterm_conns: int

    @staticmethod
    def make(quick: bool) -> Mode:
        if quick:
            return Mode(True, 20, 4.0, 100, 4, 4.0, 300, 3.0, 20, 3, 5, 20)
        return Mode(False, 200, 60.0, 1000, 16, 60.0, 1500, 20.0, 120, 21, 42, 100)


@dataclass
class Table:
    """One area's markdown table, plus the findings it turned up."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        head = f"### {self.title}\n\n| " + " | ".join(self.columns) + " |\n"
        head += "|" + "|".join("---" for _ in self.columns) + "|\n"
        body = "".join(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |\n"
            for row in self.rows
        )
        notes = "".join(f"\n{n}\n" for n in self.notes)
        return head + body + notes


@dataclass
class Finding:
    """A real problem found: what was run, with what, what came out, what should have."""

    area: str
    title: str
    command: str
    observed: str
    expected: str
    key: str = ""
    seen_also: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        also = "".join(f"\n  also seen: {a}" for a in self.seen_also)
        return (f"- **{self.area}: {self.title}**  \n  run: `{self.command}`  \n"
                f"  observed: {self.observed}  \n  expected: {self.expected}{also}")


FINDINGS: list[Finding] = []

# One root cause met by several parts is one finding: recognised by what it says.
KNOWN = (
    ("RecursionError", "broker-json-depth",
     "broker-server: a deeply nested JSON request raises RecursionError out of parse_request"),
    ("nested 100,000 deep", "broker-json-depth",
     "broker-server: a deeply nested JSON request raises RecursionError out of parse_request"),
    ("signal 11", "kubeconfig-segv",
     "kubeconfig-proxify: deeply nested YAML crashes the process (SIGSEGV in libyaml)"),
    ("exit -11", "kubeconfig-segv",
     "kubeconfig-proxify: deeply nested YAML crashes the process (SIGSEGV in libyaml)"),
    ("groupdict", "kubeconfig-timestamp",
     "kubeconfig-proxify: a bad !!timestamp escapes as AttributeError (exit 70)"),
    ("keeps its stdout open", "token-child",
     "egress-proxy: a token command whose child keeps its stdout open wedges the token read "
     "(start-up never completes, renewal stops), the child outlives the proxy"),
    ("then the proxy gets SIGTERM", "token-child",
     "egress-proxy: a token command whose child keeps its stdout open wedges the token read "
     "(start-up never completes, renewal stops), the child outlives the proxy"),
    ("Event loop is closed", "token-child",
     "egress-proxy: a token command whose child keeps its stdout open wedges the token read "
     "(start-up never completes, renewal stops), the child outlives the proxy"),
    ("slowloris", "proxy-slowloris",
     "egress-proxy: the head timeout is per read, so a slow sender is never cut off"),
)


def known_key(text: str) -> tuple[str, str] | None:
    for needle, key, title in KNOWN:
        if needle in text:
            return key, title
    return None


def finding(area: str, title: str, command: str, observed: str, expected: str) -> str:
    """Record a finding; returns the marker to put in a table cell.

    A finding whose text names a known root cause joins the first one recorded
    for it (same number), so the list at the end has one entry per bug.
    """
    known = known_key(f"{title} {observed}")
    if known is not None:
        for index, old in enumerate(FINDINGS, 1):
            if old.key == known[0]:
                old.seen_also.append(f"{area}: {title}: {observed[:300]}")
                return f"**FINDING {index}**"
        title = f"{known[1]} (first seen: {title})"
    FINDINGS.append(Finding(area, title, command, observed, expected, known[0] if known else ""))
    return f"**FINDING {len(FINDINGS)}**"


# --- /proc probes --------------------------------------------------------------


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def rss_kib(pid: int) -> int:
    """Resident set size now, KiB."""
    return int(_status(pid).get("VmRSS", "0 kB").split()[0])


def peak_rss_kib(pid: int) -> int:
    """High-water mark of the resident set, KiB."""
    return int(_status(pid).get("VmHWM", "0 kB").split()[0])


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren ...; zombies count as lingering)."""
    return reaper.descendants(pid, reaper.process_parents())


def wait_until(predicate: object, timeout: float, step: float = 0.05) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():  # type: ignore[operator]
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(step)


def processes_with_arg(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (for orphans we started)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def process_age(pid: int) -> float:
    """Seconds since ``pid`` started (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            start = int(fh.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return uptime - start / os.sysconf("SC_CLK_TCK")


def commands_with_arg(marker: str, names: tuple[str, ...]) -> list[int]:
    """Pids of processes named one of ``names`` (argv[0]) whose argv holds ``marker``."""
    found = []
    for pid in processes_with_arg(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.basename(argv0) in names:
            found.append(pid)
    return found


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.1f} ms"


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


# --- child processes -----------------------------------------------------------


@dataclass
class Server:
    """A console script we started, with the lines it announced."""

    proc: subprocess.Popen[bytes]
    lines: list[str]
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait, SIGKILL if it will not go; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(argv: list[str], want: int, tmp: Path, *, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None, timeout: float = 20.0,
                 user: str | None = None) -> Server:
    """Start ``argv`` and wait for ``want`` lines on its stdout."""
    fd, err_name = tempfile.mkstemp(prefix="stderr-", suffix=".txt", dir=tmp)
    proc = subprocess.Popen([*(prefix or []), *argv], stdout=subprocess.PIPE, stderr=fd,
                            env=env or dict(os.environ))
    os.close(fd)
    assert proc.stdout is not None
    lines: list[str] = []
    buf = b""
    deadline = time.monotonic() + timeout
    while len(lines) < want:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
        if not ready:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{argv[0]} did not announce itself: "
                               f"{Path(err_name).read_text(errors='replace')[-500:]}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            proc.wait()
            raise RuntimeError(f"{argv[0]} exited {proc.returncode}: "
                               f"{Path(err_name).read_text(errors='replace')[-500:]}")
        buf += chunk
        *done, buf = buf.split(b"\n")
        lines += [d.decode() for d in done]
    return Server(proc, lines, Path(err_name))


def start_broker(tmp: Path, *extra: str, sandbox: str = "auto",
                 env: dict[str, str] | None = None) -> tuple[Server, str, str]:
    """A broker-server on a fresh socket and workdir: (server, socket, workdir)."""
    base = Path(tempfile.mkdtemp(prefix="brk-", dir=tmp))
    workdir = base / "work"
    workdir.mkdir()
    sock = str(base / "s")
    server = start_server([script("broker-server"), f"--socket={sock}",
                           f"--workdir={workdir}", f"--sandbox={sandbox}", *extra], 1, tmp,
                          env=env)
    return server, sock, str(workdir)


def start_proxy(tmp: Path, *extra: str, socks: bool = False, prefix: list[str] | None = None,
                env: dict[str, str] | None = None) -> tuple[Server, int, int | None, Path]:
    """An egress-proxy on free ports: (server, http port, socks port, log file)."""
    log = Path(tempfile.mkstemp(prefix="proxy-", suffix=".log", dir=tmp)[1])
    argv = [script("egress-proxy"), "--listen=127.0.0.1:0", f"--log={log}", *extra]
    if socks:
        argv.append("--socks=127.0.0.1:0")
    server = start_server(argv, 2 if socks else 1, tmp, prefix=prefix, env=env)
    http = next(line for line in server.lines if line.startswith("listening http://"))
    sline = next((line for line in server.lines if line.startswith("listening socks5://")), None)
    return (server, int(http.rsplit(":", 1)[1]),
            int(sline.rsplit(":", 1)[1]) if sline else None, log)


def traceback_summary(text: str) -> str:
    """The first traceback in ``text`` in one line: its innermost frames and the exception."""
    at = text.find("Traceback (most recent call last)")
    if at < 0:
        at = text.find("internal error")
        return text[at:text.find("\n", at) if "\n" in text[at:] else None][:300] if at >= 0 \
            else ""
    lines = text[at:].splitlines()[1:]
    frames = [ln.strip() for ln in lines if ln.startswith("  File ")]
    end = next((ln for ln in lines if ln and not ln.startswith(" ")), "?")
    return " → ".join([*(f.replace('"', "") for f in frames[-2:]), end])[:500]


def traceback_in(text: str) -> bool:
    """Whether ``text`` shows an unhandled error reaching a user."""
    return "Traceback (most recent call last)" in text or "internal error" in text
