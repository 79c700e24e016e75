"""Warm runs: ``agent-sandbox run`` forked by the resident service's launcher zygote.

Real processes throughout: the service, its zygotes, the client, the child
that becomes the run, bwrap and Landlock sessions.  Each test shares one
service across several runs (a run costs a fraction of a second; a service
start more).  Whether a run went warm is read from its own
``AGENT_SANDBOX_TRACE`` line, and from the service's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from launcher_world import World
from test_serve import Service, _config, _descendants, _own_leftovers, _wait_for, service

from libbroker.broker import server as broker_server
from libbroker.launcher import warm_request

__all__ = ["service"]  # the fixture, shared with test_serve

WARM = "handed over to the service's launcher zygote"


def _runs(svc: Service) -> list[int]:
    """What the launcher zygote has forked and is still there (runs and their children)."""
    zygote = re.search(r"launcher zygote pid (\d+)", svc.text())
    assert zygote, svc.text()
    return _descendants(int(zygote.group(1)))


def _links(pid: int) -> set[str]:
    """What ``pid``'s descriptors point at (socket:[N], pipe:[N], paths)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def _run(world: World, cfg: Path, backend: str, *cmd: str, cwd: Path | None = None,
         data: bytes = b"", **env: str) -> subprocess.CompletedProcess[bytes]:
    argv = ["agent-sandbox", "run", f"--config={cfg}", f"--sandbox={backend}", "--", *cmd]
    return subprocess.run(argv, input=data, capture_output=True, timeout=120, check=False,
                          cwd=str(cwd or world.workdir),
                          env=world.env(CANARY_TOKEN="tok-w", AGENT_SANDBOX_TRACE="1", **env))


def test_a_warm_run_is_the_run_a_cold_one_would_be(world: World, service: Service) -> None:
    """On each backend, one service for both (a service's start costs more than a run)."""
    for backend in ("bwrap", "nono"):
        _as_cold(world, service, backend)
    assert service.text().count("started warm") == 14
    assert "CANARY" not in service.text()  # no argv or environment in the log
    _wait_for(lambda: _runs(service) == [], "the runs to be reaped", 30)
    assert _own_leftovers(world, service) == []


def _as_cold(world: World, service: Service, backend: str) -> None:
    cfg = _config(world, f"w-{backend}.toml", env=["WARM_CANARY"])  # passed in: the config
    done = _run(world, cfg, backend, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert done.returncode == 3, done.stderr
    assert WARM in done.stderr.decode() and done.stdout == b"out\n"
    assert b"err\n" in done.stderr
    assert _run(world, cfg, backend, "true").returncode == 0
    # A death by a signal: 128+N, as the launcher reports it.
    assert _run(world, cfg, backend, "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    # stdin passed through, of each size (the run's own descriptor, not a copy).
    for size in (0, 1, 3 << 20):
        data = os.urandom(size)
        done = _run(world, cfg, backend, "sha256sum", data=data)
        assert done.returncode == 0, done.stderr
        import hashlib

        assert done.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest(), size
    # The environment (replaced), a working directory below the workdir, the umask.
    sub = world.workdir / f"sub-{backend}"
    sub.mkdir()
    inner = ('echo "canary=$WARM_CANARY"; echo "cwd=$PWD"; echo "umask=$(umask)"; '
             'echo "fds=$(ls /proc/self/fd | tr "\\n" " ")"')
    done = subprocess.run(
        ["sh", "-c", 'umask 027; exec "$@"', "sh", "agent-sandbox", "run", f"--config={cfg}",
         f"--sandbox={backend}", "--", "sh", "-c", inner],
        capture_output=True, text=True, timeout=120, check=False, cwd=str(sub),
        env=world.env(CANARY_TOKEN="tok-w", AGENT_SANDBOX_TRACE="1", WARM_CANARY="w-1"))
    assert done.returncode == 0, done.stderr
    assert WARM in done.stderr
    got = dict(line.split("=", 1) for line in done.stdout.splitlines())
    # Nothing of the launcher's, the zygote's or (under Landlock, forked from the run:
    # no interpreter start) the helper's reaches the command: 0-2 and ls's own.
    assert got == {"canary": "w-1", "cwd": str(sub), "umask": "0027", "fds": "0 1 2 3 "}, got
    assert ("Landlock helper forked" in done.stderr) == (backend == "nono"), done.stderr


def test_signals_deaths_refusals_and_cold_runs(world: World, service: Service) -> None:
    """One service: what stays cold and what is refused (no warm start yet), then the
    client's signals and death, then the launcher zygote's death (it must come last)."""
    _cold_and_refused(world, service)  # and _stale_code
    _signals_and_deaths(world, service)
    _zygote_killed(world, service)


def _signals_and_deaths(world: World, service: Service) -> None:
    cfg = _config(world, "s.toml")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        up = world.workdir / f"up-{sig}"
        proc = subprocess.Popen(
            ["agent-sandbox", "run", f"--config={cfg}", "--sandbox=bwrap", "--", "sh", "-c",
             f'touch "{up}"; sleep 120'],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=str(world.workdir), env=world.env(CANARY_TOKEN="tok-s", AGENT_SANDBOX_TRACE="1"))
        _wait_for(lambda p=up, q=proc: p.exists() or q.poll() is not None,  # type: ignore[misc]
                  "the command", 90)
        runs = _runs(service)
        assert runs, "the run is the launcher zygote's child"
        # The run holds nothing of the zygote's or the service's: of the zygote's
        # descriptors, only the client's connection (kept until the run is reaped).
        zygote = int(re.findall(r"launcher zygote pid (\d+)", service.text())[0])
        run = int(Path(f"/proc/{zygote}/task/{zygote}/children").read_text().split()[0])
        theirs, its = _links(zygote), _links(run)
        assert len({x for x in theirs & its if x.startswith(("socket:", "pipe:"))}) == 1, its
        assert str(service.log) not in its  # the zygote's stderr, the service's log
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert WARM in err.decode()
        if sig == signal.SIGTERM:
            assert proc.returncode == 128 + signal.SIGTERM, err
        # The run (its end of file is its SIGHUP) and everything below it: gone.
        _wait_for(lambda: _runs(service) == [], "the run and its session to end", 60)
        _wait_for(lambda: _own_leftovers(world, service) == [], "no leftovers", 60)
        assert not any(os.path.exists(f"/proc/{pid}/exe") for pid in runs)


def _zygote_killed(world: World, service: Service) -> None:
    """The launcher zygote killed under a run: the run goes on, and its client exits with
    the run's own code (its reaper is gone); later runs start cold."""
    cfg = _config(world, "z.toml")
    up, go = world.workdir / "up-z", world.workdir / "go-z"
    proc = subprocess.Popen(
        ["agent-sandbox", "run", f"--config={cfg}", "--sandbox=bwrap", "--", "sh", "-c",
         f'touch "{up}"; while [ ! -e "{go}" ]; do sleep 0.05; done; exit 5'],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=str(world.workdir), env=world.env(CANARY_TOKEN="tok-s", AGENT_SANDBOX_TRACE="1"))
    _wait_for(lambda: up.exists() or proc.poll() is not None, "the command", 90)
    zygote = int(re.findall(r"launcher zygote pid (\d+)", service.text())[0])
    os.kill(zygote, signal.SIGKILL)
    _wait_for(lambda: not os.path.exists(f"/proc/{zygote}/exe"), "the zygote's end", 30)
    go.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    done = _run(world, cfg, "bwrap", "true")
    assert done.returncode == 0, done.stderr
    assert "warm launch not taken (refused: no warm run" in done.stderr.decode()
    _wait_for(lambda: _own_leftovers(world, service) == [], "no leftovers", 60)
    assert service.proc.poll() is None


def _cold_and_refused(world: World, service: Service) -> None:
    cfg = _config(world, "c.toml")
    # A terminal on stdin: the run needs it as its controlling terminal.
    primary, secondary = os.openpty()
    try:
        done = subprocess.run(
            ["agent-sandbox", "run", f"--config={cfg}", "--", "true"], stdin=secondary,
            capture_output=True, text=True, timeout=120, check=False, cwd=str(world.workdir),
            env=world.env(CANARY_TOKEN="tok-c", AGENT_SANDBOX_TRACE="1"))
    finally:
        os.close(secondary)
        os.close(primary)
    assert done.returncode == 0, done.stderr
    assert "warm launch not taken (a terminal)" in done.stderr and WARM not in done.stderr
    done = _run(world, cfg, "bwrap", "true", AGENT_SANDBOX_SERVE="off")
    assert done.returncode == 0 and WARM not in done.stderr.decode()
    # Cold under Landlock: the helper is a fork of the launcher at the session's start
    # (its imports done, one thread), not a new interpreter.
    done = _run(world, cfg, "nono", "true", AGENT_SANDBOX_SERVE="off")
    assert done.returncode == 0 and b"Landlock helper forked" in done.stderr, done.stderr
    assert "warm launch not taken (no service answers)" in done.stderr.decode()
    assert "started warm" not in service.text()
    # Hostile or malformed requests: one refusal line to the peer, one log line.
    good = json.loads(_request(world))
    bad: list[tuple[bytes, int]] = [
        (b'{"op":"launch"}\n', 0),
        (json.dumps({**good, "argv": "run"}).encode() + b"\n", 4),
        (json.dumps({**good, "env": {"A": 1}}).encode() + b"\n", 4),
        (json.dumps({**good, "rlimits": [[99, 1, 1]]}).encode() + b"\n", 4),
        (json.dumps({**good, "install": ["/usr/bin/python3", "/usr", "/elsewhere"]}).encode()
         + b"\n", 4),
        (json.dumps({**good, "ids": [0, 0, 12345, 0, []]}).encode() + b"\n", 4),
        (json.dumps({**good, "privs": ["1", *good["privs"][1:]]}).encode() + b"\n", 4),
        (b'{"op":"launch","argv":["' + b"x" * warm_request.MAX_REQUEST + b'"]}\n', 4),
    ]
    for line, nfds in bad:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(20)
            s.connect(str(service.path))
            fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(nfds)]
            try:
                socket.send_fds(s, [line], fds)
            finally:
                for fd in fds:
                    os.close(fd)
            answer = json.loads(s.makefile().readline())
        assert answer["ok"] is False and answer["error"], line[:80]
    text = service.text()
    assert text.count("refused a session") + text.count("refused a run") == len(bad), text
    assert "launcher zygote: refused a run: another installation" in text
    assert "launcher zygote: refused a run: the run's user or groups" in text
    assert "launcher zygote: refused a run: the run's privileges" in text
    assert "Traceback" not in text and "started warm" not in text
    assert service.proc.poll() is None
    time.sleep(0.2)
    assert _runs(service) == []
    # A client with no_new_privs, which the zygote lacks (a fork cannot drop it): cold.
    if shutil.which("setpriv"):
        done = subprocess.run(
            ["setpriv", "--no-new-privs", "agent-sandbox", "run", f"--config={cfg}",
             "--sandbox=bwrap", "--", "true"], capture_output=True, text=True, timeout=120,
            check=False, stdin=subprocess.DEVNULL, cwd=str(world.workdir),
            env=world.env(CANARY_TOKEN="tok-c", AGENT_SANDBOX_TRACE="1"))
        assert done.returncode == 0, done.stderr
        assert "warm launch not taken (refused: the run's privileges" in done.stderr
    _stale_code(world, service, cfg)


def _stale_code(world: World, service: Service, cfg: Path) -> None:
    """The code changed since the service imported it (an upgrade): the new code runs,
    cold, with a broker of its own (both zygotes refuse).  (A nanosecond on the mtime:
    the .pyc, by seconds, stays valid.)"""
    sources = [Path(warm_request.__file__), Path(broker_server.__file__)]
    stats = [source.stat() for source in sources]
    try:
        for source, st in zip(sources, stats, strict=True):
            os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        done = _run(world, cfg, "bwrap", "sh", "-c", "broker-client -- echo brokered")
    finally:
        for source, st in zip(sources, stats, strict=True):
            os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"brokered\n"
    assert "warm_request.py changed since the service started" in done.stderr.decode()
    assert "started warm" not in service.text()
    assert re.search(r"the zygote gave no broker: .*/server\.py changed since the service "
                     r"started", service.text()), service.text()


def _request(world: World) -> str:
    """A well-formed request, as this test's own process would send it."""
    code = ("import sys; from libbroker.launcher import warm_client; "
            "sys.stdout.write(warm_client.request(['run', '--', 'true']).decode())")
    # By the console script's interpreter, as agent-sandbox itself would send it.
    script = shutil.which("agent-sandbox")
    assert script
    python = Path(script).read_text().splitlines()[0].removeprefix("#!").strip()
    done = subprocess.run([python, "-c", code], capture_output=True, text=True,
                          check=True, env=world.env(), timeout=60)
    return done.stdout
