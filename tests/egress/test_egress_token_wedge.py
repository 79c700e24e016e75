"""A token command that wedges (a child holding stdout open) cannot stall the proxy.

The command runs in a process group of its own; at the run bound
(--token-timeout) the whole group is killed, the old token is kept and renewal
goes on.  ``listening`` never waits on a wedged read, no process of the command
outlives the proxy, and nothing of it reaches stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from egress_proxyproc import ProxyProc, start_proxy
from egress_world import World

from libegress.tokens import TokenKeeper, read_token

# The command prints its token only after `sleep` ends; `sh` waits for it, and
# the sleep (a grandchild of the proxy) holds the pipe to the proxy open.
WEDGE = "sh -c 'sleep {seconds}; echo late-token'"


def live_pids(marker: str) -> list[int]:
    """Processes (not zombies) with ``marker`` as a whole argument: the ``sleep``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in argv.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def marker() -> str:
    # A sleep length unique to this test, so its processes can be found by argv.
    return f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"


def stop_clean(p: ProxyProc) -> str:
    """Stop the proxy; its stderr, checked free of tracebacks."""
    assert p.stop() == 0
    err = p.proc.stderr.read().decode() if p.proc.stderr else ""
    assert "Traceback" not in err and "Event loop is closed" not in err, err
    return err


def test_wedged_first_read_still_listens_and_leaves_nothing(tmp_path: Path) -> None:
    sleep = marker()
    log = tmp_path / "proxy.log"
    p = start_proxy(["--token-timeout", "1", "--token-every", "1", "--allow", "allowed.test",
                     "--token-command", WEDGE.format(seconds=sleep)], log=log, socks=True)
    try:
        assert "ran longer than 1s: its process group was killed" in p.log_text()
        # Serving: a request gets its answer (a refusal, nothing is dialled).
        out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                              "--max-time", "5", "-x", p.http, "http://denied.test/"],
                             capture_output=True, text=True, check=False)
        assert out.stdout == "403"
        # Renewal runs the command again (every 1 s): each run's group is killed.
        assert wait_for(lambda: p.log_text().count("token renewal failed") >= 2, 10)
    finally:
        err = stop_clean(p)
    assert wait_for(lambda: not live_pids(sleep), 2), "the command's child outlived the proxy"
    assert "late-token" not in p.log_text() + err


def test_sigterm_during_a_wedged_read_kills_the_whole_command(tmp_path: Path) -> None:
    sleep = marker()
    proc = subprocess.Popen(["egress-proxy", "--listen", "127.0.0.1:0", "--token-command",
                             WEDGE.format(seconds=sleep)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: bool(live_pids(sleep)), 10)
        pgids = {os.getpgid(pid) for pid in live_pids(sleep)}
        assert os.getpgid(proc.pid) not in pgids  # the command has a group of its own
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in err and "Event loop is closed" not in err, err
    assert proc.stdout is not None and proc.stdout.read() == b""  # stopped before listening
    assert wait_for(lambda: not live_pids(sleep), 2), "the command's child outlived the proxy"


def _authorization(p: ProxyProc, world: World, egress: Path) -> list[str]:
    out = subprocess.run(["curl", "-sS", "--max-time", "10", "-x", p.http, "--cacert",
                          str(egress / "bundle.pem"), "https://api.github.com/whoami"],
                         capture_output=True, text=True, check=False)
    result: list[str] = json.loads(out.stdout)["authorization"]
    return result


def test_a_wedged_renewal_keeps_the_token_and_recovers(world: World, tmp_path: Path) -> None:
    sleep = marker()
    state = tmp_path / "state"
    state.write_text("ok:first-token-1a2b\n")
    script = tmp_path / "token.sh"
    # ok:TOKEN prints TOKEN; wedge runs the sleep that holds stdout open.
    script.write_text(f'w=$(cat "{state}")\ncase "$w" in\n  ok:*) echo "${{w#ok:}}";;\n'
                      f'  wedge) sleep {sleep}; echo late-token;;\nesac\n')
    egress, log = tmp_path / "egress", tmp_path / "proxy.log"
    p = start_proxy(["--resolve", f"api.github.com:127.0.0.1:{world.api.port}",
                     "--upstream-ca", str(world.ca_file), "--egress-dir", str(egress),
                     "--token-every", "1", "--token-timeout", "1.5",
                     "--token-command", f"sh {script}"], log=log)
    try:
        assert _authorization(p, world, egress) == ["Bearer first-token-1a2b"]
        state.write_text("wedge\n")
        assert wait_for(lambda: bool(live_pids(sleep)), 10)
        assert _authorization(p, world, egress) == ["Bearer first-token-1a2b"]  # kept
        assert wait_for(lambda: "ran longer than 1.5s" in p.log_text(), 10)
        assert wait_for(lambda: not live_pids(sleep), 2), "the wedged run was not killed"
        state.write_text("ok:second-token-3c4d\n")
        assert wait_for(lambda: _authorization(p, world, egress) ==
                        ["Bearer second-token-3c4d"], 15), "renewal did not recover"
    finally:
        err = stop_clean(p)
    assert not live_pids(sleep)
    text = log.read_text() + err
    assert "the previous token is kept" in text
    for secret in ("first-token-1a2b", "second-token-3c4d", "late-token"):
        assert secret not in text


def test_output_counts_when_the_command_exits_not_when_the_pipe_closes() -> None:
    # The command prints its token and exits; a child it left behind still holds
    # stdout.  The token is read at once and the child is killed with the group.
    sleep = marker()
    argv = ["sh", "-c", f"echo tok-5e6f; sleep {sleep} & exit 0"]
    assert asyncio.run(read_token(argv, bound=20)) == "tok-5e6f"
    assert wait_for(lambda: not live_pids(sleep), 2)


def test_a_slow_first_read_goes_on_after_start_returns() -> None:
    said: list[str] = []
    command = [sys.executable, "-c", "import time; time.sleep(0.6); print('slow-7a8b')"]
    keeper = TokenKeeper(command, every=60, say=said.append, bound=10, first_wait=0.1)

    async def scenario() -> tuple[str | None, str | None]:
        await keeper.start()  # returns after first_wait: no token yet
        before = keeper.current()
        keep = asyncio.create_task(keeper.keep())
        for _ in range(100):
            if keeper.current() is not None:
                break
            await asyncio.sleep(0.05)
        keep.cancel()
        await asyncio.gather(keep, return_exceptions=True)
        return before, keeper.current()

    assert asyncio.run(scenario()) == (None, "slow-7a8b")
    assert any("serving without one" in s for s in said)
    assert not any("slow-7a8b" in s for s in said)


def test_cancelling_start_kills_the_command() -> None:
    sleep = marker()
    keeper = TokenKeeper(["sh", "-c", f"sleep {sleep}; echo x"], every=60, say=lambda s: None,
                         bound=30, first_wait=30)

    async def scenario() -> None:
        start = asyncio.create_task(keeper.start())
        for _ in range(100):
            if live_pids(sleep):
                break
            await asyncio.sleep(0.05)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start

    asyncio.run(scenario())
    assert wait_for(lambda: not live_pids(sleep), 2)
